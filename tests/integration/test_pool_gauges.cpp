// The per-pool scheduler gauges and the vLLM-named export ([metrics] vllm_names) on a runtime that
// serves requests: the running / waiting gauges move with a one-slot pool's requests, the vllm:*
// counters equal what the results themselves report, promtool reads the exposition, and a tenant's
// scrape keeps the per-pool aggregates without another tenant's series; and [tracing] otlp_file
// receives each finished request's trace as OTLP/JSON spans.
#include <fmt/format.h>
#include <steward/runtime.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "prometheus_text.h"
#include "run_all.h"
#include "run_command.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

namespace {

// One pool "solo" of a small synthetic llama (the two-pool tests' "large" model file), max_batch
// sequences per step, and the vLLM names on.
std::string solo_toml(int max_batch) {
    return fmt::format(R"(
[limits]
request_timeout_ms = 300000
max_tokens_default = 8

[reload]
watch = false

[metrics]
vllm_names = true

[[pool]]
name = "solo"
model = "{}/large128.gguf"
threads = 1
kv_blocks = 256
block_size = 16
max_batch = {}
max_batch_tokens = 128
[pool.synth]
dim = 128
layers = 3
heads = 4
kv_heads = 2
ffn = 256
vocab = 512
ctx = 1024
seed = 11

[[bucket]]
name = "chat"
pool = "solo"
)",
                       two_pool_dir().string(), max_batch);
}

std::unique_ptr<Runtime> start(const std::string& file, const std::string& toml) {
    auto started = Runtime::start(write_config(file, toml));
    if (!started) FAIL(started.error().message);
    return std::move(started.value());
}

PrometheusExposition scrape(const std::string& text) {
    PrometheusExposition e = check_prometheus_text(text);
    std::string errors;
    for (const auto& x : e.errors) errors += x + "\n";
    INFO(errors << text);
    REQUIRE(e.errors.empty());
    return e;
}

// Polls the exposition until `ok` holds or the deadline passes (generous: the machine is shared).
template <class F>
bool poll(Runtime& rt, F ok, std::chrono::seconds limit = std::chrono::seconds(120)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        PrometheusExposition e = scrape(rt.metrics_prometheus());
        if (ok(e)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
}

// Requests of two tenants, some prompts sent twice (prefix-cache hits), lengths and stops mixed.
std::vector<GenerationRequest> mixed_requests() {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 8; ++i) {
        GenerationRequest q;
        q.tenant = i % 2 ? "acme" : "beta";
        for (int k = 0; k < 40 + (i % 4) * 3; ++k) q.prompt_ids.push_back(1 + (k * 7 + (i % 4) * 13) % 500);
        q.max_tokens = 3 + i;
        q.ignore_eos = i % 3 != 0;
        reqs.push_back(q);
    }
    return reqs;
}

const std::string k_solo = "engine=\"0\",model_name=\"solo\"";

}  // namespace

TEST_CASE("Running and waiting gauges follow a one-slot pool", "[metrics][gauges]") {
    auto rt = start("pool_gauges_one_slot.toml", solo_toml(1));
    // Two long requests: the pool runs one at a time, so while the first decodes the second waits.
    std::atomic<int> n_done{0};
    std::vector<GenerationResult> results(2);
    for (int i = 0; i < 2; ++i) {
        GenerationRequest q;
        for (int k = 0; k < 20; ++k) q.prompt_ids.push_back(1 + (k * 11 + i * 5) % 500);
        q.max_tokens = 900;
        q.ignore_eos = true;
        RequestCallbacks cb;
        cb.on_finish = [&, i](const GenerationResult& r) {
            results[i] = r;
            n_done++;
        };
        rt->submit(q, std::move(cb));
    }
    auto gauges = [](PrometheusExposition& e, double running, double waiting) {
        return e.values["steward_requests_running{pool=\"solo\"}"] == running &&
               e.values["steward_requests_waiting{pool=\"solo\"}"] == waiting &&
               e.values["steward_bucket_requests_running{bucket=\"chat\",pool=\"solo\"}"] == running &&
               e.values["steward_bucket_requests_waiting{bucket=\"chat\",pool=\"solo\"}"] == waiting &&
               e.values["vllm:num_requests_running{" + k_solo + "}"] == running &&
               e.values["vllm:num_requests_waiting{" + k_solo + "}"] == waiting;
    };
    const bool seen_busy = poll(*rt, [&](PrometheusExposition& e) { return gauges(e, 1, 1) || n_done == 2; });
    CHECK(seen_busy);
    CHECK(n_done < 2);  // seen while both were unfinished, not given up on because they finished
    rt->drain();
    for (const auto& r : results) {
        CHECK(r.finish == FinishReason::LENGTH);
        CHECK(r.metrics.completion_tokens == 900);
    }
    // Idle: both gauges back to 0, the bucket's series too, and no KV block in use.
    CHECK(poll(*rt, [&](PrometheusExposition& e) {
        return gauges(e, 0, 0) && e.values["vllm:kv_cache_usage_perc{" + k_solo + "}"] == 0 &&
               e.values["steward_kv_cache_used_blocks{pool=\"solo\"}"] == 0;
    }));
}

TEST_CASE("vLLM-named counters equal the results' own counts", "[metrics][vllm]") {
    auto rt = start("pool_gauges_counts.toml", solo_toml(4));
    const auto results = run_all(*rt, mixed_requests());
    // Independent counts: what each result reports of itself.
    double n_prompt = 0, n_cached = 0, n_output = 0, n_gaps = 0, e2e_s = 0;
    std::map<std::string, double> by_reason;
    for (const auto& r : results) {
        REQUIRE(r.ok());
        n_prompt += r.metrics.prompt_tokens;
        n_cached += r.metrics.cached_tokens;
        n_output += r.metrics.completion_tokens;
        n_gaps += std::max(0, r.metrics.completion_tokens - 1);
        e2e_s += r.metrics.e2e_ms / 1e3;
        by_reason[finish_reason_name(r.finish)]++;
    }
    CHECK(n_cached > 0);  // repeated prompts hit the prefix cache
    PrometheusExposition e = scrape(rt->metrics_prometheus());
    // The checker's keys list the labels sorted: engine, finished_reason, model_name.
    auto v = [&](const std::string& name, const std::string& reason = "") {
        const std::string key = name + "{engine=\"0\"" + (reason.empty() ? "" : ",finished_reason=\"" + reason + "\"") +
                                ",model_name=\"solo\"}";
        INFO(key);
        REQUIRE(e.values.count(key) == 1);
        return e.values[key];
    };
    CHECK(v("vllm:prompt_tokens_total") == n_prompt);
    CHECK(v("vllm:prefix_cache_queries_total") == n_prompt);
    CHECK(v("vllm:prefix_cache_hits_total") == n_cached);
    CHECK(v("vllm:generation_tokens_total") == n_output);
    CHECK(v("vllm:num_preemptions_total") == 0);
    CHECK(v("vllm:request_success_total", "stop") == by_reason["stop"]);
    CHECK(v("vllm:request_success_total", "length") == by_reason["length"]);
    CHECK(v("vllm:request_success_total", "abort") == 0);
    CHECK(v("vllm:time_to_first_token_seconds_count") == (double)results.size());
    CHECK(v("vllm:e2e_request_latency_seconds_count") == (double)results.size());
    CHECK(v("vllm:e2e_request_latency_seconds_sum") == Approx(e2e_s).epsilon(0.01));
    CHECK(v("vllm:request_queue_time_seconds_count") == (double)results.size());
    CHECK(v("vllm:inter_token_latency_seconds_count") == n_gaps);
    CHECK(v("vllm:time_per_output_token_seconds_count") == n_gaps);
    CHECK(v("vllm:request_prefill_time_seconds_count") == (double)results.size());
    CHECK(e.values["vllm:cache_config_info{block_size=\"16\"," + k_solo + ",num_gpu_blocks=\"256\"}"] == 1);
    // The same figures under Steward's names (per bucket) agree.
    CHECK(e.values["steward_prompt_tokens_total{bucket=\"chat\"}"] == n_prompt);
    CHECK(e.values["steward_prefix_cache_hit_tokens_total{bucket=\"chat\"}"] == n_cached);
    // Every vLLM family is typed as vLLM types it.
    CHECK(e.types["vllm:num_requests_waiting"] == "gauge");
    CHECK(e.types["vllm:kv_cache_usage_perc"] == "gauge");
    CHECK(e.types["vllm:gpu_cache_usage_perc"] == "gauge");
    CHECK(e.types["vllm:inter_token_latency_seconds"] == "histogram");
    CHECK(e.types["vllm:request_success_total"] == "counter");
}

TEST_CASE("promtool finds only vLLM's colons in the exposition", "[metrics][vllm][promtool]") {
    const CommandResult which = run_command("command -v promtool");
    if (which.rc != 0) FAIL("promtool is not installed: scripts/setup.sh installs it (Debian's prometheus package)");
    auto rt = start("pool_gauges_promtool.toml", solo_toml(4));
    run_all(*rt, mixed_requests());
    const std::string text = rt->metrics_prometheus();
    const size_t vllm_at = text.find("# HELP vllm:");
    REQUIRE(vllm_at != std::string::npos);
    const std::string dir = two_pool_dir().string();
    std::ofstream(dir + "/exposition_all.prom") << text;
    std::ofstream(dir + "/exposition_steward.prom") << text.substr(0, vllm_at);

    // Steward's own families: clean.
    const CommandResult own = run_command("promtool check metrics < " + dir + "/exposition_steward.prom 2>&1");
    INFO(own.out);
    CHECK(own.rc == 0);
    CHECK(own.out.empty());
    // With vLLM's names: it parses (rc 1 would be a format error), and the one lint finding is the
    // colon in each vllm: name, which vLLM's own /metrics draws as well (rc 3: lint problems).
    const CommandResult all = run_command("promtool check metrics < " + dir + "/exposition_all.prom 2>&1");
    INFO(all.out);
    CHECK(all.rc == 3);
    std::set<std::string> flagged;
    std::istringstream lines(all.out);
    for (std::string line; std::getline(lines, line);) {
        const std::string what = " metric names should not contain ':'";
        REQUIRE(line.size() > what.size());
        CHECK(line.compare(line.size() - what.size(), what.size(), what) == 0);
        CHECK(line.rfind("vllm:", 0) == 0);
        flagged.insert(line.substr(0, line.find(' ')));
    }
    // promtool lints the families that have samples (speculation's, here, have none).
    std::set<std::string> families;
    const PrometheusExposition e = check_prometheus_text(text);
    for (const auto& s : e.series)
        for (const auto& [family, type] : e.types)
            if (family.rfind("vllm:", 0) == 0 && (s.name == family || s.name == family + "_bucket" ||
                                                  s.name == family + "_sum" || s.name == family + "_count"))
                families.insert(family);
    CHECK(flagged == families);
    CHECK(families.size() >= 20);
}

TEST_CASE("A tenant's scrape keeps the per-pool vLLM series", "[metrics][vllm][tenants]") {
    auto rt = start("pool_gauges_tenants.toml", solo_toml(4));
    run_all(*rt, mixed_requests());
    const std::string all = rt->metrics_prometheus();
    const std::string acme = rt->metrics_prometheus_for_tenant("acme");
    PrometheusExposition ea = scrape(all), e = scrape(acme);
    // The aggregates pass unchanged: every vllm: and pool-gauge series of the whole exposition.
    int n_kept = 0;
    for (const auto& s : ea.series)
        if (s.name.rfind("vllm:", 0) == 0 || s.name.rfind("steward_requests_", 0) == 0 ||
            s.name.rfind("steward_kv_cache_", 0) == 0) {
            CHECK(s.labels.count("tenant") == 0);
            ++n_kept;
        }
    int n_seen = 0;
    for (const auto& s : e.series) {
        if (s.labels.count("tenant")) CHECK(s.labels.at("tenant") == "acme");
        if (s.name.rfind("vllm:", 0) == 0 || s.name.rfind("steward_requests_", 0) == 0 ||
            s.name.rfind("steward_kv_cache_", 0) == 0)
            ++n_seen;
    }
    CHECK(n_kept > 0);
    CHECK(n_seen == n_kept);
    CHECK(e.values["vllm:prompt_tokens_total{" + k_solo + "}"] ==
          ea.values["vllm:prompt_tokens_total{" + k_solo + "}"]);
    CHECK(acme.find("tenant=\"beta\"") == std::string::npos);
    CHECK(all.find("tenant=\"beta\"") != std::string::npos);
}

TEST_CASE("Each finished request's trace is one OTLP/JSON line", "[trace][otlp]") {
    const std::string file = two_pool_dir().string() + "/traces.otlp.jsonl";
    std::filesystem::remove(file);
    std::string toml = solo_toml(4);
    toml.insert(toml.find("[[pool]]"), "[tracing]\notlp_file = \"traces.otlp.jsonl\"\n\n");
    auto rt = start("pool_gauges_otlp.toml", toml);
    const auto results = run_all(*rt, mixed_requests());
    rt.reset();  // every line written

    std::ifstream in(file);
    REQUIRE(in.good());
    std::set<std::string> trace_ids;
    size_t n_lines = 0;
    for (std::string line; std::getline(in, line); ++n_lines) {
        const auto j = nlohmann::json::parse(line);
        REQUIRE(j["resourceSpans"].size() == 1);
        const auto& rs = j["resourceSpans"][0];
        CHECK(rs["resource"]["attributes"][0]["value"]["stringValue"] == "steward");
        const auto& spans = rs["scopeSpans"][0]["spans"];
        std::map<std::string, nlohmann::json> by_name;
        for (const auto& s : spans) by_name[s["name"].get<std::string>()] = s;
        for (const char* stage : {"request", "route", "allocate", "reuse", "prefill", "decode", "finish"})
            CHECK(by_name.count(stage) == 1);
        const std::string trace_id = by_name["request"]["traceId"];
        const std::string root = by_name["request"]["spanId"];
        CHECK(trace_id.size() == 32);
        CHECK(root.size() == 16);
        CHECK(trace_ids.insert(trace_id).second);
        std::set<std::string> span_ids;
        for (const auto& s : spans) {
            CHECK(s["traceId"] == trace_id);
            CHECK(span_ids.insert(s["spanId"].get<std::string>()).second);
            if (s["name"] != "request") CHECK(s["parentSpanId"] == root);
            // OTLP/JSON: 64-bit times as decimal strings; each stage inside the request's span.
            const long long t0 = std::stoll(s["startTimeUnixNano"].get<std::string>());
            const long long t1 = std::stoll(s["endTimeUnixNano"].get<std::string>());
            CHECK(t0 <= t1);
            CHECK(t0 >= std::stoll(by_name["request"]["startTimeUnixNano"].get<std::string>()));
            CHECK(t1 <= std::stoll(by_name["request"]["endTimeUnixNano"].get<std::string>()));
            CHECK(t0 > 1'600'000'000'000'000'000LL);  // Unix time, not the runtime's clock
        }
        // The stages follow each other: allocate ends where prefill starts, prefill where decode does.
        CHECK(by_name["allocate"]["endTimeUnixNano"] == by_name["prefill"]["startTimeUnixNano"]);
        CHECK(by_name["prefill"]["endTimeUnixNano"] == by_name["decode"]["startTimeUnixNano"]);
        bool has_reason = false, has_output = false;
        for (const auto& a : by_name["finish"]["attributes"])
            if (a["key"] == "steward.finish_reason")
                has_reason = a["value"]["stringValue"] == "stop" || a["value"]["stringValue"] == "length";
        for (const auto& a : by_name["decode"]["attributes"])
            if (a["key"] == "steward.output_tokens")
                has_output = std::stoll(a["value"]["intValue"].get<std::string>()) > 0;
        CHECK(has_reason);
        CHECK(has_output);
    }
    CHECK(n_lines == results.size());
}
