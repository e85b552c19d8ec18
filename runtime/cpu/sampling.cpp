// Sampling from logits: greedy, temperature, top-k, top-p, seeded. See sampling.h for the contract.
#include "cpu/sampling.h"
#include "cpu/kernels.h"

#include <algorithm>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <cmath>
#include <limits>
#include <string>

namespace steward {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
constexpr float k_pos_inf = std::numeric_limits<float>::infinity();

// Largest logit with NaN skipped (comparisons with NaN are false); -inf when there is none. Four
// lanes at a time with SSE (baseline x86-64): maxps keeps its second operand when the first is NaN.
float max_logit(std::span<const float> logits) {
    const size_t n = logits.size();
    const float* x = logits.data();
    size_t i = 0;
    float m = k_neg_inf;
#if defined(__SSE2__)
    __m128 m4 = _mm_set1_ps(k_neg_inf);
    for (; i + 4 <= n; i += 4) m4 = _mm_max_ps(_mm_loadu_ps(x + i), m4);
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, m4);
    m = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
#endif
    for (; i < n; ++i)
        if (x[i] > m) m = x[i];
    return m;
}

// Strict weak order: higher logit first, then lower id, so every selection is reproducible.
bool ranks_before(const Sampler::Candidate& a, const Sampler::Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Length of the shortest prefix of `sorted` whose weight reaches `target`; 0 if none does.
size_t nucleus_length(const Sampler::Candidate* sorted, size_t n, double target) {
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cum += sorted[i].weight;
        if (cum >= target) return i + 1;
    }
    return 0;
}

// sum exp(l - m) over the logits above -inf, for a finite max m. expf in float is several times
// faster than exp in double over a 150k vocabulary; each term is exact to an ulp and the sum is
// kept in double, so the logprob stays within ~1e-6 of a long double reference.
double sum_exp_shifted(std::span<const float> logits, float m) {
    return steward::sum_exp_shifted(logits.data(), (int64_t)logits.size(), m);  // NaN and -inf add nothing
}

// log softmax at logit lt, given the finite max m and sum_exp_shifted(logits, m).
float logprob_from_sum(float lt, float m, double sum) {
    if (!(lt > k_neg_inf)) return k_neg_inf;
    return static_cast<float>((static_cast<double>(lt) - m) - std::log(sum));
}

// log softmax when some logit is +inf: the limit is uniform over the +inf tokens.
float logprob_with_pos_inf(std::span<const float> logits, float lt) {
    if (lt != k_pos_inf) return k_neg_inf;
    size_t n_inf = 0;
    for (float v : logits) n_inf += (v == k_pos_inf);
    return static_cast<float>(-std::log(static_cast<double>(n_inf)));
}

// The sampler's candidates at temperature > 0 for a finite max logit m: the finite tokens, cut to
// the top_k best, weighted exp((logit - m) / temperature), cut to the nucleus of mass top_p. Shared
// by Sampler::sample and sampling_distribution, so both see exactly the same distribution.
struct Kept {
    size_t n_keep = 0;          // cands[0, n_keep) are the candidates, in the order the draw walks them
    double total = 0.0;         // their summed weight
    double sum_unmodified = 0;  // the unmodified softmax denominator (sum_exp_shifted(logits, m))
};

Kept keep_candidates(std::span<const float> logits, const SamplingParams& p, float m,
                     std::vector<Sampler::Candidate>& cands) {
    // Candidates: tokens with a finite logit (m is finite, so NaN and -inf drop out here), either
    // all of them or the top_k best.
    cands.clear();
    bool truncated = false;  // did top-k drop a finite token?
    bool sorted = false;     // are cands in ranks_before order?
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < logits.size()) {
        // A bounded heap whose front is the worst kept token: O(V log k) at worst, and usually one
        // comparison per token, without materialising V candidates.
        const auto k = static_cast<size_t>(p.top_k);
        cands.reserve(k);
        for (size_t i = 0; i < logits.size(); ++i) {
            const float v = logits[i];
            if (!(v > k_neg_inf)) continue;
            const Sampler::Candidate x{v, static_cast<int32_t>(i), 0.0};
            if (cands.size() < k) {
                cands.push_back(x);
                std::push_heap(cands.begin(), cands.end(), ranks_before);
            } else {
                truncated = true;
                if (ranks_before(x, cands.front())) {
                    std::pop_heap(cands.begin(), cands.end(), ranks_before);
                    cands.back() = x;
                    std::push_heap(cands.begin(), cands.end(), ranks_before);
                }
            }
        }
        std::sort_heap(cands.begin(), cands.end(), ranks_before);  // best first
        sorted = true;
    } else {
        cands.reserve(logits.size());
        for (size_t i = 0; i < logits.size(); ++i)
            if (logits[i] > k_neg_inf) cands.push_back({logits[i], static_cast<int32_t>(i), 0.0});
    }
    Sampler::Candidate* c = cands.data();
    size_t n_keep = cands.size();  // >= 1: the max itself is finite

    // Weights in float exp (see sum_exp_shifted), accumulated in double.
    double total = 0.0;
    if (p.temperature == 1.0f) {
        for (size_t i = 0; i < n_keep; ++i) total += (c[i].weight = std::exp(c[i].logit - m));
    } else {
        const double inv_temp = 1.0 / static_cast<double>(p.temperature);
        for (size_t i = 0; i < n_keep; ++i)
            total += (c[i].weight = std::exp(static_cast<float>((static_cast<double>(c[i].logit) - m) * inv_temp)));
    }
    // total >= 1: the max's weight is exp(0), and top-k keeps the max.
    // At temperature 1 with nothing truncated, total is already the softmax denominator.
    const double sum_unmodified = (p.temperature == 1.0f && !truncated) ? total : sum_exp_shifted(logits, m);

    if (p.top_p < 1.0f) {  // NaN top_p is treated as off
        const double target = static_cast<double>(p.top_p) * total;
        size_t n_nucleus = 0;
        if (!sorted && n_keep > 1) {
            // A token with weight below cutoff cannot be in the nucleus: all of those together weigh
            // less than (n - 1) * cutoff = (1 - top_p) * total. Sorting only the rest is usually far
            // fewer tokens than the vocabulary (trick from llama2.c). Capped at 1.0, the max's own
            // weight, so the head is never empty; a lower cutoff only keeps more, which stays correct.
            const double cutoff =
                std::min(1.0, (1.0 - static_cast<double>(p.top_p)) * total / static_cast<double>(n_keep - 1));
            Sampler::Candidate* mid = std::partition(c, c + n_keep, [&](const Sampler::Candidate& a) { return a.weight >= cutoff; });
            std::sort(c, mid, ranks_before);
            n_nucleus = nucleus_length(c, static_cast<size_t>(mid - c), target);
        }
        if (n_nucleus == 0) {  // already sorted, or rounding kept the pruned head short of target
            if (!sorted) std::sort(c, c + n_keep, ranks_before);
            n_nucleus = nucleus_length(c, n_keep, target);
        }
        if (n_nucleus != 0) n_keep = n_nucleus;  // else rounding: keep everything
        total = 0.0;
        for (size_t i = 0; i < n_keep; ++i) total += c[i].weight;
    }

    return {n_keep, total, sum_unmodified};
}

}  // namespace

Expected<bool> check_sampling(const SamplingParams& p) {
    if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
        return make_error("temperature is ", std::to_string(p.temperature), "; it must be a finite number >= 0 (0: greedy)");
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return make_error("top_p is ", std::to_string(p.top_p), "; it must be in (0, 1] (1: off)");
    if (p.top_k < 0) return make_error("top_k is ", std::to_string(p.top_k), "; it must be >= 0 (0: off)");
    if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
        return make_error("presence_penalty is ", std::to_string(p.presence_penalty), "; it must be in [-2, 2]");
    if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
        return make_error("frequency_penalty is ", std::to_string(p.frequency_penalty), "; it must be in [-2, 2]");
    if (p.logit_bias.size() > 1024)
        return make_error("logit_bias has ", p.logit_bias.size(), " entries; at most 1024 are accepted");
    for (const auto& [id, b] : p.logit_bias) {
        if (id < 0) return make_error("logit_bias names token id ", id, "; ids are >= 0");
        if (!(b >= -100.0f && b <= 100.0f))
            return make_error("logit_bias of token ", id, " is ", std::to_string(b), "; it must be in [-100, 100]");
    }
    if (p.n_top_logprobs < 0 || p.n_top_logprobs > 20)
        return make_error("top_logprobs is ", p.n_top_logprobs, "; it must be in [0, 20]");
    return true;
}

void adjust_logits(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> output) {
    for (const auto& [id, b] : p.logit_bias)
        if (id >= 0 && (size_t)id < logits.size()) logits[(size_t)id] += b;
    if (p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
    std::vector<int32_t> ids(output.begin(), output.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j < ids.size() && ids[j] == ids[i]) j++;
        if (ids[i] >= 0 && (size_t)ids[i] < logits.size())
            logits[(size_t)ids[i]] -= (float)(j - i) * p.frequency_penalty + p.presence_penalty;
        i = j;
    }
}

// Each value by the formula token_logprob and the sampler use (the same max, the same sum, the
// same rounding), so the chosen token's logprob and its entry here are equal to the bit.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k) {
    std::vector<TokenLogprob> out;
    k = std::min<int>(std::max(k, 0), (int)logits.size());
    if (k == 0) return out;
    const float m = max_logit(logits);
    const double sum = m > k_neg_inf && m < k_pos_inf ? sum_exp_shifted(logits, m) : 0.0;
    auto logprob = [&](float v) {
        if (m == k_pos_inf) return logprob_with_pos_inf(logits, v);
        return m > k_neg_inf ? logprob_from_sum(v, m, sum) : k_neg_inf;
    };
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)i;
    auto value = [&](int32_t i) { return std::isnan(logits[(size_t)i]) ? k_neg_inf : logits[(size_t)i]; };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
        const float va = value(a), vb = value(b);
        return va != vb ? va > vb : a < b;
    });
    for (int i = 0; i < k; i++) out.push_back({ids[(size_t)i], logprob(value(ids[(size_t)i]))});
    return out;
}

// The first id holding the largest value (ties keep the lowest id; NaN never wins; 0 when no
// logit is above -inf), in two 4-wide passes: max_logit, then the first id equal to it. The
// one-pass scalar scan, a compare and a branch per logit, took 0.6% of a 110M Q4_K_M decode token
// at one thread over a 32000 vocabulary.
int32_t argmax(std::span<const float> logits) {
    const size_t n = logits.size();
    const float* x = logits.data();
    const float m = max_logit(logits);
    if (!(m > k_neg_inf)) return 0;
    size_t i = 0;
#if defined(__SSE2__)
    const __m128 want = _mm_set1_ps(m);
    for (; i + 4 <= n; i += 4)
        if (const int hit = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i), want)); hit != 0)
            return static_cast<int32_t>(i + (size_t)__builtin_ctz((unsigned)hit));
#endif
    for (; i < n; ++i)
        if (x[i] == m) break;
    return static_cast<int32_t>(i);
}

float token_logprob(std::span<const float> logits, int32_t token) {
    if (token < 0 || static_cast<size_t>(token) >= logits.size()) return k_neg_inf;
    const float lt = logits[static_cast<size_t>(token)];
    const float m = max_logit(logits);
    if (m == k_neg_inf) return k_neg_inf;
    if (m == k_pos_inf) return logprob_with_pos_inf(logits, lt);
    if (!(lt > k_neg_inf)) return k_neg_inf;  // skip the pass over the vocabulary
    return logprob_from_sum(lt, m, sum_exp_shifted(logits, m));
}

double Sampler::next_uniform() {
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

Sampled Sampler::sample(std::span<const float> logits) {
    if (logits.empty()) return {-1, k_neg_inf};
    // !(t > 0) also sends a NaN temperature to greedy.
    const bool greedy = !(p_.temperature > 0.0f);
    const int32_t best = argmax(logits);
    const float m = logits[static_cast<size_t>(best)];
    // NaN never wins argmax, so m is NaN only when every logit is: the same case as all -inf.
    if (!(m > k_neg_inf)) return {0, k_neg_inf};
    if (m == k_pos_inf) {
        const float lp = logprob_with_pos_inf(logits, k_pos_inf);  // the same for every +inf token
        if (greedy) return {best, lp};
        size_t n_inf = 0;
        for (float v : logits) n_inf += (v == k_pos_inf);
        size_t pick = std::min(static_cast<size_t>(next_uniform() * static_cast<double>(n_inf)), n_inf - 1);
        for (size_t i = 0; i < logits.size(); ++i)
            if (logits[i] == k_pos_inf && pick-- == 0) return {static_cast<int32_t>(i), lp};
    }
    if (greedy) return {best, logprob_from_sum(m, m, sum_exp_shifted(logits, m))};

    const Kept kept = keep_candidates(logits, p_, m, candidates_);
    const Candidate* c = candidates_.data();
    const size_t n_keep = kept.n_keep;
    const double total = kept.total;
    const double sum_unmodified = kept.sum_unmodified;

    // Inverse CDF over the kept candidates, in their current order. Skipping zero weights (underflow
    // at low temperature) means the rounding fallback never lands on an impossible token.
    const double u = next_uniform() * total;
    double cum = 0.0;
    size_t chosen = 0;
    for (size_t i = 0; i < n_keep; ++i) {
        if (c[i].weight <= 0.0) continue;
        chosen = i;
        cum += c[i].weight;
        if (u < cum) break;
    }
    return {c[chosen].id, logprob_from_sum(c[chosen].logit, m, sum_unmodified)};
}

std::vector<TokenProb> sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
    std::vector<TokenProb> out;
    if (logits.empty()) return out;
    const int32_t best = argmax(logits);
    const float m = logits[static_cast<size_t>(best)];
    if (!(m > k_neg_inf)) return {{0, 1.0}};  // Sampler::sample answers token 0 here
    if (m == k_pos_inf) {
        if (!(p.temperature > 0.0f)) return {{best, 1.0}};
        for (size_t i = 0; i < logits.size(); ++i)
            if (logits[i] == k_pos_inf) out.push_back({static_cast<int32_t>(i), 0.0});
        for (auto& t : out) t.prob = 1.0 / static_cast<double>(out.size());
        return out;
    }
    if (!(p.temperature > 0.0f)) return {{best, 1.0}};
    std::vector<Sampler::Candidate> cands;
    const Kept kept = keep_candidates(logits, p, m, cands);
    for (size_t i = 0; i < kept.n_keep; ++i)
        if (cands[i].weight > 0.0) out.push_back({cands[i].id, cands[i].weight / kept.total});
    std::sort(out.begin(), out.end(), [](const TokenProb& a, const TokenProb& b) { return a.id < b.id; });
    return out;
}

}  // namespace steward
