// A synthetic model written by the synth tool and loaded from memory (no file): the same GGUF
// writer, reader and loader as a model on disk. Tests keep one per shape in a function-local static.
#pragma once
#include <memory>

#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"

namespace steward_test {

inline std::unique_ptr<steward::Model> memory_model(const steward::SynthSpec& spec) {
    auto w = steward::synth_model(spec);
    auto f = steward::GgufFile::from_bytes(w->to_bytes());
    return std::move(steward::Model::from_gguf(std::move(f.value())).value());
}

// A 1-layer, dim-32 model (vocab 512, context 256): the cheapest engine to drive in KV tests.
inline const steward::Model& tiny_kv_model() {
    static std::unique_ptr<steward::Model> m = [] {
        steward::SynthSpec s;
        s.n_embd = 32; s.n_layer = 1; s.n_head = 2; s.n_head_kv = 1; s.n_ff = 64; s.n_vocab = 512; s.n_ctx = 256;
        s.seed = 11;
        return memory_model(s);
    }();
    return *m;
}

}  // namespace steward_test
