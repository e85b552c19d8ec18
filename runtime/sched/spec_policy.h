// What the engine asks a speculating sequence's policy at every decode step (its draft length k),
// and the figures it passes: the host side of policy.h's steward_spec_seq. The engine sees only
// this interface (runtime/plugin's SpeculationPolicy implements it over the C ABI), as it sees
// EvictionPolicy for eviction, so the scheduler stays free of plugins and actors.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace steward {

// One sequence's speculation figures for one step. Strings and arrays are borrowed for the call.
struct SpecSeqStats {
    uint64_t request_id = 0;
    const char* bucket = "";
    const char* tenant = "";
    int32_t max_budget = 0, last_budget = 0;
    int32_t position = 0, n_generated = 0, max_tokens = 0, batch_size = 1;
    int64_t n_steps = 0, n_proposed = 0, n_accepted = 0;
    double recent_acceptance = -1;  // -1: nothing proposed yet
    double temperature = 0;
    // Goodput inputs (steward_spec_seq's appended fields; policy.h documents them).
    const double* accept_pos = nullptr;  // [n_accept_pos] this sequence's conditional acceptance per position
    uint32_t n_accept_pos = 0;
    const double* bucket_accept_pos = nullptr;  // [n_bucket_accept_pos] the bucket's on this pool
    uint32_t n_bucket_accept_pos = 0;
    double draft_ms_per_token = -1;   // measured, per draft token of this sequence's source; -1 unknown
    double verify_ms = -1;            // mean forward time of steps that verified drafts; -1 unknown
    double verify_ms_per_token = -1;  // the forward's growth per extra token; -1 unknown
    double plain_step_ms = -1;        // this step's forward predicted without any draft; -1 unknown
    int32_t draft_source = 0;         // a steward_spec_source
    int32_t draft_catch_up_tokens = 0;  // tokens a draft model computes before drafting in this step
    double draft_catch_up_ms = 0;       // their predicted time; -1 unknown
};

// A speculation policy as the engine uses it, asked on the engine's thread once per speculating
// sequence per decode step: a budget in [0, seq.max_budget], or 0 with *fallback = true when the
// plugin misbehaved (counted by the implementation).
class DraftBudgetPolicy {
public:
    virtual ~DraftBudgetPolicy() = default;
    virtual int32_t draft_budget_seq(const SpecSeqStats& seq, bool* fallback) = 0;
    // The step's sequences of this policy asked together, in order: out[i] and fallback[i] (1: the
    // plugin misbehaved) for seqs[i]. The plugin policy makes one hand-off to its decision thread for
    // the lot rather than one per sequence (a hand-off costs tens of microseconds of wake-ups, which
    // at a batch of 256 outlasts a GPU step); by default, one draft_budget_seq call each.
    virtual void draft_budgets(std::span<const SpecSeqStats> seqs, std::span<int32_t> out, std::span<uint8_t> fallback) {
        for (size_t i = 0; i < seqs.size(); i++) {
            bool fb = false;
            out[i] = draft_budget_seq(seqs[i], &fb);
            fallback[i] = fb ? 1 : 0;
        }
    }
};

}  // namespace steward
