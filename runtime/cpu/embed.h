// Embeddings from a decoder model: each input's final-norm hidden states (CpuForward::hidden_states,
// llama.cpp's result_norm) pooled into one vector (mean, first token or last token) and scaled to
// unit length, as llama.cpp's llama-embedding and llama-server do (--embd-normalize 2).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "cpu/encoder.h"
#include "cpu/forward.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace steward {

// How a sequence's hidden states become one vector.
enum class Pooling {
    MEAN,  // the mean over every token (GGUF pooling_type 1)
    CLS,   // the first token's (2): an encoder's [CLS]; for a decoder, its BOS
    LAST,  // the last token's (3): the only one a causal decoder let see the whole input
};

const char* pooling_name(Pooling p);  // "mean", "cls", "last"
std::optional<Pooling> parse_pooling(std::string_view name);

// The pooling of a model's embeddings: `configured` ([[pool]] pooling) when not empty, else the
// GGUF's <arch>.pooling_type (1 mean, 2 cls, 3 last), else LAST: vLLM's default for decoder
// models, whose last token is the only one that saw the whole input. Errors name the value and the fix:
// configured not mean / cls / last; a GGUF declaring none (0: per-token vectors), rank (4: a
// reranker's score) or another value, without configured.
Expected<Pooling> embedding_pooling(const ModelParams& p, const std::string& configured);

// hidden [n_tok][n_embd] pooled into [n_embd] and L2-normalised (a zero vector stays zero).
std::vector<float> pool_hidden(std::span<const float> hidden, int n_tok, int n_embd, Pooling pooling);
// v scaled to unit length in place (a zero vector stays zero), in double as llama.cpp's
// common_embd_normalize(..., 2).
void l2_normalize(std::span<float> v);

// Embeds token sequences with a forward of its own (an encoder model's: cpu/encoder.h) (scratch, worker threads and KV storage) over a
// model's weights: safe beside an engine running the same model. Short inputs share a forward;
// an input longer than max_tokens runs alone in chunks (chunked prefill over its own KV).
// One call at a time (it owns its scratch); the model must outlive it.
class CpuEmbedder {
public:
    // n_threads <= 0: all cores. max_tokens bounds one forward's tokens (scratch size). kv_dtype is
    // the KV's K type and, unless kv_dtype_v is given, its V type.
    CpuEmbedder(const Model& model, int n_threads, int max_tokens, KvDtype kv_dtype = KvDtype::F32,
                std::optional<KvDtype> kv_dtype_v = std::nullopt);

    // One unit-length vector of n_embd floats per input, in order. Errors (an empty input, a token
    // outside the vocabulary, an input past the model's context) name the input and the value.
    Expected<std::vector<std::vector<float>>> embed(std::span<const std::vector<int32_t>> inputs, Pooling pooling);

    int n_threads() const { return fwd_ ? fwd_->n_threads() : enc_->n_threads(); }

private:
    // One of the two: a decoder's forward over KV of its own, or an encoder's (bert, nomic-bert),
    // which runs each input whole.
    std::unique_ptr<CpuForward> fwd_;
    std::unique_ptr<CpuEncoder> enc_;
    KvDtype kv_dtype_, kv_dtype_v_;
    std::vector<float> hidden_;  // [n_tok][n_embd] of the last forward
};

}  // namespace steward
