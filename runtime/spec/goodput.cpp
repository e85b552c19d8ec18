// Goodput-driven choice of the draft length (see goodput.h).
#include "spec/goodput.h"

#include <algorithm>

namespace steward {

void AcceptanceEwma::observe(int32_t n_proposed, int32_t n_accepted) {
    const int32_t n = std::min<int32_t>(n_proposed, (int32_t)alpha.size());
    for (int32_t i = 0; i < n && i <= n_accepted; ++i) {
        const double hit = i < n_accepted ? 1.0 : 0.0;
        alpha[(size_t)i] += weight * (hit - alpha[(size_t)i]);
        n_seen[(size_t)i]++;
    }
}

double step_ms(const StepCost& c, int32_t k, int32_t batch) {
    const double b = std::max(batch, 1);
    return c.verify_fixed_ms + c.verify_per_token_ms * b * (k + 1) + k * (c.draft_fixed_ms + c.draft_per_token_ms * b);
}

double expected_tokens(const AcceptanceEwma& acc, int32_t k) {
    double e = 1.0, run = 1.0;
    for (int32_t i = 0; i < k && i < (int32_t)acc.alpha.size(); ++i) e += (run *= acc.alpha[(size_t)i]);
    return e;
}

GoodputChoice best_k(const AcceptanceEwma& acc, const StepCost& cost, int32_t batch, int32_t max_k) {
    const double base = expected_tokens(acc, 0) / step_ms(cost, 0, batch);
    GoodputChoice best{0, base, 1.0};
    for (int32_t k = 1; k <= max_k; ++k) {
        const double g = expected_tokens(acc, k) / step_ms(cost, k, batch);
        if (g > best.goodput) best = {k, g, g / base};
    }
    return best;
}

int32_t choose_k(AdaptiveState& s, const AcceptanceEwma& acc, const StepCost& cost, int32_t batch, int32_t max_k,
                 const Hysteresis& h) {
    s.k = std::min(s.k, max_k);
    const GoodputChoice best = best_k(acc, cost, batch, max_k);
    const double current = expected_tokens(acc, s.k) / step_ms(cost, s.k, batch);
    if (best.k != s.k && best.goodput > current * (1.0 + h.margin)) {
        if (++s.n_better >= h.patience) {
            s.k = best.k;
            s.n_better = 0;
        }
    } else {
        s.n_better = 0;
    }
    if (s.k != 0) {
        s.n_at_zero = 0;
        return s.k;
    }
    if (h.probe_every > 0 && ++s.n_at_zero >= h.probe_every) {
        s.n_at_zero = 0;
        return std::min(h.probe_k, max_k);
    }
    return 0;
}

}  // namespace steward
