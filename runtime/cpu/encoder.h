// The forward of an encoder model (bert, nomic-bert): every token of one input attends to every
// other (bidirectional), so an input runs whole, without KV. What an encoder's embedding pools
// (cpu/embed.h). The readable reference is tests/support/naive_encoder.h.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "cpu/thread_pool.h"
#include "model/model.h"

namespace steward {

class CpuEncoder {
public:
    // n_threads <= 0: all cores. The model must be an encoder (Model params().is_encoder()) and
    // outlive this.
    CpuEncoder(const Model& model, int n_threads);

    // hidden receives [tokens.size()][n_embd]: each token's state after the last layer's output
    // LayerNorm (llama.cpp's result_embd), all tokens seeing each other unless the model declares
    // causal attention. Errors name a token outside the vocabulary or an input past the context.
    Expected<bool> encode(std::span<const int32_t> tokens, std::vector<float>& hidden);

    const Model& model() const { return model_; }
    int n_threads() const { return pool_.n_threads(); }

private:
    const Model& model_;
    ThreadPool pool_;
    std::vector<float> q_, k_, v_, att_, tmp_, ff_, gate_;
};

}  // namespace steward
