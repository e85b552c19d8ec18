// The CPU backend's one batched forward pass over paged KV. Prefill, decode, chunked prefill and
// multi-token (tree) verification are all this call. Readable reference for every other backend.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cpu/thread_pool.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace steward {

enum class LogitsMode { LAST, ALL, NONE };

// One sequence's part of a batch. The sequence's KV lives in the slots its block table maps:
// logical slot s is physical (block_table[s / block_size], s % block_size).
struct SeqInput {
    // Slots [0, n_past) already hold this sequence's KV; every new token sees all of them.
    // Rolling back is just calling with a smaller n_past: later slots are overwritten.
    int32_t n_past = 0;
    // New tokens; token i's K/V are written to slot n_past + i.
    std::span<const int32_t> tokens;
    // RoPE position of each new token; empty means n_past + i. Tree verification gives siblings
    // the same position.
    std::span<const int32_t> positions;
    // [n_new][n_new] row-major; mask[i * n_new + j] != 0 lets new token i attend new token j.
    // Empty means causal (j <= i).
    std::span<const uint8_t> mask;
    // Physical block ids covering slots [0, n_past + n_new).
    std::span<const int32_t> block_table;
    LogitsMode logits = LogitsMode::LAST;
    // The request this sequence belongs to: what a backend deciding tokens itself keys them on (the
    // simulator's generator); the forward ignores it.
    uint64_t id = 0;
};

// Validates a batch for a forward of n_layers layers over KV shaped kc, as every backend does before
// touching the KV: the KV's shape, each sequence's positions, mask, block table (length and ids),
// token ids and positions against the context, and the batch's size against max_tokens. Returns
// the number of logits rows the batch asks for. Errors name the sequence and the value. Pure.
Expected<int> check_batch(const ModelParams& p, const KvConfig& kc, int n_layers, int max_tokens,
                          std::span<const SeqInput> batch);

// The layers a forward asked for n_layers runs: n_layers in [1, n_layer) (a self-draft), else all
// of them. Every backend and the KV shaped for it (kv_config_for_layers) follow this one rule, which
// check_batch then holds them to.
inline int forward_layers(const ModelParams& p, int n_layers) {
    return n_layers > 0 && n_layers < p.n_layer ? n_layers : p.n_layer;
}

class CpuForward {
public:
    // n_threads <= 0 means all cores. max_tokens bounds the tokens of one batch (scratch size).
    // n_layers in [1, n_layer) runs only the model's first n_layers layers, then its final norm and
    // output head: the self-speculative draft (LayerSkip / Draft & Verify), sharing the weights;
    // its KV storage then has n_layers layers. 0 (or n_layer) runs them all.
    CpuForward(const Model& model, int n_threads = 0, int max_tokens = 2048, int n_layers = 0);

    // Runs the batch. logits receives one row of n_vocab floats per requested output, in batch
    // order (LAST: one row; ALL: one per new token; NONE: none). Errors (token out of range, a
    // block table too short, a block id out of range, a batch over max_tokens, a position past
    // the context) leave the KV untouched and name the sequence and the value.
    Expected<bool> forward(KvStorage& kv, std::span<const SeqInput> batch, std::vector<float>& logits);
    // The same layers, ending at the final norm instead of the output head: hidden receives
    // [n_tok][n_embd], every new token's output-normed state (llama.cpp's result_norm), in batch
    // order; the sequences' LogitsMode is ignored. Validation, KV writes and errors as forward's.
    // What an embedding pools (cpu/embed.h).
    Expected<bool> hidden_states(KvStorage& kv, std::span<const SeqInput> batch, std::vector<float>& hidden);

    const Model& model() const { return model_; }
    int n_threads() const { return n_threads_; }
    int max_tokens() const { return max_tokens_; }
    int n_layers() const { return n_layers_; }  // layers this forward runs
    // The forward's workers, idle between forwards: the engine samples a batch's rows on them.
    ThreadPool& thread_pool() { return pool_; }

private:
    // forward (logits set) and hidden_states (hidden set): one body, one transformer.
    Expected<bool> run(KvStorage& kv, std::span<const SeqInput> batch, std::vector<float>* logits,
                       std::vector<float>* hidden);

    const Model& model_;
    int n_threads_;
    int max_tokens_;
    int n_layers_;
    ThreadPool pool_;
    // Scratch, sized for max_tokens rows.
    std::vector<float> x_;     // [n_tok][n_embd] residual stream
    std::vector<float> xn_;    // [n_tok][n_embd] normed input
    std::vector<float> q_;     // [n_tok][n_head * head_dim]
    std::vector<float> k_;     // [n_tok][n_head_kv * head_dim]
    std::vector<float> v_;     // [n_tok][n_head_kv * head_dim]
    std::vector<float> att_;   // [n_tok][n_head * head_dim]
    std::vector<float> gate_;  // [n_tok][n_ff]
    std::vector<float> up_;    // [n_tok][n_ff]
    std::vector<float> tmp_;   // [n_tok][n_embd]
    // Mixture of experts: router logits [n_tok][n_expert], then per expert its tokens' normed
    // inputs, gate, up and down rows, gathered ([n][n_embd], [n][n_ff_exp] x2, [n][n_embd]).
    std::vector<float> router_, moe_x_, moe_g_, moe_u_, moe_d_;
    std::vector<std::vector<std::pair<int, float>>> moe_groups_;  // per expert: (token, weight) of this layer
    std::vector<int> moe_order_;   // [n_expert] one token's experts by probability
    std::vector<float> moe_prob_;  // [n_expert] one token's router probabilities
    // The mixture-of-experts FFN of layer L over xn_ into tmp_ (tokens grouped by expert, each
    // expert's matrices run once over its group: the CPU form of a grouped GEMM).
    void moe_ffn(const LayerWeights& L, int n_tok);
};

}  // namespace steward
