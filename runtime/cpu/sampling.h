// Sampling from logits: greedy, temperature, top-k, top-p, seeded; returns the token's logprob.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "util/error.h"

namespace steward {

struct SamplingParams {
    float temperature = 0.0f;  // <= 0: greedy
    int top_k = 0;             // <= 0: off
    float top_p = 1.0f;        // >= 1: off
    uint64_t seed = 0;
};

// The one rule for sampling values, at every edge (`steward generate`, the C API, workload lines):
// temperature finite and >= 0 (0: greedy), top_p in (0, 1], top_k >= 0 (0: off). An error names the
// field and its value; nothing is silently turned into something else. Pure, thread-safe.
Expected<bool> check_sampling(const SamplingParams& p);

struct Sampled {
    int32_t token = -1;
    float logprob = 0.0f;  // log-probability of token under the unmodified softmax(logits)
};

// Deterministic for a given seed and sequence of calls, independent of the standard library's
// distributions (only the raw mt19937_64 output is used).
// Order of operations: logits / temperature, keep the top_k largest, renormalise, keep the
// nucleus of mass top_p, renormalise, draw. Ties are broken towards the lower token id.
// Logit hygiene: NaN counts as -inf and is never drawn while a finite alternative exists; if any
// logit is +inf the draw is uniform over the +inf tokens; if none is above -inf the result is
// token 0 with logprob -inf. An empty span gives token -1 with logprob -inf.
// Thread-safety: a Sampler holds RNG state and scratch memory; use one per thread (per request).
class Sampler {
public:
    explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
    Sampled sample(std::span<const float> logits);
    const SamplingParams& params() const { return p_; }

    struct Candidate {
        float logit;  // the unmodified logit; always finite (NaN and +-inf are handled before)
        int32_t id;
        double weight;  // exp((logit - max) / temperature), unnormalised
    };

private:
    double next_uniform();  // in [0, 1), 53 random bits

    SamplingParams p_;
    std::mt19937_64 rng_;
    std::vector<Candidate> candidates_;  // scratch, [n_vocab] at most; reused between calls
};

// log softmax(logits)[token], computed stably (max subtracted, sum in double). NaN counts as -inf.
// Returns -inf for a token out of range or when no logit is above -inf. Pure, thread-safe.
float token_logprob(std::span<const float> logits, int32_t token);
// Index of the largest logit, ties to the lowest id, NaN ignored; 0 when none is above -inf
// (and for an empty span). Pure, thread-safe.
int32_t argmax(std::span<const float> logits);

}  // namespace steward
