// The figures of docs/metrics.md per workload bucket and overall: what the runtime records per
// finished request and per KV sample, aggregated, and written as JSON, a text table and Prometheus.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <string_view>
#include <utility>
#include <vector>

#include <steward/finish_reason.h>
#include <steward/request.h>

#include "kv/admission.h"
#include "kv/kv_tier.h"
#include "metrics/histogram.h"
#include "metrics/run_figures.h"

namespace steward {

// Work a request did on a pool before the one that finished it (an upgrade re-ran or continued it).
struct PoolUse {
    std::string pool;
    int64_t n_prompt_tokens = 0;
    int64_t n_cached_prompt_tokens = 0;
    int64_t n_output_tokens = 0;
};

// What the runtime fills in for each finished request (any finish reason): the answering run's
// figures (RunFigures: prompt, cache, preemption, speculation, structured output) and the request's.
struct RequestRecord : RunFigures {
    std::string bucket;  // the classifier's decision; "" is reported as "unclassified"
    std::string tenant;
    std::string pool;  // the pool that finished the request
    // Seconds on one clock; any origin (only differences and the run window are used).
    double t_arrival_s = 0.0;               // arrival at the runtime
    std::optional<double> t_scheduled_s;    // first scheduled into a batch; none if never
    std::optional<double> t_first_token_s;  // first output token handed to the caller; none if never
    double t_finish_s = 0.0;                // last token or error
    std::vector<double> itl_s;              // [n_output_tokens - 1] gaps between consecutive tokens
    int64_t n_output_tokens = 0;
    FinishReason finish = FinishReason::STOP;
    uint64_t config_generation = 0;
    // Routing: filled by the request core (runtime/request/request_fsm).
    std::vector<PoolUse> prior_pools;  // non-empty: upgraded from a cheaper pool
    bool fallback = false;             // served by a fallback path
};

// A KV gauge reading pushed by the KV layer.
struct KvSample {
    double t_s = 0.0;           // same clock as RequestRecord
    std::string bucket;         // "": the whole pool (the "all" row); a bucket: that bucket's share
    int64_t n_blocks_used = 0;  // blocks referenced by running or pinned sequences
    int64_t n_blocks_total = 0;
    double fragmentation = 0.0;  // allocated token slots not holding a token / allocated slots, [0, 1]
    int64_t n_branches = 0;      // live forked sequences sharing blocks copy-on-write
    std::string pool;            // the pool the reading is of (the over-time series keys on it)
    double block_bytes = 0;      // bytes of KV one of the pool's blocks holds (0: unknown)
};

// One point of the KV series over time (an untagged sample): a pool's blocks in use and the
// evictions counted so far (every pool).
struct KvPoint {
    double t_s = 0.0;
    std::string pool;
    int64_t n_blocks_used = 0, n_blocks_total = 0;
    int64_t evictions = 0;
};

// The KV pool's shape, for the KV GiB figures (fill from KvConfig: bytes_per_elem = 2 for F16).
struct KvShape {
    int n_layers = 0;
    int n_blocks = 0;
    int block_size = 0;  // token slots per block
    int n_kv_heads = 0;
    int head_dim = 0;
    double bytes_per_elem = 0.0;
    double block_bytes() const;  // 2 · L · T · H_kv · D_head · bytes (K and V, every layer)
    double total_gib() const;    // block_bytes · n_blocks / 2^30: docs/metrics.md's "KV GiB (formula)"
};

// Prices in currency units per million tokens. Cached prompt tokens cost the cached price.
struct PoolPrice {
    double prompt_per_mtok = 0.0;
    double cached_prompt_per_mtok = 0.0;
    double output_per_mtok = 0.0;
};

// A bucket's service-level targets; 0 = no target on that figure.
struct BucketSlo {
    double ttft_ms = 0.0;
    double tpot_ms = 0.0;
};

struct MetricsConfig {
    std::map<std::string, PoolPrice, std::less<>> prices;  // per pool; a pool not listed costs 0
    std::optional<KvShape> kv;                             // without it the KV GiB figures are null
    std::map<std::string, BucketSlo, std::less<>> slo;     // per bucket; goodput is null without one
    bool vllm_names = false;  // [metrics] vllm_names: to_prometheus also writes the vllm:* families
};

// The live load of one pool's scheduler at the moment the exposition is written: sequences in the
// engine's batch (running) and in its queue (waiting: not yet scheduled, or preempted), in all and
// per bucket, and the KV geometry vLLM's cache_config_info carries. Requests waiting for a KV
// reservation before the engine are the admission figures' (set_admission), not these.
struct PoolLoad {
    struct Bucket {
        std::string bucket;
        int32_t n_running = 0, n_waiting = 0;
    };
    std::string pool;
    int32_t n_running = 0, n_waiting = 0;
    std::vector<Bucket> by_bucket;  // empty: not split (a remote pool: its worker's heartbeat has totals only)
    int32_t block_size = 0;         // tokens per KV block; 0: unknown
    int64_t n_blocks = 0;           // KV blocks of the pool; 0: unknown
    std::optional<KvTierStats> tiers;  // the pool's KV tiers (kv/kv_tier.h); none: no [pool.kv_tiers]
    // Documents' KV (docs/reuse.md): cached blocks with reuse priority now; of those, evicted; blocks
    // (pool and tiers) dropped because a document changed.
    int64_t n_kv_priority_blocks = 0, n_kv_priority_evictions = 0, n_kv_reuse_invalidated = 0;
};

// Time-weighted KV gauges of one row: each sample holds until the next. With every sample at one
// instant the means fall back to plain sample means.
struct KvGauges {
    int64_t n_samples = 0;
    KvSample last;
    int64_t n_blocks_used_peak = 0;
    double page_usage_peak = 0.0;  // max of used / total
    int64_t n_branches_peak = 0;
    // Bytes in use (blocks x the sample's block_bytes), for rows fed by pools of different block
    // sizes; 0 when no sample gave its block size.
    double bytes_used_peak = 0.0;

    void add(const KvSample& s);
    double blocks_used_mean() const;  // NaN without samples
    double bytes_used_mean() const;   // NaN without samples; 0 when no sample gave its block size
    double page_usage_mean() const;   // fraction; NaN without samples
    // Allocated slots not holding a token / allocated slots, weighted by blocks in use (and time):
    // equals Σ waste / Σ allocated. NaN when no block was ever in use.
    double fragmentation() const;

private:
    double t_first_ = 0.0;
    double span_s_ = 0.0;                                                  // Σ dt between samples
    double i_used_ = 0.0, i_usage_ = 0.0, i_frag_ = 0.0, i_frag_w_ = 0.0;  // ∫ · dt
    double s_used_ = 0.0, s_usage_ = 0.0, s_frag_ = 0.0, s_frag_w_ = 0.0;  // Σ over samples
    double i_bytes_ = 0.0, s_bytes_ = 0.0;
};

// TTFT of hits and misses for prompts of [2^k, 2^(k+1)) tokens (a hit: any cached prompt token).
struct LengthClassTtft {
    int64_t n_hit = 0;
    int64_t n_miss = 0;
    double ttft_hit_sum_s = 0.0;
    double ttft_miss_sum_s = 0.0;
    double penalty_s() const;  // mean miss TTFT - mean hit TTFT; NaN unless both are present
};

struct TenantCache {
    int64_t n_requests = 0;
    int64_t n_queries = 0;  // prompt tokens looked up
    int64_t n_hits = 0;     // prompt tokens found
};

// The accumulators of one row (a bucket or "all") and the figures derived from them.
// Latency populations: TTFT over requests with a first token; TPOT (per-request mean) and ITL
// (per gap) over requests with >= 2 output tokens; e2e and queue time over every request except
// ERROR and OVERLOADED ones (rejections would make the latency look good). All in seconds.
struct BucketMetrics {
    int64_t n_requests = 0;
    std::array<int64_t, n_finish_reasons> n_by_finish{};
    std::map<uint64_t, int64_t> n_by_config_generation;

    Histogram ttft_s, tpot_s, itl_s, e2e_s, queue_s;

    int64_t n_prompt_tokens = 0;
    int64_t n_cached_tokens = 0;
    int64_t n_saved_tokens = 0;  // Σ max(0, cached - recomputed) per request
    int64_t n_output_tokens = 0;
    int64_t n_recomputed_tokens = 0;
    int64_t n_preemptions = 0;
    int64_t n_cross_tenant_hits = 0;  // tokens
    int64_t n_public_hits = 0;        // tokens
    // KV tiers: cached prompt tokens promoted from host memory / disk, the promotions (requests that
    // took at least one block from a tier) and each promotion's wall time.
    int64_t n_tier_host_tokens = 0, n_tier_disk_tokens = 0, n_promotions = 0;
    Histogram promote_s;
    std::map<std::string, TenantCache, std::less<>> tenants;
    std::map<int, LengthClassTtft> length_classes;  // key k: prompts of [2^k, 2^(k+1)) tokens

    double cost_total = 0.0;
    int64_t n_met_slo = 0;
    bool has_slo = false;
    // SLO attainment per target: requests of a bucket with that target, and those that met it.
    int64_t n_slo_ttft_asked = 0, n_slo_ttft_met = 0, n_slo_tpot_asked = 0, n_slo_tpot_met = 0;
    int64_t n_slo_requests = 0;  // requests of buckets with a target (n_met_slo's denominator)

    std::map<std::string, int64_t, std::less<>> n_by_pool;
    int64_t n_upgraded = 0;
    int64_t n_fallback = 0;
    // Per route (the pool a request was answered on): agreement with the strongest pool on shadowed
    // requests, token-level (common prefix / longer output) and exact match.
    struct RouteQuality {
        int64_t n_shadowed = 0;
        double sum_agreement = 0;
        int64_t n_exact = 0;
        double agreement() const;  // NaN without shadowed requests
    };
    std::map<std::string, RouteQuality, std::less<>> route_quality;
    double quality() const;  // agreement over every shadowed request of the row; NaN without

    // Speculation (docs/metrics.md "Speculative decoding"): sums of the requests' figures, and TPOT split
    // by whether the request drafted at all (the plain ones are a same-run baseline).
    int64_t n_drafts = 0;
    int64_t n_draft_tokens = 0;
    int64_t n_accepted_tokens = 0;
    int64_t n_rollbacks = 0;
    int64_t n_spec_branches = 0;  // speculative branches verified: a tree's root-to-leaf paths, a chain 1
    std::array<int64_t, k_spec_positions> n_draft_tokens_at{}, n_accepted_at{};
    double draft_s = 0.0, verify_s = 0.0;
    int64_t n_spec_requests = 0;   // requests with n_drafts > 0
    int64_t n_decode_gaps_spec = 0;  // Σ (n_output - 1) over those with >= 2 output tokens
    Histogram tpot_spec_s, tpot_plain_s;  // TPOT of requests that drafted / did not
    double tpot_spec_sq_s2 = 0, tpot_plain_sq_s2 = 0;  // their sums of squares (the gain's interval)

    // Structured output (issue 14's figures): constrained requests (n_masked > 0), masked rows,
    // forced rows, mask seconds, and each constrained request's mean mask time per row.
    int64_t n_constrained = 0, n_masked = 0, n_forced = 0;
    double mask_s = 0.0;
    Histogram mask_per_row_s;

    KvGauges kv;
    std::map<std::string, int64_t, std::less<>> n_evictions_by_policy;

    // Reuse beyond the prefix (docs/reuse.md): ReuseCounts summed, the tool hits' ages as a histogram.
    struct Reuse {
        int64_t document_hits = 0, document_saved_prefill_tokens = 0, document_refused_permission = 0,
                document_expired = 0;
        int64_t tool_hits = 0, tool_round_trips_saved = 0, tool_resolved_tokens_saved = 0, tool_stale_refused = 0;
        Histogram tool_age_s;
        bool any() const {
            return document_hits || document_refused_permission || document_expired || tool_hits || tool_stale_refused;
        }
    } reuse;
    void add_reuse(const ReuseCounts& c);

    // cost: the request's cost; met_slo: whether it met its bucket's SLO (only with has_slo).
    void add(const RequestRecord& r, double cost, bool met_slo);

    int64_t n_ok() const;  // STOP + LENGTH
    int64_t n_evictions() const;
    double hit_rate() const;  // cached / prompt tokens; NaN without queries
    // Mean over length classes holding both hits and misses of (miss TTFT - hit TTFT), weighted by
    // each class's misses: what a typical miss costs. NaN when no class has both.
    double miss_penalty_s() const;
    double cost_per_request() const;      // NaN without requests
    double upgrade_rate() const;          // NaN without requests
    double fallback_rate() const;         // NaN without requests
    double mean_accepted_length() const;  // 1 + accepted / drafts; NaN without drafts
    int64_t n_rejected_tokens() const { return n_draft_tokens - n_accepted_tokens; }
    double acceptance_rate() const;        // accepted / draft tokens; NaN without drafts
    double acceptance_at(int i) const;     // accepted / proposed at draft position i; NaN if none
    int n_spec_positions() const;          // positions with a draft token (the last used + 1)
};

// One pool's request figures, for the vllm:* families (model_name = the pool): its finished
// requests as a row, plus the phases vLLM splits a request's time into. Tokens a request computed on
// a pool before an upgrade moved it count on that pool (PoolUse).
struct PoolRequestMetrics {
    BucketMetrics m;
    Histogram prefill_s;    // first scheduled -> first token
    Histogram decode_s;     // first token -> finish
    Histogram inference_s;  // first scheduled -> finish
};

// Where a bucket's speculation gain comes from (the "without" TPOT it divides).
enum class SpecGainSource { NONE, BASELINE, PLAIN_REQUESTS, ESTIMATE };
const char* spec_gain_source_name(SpecGainSource s);  // "none", "baseline", "plain_requests", "estimate"

// Speculation gain of a row: TPOT without speculation / TPOT with it (> 1: speculation helps), over
// the requests that drafted. "Without" is, first, a measured baseline TPOT given for the bucket
// (MetricsRegistry::set_spec_baseline, e.g. a bench's run with speculation off); else the mean TPOT
// of the bucket's requests in this run that never drafted (the adaptive policy's k = 0 ones; needs
// at least one); else an estimate from the measured parts: each verification forward costs about
// one plain decode step (small batches are bound by reading the weights, not by the k + 1 rows),
// so without speculation each accepted token would have cost one more such step and the drafts
// nothing: TPOT_off ~ TPOT_spec + (accepted · verify_s / drafts - draft_s) / decode gaps.
struct SpecGain {
    double gain = std::numeric_limits<double>::quiet_NaN();  // NaN without drafts
    double tpot_without_s = std::numeric_limits<double>::quiet_NaN();
    SpecGainSource source = SpecGainSource::NONE;
    // A 95% interval of a measured gain (source PLAIN_REQUESTS, at least 2 requests each side): the
    // delta method on the ratio of the two TPOT means over requests. NaN for an estimate or a
    // baseline run's gain (one mean: no spread).
    double lo = std::numeric_limits<double>::quiet_NaN();
    double hi = std::numeric_limits<double>::quiet_NaN();
    // The estimate from the measured parts (the formula above), whatever the source: beside a
    // measured gain it shows the estimate's error. NaN without decode gaps after drafts.
    double estimate = std::numeric_limits<double>::quiet_NaN();
};
SpecGain speculation_gain(const BucketMetrics& m, std::optional<double> baseline_tpot_s);
// The estimate's TPOT without speculation (the formula above): the TPOT with it, plus per decode
// gap each accepted token's verify-sized step less the drafting. Benches use it as the report does.
double spec_estimated_tpot_without(double tpot_with_s, int64_t n_accepted, double verify_s, int64_t n_drafts,
                                   double draft_s, int64_t n_decode_gaps);
// A 95% interval of the ratio ma / mb by the delta method, from the variance of each mean.
std::pair<double, double> ratio_ci95(double ma, double var_of_ma, double mb, double var_of_mb);

// Cost of one request: Σ over the pools it used of (uncached prompt · prompt price + cached prompt ·
// cached price + output · output price) / 1e6. Pools without a price cost 0; an OVERLOADED request
// (rejected at admission) costs 0; tokens recomputed after preemption are not charged (they are
// the runtime's cost, reported as recomputed tokens).
double request_cost(const RequestRecord& r, const MetricsConfig& cfg);

// The prompt-length class k of a prompt of n tokens: 2^k <= n < 2^(k+1); -1 for n <= 0.
int prompt_length_class(int64_t n_prompt_tokens);

// Decision counts of one policy instance line (bucket, kind, plugin), for the reports.
struct PolicyFigure {
    std::string bucket, kind, plugin;
    int64_t n_calls = 0, n_invalid = 0;
    int64_t n_declined = 0;  // eviction: "no victim" answers (the engine then preempts or waits)
    int64_t n_timed_out = 0; // answered by the safe default: over the time budget, or while an overrun call ran
    // isolation = "process": plugin host processes that ended (crashed, exited, garbled, killed after
    // an overrun), restarts, and decisions answered by the safe default because the host had died.
    int64_t n_crashed = 0, n_restarts = 0, n_unavailable = 0;
};

// Aggregates records per bucket and overall; writes the figures.
// Thread-safety: none; the owner (one actor) serialises every call. Copyable.
class MetricsRegistry {
public:
    explicit MetricsRegistry(MetricsConfig cfg = {});

    void record(const RequestRecord& r);
    // A bucket-tagged sample updates that bucket's row only; an untagged one the "all" row.
    void record_kv(const KvSample& s);
    // Counted in "all" and, when bucket is non-empty, in that bucket; and per pool ("" reads "unknown").
    void add_evictions(int64_t n, std::string_view policy = "lru", std::string_view bucket = {},
                       std::string_view pool = {});
    // Every pool's scheduler load now, replacing the previous (the owner refreshes it before writing
    // the exposition, as the policy figures). The gauge families list these pools.
    void set_pool_loads(std::vector<PoolLoad> loads) { loads_ = std::move(loads); }
    const std::vector<PoolLoad>& pool_loads() const { return loads_; }
    // A pool's request figures (nullptr if it finished none and did no upgraded work).
    const PoolRequestMetrics* pool(std::string_view name) const;
    // A pool's KV gauges from its untagged samples (nullptr before its first).
    const KvGauges* pool_kv(std::string_view name) const;
    // The wall-time window for throughput and goodput. Without it: first arrival to last finish.
    void set_window(double t_begin_s, double t_end_s);
    // A shadowed request's agreement with the strongest pool, for the route (pool) it was answered on.
    void record_quality(std::string_view bucket, std::string_view pool, double agreement, bool exact);
    // A request's reuse figures, in `bucket`'s row ("" : "unclassified") and "all".
    void record_reuse(std::string_view bucket, const ReuseCounts& c);
    // A config reload: ok or not, and the live generation after it.
    void record_reload(bool ok, uint64_t generation, const std::string& error = {});
    // Prices and SLOs of a new config generation (accumulated figures are kept).
    void update_config(MetricsConfig cfg) { cfg_ = std::move(cfg); }
    // A measured TPOT of the bucket without speculation (a run with it off), for its speculation gain.
    void set_spec_baseline(std::string_view bucket, double tpot_s) { spec_baseline_[std::string(bucket)] = tpot_s; }
    SpecGain spec_gain(std::string_view bucket) const;  // "all" for the all row
    // The plugin decision counts, refreshed by the owner before writing a report.
    void set_policy_figures(std::vector<PolicyFigure> f) { policies_ = std::move(f); }
    // A pool's KV admission figures per tenant (its kv_allocator's), replacing the pool's previous ones.
    void set_admission(const std::string& pool, std::vector<TenantAdmission> tenants) {
        admission_[pool] = std::move(tenants);
    }
    const std::map<std::string, std::vector<TenantAdmission>, std::less<>>& admission() const { return admission_; }
    uint64_t config_generation() const { return generation_; }
    int64_t n_reloads_ok() const { return n_reload_ok_; }
    int64_t n_reloads_failed() const { return n_reload_failed_; }
    double window_s() const;  // 0 before any record
    // KV usage and evictions over time: every untagged sample while fewer than k_max_kv_points are
    // kept, then every other one is dropped and every 2nd (4th, ...) sample kept, so a long run
    // keeps an evenly thinned series of bounded size.
    static constexpr size_t k_max_kv_points = 2048;
    const std::vector<KvPoint>& kv_series() const { return kv_series_; }

    const MetricsConfig& config() const { return cfg_; }
    const BucketMetrics& all() const { return all_; }
    const BucketMetrics* bucket(std::string_view name) const;  // nullptr if never seen
    // The standard buckets in docs/workloads.md's order, then any others alphabetically; only seen ones.
    std::vector<std::string> bucket_names() const;

    double throughput_tok_s(const BucketMetrics& m) const;  // output tokens / window; NaN if none
    double goodput_req_s(const BucketMetrics& m) const;     // met SLO / window; NaN without an SLO

    // {"window_s", "all": {...}, "buckets": {"short_qa": {...}, ...}}; every figure of a row, units
    // in the key names (ttft_ms: {count, mean, p50, p95, p99, max}), undefined figures null.
    nlohmann::json row_json(const BucketMetrics& m) const;
    nlohmann::json to_json() const;
    // Fixed-width text: one row per bucket and "all"; "-" for undefined figures. When some request
    // drafted, a speculation table per bucket follows (spec_table).
    // The report's text tables. The default keeps every line within 120 columns (the figures most
    // runs are judged on); wide adds the rest (ttft p95, saved tokens, KV, evictions, preemptions,
    // cost, routing; speculation's rejected, times, rollbacks and branches).
    std::string to_table(bool wide = false) const;
    // Text exposition format 0.0.4, Prometheus naming: steward_ prefix, the base unit last
    // (_seconds, _tokens, _blocks, _ratio for 0-1), _total on counters only; names follow vLLM's
    // where one exists. Request figures carry a bucket label (no "all" series: Prometheus sums
    // labels itself); KV gauges come from the untagged samples and carry the pool's; the running and
    // waiting gauges come from set_pool_loads. With config().vllm_names the vllm:* families follow.
    std::string to_prometheus() const;
    // vLLM's families (docs/metrics.md#vllm-names), one series per pool labelled model_name and
    // engine="0": what Steward measures under vLLM's names, types, units and histogram bounds.
    std::string vllm_prometheus() const;

private:
    BucketMetrics& row(std::string_view bucket);

    MetricsConfig cfg_;
    BucketMetrics all_;
    std::map<std::string, BucketMetrics, std::less<>> buckets_;
    std::optional<std::pair<double, double>> window_;  // set_window's
    double t_first_arrival_s_ = 0.0;
    double t_last_finish_s_ = 0.0;
    uint64_t generation_ = 1;
    int64_t n_reload_ok_ = 0, n_reload_failed_ = 0;
    std::string last_reload_error_;
    std::vector<PolicyFigure> policies_;
    std::map<std::string, std::vector<TenantAdmission>, std::less<>> admission_;  // pool -> by tenant
    std::map<std::string, double, std::less<>> spec_baseline_;  // bucket -> TPOT without speculation, s
    std::vector<KvPoint> kv_series_;
    uint64_t kv_series_seen_ = 0, kv_series_stride_ = 1;
    std::map<std::string, PoolRequestMetrics, std::less<>> pools_;              // by the pool that did the work
    std::map<std::string, KvGauges, std::less<>> kv_by_pool_;                   // untagged samples, by pool
    std::map<std::pair<std::string, std::string>, int64_t> evictions_by_pool_;  // (pool, policy) -> blocks
    std::vector<PoolLoad> loads_;
    // The pools the gauge families list: the loaded ones (set_pool_loads) when known, else every
    // pool that sampled its KV.
    std::vector<std::string> gauge_pools() const;
    int64_t admission_waiting(std::string_view pool) const;  // Σ over tenants of the pool's KV admission queue
    int64_t n_evictions_total_ = 0;
    std::string spec_table(bool wide) const;  // to_table's speculation section; "" when nothing drafted
    std::string structured_table() const;  // to_table's structured-output section; "" when nothing was constrained
    std::string tiers_table() const;       // to_table's KV tiers section; "" when no pool has tiers
    std::string reuse_table() const;       // to_table's reuse section; "" when no request reused a document or tool result
    static nlohmann::json reuse_json(const BucketMetrics& m);
    static nlohmann::json slo_json(const BucketMetrics& m);
    static nlohmann::json structured_json(const BucketMetrics& m);
    nlohmann::json spec_json(const BucketMetrics& m) const;
    std::optional<double> spec_baseline_of(const BucketMetrics& m) const;  // set_spec_baseline's, for m's row

public:
    // Request figures by (bucket, pool, tenant), for the Prometheus series labelled with all three.
    // Bounded: past k_max_tenant_rows distinct keys a new tenant is counted as "other".
    struct TenantRouteRow {
        std::array<int64_t, n_finish_reasons> n_by_finish{};
        int64_t n_prompt_tokens = 0, n_cached_tokens = 0, n_output_tokens = 0;
        double cost = 0.0;
        Histogram ttft_s, e2e_s;
    };
    using TenantRouteKey = std::tuple<std::string, std::string, std::string>;  // bucket, pool, tenant
    static constexpr size_t k_max_tenant_rows = 4096;
    const std::map<TenantRouteKey, TenantRouteRow>& tenant_rows() const { return tenant_rows_; }

private:
    std::map<TenantRouteKey, TenantRouteRow> tenant_rows_;
};

}  // namespace steward
