// Draft token trees: flattening for the verification forward and the EAGLE-2 best-first growth.
#include "spec/token_tree.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <queue>

namespace steward {

TokenTree::TokenTree(int32_t root_token) {
    nodes_.push_back({root_token, -1, 0, 1.0f, 1.0});
    children_.emplace_back();
}

int32_t TokenTree::add(int32_t parent, int32_t token, float prob) {
    if (parent < 0 || parent >= size()) {
        std::fprintf(stderr, "TokenTree::add: parent %d is not a node of a tree of %d\n", parent, size());
        std::abort();
    }
    const TreeNode& p = nodes_[(size_t)parent];
    const int32_t id = size();
    nodes_.push_back({token, parent, p.depth + 1, prob, p.path_prob * (double)prob});
    children_.emplace_back();
    children_[(size_t)parent].push_back(id);
    return id;
}

int32_t TokenTree::max_depth() const {
    int32_t d = 0;
    for (const auto& n : nodes_) d = std::max(d, n.depth);
    return d;
}

bool TokenTree::is_chain() const {
    return std::all_of(children_.begin(), children_.end(), [](const auto& c) { return c.size() <= 1; });
}

std::vector<int32_t> TokenTree::tokens() const {
    std::vector<int32_t> out;
    out.reserve(nodes_.size());
    for (const auto& n : nodes_) out.push_back(n.token);
    return out;
}

std::vector<int32_t> TokenTree::positions(int32_t n_past) const {
    std::vector<int32_t> out;
    out.reserve(nodes_.size());
    for (const auto& n : nodes_) out.push_back(n_past + n.depth);
    return out;
}

std::vector<uint8_t> TokenTree::ancestor_mask() const {
    const size_t n = nodes_.size();
    std::vector<uint8_t> mask(n * n, 0);  // [n][n]
    for (size_t i = 0; i < n; ++i)
        // Parents come before children, so the walk up only visits ids <= i.
        for (int32_t j = (int32_t)i; j >= 0; j = nodes_[(size_t)j].parent) mask[i * n + (size_t)j] = 1;
    return mask;
}

std::vector<int32_t> TokenTree::path_to(int32_t id) const {
    std::vector<int32_t> path;
    for (int32_t j = id; j >= 0; j = nodes_[(size_t)j].parent) path.push_back(j);
    std::reverse(path.begin(), path.end());
    return path;
}

TokenTree make_chain(int32_t root_token, std::span<const int32_t> draft, std::span<const float> probs) {
    assert(probs.empty() || probs.size() == draft.size());
    TokenTree tree(root_token);
    int32_t last = 0;
    for (size_t i = 0; i < draft.size(); ++i) last = tree.add(last, draft[i], probs.empty() ? 1.0f : probs[i]);
    return tree;
}

TokenTree grow_tree(int32_t root_token, const GrowLimits& limits, const ProposeFn& propose) {
    TokenTree tree(root_token);
    struct Candidate {
        double path_prob;
        uint64_t seq;  // insertion order: ties go to the earlier candidate
        int32_t parent;
        Proposal p;
    };
    auto worse = [](const Candidate& a, const Candidate& b) {
        return a.path_prob < b.path_prob || (a.path_prob == b.path_prob && a.seq > b.seq);
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> frontier(worse);
    uint64_t seq = 0;
    auto expand = [&](int32_t id) {
        if (tree.node(id).depth >= limits.max_depth) return;  // its children would be too deep
        std::vector<Proposal> props = propose(tree, id);
        if (limits.top_k > 0 && (int32_t)props.size() > limits.top_k) props.resize((size_t)limits.top_k);
        for (const Proposal& p : props) frontier.push({tree.node(id).path_prob * (double)p.prob, seq++, id, p});
    };
    if (limits.budget <= 0) return tree;
    expand(0);
    while (tree.n_draft() < limits.budget && !frontier.empty()) {
        const Candidate c = frontier.top();
        frontier.pop();
        const int32_t id = tree.add(c.parent, c.p.token, c.p.prob);
        if (tree.n_draft() < limits.budget) expand(id);  // a full tree needs no more draft forwards
    }
    return tree;
}

TokenTree grow_tree_fixed(int32_t root_token, const GrowLimits& limits, const ProposeLevelFn& propose_level) {
    TokenTree tree(root_token);
    const int32_t branch = std::max<int32_t>(1, limits.top_k);
    std::vector<int32_t> level = {0};
    for (int32_t depth = 0; depth < limits.max_depth && !level.empty(); ++depth) {
        const int32_t room = limits.budget - tree.n_draft();
        if (room <= 0) break;
        // Only the nodes whose children fit: ceil(room / branch) of them, in order.
        level.resize(std::min(level.size(), (size_t)((room + branch - 1) / branch)));
        const std::vector<std::vector<Proposal>> props = propose_level(tree, level);
        if (props.size() != level.size()) break;
        std::vector<int32_t> next;
        for (size_t i = 0; i < level.size(); ++i)
            for (size_t c = 0; c < props[i].size() && (int32_t)c < branch && tree.n_draft() < limits.budget; ++c)
                next.push_back(tree.add(level[i], props[i][c].token, props[i][c].prob));
        level = std::move(next);
    }
    return tree;
}

TokenTree grow_tree_dynamic(int32_t root_token, const GrowLimits& limits, const ProposeLevelFn& propose_level,
                            std::vector<int32_t>* from) {
    TokenTree cand(root_token);
    const int32_t branch = std::max<int32_t>(1, limits.top_k);
    std::vector<int32_t> level = {0};
    for (int32_t depth = 0; depth < limits.max_depth && !level.empty() && limits.budget > 0; ++depth) {
        const std::vector<std::vector<Proposal>> props = propose_level(cand, level);
        if (props.size() != level.size()) break;
        std::vector<int32_t> next;
        for (size_t i = 0; i < level.size(); ++i)
            for (size_t c = 0; c < props[i].size() && (int32_t)c < branch; ++c)
                next.push_back(cand.add(level[i], props[i][c].token, props[i][c].prob));
        // The next depth expands its top_k nodes by path probability (stable: ties to the earlier).
        std::stable_sort(next.begin(), next.end(),
                         [&](int32_t a, int32_t b) { return cand.node(a).path_prob > cand.node(b).path_prob; });
        if ((int32_t)next.size() > branch) next.resize((size_t)branch);
        std::sort(next.begin(), next.end());
        level = std::move(next);
    }
    // Re-ranking: the budget best candidates, then back into id order.
    std::vector<int32_t> order;
    for (int32_t id = 1; id < cand.size(); ++id) order.push_back(id);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return cand.node(a).path_prob > cand.node(b).path_prob; });
    if ((int32_t)order.size() > limits.budget) order.resize((size_t)std::max<int32_t>(0, limits.budget));
    std::sort(order.begin(), order.end());
    TokenTree tree(root_token);
    std::vector<int32_t> new_id((size_t)cand.size(), -1);
    new_id[0] = 0;
    if (from) from->assign(1, 0);
    for (int32_t id : order) {
        const TreeNode& n = cand.node(id);
        // Connected by the ranking (a parent ranks before its child); kept robust all the same.
        if (new_id[(size_t)n.parent] < 0) continue;
        new_id[(size_t)id] = tree.add(new_id[(size_t)n.parent], n.token, n.prob);
        if (from) from->push_back(id);
    }
    return tree;
}

}  // namespace steward
