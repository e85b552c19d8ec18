// The registry's Prometheus exposition against a strict, independent checker of the text format and
// naming conventions (tests/support/prometheus_text.h), with every kind of figure present and label
// values that need escaping; and the checker itself refusing each kind of non-conforming text.
#include <catch2/catch.hpp>
#include <string>

#include "metrics/bucket_metrics.h"
#include "prometheus_text.h"

using namespace steward;
using steward_test::check_prometheus_text;

namespace {

std::string errors_of(const steward_test::PrometheusExposition& e) {
    std::string s;
    for (const auto& x : e.errors) s += x + "\n";
    return s;
}

bool has_error(const std::string& text, const std::string& part) {
    auto e = check_prometheus_text(text);
    for (const auto& x : e.errors)
        if (x.find(part) != std::string::npos) return true;
    return false;
}

}  // namespace

TEST_CASE("The Prometheus checker refuses each kind of non-conforming exposition", "[metrics]") {
    const std::string help = "# HELP steward_x_total X.\n# TYPE steward_x_total counter\n";
    CHECK(check_prometheus_text(help + "steward_x_total{a=\"1\"} 3\n").errors.empty());
    CHECK(has_error("steward_x_total 1\n", "no # TYPE"));
    CHECK(has_error("# HELP steward_x X.\n# TYPE steward_x counter\nsteward_x 1\n", "must end in _total"));
    CHECK(has_error("# HELP steward_x_total X.\n# TYPE steward_x_total gauge\nsteward_x_total 1\n", "only counters"));
    CHECK(has_error("# HELP steward:x_total X.\n# TYPE steward:x_total counter\nsteward:x_total 1\n", "recording rules"));
    CHECK(has_error("# HELP vllm_x_total X.\n# TYPE vllm_x_total counter\nvllm_x_total 1\n", "does not start with"));
    CHECK(has_error("# HELP steward_t_ms T.\n# TYPE steward_t_ms gauge\nsteward_t_ms 1\n", "base unit"));
    CHECK(has_error("# HELP steward_u_perc U.\n# TYPE steward_u_perc gauge\nsteward_u_perc 1\n", "base unit"));
    CHECK(has_error(help + "steward_x_total{a=\"1\"} 3\nsteward_x_total{a=\"1\"} 4\n", "duplicate series"));
    CHECK(has_error(help + "steward_x_total{a=\"1\",b=\"2\"} 3\nsteward_x_total{b=\"2\",a=\"1\"} 4\n", "duplicate series"));
    CHECK(has_error(help + "steward_x_total -1\n", ">= 0"));
    CHECK(has_error(help + "steward_x_total{a=\"\\t\"} 1\n", "bad escape"));
    CHECK(has_error(help + "steward_x_total{a=\"x} 1\n", "malformed labels"));
    CHECK(has_error(help + "steward_x_total{a=x} 1\n", "malformed labels"));
    CHECK(has_error(help + "steward_x_total one\n", "bad value"));
    CHECK(has_error(help + "steward_x_total 1 2 3\n", "trailing text"));
    CHECK(has_error(help + "steward_x_total 1", "newline"));
    CHECK(has_error(help + "\nsteward_x_total 1\n", "empty line"));
    CHECK(has_error("# TYPE steward_x_total counter\nsteward_x_total 1\n", "no # HELP"));
    const std::string g = "# HELP steward_g G.\n# TYPE steward_g gauge\nsteward_g 1\n";
    CHECK(has_error(help + "steward_x_total 1\n" + g + "steward_x_total{a=\"2\"} 1\n", "outside its family"));
    const std::string h = "# HELP steward_h_seconds H.\n# TYPE steward_h_seconds histogram\n";
    const std::string good = h + "steward_h_seconds_bucket{le=\"0.1\"} 1\nsteward_h_seconds_bucket{le=\"1\"} 2\n"
                                 "steward_h_seconds_bucket{le=\"+Inf\"} 3\nsteward_h_seconds_sum 2.5\nsteward_h_seconds_count 3\n";
    CHECK(check_prometheus_text(good).errors.empty());
    CHECK(has_error(h + "steward_h_seconds_bucket{le=\"0.1\"} 2\nsteward_h_seconds_bucket{le=\"1\"} 1\n"
                        "steward_h_seconds_bucket{le=\"+Inf\"} 2\nsteward_h_seconds_sum 1\nsteward_h_seconds_count 2\n",
                    "not cumulative"));
    CHECK(has_error(h + "steward_h_seconds_bucket{le=\"1\"} 1\nsteward_h_seconds_bucket{le=\"0.1\"} 1\n"
                        "steward_h_seconds_bucket{le=\"+Inf\"} 1\nsteward_h_seconds_sum 1\nsteward_h_seconds_count 1\n",
                    "le not increasing"));
    CHECK(has_error(h + "steward_h_seconds_bucket{le=\"1\"} 1\nsteward_h_seconds_sum 1\nsteward_h_seconds_count 1\n",
                    "+Inf"));
    CHECK(has_error(h + "steward_h_seconds_bucket{le=\"+Inf\"} 2\nsteward_h_seconds_sum 1\nsteward_h_seconds_count 3\n",
                    "differs from _count"));
    CHECK(has_error(h + "steward_h_seconds_bucket{le=\"+Inf\"} 2\nsteward_h_seconds_count 2\n", "no _sum"));
    CHECK(has_error(h + "steward_h_seconds 2\n", "_bucket, _sum or _count"));
}

TEST_CASE("Every family of the registry's exposition conforms, with label values that need escaping", "[metrics]") {
    MetricsConfig cfg;
    cfg.prices["p\"1"] = {1.0, 0.1, 2.0};
    cfg.kv = KvShape{2, 64, 16, 2, 64, 2.0};
    MetricsRegistry m(cfg);
    const std::string awkward_bucket = "b\\\"x\ny";  // backslash, quote, newline
    for (int i = 0; i < 5; ++i) {
        RequestRecord r;
        r.bucket = i % 2 ? awkward_bucket : "plain";
        r.tenant = i % 2 ? "ten\"ant" : "t";
        r.pool = i < 3 ? "p\"1" : "p2";
        r.t_arrival_s = i;
        r.t_scheduled_s = i + 0.01;
        r.t_first_token_s = i + 0.05 * (i + 1);
        r.t_finish_s = i + 1.0;
        r.itl_s = {0.01, 0.02 * (i + 1), 0.5};
        r.n_prompt_tokens = 40;
        r.n_cached_prompt_tokens = 16 * (i % 3);
        r.n_output_tokens = 4;
        r.finish = i == 4 ? FinishReason::OVERLOADED : FinishReason::STOP;
        if (i == 2) r.prior_pools.push_back({"p2", 40, 0, 2});
        m.record(r);
    }
    m.record_quality("plain", "p2", 0.75, false);
    m.record_kv(KvSample{5.0, "", 10, 64, 0.25, 1});
    m.add_evictions(3, "lru", "plain");
    m.record_reload(false, 1, "bad");
    m.record_reload(true, 2);
    m.set_policy_figures({{"plain", "routing", "cost\\quality", 5, 1, 0, 2}});
    TenantAdmission a;
    a.tenant = "ten\"ant";
    a.n_admitted = 4;
    a.n_refused_quota = 1;
    m.set_admission("p\"1", {a});

    const std::string text = m.to_prometheus();
    auto e = check_prometheus_text(text);
    INFO(errors_of(e) << text);
    REQUIRE(e.errors.empty());
    // Every kind of figure is there, under the new names; the escaped labels read back as written.
    CHECK(e.types["steward_time_to_first_token_seconds"] == "histogram");
    CHECK(e.types["steward_kv_cache_usage_ratio"] == "gauge");
    CHECK(e.types["steward_config_reloads_total"] == "counter");
    CHECK(e.values["steward_prompt_tokens_total{bucket=\"plain\"}"] == 120);
    CHECK(e.values["steward_prompt_tokens_total{bucket=\"b\\\\\\\"x\\ny\"}"] == 80);
    CHECK(e.values["steward_config_reloads_total{result=\"error\"}"] == 1);
    CHECK(e.values["steward_kv_admission_refused_requests_total{limit=\"tenant_quota\",pool=\"p\\\"1\",tenant=\"ten\\\"ant\"}"] == 1);
    CHECK(e.values["steward_kv_cache_capacity_blocks{pool=\"unknown\"}"] == 64);
    CHECK(e.values["steward_time_to_first_token_seconds_count{bucket=\"plain\"}"] == 3);
    bool saw_awkward = false;
    for (const auto& s : e.series)
        if (s.labels.count("bucket") && s.labels.at("bucket") == awkward_bucket) saw_awkward = true;
    CHECK(saw_awkward);
    CHECK(e.types.size() >= 40);
}

TEST_CASE("The speculation families conform and carry vLLM's counters per bucket and position", "[metrics]") {
    MetricsRegistry m;
    RequestRecord r;
    r.bucket = "long_output";
    r.pool = "large";
    r.t_first_token_s = 0.1;
    r.t_finish_s = 0.5;
    r.itl_s = {0.1, 0.1, 0.1, 0.1};
    r.n_output_tokens = 5;
    r.n_drafts = 2;
    r.n_draft_tokens = 5;
    r.n_accepted_tokens = 3;
    r.n_draft_tokens_at = {2, 2, 1};
    r.n_accepted_at = {2, 1, 0};
    r.n_rollbacks = 2;
    r.n_spec_branches = 3;  // one draft was a tree of two leaves
    r.draft_s = 0.02;
    r.verify_s = 0.08;
    m.record(r);
    r.bucket = "high_temp";  // a bucket that never drafted: counters at 0, no per-position series
    r.n_drafts = r.n_draft_tokens = r.n_accepted_tokens = r.n_rollbacks = r.n_spec_branches = 0;
    r.n_draft_tokens_at = {};
    r.n_accepted_at = {};
    r.draft_s = r.verify_s = 0;
    m.record(r);
    const std::string text = m.to_prometheus();
    auto e = check_prometheus_text(text);
    INFO(errors_of(e) << text);
    REQUIRE(e.errors.empty());
    CHECK(e.types["steward_spec_decode_num_drafts_total"] == "counter");
    CHECK(e.types["steward_spec_decode_mean_accepted_length"] == "gauge");
    CHECK(e.values["steward_spec_decode_num_drafts_total{bucket=\"long_output\"}"] == 2);
    CHECK(e.values["steward_spec_decode_num_draft_tokens_total{bucket=\"long_output\"}"] == 5);
    CHECK(e.values["steward_spec_decode_num_accepted_tokens_total{bucket=\"long_output\"}"] == 3);
    CHECK(e.values["steward_spec_decode_num_rejected_tokens_total{bucket=\"long_output\"}"] == 2);
    CHECK(e.values["steward_spec_decode_num_rollbacks_total{bucket=\"long_output\"}"] == 2);
    CHECK(e.values["steward_spec_decode_num_branches_total{bucket=\"long_output\"}"] == 3);
    CHECK(e.values["steward_spec_decode_num_branches_total{bucket=\"high_temp\"}"] == 0);
    CHECK(e.values["steward_spec_decode_num_accepted_tokens_per_pos_total{bucket=\"long_output\",position=\"1\"}"] == 1);
    CHECK(e.values["steward_spec_decode_num_draft_tokens_per_pos_total{bucket=\"long_output\",position=\"2\"}"] == 1);
    CHECK(e.values["steward_spec_decode_draft_time_seconds_total{bucket=\"long_output\"}"] == Approx(0.02));
    CHECK(e.values["steward_spec_decode_verify_time_seconds_total{bucket=\"long_output\"}"] == Approx(0.08));
    CHECK(e.values["steward_spec_decode_mean_accepted_length{bucket=\"long_output\"}"] == Approx(2.5));
    CHECK(e.values.count("steward_spec_decode_gain{bucket=\"long_output\",source=\"plain_requests\"}") == 0);
    CHECK(e.values.count("steward_spec_decode_gain{bucket=\"long_output\",source=\"estimate\"}") == 1);
    CHECK(e.values["steward_spec_decode_num_drafts_total{bucket=\"high_temp\"}"] == 0);
    CHECK(e.values.count("steward_spec_decode_num_draft_tokens_per_pos_total{bucket=\"high_temp\",position=\"0\"}") == 0);
}

TEST_CASE("vLLM names carry each pool's figures under model_name", "[metrics][vllm]") {
    MetricsConfig cfg;
    cfg.vllm_names = true;
    MetricsRegistry m(cfg);
    // Pool "a" finishes stop, length, cancelled, timeout and error; an upgrade from "b" leaves its
    // tokens on "b"; an overloaded request never reached an engine.
    const FinishReason reasons[] = {FinishReason::STOP,    FinishReason::LENGTH, FinishReason::CANCELLED,
                                    FinishReason::TIMEOUT, FinishReason::ERROR,  FinishReason::OVERLOADED};
    for (int i = 0; i < 6; ++i) {
        RequestRecord r;
        r.bucket = "chat";
        r.pool = "a";
        r.t_arrival_s = i;
        r.t_scheduled_s = i + 0.1;
        r.t_first_token_s = i + 0.4;
        r.t_finish_s = i + 1.0;
        r.itl_s = {0.2, 0.4};
        r.n_prompt_tokens = 10;
        r.n_cached_prompt_tokens = 4;
        r.n_output_tokens = 3;
        r.n_preemptions = i == 1;
        r.finish = reasons[i];
        if (i == 0) r.prior_pools.push_back({"b", 10, 2, 5});
        m.record(r);
    }
    m.record_kv(KvSample{1.0, "", 16, 64, 0.0, 0, "a"});
    m.record_kv(KvSample{1.0, "", 8, 32, 0.0, 0, "b"});
    m.add_evictions(3, "lru", "chat", "a");
    TenantAdmission waiting;
    waiting.tenant = "t";
    waiting.n_waiting = 2;
    m.set_admission("a", {waiting});
    m.set_pool_loads({PoolLoad{"a", 3, 1, {{"chat", 2, 1}, {"", 1, 0}}, 16, 64}, PoolLoad{"b", 0, 0, {}, 32, 32}});

    const std::string text = m.to_prometheus();
    auto e = check_prometheus_text(text);
    INFO(errors_of(e) << text);
    REQUIRE(e.errors.empty());
    const std::string a = "engine=\"0\",model_name=\"a\"", b = "engine=\"0\",model_name=\"b\"";
    // Gauges: the scheduler's load; waiting adds the KV admission queue, as vLLM's queue holds both.
    CHECK(e.values["vllm:num_requests_running{" + a + "}"] == 3);
    CHECK(e.values["vllm:num_requests_waiting{" + a + "}"] == 3);
    CHECK(e.values["steward_requests_waiting{pool=\"a\"}"] == 3);
    CHECK(e.values["steward_bucket_requests_running{bucket=\"chat\",pool=\"a\"}"] == 2);
    CHECK(e.values["steward_bucket_requests_running{bucket=\"unclassified\",pool=\"a\"}"] == 1);
    CHECK(e.values["steward_bucket_requests_waiting{bucket=\"chat\",pool=\"a\"}"] == 1);
    CHECK(e.values["vllm:kv_cache_usage_perc{" + a + "}"] == 0.25);
    CHECK(e.values["vllm:gpu_cache_usage_perc{" + b + "}"] == 0.25);
    CHECK(e.values["steward_kv_cache_used_blocks{pool=\"b\"}"] == 8);
    CHECK(e.values["steward_kv_cache_evicted_blocks_total{policy=\"lru\",pool=\"a\"}"] == 3);
    CHECK(e.values["vllm:cache_config_info{block_size=\"16\"," + a + ",num_gpu_blocks=\"64\"}"] == 1);
    // Counters: every request that reached the engine (not the overloaded one); the upgrade's
    // earlier work on its own pool.
    CHECK(e.values["vllm:prompt_tokens_total{" + a + "}"] == 50);
    CHECK(e.values["vllm:prompt_tokens_total{" + b + "}"] == 10);
    CHECK(e.values["vllm:prefix_cache_hits_total{" + b + "}"] == 2);
    CHECK(e.values["vllm:generation_tokens_total{" + b + "}"] == 5);
    CHECK(e.values["vllm:num_preemptions_total{" + a + "}"] == 1);
    CHECK(e.values["vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"a\"}"] == 1);
    CHECK(e.values["vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"a\"}"] == 1);
    CHECK(e.values["vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"a\"}"] == 2);
    CHECK(e.values["vllm:request_success_total{engine=\"0\",finished_reason=\"error\",model_name=\"a\"}"] == 1);
    // Histograms on vLLM's bounds: e2e, queue and the phases over requests that were served or
    // ended by the caller or a deadline (not errors), TTFT over those with a token.
    CHECK(e.values["vllm:time_to_first_token_seconds_count{" + a + "}"] == 5);
    CHECK(e.values["vllm:e2e_request_latency_seconds_count{" + a + "}"] == 4);
    CHECK(e.values["vllm:request_prefill_time_seconds_sum{" + a + "}"] == Approx(4 * 0.3));
    CHECK(e.values["vllm:request_decode_time_seconds_sum{" + a + "}"] == Approx(4 * 0.6));
    CHECK(e.values["vllm:request_inference_time_seconds_bucket{engine=\"0\",le=\"0.8\",model_name=\"a\"}"] == 0);
    CHECK(e.values["vllm:request_inference_time_seconds_bucket{engine=\"0\",le=\"1\",model_name=\"a\"}"] == 4);
    CHECK(e.values["vllm:inter_token_latency_seconds_count{" + a + "}"] == 10);
    CHECK(e.values["vllm:inter_token_latency_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"a\"}"] == 5);
    CHECK(e.values["vllm:time_per_output_token_seconds_count{" + a + "}"] == 10);
    CHECK(e.types["vllm:request_time_per_output_token_seconds"] == "histogram");

    // Off by default: no vllm: family.
    MetricsRegistry plain;
    plain.record_kv(KvSample{1.0, "", 16, 64, 0.0, 0, "a"});
    CHECK(plain.to_prometheus().find("vllm:") == std::string::npos);
}
