// The adaptive speculation choice: from the running acceptance per draft position and the step's
// cost model, the draft length k that maximises expected tokens per unit of step time (0 where
// speculation does not pay), with hysteresis so the choice does not flap on noisy estimates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace steward {

// alpha[i]: the probability that draft position i is accepted given positions < i were (the
// conditional acceptance per position), as an EWMA of observations; prior before any.
// Not thread-safe; one per bucket or per sequence.
struct AcceptanceEwma {
    explicit AcceptanceEwma(int32_t max_k = 8, double weight = 0.1, double prior = 0.5)
        : alpha((size_t)max_k, prior), n_seen((size_t)max_k, 0), weight(weight) {}
    std::vector<double> alpha;     // [max_k]
    std::vector<int64_t> n_seen;   // [max_k] observations per position
    double weight;                 // of a new observation, in (0, 1]

    // One verification: n_proposed positions were drafted (a tree: its depth), the first
    // n_accepted kept. Positions < n_accepted saw an acceptance, position n_accepted (when
    // < n_proposed) a rejection; later ones were not tested (conditional on a rejection before).
    void observe(int32_t n_proposed, int32_t n_accepted);
};

// The step's cost in milliseconds when every one of `batch` sequences drafts k tokens, a linear
// model the caller fits to its measured draft and verify times:
//   verify: verify_fixed_ms + verify_per_token_ms * batch * (k + 1)  (k = 0 is the plain decode step)
//   draft:  k * (draft_fixed_ms + draft_per_token_ms * batch)        (k sequential draft forwards)
// The fixed parts are what a step costs regardless of its tokens (reading the weights once); the
// per-token parts what one more token adds (compute). An n-gram draft has draft costs ~0.
struct StepCost {
    double verify_fixed_ms = 1.0;
    double verify_per_token_ms = 0.0;
    double draft_fixed_ms = 0.0;
    double draft_per_token_ms = 0.0;
};
double step_ms(const StepCost& cost, int32_t k, int32_t batch);

// Expected tokens one verification yields with k draft tokens: 1 + sum_{i<k} prod_{j<=i} alpha[j]
// (the accepted prefix plus the target's own token); positions past alpha's size count as 0.
double expected_tokens(const AcceptanceEwma& acc, int32_t k);

struct GoodputChoice {
    int32_t k = 0;
    double goodput = 0.0;  // expected tokens per ms per sequence with k
    double gain = 1.0;     // goodput / goodput at k = 0 (the speculation gain predicted)
};
// The k in [0, max_k] with the highest goodput (ties to the smaller k). Pure.
GoodputChoice best_k(const AcceptanceEwma& acc, const StepCost& cost, int32_t batch, int32_t max_k);

struct Hysteresis {
    double margin = 0.05;   // a new k must beat the current one's goodput by this fraction...
    int32_t patience = 4;   // ...for this many consecutive steps before the choice switches
    // At k = 0 no acceptance is observed any more, so every probe_every steps one step drafts
    // probe_k tokens to refresh the estimate (0: never probe).
    int32_t probe_every = 64;
    int32_t probe_k = 2;
};
struct AdaptiveState {
    int32_t k = 0;          // the current choice
    int32_t n_better = 0;   // consecutive steps some other k beat it by the margin
    int32_t n_at_zero = 0;  // steps since the last probe while k = 0
};
// The draft length for the next step; updates state. The trade-off: a switch waits patience steps
// (lost gain while acceptance really changed) to avoid paying both sides of a noisy threshold.
int32_t choose_k(AdaptiveState& state, const AcceptanceEwma& acc, const StepCost& cost, int32_t batch,
                 int32_t max_k, const Hysteresis& h = {});

}  // namespace steward
