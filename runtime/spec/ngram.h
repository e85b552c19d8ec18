// Prompt lookup (n-gram) drafting: no model, the draft is what followed the last time the context's
// tail occurred earlier in the prompt or the output (llama.cpp's lookup, vLLM's ngram proposer).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace steward {

struct NgramParams {
    int32_t min_n = 1;  // shortest tail matched
    int32_t max_n = 3;  // longest tail matched (tried first)
    int32_t k = 4;      // draft tokens proposed at most
};

// tokens: the prompt then the output so far. For n from max_n down to min_n, the last n tokens are
// looked up at earlier start positions, the most recent occurrence first (recent text predicts best,
// and it is the one an agent loop or an edit repeats); the first n with a match proposes the up to k
// tokens that followed it (they may run into the tail itself, as a repeating pattern does). Empty
// when nothing matches, k <= 0, or n is out of [1, tokens.size() - 1]. O(max_n * len) per call;
// the chosen draft is a DraftKind::CHOSEN chain. Pure, thread-safe.
std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, const NgramParams& params);

}  // namespace steward
