// Pool views for routing policies: priors until the pool has served requests, then live averages.
#include "plugin/pool_estimates.h"

#include <algorithm>
#include <cmath>

namespace steward {

double ewma(double prev, double sample) { return prev < 0 ? sample : 0.8 * prev + 0.2 * sample; }

steward_pool_view make_pool_view(const PoolProfile& p, const PoolLiveStats& live, double quality_measured,
                                 int prompt_tokens, int max_tokens, int cached_tokens) {
    const int cached = std::clamp(cached_tokens, 0, std::max(0, prompt_tokens));
    const int computed = prompt_tokens - cached;
    steward_pool_view v{};
    v.name = p.name.c_str();
    v.available = live.available ? 1 : 0;
    v.n_layers = p.n_layers;
    v.n_params = p.n_params;
    v.price_prompt = p.price_prompt;
    v.price_output = p.price_output;
    v.est_cost = ((double)computed * p.price_prompt + (double)cached * p.price_cached + (double)max_tokens * p.price_output) / 1e6;
    const double tpot_prior = p.model_bytes / 20e9 * 1e3;
    v.est_tpot_ms = live.tpot_ms >= 0 ? live.tpot_ms : tpot_prior;
    v.est_ttft_ms = (double)std::max(1, computed) *
                    (live.prefill_ms_per_token >= 0 ? live.prefill_ms_per_token : tpot_prior / 8.0);
    // Waiting requests ahead each take about one TTFT of the batch's time.
    const double queue_ms = (double)live.n_waiting * v.est_ttft_ms;
    v.est_latency_ms = queue_ms + v.est_ttft_ms + (double)max_tokens * v.est_tpot_ms;
    v.quality = std::isnan(quality_measured) ? p.quality_prior : std::clamp(quality_measured, 0.0, 1.0);
    const double fill = p.max_queue > 0 ? std::min(1.0, (double)live.n_waiting / p.max_queue) : 0.0;
    v.risk = std::clamp(0.5 * fill + 0.5 * live.error_rate, 0.0, 1.0);
    v.n_waiting = live.n_waiting;
    v.n_running = live.n_running;
    return v;
}

}  // namespace steward
