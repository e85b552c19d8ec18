// Synthetic models: a real GGUF with deterministic random weights and a tokenizer, of any shape.
// Tests and benches use them; they go through the same loader and math as a downloaded model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/quantize.h"

namespace steward {

struct SynthSpec {
    // llama / mistral (adjacent-pair RoPE), qwen2 (NeoX RoPE, QKV biases) or qwen3 (NeoX RoPE, no
    // biases, RMSNorm on each q and k head before RoPE)
    std::string arch = "llama";
    int n_embd = 256;
    int n_layer = 4;
    int n_head = 4;
    int n_head_kv = 4;
    int head_dim = 0;     // 0: n_embd / n_head; otherwise written as attention.key_length / value_length
    int n_ff = 688;
    int n_vocab = 4096;   // at least 354 (3 control, 256 byte and 95 character tokens)
    int n_ctx = 2048;
    GgmlType dtype = GgmlType::F32;  // matrices (quantize_supported); norms are always F32
    // NONE: every matrix in dtype. Q4_K_M / Q5_K_M: llama-quantize's per-tensor mix over dtype
    // Q4_K / Q5_K (format_tensor_type), as the files users download are written.
    QuantMix mix = QuantMix::NONE;
    bool tied_output = false;        // untied with a larger scale gives peaked logits (see synth.cpp)
    uint64_t seed = 1;
    float rope_freq_base = 10000.0f;
    float rms_eps = 1e-5f;
    // RoPE scaling as llama.cpp reads it: a linear factor (<arch>.rope.scaling.type "linear" and
    // .rope.scaling.factor; 0: none), and per-pair factors rising linearly from 1 (the first, fastest
    // pair) to rope_freqs_ramp (the last) in a `rope_freqs.weight` tensor, the form Llama 3.1 files
    // carry (0: none).
    float rope_scaling_factor = 0.0f;
    float rope_freqs_ramp = 0.0f;
    // Gemma 2 / 3: the sliding window written as attention.sliding_window (0: the family's default,
    // 4096 for gemma2 and 512 for gemma3, as Gemma 3 1B; -1: none, for gemma3 only), and the
    // soft-caps (negative: the family's default, 50 and 30 for gemma2, none for gemma3; 0: none).
    // Mixture of experts: arch "qwen3moe", "gpt-oss", or "mixtral" (written as llama with experts, as
    // llama.cpp's converter writes Mixtral). n_expert experts of width n_ff_exp (0: n_ff), n_expert_used
    // per token. gpt-oss also gets its sinks, biases, alternating windows (sliding_window, 0: 128) and
    // YaRN; its file type mxfp4_moe writes the experts in MXFP4 and the other matrices in Q8_0.
    int n_expert = 8;
    int n_expert_used = 2;
    int n_ff_exp = 0;
    int sliding_window = 0;
    // YaRN RoPE scaling (rope.scaling.type "yarn", .factor, .original_context_length): negative: the
    // family's default (gpt-oss: factor 32 over 4096, as the released models; none for the others);
    // 0: none.
    float yarn_factor = -1.0f;
    int yarn_orig_ctx = 4096;
    // phi3: LongRoPE as Phi-3's 128k files carry it (0: none): rope.scaling.original_context_length
    // set to this, per-pair factors rising from 1 to 8 (`rope_factors_long.weight`) and to 1.5
    // (`rope_factors_short.weight`), and rope.scaling.attn_factor sqrt(1 + ln(ctx / orig) / ln(orig))
    // (1 when ctx <= orig), the converter's rule.
    int longrope_orig_ctx = 0;
    float attn_softcap = -1.0f;
    float final_softcap = -1.0f;
    // A test fixture for speculative decoding: layers >= late_from get their residual branches
    // (attn_output and ffn_down) scaled by late_scale, so that a draft of the first late_from layers
    // (synth_draft, or the self-speculative prefix) agrees with the target at a chosen rate; the other
    // tensors are bit-identical to late_scale 1 (weights are seeded per tensor name). Measured greedy
    // agreement (first-token argmax over random contexts, tests/unit/model/test_synth_late_scale.cpp)
    // for the default shape (4 layers, dim 256, vocab 4096, untied), late_from = keep_layers, 1024
    // contexts of 8 random tokens:
    //   late_scale         0     0.1   0.2   0.3   0.4   0.5   0.6   0.7   0.8   1.0
    //   1-layer draft      1.00  0.85  0.72  0.60  0.50  0.42  0.35  0.30  0.24  0.18
    //   2-layer draft      1.00  0.89  0.80  0.70  0.62  0.56  0.49  0.44  0.38  0.27
    // so ~90%: 0.1 with 2 layers; ~70%: 0.3 with 2 layers (0.2 with 1); ~30%: 0.7 with 1 layer.
    // late_from -1 (or late_scale 1): off.
    float late_scale = 1.0f;
    int late_from = -1;
    // Tensor infos without weights (GgufWriter::add_tensor_shape): a simulated model of any size,
    // whose header (synth_header_bytes) a Model is built from. synth_validate skips the dtype's
    // width rules for it (no weights are encoded).
    bool shape_only = false;
};

// Validates the shape (head counts divide, dims multiples of 32 for Q8_0, ...).
Expected<bool> synth_validate(const SynthSpec& spec);
// The head size the spec writes: head_dim, or n_embd / n_head when it is 0.
int synth_head_dim(const SynthSpec& spec);
// Builds the whole GGUF (metadata, SPM tokenizer, weights) in a writer.
Expected<GgufWriter> synth_model(const SynthSpec& spec);
Expected<bool> synth_write(const SynthSpec& spec, const std::string& path);
// The GGUF header of the spec with shape_only set: metadata, tokenizer and tensor infos, no weights
// (GgufFile::header_from_bytes and Model::from_gguf make a Model without weights of it).
Expected<std::vector<uint8_t>> synth_header_bytes(SynthSpec spec);
// Writes a draft of `target`: its embeddings, first keep_layers layers, final norm and output head.
Expected<bool> synth_draft(const std::string& target_path, int keep_layers, const std::string& out_path);

}  // namespace steward
