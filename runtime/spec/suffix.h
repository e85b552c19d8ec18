// Suffix decoding (SuffixDecoding, Oliaro et al. 2024; vLLM's and SGLang's suffix proposers): no
// model. The draft continues the longest earlier occurrence of the context's tail, in the request's
// own prompt and output and in the recent outputs of the same tenant and bucket, token by token by
// the frequency of what followed those occurrences, for as long as the path stays likely. Agent
// traffic repeats itself (tool-call JSON, code being edited, earlier answers quoted), which is where
// this pays. Plain C++, no actors; not thread-safe (one owner: a pool's engine).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace steward {

struct SuffixParams {
    int32_t min_match = 2;          // tokens of the context's tail an occurrence must match at least
    int32_t max_match = 32;         // tokens compared at most (the longest match wins)
    int32_t k = 8;                  // draft tokens at most
    double min_prob = 0.1;          // the draft stops before the token that takes the path's estimated
                                    // probability (the product of each token's share among the
                                    // occurrences still followed) below this
    int32_t max_occurrences = 256;  // occurrences of the longest match counted, the most recent first
};

// Whose outputs a draft may follow: a tenant (the KV layer's id) and a bucket. Drafts never cross
// tenants: a shared corpus would leak one tenant's text through another's acceptance timing.
struct SuffixKey {
    int32_t tenant = 0;
    std::string bucket;
    auto operator<=>(const SuffixKey&) const = default;
};

struct SuffixLimits {
    int64_t tokens_per_key = 1 << 16;  // tokens one tenant and bucket keeps (the oldest outputs go first)
    int64_t tokens_total = 1 << 20;    // tokens kept over all keys (the least recently used key's oldest first)
    int32_t max_text = 4096;           // tokens kept of one output (its last ones)
};

// Recent texts (a finished request's prompt end and output) per tenant and bucket, each with an index from its min_match-token windows to the
// positions that follow them. Memory-bounded by SuffixLimits.
class SuffixCorpus {
public:
    explicit SuffixCorpus(SuffixLimits limits = {}, int32_t min_match = 2);

    // A finished request's text (its last max_text tokens: the output and the end of its prompt),
    // newest of its key. Texts shorter than min_match + 1 tokens are not kept (nothing could follow
    // a match in them).
    void add(const SuffixKey& key, std::span<const int32_t> output);
    // Forgets a tenant's outputs (every bucket).
    void drop_tenant(int32_t tenant);

    struct Text {
        int32_t window = 0;  // the index's window length (min_match at add)
        std::vector<int32_t> tokens;
        std::unordered_map<uint64_t, std::vector<int32_t>> at;  // window hash -> positions p, p - min_match .. p - 1 the window
    };
    // The key's outputs, newest first; nullptr when none. Touches the key (least recently used order).
    const std::deque<Text>* texts(const SuffixKey& key);

    int64_t n_tokens() const { return n_tokens_; }
    int64_t n_tokens(const SuffixKey& key) const;
    int64_t n_evicted_texts() const { return n_evicted_; }
    int32_t min_match() const { return min_match_; }
    const SuffixLimits& limits() const { return limits_; }
    // "" or the first inconsistency (token counts against the texts, caps, the LRU list).
    std::string check_invariants() const;

    static uint64_t window_hash(const int32_t* tokens, int32_t n);

private:
    struct Entry {
        std::deque<Text> texts;  // newest first
        int64_t n_tokens = 0;
        uint64_t used = 0;  // last touch, for the global cap's LRU
    };
    void evict_oldest(Entry& e);
    SuffixLimits limits_;
    int32_t min_match_;
    std::map<SuffixKey, Entry> keys_;
    int64_t n_tokens_ = 0, n_evicted_ = 0;
    uint64_t clock_ = 0;
};

struct SuffixDraft {
    std::vector<int32_t> tokens;
    int32_t match_len = 0;      // tokens of the context's tail the occurrences matched
    int32_t n_occurrences = 0;  // occurrences of that match counted
    double prob = 0;            // the draft path's estimated probability (1 when empty)
};

// The draft for `context` (the prompt and the output so far): occurrences of its tail are looked up
// in the context itself (earlier positions) and in `corpus` (may be null: the key's outputs, newest
// first); only those of the longest match length found (at least min_match) count, the most recent
// max_occurrences of them (the context's own first, latest position first). Then, token by token,
// the most frequent next token among the occurrences still followed (ties: the most recent
// occurrence's), its share multiplying the path's probability; the draft ends at k tokens, when no
// occurrence has a next token, or before a token that would take the probability below min_prob.
// Empty when nothing matches.
SuffixDraft suffix_propose(std::span<const int32_t> context, const std::deque<SuffixCorpus::Text>* corpus,
                           const SuffixParams& params);

// A token tree of suffix drafts where the occurrences branch: the same occurrences as
// suffix_propose, then nodes added best first by estimated path probability (a node's probability:
// its parent's times its token's share among the parent's occurrences that have a next token), each
// at least min_prob and at most max_depth below the root, until k nodes. Every candidate continuation
// of every node competes, so the tree is deep where the history agrees and wide where it branches;
// ties go to the candidate found first (shallower nodes, then the most frequent, then the most recent
// occurrence's token). Node i + 1 is tokens[i] with parent parents[i] (0: the root, the context's
// last token); parents come before their children. Empty when nothing matches.
struct SuffixTree {
    std::vector<int32_t> tokens, parents;
    std::vector<double> probs;  // each node's estimated path probability
    int32_t match_len = 0, n_occurrences = 0;
};
SuffixTree suffix_propose_tree(std::span<const int32_t> context, const std::deque<SuffixCorpus::Text>* corpus,
                               const SuffixParams& params, int32_t max_depth);

}  // namespace steward
