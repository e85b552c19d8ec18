// Tests of draft verification (runtime/spec/acceptance.h): greedy acceptance on constructed logits,
// and THE statistical test: with speculation, the first emitted tokens are distributed as the
// target's own sampler (after temperature / top-k / top-p), for chains and trees, and wrong rules fail.
#include <algorithm>
#include <cassert>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "chi_square.h"
#include "spec/acceptance.h"

using namespace steward;
using steward_test::chi_square;

namespace {

constexpr int32_t V = 6;  // a small vocabulary: every (first, second) token pair is a cell

// The sampler's distribution computed independently of sampling.h: softmax(l / T), top_k largest
// kept, the smallest prefix of mass >= top_p kept (logits here have no ties), renormalised.
std::vector<double> reference_dist(const std::vector<float>& l, const SamplingParams& sp) {
    std::vector<int> order(l.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return l[(size_t)a] > l[(size_t)b]; });
    size_t n = sp.top_k > 0 ? std::min<size_t>((size_t)sp.top_k, l.size()) : l.size();
    std::vector<double> w(l.size(), 0.0);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i)
        total += (w[(size_t)order[i]] = std::exp(((double)l[(size_t)order[i]] - l[(size_t)order[0]]) / sp.temperature));
    if (sp.top_p < 1.0f) {
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i)
            if ((cum += w[(size_t)order[i]]) >= sp.top_p * total) {
                keep = i + 1;
                break;
            }
        for (size_t i = keep; i < n; ++i) w[(size_t)order[i]] = 0.0;
    }
    const double s = std::accumulate(w.begin(), w.end(), 0.0);
    for (double& x : w) x /= s;
    return w;
}

int32_t draw_from(const std::vector<double>& w, std::mt19937_64& rng) {
    double u = (double)(rng() >> 11) * 0x1.0p-53 * std::accumulate(w.begin(), w.end(), 0.0), cum = 0.0;
    int32_t last = 0;
    for (size_t i = 0; i < w.size(); ++i) {
        if (w[i] <= 0.0) continue;
        last = (int32_t)i;
        if (u < (cum += w[i])) return last;
    }
    return last;
}

// Draws k distinct tokens from q one after the other without replacement.
std::vector<int32_t> draw_without_replacement(std::vector<double> q, int k, std::mt19937_64& rng) {
    std::vector<int32_t> out;
    for (int i = 0; i < k; ++i) {
        const int32_t x = draw_from(q, rng);
        out.push_back(x);
        q[(size_t)x] = 0.0;
    }
    return out;
}

std::vector<int32_t> top_tokens(const std::vector<double>& q, int k) {
    std::vector<int32_t> ids(q.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return q[(size_t)a] > q[(size_t)b]; });
    ids.resize((size_t)k);
    return ids;
}

// A two-level world: target logits at the root and after each first token; a draft q that
// disagrees often (its own, flatter logits, favouring other tokens).
struct World {
    std::vector<float> target0;                 // [V]
    std::vector<std::vector<float>> target1;    // [V][V], after first token x
    std::vector<double> draft0;                 // [V]
    std::vector<std::vector<double>> draft1;    // [V][V]
};

World make_world(uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto logits = [&](float scale) {
        std::vector<float> l((size_t)V);
        for (auto& x : l) x = scale * (float)((double)(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        return l;
    };
    auto softmax = [](const std::vector<float>& l) {
        std::vector<double> p(l.size());
        double s = 0.0;
        for (size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp((double)l[i]));
        for (auto& x : p) x /= s;
        return p;
    };
    World w;
    w.target0 = logits(3.0f);
    w.draft0 = softmax(logits(2.0f));
    for (int x = 0; x < V; ++x) {
        w.target1.push_back(logits(3.0f));
        w.draft1.push_back(softmax(logits(2.0f)));
    }
    return w;
}

enum class Shape { CHAIN, TREE_SAMPLED, TREE_CHOSEN };
enum class Rule { LOSSLESS, ACCEPT_ALWAYS, RESAMPLE_FROM_P };

// One speculative step in `world`; returns the first two tokens the sequence emits (the second
// drawn from the target after the first when the step emitted only one, as the next step would).
struct Trial {
    const World& w;
    SamplingParams sp;
    Shape shape;
    Rule rule = Rule::LOSSLESS;

    std::pair<int32_t, int32_t> run(std::mt19937_64& draft_rng, std::mt19937_64& verify_rng) const {
        TokenTree tree(0);
        std::vector<float> tl, dq;  // [n][V] target logits, draft probabilities per node
        auto push_rows = [&](const std::vector<float>& t, const std::vector<double>* q) {
            tl.insert(tl.end(), t.begin(), t.end());
            for (int i = 0; i < V; ++i) dq.push_back(q ? (float)(*q)[(size_t)i] : 0.0f);
        };
        push_rows(w.target0, &w.draft0);
        const int n_root = shape == Shape::CHAIN ? 1 : 3, n_child = shape == Shape::CHAIN ? 1 : 2;
        auto pick = [&](const std::vector<double>& q, int k) {
            return shape == Shape::TREE_CHOSEN ? top_tokens(q, k) : draw_without_replacement(q, k, draft_rng);
        };
        std::vector<int32_t> firsts;
        for (int32_t x : pick(w.draft0, n_root)) {
            firsts.push_back(tree.add(0, x, (float)w.draft0[(size_t)x]));
            push_rows(w.target1[(size_t)x], &w.draft1[(size_t)x]);
        }
        for (int32_t f : firsts) {
            const auto& q1 = w.draft1[(size_t)tree.node(f).token];
            for (int32_t y : pick(q1, n_child)) {
                tree.add(f, y, (float)q1[(size_t)y]);
                push_rows(w.target0, nullptr);  // depth 2: rows past the first two tokens, unread here
            }
        }
        assert((int32_t)tl.size() == tree.size() * V);
        const DraftKind kind = shape == Shape::TREE_CHOSEN ? DraftKind::CHOSEN : DraftKind::SAMPLED;

        std::vector<int32_t> emitted;
        if (rule == Rule::LOSSLESS) {
            const Verdict v = verify_sampled(tree, tl, V, sp, kind, dq, verify_rng);
            for (int32_t id : v.accepted) emitted.push_back(tree.node(id).token);
            emitted.push_back(v.token);
        } else if (rule == Rule::ACCEPT_ALWAYS) {
            for (int32_t id = 0; !tree.children(id).empty();) emitted.push_back(tree.node(id = tree.children(id)[0]).token);
        } else {  // the classic mistake: on rejection, sample the target itself instead of the residual
            int32_t id = 0;
            for (;;) {
                const auto kids = tree.children(id);
                const auto p = reference_dist(std::vector<float>(tl.begin() + id * V, tl.begin() + (id + 1) * V), sp);
                if (kids.empty()) {
                    emitted.push_back(draw_from(p, verify_rng));
                    break;
                }
                const int32_t x = tree.node(kids[0]).token;
                const double q = dq[(size_t)(id * V + x)];
                if ((double)(verify_rng() >> 11) * 0x1.0p-53 < std::min(1.0, p[(size_t)x] / q)) {
                    emitted.push_back(x);
                    id = kids[0];
                } else {
                    emitted.push_back(draw_from(p, verify_rng));
                    break;
                }
            }
        }
        const int32_t first = emitted[0];
        const int32_t second = emitted.size() > 1 ? emitted[1] : draw_from(reference_dist(w.target1[(size_t)first], sp), verify_rng);
        return {first, second};
    }
};

struct Fit {
    steward_test::ChiSquare first, pair;
};

// n trials; chi-square of the first token (df = support - 1) and the (first, second) pair against
// the target's own distribution.
Fit fit(const Trial& trial, int n, uint64_t seed) {
    std::mt19937_64 draft_rng(seed), verify_rng(seed ^ 0x9e3779b97f4a7c15ull);
    std::vector<int64_t> first((size_t)V, 0), pair((size_t)(V * V), 0);
    for (int i = 0; i < n; ++i) {
        const auto [a, b] = trial.run(draft_rng, verify_rng);
        first[(size_t)a]++;
        pair[(size_t)(a * V + b)]++;
    }
    const auto p0 = reference_dist(trial.w.target0, trial.sp);
    std::vector<double> p01((size_t)(V * V));
    for (int a = 0; a < V; ++a) {
        const auto p1 = reference_dist(trial.w.target1[(size_t)a], trial.sp);
        for (int b = 0; b < V; ++b) p01[(size_t)(a * V + b)] = p0[(size_t)a] * p1[(size_t)b];
    }
    return {chi_square(first, p0), chi_square(pair, p01)};
}

SamplingParams params(float temperature, int top_k, float top_p) {
    SamplingParams sp;
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = top_p;
    return sp;
}

// The threshold: a correct rule fails with probability 1e-3 per statistic (fixed seeds make the
// run reproducible, so a pass is a pass every time). Degrees of freedom: the cells of nonzero target
// probability minus 1: first token 5 (V = 6) or top_k - 1; the pair up to 35.
constexpr double kMinPValue = 1e-3;
constexpr int kTrials = 200000;

}  // namespace

TEST_CASE("greedy verification accepts while the draft matches the target's argmax, then adds its token",
          "[spec][acceptance]") {
    // root(10) -> a(11) -> {c(13), d(14)};  root -> b(12) -> e(15)
    TokenTree t(10);
    const int32_t a = t.add(0, 11, 0.6f), b = t.add(0, 12, 0.3f);
    t.add(a, 13, 0.5f);
    t.add(a, 14, 0.25f);
    const int32_t e = t.add(b, 15, 0.9f);
    const int32_t n_vocab = 20;
    std::vector<float> logits((size_t)(t.size() * n_vocab), 0.0f);
    auto set_best = [&](int32_t node, int32_t token) { logits[(size_t)(node * n_vocab + token)] = 5.0f; };
    set_best(0, 12);  // picks b, the second sibling
    set_best(b, 15);  // then e, a leaf
    set_best(e, 3);   // the bonus token
    Verdict v = verify_greedy(t, logits, n_vocab);
    CHECK(v.accepted == std::vector<int32_t>{b, e});
    CHECK(v.last == e);
    CHECK(v.token == 3);

    // A mismatch at the root: nothing accepted, the target's token replaces the draft.
    std::fill(logits.begin(), logits.end(), 0.0f);
    set_best(0, 7);
    v = verify_greedy(t, logits, n_vocab);
    CHECK(v.accepted.empty());
    CHECK(v.last == 0);
    CHECK(v.token == 7);

    // A mismatch below a match: a is kept, neither c nor d is the argmax there; ties go to the lower id.
    std::fill(logits.begin(), logits.end(), 0.0f);
    set_best(0, 11);
    logits[(size_t)(a * n_vocab + 9)] = 2.0f;
    logits[(size_t)(a * n_vocab + 14)] = 1.0f;
    v = verify_greedy(t, logits, n_vocab);
    CHECK(v.accepted == std::vector<int32_t>{a});
    CHECK(v.token == 9);
    std::fill(logits.begin() + a * n_vocab, logits.begin() + (a + 1) * n_vocab, 0.0f);  // all tied: id 0
    v = verify_greedy(t, logits, n_vocab);
    CHECK(v.token == 0);

    // Greedy sampling parameters take the same path through verify_sampled.
    std::mt19937_64 rng(1);
    const Verdict vs = verify_sampled(t, logits, n_vocab, SamplingParams{}, DraftKind::CHOSEN, {}, rng);
    CHECK(vs.accepted == v.accepted);
    CHECK(vs.token == v.token);
}

TEST_CASE("sampled verification is deterministic given the rng's seed", "[spec][acceptance]") {
    const World w = make_world(3);
    const Trial trial{w, params(1.0f, 0, 1.0f), Shape::TREE_SAMPLED};
    std::vector<std::pair<int32_t, int32_t>> a, b;
    for (auto* out : {&a, &b}) {
        std::mt19937_64 d(5), v(6);
        for (int i = 0; i < 200; ++i) out->push_back(trial.run(d, v));
    }
    CHECK(a == b);
}

TEST_CASE("with speculation the first tokens are distributed exactly as the target's, for chains and trees",
          "[spec][acceptance][statistical]") {
    const World w = make_world(17);
    // The draft must disagree often for the test to mean something: its overlap with the target
    // at the root, sum min(p, q), is the chain's acceptance rate of the first token.
    const auto p0 = reference_dist(w.target0, params(1.0f, 0, 1.0f));
    double overlap = 0.0;
    for (int i = 0; i < V; ++i) overlap += std::min(p0[(size_t)i], w.draft0[(size_t)i]);
    CHECK(overlap < 0.7);

    for (const SamplingParams& sp : {params(1.0f, 0, 1.0f), params(0.7f, 4, 1.0f), params(1.3f, 0, 0.8f)}) {
        for (Shape shape : {Shape::CHAIN, Shape::TREE_SAMPLED, Shape::TREE_CHOSEN}) {
            const Fit f = fit(Trial{w, sp, shape}, kTrials, 101 + (uint64_t)shape);
            INFO("T " << sp.temperature << " top_k " << sp.top_k << " top_p " << sp.top_p << " shape " << (int)shape
                      << ": first chi2 " << f.first.statistic << " df " << f.first.df << " p " << f.first.p_value
                      << "; pair chi2 " << f.pair.statistic << " df " << f.pair.df << " p " << f.pair.p_value);
            if (sp.top_k > 0) CHECK(f.first.df == sp.top_k - 1);
            if (sp.top_k == 0 && sp.top_p == 1.0f) CHECK(f.first.df == V - 1);
            CHECK(f.first.p_value > kMinPValue);
            CHECK(f.pair.p_value > kMinPValue);
        }
    }
}

TEST_CASE("the statistical test has teeth: accepting always or resampling the target on rejection fails it",
          "[spec][acceptance][statistical]") {
    const World w = make_world(17);
    const SamplingParams sp = params(1.0f, 0, 1.0f);
    for (Rule rule : {Rule::ACCEPT_ALWAYS, Rule::RESAMPLE_FROM_P}) {
        Trial trial{w, sp, Shape::CHAIN};
        trial.rule = rule;
        const Fit f = fit(trial, kTrials, 7);
        INFO("rule " << (int)rule << ": first chi2 " << f.first.statistic << " p " << f.first.p_value);
        CHECK(f.first.p_value < kMinPValue);
        CHECK(f.pair.p_value < kMinPValue);
    }
}

TEST_CASE("sampling_distribution is the distribution Sampler::sample draws from", "[spec][acceptance][statistical]") {
    const World w = make_world(29);
    for (const SamplingParams& base : {params(1.0f, 0, 1.0f), params(0.6f, 3, 1.0f), params(1.5f, 0, 0.7f)}) {
        const auto dist = sampling_distribution(w.target0, base);
        const auto ref = reference_dist(w.target0, base);
        std::vector<double> dense((size_t)V, 0.0);
        for (const TokenProb& t : dist) dense[(size_t)t.id] = t.prob;
        for (int i = 0; i < V; ++i) CHECK(dense[(size_t)i] == Approx(ref[(size_t)i]).margin(1e-6));
        SamplingParams sp = base;
        sp.seed = 99;
        Sampler s(sp);
        std::vector<int64_t> counts((size_t)V, 0);
        for (int i = 0; i < 100000; ++i) counts[(size_t)s.sample(w.target0).token]++;
        CHECK(chi_square(counts, dense).p_value > kMinPValue);
    }
    // Greedy: the argmax alone.
    const auto g = sampling_distribution(w.target0, SamplingParams{});
    REQUIRE(g.size() == 1);
    CHECK(g[0].id == argmax(w.target0));
    CHECK(g[0].prob == 1.0);
}
