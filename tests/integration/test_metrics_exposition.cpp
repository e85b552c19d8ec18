// /metrics conformance on a runtime that served requests: two pools, a cascade bucket that upgrades, tenants with a KV quota (one refused), a failed reload; the whole Prometheus
// exposition passes the strict checker (tests/support/prometheus_text.h) and its figures count what
// was served.
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>

#include <steward/runtime.h>

#include "prometheus_text.h"
#include "run_all.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

TEST_CASE("The Prometheus exposition of a runtime that served requests conforms and counts them", "[metrics]") {
    std::string t = two_pool_toml();
    t += R"(
[[tenant]]
name = "tight"
kv_quota = 0.01

[[bucket]]
name = "cascade"
pool = "large"
[bucket.match]
hint = "cascade"
[bucket.routing]
plugin = "cascade"
start_pool = "small"
upgrade_pool = "large"
k = 2
threshold = 0.0

[[bucket]]
name = "other"
pool = "large"
)";
    const std::string path = write_config("metrics_exposition.toml", t);
    auto started = Runtime::start(path);
    if (!started) FAIL(started.error().message);
    auto rt = std::move(started.value());

    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 6; ++i) {
        GenerationRequest q;
        q.bucket_hint = i % 2 ? "cascade" : "";
        q.tenant = i % 3 ? "acme" : "beta";
        for (int k = 0; k < 20 + i; ++k) q.prompt_ids.push_back(1 + (k * 7 + i * 13) % 500);
        q.max_tokens = 4;
        reqs.push_back(q);
    }
    GenerationRequest refused;  // 0.01 of 128 blocks rounds to no room for 40 + 4 tokens
    refused.tenant = "tight";
    for (int k = 0; k < 40; ++k) refused.prompt_ids.push_back(1 + k);
    refused.max_tokens = 4;
    reqs.push_back(refused);
    const auto results = run_all(*rt, reqs);
    int n_ok = 0;
    for (const auto& r : results) n_ok += r.ok();
    CHECK(n_ok == 6);
    CHECK(results.back().finish == FinishReason::OVERLOADED);
    write_config("metrics_exposition.toml", "not = [valid toml");
    CHECK_FALSE(rt->reload().ok());

    const std::string text = rt->metrics_prometheus();
    PrometheusExposition e = check_prometheus_text(text);
    std::string errors;
    for (const auto& x : e.errors) errors += x + "\n";
    INFO(errors << text);
    REQUIRE(e.errors.empty());

    // The figures count what was served: 6 successes, 4 tokens each, one refusal naming the quota.
    double n_success = 0, n_generated = 0, n_ttft = 0;
    for (const auto& s : e.series) {
        if (s.name == "steward_request_success_total") n_success += s.value;
        if (s.name == "steward_generation_tokens_total") n_generated += s.value;
        if (s.name == "steward_time_to_first_token_seconds_count") n_ttft += s.value;
    }
    CHECK(n_success == 6);
    CHECK(n_generated == 24);
    CHECK(n_ttft == 6);
    CHECK(e.values["steward_request_failure_total{bucket=\"other\",finished_reason=\"overloaded\"}"] == 1);
    CHECK(e.values["steward_config_reloads_total{result=\"error\"}"] == 1);
    CHECK(e.values["steward_route_upgrades_total{bucket=\"cascade\"}"] == 3);
    // Admission per pool and tenant, the refusal under the limit that refused it.
    double n_refused_quota = 0;
    for (const auto& s : e.series)
        if (s.name == "steward_kv_admission_refused_requests_total" && s.labels.at("tenant") == "tight" &&
            s.labels.at("limit") == "tenant_quota")
            n_refused_quota += s.value;
    CHECK(n_refused_quota == 1);
    // By tenant: acme sent requests 1, 2, 4, 5 and beta 0, 3 (4 tokens each); tight's one was refused.
    std::map<std::string, double> tokens_by_tenant, requests_by_tenant;
    for (const auto& s : e.series) {
        if (s.name == "steward_tenant_generation_tokens_total") tokens_by_tenant[s.labels.at("tenant")] += s.value;
        if (s.name == "steward_tenant_requests_total") requests_by_tenant[s.labels.at("tenant")] += s.value;
    }
    CHECK(tokens_by_tenant["acme"] == 16);
    CHECK(tokens_by_tenant["beta"] == 8);
    CHECK(requests_by_tenant["tight"] == 1);
    double tight_overloaded = 0;
    for (const auto& s : e.series)
        if (s.name == "steward_tenant_requests_total" && s.labels.at("tenant") == "tight" &&
            s.labels.at("finished_reason") == "overloaded")
            tight_overloaded += s.value;
    CHECK(tight_overloaded == 1);
    CHECK(e.types.count("steward_plugin_decisions_total") == 1);
    CHECK(e.types.count("steward_kv_cache_usage_ratio") == 1);
}

TEST_CASE("A bucket that speculates shows its drafts per position in Prometheus, the JSON report and the table",
          "[metrics][speculation]") {
    std::string t = two_pool_toml();
    // The large pool drafts with the small pool's model (its first layer).
    const size_t at = t.find("[pool.synth]\ndim =");
    REQUIRE(at != std::string::npos);
    t.insert(at, "draft = \"small\"\n");
    t += R"(
[[bucket]]
name = "spec"
pool = "large"
[bucket.match]
hint = "spec"
[bucket.speculation]
plugin = "fixed"
budget = 3
source = "draft"

[[bucket]]
name = "other"
pool = "large"
)";
    const std::string path = write_config("metrics_speculation.toml", t);
    auto started = Runtime::start(path);
    if (!started) FAIL(started.error().message);
    auto rt = std::move(started.value());
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 4; ++i) {
        GenerationRequest q;
        q.bucket_hint = i % 2 ? "spec" : "";
        for (int k = 0; k < 12; k++) q.prompt_ids.push_back(300 + k * 11 + i);
        q.max_tokens = 8;
        reqs.push_back(q);
    }
    for (const auto& r : run_all(*rt, reqs)) CHECK(r.ok());

    PrometheusExposition e = check_prometheus_text(rt->metrics_prometheus());
    std::string errors;
    for (const auto& x : e.errors) errors += x + "\n";
    INFO(errors);
    REQUIRE(e.errors.empty());
    const double n_drafts = e.values["steward_spec_decode_num_drafts_total{bucket=\"spec\"}"];
    CHECK(n_drafts > 0);
    CHECK(e.values["steward_spec_decode_num_draft_tokens_total{bucket=\"spec\"}"] >= n_drafts);
    // Every draft has a first position; the plain bucket drafted nothing.
    CHECK(e.values["steward_spec_decode_num_draft_tokens_per_pos_total{bucket=\"spec\",position=\"0\"}"] == n_drafts);
    CHECK(e.values["steward_spec_decode_verify_time_seconds_total{bucket=\"spec\"}"] > 0);
    CHECK(e.values["steward_spec_decode_num_drafts_total{bucket=\"other\"}"] == 0);

    const auto j = nlohmann::json::parse(rt->metrics_json());
    const auto& s = j["buckets"]["spec"]["speculation"];
    CHECK(s["drafts"].get<double>() == n_drafts);
    CHECK(s["requests_speculating"].get<int>() >= 1);
    CHECK(s["acceptance_per_position"].size() >= 1);
    CHECK(rt->metrics_table().find("mean_acc_len") != std::string::npos);
}
