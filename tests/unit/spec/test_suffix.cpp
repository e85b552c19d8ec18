// Suffix decoding's drafts (runtime/spec/suffix.h) against a naive reference over random texts,
// what a draft may contain (only what followed a match, never another tenant's text), and the
// corpus's memory caps under random use.
#include <catch2/catch.hpp>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "spec/suffix.h"

using namespace steward;

namespace {

std::vector<int32_t> random_text(std::mt19937& rng, int n, int alphabet, int base = 0) {
    std::vector<int32_t> t((size_t)n);
    // Repetitive: copies of earlier stretches with a few changes, as agent text is.
    for (int i = 0; i < n; i++) {
        if (i > 8 && rng() % 3 != 0) {
            const int from = (int)(rng() % (unsigned)i);
            t[(size_t)i] = t[(size_t)from];
            const int run = 1 + (int)(rng() % 6);
            for (int j = 1; j < run && i + 1 < n; j++) t[(size_t)++i] = t[(size_t)std::min(from + j, i - 1)];
        } else {
            t[(size_t)i] = base + (int)(rng() % (unsigned)alphabet);
        }
    }
    return t;
}

// The reference: every occurrence in order (the context's latest first, then each text newest first
// at its latest position first), its match length by direct comparison, the longest kept (the first
// max_occurrences of them), then the most frequent next token (ties: the first in that order) while
// the product of shares stays at or above min_prob.
// An occurrence: its text, the position after the match and the match's length.
struct O {
    const std::vector<int32_t>* t;
    int p, l;
};

// The occurrences of the reference: every one in order (the context's latest first, then each text
// newest first at its latest position first), its match length by direct comparison, the longest
// kept (the first max_occurrences of them). *best: that length.
std::vector<O> naive_occurrences(const std::vector<int32_t>& ctx, const std::deque<std::vector<int32_t>>& texts,
                                 const SuffixParams& pr, int* best) {
    const int len = (int)ctx.size(), m = pr.min_match;
    std::vector<O> all;
    auto scan = [&](const std::vector<int32_t>& t, int n) {
        for (int p = n - 1; p >= m; --p) {
            int l = 0;
            while (l < std::min({pr.max_match, p, len}) && t[(size_t)(p - 1 - l)] == ctx[(size_t)(len - 1 - l)]) l++;
            if (l >= m) all.push_back({&t, p, l});
        }
    };
    *best = 0;
    if (len < m) return {};
    scan(ctx, len);
    for (const auto& t : texts) scan(t, (int)t.size());
    for (const O& o : all) *best = std::max(*best, o.l);
    std::vector<O> occ;
    for (const O& o : all)
        if (o.l == *best && (int)occ.size() < pr.max_occurrences) occ.push_back(o);
    return occ;
}

SuffixDraft naive(const std::vector<int32_t>& ctx, const std::deque<std::vector<int32_t>>& texts, const SuffixParams& pr) {
    SuffixDraft d;
    d.prob = 1;
    if (pr.k <= 0) return d;
    int best = 0;
    std::vector<O> occ = naive_occurrences(ctx, texts, pr, &best);
    if (occ.empty()) return d;
    d.match_len = best;
    d.n_occurrences = (int)occ.size();
    auto size_of = [&](const O& o) { return (int)o.t->size(); };
    for (int j = 0; j < pr.k; j++) {
        std::vector<std::pair<int32_t, int>> counts;
        int total = 0;
        for (const O& o : occ) {
            if (o.p + j >= size_of(o)) continue;
            const int32_t tok = (*o.t)[(size_t)(o.p + j)];
            total++;
            bool found = false;
            for (auto& c : counts)
                if (c.first == tok) c.second++, found = true;
            if (!found) counts.emplace_back(tok, 1);
        }
        if (total == 0) break;
        size_t top = 0;
        for (size_t i = 1; i < counts.size(); i++)
            if (counts[i].second > counts[top].second) top = i;
        const double prob = d.prob * counts[top].second / total;
        if (prob < pr.min_prob) break;
        d.prob = prob;
        d.tokens.push_back(counts[top].first);
        std::vector<O> kept;
        for (const O& o : occ)
            if (o.p + j < size_of(o) && (*o.t)[(size_t)(o.p + j)] == counts[top].first) kept.push_back(o);
        occ = kept;
    }
    return d;
}

}  // namespace

TEST_CASE("Suffix drafts equal a naive search over the context and the tenant's outputs", "[spec][suffix]") {
    std::mt19937 rng(4242);
    for (int round = 0; round < 300; round++) {
        SuffixParams pr;
        pr.min_match = 1 + (int)(rng() % 3);
        pr.max_match = pr.min_match + (int)(rng() % 8);
        pr.k = (int)(rng() % 10);
        pr.min_prob = (rng() % 4) * 0.15;
        pr.max_occurrences = 1 + (int)(rng() % 12);
        const int alphabet = 3 + (int)(rng() % 6);
        SuffixCorpus corpus({1 << 20, 1 << 20, 4096}, pr.min_match);
        const SuffixKey key{1, "agent"};
        const int n_texts = (int)(rng() % 5);
        std::deque<std::vector<int32_t>> texts;
        for (int i = 0; i < n_texts; i++) {
            auto t = random_text(rng, 2 + (int)(rng() % 60), alphabet);
            corpus.add(key, t);
            if ((int)t.size() >= pr.min_match + 1) texts.push_front(t);
        }
        const auto ctx = random_text(rng, (int)(rng() % 80), alphabet);
        const SuffixDraft got = suffix_propose(ctx, corpus.texts(key), pr);
        const SuffixDraft want = naive(ctx, texts, pr);
        INFO("round " << round);
        CHECK(got.tokens == want.tokens);
        CHECK(got.match_len == want.match_len);
        CHECK(got.n_occurrences == want.n_occurrences);
        CHECK(got.prob == Approx(want.prob));
        CHECK((int)got.tokens.size() <= std::max(pr.k, 0));
        CHECK((got.tokens.empty() || got.prob >= pr.min_prob));
        // What a draft is, whatever the search: the tokens that followed one occurrence of the tail.
        if (!got.tokens.empty()) {
            bool seen = false;
            auto follows = [&](const std::vector<int32_t>& t, int limit) {
                const size_t L = (size_t)got.match_len, J = got.tokens.size();
                for (size_t p = L; p + J <= (size_t)limit && !seen; p++)
                    seen = std::equal(t.begin() + (long)(p - L), t.begin() + (long)p, ctx.end() - (long)L) &&
                           std::equal(got.tokens.begin(), got.tokens.end(), t.begin() + (long)p);
            };
            follows(ctx, (int)ctx.size());
            for (const auto& t : texts) follows(t, (int)t.size());
            CHECK(seen);
        }
    }
}

TEST_CASE("Suffix trees hold the k most probable continuations of a naive trie over the occurrences", "[spec][suffix]") {
    std::mt19937 rng(777);
    int n_branching = 0;
    for (int round = 0; round < 300; round++) {
        SuffixParams pr;
        pr.min_match = 1 + (int)(rng() % 2);
        pr.max_match = pr.min_match + (int)(rng() % 8);
        pr.k = (int)(rng() % 12);
        pr.min_prob = (rng() % 4) * 0.1;
        pr.max_occurrences = 1 + (int)(rng() % 12);
        const int max_depth = 1 + (int)(rng() % 8);
        const int alphabet = 3 + (int)(rng() % 5);
        SuffixCorpus corpus({1 << 20, 1 << 20, 4096}, pr.min_match);
        const SuffixKey key{1, "agent"};
        std::deque<std::vector<int32_t>> texts;
        for (int i = 0, n = (int)(rng() % 5); i < n; i++) {
            auto t = random_text(rng, 2 + (int)(rng() % 60), alphabet);
            corpus.add(key, t);
            if ((int)t.size() >= pr.min_match + 1) texts.push_front(t);
        }
        const auto ctx = random_text(rng, (int)(rng() % 80), alphabet);
        const SuffixTree got = suffix_propose_tree(ctx, corpus.texts(key), pr, max_depth);
        INFO("round " << round);
        // The reference: the chain reference's occurrences, then every node of the trie of their
        // continuations: a child's probability is its parent's times its token's share among the
        // parent's occurrences that continue; kept at min_prob and above, max_depth deep.
        int best = 0;
        const std::vector<O> occ = naive_occurrences(ctx, texts, pr, &best);
        CHECK(got.match_len == (pr.k > 0 ? best : 0));
        std::map<std::vector<int32_t>, double> trie;  // path -> probability
        std::function<void(const std::vector<int32_t>&, const std::vector<O>&, double)> grow =
            [&](const std::vector<int32_t>& path, const std::vector<O>& os, double prob) {
                const int d = (int)path.size();
                if (d >= max_depth) return;
                std::map<int32_t, std::vector<O>> next;
                int total = 0;
                for (const O& o : os)
                    if (o.p + d < (int)o.t->size()) next[(*o.t)[(size_t)(o.p + d)]].push_back(o), total++;
                for (const auto& [tok, g] : next) {
                    const double p = prob * (double)g.size() / total;
                    if (p < pr.min_prob) continue;
                    std::vector<int32_t> child = path;
                    child.push_back(tok);
                    trie[child] = p;
                    grow(child, g, p);
                }
            };
        if (pr.k > 0) grow({}, occ, 1.0);
        std::vector<double> want;
        for (const auto& [path, p] : trie) want.push_back(p);
        std::sort(want.rbegin(), want.rend());
        if ((int)want.size() > pr.k) want.resize((size_t)std::max(pr.k, 0));
        std::vector<double> have = got.probs;
        std::sort(have.rbegin(), have.rend());
        REQUIRE(have.size() == want.size());
        for (size_t i = 0; i < have.size(); i++) CHECK(have[i] == Approx(want[i]));
        // Each node's path is a path of the trie with that probability; parents come first.
        bool branches = false;
        for (size_t i = 0; i < got.tokens.size(); i++) {
            REQUIRE(got.parents[i] >= 0);
            REQUIRE(got.parents[i] <= (int32_t)i);
            branches = branches || got.parents[i] != (int32_t)i;
            std::vector<int32_t> path{got.tokens[i]};
            for (int32_t q = got.parents[i]; q > 0; q = got.parents[(size_t)q - 1]) path.insert(path.begin(), got.tokens[(size_t)q - 1]);
            REQUIRE(trie.count(path) == 1);
            CHECK(trie.at(path) == Approx(got.probs[i]));
            CHECK((int)path.size() <= max_depth);
        }
        n_branching += branches;
    }
    CHECK(n_branching > 30);  // the rounds exercise branching, not only chains
}

TEST_CASE("A suffix draft never holds a token of another tenant's outputs", "[spec][suffix]") {
    // Every tenant writes a shared stretch, then tokens only it uses (its own id range). A request of
    // tenant t whose context ends in the shared stretch drafts from t's outputs alone.
    std::mt19937 rng(77);
    SuffixCorpus corpus({4000, 9000, 512}, 2);
    const std::vector<int32_t> shared = {5, 6, 7, 8, 9, 10};
    for (int step = 0; step < 400; step++) {
        const int32_t tenant = (int32_t)(rng() % 4);
        const std::string bucket = rng() % 2 ? "agent" : "other";
        if (rng() % 5 == 0) {
            std::vector<int32_t> out = shared;
            for (int i = 0; i < 1 + (int)(rng() % 40); i++) out.push_back(1000 * (tenant + 1) + (int)(rng() % 7));
            corpus.add({tenant, bucket}, out);
        } else if (rng() % 50 == 0) {
            corpus.drop_tenant(tenant);
        }
        const int32_t asker = (int32_t)(rng() % 4);
        std::vector<int32_t> ctx = {1, 2, 3};
        ctx.insert(ctx.end(), shared.begin(), shared.begin() + 2 + (long)(rng() % 4));
        SuffixParams pr;
        pr.min_prob = 0;
        const SuffixDraft d = suffix_propose(ctx, corpus.texts({asker, bucket}), pr);
        for (int32_t tok : d.tokens) {
            INFO("tenant " << asker << " drafted " << tok);
            CHECK((tok < 1000 || tok / 1000 == asker + 1));
        }
        REQUIRE(corpus.check_invariants() == "");
    }
}

TEST_CASE("The suffix corpus holds its caps per key and overall, oldest outputs first", "[spec][suffix]") {
    std::mt19937 rng(9);
    const SuffixLimits lim{300, 1000, 120};
    SuffixCorpus corpus(lim, 3);
    for (int step = 0; step < 2000; step++) {
        const SuffixKey key{(int32_t)(rng() % 6), rng() % 3 ? "a" : "b"};
        const int n = 1 + (int)(rng() % 200);
        std::vector<int32_t> out((size_t)n);
        for (auto& t : out) t = (int32_t)(rng() % 50);
        corpus.add(key, out);
        REQUIRE(corpus.check_invariants() == "");
        REQUIRE(corpus.n_tokens() <= lim.tokens_total);
        REQUIRE(corpus.n_tokens(key) <= lim.tokens_per_key);
        if (const auto* texts = corpus.texts(key)) {
            // The newest output is kept (it fits both caps), truncated to its last max_text tokens.
            if (n >= 4) REQUIRE(texts->front().tokens == std::vector<int32_t>(out.end() - std::min(n, 120), out.end()));
        }
    }
    CHECK(corpus.n_evicted_texts() > 0);
}
