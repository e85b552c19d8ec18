// What a routing policy sees of each pool: configured prices and size, and live estimates (latency,
// queue, errors, measured quality) turned into a steward_pool_view for one request.
#pragma once
#include "kv/kv_tier.h"
#include <optional>
#include <steward/policy.h>

#include <string>

namespace steward {

// Fixed per pool (from the config and the model file).
struct PoolProfile {
    std::string name;
    int n_layers = 0;
    double n_params = 0;
    double model_bytes = 0;     // bytes of weights read per decoded token
    int max_queue = 0;
    double price_prompt = 0, price_output = 0, price_cached = 0;
    double quality_prior = 1.0;  // [0, 1]
};

// Live figures per pool, updated as requests finish and steps run.
struct PoolLiveStats {
    double prefill_ms_per_token = -1;  // moving average of TTFT / uncached prompt tokens; < 0: none yet
    double tpot_ms = -1;               // moving average; < 0: none yet (a prior is used)
    double error_rate = 0;   // moving average of requests that failed or were refused
    int n_waiting = 0, n_running = 0;
    int n_kv_blocks_used = -1, n_kv_blocks_total = -1;  // the pool's KV (a remote pool's from heartbeats); -1 unknown
    double kv_fragmentation = 0, n_kv_branches = 0;     // with them
    int n_inflight = 0;      // runs requests have sent to the pool and not seen end (the front's own count)
    int n_blocks_inflight = 0;  // their prompts' KV blocks (what a run holds once prefilled; Dynamo's active blocks)
    bool available = true;   // false while draining, or while a remote pool's worker is lost
    std::optional<KvTierStats> tiers;  // the pool's KV tiers' figures (none: no [pool.kv_tiers])
    // Documents' KV (docs/reuse.md): cached blocks with reuse priority now, those evicted, and the
    // blocks (pool and tiers) dropped because a document changed.
    int64_t n_kv_priority_blocks = 0, n_kv_priority_evictions = 0, n_kv_reuse_invalidated = 0;
};

// quality_measured: agreement with the strongest pool on this bucket's shadowed requests (NaN: none,
// the prior is used). TTFT is estimated per prompt token, so requests of any length inform it.
// Before any request finished, TPOT's prior is the time to read the weights once at 20 GB/s and a
// prompt token costs an eighth of that (prefill is batched).
// cached_tokens: the prompt tokens the pool already holds for the request's tenant (the cache actor's
// figure; < 0 unknown, taken as 0): they cost the cached price and no prefill time, so a pool
// holding the prefix looks as much cheaper and quicker as it is.
steward_pool_view make_pool_view(const PoolProfile& p, const PoolLiveStats& live, double quality_measured,
                                 int prompt_tokens, int max_tokens, int cached_tokens = -1);

// An exponential moving average step (alpha 0.2); the first sample is taken as is.
double ewma(double prev, double sample);

}  // namespace steward
