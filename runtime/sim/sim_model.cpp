#include "sim/sim_model.h"

#include "model/gguf.h"
#include "model/synth.h"

namespace steward {

Expected<std::unique_ptr<Model>> sim_model(const SimModelConfig& m) {
    SynthSpec spec;
    spec.n_embd = m.dim, spec.n_layer = m.layers, spec.n_head = m.heads, spec.n_head_kv = m.kv_heads;
    spec.head_dim = m.head_dim == m.dim / m.heads ? 0 : m.head_dim;
    spec.n_ff = m.ffn, spec.n_vocab = m.vocab, spec.n_ctx = m.ctx;
    spec.dtype = m.weight_dtype == "f32" ? GgmlType::F32 : m.weight_dtype == "fp8" ? GgmlType::Q8_0 : GgmlType::F16;
    auto header = synth_header_bytes(spec);
    if (!header) return header.error();
    auto file = GgufFile::header_from_bytes(std::move(*header), "sim:" + m.name);
    if (!file) return file.error();
    return Model::from_gguf(std::move(*file));
}

}  // namespace steward
