// Per-bucket aggregation of request records and KV samples, and its JSON, table and Prometheus output.
#include "metrics/bucket_metrics.h"
#include "grammar/constraint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <tuple>

namespace steward {

namespace {

constexpr double k_nan = std::numeric_limits<double>::quiet_NaN();
constexpr double k_gib = 1024.0 * 1024.0 * 1024.0;

// docs/workloads.md's order; others follow alphabetically.
constexpr std::array<std::string_view, 6> k_standard_buckets = {"short_qa", "long_doc",  "long_output",
                                                                "agent",    "high_temp", "structured"};

// Histogram boundaries (seconds): vLLM's, with finer steps at the low end where small synthetic
// models on a CPU land.
constexpr double k_ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
constexpr double k_itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,
                                   0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
constexpr double k_e2e_bounds[] = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,    5.0,   10.0,
                                   15.0, 20.0,  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

const std::string& bucket_key(const std::string& b) {
    static const std::string unclassified = "unclassified";
    return b.empty() ? unclassified : b;
}

std::string pool_key(std::string_view p) {
    return p.empty() ? std::string("unknown") : std::string(p);
}

// Per-request mean time per output token: from the gaps when given, else from first/finish times.
std::optional<double> request_tpot_s(const RequestRecord& r) {
    if (r.n_output_tokens < 2) return std::nullopt;
    if (!r.itl_s.empty()) return std::accumulate(r.itl_s.begin(), r.itl_s.end(), 0.0) / (double)r.itl_s.size();
    if (!r.t_first_token_s) return std::nullopt;
    return (r.t_finish_s - *r.t_first_token_s) / (double)(r.n_output_tokens - 1);
}

bool counts_for_e2e(FinishReason f) {
    return f != FinishReason::ERROR && f != FinishReason::OVERLOADED;
}

double ratio(double num, double den) {
    return den > 0 ? num / den : k_nan;
}

nlohmann::json num(double v) {
    if (!std::isfinite(v)) return nullptr;
    return v;
}

// A latency distribution in ms. With `with_cdf`, also "cdf": [[le_ms, n_at_or_below], ...], one
// point per non-empty histogram bucket (its upper edge, clamped to max; the last point is
// [max, count]), so that a report can draw the whole CDF, not only its quantiles. A point's x is
// within one bucket width (~9%) of where the exact step lies.
nlohmann::json dist_ms(const Histogram& h, bool with_cdf = false) {
    nlohmann::json d = {{"count", h.count()},
                        {"mean", num(h.mean() * 1e3)},
                        {"p50", num(h.quantile(0.50) * 1e3)},
                        {"p95", num(h.quantile(0.95) * 1e3)},
                        {"p99", num(h.quantile(0.99) * 1e3)},
                        {"max", num(h.max() * 1e3)}};
    if (!with_cdf) return d;
    nlohmann::json cdf = nlohmann::json::array();
    if (h.count() > 0) {
        const double max = h.max();
        uint64_t seen = h.n_underflow();
        if (seen > 0) cdf.push_back({std::min(Histogram::k_lo, max) * 1e3, seen});
        for (int i = 0; i < Histogram::n_buckets; ++i) {
            if (h.bucket_count(i) == 0) continue;
            seen += h.bucket_count(i);
            cdf.push_back({std::min(Histogram::bucket_lower(i + 1), max) * 1e3, seen});
        }
        if (h.n_overflow() > 0) cdf.push_back({max * 1e3, h.count()});
    }
    d["cdf"] = std::move(cdf);
    return d;
}

std::string fmt(double v, const char* f) {
    if (!std::isfinite(v)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

}  // namespace

double KvShape::block_bytes() const {
    return 2.0 * n_layers * block_size * n_kv_heads * head_dim * bytes_per_elem;
}

double KvShape::total_gib() const {
    return block_bytes() * n_blocks / k_gib;
}

void KvGauges::add(const KvSample& s) {
    double usage = s.n_blocks_total > 0 ? (double)s.n_blocks_used / (double)s.n_blocks_total : 0.0;
    if (n_samples == 0) {
        t_first_ = s.t_s;
    } else {
        // The previous reading held from its time until now; a sample out of order holds for 0 s.
        double dt = std::max(0.0, s.t_s - last.t_s);
        double prev_usage = last.n_blocks_total > 0 ? (double)last.n_blocks_used / (double)last.n_blocks_total : 0.0;
        span_s_ += dt;
        i_used_ += (double)last.n_blocks_used * dt;
        i_usage_ += prev_usage * dt;
        i_frag_ += last.fragmentation * (double)last.n_blocks_used * dt;
        i_frag_w_ += (double)last.n_blocks_used * dt;
        i_bytes_ += (double)last.n_blocks_used * last.block_bytes * dt;
    }
    s_bytes_ += (double)s.n_blocks_used * s.block_bytes;
    bytes_used_peak = std::max(bytes_used_peak, (double)s.n_blocks_used * s.block_bytes);
    s_used_ += (double)s.n_blocks_used;
    s_usage_ += usage;
    s_frag_ += s.fragmentation * (double)s.n_blocks_used;
    s_frag_w_ += (double)s.n_blocks_used;
    n_blocks_used_peak = std::max(n_blocks_used_peak, s.n_blocks_used);
    page_usage_peak = std::max(page_usage_peak, usage);
    n_branches_peak = std::max(n_branches_peak, s.n_branches);
    last = s;
    ++n_samples;
}

double KvGauges::blocks_used_mean() const {
    if (n_samples == 0) return k_nan;
    return span_s_ > 0 ? i_used_ / span_s_ : s_used_ / (double)n_samples;
}

double KvGauges::bytes_used_mean() const {
    if (n_samples == 0) return k_nan;
    return span_s_ > 0 ? i_bytes_ / span_s_ : s_bytes_ / (double)n_samples;
}

double KvGauges::page_usage_mean() const {
    if (n_samples == 0) return k_nan;
    return span_s_ > 0 ? i_usage_ / span_s_ : s_usage_ / (double)n_samples;
}

double KvGauges::fragmentation() const {
    if (i_frag_w_ > 0) return i_frag_ / i_frag_w_;
    return ratio(s_frag_, s_frag_w_);
}

double LengthClassTtft::penalty_s() const {
    if (n_hit == 0 || n_miss == 0) return k_nan;
    return ttft_miss_sum_s / (double)n_miss - ttft_hit_sum_s / (double)n_hit;
}

int prompt_length_class(int64_t n) {
    if (n <= 0) return -1;
    int k = 0;
    while ((n >> 1) > 0) {
        n >>= 1;
        ++k;
    }
    return k;
}

void BucketMetrics::add(const RequestRecord& r, double cost, bool met_slo) {
    ++n_requests;
    ++n_by_finish[(size_t)r.finish];
    ++n_by_config_generation[r.config_generation];

    std::optional<double> ttft;
    if (r.t_first_token_s) {
        ttft = *r.t_first_token_s - r.t_arrival_s;
        ttft_s.record(*ttft);
    }
    if (auto tpot = request_tpot_s(r)) tpot_s.record(*tpot);
    if (r.n_output_tokens >= 2)
        for (double g : r.itl_s) itl_s.record(g);
    if (counts_for_e2e(r.finish)) {
        e2e_s.record(r.t_finish_s - r.t_arrival_s);
        if (r.t_scheduled_s) queue_s.record(*r.t_scheduled_s - r.t_arrival_s);
    }

    n_prompt_tokens += r.n_prompt_tokens;
    n_cached_tokens += r.n_cached_prompt_tokens;
    n_saved_tokens += std::max<int64_t>(0, r.n_cached_prompt_tokens - r.n_recomputed_tokens);
    n_output_tokens += r.n_output_tokens;
    n_recomputed_tokens += r.n_recomputed_tokens;
    n_preemptions += r.n_preemptions;
    n_cross_tenant_hits += r.n_cached_cross_tenant;
    n_public_hits += r.n_cached_public;
    n_tier_host_tokens += r.n_cached_host_tokens;
    n_tier_disk_tokens += r.n_cached_disk_tokens;
    if (r.n_promotions > 0) {
        n_promotions += r.n_promotions;
        promote_s.record(r.promote_s);
    }
    TenantCache& t = tenants[r.tenant];
    ++t.n_requests;
    t.n_queries += r.n_prompt_tokens;
    t.n_hits += r.n_cached_prompt_tokens;
    if (ttft && r.n_prompt_tokens > 0) {
        LengthClassTtft& c = length_classes[prompt_length_class(r.n_prompt_tokens)];
        if (r.n_cached_prompt_tokens > 0) {
            ++c.n_hit;
            c.ttft_hit_sum_s += *ttft;
        } else {
            ++c.n_miss;
            c.ttft_miss_sum_s += *ttft;
        }
    }

    cost_total += cost;
    if (met_slo) ++n_met_slo;

    ++n_by_pool[r.pool.empty() ? std::string("unknown") : r.pool];
    if (!r.prior_pools.empty()) ++n_upgraded;
    if (r.fallback) ++n_fallback;

    n_drafts += r.n_drafts;
    n_draft_tokens += r.n_draft_tokens;
    n_accepted_tokens += r.n_accepted_tokens;
    n_rollbacks += r.n_rollbacks;
    n_spec_branches += r.n_spec_branches;
    for (size_t i = 0; i < n_draft_tokens_at.size(); i++) {
        n_draft_tokens_at[i] += r.n_draft_tokens_at[i];
        n_accepted_at[i] += r.n_accepted_at[i];
    }
    draft_s += r.draft_s;
    verify_s += r.verify_s;
    const std::optional<double> tpot = request_tpot_s(r);
    if (r.n_drafts > 0) {
        ++n_spec_requests;
        if (tpot) {
            tpot_spec_s.record(*tpot);
            tpot_spec_sq_s2 += *tpot * *tpot;
            n_decode_gaps_spec += r.n_output_tokens - 1;
        }
    } else if (tpot) {
        tpot_plain_s.record(*tpot);
        tpot_plain_sq_s2 += *tpot * *tpot;
    }
    if (r.n_masked > 0) {
        ++n_constrained;
        n_masked += r.n_masked;
        n_forced += r.n_forced;
        mask_s += r.mask_s;
        mask_per_row_s.record(r.mask_s / (double)r.n_masked);
    }
}

int64_t BucketMetrics::n_ok() const {
    return n_by_finish[(size_t)FinishReason::STOP] + n_by_finish[(size_t)FinishReason::LENGTH];
}

int64_t BucketMetrics::n_evictions() const {
    int64_t n = 0;
    for (const auto& [policy, c] : n_evictions_by_policy) n += c;
    return n;
}

double BucketMetrics::hit_rate() const {
    return ratio((double)n_cached_tokens, (double)n_prompt_tokens);
}

double BucketMetrics::miss_penalty_s() const {
    double sum = 0.0, weight = 0.0;
    for (const auto& [k, c] : length_classes) {
        double p = c.penalty_s();
        if (std::isnan(p)) continue;
        sum += p * (double)c.n_miss;
        weight += (double)c.n_miss;
    }
    return ratio(sum, weight);
}

double BucketMetrics::cost_per_request() const {
    return ratio(cost_total, (double)n_requests);
}
double BucketMetrics::RouteQuality::agreement() const {
    return n_shadowed > 0 ? sum_agreement / (double)n_shadowed : std::numeric_limits<double>::quiet_NaN();
}

double BucketMetrics::quality() const {
    int64_t n = 0;
    double sum = 0;
    for (const auto& [pool, q] : route_quality) {
        n += q.n_shadowed;
        sum += q.sum_agreement;
    }
    return n > 0 ? sum / (double)n : std::numeric_limits<double>::quiet_NaN();
}

void MetricsRegistry::record_quality(std::string_view bucket, std::string_view pool, double agreement, bool exact) {
    for (BucketMetrics* m : {&all_, &row(bucket)}) {
        auto it = m->route_quality.find(pool);
        if (it == m->route_quality.end()) it = m->route_quality.emplace(std::string(pool), BucketMetrics::RouteQuality{}).first;
        it->second.n_shadowed++;
        it->second.sum_agreement += agreement;
        it->second.n_exact += exact ? 1 : 0;
    }
}

void BucketMetrics::add_reuse(const ReuseCounts& c) {
    reuse.document_hits += c.document_hits;
    reuse.document_saved_prefill_tokens += c.document_saved_prefill_tokens;
    reuse.document_refused_permission += c.document_refused_permission;
    reuse.document_expired += c.document_expired;
    reuse.tool_hits += c.tool_hits;
    reuse.tool_round_trips_saved += c.tool_round_trips_saved;
    reuse.tool_resolved_tokens_saved += c.tool_resolved_tokens_saved;
    reuse.tool_stale_refused += c.tool_stale_refused;
    for (double a : c.tool_age_at_use_s) reuse.tool_age_s.record(std::max(0.0, a));
}

void MetricsRegistry::record_reuse(std::string_view bucket, const ReuseCounts& c) {
    all_.add_reuse(c);
    row(bucket).add_reuse(c);
}

nlohmann::json MetricsRegistry::reuse_json(const BucketMetrics& m) {
    const auto& r = m.reuse;
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    return {{"documents",
             {{"hits", r.document_hits},
              {"saved_prefill_tokens", r.document_saved_prefill_tokens},
              {"refused_permission", r.document_refused_permission},
              {"expired", r.document_expired}}},
            {"tools",
             {{"hits", r.tool_hits},
              {"round_trips_saved", r.tool_round_trips_saved},
              {"resolved_tokens_saved", r.tool_resolved_tokens_saved},
              {"age_at_use_p50_s", num(r.tool_age_s.quantile(0.50))},
              {"age_at_use_p99_s", num(r.tool_age_s.quantile(0.99))},
              {"stale_refused", r.tool_stale_refused}}}};
}

// Printed only when some request reused a document or a tool result (or was refused one).
std::string MetricsRegistry::reuse_table() const {
    if (!all_.reuse.any()) return {};
    std::string out = "\n";
    char buf[320];
    std::snprintf(buf, sizeof buf, "%-12s %8s %10s %8s %8s %8s %8s %10s %9s %8s\n", "reuse", "doc_hits", "doc_saved",
                  "doc_403", "doc_exp", "tool_hit", "trips", "tool_saved", "age_p50_s", "stale");
    out += buf;
    auto line = [&](const std::string& name, const BucketMetrics& m) {
        const auto& r = m.reuse;
        std::snprintf(buf, sizeof buf, "%-12s %8lld %10lld %8lld %8lld %8lld %8lld %10lld %9s %8lld\n", name.c_str(),
                      (long long)r.document_hits, (long long)r.document_saved_prefill_tokens,
                      (long long)r.document_refused_permission, (long long)r.document_expired, (long long)r.tool_hits,
                      (long long)r.tool_round_trips_saved, (long long)r.tool_resolved_tokens_saved,
                      fmt(r.tool_age_s.quantile(0.5), "%.2f").c_str(), (long long)r.tool_stale_refused);
        out += buf;
    };
    for (const std::string& name : bucket_names()) line(name, buckets_.find(name)->second);
    line("all", all_);
    return out;
}

void MetricsRegistry::record_reload(bool ok, uint64_t generation, const std::string& error) {
    (ok ? n_reload_ok_ : n_reload_failed_)++;
    generation_ = generation;
    if (!ok) last_reload_error_ = error;
}

double BucketMetrics::upgrade_rate() const {
    return ratio((double)n_upgraded, (double)n_requests);
}
double BucketMetrics::fallback_rate() const {
    return ratio((double)n_fallback, (double)n_requests);
}

double BucketMetrics::mean_accepted_length() const {
    return n_drafts > 0 ? 1.0 + (double)n_accepted_tokens / (double)n_drafts : k_nan;
}

double BucketMetrics::acceptance_rate() const {
    return ratio((double)n_accepted_tokens, (double)n_draft_tokens);
}

double BucketMetrics::acceptance_at(int i) const {
    if (i < 0 || i >= k_spec_positions) return k_nan;
    return ratio((double)n_accepted_at[(size_t)i], (double)n_draft_tokens_at[(size_t)i]);
}

int BucketMetrics::n_spec_positions() const {
    int n = 0;
    for (int i = 0; i < k_spec_positions; i++)
        if (n_draft_tokens_at[(size_t)i] > 0) n = i + 1;
    return n;
}

const char* spec_gain_source_name(SpecGainSource s) {
    switch (s) {
        case SpecGainSource::NONE: return "none";
        case SpecGainSource::BASELINE: return "baseline";
        case SpecGainSource::PLAIN_REQUESTS: return "plain_requests";
        case SpecGainSource::ESTIMATE: return "estimate";
    }
    return "none";
}

double spec_estimated_tpot_without(double tpot_with_s, int64_t n_accepted, double verify_s, int64_t n_drafts,
                                   double draft_s, int64_t n_decode_gaps) {
    const double verify_per_draft = verify_s / (double)n_drafts;
    return tpot_with_s + ((double)n_accepted * verify_per_draft - draft_s) / (double)n_decode_gaps;
}

std::pair<double, double> ratio_ci95(double ma, double var_of_ma, double mb, double var_of_mb) {
    const double r = ma / mb, se = r * std::sqrt(var_of_ma / (ma * ma) + var_of_mb / (mb * mb));
    return {r - 1.96 * se, r + 1.96 * se};
}

SpecGain speculation_gain(const BucketMetrics& m, std::optional<double> baseline_tpot_s) {
    SpecGain g;
    const double with = m.tpot_spec_s.mean();
    if (m.n_drafts == 0 || !(with > 0)) return g;
    double estimated_without = std::numeric_limits<double>::quiet_NaN();
    if (m.n_decode_gaps_spec > 0) {
        estimated_without = spec_estimated_tpot_without(with, m.n_accepted_tokens, m.verify_s, m.n_drafts, m.draft_s,
                                                        m.n_decode_gaps_spec);
        g.estimate = estimated_without / with;
    }
    if (baseline_tpot_s && *baseline_tpot_s > 0) {
        g.tpot_without_s = *baseline_tpot_s;
        g.source = SpecGainSource::BASELINE;
    } else if (m.tpot_plain_s.count() > 0) {
        g.tpot_without_s = m.tpot_plain_s.mean();
        g.source = SpecGainSource::PLAIN_REQUESTS;
        const double np = (double)m.tpot_plain_s.count(), ns = (double)m.tpot_spec_s.count();
        if (np >= 2 && ns >= 2) {
            // The variance of each mean, from the sums: (sum x^2 - n mean^2) / (n - 1) / n.
            const double mp = g.tpot_without_s, ms = with;
            const double vp = std::max(0.0, (m.tpot_plain_sq_s2 - np * mp * mp) / (np - 1)) / np;
            const double vs = std::max(0.0, (m.tpot_spec_sq_s2 - ns * ms * ms) / (ns - 1)) / ns;
            std::tie(g.lo, g.hi) = ratio_ci95(mp, vp, ms, vs);
        }
    } else if (m.n_decode_gaps_spec > 0) {
        g.tpot_without_s = estimated_without;
        g.source = SpecGainSource::ESTIMATE;
    } else {
        return g;
    }
    g.gain = g.tpot_without_s / with;
    return g;
}

SpecGain MetricsRegistry::spec_gain(std::string_view bucket) const {
    const BucketMetrics* m = bucket == "all" ? &all_ : this->bucket(bucket);
    if (!m) return {};
    auto it = spec_baseline_.find(bucket);
    return speculation_gain(*m, it == spec_baseline_.end() ? std::nullopt : std::optional<double>(it->second));
}

double request_cost(const RequestRecord& r, const MetricsConfig& cfg) {
    if (r.finish == FinishReason::OVERLOADED) return 0.0;  // rejected at admission: nothing computed
    auto cost_on = [&](const std::string& pool, int64_t n_prompt, int64_t n_cached, int64_t n_output) {
        auto it = cfg.prices.find(pool);
        if (it == cfg.prices.end()) return 0.0;
        const PoolPrice& p = it->second;
        int64_t n_computed = std::max<int64_t>(0, n_prompt - n_cached);
        return ((double)n_computed * p.prompt_per_mtok + (double)n_cached * p.cached_prompt_per_mtok +
                (double)n_output * p.output_per_mtok) /
               1e6;
    };
    double c = cost_on(r.pool, r.n_prompt_tokens, r.n_cached_prompt_tokens, r.n_output_tokens);
    for (const PoolUse& u : r.prior_pools)
        c += cost_on(u.pool, u.n_prompt_tokens, u.n_cached_prompt_tokens, u.n_output_tokens);
    return c;
}

MetricsRegistry::MetricsRegistry(MetricsConfig cfg) : cfg_(std::move(cfg)) {}

BucketMetrics& MetricsRegistry::row(std::string_view bucket) {
    auto it = buckets_.find(bucket);
    if (it == buckets_.end()) it = buckets_.emplace(std::string(bucket), BucketMetrics{}).first;
    return it->second;
}

void MetricsRegistry::record(const RequestRecord& r) {
    const std::string& b = bucket_key(r.bucket);
    BucketMetrics& m = row(b);
    double cost = request_cost(r, cfg_);
    bool met = false;
    auto slo = cfg_.slo.find(b);
    if (slo != cfg_.slo.end()) {
        m.has_slo = all_.has_slo = true;
        auto tpot = request_tpot_s(r);
        const bool ok = finish_reason_ok(r.finish) && r.t_first_token_s;
        const bool ttft_met = ok && (slo->second.ttft_ms <= 0 || (*r.t_first_token_s - r.t_arrival_s) * 1e3 <= slo->second.ttft_ms);
        const bool tpot_met = ok && (slo->second.tpot_ms <= 0 || !tpot || *tpot * 1e3 <= slo->second.tpot_ms);
        met = ttft_met && tpot_met;
        // Attainment per target: a failed request misses both.
        for (BucketMetrics* x : {&m, &all_}) {
            x->n_slo_requests++;
            if (slo->second.ttft_ms > 0) x->n_slo_ttft_asked++, x->n_slo_ttft_met += ttft_met;
            if (slo->second.tpot_ms > 0) x->n_slo_tpot_asked++, x->n_slo_tpot_met += tpot_met;
        }
    }
    if (all_.n_requests == 0) {
        t_first_arrival_s_ = r.t_arrival_s;
        t_last_finish_s_ = r.t_finish_s;
    }
    t_first_arrival_s_ = std::min(t_first_arrival_s_, r.t_arrival_s);
    t_last_finish_s_ = std::max(t_last_finish_s_, r.t_finish_s);
    m.add(r, cost, met);
    all_.add(r, cost, met);
    // Per pool (the vllm:* families): the finishing pool's row, vLLM's phases of the request, and
    // the tokens an upgraded request computed on the pools before it. A request refused at
    // admission (overloaded) never reached the pool's engine: vLLM would not have counted it.
    if (r.finish != FinishReason::OVERLOADED) {
        PoolRequestMetrics& p = pools_[pool_key(r.pool)];
        p.m.add(r, cost, met);
        if (counts_for_e2e(r.finish) && r.t_scheduled_s) {
            if (r.t_first_token_s) {
                p.prefill_s.record(*r.t_first_token_s - *r.t_scheduled_s);
                p.decode_s.record(r.t_finish_s - *r.t_first_token_s);
            }
            p.inference_s.record(r.t_finish_s - *r.t_scheduled_s);
        }
        for (const PoolUse& u : r.prior_pools) {
            BucketMetrics& q = pools_[pool_key(u.pool)].m;
            q.n_prompt_tokens += u.n_prompt_tokens;
            q.n_cached_tokens += u.n_cached_prompt_tokens;
            q.n_output_tokens += u.n_output_tokens;
        }
    }
    TenantRouteKey key{b, r.pool.empty() ? std::string("none") : r.pool, r.tenant.empty() ? std::string("default") : r.tenant};
    if (tenant_rows_.size() >= k_max_tenant_rows && !tenant_rows_.count(key)) std::get<2>(key) = "other";
    TenantRouteRow& t = tenant_rows_[key];
    t.n_by_finish[(size_t)r.finish]++;
    t.n_prompt_tokens += r.n_prompt_tokens;
    t.n_cached_tokens += r.n_cached_prompt_tokens;
    t.n_output_tokens += r.n_output_tokens;
    t.cost += cost;
    if (r.t_first_token_s) t.ttft_s.record(*r.t_first_token_s - r.t_arrival_s);
    if (r.finish != FinishReason::ERROR && r.finish != FinishReason::OVERLOADED) t.e2e_s.record(r.t_finish_s - r.t_arrival_s);
}

void MetricsRegistry::record_kv(const KvSample& s) {
    if (!s.bucket.empty()) {
        row(s.bucket).kv.add(s);
        return;
    }
    all_.kv.add(s);
    kv_by_pool_[pool_key(s.pool)].add(s);
    if (kv_series_seen_++ % kv_series_stride_ != 0) return;
    kv_series_.push_back({s.t_s, s.pool, s.n_blocks_used, s.n_blocks_total, n_evictions_total_});
    if (kv_series_.size() >= k_max_kv_points) {  // thin: keep every other point, sample half as often
        size_t w = 0;
        for (size_t r = 0; r < kv_series_.size(); r += 2) kv_series_[w++] = std::move(kv_series_[r]);
        kv_series_.resize(w);
        kv_series_stride_ *= 2;
    }
}

void MetricsRegistry::add_evictions(int64_t n, std::string_view policy, std::string_view bucket,
                                    std::string_view pool) {
    std::string p(policy.empty() ? "unknown" : policy);
    n_evictions_total_ += n;
    evictions_by_pool_[{pool_key(pool), p}] += n;
    all_.n_evictions_by_policy[p] += n;
    if (!bucket.empty()) row(bucket).n_evictions_by_policy[p] += n;
}

void MetricsRegistry::set_window(double t_begin_s, double t_end_s) {
    window_ = {t_begin_s, t_end_s};
}

double MetricsRegistry::window_s() const {
    if (window_) return std::max(0.0, window_->second - window_->first);
    if (all_.n_requests == 0) return 0.0;
    return std::max(0.0, t_last_finish_s_ - t_first_arrival_s_);
}

const PoolRequestMetrics* MetricsRegistry::pool(std::string_view name) const {
    auto it = pools_.find(name);
    return it == pools_.end() ? nullptr : &it->second;
}

const KvGauges* MetricsRegistry::pool_kv(std::string_view name) const {
    auto it = kv_by_pool_.find(name);
    return it == kv_by_pool_.end() ? nullptr : &it->second;
}

int64_t MetricsRegistry::admission_waiting(std::string_view pool) const {
    int64_t n = 0;
    if (auto it = admission_.find(pool); it != admission_.end())
        for (const TenantAdmission& t : it->second) n += t.n_waiting;
    return n;
}

std::vector<std::string> MetricsRegistry::gauge_pools() const {
    std::vector<std::string> out;
    if (!loads_.empty())
        for (const PoolLoad& l : loads_) out.push_back(pool_key(l.pool));
    else
        for (const auto& [pool, kv] : kv_by_pool_) out.push_back(pool);
    return out;
}

const BucketMetrics* MetricsRegistry::bucket(std::string_view name) const {
    auto it = buckets_.find(name);
    return it == buckets_.end() ? nullptr : &it->second;
}

std::vector<std::string> MetricsRegistry::bucket_names() const {
    std::vector<std::string> names;
    for (std::string_view s : k_standard_buckets)
        if (buckets_.count(s)) names.emplace_back(s);
    for (const auto& [name, m] : buckets_)
        if (std::find(k_standard_buckets.begin(), k_standard_buckets.end(), name) == k_standard_buckets.end())
            names.push_back(name);
    return names;
}

double MetricsRegistry::throughput_tok_s(const BucketMetrics& m) const {
    return ratio((double)m.n_output_tokens, window_s());
}

double MetricsRegistry::goodput_req_s(const BucketMetrics& m) const {
    // Null without a target (a bucket listed with 0 for both has none).
    return m.has_slo && m.n_slo_ttft_asked + m.n_slo_tpot_asked > 0 ? ratio((double)m.n_met_slo, window_s()) : k_nan;
}

std::optional<double> MetricsRegistry::spec_baseline_of(const BucketMetrics& m) const {
    std::string_view name = "all";
    if (&m != &all_) {
        name = {};
        for (const auto& [b, row] : buckets_)
            if (&row == &m) name = b;
    }
    auto it = spec_baseline_.find(name);
    if (name.empty() || it == spec_baseline_.end()) return std::nullopt;
    return it->second;
}

// The row's speculation figures (docs/metrics.md "Speculative decoding"); per-position arrays run to the
// last draft position used.
nlohmann::json MetricsRegistry::spec_json(const BucketMetrics& m) const {
    using nlohmann::json;
    json proposed = json::array(), accepted = json::array(), rate = json::array();
    for (int i = 0; i < m.n_spec_positions(); i++) {
        proposed.push_back(m.n_draft_tokens_at[(size_t)i]);
        accepted.push_back(m.n_accepted_at[(size_t)i]);
        rate.push_back(num(m.acceptance_at(i)));
    }
    const SpecGain g = speculation_gain(m, spec_baseline_of(m));
    return {{"drafts", m.n_drafts},
            {"draft_tokens", m.n_draft_tokens},
            {"accepted_tokens", m.n_accepted_tokens},
            {"rejected_tokens", m.n_rejected_tokens()},
            {"mean_accepted_length", num(m.mean_accepted_length())},
            {"acceptance_rate", num(m.acceptance_rate())},
            {"acceptance_per_position", rate},
            {"draft_tokens_per_position", proposed},
            {"accepted_tokens_per_position", accepted},
            {"draft_s", m.draft_s},
            {"verify_s", m.verify_s},
            {"draft_ms_per_draft", num(ratio(m.draft_s, (double)m.n_drafts) * 1e3)},
            {"verify_ms_per_draft", num(ratio(m.verify_s, (double)m.n_drafts) * 1e3)},
            {"rollbacks", m.n_rollbacks},
            {"branches", m.n_spec_branches},
            {"branches_per_draft", num(ratio((double)m.n_spec_branches, (double)m.n_drafts))},
            {"requests_speculating", m.n_spec_requests},
            {"tpot_spec_ms", dist_ms(m.tpot_spec_s)},
            {"tpot_plain_ms", dist_ms(m.tpot_plain_s)},
            {"gain", num(g.gain)},
            {"gain_ci95", std::isfinite(g.lo) ? nlohmann::json::array({g.lo, g.hi}) : nlohmann::json(nullptr)},
            {"gain_tpot_without_ms", num(g.tpot_without_s * 1e3)},
            {"gain_source", spec_gain_source_name(g.source)},
            {"gain_estimate", num(g.estimate)}};
}

nlohmann::json MetricsRegistry::row_json(const BucketMetrics& m) const {
    using nlohmann::json;
    json by_finish = json::object();
    for (int i = 0; i < n_finish_reasons; ++i)
        by_finish[finish_reason_name((FinishReason)i)] = m.n_by_finish[(size_t)i];
    json generations = json::object();
    for (const auto& [g, n] : m.n_by_config_generation) generations[std::to_string(g)] = n;

    json classes = json::array();
    for (const auto& [k, c] : m.length_classes) {
        classes.push_back({{"prompt_tokens_min", int64_t{1} << k},
                           {"prompt_tokens_max", (int64_t{1} << (k + 1)) - 1},
                           {"n_hit", c.n_hit},
                           {"n_miss", c.n_miss},
                           {"ttft_hit_mean_ms", num(ratio(c.ttft_hit_sum_s, (double)c.n_hit) * 1e3)},
                           {"ttft_miss_mean_ms", num(ratio(c.ttft_miss_sum_s, (double)c.n_miss) * 1e3)},
                           {"penalty_ms", num(c.penalty_s() * 1e3)}});
    }
    json tenants = json::object();
    for (const auto& [name, t] : m.tenants)
        tenants[name] = {{"requests", t.n_requests},
                         {"queries_tokens", t.n_queries},
                         {"hits_tokens", t.n_hits},
                         {"hit_rate", num(ratio((double)t.n_hits, (double)t.n_queries))}};

    double block_gib = cfg_.kv ? cfg_.kv->block_bytes() / k_gib : k_nan;
    const KvGauges& kv = m.kv;
    bool has_kv = kv.n_samples > 0;
    json evictions = json::object();
    for (const auto& [policy, n] : m.n_evictions_by_policy) evictions[policy] = n;

    json by_pool = json::object(), share = json::object();
    for (const auto& [pool, n] : m.n_by_pool) {
        by_pool[pool] = n;
        share[pool] = num(ratio((double)n, (double)m.n_requests));
    }
    json quality = json::object();
    for (const auto& [pool, q] : m.route_quality)
        quality[pool] = {{"shadowed", q.n_shadowed}, {"agreement", num(q.agreement())},
                         {"exact_match_rate", num(ratio((double)q.n_exact, (double)q.n_shadowed))}};

    return {
        {"requests",
         {{"total", m.n_requests},
          {"ok", m.n_ok()},
          {"by_finish_reason", by_finish},
          {"by_config_generation", generations}}},
        {"tokens",
         {{"prompt", m.n_prompt_tokens},
          {"cached_prompt", m.n_cached_tokens},
          {"output", m.n_output_tokens},
          {"recomputed", m.n_recomputed_tokens}}},
        {"ttft_ms", dist_ms(m.ttft_s, true)},
        {"tpot_ms", dist_ms(m.tpot_s, true)},
        {"itl_ms", dist_ms(m.itl_s)},
        {"e2e_ms", dist_ms(m.e2e_s, true)},
        {"queue_ms", dist_ms(m.queue_s)},
        {"throughput_tok_s", num(throughput_tok_s(m))},
        {"goodput_req_s", num(goodput_req_s(m))},
        {"slo", slo_json(m)},
        {"cost_total", m.cost_total},
        {"cost_per_request", num(m.cost_per_request())},
        {"prefix_cache",
         {{"queries_tokens", m.n_prompt_tokens},
          {"hits_tokens", m.n_cached_tokens},
          {"hit_rate", num(m.hit_rate())},
          {"saved_prefill_tokens", m.n_saved_tokens},
          {"miss_penalty_ms", num(m.miss_penalty_s() * 1e3)},
          {"miss_penalty_by_length_class", classes},
          {"cross_tenant_hits_tokens", m.n_cross_tenant_hits},
          {"public_hits_tokens", m.n_public_hits},
          {"tenants", tenants},
          {"tier_hits_tokens", {{"pool", m.n_cached_tokens - m.n_tier_host_tokens - m.n_tier_disk_tokens},
                                {"host", m.n_tier_host_tokens},
                                {"disk", m.n_tier_disk_tokens}}},
          {"promotions", m.n_promotions},
          {"promotion_ms_p50", num(m.promote_s.quantile(0.50) * 1e3)},
          {"promotion_ms_p99", num(m.promote_s.quantile(0.99) * 1e3)}}},
        {"kv",
         {{"gib_formula", num(cfg_.kv ? cfg_.kv->total_gib() : k_nan)},
          {"gib_in_use_peak", num(has_kv ? (kv.bytes_used_peak > 0 ? kv.bytes_used_peak / k_gib
                                                                    : (double)kv.n_blocks_used_peak * block_gib)
                                         : k_nan)},
          {"gib_in_use_mean", num(kv.bytes_used_peak > 0 ? kv.bytes_used_mean() / k_gib : kv.blocks_used_mean() * block_gib)},
          {"blocks_used_peak", has_kv ? json(kv.n_blocks_used_peak) : json(nullptr)},
          {"blocks_used_mean", num(kv.blocks_used_mean())},
          {"blocks_total", has_kv ? json(kv.last.n_blocks_total) : json(nullptr)},
          {"page_usage_peak_pct", num(has_kv ? kv.page_usage_peak * 100.0 : k_nan)},
          {"page_usage_mean_pct", num(kv.page_usage_mean() * 100.0)},
          {"fragmentation_pct", num(kv.fragmentation() * 100.0)},
          {"samples", kv.n_samples},
          {"evictions", m.n_evictions()},
          {"evictions_by_policy", evictions},
          {"preemptions", m.n_preemptions},
          {"recomputed_tokens", m.n_recomputed_tokens},
          {"branches_peak", has_kv ? json(kv.n_branches_peak) : json(nullptr)},
          {"branches_last", has_kv ? json(kv.last.n_branches) : json(nullptr)}}},
        {"routing",
         {{"requests_by_pool", by_pool},
          {"route_share", share},
          {"upgraded", m.n_upgraded},
          {"upgrade_rate", num(m.upgrade_rate())},
          {"fallback", m.n_fallback},
          {"fallback_rate", num(m.fallback_rate())},
          {"quality", num(m.quality())},
          {"quality_by_route", quality}}},
        {"speculation", spec_json(m)},
        {"structured", structured_json(m)},
        {"reuse", reuse_json(m)},
    };
}

// The row's structured-output figures: constrained requests, masked rows (speculation's verified
// rows included), forced rows (one token allowed: the grammar chose it), mask time per row.
nlohmann::json MetricsRegistry::structured_json(const BucketMetrics& m) {
    return {{"requests", m.n_constrained},
            {"masked_tokens", m.n_masked},
            {"forced_tokens", m.n_forced},
            {"forced_rate", num(ratio((double)m.n_forced, (double)m.n_masked))},
            {"mask_s", m.mask_s},
            {"mask_us_per_token_mean", num(ratio(m.mask_s, (double)m.n_masked) * 1e6)},
            {"mask_us_per_token_p50_of_requests", num(m.mask_per_row_s.quantile(0.50) * 1e6)},
            {"mask_us_per_token_p99_of_requests", num(m.mask_per_row_s.quantile(0.99) * 1e6)}};
}

// SLO attainment (docs/metrics.md): the share of the requests with a target that met it, per target
// and for both (goodput's numerator); null where no request had that target.
nlohmann::json MetricsRegistry::slo_json(const BucketMetrics& m) {
    auto share = [](int64_t met, int64_t asked) { return asked > 0 ? nlohmann::json((double)met / (double)asked) : nlohmann::json(nullptr); };
    return {{"ttft_attainment", share(m.n_slo_ttft_met, m.n_slo_ttft_asked)},
            {"tpot_attainment", share(m.n_slo_tpot_met, m.n_slo_tpot_asked)},
            {"attainment", share(m.n_met_slo, m.n_slo_requests)}};
}

nlohmann::json MetricsRegistry::to_json() const {
    nlohmann::json buckets = nlohmann::json::object();
    for (const std::string& name : bucket_names()) {
        nlohmann::json& row = buckets[name] = row_json(buckets_.find(name)->second);
        // The bucket's targets beside its attainment (0: no target on that figure).
        const auto slo = cfg_.slo.find(name);
        row["slo"]["ttft_ms"] = slo == cfg_.slo.end() ? 0.0 : slo->second.ttft_ms;
        row["slo"]["tpot_ms"] = slo == cfg_.slo.end() ? 0.0 : slo->second.tpot_ms;
    }
    nlohmann::json policies = nlohmann::json::array();
    for (const PolicyFigure& p : policies_)
        policies.push_back({{"bucket", p.bucket}, {"kind", p.kind}, {"plugin", p.plugin}, {"decisions", p.n_calls},
                            {"invalid_decisions", p.n_invalid}, {"declined_decisions", p.n_declined},
                            {"timed_out_decisions", p.n_timed_out}, {"host_crashes", p.n_crashed},
                            {"host_restarts", p.n_restarts}, {"unavailable_decisions", p.n_unavailable}});
    nlohmann::json config = {{"generation", generation_},
                             {"reloads_ok", n_reload_ok_},
                             {"reloads_failed", n_reload_failed_},
                             {"last_reload_error", last_reload_error_}};
    // KV admission per pool and tenant: {"pool": {"tenant": {admitted, queued, refused, ...}}}.
    nlohmann::json admission = nlohmann::json::object();
    for (const auto& [pool, tenants] : admission_) {
        nlohmann::json& pj = admission[pool] = nlohmann::json::object();
        for (const TenantAdmission& t : tenants)
            pj[t.tenant] = {{"admitted", t.n_admitted},
                            {"queued", t.n_queued},
                            {"refused", t.n_refused()},
                            {"refused_tenant_quota", t.n_refused_quota},
                            {"refused_pool_capacity", t.n_refused_capacity},
                            {"refused_queue_length", t.n_refused_queue},
                            {"blocks_reserved", t.n_blocks_reserved},
                            {"reservations", t.n_reservations},
                            {"waiting", t.n_waiting},
                            {"quota_blocks", t.quota_blocks >= 0 ? nlohmann::json(t.quota_blocks) : nlohmann::json()}};
    }
    const GrammarCacheStats gc = grammar_cache_stats();  // process-wide, like the cache
    const nlohmann::json grammar_cache = {{"compiles", gc.n_compiles},
                                          {"hits", gc.n_hits},
                                          {"compile_ms", gc.compile_s * 1e3},
                                          {"entries", gc.n_entries}};
    // KV over time: seconds from the first point, per pool blocks in use of total, evictions so far.
    nlohmann::json series = nlohmann::json::array();
    const double t0 = kv_series_.empty() ? 0.0 : kv_series_.front().t_s;
    for (const KvPoint& k : kv_series_)
        series.push_back({{"t_s", k.t_s - t0}, {"pool", k.pool}, {"blocks_used", k.n_blocks_used},
                          {"blocks_total", k.n_blocks_total}, {"evictions", k.evictions}});
    // KV tiers per pool: what each tier holds and did (docs/kv-tiers.md); the pool's own KV is "kv".
    nlohmann::json tiers = nlohmann::json::object();
    for (const PoolLoad& l : loads_) {
        if (!l.tiers) continue;
        const KvTierStats& t = *l.tiers;
        nlohmann::json& pj = tiers[l.pool] = nlohmann::json::object();
        for (KvTier k : {KvTier::HOST, KvTier::DISK}) {
            const KvTierCounters& c = t.tier[(int)k];
            pj[kv_tier_name(k)] = {{"blocks", c.n_blocks},     {"gib", (double)c.bytes / k_gib}, {"demotions", c.n_stores},
                                   {"evictions", c.n_removals}, {"lookups", c.n_lookups},       {"hits", c.n_hits}};
        }
        pj["disk_reads"] = t.n_disk_reads;
        pj["disk_writes"] = t.n_disk_writes;
        pj["disk_read_gib"] = (double)t.disk_read_bytes / k_gib;
        pj["disk_write_gib"] = (double)t.disk_write_bytes / k_gib;
        pj["dropped_files"] = t.n_dropped_files;
        pj["write_errors"] = t.n_write_errors;
    }
    // Documents' KV per pool (docs/reuse.md): priority blocks held, evicted, invalidated.
    nlohmann::json reuse_kv = nlohmann::json::object();
    for (const PoolLoad& l : loads_)
        reuse_kv[l.pool] = {{"priority_blocks", l.n_kv_priority_blocks},
                            {"priority_evictions", l.n_kv_priority_evictions},
                            {"invalidated_blocks", l.n_kv_reuse_invalidated}};
    return {{"window_s", window_s()}, {"all", row_json(all_)}, {"buckets", buckets}, {"config", config},
            {"policies", policies}, {"admission", admission}, {"grammar_cache", grammar_cache},
            {"kv_series", series}, {"kv_tiers", tiers}, {"reuse_kv", reuse_kv}};
}

std::string MetricsRegistry::to_table(bool wide) const {
    struct Column {
        const char* header;  // the statistic in its name: p50, p99, mean, %, per second
        int width;
        bool wide_only;
    };
    // The default's columns add up to 120 characters.
    static constexpr Column columns[] = {
        {"bucket", 12, false},      {"requests", 8, false},     {"ok", 5, false},          {"ttft_p50_ms", 11, false},
        {"ttft_p95_ms", 11, true},  {"ttft_p99_ms", 11, false}, {"tpot_mean_ms", 12, false}, {"e2e_p99_ms", 10, false},
        {"tok/s", 7, false},        {"hit_%", 6, false},        {"saved_tok", 10, true},   {"kv_peak_GiB", 12, true},
        {"page_mean_%", 12, true},  {"frag_%", 7, true},        {"evict", 7, true},        {"preempt", 8, true},
        {"cost/req", 11, true},     {"upgr_%", 7, true},        {"fallb_%", 8, true},      {"route_q", 8, true},
        {"slo_ttft%", 9, false},    {"slo_tpot%", 9, false},    {"goodput/s", 9, false},
    };
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t i = 0; i < cells.size(); ++i) {
            if (columns[i].wide_only && !wide) continue;
            char buf[128];
            if (i == 0)
                std::snprintf(buf, sizeof buf, "%-*s", columns[i].width, cells[i].c_str());
            else
                std::snprintf(buf, sizeof buf, " %*s", columns[i].width, cells[i].c_str());
            s += buf;
        }
        return s + "\n";
    };
    std::vector<std::string> header;
    for (const Column& c : columns) header.emplace_back(c.header);
    std::string out = line(header);

    double block_gib = cfg_.kv ? cfg_.kv->block_bytes() / k_gib : k_nan;
    auto share = [](int64_t met, int64_t asked) { return asked > 0 ? fmt(100.0 * (double)met / (double)asked, "%.1f") : std::string("-"); };
    auto row_cells = [&](const std::string& name, const BucketMetrics& m) {
        bool has_kv = m.kv.n_samples > 0;
        return std::vector<std::string>{
            name,
            std::to_string(m.n_requests),
            std::to_string(m.n_ok()),
            fmt(m.ttft_s.quantile(0.50) * 1e3, "%.1f"),
            fmt(m.ttft_s.quantile(0.95) * 1e3, "%.1f"),
            fmt(m.ttft_s.quantile(0.99) * 1e3, "%.1f"),
            fmt(m.tpot_s.mean() * 1e3, "%.2f"),
            fmt(m.e2e_s.quantile(0.99) * 1e3, "%.1f"),
            fmt(throughput_tok_s(m), "%.1f"),
            fmt(m.hit_rate() * 100.0, "%.1f"),
            std::to_string(m.n_saved_tokens),
            fmt(!has_kv ? k_nan
                : m.kv.bytes_used_peak > 0 ? m.kv.bytes_used_peak / k_gib
                                           : (double)m.kv.n_blocks_used_peak * block_gib,
                "%.4g"),
            fmt(m.kv.page_usage_mean() * 100.0, "%.1f"),
            fmt(m.kv.fragmentation() * 100.0, "%.1f"),
            std::to_string(m.n_evictions()),
            std::to_string(m.n_preemptions),
            fmt(m.cost_per_request(), "%.4g"),
            fmt(m.upgrade_rate() * 100.0, "%.1f"),
            fmt(m.fallback_rate() * 100.0, "%.1f"),
            fmt(m.quality(), "%.3f"),
            share(m.n_slo_ttft_met, m.n_slo_ttft_asked),
            share(m.n_slo_tpot_met, m.n_slo_tpot_asked),
            fmt(goodput_req_s(m), "%.2f"),
        };
    };
    for (const std::string& name : bucket_names()) out += line(row_cells(name, buckets_.find(name)->second));
    out += line(row_cells("all", all_));
    return out + spec_table(wide) + structured_table() + tiers_table() + reuse_table();
}

// Printed only when some pool has KV tiers: per pool and tier, what it holds and did; then per
// bucket the prompt tokens each tier gave back and the promotions' time.
std::string MetricsRegistry::tiers_table() const {
    bool any = false;
    for (const PoolLoad& l : loads_) any = any || l.tiers.has_value();
    if (!any) return {};
    std::string out = "\n";
    char buf[320];
    std::snprintf(buf, sizeof buf, "%-12s %-5s %9s %9s %9s %9s %9s %9s %8s %8s %8s\n", "kv_tiers", "tier", "blocks", "GiB",
                  "demoted", "evicted", "lookups", "hits", "reads", "writes", "dropped");
    out += buf;
    for (const PoolLoad& l : loads_) {
        if (!l.tiers) continue;
        for (KvTier k : {KvTier::HOST, KvTier::DISK}) {
            const KvTierCounters& c = l.tiers->tier[(int)k];
            const bool disk = k == KvTier::DISK;
            std::snprintf(buf, sizeof buf, "%-12s %-5s %9lld %9.4f %9lld %9lld %9lld %9lld %8s %8s %8s\n", l.pool.c_str(),
                          kv_tier_name(k), (long long)c.n_blocks, (double)c.bytes / k_gib, (long long)c.n_stores,
                          (long long)c.n_removals, (long long)c.n_lookups, (long long)c.n_hits,
                          disk ? std::to_string(l.tiers->n_disk_reads).c_str() : "-",
                          disk ? std::to_string(l.tiers->n_disk_writes).c_str() : "-",
                          disk ? std::to_string(l.tiers->n_dropped_files).c_str() : "-");
            out += buf;
        }
    }
    std::snprintf(buf, sizeof buf, "%-12s %10s %10s %10s %10s %12s %12s\n", "tier_hits", "pool_tok", "host_tok", "disk_tok",
                  "promotions", "promo_p50_ms", "promo_p99_ms");
    out += buf;
    auto row = [&](const std::string& name, const BucketMetrics& m) {
        std::snprintf(buf, sizeof buf, "%-12s %10lld %10lld %10lld %10lld %12s %12s\n", name.c_str(),
                      (long long)(m.n_cached_tokens - m.n_tier_host_tokens - m.n_tier_disk_tokens),
                      (long long)m.n_tier_host_tokens, (long long)m.n_tier_disk_tokens, (long long)m.n_promotions,
                      fmt(m.promote_s.quantile(0.50) * 1e3, "%.3f").c_str(), fmt(m.promote_s.quantile(0.99) * 1e3, "%.3f").c_str());
        out += buf;
    };
    for (const std::string& name : bucket_names()) row(name, buckets_.find(name)->second);
    row("all", all_);
    return out;
}

// Printed only when some request was constrained (response_format / grammar). mask_us: mean mask
// time per masked row; p99_req: the 99th percentile over requests of their mean.
std::string MetricsRegistry::structured_table() const {
    if (all_.n_constrained == 0) return {};
    const GrammarCacheStats gc = grammar_cache_stats();
    std::string out = "\n";
    char buf[256];
    std::snprintf(buf, sizeof buf, "%-12s %11s %8s %8s %8s %9s %9s\n", "structured", "constrained", "masked", "forced",
                  "forced%", "mask_us", "p99_req");
    out += buf;
    auto row = [&](const std::string& name, const BucketMetrics& m) {
        std::snprintf(buf, sizeof buf, "%-12s %11lld %8lld %8lld %8s %9s %9s\n", name.c_str(), (long long)m.n_constrained,
                      (long long)m.n_masked, (long long)m.n_forced,
                      fmt(ratio((double)m.n_forced, (double)m.n_masked) * 100.0, "%.1f").c_str(),
                      fmt(ratio(m.mask_s, (double)m.n_masked) * 1e6, "%.1f").c_str(),
                      fmt(m.mask_per_row_s.quantile(0.99) * 1e6, "%.1f").c_str());
        out += buf;
    };
    for (const std::string& name : bucket_names()) {
        const BucketMetrics& m = buckets_.find(name)->second;
        if (m.n_constrained > 0) row(name, m);
    }
    row("all", all_);
    // json_object runs on one built-in grammar: nothing is compiled or looked up for it.
    if (gc.n_compiles + gc.n_hits == 0)
        return out + "grammars: the built-in json_object grammar only (nothing compiled or cached)\n";
    std::snprintf(buf, sizeof buf, "grammars compiled %lld (%.1f ms), cache hits %lld\n", (long long)gc.n_compiles,
                  gc.compile_s * 1e3, (long long)gc.n_hits);
    return out + buf;
}

// Printed only when some request drafted, so the main table stays readable without speculation.
// acc_by_pos: acceptance at the first draft positions; gain: TPOT without / with speculation, its
// "without" from a baseline run, the bucket's plain requests or an estimate (see speculation_gain).
std::string MetricsRegistry::spec_table(bool wide) const {
    if (all_.n_drafts == 0) return {};
    struct Column {
        const char* header;
        int width;
        bool wide_only;
    };
    static constexpr Column columns[] = {
        {"speculation", 12, false}, {"drafts", 8, false},      {"draft_tok", 10, false}, {"accepted", 9, false},
        {"rejected", 9, true},      {"mean_acc_len", 12, false}, {"acc_by_pos", 24, false}, {"draft_s", 9, true},
        {"verify_s", 9, true},      {"rollbacks", 9, true},    {"branches", 8, true},    {"gain", 6, false},
        {"gain_95%", 11, false},    {"gain_from", 14, false},
    };
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t i = 0; i < cells.size(); ++i) {
            if (columns[i].wide_only && !wide) continue;
            char buf[128];
            std::snprintf(buf, sizeof buf, i == 0 ? "%-*s" : " %*s", columns[i].width, cells[i].c_str());
            s += buf;
        }
        return s + "\n";
    };
    std::vector<std::string> header;
    for (const Column& c : columns) header.emplace_back(c.header);
    std::string out = "\n" + line(header);
    auto row_cells = [&](const std::string& name, const BucketMetrics& m) {
        std::string by_pos;
        for (int i = 0; i < std::min(m.n_spec_positions(), 5); i++) by_pos += (i ? " " : "") + fmt(m.acceptance_at(i), "%.2f");
        if (by_pos.empty()) by_pos = "-";
        const SpecGain g = speculation_gain(m, spec_baseline_of(m));
        return std::vector<std::string>{name,
                                        std::to_string(m.n_drafts),
                                        std::to_string(m.n_draft_tokens),
                                        std::to_string(m.n_accepted_tokens),
                                        std::to_string(m.n_rejected_tokens()),
                                        fmt(m.mean_accepted_length(), "%.2f"),
                                        by_pos,
                                        fmt(m.draft_s, "%.3f"),
                                        fmt(m.verify_s, "%.3f"),
                                        std::to_string(m.n_rollbacks),
                                        std::to_string(m.n_spec_branches),
                                        fmt(g.gain, "%.2f"),
                                        std::isfinite(g.lo) ? fmt(g.lo, "%.2f") + "-" + fmt(g.hi, "%.2f") : std::string("-"),
                                        g.source == SpecGainSource::NONE ? "-" : spec_gain_source_name(g.source)};
    };
    for (const std::string& name : bucket_names()) out += line(row_cells(name, buckets_.find(name)->second));
    out += line(row_cells("all", all_));
    return out;
}

// Our own exposition rather than prometheus-cpp's registry and serializer: every figure here is a
// snapshot computed from the registry's records (per-bucket log histograms re-bucketed on fixed
// bounds, counts by finish reason, admission and plugin figures), not a live instrument that code
// increments. prometheus-cpp would have to be a fresh registry filled from the snapshot on every
// scrape, and it would then only format ~40 families that this function formats in place, while
// becoming one more shared dependency (DT_NEEDED) of the installed libsteward.so (Debian 12 ships
// prometheus-cpp 1.0.1, libprometheus-cpp-core1.0). Conformance is what matters, and the tests
// check it with a strict, independent parser of the text format (tests/support/prometheus_text.h)
// on the exposition of a runtime that served requests.
std::string MetricsRegistry::to_prometheus() const {
    std::string out;
    std::vector<std::string> names = bucket_names();
    auto family = [&](const char* name, const char* type, const char* help) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    };
    auto label = [](const std::string& bucket) { return "bucket=\"" + prometheus_label_value(bucket) + "\""; };
    auto histogram = [&](const char* name, const char* help, Histogram BucketMetrics::*h,
                         std::span<const double> bounds) {
        family(name, "histogram", help);
        for (const std::string& b : names)
            out += prometheus_histogram(buckets_.find(b)->second.*h, name, label(b), bounds);
    };
    auto counter = [&](const char* name, const char* help, auto value_of) {
        family(name, "counter", help);
        for (const std::string& b : names)
            out += std::string(name) + "{" + label(b) + "} " +
                   prometheus_number((double)value_of(buckets_.find(b)->second)) + "\n";
    };

    // By bucket, pool and tenant (what a tenant's dashboard and bill need).
    auto tlabel = [](const TenantRouteKey& k) {
        return "bucket=\"" + prometheus_label_value(std::get<0>(k)) + "\",pool=\"" + prometheus_label_value(std::get<1>(k)) +
               "\",tenant=\"" + prometheus_label_value(std::get<2>(k)) + "\"";
    };
    family("steward_tenant_requests_total", "counter", "Requests finished, by bucket, pool, tenant and finish reason.");
    for (const auto& [k, t] : tenant_rows_)
        for (size_t f = 0; f < t.n_by_finish.size(); f++)
            if (t.n_by_finish[f] > 0)
                out += "steward_tenant_requests_total{" + tlabel(k) + ",finished_reason=\"" +
                       finish_reason_name((FinishReason)f) + "\"} " + std::to_string(t.n_by_finish[f]) + "\n";
    auto tcounter = [&](const char* name, const char* help, auto value_of) {
        family(name, "counter", help);
        for (const auto& [k, t] : tenant_rows_)
            out += std::string(name) + "{" + tlabel(k) + "} " + prometheus_number((double)value_of(t)) + "\n";
    };
    tcounter("steward_tenant_prompt_tokens_total", "Prompt tokens, by bucket, pool and tenant.",
             [](const TenantRouteRow& t) { return t.n_prompt_tokens; });
    tcounter("steward_tenant_cached_prompt_tokens_total", "Prompt tokens found in the prefix cache, by bucket, pool and tenant.",
             [](const TenantRouteRow& t) { return t.n_cached_tokens; });
    tcounter("steward_tenant_generation_tokens_total", "Output tokens, by bucket, pool and tenant.",
             [](const TenantRouteRow& t) { return t.n_output_tokens; });
    tcounter("steward_tenant_request_cost_total", "Cost from per-pool prices (currency units), by bucket, pool and tenant.",
             [](const TenantRouteRow& t) { return t.cost; });
    family("steward_tenant_time_to_first_token_seconds", "histogram", "Arrival to first output token, seconds, by bucket, pool and tenant.");
    for (const auto& [k, t] : tenant_rows_)
        out += prometheus_histogram(t.ttft_s, "steward_tenant_time_to_first_token_seconds", tlabel(k), k_ttft_bounds);
    family("steward_tenant_e2e_request_latency_seconds", "histogram", "Arrival to finish, seconds, by bucket, pool and tenant.");
    for (const auto& [k, t] : tenant_rows_)
        out += prometheus_histogram(t.e2e_s, "steward_tenant_e2e_request_latency_seconds", tlabel(k), k_e2e_bounds);

    histogram("steward_time_to_first_token_seconds", "Arrival to first output token, seconds.", &BucketMetrics::ttft_s,
              k_ttft_bounds);
    histogram("steward_inter_token_latency_seconds", "Gap between consecutive output tokens, seconds.",
              &BucketMetrics::itl_s, k_itl_bounds);
    histogram("steward_request_time_per_output_token_seconds", "Per-request mean time per output token, seconds.",
              &BucketMetrics::tpot_s, k_itl_bounds);
    histogram("steward_e2e_request_latency_seconds", "Arrival to finish, seconds.", &BucketMetrics::e2e_s,
              k_e2e_bounds);
    histogram("steward_request_queue_time_seconds", "Arrival to first scheduled, seconds.", &BucketMetrics::queue_s,
              k_e2e_bounds);

    family("steward_request_success_total", "counter", "Requests finished with stop or length.");
    for (const std::string& b : names)
        for (FinishReason f : {FinishReason::STOP, FinishReason::LENGTH})
            out += "steward_request_success_total{" + label(b) + ",finished_reason=\"" + finish_reason_name(f) +
                   "\"} " + std::to_string(buckets_.find(b)->second.n_by_finish[(size_t)f]) + "\n";
    family("steward_request_failure_total", "counter", "Requests cancelled, timed out, failed or rejected.");
    for (const std::string& b : names)
        for (FinishReason f :
             {FinishReason::CANCELLED, FinishReason::TIMEOUT, FinishReason::ERROR, FinishReason::OVERLOADED})
            out += "steward_request_failure_total{" + label(b) + ",finished_reason=\"" + finish_reason_name(f) +
                   "\"} " + std::to_string(buckets_.find(b)->second.n_by_finish[(size_t)f]) + "\n";

    counter("steward_prompt_tokens_total", "Prompt tokens.", [](const BucketMetrics& m) { return m.n_prompt_tokens; });
    counter("steward_generation_tokens_total", "Output tokens.",
            [](const BucketMetrics& m) { return m.n_output_tokens; });
    counter("steward_prefix_cache_query_tokens_total", "Prompt tokens looked up in the prefix cache.",
            [](const BucketMetrics& m) { return m.n_prompt_tokens; });
    counter("steward_prefix_cache_hit_tokens_total", "Prompt tokens found in cached full blocks.",
            [](const BucketMetrics& m) { return m.n_cached_tokens; });
    counter("steward_prefix_cache_saved_tokens_total", "Prompt tokens not computed thanks to the cache.",
            [](const BucketMetrics& m) { return m.n_saved_tokens; });
    counter("steward_prefix_cache_cross_tenant_hit_tokens_total",
            "Hit tokens on another tenant's blocks outside declared-public prefixes (must be 0).",
            [](const BucketMetrics& m) { return m.n_cross_tenant_hits; });
    counter("steward_prefix_cache_public_hit_tokens_total", "Hit tokens on another tenant's declared-public blocks.",
            [](const BucketMetrics& m) { return m.n_public_hits; });
    counter("steward_kv_tier_host_hit_tokens_total", "Cached prompt tokens promoted from the host-memory KV tier.",
            [](const BucketMetrics& m) { return m.n_tier_host_tokens; });
    counter("steward_kv_tier_disk_hit_tokens_total", "Cached prompt tokens promoted from the disk KV tier.",
            [](const BucketMetrics& m) { return m.n_tier_disk_tokens; });
    counter("steward_reuse_document_hits_total", "Document references served (docs/reuse.md).",
            [](const BucketMetrics& m) { return m.reuse.document_hits; });
    counter("steward_reuse_document_saved_prefill_tokens_total", "Prompt tokens of referenced documents found cached.",
            [](const BucketMetrics& m) { return m.reuse.document_saved_prefill_tokens; });
    counter("steward_reuse_document_refused_permission_total", "Document references refused: the caller's labels do not cover the acl.",
            [](const BucketMetrics& m) { return m.reuse.document_refused_permission; });
    counter("steward_reuse_document_expired_total", "Document references to an expired document.",
            [](const BucketMetrics& m) { return m.reuse.document_expired; });
    counter("steward_reuse_tool_hits_total", "Tool calls answered from the tool-result cache.",
            [](const BucketMetrics& m) { return m.reuse.tool_hits; });
    counter("steward_reuse_tool_round_trips_saved_total", "Tool calls resolved in the same request.",
            [](const BucketMetrics& m) { return m.reuse.tool_round_trips_saved; });
    counter("steward_reuse_tool_resolved_tokens_saved_total", "Prompt tokens the resolved continuations found cached.",
            [](const BucketMetrics& m) { return m.reuse.tool_resolved_tokens_saved; });
    counter("steward_reuse_tool_stale_refused_total", "Cached tool results too old to serve.",
            [](const BucketMetrics& m) { return m.reuse.tool_stale_refused; });
    family("steward_reuse_tool_age_seconds", "histogram", "Age of the cached tool results used, seconds.");
    for (const std::string& b : names)
        out += prometheus_histogram(buckets_.find(b)->second.reuse.tool_age_s, "steward_reuse_tool_age_seconds", label(b),
                                    k_e2e_bounds);
    histogram("steward_kv_promotion_seconds", "Wall time of a request's promotion of its prompt blocks from the KV tiers, seconds.",
              &BucketMetrics::promote_s, k_itl_bounds);
    counter("steward_preemptions_total", "Preemptions for lack of KV blocks.",
            [](const BucketMetrics& m) { return m.n_preemptions; });
    counter("steward_recomputed_tokens_total", "Tokens computed again after preemption.",
            [](const BucketMetrics& m) { return m.n_recomputed_tokens; });
    counter("steward_request_cost_total", "Cost from per-pool prices, currency units.",
            [](const BucketMetrics& m) { return m.cost_total; });
    counter("steward_route_upgrades_total", "Requests upgraded from a cheaper pool.",
            [](const BucketMetrics& m) { return m.n_upgraded; });
    counter("steward_route_fallbacks_total", "Requests served by a fallback path.",
            [](const BucketMetrics& m) { return m.n_fallback; });
    family("steward_route_requests_total", "counter", "Requests finished per pool.");
    for (const std::string& b : names)
        for (const auto& [pool, n] : buckets_.find(b)->second.n_by_pool)
            out += "steward_route_requests_total{" + label(b) + ",pool=\"" + prometheus_label_value(pool) + "\"} " +
                   std::to_string(n) + "\n";
    family("steward_route_shadowed_requests_total", "counter", "Requests also run on the strongest pool, per route.");
    for (const std::string& b : names)
        for (const auto& [pool, q] : buckets_.find(b)->second.route_quality)
            out += "steward_route_shadowed_requests_total{" + label(b) + ",pool=\"" + prometheus_label_value(pool) + "\"} " +
                   std::to_string(q.n_shadowed) + "\n";
    family("steward_route_quality_agreement_ratio", "gauge", "Agreement with the strongest pool on shadowed requests (0-1).");
    for (const std::string& b : names)
        for (const auto& [pool, q] : buckets_.find(b)->second.route_quality)
            out += "steward_route_quality_agreement_ratio{" + label(b) + ",pool=\"" + prometheus_label_value(pool) + "\"} " +
                   prometheus_number(q.agreement()) + "\n";
    family("steward_config_generation", "gauge", "The live config generation.");
    out += "steward_config_generation " + std::to_string(generation_) + "\n";
    family("steward_config_reloads_total", "counter", "Config reloads by result.");
    out += "steward_config_reloads_total{result=\"ok\"} " + std::to_string(n_reload_ok_) + "\n";
    out += "steward_config_reloads_total{result=\"error\"} " + std::to_string(n_reload_failed_) + "\n";
    auto plabel = [](const PolicyFigure& p) {
        return "bucket=\"" + prometheus_label_value(p.bucket) + "\",kind=\"" + prometheus_label_value(p.kind) +
               "\",plugin=\"" + prometheus_label_value(p.plugin) + "\"";
    };
    auto plugin_counter = [&](const char* name, const char* help, int64_t PolicyFigure::*field) {
        family(name, "counter", help);
        for (const PolicyFigure& p : policies_) out += std::string(name) + "{" + plabel(p) + "} " + std::to_string(p.*field) + "\n";
    };
    plugin_counter("steward_plugin_decisions_total", "Decisions asked of policy plugins.", &PolicyFigure::n_calls);
    plugin_counter("steward_plugin_invalid_decisions_total", "Plugin errors and rejected decisions (replaced by the safe default).",
                   &PolicyFigure::n_invalid);
    plugin_counter("steward_plugin_declined_decisions_total",
                   "Eviction plugins' 'no victim' answers (the engine preempts or waits instead of evicting).",
                   &PolicyFigure::n_declined);
    plugin_counter("steward_plugin_timed_out_decisions_total",
                   "Plugin decisions answered by the safe default because the plugin overran its time budget "
                   "([plugins] decision_budget_ms / step_decision_budget_ms) or was still running an overrun call.",
                   &PolicyFigure::n_timed_out);
    plugin_counter("steward_plugin_crashes_total",
                   "Plugin host processes (isolation = \"process\") that ended: crashed, exited, answered garbage, or "
                   "were killed after overrunning a decision budget.",
                   &PolicyFigure::n_crashed);
    plugin_counter("steward_plugin_restarts_total", "Plugin host processes restarted after a crash (with backoff).",
                   &PolicyFigure::n_restarts);
    plugin_counter("steward_plugin_unavailable_decisions_total",
                   "Plugin decisions answered by the safe default because the plugin's host process had died (the call "
                   "that found it dead, and every call until its restart).",
                   &PolicyFigure::n_unavailable);
    // Speculative decoding: vLLM's spec_decode_num_* counters (per position too), then ours.
    counter("steward_spec_decode_num_drafts_total", "Target verifications of a non-empty draft.",
            [](const BucketMetrics& m) { return m.n_drafts; });
    counter("steward_spec_decode_num_draft_tokens_total", "Draft tokens verified.",
            [](const BucketMetrics& m) { return m.n_draft_tokens; });
    counter("steward_spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
            [](const BucketMetrics& m) { return m.n_accepted_tokens; });
    auto per_pos = [&](const char* name, const char* help, std::array<int64_t, k_spec_positions> BucketMetrics::*a) {
        family(name, "counter", help);
        for (const std::string& b : names) {
            const BucketMetrics& m = buckets_.find(b)->second;
            for (int i = 0; i < m.n_spec_positions(); i++)
                out += std::string(name) + "{" + label(b) + ",position=\"" + std::to_string(i) + "\"} " +
                       std::to_string((m.*a)[(size_t)i]) + "\n";
        }
    };
    per_pos("steward_spec_decode_num_accepted_tokens_per_pos_total", "Draft tokens accepted at each draft position.",
            &BucketMetrics::n_accepted_at);
    per_pos("steward_spec_decode_num_draft_tokens_per_pos_total", "Draft tokens verified at each draft position.",
            &BucketMetrics::n_draft_tokens_at);
    counter("steward_spec_decode_num_rejected_tokens_total", "Draft tokens not accepted.",
            [](const BucketMetrics& m) { return m.n_rejected_tokens(); });
    counter("steward_spec_decode_num_rollbacks_total", "Verifications that discarded the KV of rejected draft tokens.",
            [](const BucketMetrics& m) { return m.n_rollbacks; });
    counter("steward_structured_requests_total", "Requests constrained by a grammar or JSON schema (response_format, grammar).",
            [](const BucketMetrics& m) { return m.n_constrained; });
    counter("steward_structured_masked_tokens_total", "Rows of logits masked by a request's grammar (speculation's verified rows included).",
            [](const BucketMetrics& m) { return m.n_masked; });
    counter("steward_structured_forced_tokens_total", "Masked rows where the grammar allowed one token only.",
            [](const BucketMetrics& m) { return m.n_forced; });
    counter("steward_structured_mask_time_seconds_total", "Wall time computing grammar masks, seconds.",
            [](const BucketMetrics& m) { return m.mask_s; });
    counter("steward_spec_decode_num_branches_total",
            "Speculative branches verified: a token tree's root-to-leaf paths, sharing the sequence's KV in one forward (a chain is one).",
            [](const BucketMetrics& m) { return m.n_spec_branches; });
    counter("steward_spec_decode_draft_time_seconds_total", "Wall time in draft forwards, seconds.",
            [](const BucketMetrics& m) { return m.draft_s; });
    counter("steward_spec_decode_verify_time_seconds_total",
            "Wall time in the target forwards that verified drafts (per request), seconds.",
            [](const BucketMetrics& m) { return m.verify_s; });
    family("steward_spec_decode_mean_accepted_length", "gauge", "Tokens produced per verification: 1 + accepted / drafts.");
    for (const std::string& b : names)
        if (buckets_.find(b)->second.n_drafts > 0)
            out += "steward_spec_decode_mean_accepted_length{" + label(b) + "} " +
                   prometheus_number(buckets_.find(b)->second.mean_accepted_length()) + "\n";
    family("steward_spec_decode_gain", "gauge",
           "TPOT without speculation / TPOT with it, over requests that drafted; source: where 'without' comes from.");
    for (const std::string& b : names) {
        const SpecGain g = spec_gain(b);
        if (g.source != SpecGainSource::NONE)
            out += "steward_spec_decode_gain{" + label(b) + ",source=\"" + spec_gain_source_name(g.source) + "\"} " +
                   prometheus_number(g.gain) + "\n";
    }

    auto alabel = [](const std::string& pool, const TenantAdmission& t) {
        return "pool=\"" + prometheus_label_value(pool) + "\",tenant=\"" + prometheus_label_value(t.tenant) + "\"";
    };
    family("steward_kv_admission_requests_total", "counter", "KV admission answers per pool and tenant (refused: see the limit).");
    for (const auto& [pool, tenants] : admission_)
        for (const TenantAdmission& t : tenants) {
            out += "steward_kv_admission_requests_total{" + alabel(pool, t) + ",result=\"admitted\"} " + std::to_string(t.n_admitted) + "\n";
            out += "steward_kv_admission_requests_total{" + alabel(pool, t) + ",result=\"queued\"} " + std::to_string(t.n_queued) + "\n";
            out += "steward_kv_admission_requests_total{" + alabel(pool, t) + ",result=\"refused\"} " + std::to_string(t.n_refused()) + "\n";
        }
    family("steward_kv_admission_refused_requests_total", "counter", "Requests refused at KV admission, by the limit that refused them.");
    for (const auto& [pool, tenants] : admission_)
        for (const TenantAdmission& t : tenants)
            for (auto [limit, n] : {std::pair{AdmissionLimit::TENANT_QUOTA, t.n_refused_quota},
                                    std::pair{AdmissionLimit::POOL_CAPACITY, t.n_refused_capacity},
                                    std::pair{AdmissionLimit::QUEUE_LENGTH, t.n_refused_queue}})
                out += "steward_kv_admission_refused_requests_total{" + alabel(pool, t) + ",limit=\"" + admission_limit_name(limit) + "\"} " + std::to_string(n) + "\n";
    family("steward_kv_admission_reserved_blocks", "gauge", "KV blocks reserved by admitted, unfinished requests.");
    for (const auto& [pool, tenants] : admission_)
        for (const TenantAdmission& t : tenants)
            out += "steward_kv_admission_reserved_blocks{" + alabel(pool, t) + "} " + std::to_string(t.n_blocks_reserved) + "\n";
    family("steward_kv_admission_waiting_requests", "gauge", "Requests waiting for a KV reservation.");
    for (const auto& [pool, tenants] : admission_)
        for (const TenantAdmission& t : tenants)
            out += "steward_kv_admission_waiting_requests{" + alabel(pool, t) + "} " + std::to_string(t.n_waiting) + "\n";

    // The schedulers' load: per pool, and per pool and bucket (a remote pool's only as its total).
    auto poollabel = [](const std::string& pool) { return "pool=\"" + prometheus_label_value(pool) + "\""; };
    family("steward_requests_running", "gauge", "Sequences in the pool's running batch.");
    for (const PoolLoad& l : loads_)
        out += "steward_requests_running{" + poollabel(pool_key(l.pool)) + "} " + std::to_string(l.n_running) + "\n";
    family("steward_requests_waiting", "gauge",
           "Requests waiting on the pool: in its engine's queue (not yet scheduled, or preempted) or for a KV "
           "reservation.");
    for (const PoolLoad& l : loads_)
        out += "steward_requests_waiting{" + poollabel(pool_key(l.pool)) + "} " +
               std::to_string(l.n_waiting + admission_waiting(l.pool)) + "\n";
    family("steward_bucket_requests_running", "gauge", "Sequences in the pool's running batch, per bucket.");
    for (const PoolLoad& l : loads_)
        for (const PoolLoad::Bucket& b : l.by_bucket)
            out += "steward_bucket_requests_running{" + label(bucket_key(b.bucket)) + "," +
                   poollabel(pool_key(l.pool)) + "} " + std::to_string(b.n_running) + "\n";
    family("steward_bucket_requests_waiting", "gauge",
           "Sequences in the pool's engine queue (not yet scheduled, or preempted), per bucket.");
    for (const PoolLoad& l : loads_)
        for (const PoolLoad::Bucket& b : l.by_bucket)
            out += "steward_bucket_requests_waiting{" + label(bucket_key(b.bucket)) + "," +
                   poollabel(pool_key(l.pool)) + "} " + std::to_string(b.n_waiting) + "\n";

    // KV tiers (docs/kv-tiers.md): per pool and tier, then the disk's I/O.
    auto tierlabel = [&](const PoolLoad& l, KvTier k) { return poollabel(pool_key(l.pool)) + ",tier=\"" + kv_tier_name(k) + "\""; };
    auto tier_family = [&](const char* name, const char* type, const char* help, auto value_of) {
        bool any = false;
        for (const PoolLoad& l : loads_) any = any || l.tiers.has_value();
        if (!any) return;
        family(name, type, help);
        for (const PoolLoad& l : loads_)
            if (l.tiers)
                for (KvTier k : {KvTier::HOST, KvTier::DISK})
                    out += std::string(name) + "{" + tierlabel(l, k) + "} " +
                           prometheus_number((double)value_of(l.tiers->tier[(int)k])) + "\n";
    };
    tier_family("steward_kv_tier_blocks", "gauge", "KV blocks a tier below the pool holds.",
                [](const KvTierCounters& c) { return c.n_blocks; });
    tier_family("steward_kv_tier_bytes", "gauge", "Bytes of KV a tier below the pool holds.",
                [](const KvTierCounters& c) { return c.bytes; });
    tier_family("steward_kv_tier_demoted_blocks_total", "counter", "KV blocks stored into a tier (demoted from above).",
                [](const KvTierCounters& c) { return c.n_stores; });
    tier_family("steward_kv_tier_evicted_blocks_total", "counter", "KV blocks a tier evicted (to the tier below, or dropped).",
                [](const KvTierCounters& c) { return c.n_removals; });
    tier_family("steward_kv_tier_hits_total", "counter", "Promotions answered from a tier (blocks).",
                [](const KvTierCounters& c) { return c.n_hits; });
    {
        bool any = false;
        for (const PoolLoad& l : loads_) any = any || l.tiers.has_value();
        if (any) {
            auto disk_family = [&](const char* name, const char* help, auto value_of) {
                family(name, "counter", help);
                for (const PoolLoad& l : loads_)
                    if (l.tiers) out += std::string(name) + "{" + poollabel(pool_key(l.pool)) + "} " + prometheus_number((double)value_of(*l.tiers)) + "\n";
            };
            disk_family("steward_kv_disk_reads_total", "KV block files read (promotions from disk).",
                        [](const KvTierStats& t) { return t.n_disk_reads; });
            disk_family("steward_kv_disk_writes_total", "KV block files written.", [](const KvTierStats& t) { return t.n_disk_writes; });
            disk_family("steward_kv_disk_dropped_files_total",
                        "KV block files deleted unserved: a failed checksum or header, another model, layout or salt set.",
                        [](const KvTierStats& t) { return t.n_dropped_files; });
        }
    }

    if (!loads_.empty()) {
        auto reuse_family = [&](const char* name, const char* type, const char* help, auto value_of) {
            family(name, type, help);
            for (const PoolLoad& l : loads_)
                out += std::string(name) + "{" + poollabel(pool_key(l.pool)) + "} " + std::to_string(value_of(l)) + "\n";
        };
        reuse_family("steward_reuse_kv_priority_blocks", "gauge",
                     "Cached KV blocks with reuse priority: referenced documents and the prompt before them (docs/reuse.md).",
                     [](const PoolLoad& l) { return l.n_kv_priority_blocks; });
        reuse_family("steward_reuse_kv_priority_evictions_total", "counter",
                     "KV blocks with reuse priority evicted (the pool held nothing else to reclaim).",
                     [](const PoolLoad& l) { return l.n_kv_priority_evictions; });
        reuse_family("steward_reuse_kv_invalidated_blocks_total", "counter",
                     "KV blocks (pool and tiers) dropped because a document got a new version, expired or was deleted.",
                     [](const PoolLoad& l) { return l.n_kv_reuse_invalidated; });
    }

    family("steward_kv_cache_evicted_blocks_total", "counter",
           "Cached unreferenced KV blocks reclaimed, per pool and policy.");
    for (const auto& [key, n] : evictions_by_pool_)
        out += "steward_kv_cache_evicted_blocks_total{" + poollabel(key.first) + ",policy=\"" +
               prometheus_label_value(key.second) + "\"} " + std::to_string(n) + "\n";
    std::vector<std::pair<std::string, const KvGauges*>> kvs;  // the listed pools that sampled
    for (const std::string& p : gauge_pools())
        if (const KvGauges* g = pool_kv(p); g && g->n_samples > 0) kvs.emplace_back(p, g);
    if (!kvs.empty()) {
        auto kv_gauge = [&](const char* name, const char* help, auto value_of) {
            family(name, "gauge", help);
            for (const auto& [p, g] : kvs)
                out +=
                    std::string(name) + "{" + poollabel(p) + "} " + prometheus_number((double)value_of(g->last)) + "\n";
        };
        kv_gauge("steward_kv_cache_usage_ratio", "Fraction of the pool's KV blocks in use (0-1).",
                 [](const KvSample& k) {
                     return k.n_blocks_total > 0 ? (double)k.n_blocks_used / (double)k.n_blocks_total : 0.0;
                 });
        kv_gauge("steward_kv_cache_fragmentation_ratio", "Fraction of allocated token slots not holding a token (0-1).",
                 [](const KvSample& k) { return k.fragmentation; });
        kv_gauge("steward_kv_cache_used_blocks", "KV blocks referenced by running or pinned sequences.",
                 [](const KvSample& k) { return k.n_blocks_used; });
        kv_gauge("steward_kv_cache_capacity_blocks", "KV blocks in the pool.",
                 [](const KvSample& k) { return k.n_blocks_total; });
        kv_gauge("steward_kv_cache_branches", "Live forked sequences sharing blocks copy-on-write.",
                 [](const KvSample& k) { return k.n_branches; });
    }
    if (cfg_.vllm_names) out += vllm_prometheus();
    return out;
}

// vLLM's bounds, so that a dashboard's le-labelled panels (heatmaps) read the same buckets: TTFT as
// steward's (already vLLM's), inter-token latency and TPOT, and the request phases.
namespace {
constexpr double k_vllm_itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
constexpr double k_vllm_request_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}  // namespace

// Only what Steward measures, each under the meaning vLLM gives the name (docs/metrics.md's table);
// one series per pool: model_name is the pool (what a client names in "model"), engine is "0" (a
// pool is one engine). Gauges list the loaded pools (set_pool_loads, else those with KV samples);
// request figures the pools that finished or worked on a request.
std::string MetricsRegistry::vllm_prometheus() const {
    std::string out;
    auto family = [&](const char* name, const char* type, const char* help) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    };
    auto label = [](const std::string& pool) {
        return "engine=\"0\",model_name=\"" + prometheus_label_value(pool) + "\"";
    };
    std::vector<std::string> gauge_pools = this->gauge_pools();
    auto load_of = [&](const std::string& pool) -> const PoolLoad* {
        for (const PoolLoad& l : loads_)
            if (pool_key(l.pool) == pool) return &l;
        return nullptr;
    };
    auto gauge = [&](const char* name, const char* help, auto value_of) {
        family(name, "gauge", help);
        for (const std::string& p : gauge_pools)
            out += std::string(name) + "{" + label(p) + "} " + prometheus_number(value_of(p)) + "\n";
    };
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", [&](const std::string& p) {
        const PoolLoad* l = load_of(p);
        return l ? (double)l->n_running : 0.0;
    });
    // vLLM's waiting queue holds every accepted request not running, those short of KV blocks too:
    // Steward's engine queue and its KV admission queue together.
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", [&](const std::string& p) {
        const PoolLoad* l = load_of(p);
        return (double)((l ? l->n_waiting : 0) + admission_waiting(p));
    });
    auto usage = [&](const std::string& p) {
        const KvGauges* g = pool_kv(p);
        if (!g || g->n_samples == 0 || g->last.n_blocks_total <= 0) return 0.0;  // not stepped yet: nothing in use
        return (double)g->last.n_blocks_used / (double)g->last.n_blocks_total;
    };
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
    gauge("vllm:gpu_cache_usage_perc",
          "KV-cache usage. 1 means 100 percent usage (vLLM's older name, whatever the pool runs on).", usage);
    family("vllm:cache_config_info", "gauge", "Information of the pool's KV cache (block_size, num_gpu_blocks).");
    for (const std::string& p : gauge_pools)
        if (const PoolLoad* l = load_of(p); l && l->block_size > 0)
            out += "vllm:cache_config_info{block_size=\"" + std::to_string(l->block_size) + "\"," + label(p) +
                   ",num_gpu_blocks=\"" + std::to_string(l->n_blocks) + "\"} 1\n";

    auto counter = [&](const char* name, const char* help, auto value_of) {
        family(name, "counter", help);
        for (const auto& [p, m] : pools_)
            out += std::string(name) + "{" + label(p) + "} " + prometheus_number((double)value_of(m)) + "\n";
    };
    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
            [](const PoolRequestMetrics& m) { return m.m.n_prompt_tokens; });
    counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
            [](const PoolRequestMetrics& m) { return m.m.n_output_tokens; });
    counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            [](const PoolRequestMetrics& m) { return m.m.n_prompt_tokens; });
    counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            [](const PoolRequestMetrics& m) { return m.m.n_cached_tokens; });
    counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
            [](const PoolRequestMetrics& m) { return m.m.n_preemptions; });
    // vLLM's finish reasons: stop, length, abort (cancelled or timed out), error. A request refused
    // at admission (overloaded) never reached an engine, as in vLLM, where it is never scheduled.
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
    for (const auto& [p, m] : pools_) {
        const auto& f = m.m.n_by_finish;
        for (auto [reason, n] : {std::pair<const char*, int64_t>{"stop", f[(size_t)FinishReason::STOP]},
                                 {"length", f[(size_t)FinishReason::LENGTH]},
                                 {"abort", f[(size_t)FinishReason::CANCELLED] + f[(size_t)FinishReason::TIMEOUT]},
                                 {"error", f[(size_t)FinishReason::ERROR]}})
            out += "vllm:request_success_total{" + label(p) + ",finished_reason=\"" + reason + "\"} " +
                   std::to_string(n) + "\n";
    }
    counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
            [](const PoolRequestMetrics& m) { return m.m.n_drafts; });
    counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.",
            [](const PoolRequestMetrics& m) { return m.m.n_draft_tokens; });
    counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
            [](const PoolRequestMetrics& m) { return m.m.n_accepted_tokens; });
    family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft's positions.");
    for (const auto& [p, m] : pools_)
        for (int i = 0; i < m.m.n_spec_positions(); i++)
            out += "vllm:spec_decode_num_accepted_tokens_per_pos_total{" + label(p) + ",position=\"" +
                   std::to_string(i) + "\"} " + std::to_string(m.m.n_accepted_at[(size_t)i]) + "\n";

    auto histogram = [&](const char* name, const char* help, auto hist_of, std::span<const double> bounds) {
        family(name, "histogram", help);
        for (const auto& [p, m] : pools_) out += prometheus_histogram(hist_of(m), name, label(p), bounds);
    };
    histogram(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.m.ttft_s; }, k_ttft_bounds);
    histogram(
        "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.m.itl_s; }, k_vllm_itl_bounds);
    histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds (vLLM's older name of the inter-token latency).",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.m.itl_s; }, k_vllm_itl_bounds);
    histogram(
        "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.m.tpot_s; }, k_vllm_itl_bounds);
    histogram(
        "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.m.e2e_s; }, k_vllm_request_bounds);
    histogram(
        "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.m.queue_s; }, k_vllm_request_bounds);
    histogram(
        "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.inference_s; }, k_vllm_request_bounds);
    histogram(
        "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.prefill_s; }, k_vllm_request_bounds);
    histogram(
        "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
        [](const PoolRequestMetrics& m) -> const Histogram& { return m.decode_s; }, k_vllm_request_bounds);
    return out;
}

}  // namespace steward
