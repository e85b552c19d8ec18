// A draft token tree for one verification forward (SpecInfer): the root is the last accepted token,
// the draft tokens hang below it; flattening gives SeqInput's tokens, positions and tree mask.
// A chain is the degenerate tree. grow_tree builds the EAGLE-2 dynamic tree from a draft source.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace steward {

struct TreeNode {
    int32_t token = -1;
    int32_t parent = -1;     // -1 for the root
    int32_t depth = 0;       // the root is 0; its RoPE position is n_past + depth
    float prob = 1.0f;       // the draft's probability of token after the path to parent (root: 1)
    double path_prob = 1.0;  // product of prob from the root down (the draft's confidence in the path)
};

// Nodes are kept in insertion order, which is the flattened order: a parent always comes before
// its children, so node i's KV is written to slot n_past + i in the verification forward, and
// siblings keep the order in which they were added (the draw order the acceptance rule walks).
// Not thread-safe for concurrent writes; const use is.
class TokenTree {
public:
    explicit TokenTree(int32_t root_token);

    // Adds a child of `parent` (a node id < size()) and returns its id. Aborts on a bad parent:
    // trees are built inside the runtime, never from outside input.
    int32_t add(int32_t parent, int32_t token, float prob);

    int32_t size() const { return (int32_t)nodes_.size(); }
    int32_t n_draft() const { return size() - 1; }  // draft tokens (the root is not one)
    const TreeNode& node(int32_t id) const { return nodes_[(size_t)id]; }
    std::span<const int32_t> children(int32_t id) const { return children_[(size_t)id]; }
    int32_t max_depth() const;
    bool is_chain() const;  // every node has at most one child

    // What one verification forward needs for this tree, n = size():
    std::vector<int32_t> tokens() const;                   // [n] node tokens, root first
    std::vector<int32_t> positions(int32_t n_past) const;  // [n] n_past + depth
    // [n][n] row-major: mask[i * n + j] = 1 iff j is i or an ancestor of i. A chain gives the
    // causal mask (j <= i).
    std::vector<uint8_t> ancestor_mask() const;
    // Node ids from the root down to `id`, both included.
    std::vector<int32_t> path_to(int32_t id) const;

private:
    std::vector<TreeNode> nodes_;
    std::vector<std::vector<int32_t>> children_;
};

// The chain root -> draft[0] -> draft[1] -> ...; probs (same length as draft, or empty: 1 each)
// are the draft's probabilities of its tokens.
TokenTree make_chain(int32_t root_token, std::span<const int32_t> draft, std::span<const float> probs = {});

struct Proposal {
    int32_t token = -1;
    float prob = 0.0f;  // the draft's probability of token after the node's path, in [0, 1]
};
// A draft source: its top proposals for the token after `node` of `tree` (the draft forward of that
// node's path). Called once per node that may get children, in the order nodes are added.
using ProposeFn = std::function<std::vector<Proposal>(const TokenTree& tree, int32_t node)>;

struct GrowLimits {
    int32_t budget = 0;     // draft tokens (nodes besides the root) at most
    int32_t max_depth = 0;  // deepest draft node
    int32_t top_k = 0;      // proposals kept per node (0: all the source gives)
};

// The dynamic tree (EAGLE-2, Li et al. 2024): best-first, the next node added is always the
// candidate (a proposal of a node already in the tree) with the highest path probability. Since a
// child's path probability never exceeds its parent's, the result is the set of `budget` nodes with
// the highest path probabilities among all nodes reachable by top_k expansion within max_depth
// (EAGLE-2's re-ranking step) and connected by construction. Ties go to the earlier candidate.
// Proposals are asked only for nodes above max_depth. Budget 0 or max_depth 0 gives the bare root.
TokenTree grow_tree(int32_t root_token, const GrowLimits& limits, const ProposeFn& propose);

// The level-wise growers the engine's drafters use: one call of propose_level per depth gives the
// proposals after each of `nodes` (all of one depth, ascending ids), so a draft model computes a
// whole depth in ONE forward instead of one per node. Empty rows stop that node; an empty answer
// (the draft ran out of room) stops the growth.
using ProposeLevelFn =
    std::function<std::vector<std::vector<Proposal>>(const TokenTree& tree, std::span<const int32_t> nodes)>;

// The fixed shape: every node down to limits.max_depth gets its first limits.top_k proposals as
// children, breadth first, until limits.budget draft tokens. A node is asked for proposals only if
// some of its children fit the budget. top_k 1 gives the chain.
TokenTree grow_tree_fixed(int32_t root_token, const GrowLimits& limits, const ProposeLevelFn& propose_level);

// EAGLE-2's two phases (Li et al. 2024, section 4): expansion, where at each depth the top_k nodes
// of that depth with the highest path probability are expanded by their top_k proposals, and
// re-ranking, where the `budget` nodes of highest path probability among all candidates are kept
// (ties to the earlier candidate; a parent's path probability is never below its child's and it
// came first, so the kept set is connected). The kept nodes keep their relative order, so parents
// still come first. from (optional) receives, per node of the result, its id in the candidate tree.
TokenTree grow_tree_dynamic(int32_t root_token, const GrowLimits& limits, const ProposeLevelFn& propose_level,
                            std::vector<int32_t>* from = nullptr);

}  // namespace steward
