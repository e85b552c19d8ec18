// The kv_aware and round_robin routing plugins (plugins/routing/), driven through the runtime's
// RoutingPolicy (so RouteInput::pool_loads -> ctx->loads is exercised too) and, for the ABI gates,
// through their raw table. kv_aware's decisions are checked against a naive C++ restatement of its
// rules over random pools, and on hand-worked cases.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <steward/policy.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "plugin/plugin_loader.h"
#include "plugin/policies.h"

using namespace steward;

namespace {

std::string builtin(const std::string& name) {
    return std::string(STEWARD_PLUGIN_BUILD_DIR) + "/steward_routing_" + name + ".so";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::shared_ptr<PluginLibrary> open_ok(const std::string& name) {
    auto lib = PluginLibrary::open(builtin(name), PolicyKind::ROUTING);
    INFO(name << ": " << (lib ? "" : lib.error().message));
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

std::unique_ptr<RoutingPolicy> router(const std::shared_ptr<PluginLibrary>& lib, const PolicySpec& spec,
                                      const std::vector<std::string>& pool_names) {
    auto p = RoutingPolicy::create(lib, spec, "chat", std::make_shared<PolicyCounters>(), pool_names);
    INFO(spec.plugin << ": " << (p ? "" : p.error().message));
    REQUIRE(p.ok());
    return std::move(*p);
}

std::string create_error(const std::shared_ptr<PluginLibrary>& lib, const PolicySpec& spec,
                         const std::vector<std::string>& pool_names) {
    auto p = RoutingPolicy::create(lib, spec, "chat", std::make_shared<PolicyCounters>(), pool_names);
    REQUIRE_FALSE(p.ok());
    return p.error().message;
}

// Pool views with stable name storage (steward_pool_view holds a char pointer).
struct Pools {
    std::vector<std::string> names;
    std::vector<steward_pool_view> views;
    explicit Pools(size_t n) {
        for (size_t i = 0; i < n; i++) names.push_back(std::string(1, char('a' + i)));
        views.resize(n);
        for (size_t i = 0; i < n; i++) {
            views[i] = steward_pool_view{};
            views[i].name = names[i].c_str();
            views[i].available = 1;
            views[i].n_layers = 4;
            views[i].n_params = 1e6;
        }
    }
};

RouteInput request(int32_t n_prompt, int32_t max_tokens, int32_t session_pool = -1) {
    RouteInput r;
    r.request_id = 11;
    r.bucket = "chat";
    r.tenant = "t";
    r.n_prompt_tokens = n_prompt;
    r.max_tokens = max_tokens;
    r.session = session_pool >= 0 ? "s1" : "";
    r.session_pool = session_pool;
    return r;
}

RouteInput::PoolLoad load(int32_t used, int32_t inflight, int32_t block_size = 16) {
    RouteInput::PoolLoad l;
    l.n_kv_blocks_used = used;
    l.n_kv_blocks_total = 1000;
    l.block_size = block_size;
    l.n_inflight = inflight;
    l.worker = "10.0.0.1:7000";
    return l;
}

int32_t pick(RoutingPolicy& r, const RouteInput& in, const Pools& p, int32_t default_pool = 0) {
    bool fallback = false;
    const steward_route_decision d = r.route(in, p.views, default_pool, &fallback);
    CHECK(d.upgrade_pool == -1);
    CHECK(d.shadow_pool == -1);
    return d.pool;
}

// kv_aware's rules restated as plainly as possible (see docs/plugin-abi.md, "Built-in plugins").
struct Knobs {
    std::string pools;  // "" every pool
    double prefill_weight = 1.0, balance_abs = 4.0, balance_rel = 1.5;
    bool session_sticky = true;
};

// The pool, and which rule chose it.
enum class Rule { DEFAULT, SESSION, LEAST_LOADED, COST };
struct Choice {
    int32_t pool;
    Rule rule;
};

Choice reference_kv_aware(const Knobs& k, const std::vector<std::string>& names, const RouteInput& in,
                          const std::vector<steward_pool_view>& views, int32_t default_pool) {
    std::set<int32_t> candidates;
    for (size_t at = 0; !k.pools.empty() && at <= k.pools.size();) {
        size_t end = k.pools.find(',', at);
        if (end == std::string::npos) end = k.pools.size();
        const std::string name = k.pools.substr(at, end - at);
        candidates.insert(int32_t(std::find(names.begin(), names.end(), name) - names.begin()));
        at = end + 1;
    }
    struct Row {
        int32_t pool;
        double load, cost;
    };
    std::vector<Row> rows;
    for (int32_t i = 0; i < int32_t(views.size()); i++) {
        if ((!candidates.empty() && !candidates.count(i)) || !views[i].available) continue;
        RouteInput::PoolLoad l;  // unknown unless the input has it
        l.n_inflight = -1;
        if (size_t(i) < in.pool_loads.size()) l = in.pool_loads[i];
        const int32_t block = l.block_size > 0 ? l.block_size : 16;
        const int32_t cached =
            size_t(i) < in.n_cached_prompt_tokens.size() ? std::max(0, in.n_cached_prompt_tokens[i]) : 0;
        const int32_t uncached = std::max(0, in.n_prompt_tokens - cached);
        const int32_t prefill_blocks = (uncached + block - 1) / block;
        const double load = l.n_inflight >= 0 ? l.n_inflight : views[i].n_waiting + views[i].n_running;
        const int32_t request_blocks = (in.n_prompt_tokens + in.max_tokens + block - 1) / block;
        const double decode_blocks = l.n_kv_blocks_used >= 0 ? l.n_kv_blocks_used : load * request_blocks;
        rows.push_back({i, load, k.prefill_weight * prefill_blocks + decode_blocks});
    }
    if (rows.empty()) return {default_pool, Rule::DEFAULT};
    auto by_load = [](const Row& a, const Row& b) { return a.load < b.load; };
    const Row& least = *std::min_element(rows.begin(), rows.end(), by_load);
    const double max_load = std::max_element(rows.begin(), rows.end(), by_load)->load;
    if (k.session_sticky)
        for (const Row& r : rows)
            if (r.pool == in.session_pool && r.load <= k.balance_rel * least.load + k.balance_abs)
                return {r.pool, Rule::SESSION};
    if (max_load - least.load > k.balance_abs && max_load > k.balance_rel * least.load)
        return {least.pool, Rule::LEAST_LOADED};
    auto by_cost = [](const Row& a, const Row& b) { return a.cost < b.cost; };
    return {std::min_element(rows.begin(), rows.end(), by_cost)->pool, Rule::COST};
}

// A host API whose every parameter is absent, for calls through the raw table.
int absent_double(const steward_params*, const char*, double*) { return STEWARD_PLUGIN_ERR_NOT_FOUND; }
int absent_int(const steward_params*, const char*, int64_t*) { return STEWARD_PLUGIN_ERR_NOT_FOUND; }
int absent_bool(const steward_params*, const char*, int*) { return STEWARD_PLUGIN_ERR_NOT_FOUND; }
int absent_string(const steward_params*, const char*, const char**) { return STEWARD_PLUGIN_ERR_NOT_FOUND; }
void quiet_log(const steward_params*, int, const char*) {}
int no_pool(const steward_params*, const char*, int32_t*) { return STEWARD_PLUGIN_ERR_NOT_FOUND; }
const steward_host_api kAbsentHost = {STEWARD_HOST_API_VERSION, sizeof(steward_host_api), absent_double, absent_int,
                                      absent_bool, absent_string, quiet_log, no_pool};

}  // namespace

TEST_CASE("kv_aware and round_robin are routing plugins of this ABI under their own names", "[kv_aware]") {
    for (const char* name : {"kv_aware", "round_robin"}) {
        INFO(name);
        auto lib = open_ok(name);
        CHECK(lib->name() == name);
        CHECK(lib->abi_version() == STEWARD_POLICY_ABI_VERSION);
        CHECK(lib->info().description != nullptr);
    }
    CHECK(open_ok("kv_aware")->routing()->route_v2 != nullptr);
}

TEST_CASE("kv_aware picks as a naive restatement of its cost and balance rules does, over random pools and loads",
          "[kv_aware]") {
    auto lib = open_ok("kv_aware");
    std::mt19937 rng(20240611);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    // Weights exact in binary, so the plugin's and the reference's sums agree to the bit (ties included).
    const double weights[] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0};
    const double rels[] = {1.0, 1.25, 1.5, 2.0};
    std::map<Rule, int> n_by_rule;
    for (int c = 0; c < 1000; c++) {
        const size_t n = size_t(uniform(1, 6));
        Pools p(n);
        Knobs k;
        std::map<std::string, PolicyParam> params;
        if (uniform(0, 1) == 0) {  // a subset of the pools, in any order
            std::vector<std::string> some;
            for (const auto& name : p.names)
                if (uniform(0, 1)) some.push_back(name);
            if (some.empty()) some.push_back(p.names[0]);
            std::shuffle(some.begin(), some.end(), rng);
            for (const auto& name : some) k.pools += (k.pools.empty() ? "" : ",") + name;
            params["pools"] = k.pools;
        }
        if (uniform(0, 1)) params["prefill_weight"] = k.prefill_weight = weights[uniform(0, 5)];
        if (uniform(0, 1)) params["balance_abs"] = int64_t(k.balance_abs = uniform(0, 8));
        if (uniform(0, 1)) params["balance_rel"] = k.balance_rel = rels[uniform(0, 3)];
        if (uniform(0, 1)) params["session_sticky"] = k.session_sticky = uniform(0, 1) == 1;
        auto r = router(lib, spec_of("kv_aware", params), p.names);

        RouteInput in = request(uniform(0, 2000), uniform(0, 500), uniform(-1, int(n) - 1));
        for (size_t i = 0; i < n; i++) {
            p.views[i].available = uniform(0, 2) != 0;
            p.views[i].n_waiting = uniform(0, 10);
            p.views[i].n_running = uniform(0, 10);
        }
        const size_t n_cached = size_t(uniform(0, int(n)));  // shorter: the rest unknown
        for (size_t i = 0; i < n_cached; i++) in.n_cached_prompt_tokens.push_back(uniform(-1, in.n_prompt_tokens + 50));
        const size_t n_loads = size_t(uniform(0, int(n)));  // shorter: the rest unknown
        for (size_t i = 0; i < n_loads; i++)
            in.pool_loads.push_back(load(uniform(0, 3) ? uniform(0, 400) : -1, uniform(-1, 20),
                                         std::vector<int32_t>{0, 8, 16, 32}[size_t(uniform(0, 3))]));
        // The host's default is an available pool (one is always left), so no answer here is invalid.
        const int32_t default_pool = uniform(0, int(n) - 1);
        p.views[size_t(default_pool)].available = 1;

        const Choice expected = reference_kv_aware(k, p.names, in, p.views, default_pool);
        INFO("case " << c << ": pools '" << k.pools << "', " << n << " pools, expected " << expected.pool
                     << " by rule " << int(expected.rule));
        bool fallback = true;
        CHECK(r->route(in, p.views, default_pool, &fallback).pool == expected.pool);
        CHECK_FALSE(fallback);
        n_by_rule[expected.rule]++;
    }
    // The cases reach every rule often enough to mean something.
    for (Rule rule : {Rule::DEFAULT, Rule::SESSION, Rule::LEAST_LOADED, Rule::COST}) {
        INFO("rule " << int(rule) << ": " << n_by_rule[rule] << " cases");
        CHECK(n_by_rule[rule] >= 30);
    }
}

TEST_CASE("kv_aware goes where the prompt's prefix is cached while the loads are balanced, and to the least loaded "
          "pool when they are not",
          "[kv_aware]") {
    auto lib = open_ok("kv_aware");
    Pools p(2);
    auto r = router(lib, spec_of("kv_aware"), p.names);
    RouteInput in = request(100, 50);
    in.n_cached_prompt_tokens = {-1, 96};
    // a: 7 prefill blocks + 10 busy = 17; b: 1 + 12 = 13.
    in.pool_loads = {load(10, 1), load(12, 4)};
    CHECK(pick(*r, in, p) == 1);
    // Without the cache b costs 7 + 12: a.
    in.n_cached_prompt_tokens = {};
    CHECK(pick(*r, in, p) == 0);
    // b's 8 in flight against a's 1: 7 > balance_abs 4 and 8 > 1.5 x 1, so the least loaded, cache or not.
    in.n_cached_prompt_tokens = {-1, 96};
    in.pool_loads = {load(10, 1), load(12, 8)};
    CHECK(pick(*r, in, p) == 0);
    // A larger balance_abs tolerates it.
    auto tolerant = router(lib, spec_of("kv_aware", {{"balance_abs", int64_t(10)}}), p.names);
    CHECK(pick(*tolerant, in, p) == 1);
    // prefill_weight 0: the cache counts for nothing, the busy blocks decide.
    auto no_prefill = router(lib, spec_of("kv_aware", {{"prefill_weight", 0.0}}), p.names);
    in.pool_loads = {load(10, 1), load(12, 4)};
    CHECK(pick(*no_prefill, in, p) == 0);
}

TEST_CASE("kv_aware keeps an agent session on the pool holding its KV until that pool is overloaded", "[kv_aware]") {
    auto lib = open_ok("kv_aware");
    Pools p(3);
    auto sticky = router(lib, spec_of("kv_aware"), p.names);
    auto loose = router(lib, spec_of("kv_aware", {{"session_sticky", false}}), p.names);
    RouteInput in = request(100, 50, /*session_pool=*/0);
    // a is the session's pool but the most expensive: 7 + 300 busy blocks against 7 + 20.
    in.pool_loads = {load(300, 7), load(20, 2), load(20, 2)};
    // 7 in flight <= 1.5 x 2 + 4: stays.
    CHECK(pick(*sticky, in, p) == 0);
    CHECK(pick(*loose, in, p) == 1);
    // 8 > 7: overloaded, so the session leaves (the loads are imbalanced too: the least loaded, b).
    in.pool_loads[0].n_inflight = 8;
    CHECK(pick(*sticky, in, p) == 1);
    // The session's pool draining: routed as a new request.
    in.pool_loads[0].n_inflight = 2;
    p.views[0].available = 0;
    CHECK(pick(*sticky, in, p) == 1);
    // The session's pool outside `pools`: not a candidate, so not kept.
    p.views[0].available = 1;
    auto others = router(lib, spec_of("kv_aware", {{"pools", std::string("b, c")}}), p.names);
    CHECK(pick(*others, in, p) == 1);
}

TEST_CASE("kv_aware and round_robin skip unavailable pools and keep the host's default when no candidate is available",
          "[kv_aware]") {
    Pools p(3);
    for (const char* name : {"kv_aware", "round_robin"}) {
        INFO(name);
        auto lib = open_ok(name);
        auto r = router(lib, spec_of(name, {{"pools", std::string("a,b")}}), p.names);
        RouteInput in = request(100, 50);
        p.views[0].available = 0;
        for (int i = 0; i < 5; i++) CHECK(pick(*r, in, p, 2) == 1);
        p.views[1].available = 0;
        bool fallback = true;
        CHECK(r->route(in, p.views, 2, &fallback).pool == 2);  // c is available but not a candidate
        CHECK_FALSE(fallback);
        p.views[0].available = p.views[1].available = 1;
    }
    // Among every pool (no `pools`), kv_aware never picks an unavailable one, however cheap.
    auto lib = open_ok("kv_aware");
    auto r = router(lib, spec_of("kv_aware"), p.names);
    RouteInput in = request(100, 50);
    in.pool_loads = {load(0, 0), load(50, 1), load(60, 1)};
    p.views[0].available = 0;
    CHECK(pick(*r, in, p) == 1);
}

TEST_CASE("kv_aware and round_robin refuse an unknown pool name in `pools` at create, naming it", "[kv_aware]") {
    const std::vector<std::string> names = {"a", "b", "c"};
    for (const char* name : {"kv_aware", "round_robin"}) {
        INFO(name);
        auto lib = open_ok(name);
        const std::string err = create_error(lib, spec_of(name, {{"pools", std::string("a, nope")}}), names);
        CHECK(contains(err, "'pools'"));
        CHECK(contains(err, "\"nope\""));
        CHECK(contains(create_error(lib, spec_of(name, {{"pools", std::string("a,,b")}}), names), "empty pool name"));
        CHECK(contains(create_error(lib, spec_of(name, {{"pools", int64_t(3)}}), names), "'pools'"));
        router(lib, spec_of(name, {{"pools", std::string("")}}), names);  // "": every pool
    }
    auto lib = open_ok("kv_aware");
    CHECK(contains(create_error(lib, spec_of("kv_aware", {{"balance_rel", 0.5}}), names), "'balance_rel'"));
    CHECK(contains(create_error(lib, spec_of("kv_aware", {{"prefill_weight", -1.0}}), names), "'prefill_weight'"));
    CHECK(contains(create_error(lib, spec_of("kv_aware", {{"balance_abs", -1.0}}), names), "'balance_abs'"));
    CHECK(contains(create_error(lib, spec_of("kv_aware", {{"session_sticky", int64_t(1)}}), names),
                   "'session_sticky'"));
}

TEST_CASE("round_robin cycles evenly over the available candidates", "[kv_aware]") {
    auto lib = open_ok("round_robin");
    Pools p(5);
    p.views[2].available = 0;
    auto r = router(lib, spec_of("round_robin", {{"pools", std::string("e,a,c,b")}}), p.names);
    RouteInput in = request(100, 50);
    std::vector<int> counts(5, 0);
    std::vector<int32_t> order;
    for (int i = 0; i < 300; i++) {
        const int32_t d = pick(*r, in, p, 3);
        counts[size_t(d)]++;
        if (i < 6) order.push_back(d);
    }
    CHECK(order == std::vector<int32_t>{0, 1, 4, 0, 1, 4});
    CHECK(counts[2] == 0);  // unavailable
    CHECK(counts[3] == 0);  // not a candidate
    const int lo = std::min({counts[0], counts[1], counts[4]}), hi = std::max({counts[0], counts[1], counts[4]});
    CHECK(hi - lo <= 1);
    CHECK(counts[0] + counts[1] + counts[4] == 300);
    // A pool coming back joins the rotation at its place; one leaving is skipped, not waited for.
    p.views[2].available = 1;
    auto all = router(lib, spec_of("round_robin"), p.names);
    counts.assign(5, 0);
    for (int i = 0; i < 300; i++) {
        if (i == 150) p.views[4].available = 0;
        counts[size_t(pick(*all, in, p))]++;
    }
    // 30 rounds of five, then 150 calls over four: 37 rounds and two more.
    CHECK(counts == std::vector<int>{68, 68, 67, 67, 30});
}

TEST_CASE("kv_aware reads ctx->loads only when the host's route context reaches it, and routes ABI 1's route() by "
          "queue length",
          "[kv_aware]") {
    auto lib = open_ok("kv_aware");
    const steward_routing_table& t = *lib->routing();
    steward_policy* self = nullptr;
    char err[256] = {0};
    REQUIRE(t.create(&kAbsentHost, nullptr, &self, err, sizeof err) == STEWARD_PLUGIN_OK);
    Pools p(2);
    p.views[0].n_running = 1;  // by the views a is busier
    steward_route_request req{};
    req.request_id = 3;
    req.bucket = req.tenant = req.response_format = "";
    req.n_prompt_tokens = 100;
    req.max_tokens = 200;
    std::vector<steward_pool_extra> extra(2, steward_pool_extra{-1});
    std::vector<steward_pool_load> loads = {{0, 100, 16, 0, "w0:1"}, {900, 1000, 16, 9, "w1:1"}};  // b busy
    steward_route_context ctx{};
    ctx.size = sizeof ctx;
    ctx.session = "";
    ctx.session_pool = -1;
    ctx.pools = extra.data();
    ctx.loads = loads.data();
    auto route_v2 = [&] {
        steward_route_decision d{-1, -1, 0, -1};
        REQUIRE(t.route_v2(self, &req, &ctx, p.views.data(), 2, &d) == STEWARD_PLUGIN_OK);
        return d.pool;
    };
    CHECK(route_v2() == 0);
    ctx.size = offsetof(steward_route_context, loads);  // a host of the first ABI 2 release
    CHECK(route_v2() == 1);
    ctx.size = sizeof ctx;
    ctx.loads = nullptr;  // the host knows no loads
    CHECK(route_v2() == 1);
    steward_route_decision d{-1, -1, 0, -1};
    REQUIRE(t.route(self, &req, p.views.data(), 2, &d) == STEWARD_PLUGIN_OK);
    CHECK(d.pool == 1);
    t.destroy(self);
}
