// isolation = "process" (runtime/plugin/plugin_process.*, runtime/plugin_host/): built-in plugins
// decide the same in a plugin host as in-process (every call's inputs cross the wire intact); a host
// that segfaults, aborts or overruns its budget costs that decision the safe default, is counted,
// reaped and restarted, and the restarted host decides again; create()'s errors and crashes reach the
// caller; the config keys.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <thread>

#include "config/config.h"
#include "plugin/plugin_loader.h"
#include "plugin/plugin_process.h"
#include "plugin/policies.h"
#include "test_paths.h"

using namespace steward;

namespace {

const std::vector<std::string> k_pools = {"a", "b", "c"};
const InstanceIsolation k_process{PluginIsolation::PROCESS, 20000};

std::string test_plugin(const std::string& name) { return std::string(STEWARD_TEST_PLUGIN_DIR) + "/" + name + ".so"; }

std::shared_ptr<PluginLibrary> load(const std::string& plugin, PolicyKind kind) {
    PluginLoader loader;
    auto lib = loader.load(plugin, kind, {STEWARD_PLUGIN_BUILD_DIR, STEWARD_TEST_PLUGIN_DIR});
    INFO(plugin << ": " << (lib ? "" : lib.error().message));
    REQUIRE(lib.ok());
    return *lib;
}

PolicySpec spec_of(const std::string& plugin, std::map<std::string, PolicyParam> params = {}) {
    PolicySpec s;
    s.plugin = plugin;
    s.params = std::move(params);
    s.where = "test.toml:1:1";
    return s;
}

template <typename P>
std::unique_ptr<P> make(const std::string& plugin, PolicyKind kind, std::map<std::string, PolicyParam> params,
                        const InstanceIsolation& iso, std::shared_ptr<PolicyCounters> counters = std::make_shared<PolicyCounters>()) {
    auto p = P::create(load(plugin, kind), spec_of(plugin, std::move(params)), "chat", counters, k_pools, iso);
    INFO(plugin << ": " << (p ? "" : p.error().message));
    REQUIRE(p.ok());
    return std::move(*p);
}

std::vector<steward_pool_view> views(int variant) {
    std::vector<steward_pool_view> v(3);
    const char* names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        v[i].name = names[i];
        v[i].available = !(variant == 2 && i == 0);
        v[i].n_layers = 4 * (i + 1);
        v[i].n_params = 1e6 * (i + 1);
        v[i].price_prompt = 0.1 * (3 - i);
        v[i].price_output = 0.2 * (3 - i);
        v[i].est_cost = 0.001 * (3 - i + variant);
        v[i].est_latency_ms = 100.0 * (i + 1) + 37 * variant;
        v[i].est_ttft_ms = 10.0 * (i + variant);
        v[i].est_tpot_ms = 5.0 * (i + 1);
        v[i].quality = 0.3 * (i + 1);
        v[i].risk = 0.1 * variant;
        v[i].n_waiting = (i * 3 + variant) % 5;
        v[i].n_running = (i + variant) % 3;
    }
    return v;
}

RouteInput request(int variant) {
    RouteInput r;
    r.request_id = 100 + variant;
    r.bucket = "chat";
    r.tenant = "t" + std::to_string(variant % 2);
    r.n_prompt_tokens = 40 + 30 * variant;
    r.max_tokens = 20;
    r.session = variant % 2 ? "s1" : "";
    r.session_pool = variant % 3 - 1;
    r.n_cached_prompt_tokens = {0, 32 * variant, 16};
    for (int i = 0; i < 3; i++) {
        RouteInput::PoolLoad l;
        l.n_kv_blocks_used = (i * 7 + variant * 5) % 20;
        l.n_kv_blocks_total = 64;
        l.block_size = 16;
        l.n_inflight = (i + 2 * variant) % 4;
        l.worker = "w" + std::to_string(i) + ":1";
        r.pool_loads.push_back(l);
    }
    return r;
}

// Waits (up to 30 s: a wait for an event, not a timing assertion) until the instance's host is up.
bool wait_up(const PolicyInstance& p) {
    for (int i = 0; i < 3000 && p.process()->pid() < 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return p.process()->pid() > 0;
}

bool reaped(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Waits (up to 30 s, for the event) until pid is gone: reaped, not a zombie.
bool wait_reaped(pid_t pid) {
    for (int i = 0; i < 3000 && !reaped(pid); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return reaped(pid);
}

}  // namespace

TEST_CASE("built-in plugins decide the same in a plugin host as in-process, for every kind and input", "[plugin_process]") {
    SECTION("routing: cost_quality and kv_aware see the same pools, contexts and loads") {
        for (const std::string name : {"cost_quality", "kv_aware"}) {
            auto local = make<RoutingPolicy>(name, PolicyKind::ROUTING, {}, {});
            auto remote = make<RoutingPolicy>(name, PolicyKind::ROUTING, {}, k_process);
            REQUIRE(remote->isolated());
            std::vector<int32_t> picks;
            for (int v = 0; v < 6; v++) {
                bool f1 = true, f2 = true;
                const auto a = local->route(request(v), views(v % 3), 1, &f1);
                const auto b = remote->route(request(v), views(v % 3), 1, &f2);
                INFO(name << " variant " << v);
                CHECK(a.pool == b.pool);
                CHECK(a.upgrade_pool == b.upgrade_pool);
                CHECK(a.shadow_pool == b.shadow_pool);
                CHECK(f1 == f2);
                CHECK_FALSE(f2);
                picks.push_back(b.pool);
            }
            CHECK(remote->counters()->n_calls.load() == 6);
            CHECK(remote->counters()->n_crashed.load() == 0);
        }
    }
    SECTION("eviction: lfu, cost_aware and tenant_fair see the same candidates, tenants and names") {
        std::vector<EvictionCandidate> cands;
        for (int i = 0; i < 8; i++) {
            EvictionCandidate e;
            e.block = 10 + i;
            e.tenant = i % 3;
            e.depth = (i * 5) % 7;
            e.last_access_tick = i;
            e.n_hits = (i * 11) % 6;
            cands.push_back(e);
        }
        const std::vector<TenantBlocks> tenants = {{0, 30, 8}, {1, 4, -1}, {2, 12, 10}};
        const std::vector<std::string> names = {"acme", "beta", "corp"};
        EvictionContext ctx;
        ctx.now_tick = 20;
        ctx.n_blocks_total = 64;
        ctx.block_size = 16;
        ctx.block_bytes = 4096;
        ctx.requesting_tenant = 1;
        ctx.tenants = tenants;
        ctx.tenant_names = &names;
        for (const std::string name : {"lfu", "cost_aware", "tenant_fair"}) {
            auto local = make<PluginEvictionPolicy>(name, PolicyKind::EVICTION, {}, {});
            auto remote = make<PluginEvictionPolicy>(name, PolicyKind::EVICTION, {}, k_process);
            INFO(name);
            const size_t a = local->choose_victim(ctx, cands);
            CHECK(a == remote->choose_victim(ctx, cands));
            CHECK(remote->counters()->n_calls.load() == 1);
            CHECK(remote->counters()->n_invalid.load() == 0);
        }
    }
    SECTION("speculation: adaptive and fixed see the same sequence, acceptance arrays and timings") {
        const std::vector<double> acc = {0.9, 0.7, 0.4, -1}, bucket_acc = {0.8, 0.6, 0.5, 0.3};
        for (const std::string name : {"adaptive", "fixed"}) {
            auto local = make<SpeculationPolicy>(name, PolicyKind::SPECULATION, {}, {});
            auto remote = make<SpeculationPolicy>(name, PolicyKind::SPECULATION, {}, k_process);
            for (int v = 0; v < 5; v++) {
                SpecSeqStats q;
                q.request_id = 9;
                q.bucket = "chat";
                q.tenant = "t";
                q.max_budget = 6;
                q.last_budget = v % 3;
                q.position = 40 + v;
                q.n_generated = 10 + v;
                q.max_tokens = 64;
                q.batch_size = 1 + v;
                q.n_steps = 8 + v;
                q.n_proposed = 20;
                q.n_accepted = 14 - v;
                q.recent_acceptance = 0.6;
                q.accept_pos = acc.data();
                q.n_accept_pos = (uint32_t)acc.size();
                q.bucket_accept_pos = bucket_acc.data();
                q.n_bucket_accept_pos = (uint32_t)bucket_acc.size();
                q.draft_ms_per_token = 0.5;
                q.verify_ms = 10 + v;
                q.verify_ms_per_token = 0.2;
                q.plain_step_ms = 9;
                q.draft_source = STEWARD_SPEC_SOURCE_DRAFT;
                bool f1 = true, f2 = true;
                INFO(name << " step " << v);
                CHECK(local->draft_budget_seq(q, &f1) == remote->draft_budget_seq(q, &f2));
                CHECK(f1 == f2);
            }
            CHECK(remote->counters()->n_calls.load() == 5);
        }
    }
}

TEST_CASE("a router that segfaults on its 5th decision in its plugin host costs that decision the bucket's pool, the "
          "host is reaped and restarted, and the restarted host decides again",
          "[plugin_process]") {
    auto counters = std::make_shared<PolicyCounters>();
    auto p = make<RoutingPolicy>(test_plugin("segv_routing"), PolicyKind::ROUTING, {{"pool", int64_t(2)}}, k_process, counters);
    const pid_t first = p->process()->pid();
    REQUIRE(first > 0);
    for (int i = 1; i <= 4; i++) {
        bool fallback = true;
        CHECK(p->route(request(0), views(0), 1, &fallback).pool == 2);  // the plugin's pick
        CHECK_FALSE(fallback);
    }
    bool fallback = false;
    CHECK(p->route(request(0), views(0), 1, &fallback).pool == 1);  // the 5th: the host dies, the bucket's pool
    CHECK(fallback);
    CHECK(counters->n_crashed.load() == 1);
    CHECK(counters->n_unavailable.load() == 1);
    CHECK(counters->n_invalid.load() == 0);
    CHECK(reaped(first));  // killed and waited for: no zombie left behind

    REQUIRE(wait_up(*p));
    CHECK(p->process()->pid() != first);
    CHECK(counters->n_restarts.load() == 1);
    // Decisions 6+ come from the restarted host (a fresh instance: it counts to 5 again).
    for (int i = 1; i <= 4; i++) {
        CHECK(p->route(request(1), views(0), 1, &fallback).pool == 2);
        CHECK_FALSE(fallback);
    }
    CHECK(counters->n_calls.load() == 9);
    CHECK(counters->n_crashed.load() == 1);
    const pid_t second = p->process()->pid();
    p.reset();
    CHECK(wait_reaped(second));  // the instance's end ends its host, and a reaper waits for it
}

TEST_CASE("isolated instances leave no descriptor and no process behind, after crashes and restarts too",
          "[plugin_process]") {
    auto n_fds = [] {
        int n = 0;
        for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n++;
        return n;
    };
    auto lib = load(test_plugin("segv_routing"), PolicyKind::ROUTING);  // loaded first: its copy's fd is not counted
    const int before = n_fds();
    std::vector<pid_t> pids;
    {
        auto p = RoutingPolicy::create(lib, spec_of(test_plugin("segv_routing"), {{"crash_at", int64_t(1)}}), "chat",
                                       std::make_shared<PolicyCounters>(), k_pools, k_process);
        REQUIRE(p.ok());
        for (int round = 0; round < 2; round++) {
            REQUIRE(wait_up(**p));
            pids.push_back((*p)->process()->pid());
            bool fallback = false;
            (*p)->route(request(0), views(0), 1, &fallback);  // crash_at = 1: every host dies at once
            CHECK(fallback);
        }
    }
    CHECK(n_fds() == before);
    for (pid_t pid : pids) CHECK(reaped(pid));
}

TEST_CASE("an evictor that aborts in its plugin host falls back to LRU, counted, and decisions while it is down take "
          "LRU at once",
          "[plugin_process]") {
    auto counters = std::make_shared<PolicyCounters>();
    auto p = make<PluginEvictionPolicy>(test_plugin("abort_eviction"), PolicyKind::EVICTION, {}, k_process, counters);
    std::vector<EvictionCandidate> cands(4);
    for (int i = 0; i < 4; i++) cands[i].block = i, cands[i].last_access_tick = i;
    EvictionContext ctx;
    ctx.n_blocks_total = 8;
    CHECK(p->choose_victim(ctx, cands) == 0);
    CHECK(counters->n_crashed.load() == 1);
    // Down (restarting after 100 ms, or already back and aborting again): LRU either way, never a hang.
    CHECK(p->choose_victim(ctx, cands) == 0);
    CHECK(counters->n_unavailable.load() == 2);
    CHECK(counters->n_invalid.load() == 0);
}

TEST_CASE("a router that sleeps past its budget in its plugin host is killed, answered by the safe default, counted as "
          "timed out, and restarted",
          "[plugin_process]") {
    auto counters = std::make_shared<PolicyCounters>();
    auto p = make<RoutingPolicy>(test_plugin("slow_routing"), PolicyKind::ROUTING, {{"sleep_ms", int64_t(60000)}, {"pool", int64_t(0)}},
                                 k_process, counters);
    p->set_budget_ms(50);
    const pid_t first = p->process()->pid();
    bool fallback = false;
    CHECK(p->route(request(0), views(0), 1, &fallback).pool == 1);
    CHECK(fallback);
    CHECK(counters->n_timed_out.load() == 1);
    CHECK(counters->n_crashed.load() == 1);
    CHECK(reaped(first));
    REQUIRE(wait_up(*p));
    CHECK(counters->n_restarts.load() == 1);
}

TEST_CASE("create() in a plugin host: a crash is refused naming it, an unknown parameter with the in-process message",
          "[plugin_process]") {
    auto crash = RoutingPolicy::create(load(test_plugin("crash_create"), PolicyKind::ROUTING), spec_of(test_plugin("crash_create")),
                                       "chat", std::make_shared<PolicyCounters>(), k_pools, k_process);
    REQUIRE_FALSE(crash.ok());
    CHECK_THAT(crash.error().message, Catch::Contains("create() crashed in its plugin host process") &&
                                          Catch::Contains("crash_create") && Catch::Contains("bucket 'chat'"));

    const PolicySpec bad = spec_of("cost_quality", {{"lambda_typo", 1.0}});
    auto local = RoutingPolicy::create(load("cost_quality", PolicyKind::ROUTING), bad, "chat", std::make_shared<PolicyCounters>(), k_pools);
    auto remote = RoutingPolicy::create(load("cost_quality", PolicyKind::ROUTING), bad, "chat", std::make_shared<PolicyCounters>(),
                                        k_pools, k_process);
    REQUIRE_FALSE(local.ok());
    REQUIRE_FALSE(remote.ok());
    CHECK(remote.error().message == local.error().message);
    CHECK_THAT(remote.error().message, Catch::Contains("unknown parameter 'lambda_typo'"));
}

TEST_CASE("[plugins] isolation and a policy table's isolation are parsed, another value is refused naming the key and "
          "the allowed values",
          "[plugin_process]") {
    const std::string pools = R"(
[[pool]]
name = "a"
model = "m.gguf"
)";
    auto ok = parse_config(pools + R"(
[plugins]
isolation = "process"
[[bucket]]
name = "chat"
[bucket.routing]
plugin = "rules"
isolation = "in_process"
)",
                           "iso.toml");
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok.ok());
    CHECK(ok->plugins.isolation == PluginIsolation::PROCESS);
    REQUIRE(ok->buckets[0].routing);
    CHECK(ok->buckets[0].routing->isolation == PluginIsolation::IN_PROCESS);
    CHECK(ok->buckets[0].routing->params.count("isolation") == 0);  // not a plugin parameter

    auto bad = parse_config(pools + "[plugins]\nisolation = \"sandbox\"\n", "iso.toml");
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.error().message, Catch::Contains("isolation") && Catch::Contains("\"sandbox\"") &&
                                        Catch::Contains("\"in_process\"") && Catch::Contains("\"process\""));
}

TEST_CASE("every truncation of a call's frame is refused by the decoder, never read past, an answer of the wrong size "
          "is garbage",
          "[plugin_process]") {
    PluginCall c;
    c.in = request(1);
    const auto pools = views(1);
    c.pools = pools;
    c.point_route_views(pools.size());
    c.d = steward_route_decision{1, -1, 0, -1};
    for (int i = 0; i < 3; i++) c.cands.push_back(steward_evict_candidate{i, i, 0, i, i, i});
    c.tenants = {{0, 3, -1}, {1, 2, 4}};
    c.tenant_name_store = {"acme", "beta"};
    c.tenant_names = {c.tenant_name_store[0].c_str(), c.tenant_name_store[1].c_str()};
    c.ecx = steward_evict_context{5, 64, 16, 4096, 1, c.tenants.data(), 2};
    c.erq = steward_evict_request{sizeof(steward_evict_request), "chat", "beta", c.tenant_names.data()};
    c.spec_accept = {0.9, 0.5};
    c.seq.size = sizeof c.seq;
    c.seq.bucket = "chat";
    c.seq.tenant = "t";
    c.seq.accept_pos = c.spec_accept.data();
    c.seq.n_accept_pos = 2;
    for (PluginOp op : {PluginOp::ROUTE, PluginOp::ON_OUTCOME, PluginOp::CHOOSE_VICTIM, PluginOp::DRAFT_BUDGET}) {
        WireWriter w;
        c.encode_inputs(op, w);
        const std::string frame = w.buf.substr(1);  // without the op byte, as the host reads it
        {
            PluginCall d;
            WireReader r(frame);
            INFO(plugin_op_name(op));
            REQUIRE(d.decode_inputs(op, r));
            CHECK(r.left() == 0);
            if (op == PluginOp::ROUTE) {
                CHECK(d.pools.size() == 3);
                CHECK(std::string(d.pools[2].name) == "c");
                CHECK(std::string(d.req.bucket) == "chat");
                CHECK(std::string(d.ctx.loads[1].worker) == "w1:1");
                CHECK(d.ctx.pools[1].n_cached_prompt_tokens == 32);
            }
            if (op == PluginOp::CHOOSE_VICTIM) {
                CHECK(std::string(d.erq.tenant_names[1]) == "beta");
                CHECK(d.ecx.tenants == d.tenants.data());
            }
            if (op == PluginOp::DRAFT_BUDGET) CHECK(d.seq.accept_pos[1] == 0.5);
        }
        for (size_t n = 0; n < frame.size(); n++) {
            PluginCall d;
            const std::string cut = frame.substr(0, n);
            WireReader r(cut);
            INFO(plugin_op_name(op) << " cut at " << n << " of " << frame.size());
            CHECK_FALSE(d.decode_inputs(op, r));
        }
    }
    WireWriter answer;
    c.encode_result(PluginOp::ROUTE, answer);
    PluginCall d;
    WireReader exact(answer.buf);
    CHECK(d.decode_result(PluginOp::ROUTE, exact));
    const std::string longer = answer.buf + "x";
    WireReader more(longer);
    CHECK_FALSE(d.decode_result(PluginOp::ROUTE, more));
    const std::string shorter = answer.buf.substr(0, answer.buf.size() - 1);
    WireReader less(shorter);
    CHECK_FALSE(d.decode_result(PluginOp::ROUTE, less));
}
