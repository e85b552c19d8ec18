// Tests of draft token trees (runtime/spec/token_tree.h): flattening and the ancestor mask against a
// hand-worked tree, chains as the causal case, and the EAGLE-2 growth against brute force.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <vector>

#include "cpu/forward.h"
#include "kv/kv_storage.h"
#include "memory_model.h"
#include "spec/token_tree.h"

using namespace steward;

namespace {

// root(10) -> a(11) -> {c(13), d(14)};  root -> b(12) -> e(15). Ids in insertion order 0..5.
TokenTree hand_tree() {
    TokenTree t(10);
    const int32_t a = t.add(0, 11, 0.6f), b = t.add(0, 12, 0.3f);
    t.add(a, 13, 0.5f);
    t.add(a, 14, 0.25f);
    t.add(b, 15, 0.9f);
    return t;
}

// A deterministic draft source: after a path, k distinct tokens with distinct probabilities that
// are a hash of the path (summing to < 1).
std::vector<Proposal> hashed_proposals(const std::vector<int32_t>& path_tokens, int k) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : path_tokens) h = (h ^ (uint64_t)t) * 1099511628211ull;
    std::vector<Proposal> out;
    double left = 0.95;
    for (int i = 0; i < k; ++i) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        const double share = 0.2 + 0.6 * (double)(h >> 11) * 0x1.0p-53;
        const float p = (float)(left * share);
        left -= p;
        out.push_back({(int32_t)(100 + i * 16 + (int)(h >> 60)), p});
    }
    std::sort(out.begin(), out.end(), [](const Proposal& a, const Proposal& b) { return a.prob > b.prob; });
    return out;
}

std::vector<int32_t> path_tokens(const TokenTree& t, int32_t id) {
    std::vector<int32_t> out;
    for (int32_t n : t.path_to(id)) out.push_back(t.node(n).token);
    return out;
}

}  // namespace

TEST_CASE("a hand-worked tree flattens to its tokens, depth positions and ancestor mask", "[spec][tree]") {
    const TokenTree t = hand_tree();
    REQUIRE(t.size() == 6);
    CHECK(t.n_draft() == 5);
    CHECK(t.max_depth() == 2);
    CHECK_FALSE(t.is_chain());
    CHECK(t.tokens() == std::vector<int32_t>{10, 11, 12, 13, 14, 15});
    CHECK(t.positions(7) == std::vector<int32_t>{7, 8, 8, 9, 9, 9});
    const std::vector<uint8_t> expected = {
        1, 0, 0, 0, 0, 0,  //
        1, 1, 0, 0, 0, 0,  //
        1, 0, 1, 0, 0, 0,  //
        1, 1, 0, 1, 0, 0,  //
        1, 1, 0, 0, 1, 0,  //
        1, 0, 1, 0, 0, 1,  //
    };
    CHECK(t.ancestor_mask() == expected);
    CHECK(t.path_to(4) == std::vector<int32_t>{0, 1, 4});
    CHECK(t.path_to(5) == std::vector<int32_t>{0, 2, 5});
    CHECK(t.node(4).path_prob == Approx(0.6 * 0.25));
    CHECK(t.node(5).depth == 2);
    CHECK(std::vector<int32_t>(t.children(1).begin(), t.children(1).end()) == std::vector<int32_t>{3, 4});
}

TEST_CASE("a chain is the degenerate tree: consecutive positions and the causal mask", "[spec][tree]") {
    const std::vector<int32_t> draft = {5, 6, 7};
    const TokenTree t = make_chain(4, draft);
    REQUIRE(t.size() == 4);
    CHECK(t.is_chain());
    CHECK(t.tokens() == std::vector<int32_t>{4, 5, 6, 7});
    CHECK(t.positions(20) == std::vector<int32_t>{20, 21, 22, 23});
    const auto mask = t.ancestor_mask();
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) CHECK(mask[(size_t)(i * 4 + j)] == (j <= i ? 1 : 0));
}

TEST_CASE("the dynamic tree keeps the budget nodes of highest path probability, as brute force finds",
          "[spec][tree]") {
    for (int top_k : {1, 2, 3}) {
        for (int max_depth : {1, 3, 5}) {
            for (int budget : {0, 1, 4, 9, 20}) {
                int n_calls = 0;
                const ProposeFn propose = [&](const TokenTree& tree, int32_t node) {
                    n_calls++;
                    return hashed_proposals(path_tokens(tree, node), 4);
                };
                const TokenTree t = grow_tree(1, {budget, max_depth, top_k}, propose);

                // Brute force: every node of the full top_k tree to max_depth, best path probabilities.
                struct Full {
                    std::vector<int32_t> path;
                    double prob;
                };
                std::vector<Full> all, level = {{{1}, 1.0}};
                for (int d = 1; d <= max_depth; ++d) {
                    std::vector<Full> next;
                    for (const Full& f : level) {
                        auto props = hashed_proposals(f.path, 4);
                        props.resize((size_t)top_k);
                        for (const Proposal& p : props) {
                            Full c = f;
                            c.path.push_back(p.token);
                            c.prob = f.prob * (double)p.prob;
                            next.push_back(c);
                        }
                    }
                    all.insert(all.end(), next.begin(), next.end());
                    level.swap(next);
                }
                std::sort(all.begin(), all.end(), [](const Full& a, const Full& b) { return a.prob > b.prob; });
                const size_t n_expected = std::min<size_t>((size_t)budget, all.size());
                std::vector<std::vector<int32_t>> want, got;
                for (size_t i = 0; i < n_expected; ++i) want.push_back(all[i].path);
                for (int32_t id = 1; id < t.size(); ++id) {
                    got.push_back(path_tokens(t, id));
                    CHECK(t.node(id).depth <= max_depth);
                }
                std::sort(want.begin(), want.end());
                std::sort(got.begin(), got.end());
                INFO("top_k " << top_k << " max_depth " << max_depth << " budget " << budget);
                CHECK(got == want);
                // Proposals are asked for nodes that may still get children, never beyond that.
                CHECK(n_calls <= std::max(1, t.size()));
            }
        }
    }
}

TEST_CASE("the dynamic tree's nodes are added best first, so each node's path probability falls",
          "[spec][tree]") {
    const ProposeFn propose = [&](const TokenTree& tree, int32_t node) {
        return hashed_proposals(path_tokens(tree, node), 3);
    };
    const TokenTree t = grow_tree(1, {12, 4, 3}, propose);
    REQUIRE(t.n_draft() == 12);
    for (int32_t id = 2; id < t.size(); ++id) CHECK(t.node(id).path_prob <= t.node(id - 1).path_prob);
}

TEST_CASE("a flattened tree verified in one forward gives each node the logits of its own path",
          "[spec][tree]") {
    const Model& m = steward_test::tiny_kv_model();
    const size_t V = (size_t)m.params().n_vocab;
    CpuForward fwd(m, 1, 64);
    KvStorage kv(KvStorage::config_for(m.params(), 4, 16, KvDtype::F32));
    const std::vector<int32_t> prompt = {1, 40, 41, 42, 43}, table = {0, 1}, other = {2, 3};
    auto run = [&](const std::vector<int32_t>& table_, int32_t n_past, std::span<const int32_t> tokens,
                   std::span<const int32_t> positions, std::span<const uint8_t> mask) {
        SeqInput s;
        s.n_past = n_past;
        s.tokens = tokens;
        s.positions = positions;
        s.mask = mask;
        s.block_table = table_;
        s.logits = LogitsMode::ALL;
        std::vector<float> logits;
        REQUIRE(fwd.forward(kv, std::span<const SeqInput>(&s, 1), logits).ok());
        return logits;
    };
    run(table, 0, prompt, {}, {});
    const TokenTree t = hand_tree();
    const auto tokens = t.tokens();
    const auto positions = t.positions((int32_t)prompt.size());
    const auto mask = t.ancestor_mask();
    const auto tree_logits = run(table, (int32_t)prompt.size(), tokens, positions, mask);
    for (int32_t id = 0; id < t.size(); ++id) {
        // The reference: the prompt then the node's path, as a plain causal sequence elsewhere in the pool.
        std::vector<int32_t> seq = prompt;
        for (int32_t n : t.path_to(id)) seq.push_back(t.node(n).token);
        const auto ref = run(other, 0, seq, {}, {});
        const size_t row = seq.size() - 1;
        for (size_t i = 0; i < V; ++i)
            REQUIRE(tree_logits[(size_t)id * V + i] == Approx(ref[row * V + i]).margin(1e-4));
    }
}

namespace {

// A level source over hashed_proposals that counts its calls (one draft forward each).
struct LevelSource {
    int n_calls = 0;
    int n_proposals = 4;
    std::vector<std::vector<Proposal>> operator()(const TokenTree& tree, std::span<const int32_t> nodes) {
        n_calls++;
        std::vector<std::vector<Proposal>> out;
        int32_t depth = -1;
        for (int32_t n : nodes) {
            if (depth >= 0) CHECK(tree.node(n).depth == depth);  // one depth per call
            depth = tree.node(n).depth;
            out.push_back(hashed_proposals(path_tokens(tree, n), n_proposals));
        }
        return out;
    }
};

}  // namespace

TEST_CASE("the fixed tree gives each node its first branch proposals breadth first, one call per depth, to the budget",
          "[spec][tree]") {
    for (int branch : {1, 2, 3}) {
        for (int max_depth : {1, 2, 4}) {
            for (int budget : {0, 1, 5, 12, 100}) {
                INFO("branch " << branch << " max_depth " << max_depth << " budget " << budget);
                LevelSource src;
                const TokenTree t = grow_tree_fixed(
                    1, {budget, max_depth, branch},
                    [&](const TokenTree& tr, std::span<const int32_t> n) { return src(tr, n); });
                // Reference: the full branch-ary tree's paths in breadth-first order, cut at the budget.
                std::vector<std::vector<int32_t>> bfs, level = {{1}};
                for (int d = 1; d <= max_depth; ++d) {
                    std::vector<std::vector<int32_t>> next;
                    for (const auto& p : level) {
                        auto props = hashed_proposals(p, 4);
                        for (int c = 0; c < branch; ++c) {
                            auto q = p;
                            q.push_back(props[(size_t)c].token);
                            next.push_back(q);
                        }
                    }
                    bfs.insert(bfs.end(), next.begin(), next.end());
                    level.swap(next);
                }
                if ((int)bfs.size() > budget) bfs.resize((size_t)budget);
                REQUIRE(t.n_draft() == (int)bfs.size());
                for (int32_t id = 1; id < t.size(); ++id) CHECK(path_tokens(t, id) == bfs[(size_t)id - 1]);
                CHECK(src.n_calls <= max_depth);
                CHECK((branch > 1 || t.is_chain()));
            }
        }
    }
}

TEST_CASE("the dynamic tree keeps the budget best of EAGLE-2's expanded candidates, connected, one call per depth",
          "[spec][tree]") {
    for (int branch : {1, 2, 3}) {
        for (int max_depth : {1, 3, 5}) {
            for (int budget : {0, 1, 4, 9, 30}) {
                INFO("branch " << branch << " max_depth " << max_depth << " budget " << budget);
                LevelSource src;
                std::vector<int32_t> from;
                const TokenTree t = grow_tree_dynamic(
                    1, {budget, max_depth, branch},
                    [&](const TokenTree& tr, std::span<const int32_t> n) { return src(tr, n); }, &from);
                // Reference over token paths: each depth's candidates are the top `branch` proposals of
                // the previous depth's `branch` best candidates; keep the budget best of them all.
                struct Cand {
                    std::vector<int32_t> path;
                    double prob;
                };
                std::vector<Cand> all, level = {{{1}, 1.0}};
                for (int d = 1; d <= max_depth && budget > 0; ++d) {
                    std::vector<Cand> next;
                    for (const Cand& c : level) {
                        auto props = hashed_proposals(c.path, 4);
                        for (int i = 0; i < branch; ++i) {
                            Cand n = c;
                            n.path.push_back(props[(size_t)i].token);
                            n.prob = c.prob * (double)props[(size_t)i].prob;
                            next.push_back(n);
                        }
                    }
                    all.insert(all.end(), next.begin(), next.end());
                    std::stable_sort(next.begin(), next.end(), [](const Cand& a, const Cand& b) { return a.prob > b.prob; });
                    if ((int)next.size() > branch) next.resize((size_t)branch);
                    level = next;
                }
                std::stable_sort(all.begin(), all.end(), [](const Cand& a, const Cand& b) { return a.prob > b.prob; });
                if ((int)all.size() > budget) all.resize((size_t)budget);
                std::vector<std::vector<int32_t>> want, got;
                for (const Cand& c : all) want.push_back(c.path);
                for (int32_t id = 1; id < t.size(); ++id) {
                    got.push_back(path_tokens(t, id));
                    CHECK(t.node(id).parent < id);  // parents first
                    CHECK(t.node(id).depth <= max_depth);
                }
                std::sort(want.begin(), want.end());
                std::sort(got.begin(), got.end());
                CHECK(got == want);
                CHECK(src.n_calls <= max_depth);
                CHECK(from.size() == (size_t)t.size());
            }
        }
    }
}
