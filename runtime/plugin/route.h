// The routing question, host side, in one place: what a routing plugin is told about a request
// (RouteInput, turned into steward_route_request + steward_route_context by RoutingPolicy), how it
// ended (RouteOutcome, for on_outcome), and which pool holds each agent session's KV (SessionPools).
// Plain C++: the router actor and the request path both build on it.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "metrics/bucket_metrics.h"  // FinishReason

namespace steward {

// One request as routing plugins see it. Built once by the router; the request path keeps it for
// check_upgrade and on_outcome, so every call about the request tells the plugin the same thing.
struct RouteInput {
    uint64_t request_id = 0;
    std::string bucket, tenant, response_format;
    int32_t n_prompt_tokens = 0, max_tokens = 0;
    double temperature = 0;
    bool tools = false;
    std::string session;            // the caller's session id ("" none), as the caller named it
    int32_t session_pool = -1;      // pool index (of the routing generation) holding the session's KV
    int32_t priority = 0;           // the bucket's
    double slo_ttft_ms = 0, slo_tpot_ms = 0;  // the bucket's (0: none)
    double deadline_ms = 0;         // time left before the request times out (0: none)
    // Per pool, in the views' order: prompt tokens already cached there for this tenant; -1 unknown.
    // Shorter than the pools (e.g. empty): the rest are unknown.
    std::vector<int32_t> n_cached_prompt_tokens;
    // Per pool, in the views' order: its load on the worker process hosting it (ctx->loads). Shorter
    // than the pools (e.g. empty): the rest reach the plugin as unknown (counts -1, block_size 0, worker "").
    struct PoolLoad {
        int32_t n_kv_blocks_used = -1, n_kv_blocks_total = -1, block_size = 0, n_inflight = 0;
        std::string worker;  // "host:port" of the pool's worker; "" local
    };
    std::vector<PoolLoad> pool_loads;
};

// How a routed request ended (what on_outcome reports).
struct RouteOutcome {
    int32_t pool = -1;  // the pool whose run answered; -1: none ran
    FinishReason finish = FinishReason::ERROR;
    bool upgraded = false;
    int32_t n_prompt_tokens = 0, n_cached_prompt_tokens = 0, n_output_tokens = 0;
    double ttft_ms = -1, tpot_ms = -1, e2e_ms = 0;
    double cost = 0;
};

// Which pool served each session's last turn, by tenant-scoped session key, and how many tokens that
// turn left in its KV (prompt + output). Pools are kept by name: indices differ between generations.
// Bounded: past max_entries the oldest half is forgotten (a forgotten session is routed as a new one;
// the engine drops idle sessions' KV after session_ttl anyway). Thread-safe.
class SessionPools {
public:
    struct Place {
        std::string pool;
        int32_t n_tokens = 0;
    };
    explicit SessionPools(size_t max_entries = 1 << 16) : max_entries_(max_entries) {}
    void record(const std::string& key, const std::string& pool, int32_t n_tokens);
    std::optional<Place> find(const std::string& key) const;
    size_t size() const;

private:
    mutable std::mutex mu_;
    size_t max_entries_;
    uint64_t serial_ = 0;
    std::unordered_map<std::string, std::pair<Place, uint64_t>> by_key_;  // -> (place, last write)
};

// Fills in.session_pool from `place` (a pool named in pool_names, else -1) and, for that pool, the
// cached-token estimate the session gives: the tokens its last turn left, capped at this prompt's
// length minus one (the engine recomputes at least the last prompt token). Other pools' figures are
// left as they are (unknown unless a cache index supplied them).
void apply_session_place(RouteInput& in, const std::optional<SessionPools::Place>& place,
                         const std::vector<std::string>& pool_names);

// The router's answer for a request (router_actor -> request_actor, and what the request core
// runs on): where it goes and with which policies, and for the decision trace how it was decided.
struct RouteDecision {
    std::string bucket;
    int32_t bucket_index = 0;  // into the snapshot's config.buckets
    int32_t pool = 0;          // index into the snapshot's pools
    int32_t priority = 0;
    uint64_t generation = 0;  // config generation the decision was made with
    // The speculation policy's draft budget for the bucket at routing time (tokens per step), for the
    // decision trace; the engine asks the policy again per sequence at every step (draft_budget_seq).
    int32_t draft_budget = 0;
    int32_t upgrade_pool = -1;       // re-run there if the routing policy's check says so
    int32_t check_after_tokens = 0;  // when to ask it
    int32_t shadow_pool = -1;        // also run there to measure agreement
    bool fallback = false;           // a plugin decision was rejected: the safe default was used
    RouteInput input;                // what the routing policy was told: check_upgrade and on_outcome reuse it
    // For the decision trace: why the bucket, how the pool was chosen, and per pool (snapshot order)
    // the estimates the routing policy saw.
    std::string bucket_why, route_why;
    std::vector<double> est_cost, est_ttft_ms, est_latency_ms, quality, risk;
};

}  // namespace steward
