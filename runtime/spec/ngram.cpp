// Prompt lookup drafting (see ngram.h).
#include "spec/ngram.h"

#include <algorithm>
#include <cstring>

namespace steward {

std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, const NgramParams& params) {
    const auto len = (int64_t)tokens.size();
    if (params.k <= 0) return {};
    for (int64_t n = std::min<int64_t>(params.max_n, len - 1); n >= std::max<int32_t>(params.min_n, 1); --n) {
        const int32_t* tail = tokens.data() + (len - n);
        // Start i < len - n: the occurrence is not the tail itself, and a token follows it.
        for (int64_t i = len - n - 1; i >= 0; --i) {
            if (std::memcmp(tokens.data() + i, tail, (size_t)n * sizeof(int32_t)) != 0) continue;
            const int64_t from = i + n, to = std::min<int64_t>(from + params.k, len);
            return {tokens.begin() + from, tokens.begin() + to};
        }
    }
    return {};
}

}  // namespace steward
