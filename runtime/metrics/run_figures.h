// What one run of a request did on its pool, as the engine counts it: the prompt and what the
// prefix cache gave of it, preemption's recomputation, speculation and structured output. Kept
// once per sequence by the engine, carried unchanged by its events (EngineEvent, across the actors
// and the wire to the request) and the finished request's record (RequestRecord), each of which
// is one (docs/metrics.md).
#pragma once
#include <array>
#include <cstdint>

namespace steward {

// Draft positions counted per request for acceptance per position (the engine's k_max_spec_tokens).
constexpr int k_spec_positions = 16;

struct RunFigures {
    int64_t n_prompt_tokens = 0;
    int64_t n_cached_prompt_tokens = 0;  // prompt tokens found in cached full blocks or the session
    int64_t n_cached_cross_tenant = 0;   // of those, on blocks another tenant wrote outside any
                                         // declared-public prefix: a boundary breach, must be 0
    int64_t n_cached_public = 0;         // of those, on another tenant's declared-public blocks
    // Of n_cached_prompt_tokens, those promoted back from a KV tier (host memory, disk), and the
    // promotions' count (0 or 1 per admission) and wall seconds.
    int64_t n_cached_host_tokens = 0, n_cached_disk_tokens = 0;
    int64_t n_promotions = 0;
    double promote_s = 0.0;
    int64_t n_recomputed_tokens = 0;     // tokens computed again after preemptions
    int64_t n_preemptions = 0;           // times its KV was dropped to make room
    // Speculative decoding (vLLM's num_drafts / num_draft_tokens / num_accepted_tokens):
    // verifications with a non-empty draft, draft tokens verified, of those accepted, verifications
    // that discarded the KV of rejected (or unused) draft tokens, and the branches verified (a
    // tree's root-to-leaf paths; a chain is one).
    int64_t n_drafts = 0;
    int64_t n_draft_tokens = 0;
    int64_t n_accepted_tokens = 0;
    int64_t n_rollbacks = 0;
    int64_t n_spec_branches = 0;
    // Per draft position i: draft tokens verified there and, of them, accepted.
    std::array<int64_t, k_spec_positions> n_draft_tokens_at{}, n_accepted_at{};
    // Wall seconds in its draft forwards (n-gram lookup included) and in the target forwards in
    // which it verified drafts (the whole step's forward: its batch shares it); simulated pools:
    // device seconds.
    double draft_s = 0.0, verify_s = 0.0;
    int64_t n_spec_fallbacks = 0;  // steps whose speculation policy answered invalidly (decoded plainly)
    // Structured output: rows masked by the request's grammar (speculation's verified rows
    // included), of them the ones where one token only was allowed, and the wall time of the masks.
    int64_t n_masked = 0, n_forced = 0;
    double mask_s = 0.0;
};

}  // namespace steward
