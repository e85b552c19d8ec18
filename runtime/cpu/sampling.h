// Sampling from logits: greedy, temperature, top-k, top-p, seeded; returns the token's logprob.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "steward/request.h"
#include <steward/expected.h>

namespace steward {

struct SamplingParams {
    float temperature = 0.0f;  // <= 0: greedy
    int top_k = 0;             // <= 0: off
    float top_p = 1.0f;        // >= 1: off
    uint64_t seed = 0;
    // OpenAI's logit adjustments (adjust_logits), applied before everything above.
    float presence_penalty = 0.0f;   // [-2, 2]
    float frequency_penalty = 0.0f;  // [-2, 2]
    std::vector<std::pair<int32_t, float>> logit_bias;  // id -> added, [-100, 100]
    int n_top_logprobs = 0;          // [0, 20]: alternatives reported per output token
    bool adjusts_logits() const { return presence_penalty != 0 || frequency_penalty != 0 || !logit_bias.empty(); }
};

// The one rule for sampling values, at every edge (`steward generate`, the C API, workload lines,
// HTTP): temperature finite and >= 0 (0: greedy), top_p in (0, 1], top_k >= 0 (0: off); penalties
// finite in [-2, 2]; at most 1024 logit_bias entries, ids >= 0, values finite in [-100, 100];
// n_top_logprobs in [0, 20]. An error names the
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
    // The request's random stream, for draws made outside sample() that must share it (speculative
    // drafting and verification, acceptance.h), so one seed decides the whole output.
    std::mt19937_64& rng() { return rng_; }

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

struct TokenProb {
    int32_t id = -1;
    double prob = 0.0;
};
// The distribution Sampler::sample(logits) draws from under p: temperature, top_k and top_p
// applied exactly as the sampler applies them (one shared implementation), as the kept tokens with
// probability > 0 in ascending id order, summing to 1. Greedy (temperature <= 0): the argmax with
// probability 1. The logit hygiene of Sampler applies (NaN is -inf; +inf logits share the mass;
// nothing above -inf gives token 0). Empty logits give an empty vector. adjust_logits is the
// caller's step, before this one. Speculative verification reads p and the draft's q from here.
// Pure, thread-safe.
std::vector<TokenProb> sampling_distribution(std::span<const float> logits, const SamplingParams& p);

// OpenAI's adjustments, in place: logits[id] += bias for each logit_bias entry (ids outside the span
// are ignored), then for every id that occurs c > 0 times in `output` (the tokens generated so far):
// logits[id] -= c * frequency_penalty + presence_penalty. Pure apart from `logits`.
void adjust_logits(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> output);

// The k most likely ids under log softmax(logits), most likely first (ties to the lower id), with
// their log-probabilities; k is clamped to the span's size. NaN counts as -inf.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k);

// log softmax(logits)[token], computed stably (max subtracted, sum in double). NaN counts as -inf.
// Returns -inf for a token out of range or when no logit is above -inf. Pure, thread-safe.
float token_logprob(std::span<const float> logits, int32_t token);
// Index of the largest logit, ties to the lowest id, NaN ignored; 0 when none is above -inf
// (and for an empty span). Pure, thread-safe.
int32_t argmax(std::span<const float> logits);

}  // namespace steward
