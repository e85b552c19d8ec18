// isolation = "process" through the runtime: a router that segfaults and an evictor that aborts (in
// their plugin host processes) cost only their own decisions: every request finishes, the runtime stays
// up and the crashes are in the JSON metrics and the Prometheus text; the crashed router's host is
// restarted and routes again; a reload into a plugin whose create() segfaults is refused, naming the
// crash, while the live generation serves.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include <steward/runtime.h>

#include "prometheus_text.h"
#include "run_all.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

namespace {

std::vector<int32_t> ids(int n, int salt) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; i++) v.push_back(1 + (i * 13 + salt * 19) % 500);
    return v;
}

struct PolicyRow {
    int64_t decisions = 0, invalid = 0, crashes = 0, restarts = 0, unavailable = 0;
};
PolicyRow policy_row(Runtime& r, const std::string& bucket, const std::string& kind) {
    auto j = nlohmann::json::parse(r.metrics_json());
    for (const auto& p : j["policies"])
        if (p["bucket"] == bucket && p["kind"] == kind)
            return {p["decisions"].get<int64_t>(), p["invalid_decisions"].get<int64_t>(), p["host_crashes"].get<int64_t>(),
                    p["host_restarts"].get<int64_t>(), p["unavailable_decisions"].get<int64_t>()};
    FAIL("no policies row for bucket " << bucket << " kind " << kind);
    return {};
}

double prom_value(Runtime& r, const std::string& family, const std::string& kind, const std::string& plugin) {
    const PrometheusExposition e = check_prometheus_text(r.metrics_prometheus());
    INFO(e.errors.size() << " exposition errors, first: " << (e.errors.empty() ? "" : e.errors[0]));
    CHECK(e.errors.empty());
    for (const auto& s : e.series)
        if (s.name == family && s.labels.count("kind") && s.labels.at("kind") == kind && s.labels.at("plugin") == plugin) return s.value;
    FAIL("no " << family << " series for " << kind << " plugin " << plugin);
    return -1;
}

std::string config(const std::string& plugin_keys, int kv_blocks, const std::string& buckets) {
    TwoPoolOptions o;
    o.kv_blocks = kv_blocks;
    o.plugin_keys = plugin_keys + "\ndecision_budget_ms = 60000\nstep_decision_budget_ms = 60000\n";
    return two_pool_toml(o) + buckets;
}

std::unique_ptr<Runtime> start(const std::string& name, const std::string& text) {
    auto rt = Runtime::start(write_config(name, text));
    if (!rt) FAIL(rt.error().message);
    return std::move(rt.value());
}

GenerationRequest request(int salt, int n_prompt = 20) {
    GenerationRequest q;
    q.prompt_ids = ids(n_prompt, salt);
    q.max_tokens = 3;
    return q;
}

}  // namespace

TEST_CASE("with isolation = \"process\" a router that segfaults and an evictor that aborts cost only their decisions: "
          "every request finishes, the runtime stays up, and the crashes are in the JSON and Prometheus metrics",
          "[plugin_isolation]") {
    auto rt = start("isolated_crashes.toml", config("isolation = \"process\"", 12, R"(
[[bucket]]
name = "crashy"
pool = "small"
[bucket.routing]
plugin = "segv_routing"
pool = 1
[bucket.eviction]
plugin = "abort_eviction"
)"));
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 16; i++) reqs.push_back(request(i, 40));  // distinct prompts: 3 blocks each, 12 blocks a pool
    for (const auto& r : run_all(*rt, reqs)) {
        INFO(r.error);
        REQUIRE(r.ok());
        CHECK(r.pool == "small");  // the plugin's pick (1) and the bucket's pool agree: fallbacks cannot move it
    }
    const PolicyRow route = policy_row(*rt, "crashy", "routing");
    CHECK(route.decisions == 16);
    CHECK(route.crashes >= 1);  // its 5th decision, and each restarted host's 5th
    CHECK(route.unavailable >= 1);
    CHECK(route.invalid == 0);
    const PolicyRow evict = policy_row(*rt, "crashy", "eviction");
    CHECK(evict.decisions >= 1);
    CHECK(evict.crashes >= 1);  // every host aborts at its first eviction
    CHECK(evict.invalid == 0);
    CHECK(prom_value(*rt, "steward_plugin_crashes_total", "routing", "segv_routing") == (double)route.crashes);
    CHECK(prom_value(*rt, "steward_plugin_crashes_total", "eviction", "abort_eviction") >= 1);
    CHECK(prom_value(*rt, "steward_plugin_unavailable_decisions_total", "routing", "segv_routing") >= 1);

    // Still up: a second round is served too.
    std::vector<GenerationRequest> again;
    for (int i = 16; i < 24; i++) again.push_back(request(i, 40));
    for (const auto& r : run_all(*rt, again)) REQUIRE(r.ok());
}

TEST_CASE("with isolation = \"process\" the host of a router that segfaulted on its 5th decision is restarted, and the "
          "decisions after the restart are the plugin's again",
          "[plugin_isolation]") {
    auto rt = start("isolated_restart.toml", config("isolation = \"process\"", 128, R"(
[[bucket]]
name = "crashy"
pool = "small"
[bucket.routing]
plugin = "segv_routing"
pool = 0
)"));
    // One at a time: decisions 1-4 are the plugin's (pool 0 = large), the 5th kills its host.
    for (int i = 1; i <= 5; i++) {
        const auto res = run_all(*rt, {request(i)});
        INFO("request " << i << ": " << res[0].error);
        REQUIRE(res[0].ok());
        CHECK(res[0].fallback == (i == 5));
        CHECK(res[0].pool == (i == 5 ? "small" : "large"));
    }
    CHECK(policy_row(*rt, "crashy", "routing").crashes == 1);
    // The restart comes after a 100 ms backoff: wait for the event (up to 30 s), not for a time.
    for (int i = 0; i < 3000 && policy_row(*rt, "crashy", "routing").restarts < 1; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(policy_row(*rt, "crashy", "routing").restarts == 1);
    for (int i = 6; i <= 9; i++) {
        const auto res = run_all(*rt, {request(i)});
        REQUIRE(res[0].ok());
        CHECK_FALSE(res[0].fallback);  // the restarted host's own decisions 1-4
        CHECK(res[0].pool == "large");
    }
    const PolicyRow row = policy_row(*rt, "crashy", "routing");
    CHECK(row.decisions == 9);
    CHECK(row.crashes == 1);
    CHECK(row.unavailable == 1);
    CHECK(prom_value(*rt, "steward_plugin_restarts_total", "routing", "segv_routing") == 1);
}

TEST_CASE("a reload into a plugin whose create() segfaults in its plugin host (isolation in the bucket's table) is "
          "refused naming the crash, and the live generation keeps serving",
          "[plugin_isolation]") {
    const std::string base = config("", 128, "");
    auto rt = start("isolated_reload.toml", base + R"(
[[bucket]]
name = "routed"
pool = "small"
[bucket.routing]
plugin = "param_routing"
pick = 0
)");
    write_config("isolated_reload.toml", base + R"(
[[bucket]]
name = "routed"
pool = "small"
[bucket.routing]
plugin = "crash_create"
isolation = "process"
)");
    auto g = rt->reload();
    REQUIRE_FALSE(g.ok());
    INFO(g.error().message);
    CHECK_THAT(g.error().message, Catch::Contains("plugin 'crash_create'") && Catch::Contains("create() crashed in its plugin host process"));
    const auto res = run_all(*rt, {request(1)});
    REQUIRE(res[0].ok());
    CHECK(res[0].bucket == "routed");
    CHECK(res[0].pool == "large");  // param_routing's pick: the old generation
}
