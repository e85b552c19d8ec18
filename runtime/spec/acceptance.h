// Verification of a draft tree against the target's logits: which draft tokens the target keeps
// and the token it writes after them. Greedy requests match argmax; sampled requests use lossless
// rejection sampling (chains: Leviathan et al. 2023 / Chen et al. 2023; trees: recursive rejection).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "cpu/sampling.h"
#include "spec/token_tree.h"

namespace steward {

// How the draft chose the children of a node; the lossless rule depends on it.
enum class DraftKind {
    // Drawn one after the other WITHOUT replacement from the draft's distribution q at the node
    // (a chain: one draw from q). Recursive rejection sampling as in RSD (Jeon et al. 2024,
    // "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling Without
    // Replacement", arXiv 2402.14160): accept child x with min(1, p(x)/q(x)); on rejection
    // p := norm(max(0, p - q)) and q := q without x, renormalised; the next sibling is tested against
    // those. With one child per node this is exactly Leviathan / Chen's rule.
    SAMPLED,
    // Chosen, not drawn: the draft's top-k (the EAGLE-2 tree), an n-gram lookup, a greedy draft.
    // Each child's proposal is then a point mass at its token, so the same rule with q = delta(x)
    // reads: accept x with p(x); on rejection p := p with x removed, renormalised (the rule of
    // EAGLE's evaluate_posterior and SpecInfer's deterministic case). Lossless for any draft; q unused.
    CHOSEN,
};

struct Verdict {
    std::vector<int32_t> accepted;  // accepted draft node ids, root's child first (the root excluded)
    int32_t last = 0;               // the deepest accepted node: accepted.back(), or 0 (the root)
    // The token the target writes after `last`: the replacement of the first rejected position, or
    // the bonus token when `last` has no children or (greedy) none of them matched.
    int32_t token = -1;
};
// How the caller applies a verdict to a sequence that fed tree.tokens() at slots n_past.. :
// keep the KV of the root and of `accepted` (a chain's accepted prefix is already contiguous, so
// the next forward just uses n_past + 1 + accepted.size(); a tree's accepted nodes sit at slots
// n_past + id and are first copied down to n_past + depth with KvStorage::copy_slot), output the
// accepted tokens then `token`, and roll back everything else (the next n_past discards it).

// Greedy: walk down from the root while some child's token is the target's argmax there
// (sampling.h's argmax, as Sampler::sample's greedy path), then emit the target's argmax.
// target_logits is [tree.size()][n_vocab], row i the target's logits after node i's path
// (adjust_logits already applied by the caller when the request adjusts logits). Pure.
Verdict verify_greedy(const TokenTree& tree, std::span<const float> target_logits, int32_t n_vocab);

// Sampled: the target's distribution p at each visited node is sampling_distribution(row, params)
// (the sampler's own temperature / top_k / top_p; greedy params delegate to verify_greedy).
// draft_probs ([tree.size()][n_vocab], row i the draft's distribution q after node i's path, after
// the same processing of the draft's logits) is read for SAMPLED only and may be empty for CHOSEN;
// rows of leaves are never read. Uniforms come from rng as Sampler draws them ((rng() >> 11) * 2^-53,
// the request's mt19937_64 seeded with its seed): deterministic given the rng's state. A child whose
// q is 0 (cannot have been drawn) or whose token was already rejected is skipped. Pure apart from rng.
Verdict verify_sampled(const TokenTree& tree, std::span<const float> target_logits, int32_t n_vocab,
                       const SamplingParams& params, DraftKind kind, std::span<const float> draft_probs,
                       std::mt19937_64& rng);

// Dense [n_vocab] form of sampling_distribution(logits, params), for building draft_probs rows.
std::vector<float> dense_distribution(std::span<const float> logits, const SamplingParams& params);

}  // namespace steward
