// Misbehaving plugins through the runtime: a router that sleeps or spins and an evictor that sleeps
// are abandoned at their time budget for the safe default (counted as timed out) while other buckets
// are served; with [plugins] check_in_child a create() that segfaults, a decision that hangs and one
// that leaks fail the start or reload naming the plugin, and the live generation keeps serving.
#include <catch2/catch.hpp>

#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include <steward/runtime.h>

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

// The pools with extra [plugins] keys, and the tests' generous decision budgets for those it does
// not set.
std::string pools_with(const std::string& plugin_keys, TwoPoolOptions o = {}) {
    o.plugin_keys = plugin_keys + "\n";
    for (const std::string k : {"decision_budget_ms", "step_decision_budget_ms"})
        if (("\n" + plugin_keys).find("\n" + k + " ") == std::string::npos) o.plugin_keys += k + " = 60000\n";
    return two_pool_toml(o);
}

struct PolicyRow {
    int64_t decisions = 0, invalid = 0, timed_out = 0;
};
PolicyRow policy_row(Runtime& r, const std::string& bucket, const std::string& kind) {
    auto j = nlohmann::json::parse(r.metrics_json());
    for (const auto& p : j["policies"])
        if (p["bucket"] == bucket && p["kind"] == kind)
            return {p["decisions"].get<int64_t>(), p["invalid_decisions"].get<int64_t>(), p["timed_out_decisions"].get<int64_t>()};
    FAIL("no policies row for bucket " << bucket << " kind " << kind);
    return {};
}

std::vector<GenerationRequest> mixed(int n, const std::string& stuck_hint) {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < n; i++) {
        GenerationRequest q;
        q.bucket_hint = i % 2 ? stuck_hint : "other";
        q.prompt_ids = ids(20, i);
        q.max_tokens = 3;
        reqs.push_back(q);
    }
    return reqs;
}

const char* k_other_bucket = R"(
[[bucket]]
name = "other"
pool = "large"
[bucket.match]
hint = "other"
)";

std::unique_ptr<Runtime> start(const std::string& name, const std::string& text) {
    auto rt = Runtime::start(write_config(name, text));
    if (!rt) FAIL(rt.error().message);
    return std::move(rt.value());
}

}  // namespace

TEST_CASE("a router that sleeps past its budget is answered by the bucket's pool, counted as timed out, while another "
          "bucket is served",
          "[plugin_faults]") {
    std::string t = pools_with("decision_budget_ms = 30");
    t += k_other_bucket;
    t += R"(
[[bucket]]
name = "slow"
pool = "small"
[bucket.match]
hint = "slow"
[bucket.routing]
plugin = "slow_routing"
sleep_ms = 2000
pool = 0
)";
    auto rt = start("slow_router.toml", t);
    const auto reqs = mixed(12, "slow");
    int n_slow = 0, n_other = 0;
    for (const auto& r : run_all(*rt, reqs)) {
        INFO(r.error);
        REQUIRE(r.ok());
        if (r.bucket == "slow") {
            n_slow++;
            CHECK(r.fallback);
            CHECK(r.pool == "small");  // the bucket's pool, not the plugin's late pick (0 = large)
        } else {
            n_other++;
            CHECK_FALSE(r.fallback);
            CHECK(r.pool == "large");
        }
    }
    CHECK(n_slow == 6);
    CHECK(n_other == 6);
    const PolicyRow row = policy_row(*rt, "slow", "routing");
    CHECK(row.timed_out == n_slow);  // the one that overran, and the ones made while it still slept
    CHECK(row.invalid == 0);
    CHECK(row.decisions >= 1);
    CHECK(row.decisions <= n_slow);
    CHECK_THAT(rt->metrics_prometheus(),
               Catch::Contains("steward_plugin_timed_out_decisions_total{bucket=\"slow\",kind=\"routing\",plugin=\"slow_routing\"} " +
                               std::to_string(n_slow)));
}

namespace {
volatile int g_release_spin = 0;  // the spinning router's flag: released at the test's end
}

TEST_CASE("a router stuck in an endless loop costs one budget, then answers the safe default at once, other buckets "
          "are served",
          "[plugin_faults]") {
    g_release_spin = 0;
    std::string t = pools_with("decision_budget_ms = 30");
    t += k_other_bucket;
    t += fmt::format(R"(
[[bucket]]
name = "spin"
pool = "small"
[bucket.match]
hint = "spin"
[bucket.routing]
plugin = "spin_routing"
release_flag = {}
)",
                     (int64_t)(intptr_t)&g_release_spin);
    {
        auto rt = start("spin_router.toml", t);
        const auto reqs = mixed(10, "spin");
        int n_spin = 0;
        for (const auto& r : run_all(*rt, reqs)) {
            REQUIRE(r.ok());
            if (r.bucket == "spin") {
                n_spin++;
                CHECK(r.fallback);
                CHECK(r.pool == "small");
            } else {
                CHECK_FALSE(r.fallback);
            }
        }
        const PolicyRow row = policy_row(*rt, "spin", "routing");
        CHECK(row.decisions == 1);  // the plugin was called once; it never returned while the runtime ran
        CHECK(row.timed_out == n_spin);
    }  // the runtime stops with the call still spinning: its thread is left to it
    g_release_spin = 1;  // lets the abandoned call return, so its thread ends
}

TEST_CASE("an eviction plugin that sleeps inside an engine step falls back to LRU at its budget, every request finishes",
          "[plugin_faults]") {
    TwoPoolOptions o;
    o.kv_blocks = 12;  // tight: requests evict each other's cached blocks
    std::string t = pools_with("step_decision_budget_ms = 5", o);
    t += R"(
[[bucket]]
name = "sleepy"
pool = "small"
[bucket.eviction]
plugin = "slow_eviction"
sleep_ms = 300
)";
    auto rt = start("slow_evict.toml", t);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 16; i++) {
        GenerationRequest q;
        q.prompt_ids = ids(40, i);  // distinct prompts: 3 full blocks each, cached then evicted
        q.max_tokens = 3;
        reqs.push_back(q);
    }
    for (const auto& r : run_all(*rt, reqs)) REQUIRE(r.ok());
    const PolicyRow row = policy_row(*rt, "sleepy", "eviction");
    CHECK(row.timed_out > 0);
    CHECK(row.invalid == 0);
    CHECK(row.decisions >= 1);
}

TEST_CASE("with check_in_child a reload into a plugin whose create() segfaults fails naming it, and the live "
          "generation keeps serving",
          "[plugin_faults]") {
    const std::string base = pools_with("check_in_child = true") + k_other_bucket;
    auto rt = start("crash_reload.toml", base + R"(
[[bucket]]
name = "routed"
pool = "small"
[bucket.routing]
plugin = "param_routing"
pick = 0
)");
    write_config("crash_reload.toml", base + R"(
[[bucket]]
name = "routed"
pool = "small"
[bucket.routing]
plugin = "crash_create"
)");
    auto g = rt->reload();
    REQUIRE_FALSE(g.ok());
    INFO(g.error().message);
    CHECK_THAT(g.error().message, Catch::Contains("plugin 'crash_create'"));
#if defined(__SANITIZE_ADDRESS__)
    // The sanitizers' runtime catches the null store in the child and exits it with an error
    // status instead of letting the signal through: the check still refuses, in other words.
    CHECK_THAT(g.error().message, Catch::Contains("in create()"));
#else
    CHECK_THAT(g.error().message, Catch::Contains("crashed in create()"));
    CHECK_THAT(g.error().message, Catch::Contains("signal 11"));
#endif
    GenerationRequest q;
    q.prompt_ids = ids(10, 1);
    q.max_tokens = 2;
    const auto res = run_all(*rt, {q});
    REQUIRE(res[0].ok());
    CHECK(res[0].bucket == "routed");
}

TEST_CASE("with check_in_child a plugin whose decision hangs fails the start, naming the plugin and the stage",
          "[plugin_faults]") {
    const std::string t = pools_with("check_in_child = true\ncheck_timeout_ms = 3000") + R"(
[[bucket]]
name = "spin"
pool = "small"
[bucket.routing]
plugin = "spin_routing"
)";
    auto rt = Runtime::start(write_config("hang_check.toml", t));
    REQUIRE_FALSE(rt.ok());
    INFO(rt.error().message);
    CHECK_THAT(rt.error().message, Catch::Contains("plugin 'spin_routing'"));
    CHECK_THAT(rt.error().message, Catch::Contains("hung in a decision"));
    CHECK_THAT(rt.error().message, Catch::Contains("check_timeout_ms = 3000"));
}

TEST_CASE("with check_in_child a plugin that leaks per decision fails the start, saying how much it kept",
          "[plugin_faults]") {
    {  // mallinfo2 is glibc's: under a sanitizer's allocator it reads nothing and leaks go unmeasured
        const size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
        void* volatile p = std::malloc(1 << 20);
        const size_t after = mallinfo2().uordblks + mallinfo2().hblkhd;
        std::free(p);
        if (after <= before) {
            WARN("mallinfo2 does not see this allocator; the leak check is not measured here");
            return;
        }
    }
    const std::string t = pools_with("check_in_child = true") + R"(
[[bucket]]
name = "leaky"
pool = "small"
[bucket.routing]
plugin = "leak_routing"
)";
    auto rt = Runtime::start(write_config("leak_check.toml", t));
    REQUIRE_FALSE(rt.ok());
    INFO(rt.error().message);
    CHECK_THAT(rt.error().message, Catch::Contains("plugin 'leak_routing'"));
    CHECK_THAT(rt.error().message, Catch::Contains("its decisions leak"));
}

TEST_CASE("with check_in_child a well-behaved plugin passes the check and decides as usual", "[plugin_faults]") {
    const std::string t = pools_with("check_in_child = true") + R"(
[[bucket]]
name = "routed"
pool = "small"
[bucket.routing]
plugin = "param_routing"
pick = 0
)";
    auto rt = start("ok_check.toml", t);
    GenerationRequest q;
    q.prompt_ids = ids(10, 2);
    q.max_tokens = 2;
    const auto res = run_all(*rt, {q});
    REQUIRE(res[0].ok());
    CHECK(res[0].pool == "large");
    CHECK_FALSE(res[0].fallback);
}
