// Greedy and lossless sampled verification of draft trees (see acceptance.h for the rules).
#include "spec/acceptance.h"

#include <algorithm>
#include <cassert>

namespace steward {

namespace {

// Sampler's uniform: 53 random bits in [0, 1).
double next_uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Inverse CDF over ids in ascending order, zero weights skipped, so rounding never lands on an
// impossible token. w must have some positive weight.
int32_t draw(const std::vector<double>& w, std::mt19937_64& rng) {
    double total = 0.0;
    for (double x : w) total += x;
    const double u = next_uniform(rng) * total;
    double cum = 0.0;
    int32_t chosen = -1;
    for (size_t i = 0; i < w.size(); ++i) {
        if (w[i] <= 0.0) continue;
        chosen = (int32_t)i;
        cum += w[i];
        if (u < cum) break;
    }
    return chosen;
}

std::vector<double> dense_target(std::span<const float> row, const SamplingParams& params) {
    std::vector<double> p(row.size(), 0.0);
    for (const TokenProb& t : sampling_distribution(row, params)) p[(size_t)t.id] = t.prob;
    return p;
}

void normalise(std::vector<double>& w) {
    double total = 0.0;
    for (double x : w) total += x;
    if (total > 0.0)
        for (double& x : w) x /= total;
}

}  // namespace

std::vector<float> dense_distribution(std::span<const float> logits, const SamplingParams& params) {
    std::vector<float> q(logits.size(), 0.0f);
    for (const TokenProb& t : sampling_distribution(logits, params)) q[(size_t)t.id] = (float)t.prob;
    return q;
}

Verdict verify_greedy(const TokenTree& tree, std::span<const float> target_logits, int32_t n_vocab) {
    assert(target_logits.size() == (size_t)tree.size() * (size_t)n_vocab);
    Verdict v;
    for (;;) {
        const int32_t best = argmax(target_logits.subspan((size_t)v.last * (size_t)n_vocab, (size_t)n_vocab));
        int32_t next = -1;
        for (int32_t c : tree.children(v.last))
            if (tree.node(c).token == best) {
                next = c;
                break;
            }
        if (next < 0) {
            v.token = best;
            return v;
        }
        v.accepted.push_back(next);
        v.last = next;
    }
}

Verdict verify_sampled(const TokenTree& tree, std::span<const float> target_logits, int32_t n_vocab,
                       const SamplingParams& params, DraftKind kind, std::span<const float> draft_probs,
                       std::mt19937_64& rng) {
    if (!(params.temperature > 0.0f)) return verify_greedy(tree, target_logits, n_vocab);
    const size_t V = (size_t)n_vocab;
    assert(target_logits.size() == (size_t)tree.size() * V);
    assert(kind == DraftKind::CHOSEN || draft_probs.size() == (size_t)tree.size() * V);
    Verdict v;
    std::vector<double> q(V);
    for (;;) {
        std::vector<double> p = dense_target(target_logits.subspan((size_t)v.last * V, V), params);
        const auto kids = tree.children(v.last);
        if (kind == DraftKind::SAMPLED && !kids.empty()) {
            const auto row = draft_probs.subspan((size_t)v.last * V, V);
            std::copy(row.begin(), row.end(), q.begin());
            normalise(q);
        }
        int32_t next = -1;
        for (int32_t c : kids) {
            const auto x = (size_t)tree.node(c).token;
            if (x >= V) continue;
            if (kind == DraftKind::CHOSEN) {
                // q = delta(x): accept with min(1, p(x) / 1); residual max(0, p - delta(x)) = p without x.
                if (next_uniform(rng) < p[x]) {
                    next = c;
                    break;
                }
                p[x] = 0.0;
                normalise(p);
            } else {
                if (!(q[x] > 0.0)) continue;  // already rejected (a repeated token) or never drawable
                if (next_uniform(rng) < std::min(1.0, p[x] / q[x])) {
                    next = c;
                    break;
                }
                double mass = 0.0;
                for (size_t i = 0; i < V; ++i) mass += (p[i] = std::max(0.0, p[i] - q[i]));
                // p <= q everywhere means p == q (both sum to 1), where rejection has probability 0:
                // only rounding gets here, and p is left as it was rather than emptied.
                if (mass > 0.0) {
                    for (double& w : p) w /= mass;
                } else {
                    p = dense_target(target_logits.subspan((size_t)v.last * V, V), params);
                }
                q[x] = 0.0;  // sampled without replacement: the next sibling was drawn from q without x
                normalise(q);
            }
        }
        if (next < 0) {
            v.token = draw(p, rng);
            return v;
        }
        v.accepted.push_back(next);
        v.last = next;
    }
}

}  // namespace steward
