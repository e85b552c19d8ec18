// Tests for runtime/metrics/bucket_metrics: every figure on a hand-worked set of records (worked
// out in the comments), the table, and the Prometheus text parsed back line by line.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/bucket_metrics.h"

using namespace steward;

namespace {

// Prices per million tokens: small 1 / 0.1 cached / 2 output; large 10 / 1 / 20.
MetricsConfig test_config() {
    MetricsConfig cfg;
    cfg.prices["small"] = {1.0, 0.1, 2.0};
    cfg.prices["large"] = {10.0, 1.0, 20.0};
    // 2 (K,V) · 2 layers · 16 slots · 2 heads · 64 dims · 2 bytes = 16384 bytes a block.
    cfg.kv = KvShape{2, 1024, 16, 2, 64, 2.0};
    cfg.slo["short_qa"] = {200.0, 150.0};
    return cfg;
}

RequestRecord rec(std::string bucket, std::string tenant, std::string pool, double arrival,
                  std::optional<double> scheduled, std::optional<double> first, double finish, std::vector<double> itl,
                  int64_t n_prompt, int64_t n_cached, int64_t n_out, FinishReason f) {
    RequestRecord r;
    r.bucket = std::move(bucket);
    r.tenant = std::move(tenant);
    r.pool = std::move(pool);
    r.t_arrival_s = arrival;
    r.t_scheduled_s = scheduled;
    r.t_first_token_s = first;
    r.t_finish_s = finish;
    r.itl_s = std::move(itl);
    r.n_prompt_tokens = n_prompt;
    r.n_cached_prompt_tokens = n_cached;
    r.n_output_tokens = n_out;
    r.finish = f;
    return r;
}

// The hand-worked run:
// R1 short_qa a small: ttft 100 ms, gaps 100/100/200 ms (tpot 133.33), e2e 500, queue 10;
//    prompt 100 cached 64: cost (36·1 + 64·0.1 + 4·2)/1e6 = 50.4e-6. Meets the SLO.
// R2 short_qa b small: ttft 300, gaps 100/100 (tpot 100), e2e 500, queue 20; prompt 120 miss:
//    cost (120 + 3·2)/1e6 = 126e-6. Misses the TTFT target.
// R3 short_qa a large, upgraded from small (64 prompt tokens there): ttft 50, 1 token (no tpot),
//    e2e 50, queue 0; prompt 64 all cached: (64·1 + 1·20)/1e6 + 64·1/1e6 = 148e-6. Meets the SLO.
// R4 short_qa b small, OVERLOADED, fallback: no first token, not in e2e, costs 0.
// R5 long_doc c large: ttft 1000, gaps 500/500, e2e 2000, queue 100; prompt 700 cached 512 (64 of
//    them public), 16 recomputed, 1 preemption: cost (188·10 + 512·1 + 3·20)/1e6 = 2452e-6.
MetricsRegistry hand_worked() {
    MetricsRegistry m(test_config());
    m.record(rec("short_qa", "a", "small", 0.0, 0.01, 0.1, 0.5, {0.1, 0.1, 0.2}, 100, 64, 4, FinishReason::STOP));
    m.record(rec("short_qa", "b", "small", 1.0, 1.02, 1.3, 1.5, {0.1, 0.1}, 120, 0, 3, FinishReason::LENGTH));
    RequestRecord r3 = rec("short_qa", "a", "large", 2.0, 2.0, 2.05, 2.05, {}, 64, 64, 1, FinishReason::STOP);
    r3.prior_pools.push_back({"small", 64, 0, 0});
    m.record(r3);
    RequestRecord r4 =
        rec("short_qa", "b", "small", 3.0, std::nullopt, std::nullopt, 3.0, {}, 100, 0, 0, FinishReason::OVERLOADED);
    r4.fallback = true;
    m.record(r4);
    RequestRecord r5 = rec("long_doc", "c", "large", 0.5, 0.6, 1.5, 2.5, {0.5, 0.5}, 700, 512, 3, FinishReason::STOP);
    r5.n_cached_public = 64;
    r5.n_recomputed_tokens = 16;
    r5.n_preemptions = 1;
    r5.config_generation = 2;
    m.record(r5);
    // KV: used 10 for 1 s, 30 for 2 s, then 20: time-weighted mean (10 + 60) / 3 = 23.33 blocks;
    // fragmentation (0.1·10·1 + 0.2·30·2) / (10·1 + 30·2) = 13 / 70.
    m.record_kv({0.0, "", 10, 100, 0.1, 0});
    m.record_kv({1.0, "", 30, 100, 0.2, 2});
    m.record_kv({3.0, "", 20, 100, 0.05, 1});
    m.add_evictions(5, "lru");
    m.add_evictions(2, "lru", "short_qa");
    return m;
}

const double k_tol = Histogram::k_quantile_rel_error;

bool is_metric_name(const std::string& s) {
    if (s.empty() || std::isdigit((unsigned char)s[0])) return false;
    for (char c : s)
        if (!std::isalnum((unsigned char)c) && c != '_' && c != ':') return false;
    return true;
}

// One sample line: name{label="value",...} value, with \\, \" and \n escapes in label values.
bool parse_sample(const std::string& line, std::string& name, std::string& value) {
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    name = line.substr(0, i);
    if (!is_metric_name(name)) return false;
    if (i < line.size() && line[i] == '{') {
        ++i;
        for (bool first = true; i < line.size() && line[i] != '}'; first = false) {
            if (!first && line[i++] != ',') return false;
            size_t eq = line.find('=', i);
            if (eq == std::string::npos || !is_metric_name(line.substr(i, eq - i)) || line.find(':', i) < eq)
                return false;
            i = eq + 1;
            if (i >= line.size() || line[i++] != '"') return false;
            while (i < line.size() && line[i] != '"') {
                if (line[i] == '\\') {
                    if (i + 1 >= line.size() || std::string("\\\"n").find(line[i + 1]) == std::string::npos)
                        return false;
                    ++i;
                }
                ++i;
            }
            if (i++ >= line.size()) return false;
        }
        if (i++ >= line.size()) return false;  // the closing brace
    }
    if (i >= line.size() || line[i] != ' ') return false;
    value = line.substr(i + 1);
    if (value.empty() || value.find(' ') != std::string::npos) return false;
    if (value == "+Inf" || value == "-Inf" || value == "NaN") return true;
    size_t used = 0;
    try {
        std::stod(value, &used);
    } catch (...) {
        return false;
    }
    return used == value.size();
}

}  // namespace

TEST_CASE("bucket figures match the hand-worked records", "[metrics]") {
    MetricsRegistry m = hand_worked();
    REQUIRE(m.bucket_names() == std::vector<std::string>{"short_qa", "long_doc"});
    const BucketMetrics& qa = *m.bucket("short_qa");
    CHECK(qa.n_requests == 4);
    CHECK(qa.n_ok() == 3);
    CHECK(qa.n_by_finish[(size_t)FinishReason::OVERLOADED] == 1);

    CHECK(qa.ttft_s.count() == 3);  // R4 never produced a token
    CHECK(qa.ttft_s.quantile(0.5) == Approx(0.100).epsilon(k_tol));
    CHECK(qa.ttft_s.quantile(0.99) == Approx(0.300).epsilon(1e-12));  // the max, exact
    CHECK(qa.tpot_s.count() == 2);
    CHECK(qa.tpot_s.mean() == Approx((0.4 / 3 + 0.1) / 2));
    CHECK(qa.itl_s.count() == 5);
    CHECK(qa.itl_s.mean() == Approx(0.12));
    CHECK(qa.e2e_s.count() == 3);  // OVERLOADED left out
    CHECK(qa.e2e_s.max() == Approx(0.5));
    CHECK(qa.queue_s.count() == 3);
    CHECK(qa.queue_s.max() == Approx(0.02));

    CHECK(qa.n_prompt_tokens == 384);
    CHECK(qa.n_cached_tokens == 128);
    CHECK(qa.hit_rate() == Approx(128.0 / 384.0));
    CHECK(qa.n_saved_tokens == 128);
    // All three with a first token are in length class [64, 128): hits 100 and 50 ms, miss 300 ms.
    CHECK(qa.length_classes.size() == 1);
    CHECK(qa.length_classes.at(6).n_hit == 2);
    CHECK(qa.miss_penalty_s() == Approx(0.300 - 0.075));
    CHECK(qa.tenants.at("a").n_queries == 164);
    CHECK(qa.tenants.at("a").n_hits == 128);
    CHECK(qa.tenants.at("b").n_hits == 0);

    CHECK(qa.cost_total == Approx((50.4 + 126.0 + 148.0) * 1e-6));
    CHECK(qa.cost_per_request() == Approx(324.4e-6 / 4));
    CHECK(qa.upgrade_rate() == Approx(0.25));
    CHECK(qa.fallback_rate() == Approx(0.25));
    CHECK(qa.n_by_pool.at("small") == 3);
    CHECK(qa.n_by_pool.at("large") == 1);
    CHECK(qa.n_met_slo == 2);
    CHECK(qa.n_evictions() == 2);
    CHECK(std::isnan(qa.mean_accepted_length()));

    const BucketMetrics& doc = *m.bucket("long_doc");
    CHECK(doc.hit_rate() == Approx(512.0 / 700.0));
    CHECK(doc.n_saved_tokens == 496);
    CHECK(doc.n_public_hits == 64);
    CHECK(doc.n_preemptions == 1);
    CHECK(doc.cost_total == Approx(2452e-6));
    CHECK(std::isnan(doc.miss_penalty_s()));  // only a hit in its class

    // Window: first arrival 0 to last finish 3 s.
    CHECK(m.window_s() == Approx(3.0));
    CHECK(m.throughput_tok_s(qa) == Approx(8.0 / 3.0));
    CHECK(m.throughput_tok_s(m.all()) == Approx(11.0 / 3.0));
    CHECK(m.goodput_req_s(qa) == Approx(2.0 / 3.0));
    CHECK(std::isnan(m.goodput_req_s(doc)));

    const BucketMetrics& all = m.all();
    CHECK(all.n_requests == 5);
    CHECK(all.cost_total == Approx(2776.4e-6));
    CHECK(all.ttft_s.quantile(0.99) == Approx(1.0));
    CHECK(all.n_evictions() == 7);
    CHECK(all.kv.blocks_used_mean() == Approx(70.0 / 3.0));
    CHECK(all.kv.page_usage_mean() == Approx(0.70 / 3.0));
    CHECK(all.kv.page_usage_peak == Approx(0.30));
    CHECK(all.kv.n_blocks_used_peak == 30);
    CHECK(all.kv.fragmentation() == Approx(13.0 / 70.0));
    CHECK(all.kv.n_branches_peak == 2);
}

TEST_CASE("the JSON has every figure with units in the key names", "[metrics]") {
    MetricsRegistry m = hand_worked();
    nlohmann::json j = m.to_json();
    CHECK(j["window_s"] == Approx(3.0));
    const auto& qa = j["buckets"]["short_qa"];
    CHECK(qa["requests"]["total"] == 4);
    CHECK(qa["requests"]["ok"] == 3);
    CHECK(qa["requests"]["by_finish_reason"]["overloaded"] == 1);
    CHECK(qa["ttft_ms"]["p50"].get<double>() == Approx(100.0).epsilon(k_tol));
    CHECK(qa["ttft_ms"]["p95"].get<double>() == Approx(300.0));
    CHECK(qa["ttft_ms"]["p99"].get<double>() == Approx(300.0));
    CHECK(qa["tpot_ms"]["mean"].get<double>() == Approx(350.0 / 3.0));
    CHECK(qa["itl_ms"]["count"] == 5);
    CHECK(qa["e2e_ms"]["p99"].get<double>() == Approx(500.0));
    CHECK(qa["queue_ms"]["count"] == 3);
    CHECK(qa["throughput_tok_s"].get<double>() == Approx(8.0 / 3.0));
    CHECK(qa["goodput_req_s"].get<double>() == Approx(2.0 / 3.0));
    CHECK(qa["cost_per_request"].get<double>() == Approx(81.1e-6));
    CHECK(qa["prefix_cache"]["queries_tokens"] == 384);
    CHECK(qa["prefix_cache"]["hits_tokens"] == 128);
    CHECK(qa["prefix_cache"]["hit_rate"].get<double>() == Approx(1.0 / 3.0));
    CHECK(qa["prefix_cache"]["saved_prefill_tokens"] == 128);
    CHECK(qa["prefix_cache"]["miss_penalty_ms"].get<double>() == Approx(225.0));
    CHECK(qa["prefix_cache"]["miss_penalty_by_length_class"][0]["prompt_tokens_min"] == 64);
    CHECK(qa["prefix_cache"]["miss_penalty_by_length_class"][0]["prompt_tokens_max"] == 127);
    CHECK(qa["prefix_cache"]["cross_tenant_hits_tokens"] == 0);
    CHECK(qa["prefix_cache"]["tenants"]["a"]["hit_rate"].get<double>() == Approx(128.0 / 164.0));
    CHECK(qa["routing"]["route_share"]["small"].get<double>() == Approx(0.75));
    CHECK(qa["routing"]["upgrade_rate"].get<double>() == Approx(0.25));
    CHECK(qa["routing"]["fallback_rate"].get<double>() == Approx(0.25));
    CHECK(qa["speculation"]["drafts"] == 0);
    CHECK(qa["speculation"]["mean_accepted_length"].is_null());
    CHECK(qa["kv"]["evictions"] == 2);
    CHECK(qa["kv"]["gib_in_use_peak"].is_null());  // no bucket-tagged KV samples
    CHECK(qa["kv"]["gib_formula"].get<double>() == Approx(1.0 / 64.0));

    const auto& doc = j["buckets"]["long_doc"];
    CHECK(doc["goodput_req_s"].is_null());
    CHECK(doc["prefix_cache"]["public_hits_tokens"] == 64);
    CHECK(doc["kv"]["preemptions"] == 1);
    CHECK(doc["kv"]["recomputed_tokens"] == 16);
    CHECK(doc["requests"]["by_config_generation"]["2"] == 1);

    const auto& all = j["all"];
    CHECK(all["kv"]["gib_in_use_peak"].get<double>() == Approx(30.0 * 16384 / (1024.0 * 1024 * 1024)));
    CHECK(all["kv"]["page_usage_mean_pct"].get<double>() == Approx(70.0 / 3.0));
    CHECK(all["kv"]["page_usage_peak_pct"].get<double>() == Approx(30.0));
    CHECK(all["kv"]["fragmentation_pct"].get<double>() == Approx(1300.0 / 70.0));
    CHECK(all["kv"]["evictions_by_policy"]["lru"] == 7);
    CHECK(all["kv"]["blocks_total"] == 100);
    // The whole thing serialises (NaN never reaches the JSON: undefined figures are null).
    CHECK(j.dump().find("NaN") == std::string::npos);
}

TEST_CASE("the JSON's latency CDF points climb to the count at the max", "[metrics]") {
    nlohmann::json j = hand_worked().to_json();
    // short_qa's TTFTs: 50, 100, 300 ms; its queue time carries no CDF (only TTFT, TPOT, e2e do).
    const auto& cdf = j["buckets"]["short_qa"]["ttft_ms"]["cdf"];
    REQUIRE(cdf.size() == 3);
    CHECK(cdf[0][1] == 1);
    CHECK(cdf[1][1] == 2);
    CHECK(cdf[2][0].get<double>() == Approx(300.0));
    CHECK(cdf[2][1] == 3);
    // Each point is its bucket's upper edge: at or above the sample, within one bucket width.
    for (auto [i, x] : {std::pair{0, 50.0}, std::pair{1, 100.0}}) {
        CHECK(cdf[i][0].get<double>() >= x * (1 - 1e-9));
        CHECK(cdf[i][0].get<double>() <= x * (1 + Histogram::bucket_width()) * (1 + 1e-9));
    }
    CHECK_FALSE(j["buckets"]["short_qa"]["queue_ms"].contains("cdf"));
    CHECK(j["buckets"]["short_qa"]["e2e_ms"]["cdf"].back()[1] == j["buckets"]["short_qa"]["e2e_ms"]["count"]);
}

TEST_CASE("the table has one fixed-width row per bucket and an all row", "[metrics]") {
    MetricsRegistry m = hand_worked();
    std::string t = m.to_table(true);
    std::istringstream in(t);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    REQUIRE(lines.size() == 4);
    CHECK(lines[0].rfind("bucket", 0) == 0);
    CHECK(lines[1].rfind("short_qa", 0) == 0);
    CHECK(lines[2].rfind("long_doc", 0) == 0);
    CHECK(lines[3].rfind("all", 0) == 0);
    for (const std::string& l : lines) CHECK(l.size() == lines[0].size());
    CHECK(lines[1].find(" 33.3 ") != std::string::npos);   // hit rate %
    CHECK(lines[1].find(" 300.0 ") != std::string::npos);  // ttft p99 ms
    CHECK(lines[3].find(" 23.3 ") != std::string::npos);   // mean page use %
    CHECK(lines[3].find(" 18.6 ") != std::string::npos);   // fragmentation %
}

TEST_CASE("the Prometheus text parses line by line with vLLM-aligned names", "[metrics]") {
    MetricsRegistry m = hand_worked();
    std::string text = m.to_prometheus();
    std::map<std::string, std::string> types;
    std::map<std::string, double> values;  // "name{labels}" -> value
    std::istringstream in(text);
    int n_samples = 0;
    for (std::string line; std::getline(in, line);) {
        INFO(line);
        if (line.rfind("#", 0) == 0) {
            std::istringstream c(line);
            std::string hash, kind, name, rest;
            c >> hash >> kind >> name;
            std::getline(c, rest);
            REQUIRE((kind == "HELP" || kind == "TYPE"));
            REQUIRE(is_metric_name(name));
            REQUIRE(rest.size() > 1);
            if (kind == "TYPE") types[name] = rest.substr(1);
            continue;
        }
        std::string name, value;
        REQUIRE(parse_sample(line, name, value));
        std::string family = name;
        for (const char* suffix : {"_bucket", "_sum", "_count"})
            if (!types.count(family) && family.size() > strlen(suffix) &&
                family.compare(family.size() - strlen(suffix), strlen(suffix), suffix) == 0)
                family = family.substr(0, family.size() - strlen(suffix));
        CHECK(types.count(family) == 1);  // its # TYPE came first
        double x = value == "+Inf" ? INFINITY : value == "NaN" ? NAN : std::stod(value);
        values[line.substr(0, line.rfind(' '))] = x;
        ++n_samples;
    }
    CHECK(n_samples > 50);
    // The line parser itself refuses what is not a sample.
    std::string n, v;
    CHECK(parse_sample("x{a=\"b\\\"c\",d=\"\"} 1.5", n, v));
    CHECK(!parse_sample("x{a=\"b} 1", n, v));
    CHECK(!parse_sample("x{a=b} 1", n, v));
    CHECK(!parse_sample("x 1 2", n, v));
    CHECK(!parse_sample("x one", n, v));
    CHECK(!parse_sample("1x 1", n, v));
    CHECK(types["steward_time_to_first_token_seconds"] == "histogram");
    CHECK(types["steward_prefix_cache_query_tokens_total"] == "counter");
    CHECK(types["steward_kv_cache_usage_ratio"] == "gauge");
    CHECK(values["steward_prefix_cache_query_tokens_total{bucket=\"short_qa\"}"] == 384);
    CHECK(values["steward_prefix_cache_hit_tokens_total{bucket=\"short_qa\"}"] == 128);
    CHECK(values["steward_prefix_cache_hit_tokens_total{bucket=\"long_doc\"}"] == 512);
    CHECK(values["steward_kv_cache_usage_ratio{pool=\"unknown\"}"] == Approx(0.2));
    CHECK(values["steward_preemptions_total{bucket=\"long_doc\"}"] == 1);
    CHECK(values["steward_request_success_total{bucket=\"short_qa\",finished_reason=\"length\"}"] == 1);
    CHECK(values["steward_request_failure_total{bucket=\"short_qa\",finished_reason=\"overloaded\"}"] == 1);
    CHECK(values["steward_route_requests_total{bucket=\"short_qa\",pool=\"small\"}"] == 3);
    CHECK(values["steward_kv_cache_evicted_blocks_total{pool=\"unknown\",policy=\"lru\"}"] == 7);
    CHECK(values["steward_spec_decode_num_drafts_total{bucket=\"short_qa\"}"] == 0);
    CHECK(values["steward_time_to_first_token_seconds_count{bucket=\"short_qa\"}"] == 3);
    CHECK(values["steward_time_to_first_token_seconds_sum{bucket=\"short_qa\"}"] == Approx(0.45));
    CHECK(values["steward_time_to_first_token_seconds_bucket{bucket=\"short_qa\",le=\"0.08\"}"] == 1);
    CHECK(values["steward_time_to_first_token_seconds_bucket{bucket=\"short_qa\",le=\"0.25\"}"] == 2);
    CHECK(values["steward_time_to_first_token_seconds_bucket{bucket=\"short_qa\",le=\"+Inf\"}"] == 3);
}

TEST_CASE("records without a bucket, prices or KV shape still give well-formed output", "[metrics]") {
    MetricsRegistry m;
    RequestRecord r;
    r.tenant = "t\"x";  // escaped in labels, fine in JSON
    r.pool = "p";
    r.t_arrival_s = 5.0;
    r.t_first_token_s = 5.2;
    r.t_finish_s = 6.0;
    r.n_prompt_tokens = 10;
    r.n_output_tokens = 5;  // no gaps: tpot from (finish - first) / 4
    m.record(r);
    REQUIRE(m.bucket("unclassified") != nullptr);
    CHECK(m.bucket("unclassified")->tpot_s.mean() == Approx(0.2));
    CHECK(m.bucket("unclassified")->cost_total == 0.0);
    nlohmann::json j = m.to_json();
    CHECK(j["all"]["kv"]["gib_formula"].is_null());
    CHECK(j["all"]["prefix_cache"]["hit_rate"].get<double>() == 0.0);
    CHECK(j["all"]["prefix_cache"]["miss_penalty_ms"].is_null());
    m.set_window(0.0, 10.0);
    CHECK(m.throughput_tok_s(m.all()) == Approx(0.5));
    CHECK(m.to_prometheus().find("steward_kv_cache_usage_ratio") == std::string::npos);
    CHECK(m.to_table().find("unclassified") != std::string::npos);

    MetricsRegistry empty;
    CHECK(empty.window_s() == 0.0);
    CHECK(empty.to_json()["all"]["requests"]["total"] == 0);
    CHECK(empty.to_table().find("all") != std::string::npos);
}

TEST_CASE("finish reasons and length classes name and bound what they should", "[metrics]") {
    for (int i = 0; i < n_finish_reasons; ++i)
        CHECK(parse_finish_reason(finish_reason_name((FinishReason)i)) == (FinishReason)i);
    CHECK(!parse_finish_reason("done"));
    CHECK(finish_reason_ok(FinishReason::LENGTH));
    CHECK(!finish_reason_ok(FinishReason::TIMEOUT));
    CHECK(prompt_length_class(0) == -1);
    CHECK(prompt_length_class(1) == 0);
    CHECK(prompt_length_class(63) == 5);
    CHECK(prompt_length_class(64) == 6);
    CHECK(prompt_length_class(127) == 6);
    CHECK(prompt_length_class(128) == 7);
}

namespace {

// A request that speculated: per draft position the tokens verified and accepted there.
RequestRecord spec_rec(std::string bucket, int64_t n_out, double gap, int64_t n_drafts, std::vector<int64_t> proposed,
                       std::vector<int64_t> accepted, int64_t n_rollbacks, double draft_s, double verify_s) {
    RequestRecord r;
    r.bucket = std::move(bucket);
    r.pool = "large";
    r.t_arrival_s = 0.0;
    r.t_first_token_s = 0.1;
    r.itl_s.assign((size_t)(n_out - 1), gap);
    r.t_finish_s = 0.1 + gap * (double)(n_out - 1);
    r.n_prompt_tokens = 8;
    r.n_output_tokens = n_out;
    r.n_drafts = n_drafts;
    for (size_t i = 0; i < proposed.size(); i++) {
        r.n_draft_tokens_at[i] = proposed[i];
        r.n_accepted_at[i] = accepted[i];
        r.n_draft_tokens += proposed[i];
        r.n_accepted_tokens += accepted[i];
    }
    r.n_rollbacks = n_rollbacks;
    r.draft_s = draft_s;
    r.verify_s = verify_s;
    r.finish = FinishReason::LENGTH;
    return r;
}

}  // namespace

// Hand-worked: request A drafted 10 times with k = 4 (40 draft tokens, accepted 10/8/7/5 = 30 by
// position), 41 tokens at 10 ms; request B 5 times with k = 2 (10 tokens, accepted 3/1), 9 tokens at
// 20 ms. Sums: 15 drafts, 50 draft tokens, 34 accepted, 16 rejected, mean accepted length
// 1 + 34/15; acceptance by position 13/15, 9/15, 7/10, 5/10.
TEST_CASE("speculation figures sum per bucket and give acceptance per position and mean accepted length", "[metrics]") {
    MetricsRegistry m;
    m.record(spec_rec("long_output", 41, 0.01, 10, {10, 10, 10, 10}, {10, 8, 7, 5}, 6, 0.2, 0.5));
    m.record(spec_rec("long_output", 9, 0.02, 5, {5, 5}, {3, 1}, 4, 0.1, 0.25));
    m.record(rec("high_temp", "t", "large", 0, 0.01, 0.1, 0.2, {0.05, 0.05}, 8, 0, 3, FinishReason::STOP));
    const BucketMetrics& lo = *m.bucket("long_output");
    CHECK(lo.n_drafts == 15);
    CHECK(lo.n_draft_tokens == 50);
    CHECK(lo.n_accepted_tokens == 34);
    CHECK(lo.n_rejected_tokens() == 16);
    CHECK(lo.n_rollbacks == 10);
    CHECK(lo.mean_accepted_length() == Approx(1.0 + 34.0 / 15.0));
    CHECK(lo.acceptance_rate() == Approx(34.0 / 50.0));
    CHECK(lo.n_spec_positions() == 4);
    CHECK(lo.acceptance_at(0) == Approx(13.0 / 15.0));
    CHECK(lo.acceptance_at(1) == Approx(9.0 / 15.0));
    CHECK(lo.acceptance_at(2) == Approx(7.0 / 10.0));
    CHECK(lo.acceptance_at(3) == Approx(5.0 / 10.0));
    CHECK(std::isnan(lo.acceptance_at(4)));
    CHECK(lo.draft_s == Approx(0.3));
    CHECK(lo.verify_s == Approx(0.75));
    CHECK(lo.n_spec_requests == 2);
    CHECK(m.all().n_drafts == 15);
    CHECK(m.all().n_accepted_at[0] == 13);
    const BucketMetrics& ht = *m.bucket("high_temp");
    CHECK(ht.n_drafts == 0);
    CHECK(std::isnan(ht.mean_accepted_length()));
    CHECK(ht.n_spec_positions() == 0);
    CHECK(m.spec_gain("high_temp").source == SpecGainSource::NONE);
    CHECK(std::isnan(m.spec_gain("high_temp").gain));
}

// The estimate on the same two requests: TPOT with = mean(10, 20) ms = 15 ms; each of the 34
// accepted tokens would have cost one more verify-sized step (0.75 s / 15 drafts = 50 ms) and the
// 0.3 s of drafting nothing, over 40 + 8 decode gaps: without = 15 ms + (1.7 - 0.3) / 48 s.
TEST_CASE("speculation gain divides a baseline, else the bucket's plain requests, else an estimate", "[metrics]") {
    MetricsRegistry m;
    m.record(spec_rec("long_output", 41, 0.01, 10, {10, 10, 10, 10}, {10, 8, 7, 5}, 6, 0.2, 0.5));
    m.record(spec_rec("long_output", 9, 0.02, 5, {5, 5}, {3, 1}, 4, 0.1, 0.25));
    SpecGain g = m.spec_gain("long_output");
    CHECK(g.source == SpecGainSource::ESTIMATE);
    const double without = 0.015 + (34 * 0.05 - 0.3) / 48.0;
    CHECK(g.tpot_without_s == Approx(without));
    CHECK(g.gain == Approx(without / 0.015));

    // A request of the bucket that never drafted (30 ms TPOT) is a measured "without" in the same run.
    m.record(spec_rec("long_output", 5, 0.03, 0, {}, {}, 0, 0.0, 0.0));
    g = m.spec_gain("long_output");
    CHECK(g.source == SpecGainSource::PLAIN_REQUESTS);
    CHECK(g.gain == Approx(0.03 / 0.015));
    // The estimate stays beside the measured gain (the plain request adds no drafts or gaps).
    CHECK(g.estimate == Approx(without / 0.015));
    CHECK(m.bucket("long_output")->n_spec_requests == 2);  // the plain one does not count

    // A baseline run's TPOT wins over both.
    m.set_spec_baseline("long_output", 0.045);
    g = m.spec_gain("long_output");
    CHECK(g.source == SpecGainSource::BASELINE);
    CHECK(g.gain == Approx(3.0));
    CHECK(std::string(spec_gain_source_name(g.source)) == "baseline");
}

TEST_CASE("the JSON report carries every speculation figure per bucket", "[metrics]") {
    MetricsRegistry m;
    m.record(spec_rec("long_output", 41, 0.01, 10, {10, 10, 10, 10}, {10, 8, 7, 5}, 6, 0.2, 0.5));
    const nlohmann::json j = m.to_json();
    const nlohmann::json& s = j["buckets"]["long_output"]["speculation"];
    for (const char* key : {"drafts", "draft_tokens", "accepted_tokens", "rejected_tokens", "mean_accepted_length",
                            "acceptance_rate", "acceptance_per_position", "draft_tokens_per_position",
                            "accepted_tokens_per_position", "draft_s", "verify_s", "draft_ms_per_draft",
                            "verify_ms_per_draft", "rollbacks", "branches", "branches_per_draft", "requests_speculating", "tpot_spec_ms", "tpot_plain_ms",
                            "gain", "gain_tpot_without_ms", "gain_source", "gain_estimate"}) {
        INFO(key);
        CHECK(s.contains(key));
    }
    CHECK(s["drafts"] == 10);
    CHECK(s["rejected_tokens"] == 10);
    CHECK(s["rollbacks"] == 6);
    CHECK(s["acceptance_per_position"].size() == 4);
    CHECK(s["acceptance_per_position"][1].get<double>() == Approx(0.8));
    CHECK(s["accepted_tokens_per_position"][3] == 5);
    CHECK(s["verify_ms_per_draft"].get<double>() == Approx(50.0));
    CHECK(s["gain_source"] == "estimate");
    CHECK(j["all"]["speculation"]["mean_accepted_length"].get<double>() == Approx(4.0));
}

TEST_CASE("the table shows a speculation section only when some bucket speculated", "[metrics]") {
    MetricsRegistry plain;
    plain.record(rec("short_qa", "t", "small", 0, 0.01, 0.1, 0.2, {0.05, 0.05}, 8, 0, 3, FinishReason::STOP));
    CHECK(plain.to_table().find("mean_acc_len") == std::string::npos);

    MetricsRegistry m;
    m.record(spec_rec("long_output", 41, 0.01, 10, {10, 10, 10, 10}, {10, 8, 7, 5}, 6, 0.2, 0.5));
    m.record(rec("short_qa", "t", "small", 0, 0.01, 0.1, 0.2, {0.05, 0.05}, 8, 0, 3, FinishReason::STOP));
    const std::string t = m.to_table();
    INFO(t);
    const size_t at = t.find("mean_acc_len");
    REQUIRE(at != std::string::npos);
    std::istringstream lines(t.substr(t.rfind('\n', at) + 1));
    std::string line;
    std::map<std::string, std::string> rows;
    while (std::getline(lines, line))
        if (!line.empty()) rows[line.substr(0, line.find(' '))] = line;
    REQUIRE(rows.count("long_output"));
    CHECK(rows["long_output"].find("1.00 0.80 0.70 0.50") != std::string::npos);
    CHECK(rows["long_output"].find("estimate") != std::string::npos);
    CHECK(rows["short_qa"].find("1.00") == std::string::npos);  // no drafts: dashes
}

TEST_CASE("structured-output figures sum per bucket: constrained requests, masked and forced rows, mask time", "[metrics]") {
    MetricsRegistry m;
    RequestRecord a = rec("structured", "t", "small", 0, 0.01, 0.1, 0.2, {0.05, 0.05}, 8, 0, 3, FinishReason::STOP);
    a.n_masked = 10;
    a.n_forced = 4;
    a.mask_s = 100e-6;  // 10 us a row
    RequestRecord b = a;
    b.n_masked = 30;
    b.n_forced = 6;
    b.mask_s = 900e-6;  // 30 us a row
    RequestRecord plain = rec("structured", "t", "small", 0, 0.01, 0.1, 0.2, {0.05, 0.05}, 8, 0, 3, FinishReason::STOP);
    m.record(a);
    m.record(b);
    m.record(plain);
    m.record(rec("short_qa", "t", "small", 0, 0.01, 0.1, 0.2, {0.05, 0.05}, 8, 0, 3, FinishReason::STOP));
    const nlohmann::json j = m.to_json();
    const nlohmann::json& s = j["buckets"]["structured"]["structured"];
    CHECK(s["requests"] == 2);  // the unconstrained one is not counted
    CHECK(s["masked_tokens"] == 40);
    CHECK(s["forced_tokens"] == 10);
    CHECK(s["forced_rate"].get<double>() == Approx(0.25));
    CHECK(s["mask_us_per_token_mean"].get<double>() == Approx(25.0));  // 1000 us over 40 rows
    // The per-request means are 10 and 30 us: the 99th percentile is the larger, within the
    // histogram's relative error.
    CHECK(s["mask_us_per_token_p99_of_requests"].get<double>() == Approx(30.0).epsilon(0.05));
    CHECK(j["buckets"]["short_qa"]["structured"]["requests"] == 0);
    CHECK(j["buckets"]["short_qa"]["structured"]["mask_us_per_token_mean"].is_null());
    CHECK(j.contains("grammar_cache"));
    const std::string t = m.to_table();
    INFO(t);
    const size_t at = t.find("constrained");
    REQUIRE(at != std::string::npos);
    CHECK(t.find("short_qa", at) == std::string::npos);  // only constrained buckets, then all
    std::istringstream lines(t.substr(t.find('\n', at) + 1));
    std::string name, forced_pct, mask_us, p99;
    long long constrained = 0, masked = 0, forced = 0;
    lines >> name >> constrained >> masked >> forced >> forced_pct >> mask_us >> p99;
    CHECK(name == "structured");
    CHECK(constrained == 2);
    CHECK(masked == 40);
    CHECK(forced == 10);
    CHECK(forced_pct == "25.0");
    CHECK(mask_us == "25.0");
    MetricsRegistry none;
    none.record(plain);
    CHECK(none.to_table().find("constrained") == std::string::npos);
}

TEST_CASE("the KV series over time keeps every untagged sample, then an evenly thinned bounded series with the "
          "evictions so far", "[metrics]") {
    MetricsRegistry m;
    for (int i = 0; i < 10; i++) {
        m.add_evictions(2, "lru", "short_qa");
        m.record_kv({(double)i, "", 5 + i, 100, 0.0, 0, "p"});
        m.record_kv({(double)i, "short_qa", 1, 100, 0.0, 0, "p"});  // a bucket's share: not in the series
    }
    REQUIRE(m.kv_series().size() == 10);
    for (int i = 0; i < 10; i++) {
        CHECK(m.kv_series()[i].t_s == i);
        CHECK(m.kv_series()[i].n_blocks_used == 5 + i);
        CHECK(m.kv_series()[i].evictions == 2 * (i + 1));
        CHECK(m.kv_series()[i].pool == "p");
    }
    const nlohmann::json j = m.to_json();
    REQUIRE(j["kv_series"].size() == 10);
    CHECK(j["kv_series"][3]["t_s"] == 3.0);
    CHECK(j["kv_series"][3]["evictions"] == 8);

    MetricsRegistry big;
    const int n = 20000;
    for (int i = 0; i < n; i++) big.record_kv({(double)i, "", i, n, 0.0, 0, "p"});
    const auto& s = big.kv_series();
    REQUIRE(s.size() < MetricsRegistry::k_max_kv_points);
    REQUIRE(s.size() > MetricsRegistry::k_max_kv_points / 4);
    // Evenly spaced from the first sample: one step throughout, covering the run.
    const double step = s[1].t_s - s[0].t_s;
    CHECK(s[0].t_s == 0.0);
    CHECK(step >= 2.0);
    for (size_t i = 1; i < s.size(); i++) CHECK(s[i].t_s - s[i - 1].t_s == step);
    CHECK(s.back().t_s > n - 2 * step);
}

TEST_CASE("SLO attainment per target matches a hand count, and the default table stays within 120 columns",
          "[metrics][slo]") {
    // short_qa's targets: TTFT 200 ms, TPOT 150 ms (test_config). By hand, over its four requests:
    //   R1 ttft 100, tpot 133.3: both met. R2 ttft 300 (missed), tpot 100 (met).
    //   R3 ttft 50, one token (no TPOT): both met. R4 overloaded: neither.
    // TTFT 2 of 4, TPOT 3 of 4, both 2 of 4. long_doc has no target: null.
    MetricsRegistry m = hand_worked();
    const nlohmann::json j = m.to_json();
    const nlohmann::json& qa = j["buckets"]["short_qa"]["slo"];
    CHECK(qa["ttft_ms"].get<double>() == 200.0);
    CHECK(qa["tpot_ms"].get<double>() == 150.0);
    CHECK(qa["ttft_attainment"].get<double>() == Approx(0.5));
    CHECK(qa["tpot_attainment"].get<double>() == Approx(0.75));
    CHECK(qa["attainment"].get<double>() == Approx(0.5));
    CHECK(j["buckets"]["long_doc"]["slo"]["ttft_attainment"].is_null());
    CHECK(j["buckets"]["long_doc"]["slo"]["ttft_ms"].get<double>() == 0.0);
    // "all" counts the requests that had a target: short_qa's.
    CHECK(j["all"]["slo"]["ttft_attainment"].get<double>() == Approx(0.5));
    CHECK(j["all"]["slo"]["attainment"].get<double>() == Approx(0.5));

    const std::string t = m.to_table();
    std::istringstream in(t);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) {
        INFO(l);
        CHECK(l.size() <= 120);
        lines.push_back(l);
    }
    REQUIRE(lines.size() >= 4);
    CHECK(lines[0].find("tpot_mean_ms") != std::string::npos);  // the statistic is in the name
    CHECK(lines[0].find("slo_ttft%") != std::string::npos);
    CHECK(lines[1].rfind("short_qa", 0) == 0);
    CHECK(lines[1].find(" 50.0  ") != std::string::npos);   // slo_ttft%
    CHECK(lines[1].find(" 75.0 ") != std::string::npos);    // slo_tpot%
    CHECK(lines[2].rfind("long_doc", 0) == 0);
    CHECK(lines[2].find("        -         -") != std::string::npos);  // no targets
    // The wide table has every column.
    CHECK(m.to_table(true).find("page_mean_%") != std::string::npos);
    CHECK(t.find("page_mean_%") == std::string::npos);

    // With speculation, its section stays within 120 columns as well.
    MetricsRegistry s;
    s.record(spec_rec("long_output", 41, 0.01, 10, {10, 10, 10, 10}, {10, 8, 7, 5}, 6, 0.2, 0.5));
    std::istringstream sin(s.to_table());
    for (std::string l; std::getline(sin, l);) {
        INFO(l);
        CHECK(l.size() <= 120);
    }
    CHECK(s.to_table(true).find("rollbacks") != std::string::npos);
}

TEST_CASE("a gain measured against plain requests of the bucket carries a 95% interval by the delta method", "[metrics][spec]") {
    MetricsRegistry m;
    // Three speculating requests with TPOT 10, 12 and 14 ms; two plain ones with 20 and 24 ms.
    for (double t : {0.010, 0.012, 0.014}) {
        RequestRecord r = rec("agent", "t", "p", 0, 0.0, 0.01, 0.01 + 2 * t, {t, t}, 8, 0, 3, FinishReason::STOP);
        r.n_drafts = 1;
        r.n_draft_tokens = 2;
        r.n_accepted_tokens = 1;
        m.record(r);
    }
    for (double t : {0.020, 0.024}) m.record(rec("agent", "t", "p", 0, 0.0, 0.01, 0.01 + 2 * t, {t, t}, 8, 0, 3, FinishReason::STOP));
    // By hand: gain 22 / 12; the means' variances 8 / 2 (plain) and 4 / 3 (speculating), in ms^2.
    const double gain = 22.0 / 12.0;
    const double se = gain * std::sqrt((8.0 / 2) / (22.0 * 22.0) + (4.0 / 3) / (12.0 * 12.0));
    const SpecGain g = m.spec_gain("agent");
    CHECK(g.source == SpecGainSource::PLAIN_REQUESTS);
    CHECK(g.gain == Approx(gain));
    CHECK(g.lo == Approx(gain - 1.96 * se));
    CHECK(g.hi == Approx(gain + 1.96 * se));
    const nlohmann::json j = m.to_json();
    CHECK(j["buckets"]["agent"]["speculation"]["gain_ci95"][0].get<double>() == Approx(gain - 1.96 * se));
    CHECK(m.to_table().find(fmt::format("{:.2f}-{:.2f}", gain - 1.96 * se, gain + 1.96 * se)) != std::string::npos);
    // An estimate has no interval.
    MetricsRegistry e;
    e.record(spec_rec("long_output", 41, 0.01, 10, {10, 10, 10, 10}, {10, 8, 7, 5}, 6, 0.2, 0.5));
    CHECK(e.to_json()["buckets"]["long_output"]["speculation"]["gain_ci95"].is_null());
}
