// Speculation for the engine: per-request settings, drafting a sequence's next tokens as a chain or
// a token tree (n-gram lookup; a draft model, or the target's own first layers, with its own KV kept
// in step with the target), and turning the target's verification rows into the tokens to append.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include <steward/expected.h>

#include "backend/backend.h"
#include "cpu/forward.h"
#include "cpu/sampling.h"
#include "kv/kv_manager.h"
#include "kv/kv_storage.h"
#include "spec/acceptance.h"
#include "spec/suffix.h"
#include "spec/token_tree.h"

namespace steward {

// NGRAM: prompt lookup. DRAFT: the engine's draft model. SELF: the target's first self_layers
// layers, then its final norm and output head (Draft & Verify, LayerSkip), sharing its weights.
// SUFFIX: suffix decoding over the request's own text and its tenant and bucket's recent outputs
// (spec/suffix.h).
enum class SpecSource { NONE, NGRAM, DRAFT, SELF, SUFFIX };  // the values of steward_spec_source (policy.h)

// The draft's shape. A tree is verified in the same ONE target forward as a chain (positions =
// depth, the ancestor mask); it buys acceptance where the draft's first choice is often wrong but
// its second is right, at the price of more verified tokens per step.
enum class SpecTree {
    CHAIN,    // k tokens, each the draft's choice after the one before
    FIXED,    // every node's tree_branch best (greedy) or drawn (sampled) children, down to
              // tree_depth, breadth first, until k draft tokens (grow_tree_fixed)
    DYNAMIC,  // EAGLE-2: expand the tree_branch nodes of highest path probability per depth by their
              // tree_branch best children, keep the k of highest path probability (grow_tree_dynamic)
};

// A request's speculation: which draft source, and k: the draft tokens verified per step at most
// (the chain's length, or the tree's token budget; the step's leftover token budget, max_tokens
// and the context can shorten it).
struct SpecSettings {
    SpecSource source = SpecSource::NONE;
    int k = 0;            // [0, k_max_spec_tokens]; 0 means off
    int ngram_min_n = 1;  // NGRAM: tail lengths tried, longest first (ngram.h)
    int ngram_max_n = 3;
    int self_layers = 0;              // SELF: the target layers that draft, [1, the target's n_layer)
    SpecTree tree = SpecTree::CHAIN;  // DRAFT and SELF; SUFFIX: CHAIN or DYNAMIC; n-gram drafts are chains
    int suffix_min_match = 2;         // SUFFIX: tail tokens a match needs (spec/suffix.h SuffixParams)
    double suffix_min_prob = 0.1;     // SUFFIX: the draft stops below this estimated path probability
    int tree_branch = 2;              // FIXED and DYNAMIC: [1, k_max_tree_branch]
    int tree_depth = 4;               // FIXED and DYNAMIC: deepest draft token, [1, k_max_spec_tokens]
    bool enabled() const { return source != SpecSource::NONE && k > 0; }
};
constexpr int k_max_spec_tokens = 16;
constexpr int k_max_tree_branch = 8;

// Whether the run with engine id `id` is one of the control share of its bucket's requests that run
// without speculation ([bucket.speculation] control_share): a hash of the id below `share`, so each
// run is decided the same way wherever it is asked. Pure.
bool speculation_control(uint64_t id, double share);

// The rule for the settings at submit: k in [0, 16], 1 <= ngram_min_n <= ngram_max_n <= 16, DRAFT
// only when the engine has a draft model, SELF with 1 <= self_layers < n_target_layers (fewer
// layers than the target, or the draft is the target), a tree only for DRAFT and SELF with branch
// and depth in range. An error names the field, its value and the fix. Pure.
Expected<bool> check_spec_settings(const SpecSettings& s, bool has_draft_model, int n_target_layers);

// A draft model must share the target's vocabulary: the same size, the same token texts and the
// same EOS; otherwise its tokens would mean something else to the target. Pure.
Expected<bool> check_draft_model(const Model& target, const Model& draft);

// One sequence's draft for one step: a chain, or a tree flattened in node order (token_tree.h).
struct SpecDraft {
    DraftKind kind = DraftKind::CHOSEN;
    // [k] the draft tokens after the root (the sequence's last token): node i + 1 of the tree.
    std::vector<int32_t> tokens;
    // Trees only ([k]): parents[i] is node i + 1's parent (0: the root). Empty for a chain.
    std::vector<int32_t> parents;
    // SAMPLED only: [k + 1][n_vocab], row i the draft's distribution q the children of node i were
    // drawn from (rows of leaves are never read and left zero).
    std::vector<float> probs;
    // Trees only: the verification forward's [k + 1] positions and [k + 1][k + 1] ancestor mask
    // (SeqInput), root first; filled by the engine's hook once it knows n_past. Empty for a chain.
    std::vector<int32_t> positions;
    std::vector<uint8_t> mask;
    int k() const { return (int)tokens.size(); }
    bool is_tree() const { return !parents.empty(); }
    TokenTree tree() const;  // the chain or tree, root token -1 (verification never reads it)
};

// The n-gram draft of up to k tokens over the prompt and output so far (CHOSEN). Pure.
SpecDraft draft_ngram(std::span<const int32_t> all_tokens, const SpecSettings& s, int k);
// A suffix-decoding draft (spec/suffix.h) over the sequence's tokens and `corpus` (its tenant and
// bucket's recent outputs; may be null), at most k tokens, as DraftKind::CHOSEN: a chain, or with
// s.tree DYNAMIC a token tree (at most max_depth deep) where the occurrences branch (a chain when
// they do not).
SpecDraft draft_suffix(std::span<const int32_t> all_tokens, const std::deque<SuffixCorpus::Text>* corpus,
                       const SpecSettings& s, int k, int max_depth = k_max_spec_tokens);

// What a verification gives: the accepted draft tokens (a path from the root), then the target's
// own token (the replacement of the first rejected one, or the bonus after a leaf).
struct SpecResult {
    int n_accepted = 0;
    std::vector<int32_t> tokens;  // [n_accepted + 1]
    // [n_accepted + 1] the node whose target row gave tokens[j]: the root (0), then the accepted
    // nodes. Node j of a chain is j; a tree's accepted KV sits at slots n_past + nodes[j].
    std::vector<int32_t> nodes;
};
// rows: [draft.k() + 1][n_vocab] the target's logits after the root and each draft node, with the
// request's logit adjustments already applied. Greedy sampling (temperature <= 0) uses
// verify_greedy; otherwise verify_sampled with the draft's kind, drawing from rng (the request's
// sampler's). Lossless: the tokens are distributed as sampling from the target one at a time.
SpecResult verify_draft(const SpecDraft& draft, std::span<const float> rows, int32_t n_vocab, const SamplingParams& sp,
                        std::mt19937_64& rng);
// The verification against a backend that decided the target's tokens itself (the simulator):
// row_tokens[i] is the target's token after node i. From the root, the child whose token is the
// target's is accepted, until none is; then the target's token follows. Pure.
SpecResult verify_decided(const SpecDraft& draft, std::span<const int32_t> row_tokens);

// A constraint on a draft chain's tokens (structured output): mask(row) sets the logits of the
// tokens the grammar rejects after the chain so far to -inf (false: it allows none, the chain stops
// there); accept(token) moves past a chosen token (false, e.g. the end of generation: the chain
// stops after it).
struct DraftConstraint {
    std::function<bool(std::span<float>)> mask;
    std::function<bool(int32_t)> accept;
};

// The draft model's side: its forward, its KV storage and block tables (a KvManager of its own,
// never a prefix cache). Each target sequence that drafts with it owns one draft sequence whose
// tokens are a prefix of the target's; before drafting it catches up on the tokens it has not
// computed, and after verification it is rolled back to the target's accepted tokens. Not
// thread-safe: one owner (the Engine).
class DraftModel {
public:
    // Drafts with `backend`: a forward of `draft` over KV in the draft's own geometry (n_blocks
    // blocks of block_size slots; its max_tokens bounds one forward, catch-up is chunked to it). A
    // backend running fewer layers than the model's (self-speculation: `draft` is then the target
    // itself, its weights shared on the CPU) has KV of that many layers (kv_config_for_layers).
    DraftModel(const Model& draft, std::unique_ptr<ForwardBackend> backend);

    // Drafts up to k tokens after all_tokens (the target's prompt + output; its last token is the
    // root), in the shape s.tree (s.tree_branch, s.tree_depth; a tree's depth at most max_depth).
    // Greedy params take the draft's best tokens (CHOSEN); sampled ones draw from the draft's
    // sampling_distribution (SAMPLED, probs filled) with rng, except a DYNAMIC tree, whose
    // children are the draft's best by construction (CHOSEN: the lossless rule for chosen tokens;
    // drawn children kept or dropped by their own probability would bias the draws). *seq is the
    // draft sequence (0: none yet, created here). Fewer tokens (maybe none) come back when the
    // draft's pool lacks room: speculation is an optimisation and never preempts. Errors are the
    // forward's. With a constraint (structured output) a chain's tokens are drawn from the draft's
    // logits masked to what the grammar allows after the tokens before them (the draft distribution
    // the acceptance rule compares with is that masked one), so the draft proposes what the
    // constrained target can accept; trees are not filtered.
    Expected<SpecDraft> propose(SeqId* seq, std::span<const int32_t> all_tokens, const SpecSettings& s, int k,
                                int max_depth, const SamplingParams& sp, std::mt19937_64& rng,
                                const DraftConstraint* constraint = nullptr);
    // Keeps only the draft KV of the first n_valid tokens (the target's accepted ones).
    void rollback(SeqId seq, int n_valid);
    // Frees a draft sequence (no-op for 0) and sets it to 0.
    void release(SeqId* seq);

    const KvManager& manager() const { return mgr_; }
    const Model& model() const { return model_; }
    // The last chain proposal's one-token draft forwards (each fed draft token's forward and its
    // choice): their count and wall time. A draft token's cost is their mean, whatever the catch-up
    // before them cost (a prompt, or the output since the last draft); 0 forwards for a chain of
    // one token or a tree.
    int last_chain_forwards() const { return last_chain_forwards_; }
    double last_chain_ms() const { return last_chain_ms_; }
    // The last proposal's catch-up before its first draft token: the tokens it fed (the root
    // included) and their wall time.
    int last_catch_up_tokens() const { return last_catch_up_tokens_; }
    double last_catch_up_ms() const { return last_catch_up_ms_; }
    int n_layers() const { return be_->n_layers(); }
    int64_t bytes() const { return be_->kv_storage_bytes(); }

private:
    int last_chain_forwards_ = 0;
    double last_chain_ms_ = 0;
    int last_catch_up_tokens_ = 0;
    double last_catch_up_ms_ = 0;
    bool grow(SeqId seq, std::span<const int32_t> tokens);  // append + allocate; false without room
    // Forwards the tokens the draft knows but has not computed (chunked), leaving the last one's
    // logits in logits_.
    Expected<bool> feed_pending(SeqId seq);
    Expected<SpecDraft> propose_chain(SeqId seq, int k, const SamplingParams& sp, std::mt19937_64& rng,
                                      const DraftConstraint* constraint);
    Expected<SpecDraft> propose_tree(SeqId seq, const SpecSettings& s, int k, int max_depth, const SamplingParams& sp,
                                     std::mt19937_64& rng);

    const Model& model_;
    std::unique_ptr<ForwardBackend> be_;
    KvManager mgr_;
    std::vector<float> logits_;
    std::vector<float> masked_;  // a constrained chain's masked row
};

// The KV shape of a forward of n_layers layers (0: all; forward_layers) of m, target or draft:
// n_blocks blocks of block_size.
KvConfig kv_config_for_layers(const Model& m, int n_blocks, int block_size, KvDtype dtype_k, KvDtype dtype_v,
                               int n_layers);

// The split of one pool's KV budget when a draft model (or null) and self-drafts of self_layers
// layers in all join it: n_blocks target blocks' worth of bytes are shared so that each gets the same
// block count (every target slot has a draft slot), i.e. the target keeps its bytes per block over
// the sum of everyone's (a self-draft's block is self_layers / n_layer of a target block). Pure.
int32_t shared_kv_blocks(const Model& target, const Model* draft, int self_layers, int32_t n_blocks, int block_size,
                         KvDtype dtype_k, KvDtype dtype_v);

}  // namespace steward
