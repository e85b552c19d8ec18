// The built-in policy plugins (plugins/), loaded with raw dlopen + dlsym (not through runtime/plugin,
// so a loader bug cannot hide a plugin bug) and driven through a fake host API over a std::map of
// parameters. Every expected decision is worked out by hand in the test, not by the plugin's formula.
// Also checks that the test plugins (tests/plugins) are what the loader tests assume.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <steward/policy.h>

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace {

using Value = std::variant<int64_t, double, bool, std::string>;
using Params = std::map<std::string, Value>;

const Params& params_of(const steward_params* p) { return *reinterpret_cast<const Params*>(p); }
const steward_params* as_params(const Params& p) { return reinterpret_cast<const steward_params*>(&p); }

int fake_double(const steward_params* p, const char* key, double* out) {
    auto it = params_of(p).find(key);
    if (it == params_of(p).end()) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto d = std::get_if<double>(&it->second)) return *out = *d, STEWARD_PLUGIN_OK;
    if (auto i = std::get_if<int64_t>(&it->second)) return *out = double(*i), STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
int fake_int(const steward_params* p, const char* key, int64_t* out) {
    auto it = params_of(p).find(key);
    if (it == params_of(p).end()) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto i = std::get_if<int64_t>(&it->second)) return *out = *i, STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
int fake_bool(const steward_params* p, const char* key, int* out) {
    auto it = params_of(p).find(key);
    if (it == params_of(p).end()) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto b = std::get_if<bool>(&it->second)) return *out = *b ? 1 : 0, STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
int fake_string(const steward_params* p, const char* key, const char** out) {
    auto it = params_of(p).find(key);
    if (it == params_of(p).end()) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto s = std::get_if<std::string>(&it->second)) return *out = s->c_str(), STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
void fake_log(const steward_params*, int, const char*) {}

const steward_host_api kHost = {STEWARD_HOST_API_VERSION, sizeof(steward_host_api), fake_double, fake_int,
                                fake_bool, fake_string, fake_log, nullptr};

std::string builtin_path(const std::string& kind, const std::string& name) {
    return std::string(STEWARD_PLUGIN_BUILD_DIR) + "/steward_" + kind + "_" + name + ".so";
}
std::string test_plugin_path(const std::string& name) {
    return std::string(STEWARD_TEST_PLUGIN_DIR) + "/" + name + ".so";
}

// A dlopen'ed library and its entry point.
struct Library {
    void* handle = nullptr;
    steward_plugin_entry_fn entry = nullptr;
    const steward_plugin* plugin = nullptr;

    explicit Library(const std::string& path) {
        handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        const char* why = handle ? "" : dlerror();
        INFO(path << ": " << (why ? why : ""));
        REQUIRE(handle != nullptr);
        entry = reinterpret_cast<steward_plugin_entry_fn>(dlsym(handle, STEWARD_PLUGIN_ENTRY_NAME));
        REQUIRE(entry != nullptr);
        plugin = entry(STEWARD_POLICY_ABI_VERSION);
        if (!plugin) plugin = entry(1);  // an ABI 1 plugin answers only 1
        REQUIRE(plugin != nullptr);
    }
    ~Library() {
        if (handle) dlclose(handle);
    }
    Library(const Library&) = delete;
    Library& operator=(const Library&) = delete;
};

// One instance of a plugin of table type T, created from params (rc and err tell how that went).
template <class T>
struct Policy {
    Library lib;
    const T* table = nullptr;
    steward_policy* self = nullptr;
    int rc = -1;
    std::string err;

    Policy(const std::string& path, const Params& params = {}, const steward_host_api* host = &kHost) : lib(path) {
        table = static_cast<const T*>(lib.plugin->table);
        char buf[512] = {};
        rc = table->create(host, as_params(params), &self, buf, sizeof buf);
        err = buf;
        if (rc != STEWARD_PLUGIN_OK) self = nullptr;
    }
    ~Policy() {
        if (self) table->destroy(self);
    }
    Policy(const Policy&) = delete;
    Policy& operator=(const Policy&) = delete;
};
using Router = Policy<steward_routing_table>;
using Evictor = Policy<steward_eviction_table>;
using Speculator = Policy<steward_speculation_table>;

steward_pool_view pool(const char* name, double n_params, double est_cost, double latency_ms, double quality,
                       double risk, double price_output = 1.0, int available = 1) {
    steward_pool_view p{};
    p.name = name;
    p.available = available;
    p.n_layers = 32;
    p.n_params = n_params;
    p.price_prompt = price_output / 4;
    p.price_output = price_output;
    p.est_cost = est_cost;
    p.est_latency_ms = latency_ms;
    p.est_ttft_ms = latency_ms / 10;
    p.est_tpot_ms = latency_ms / 100;
    p.quality = quality;
    p.risk = risk;
    return p;
}

struct Routed {
    int rc;
    steward_route_decision d;
};

// Routes one request the way the host does: *out pre-filled with the safe default.
Routed route(Router& r, const std::vector<steward_pool_view>& pools, uint64_t request_id = 1,
             int32_t default_pool = 0) {
    REQUIRE(r.self != nullptr);
    steward_route_request req{};
    req.request_id = request_id;
    req.bucket = "chat";
    req.tenant = "acme";
    req.n_prompt_tokens = 100;
    req.max_tokens = 200;
    req.temperature = 0.7;
    req.response_format = "";
    Routed out{};
    out.d = {default_pool, -1, 0, -1};
    out.rc = r.table->route(r.self, &req, pools.data(), uint32_t(pools.size()), &out.d);
    return out;
}

struct Checked {
    int rc;
    int32_t upgrade;
};

Checked check_upgrade(Router& r, const std::vector<float>& logprobs) {
    REQUIRE(r.self != nullptr);
    REQUIRE(r.table->check_upgrade != nullptr);
    steward_route_request req{};
    req.request_id = 1;
    std::vector<int32_t> tokens(logprobs.size(), 42);
    steward_token_view view{tokens.data(), logprobs.data(), uint32_t(logprobs.size()), 0};
    Checked out{};
    out.upgrade = -7;
    out.rc = r.table->check_upgrade(r.self, &req, &view, &out.upgrade);
    return out;
}

steward_evict_candidate cand(int32_t tenant, int32_t depth, int64_t hits, int32_t is_public = 0) {
    static int32_t next_block = 0;
    steward_evict_candidate c{};
    c.block = next_block++;
    c.tenant = tenant;
    c.is_public = is_public;
    c.depth = depth;
    c.last_access_tick = 10;
    c.n_hits = hits;
    return c;
}

uint32_t victim(Evictor& e, const std::vector<steward_evict_candidate>& cands,
                const std::vector<steward_evict_tenant>& tenants = {}, int32_t n_blocks_total = 100) {
    REQUIRE(e.self != nullptr);
    steward_evict_context ctx{};
    ctx.now_tick = 1000;
    ctx.n_blocks_total = n_blocks_total;
    ctx.block_size = 16;
    ctx.block_bytes = 16.0 * 2 * 32 * 1024 * 2; // K and V, 32 layers, 1024 wide, f16
    ctx.requesting_tenant = -1;
    ctx.tenants = tenants.data();
    ctx.n_tenants = uint32_t(tenants.size());
    uint32_t v = 12345;
    REQUIRE(e.table->choose_victim(e.self, &ctx, cands.data(), uint32_t(cands.size()), &v) == STEWARD_PLUGIN_OK);
    return v;
}

// choose_victim_v2 with a request carrying the candidates' reuse priority (null: a host from
// before the field, its size short of it).
uint32_t victim_v2(Evictor& e, const std::vector<steward_evict_candidate>& cands, const std::vector<int32_t>* priority,
                   const std::vector<steward_evict_tenant>& tenants = {}) {
    REQUIRE(e.self != nullptr);
    REQUIRE(e.table->choose_victim_v2 != nullptr);
    steward_evict_context ctx{};
    ctx.now_tick = 1000;
    ctx.n_blocks_total = 100;
    ctx.block_size = 16;
    ctx.block_bytes = 16.0 * 2 * 32 * 1024 * 2;
    ctx.requesting_tenant = -1;
    ctx.tenants = tenants.data();
    ctx.n_tenants = uint32_t(tenants.size());
    std::vector<const char*> names(tenants.size(), "");
    steward_evict_request req{};
    req.tenant_names = names.data();
    req.size = priority ? (uint32_t)sizeof(steward_evict_request) : (uint32_t)offsetof(steward_evict_request, reuse_priority);
    req.bucket = "b";
    req.tenant = "";
    req.reuse_priority = priority ? priority->data() : nullptr;
    uint32_t v = 12345;
    REQUIRE(e.table->choose_victim_v2(e.self, &ctx, &req, cands.data(), uint32_t(cands.size()), &v) == STEWARD_PLUGIN_OK);
    return v;
}

int32_t budget(Speculator& s) {
    REQUIRE(s.self != nullptr);
    int64_t hist[3] = {1, 2, 3};
    steward_spec_stats st{};
    st.max_budget = 8;
    st.last_budget = 2;
    st.batch_size = 4;
    st.n_steps = 6;
    st.mean_accepted = 1.5;
    st.accepted_hist = hist;
    st.n_hist = 3;
    st.step_ms = 20;
    st.draft_ms = 5;
    st.verify_ms = 15;
    int32_t b = -99;
    REQUIRE(s.table->draft_budget(s.self, &st, &b) == STEWARD_PLUGIN_OK);
    return b;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Builtin {
    const char* kind_dir;
    const char* name;
    uint32_t kind;
};
const Builtin kBuiltins[] = {
    {"routing", "rules", STEWARD_POLICY_ROUTING},         {"routing", "cost_quality", STEWARD_POLICY_ROUTING},
    {"routing", "cascade", STEWARD_POLICY_ROUTING},       {"eviction", "lru", STEWARD_POLICY_EVICTION},
    {"eviction", "lfu", STEWARD_POLICY_EVICTION},         {"eviction", "cost_aware", STEWARD_POLICY_EVICTION},
    {"eviction", "tenant_fair", STEWARD_POLICY_EVICTION}, {"speculation", "off", STEWARD_POLICY_SPECULATION},
    {"speculation", "fixed", STEWARD_POLICY_SPECULATION},
    {"speculation", "adaptive", STEWARD_POLICY_SPECULATION},
};

// Pools for routing: a cheap small model, a medium one, a strong expensive one, and a draining pool
// that would win every criterion if it were available.
std::vector<steward_pool_view> four_pools() {
    return {
        pool("small", 1e9, 0.001, 300, 0.60, 0.1, 0.5),
        pool("medium", 8e9, 0.004, 500, 0.80, 0.1, 2.0),
        pool("large", 70e9, 0.020, 1500, 0.97, 0.3, 10.0),
        pool("draining", 400e9, 0.0001, 10, 1.00, 0.0, 0.1, /*available=*/0),
    };
}

} // namespace

// ---- every plugin

TEST_CASE("every built-in plugin reports its kind, its name and the ABI version it was built with", "[plugins]") {
    for (const Builtin& b : kBuiltins) {
        INFO(b.kind_dir << "/" << b.name);
        Library lib(builtin_path(b.kind_dir, b.name));
        CHECK(lib.plugin->abi_version == STEWARD_POLICY_ABI_VERSION);
        CHECK(lib.plugin->kind == b.kind);
        CHECK(std::string(lib.plugin->name) == b.name);
        CHECK(lib.plugin->description != nullptr);
        REQUIRE(lib.plugin->table != nullptr);
        if (b.kind == STEWARD_POLICY_ROUTING) {
            auto t = static_cast<const steward_routing_table*>(lib.plugin->table);
            CHECK(t->version == STEWARD_ROUTING_TABLE_VERSION);
            CHECK(t->size == sizeof(steward_routing_table));
            CHECK((t->create && t->destroy && t->route));
        } else if (b.kind == STEWARD_POLICY_EVICTION) {
            auto t = static_cast<const steward_eviction_table*>(lib.plugin->table);
            CHECK(t->version == STEWARD_EVICTION_TABLE_VERSION);
            CHECK(t->size == sizeof(steward_eviction_table));
            CHECK((t->create && t->destroy && t->choose_victim));
        } else {
            auto t = static_cast<const steward_speculation_table*>(lib.plugin->table);
            CHECK(t->version == STEWARD_SPECULATION_TABLE_VERSION);
            CHECK(t->size == sizeof(steward_speculation_table));
            CHECK((t->create && t->destroy && t->draft_budget));
        }
    }
}

TEST_CASE("a built-in plugin answers a host of its ABI version or newer and returns NULL to an older one", "[plugins]") {
    for (const Builtin& b : kBuiltins) {
        INFO(b.kind_dir << "/" << b.name);
        Library lib(builtin_path(b.kind_dir, b.name));
        CHECK(lib.entry(STEWARD_POLICY_ABI_VERSION - 1) == nullptr);
        CHECK(lib.entry(0) == nullptr);
        CHECK(lib.entry(STEWARD_POLICY_ABI_VERSION) == lib.plugin);
        CHECK(lib.entry(STEWARD_POLICY_ABI_VERSION + 1) == lib.plugin);
    }
}

TEST_CASE("a built-in plugin with parameters refuses an older host API, with a message, and takes a newer one",
          "[plugins]") {
    steward_host_api old = kHost;
    old.version = STEWARD_HOST_API_VERSION - 1;
    Router r(builtin_path("routing", "cost_quality"), {}, &old);
    CHECK(r.rc != STEWARD_PLUGIN_OK);
    CHECK(contains(r.err, "host API"));
    steward_host_api newer = kHost;
    newer.version = STEWARD_HOST_API_VERSION + 1;
    Router n(builtin_path("routing", "cost_quality"), {}, &newer);
    CHECK(n.rc == STEWARD_PLUGIN_OK);
}

TEST_CASE("the ABI 1 test plugins were built against the frozen v1 header: version 1 tables of the v1 size",
          "[plugins]") {
    // The v1 layout, counted by hand: two uint32 fields, then 4 (routing) or 3 (eviction) pointers.
    Library r(test_plugin_path("v1_routing"));
    CHECK(r.plugin->abi_version == 1);
    CHECK(r.entry(STEWARD_POLICY_ABI_VERSION) == nullptr);  // it only knows host version 1
    auto rt = static_cast<const steward_routing_table*>(r.plugin->table);
    CHECK(rt->version == 1);
    CHECK(rt->size == 8 + 4 * sizeof(void*));
    CHECK(rt->size == STEWARD_ROUTING_TABLE_SIZE_V1);
    Library e(test_plugin_path("v1_eviction"));
    auto et = static_cast<const steward_eviction_table*>(e.plugin->table);
    CHECK(e.plugin->abi_version == 1);
    CHECK(et->version == 1);
    CHECK(et->size == 8 + 3 * sizeof(void*));
    CHECK(et->size == STEWARD_EVICTION_TABLE_SIZE_V1);
}

TEST_CASE("a built-in plugin creates independent instances from different parameters", "[plugins]") {
    Speculator a(builtin_path("speculation", "fixed"), {{"budget", int64_t(2)}});
    Speculator b(builtin_path("speculation", "fixed"), {{"budget", int64_t(6)}});
    REQUIRE(a.rc == STEWARD_PLUGIN_OK);
    REQUIRE(b.rc == STEWARD_PLUGIN_OK);
    CHECK(budget(a) == 2);
    CHECK(budget(b) == 6);
}

// ---- routing/rules

TEST_CASE("rules routing keeps the decision the host pre-filled", "[plugins]") {
    Router r(builtin_path("routing", "rules"));
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    CHECK(r.table->check_upgrade == nullptr);
    for (int32_t def : {0, 1, 2}) {
        Routed out = route(r, four_pools(), 7, def);
        CHECK(out.rc == STEWARD_PLUGIN_OK);
        CHECK(out.d.pool == def);
        CHECK(out.d.upgrade_pool == -1);
        CHECK(out.d.check_after_tokens == 0);
        CHECK(out.d.shadow_pool == -1);
    }
}

// ---- routing/cost_quality

TEST_CASE("cost_quality with a dominant cost weight picks the cheapest available pool", "[plugins]") {
    Router r(builtin_path("routing", "cost_quality"),
             {{"lambda_cost", 1000.0}, {"lambda_latency", 0.0}, {"lambda_quality", 0.0}, {"lambda_risk", 0.0}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    Routed out = route(r, four_pools(), 1, 2);
    CHECK(out.rc == STEWARD_PLUGIN_OK);
    CHECK(out.d.pool == 0); // "draining" is cheaper but unavailable
    CHECK(out.d.upgrade_pool == -1);
    CHECK(out.d.check_after_tokens == 0);
    CHECK(out.d.shadow_pool == -1);
}

TEST_CASE("cost_quality with a dominant quality weight picks the best available pool", "[plugins]") {
    Router r(builtin_path("routing", "cost_quality"),
             {{"lambda_cost", 0.0}, {"lambda_latency", 0.0}, {"lambda_quality", int64_t(1000)}, {"lambda_risk", 0.0}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    CHECK(route(r, four_pools()).d.pool == 2); // quality 0.97; the draining 1.00 is not available
}

TEST_CASE("cost_quality balances the terms as the hand computation says", "[plugins]") {
    // A: cost 0.002 -> 0.2 of the max, latency 400 -> 0.5, quality 0.70, risk 0.10
    // B: cost 0.010 -> 1.0,              latency 800 -> 1.0, quality 0.95, risk 0.20
    // With every lambda 1 except lambda_quality = q:
    //   A = 0.2 + 0.5 - 0.70 q + 0.1 = 0.8 - 0.70 q;   B = 1 + 1 - 0.95 q + 0.2 = 2.2 - 0.95 q
    //   equal at q = 1.4 / 0.25 = 5.6: A below, B above.
    std::vector<steward_pool_view> pools = {pool("A", 7e9, 0.002, 400, 0.70, 0.10),
                                            pool("B", 70e9, 0.010, 800, 0.95, 0.20)};
    Router defaults(builtin_path("routing", "cost_quality"));
    REQUIRE(defaults.rc == STEWARD_PLUGIN_OK);
    CHECK(route(defaults, pools).d.pool == 0); // A 0.1 vs B 1.25

    Router q5(builtin_path("routing", "cost_quality"), {{"lambda_quality", 5.0}});
    CHECK(route(q5, pools).d.pool == 0); // A -2.7 vs B -2.55

    Router q6(builtin_path("routing", "cost_quality"), {{"lambda_quality", 6.0}});
    CHECK(route(q6, pools, 1, 0).d.pool == 1); // A -3.4 vs B -3.5
}

TEST_CASE("cost_quality breaks a tie on the cheaper pool, then on the lower index", "[plugins]") {
    Router r(builtin_path("routing", "cost_quality"),
             {{"lambda_cost", 0.0}, {"lambda_latency", 0.0}, {"lambda_quality", 0.0}, {"lambda_risk", 1.0}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    // Same risk: the cheaper pool wins even at a higher index.
    CHECK(route(r, {pool("a", 1e9, 0.005, 100, 0.5, 0.2), pool("b", 1e9, 0.003, 900, 0.1, 0.2)}).d.pool == 1);
    // Same risk, same cost: the lower index.
    CHECK(route(r, {pool("a", 1e9, 0.003, 100, 0.5, 0.2), pool("b", 1e9, 0.003, 900, 0.1, 0.2)}, 1, 1).d.pool == 0);
}

TEST_CASE("cost_quality keeps the host's default when no pool is available", "[plugins]") {
    Router r(builtin_path("routing", "cost_quality"));
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    std::vector<steward_pool_view> pools = {pool("a", 1e9, 0.001, 100, 0.5, 0.1, 1, 0),
                                            pool("b", 1e9, 0.002, 100, 0.5, 0.1, 1, 0)};
    Routed out = route(r, pools, 1, 1);
    CHECK(out.rc == STEWARD_PLUGIN_OK);
    CHECK(out.d.pool == 1);
}

TEST_CASE("cost_quality shadows a deterministic fraction of requests on the strongest available pool",
          "[plugins]") {
    // With every lambda 1 on four_pools(): small -0.25, medium -0.17, large 1.33 -> small; the
    // strongest available pool is large (the draining one is bigger but unavailable).
    Router r(builtin_path("routing", "cost_quality"), {{"shadow_fraction", 0.25}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    const int n = 4000;
    int shadowed = 0;
    for (int id = 0; id < n; ++id) {
        Routed out = route(r, four_pools(), uint64_t(id) + 1000);
        REQUIRE(out.d.pool == 0);
        if (out.d.shadow_pool != -1) {
            REQUIRE(out.d.shadow_pool == 2);
            ++shadowed;
        }
        REQUIRE(route(r, four_pools(), uint64_t(id) + 1000).d.shadow_pool == out.d.shadow_pool);
    }
    // Binomial(4000, 0.25): mean 1000, sigma = sqrt(4000 * 0.25 * 0.75) = 27.4; 5 sigma = 137.
    CHECK(shadowed >= 1000 - 137);
    CHECK(shadowed <= 1000 + 137);

    Router all(builtin_path("routing", "cost_quality"), {{"shadow_fraction", 1.0}});
    Router none(builtin_path("routing", "cost_quality"));
    for (uint64_t id = 0; id < 50; ++id) {
        CHECK(route(all, four_pools(), id).d.shadow_pool == 2);
        CHECK(route(none, four_pools(), id).d.shadow_pool == -1);
    }
}

TEST_CASE("cost_quality never shadows a request on the pool it already runs on", "[plugins]") {
    Router r(builtin_path("routing", "cost_quality"), {{"shadow_fraction", 1.0}, {"lambda_quality", 1000.0}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    for (uint64_t id = 0; id < 50; ++id) {
        Routed out = route(r, four_pools(), id);
        CHECK(out.d.pool == 2);
        CHECK(out.d.shadow_pool == -1);
    }
}

TEST_CASE("cost_quality refuses negative weights and a shadow fraction outside [0, 1], naming the key",
          "[plugins]") {
    Router neg(builtin_path("routing", "cost_quality"), {{"lambda_latency", -0.5}});
    CHECK(neg.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(neg.err, "lambda_latency"));
    CHECK(contains(neg.err, ">= 0"));

    Router frac(builtin_path("routing", "cost_quality"), {{"shadow_fraction", 1.5}});
    CHECK(frac.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(frac.err, "shadow_fraction"));
    CHECK(contains(frac.err, "[0, 1]"));

    Router type(builtin_path("routing", "cost_quality"), {{"lambda_cost", std::string("cheap")}});
    CHECK(type.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(type.err, "lambda_cost"));
    CHECK(contains(type.err, "number"));
}

// ---- routing/cascade

TEST_CASE("cascade starts on the cheapest output price and upgrades to the pool with the most parameters",
          "[plugins]") {
    Router r(builtin_path("routing", "cascade"));
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    Routed out = route(r, four_pools(), 1, 1);
    CHECK(out.rc == STEWARD_PLUGIN_OK);
    CHECK(out.d.pool == 0);         // price_output 0.5 (the draining pool's 0.1 is unavailable)
    CHECK(out.d.upgrade_pool == 2); // 70e9 parameters (the draining pool's 400e9 is unavailable)
    CHECK(out.d.check_after_tokens == 8);
    CHECK(out.d.shadow_pool == -1);

    auto pools = four_pools();
    pools[0].available = 0; // the cheapest is draining: the next cheapest
    CHECK(route(r, pools).d.pool == 1);
}

TEST_CASE("cascade uses the pools and k it is given by name", "[plugins]") {
    Router r(builtin_path("routing", "cascade"),
             {{"start_pool", std::string("medium")}, {"upgrade_pool", std::string("large")}, {"k", int64_t(16)}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    Routed out = route(r, four_pools());
    CHECK(out.d.pool == 1);
    CHECK(out.d.upgrade_pool == 2);
    CHECK(out.d.check_after_tokens == 16);
}

TEST_CASE("cascade does not upgrade when it starts on the strong pool", "[plugins]") {
    Router r(builtin_path("routing", "cascade"), {{"start_pool", std::string("large")}, {"shadow_fraction", 1.0}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    Routed out = route(r, four_pools());
    CHECK(out.d.pool == 2);
    CHECK(out.d.upgrade_pool == -1);
    CHECK(out.d.check_after_tokens == 0);
    CHECK(out.d.shadow_pool == -1);
}

TEST_CASE("cascade refuses to route when a named pool does not exist", "[plugins]") {
    Router up(builtin_path("routing", "cascade"), {{"upgrade_pool", std::string("xl")}});
    REQUIRE(up.rc == STEWARD_PLUGIN_OK); // names are only known at route time
    CHECK(route(up, four_pools()).rc == STEWARD_PLUGIN_ERR_PARAM);
    Router start(builtin_path("routing", "cascade"), {{"start_pool", std::string("tiny")}});
    REQUIRE(start.rc == STEWARD_PLUGIN_OK);
    CHECK(route(start, four_pools()).rc == STEWARD_PLUGIN_ERR_PARAM);
}

TEST_CASE("cascade shadows the sampled requests on the strong pool", "[plugins]") {
    Router r(builtin_path("routing", "cascade"), {{"shadow_fraction", 1.0}});
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    for (uint64_t id = 0; id < 20; ++id) CHECK(route(r, four_pools(), id).d.shadow_pool == 2);
}

TEST_CASE("cascade upgrades when the mean log-probability is below the threshold and not above", "[plugins]") {
    Router r(builtin_path("routing", "cascade"));
    REQUIRE(r.rc == STEWARD_PLUGIN_OK);
    Checked low = check_upgrade(r, {-2.5f, -3.0f, -1.5f, -2.2f}); // mean -2.3 < -2
    CHECK(low.rc == STEWARD_PLUGIN_OK);
    CHECK(low.upgrade == 1);
    Checked high = check_upgrade(r, {-0.5f, -1.0f, -0.2f, -0.3f}); // mean -0.5
    CHECK(high.rc == STEWARD_PLUGIN_OK);
    CHECK(high.upgrade == 0);
    Checked none = check_upgrade(r, {});
    CHECK(none.rc == STEWARD_PLUGIN_OK);
    CHECK(none.upgrade == 0);
}

TEST_CASE("cascade's min metric upgrades on one unsure token where the mean does not", "[plugins]") {
    const std::vector<float> one_bad = {-0.1f, -0.1f, -0.1f, -5.0f}; // mean -1.325, min -5
    Router mean(builtin_path("routing", "cascade"), {{"metric", std::string("mean")}});
    Router min(builtin_path("routing", "cascade"), {{"metric", std::string("min")}});
    Router strict(builtin_path("routing", "cascade"), {{"threshold", -1.0}});
    REQUIRE(mean.rc == STEWARD_PLUGIN_OK);
    REQUIRE(min.rc == STEWARD_PLUGIN_OK);
    REQUIRE(strict.rc == STEWARD_PLUGIN_OK);
    CHECK(check_upgrade(mean, one_bad).upgrade == 0);
    CHECK(check_upgrade(min, one_bad).upgrade == 1);
    CHECK(check_upgrade(strict, one_bad).upgrade == 1); // mean -1.325 < -1
}

TEST_CASE("cascade refuses a bad k, metric, threshold or pool name, naming the key", "[plugins]") {
    Router k(builtin_path("routing", "cascade"), {{"k", int64_t(0)}});
    CHECK(k.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(k.err, "'k'"));
    Router metric(builtin_path("routing", "cascade"), {{"metric", std::string("median")}});
    CHECK(metric.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(metric.err, "metric"));
    CHECK(contains(metric.err, "min"));
    Router threshold(builtin_path("routing", "cascade"), {{"threshold", std::string("low")}});
    CHECK(threshold.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(threshold.err, "threshold"));
    Router name(builtin_path("routing", "cascade"), {{"start_pool", std::string("")}});
    CHECK(name.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(name.err, "start_pool"));
    Router frac(builtin_path("routing", "cascade"), {{"shadow_fraction", -0.1}});
    CHECK(frac.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(frac.err, "shadow_fraction"));
}

// ---- eviction

TEST_CASE("lru evicts the first candidate", "[plugins]") {
    Evictor e(builtin_path("eviction", "lru"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(e, {cand(1, 3, 9), cand(1, 0, 0), cand(2, 1, 0)}) == 0);
    CHECK(victim(e, {cand(1, 3, 9)}) == 0);
}

TEST_CASE("lru keeps blocks with reuse priority until no other is left, and is plain LRU for an older host", "[plugins][reuse]") {
    Evictor e(builtin_path("eviction", "lru"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    const std::vector<steward_evict_candidate> c = {cand(1, 0, 0), cand(1, 1, 0), cand(1, 2, 0)};
    const std::vector<int32_t> first_kept = {1, 0, 0}, all_kept = {1, 1, 1}, none = {0, 0, 0};
    CHECK(victim_v2(e, c, &first_kept) == 1);
    CHECK(victim_v2(e, c, &all_kept) == 0);
    CHECK(victim_v2(e, c, &none) == 0);
    CHECK(victim_v2(e, c, nullptr) == 0);
}

TEST_CASE("cost_aware weighs reuse priority by priority_weight", "[plugins][reuse]") {
    // Scores at the defaults (see the test above): depth 0 cold 17.28, depth 3 with 1 hit 49.92.
    // With priority on the first, x (1 + 4) = 86.4: the second is cheaper now.
    const std::vector<steward_evict_candidate> c = {cand(1, 0, 0), cand(1, 3, 1)};
    const std::vector<int32_t> first_kept = {1, 0};
    Evictor e(builtin_path("eviction", "cost_aware"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    CHECK(victim_v2(e, c, nullptr) == 0);
    CHECK(victim_v2(e, c, &first_kept) == 1);
    // priority_weight 2: 17.28 x 3 = 51.84 > 49.92, still the second; 1: 34.56 < 49.92, the first.
    Evictor w2(builtin_path("eviction", "cost_aware"), {{"priority_weight", 2.0}});
    REQUIRE(w2.rc == STEWARD_PLUGIN_OK);
    CHECK(victim_v2(w2, c, &first_kept) == 1);
    Evictor w1(builtin_path("eviction", "cost_aware"), {{"priority_weight", 1.0}});
    REQUIRE(w1.rc == STEWARD_PLUGIN_OK);
    CHECK(victim_v2(w1, c, &first_kept) == 0);
    Evictor bad(builtin_path("eviction", "cost_aware"), {{"priority_weight", -1.0}});
    CHECK(bad.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(bad.err, "priority_weight"));
}

TEST_CASE("lfu evicts the block with the fewest hits, the least recently used among equals", "[plugins]") {
    Evictor e(builtin_path("eviction", "lfu"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(e, {cand(1, 0, 5), cand(1, 0, 2), cand(1, 0, 7), cand(1, 0, 2)}) == 1);
    CHECK(victim(e, {cand(1, 0, 3), cand(1, 0, 3)}) == 0);
}

TEST_CASE("cost_aware keeps a deep hot block and evicts a shallow cold one", "[plugins]") {
    // block_size 16, attn_ratio 0.01, hit_weight 1 (the defaults):
    //   depth 20, 5 hits: 16 * (1 + 0.01 * 20.5 * 16) * 6 = 68.48 * 6 = 410.88
    //   depth 0, 0 hits:  16 * (1 + 0.01 * 0.5 * 16) * 1  = 17.28
    //   depth 3, 1 hit:   16 * (1 + 0.01 * 3.5 * 16) * 2  = 49.92
    Evictor e(builtin_path("eviction", "cost_aware"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(e, {cand(1, 20, 5), cand(1, 0, 0), cand(1, 3, 1)}) == 1);
    // Hits outweigh depth: depth 0 with 10 hits 17.28 * 11 = 190.08; depth 30 cold: 16 * 5.88 = 94.08.
    CHECK(victim(e, {cand(1, 0, 10), cand(1, 30, 0)}) == 1);
}

TEST_CASE("cost_aware follows its parameters: no hit weight evicts by depth, no weights is LRU", "[plugins]") {
    Evictor depth_only(builtin_path("eviction", "cost_aware"), {{"hit_weight", 0.0}});
    REQUIRE(depth_only.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(depth_only, {cand(1, 0, 10), cand(1, 30, 0)}) == 0); // 17.28 vs 94.08
    Evictor flat(builtin_path("eviction", "cost_aware"), {{"hit_weight", 0.0}, {"attn_ratio", 0.0}});
    REQUIRE(flat.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(flat, {cand(1, 9, 10), cand(1, 0, 0), cand(1, 30, 0)}) == 0);
    Evictor bad(builtin_path("eviction", "cost_aware"), {{"attn_ratio", -1.0}});
    CHECK(bad.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(bad.err, "attn_ratio"));
}

TEST_CASE("tenant_fair evicts the least recently used private block of the tenant over its quota",
          "[plugins]") {
    Evictor e(builtin_path("eviction", "tenant_fair"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    // 100 blocks, 2 tenants, no configured quotas: 50 each. Tenant 1 holds 60 (ratio 1.2).
    std::vector<steward_evict_tenant> tenants = {{1, 60, -1}, {2, 30, -1}};
    std::vector<steward_evict_candidate> cands = {cand(2, 0, 0), cand(1, 0, 0, /*public=*/1), cand(1, 2, 0),
                                                  cand(1, 3, 0)};
    CHECK(victim(e, cands, tenants) == 2);
    // Nobody over quota: plain LRU.
    CHECK(victim(e, cands, {{1, 40, -1}, {2, 30, -1}}) == 0);
    // A configured quota: tenant 2 holds 30 of 10 (ratio 3) beats tenant 1's 1.2.
    CHECK(victim(e, {cand(1, 0, 0), cand(2, 0, 0), cand(2, 1, 0)}, {{1, 60, -1}, {2, 30, 10}}) == 1);
    // An over-quota tenant with only a public block left: that block.
    CHECK(victim(e, {cand(2, 0, 0), cand(1, 0, 0, 1)}, tenants) == 1);
    // An over-quota tenant with no candidate cannot give one back: LRU among the others.
    CHECK(victim(e, {cand(2, 0, 0), cand(1, 0, 0)}, {{1, 40, 50}, {2, 30, 50}, {3, 90, 10}}) == 0);
}

TEST_CASE("tenant_fair takes a tenant's blocks with reuse priority after its other private ones", "[plugins][reuse]") {
    Evictor e(builtin_path("eviction", "tenant_fair"));
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    const std::vector<steward_evict_tenant> tenants = {{1, 60, -1}, {2, 30, -1}};  // tenant 1 over its 50
    const std::vector<steward_evict_candidate> c = {cand(2, 0, 0), cand(1, 0, 0), cand(1, 1, 0), cand(1, 2, 0, 1)};
    const std::vector<int32_t> p1 = {0, 1, 0, 0}, p12 = {0, 1, 1, 0}, all = {1, 1, 1, 1};
    CHECK(victim_v2(e, c, nullptr, tenants) == 1);  // an older host: the tenant's LRU private block
    CHECK(victim_v2(e, c, &p1, tenants) == 2);      // its private block without priority
    CHECK(victim_v2(e, c, &p12, tenants) == 1);     // both private ones have it: the LRU of them, before the public one
    CHECK(victim_v2(e, c, &all, tenants) == 1);
    // Nobody over quota: LRU among the blocks without priority (tenant 2's block has it here).
    const std::vector<int32_t> first = {1, 0, 0, 0};
    CHECK(victim_v2(e, c, &first, {{1, 40, -1}, {2, 30, -1}}) == 1);
}

TEST_CASE("tenant_fair's default_share sets the quota of tenants without one", "[plugins]") {
    // default_share 0.25 of 100 blocks: 25 each; tenant 1 is at 2.4, tenant 2 at 1.2.
    Evictor e(builtin_path("eviction", "tenant_fair"), {{"default_share", 0.25}});
    REQUIRE(e.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(e, {cand(2, 0, 0), cand(1, 0, 0, 1), cand(1, 1, 0)}, {{1, 60, -1}, {2, 30, -1}}) == 2);
    // default_share 0.9: quotas of 90, nobody over: plain LRU.
    Evictor wide(builtin_path("eviction", "tenant_fair"), {{"default_share", 0.9}});
    REQUIRE(wide.rc == STEWARD_PLUGIN_OK);
    CHECK(victim(wide, {cand(2, 0, 0), cand(1, 1, 0)}, {{1, 60, -1}, {2, 30, -1}}) == 0);

    for (double bad : {0.0, 1.5, -0.2}) {
        Evictor b(builtin_path("eviction", "tenant_fair"), {{"default_share", bad}});
        CHECK(b.rc == STEWARD_PLUGIN_ERR_PARAM);
        CHECK(contains(b.err, "default_share"));
        CHECK(contains(b.err, "(0, 1]"));
    }
}

// ---- speculation

TEST_CASE("off never speculates", "[plugins]") {
    Speculator s(builtin_path("speculation", "off"));
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    CHECK(budget(s) == 0);
}

TEST_CASE("fixed returns its configured budget, 4 by default", "[plugins]") {
    Speculator def(builtin_path("speculation", "fixed"));
    REQUIRE(def.rc == STEWARD_PLUGIN_OK);
    CHECK(budget(def) == 4);
    Speculator seven(builtin_path("speculation", "fixed"), {{"budget", int64_t(7)}});
    REQUIRE(seven.rc == STEWARD_PLUGIN_OK);
    CHECK(budget(seven) == 7);
    Speculator zero(builtin_path("speculation", "fixed"), {{"budget", int64_t(0)}});
    REQUIRE(zero.rc == STEWARD_PLUGIN_OK);
    CHECK(budget(zero) == 0);
}

TEST_CASE("fixed refuses a negative or non-integer budget with a message naming the key", "[plugins]") {
    Speculator neg(builtin_path("speculation", "fixed"), {{"budget", int64_t(-1)}});
    CHECK(neg.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(neg.self == nullptr);
    CHECK(contains(neg.err, "'budget'"));
    CHECK(contains(neg.err, "-1"));
    Speculator frac(builtin_path("speculation", "fixed"), {{"budget", 2.5}});
    CHECK(frac.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(frac.err, "'budget'"));
    CHECK(contains(frac.err, "integer"));
}

TEST_CASE("off answers 0 per sequence and fixed its budget, capped at the tokens the sequence has left",
          "[plugins]") {
    auto per_seq = [](Speculator& s, int32_t n_generated, int32_t max_tokens) {
        REQUIRE(s.table->draft_budget_seq != nullptr);
        steward_spec_seq q{};
        q.size = sizeof q;
        q.request_id = 3;
        q.bucket = "chat";
        q.tenant = "acme";
        q.max_budget = 8;
        q.last_budget = 2;
        q.position = 100 + n_generated;
        q.n_generated = n_generated;
        q.max_tokens = max_tokens;
        q.batch_size = 4;
        q.n_steps = 5;
        q.n_proposed = 10;
        q.n_accepted = 6;
        q.recent_acceptance = 0.6;
        int32_t b = -99;
        REQUIRE(s.table->draft_budget_seq(s.self, &q, &b) == STEWARD_PLUGIN_OK);
        return b;
    };
    Speculator off(builtin_path("speculation", "off"));
    REQUIRE(off.rc == STEWARD_PLUGIN_OK);
    CHECK(per_seq(off, 0, 64) == 0);
    Speculator fixed(builtin_path("speculation", "fixed"), {{"budget", int64_t(5)}});
    REQUIRE(fixed.rc == STEWARD_PLUGIN_OK);
    CHECK(per_seq(fixed, 0, 64) == 5);
    CHECK(per_seq(fixed, 0, 0) == 5);    // no output limit known: the budget as is
    CHECK(per_seq(fixed, 60, 64) == 3);  // 4 tokens left: 3 drafts + the verified one
    CHECK(per_seq(fixed, 63, 64) == 0);  // the last token: no drafts
}

TEST_CASE("cost_quality with session_affinity keeps a session on the pool holding its KV while it is available",
          "[plugins]") {
    auto pools = four_pools();  // by score alone (λ quality 1000) "large" (2) wins
    auto route_v2 = [&](Router& r, int32_t session_pool) {
        REQUIRE(r.table->route_v2 != nullptr);
        steward_route_request req{};
        req.request_id = 5;
        req.bucket = "agent";
        req.tenant = "acme";
        req.n_prompt_tokens = 500;
        req.max_tokens = 20;
        req.response_format = "";
        std::vector<steward_pool_extra> extra(pools.size(), steward_pool_extra{-1});
        if (session_pool >= 0) extra[session_pool].n_cached_prompt_tokens = 480;
        steward_route_context ctx{};
        ctx.size = sizeof ctx;
        ctx.session = "s1";
        ctx.session_pool = session_pool;
        ctx.pools = extra.data();
        steward_route_decision d{0, -1, 0, -1};
        REQUIRE(r.table->route_v2(r.self, &req, &ctx, pools.data(), uint32_t(pools.size()), &d) == STEWARD_PLUGIN_OK);
        return d.pool;
    };
    Router sticky(builtin_path("routing", "cost_quality"), {{"lambda_quality", 1000.0}, {"session_affinity", true}});
    Router plain(builtin_path("routing", "cost_quality"), {{"lambda_quality", 1000.0}});
    REQUIRE(sticky.rc == STEWARD_PLUGIN_OK);
    REQUIRE(plain.rc == STEWARD_PLUGIN_OK);
    CHECK(route_v2(sticky, 0) == 0);   // the session's pool, though "large" scores better
    CHECK(route_v2(plain, 0) == 2);    // without affinity: the score
    CHECK(route_v2(sticky, -1) == 2);  // no session pool: the score
    CHECK(route_v2(sticky, 3) == 2);   // the session's pool is draining: the score
    Router bad(builtin_path("routing", "cost_quality"), {{"session_affinity", int64_t(1)}});
    CHECK(bad.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(bad.err, "'session_affinity'"));
}

// ---- the test plugins the loader tests use

TEST_CASE("the test plugins are built as the loader tests assume", "[plugins]") {
    {
        Library lib(test_plugin_path("bad_abi"));
        CHECK(lib.plugin->abi_version == STEWARD_POLICY_ABI_VERSION + 1);
        CHECK(lib.plugin->kind == STEWARD_POLICY_ROUTING);
    }
    {
        void* h = dlopen(test_plugin_path("no_entry").c_str(), RTLD_NOW | RTLD_LOCAL);
        REQUIRE(h != nullptr);
        CHECK(dlsym(h, STEWARD_PLUGIN_ENTRY_NAME) == nullptr);
        dlclose(h);
    }
    {
        Library lib(test_plugin_path("kind_eviction"));
        CHECK(lib.plugin->kind == STEWARD_POLICY_EVICTION);
    }
    {
        Library lib(test_plugin_path("bad_table_version"));
        CHECK(static_cast<const steward_routing_table*>(lib.plugin->table)->version == 99);
    }
    auto pools = four_pools();
    {
        Router v1(test_plugin_path("swap_v1")), v2(test_plugin_path("swap_v2"));
        CHECK(route(v1, pools, 1, 3).d.pool == 0);
        CHECK(route(v2, pools, 1, 3).d.pool == 1);
        CHECK(route(v2, {pools[0]}, 1, 3).d.pool == 0);
        CHECK(std::string(v2.lib.plugin->name) == "swap_v2");
    }
    {
        Router a(test_plugin_path("param_routing"), {{"pick", int64_t(2)}}), b(test_plugin_path("param_routing"));
        CHECK(route(a, pools).d.pool == 2);
        CHECK(route(b, pools, 1, 3).d.pool == 0);
        Router bad(test_plugin_path("param_routing"), {{"pick", int64_t(-1)}});
        CHECK(bad.rc == STEWARD_PLUGIN_ERR_PARAM);
    }
    {
        Router r(test_plugin_path("invalid_routing"));
        CHECK(route(r, pools).d.pool == 999);
        CHECK(check_upgrade(r, {-1.0f}).rc == STEWARD_PLUGIN_ERR);
        Router check(test_plugin_path("invalid_routing"), {{"mode", std::string("check")}});
        Routed out = route(check, pools, 1, 0);
        CHECK(out.d.pool == 0);
        CHECK(out.d.upgrade_pool == 1);
        CHECK(out.d.check_after_tokens == 1);
        Router up(test_plugin_path("invalid_routing"), {{"mode", std::string("upgrade_pool")}});
        CHECK(route(up, pools).d.upgrade_pool == 999);
        Router sh(test_plugin_path("invalid_routing"), {{"mode", std::string("shadow_pool")}});
        CHECK(route(sh, pools).d.shadow_pool == 999);
    }
    {
        Router r(test_plugin_path("error_routing"));
        CHECK(route(r, pools).rc == STEWARD_PLUGIN_ERR);
    }
    {
        Evictor e(test_plugin_path("invalid_eviction"));
        CHECK(victim(e, {cand(1, 0, 0), cand(1, 0, 0)}) == 2);
    }
    {
        Speculator neg(test_plugin_path("invalid_speculation"));
        CHECK(budget(neg) == -1);
        Speculator over(test_plugin_path("invalid_speculation"), {{"mode", std::string("over_max")}});
        CHECK(budget(over) == 9); // max_budget 8 + 1
    }
}

// ---- adaptive: checked against an independent goodput computation written here

namespace {

// One sequence as the host describes it, with a constant acceptance per position and the times.
struct SpecSeqCase {
    uint64_t id = 7;
    double acceptance = 0.8;
    double plain_ms = 10, verify_ms_per_token = 1, draft_ms_per_token = 2;
    int32_t batch = 1, max_budget = 16, n_generated = 10, max_tokens = 1000;
    double catch_up_ms = 0;  // the draft model's catch-up before this step's first draft token
};

int32_t adaptive_budget(Speculator& s, const SpecSeqCase& c) {
    std::vector<double> acc(16, c.acceptance);
    steward_spec_seq q{};
    q.size = sizeof q;
    q.request_id = c.id;
    q.bucket = "b";
    q.tenant = "t";
    q.max_budget = c.max_budget;
    q.n_generated = c.n_generated;
    q.max_tokens = c.max_tokens;
    q.batch_size = c.batch;
    q.recent_acceptance = c.acceptance;
    q.accept_pos = acc.data();
    q.n_accept_pos = (uint32_t)acc.size();
    q.draft_ms_per_token = c.draft_ms_per_token;
    q.verify_ms = c.plain_ms + c.verify_ms_per_token;
    q.verify_ms_per_token = c.verify_ms_per_token;
    q.plain_step_ms = c.plain_ms;
    q.draft_source = STEWARD_SPEC_SOURCE_DRAFT;
    q.draft_catch_up_ms = c.catch_up_ms;
    q.draft_catch_up_tokens = c.catch_up_ms > 0 ? 100 : 0;
    int32_t b = -99;
    REQUIRE(s.table->draft_budget_seq(s.self, &q, &b) == STEWARD_PLUGIN_OK);
    return b;
}

// The best k by brute force: tokens per ms of the batch when this sequence verifies k drafts; 0
// unless the best adds min_gain - 1 of the sequence's own plain rate (goodput(0) / batch). A
// catch-up is paid once for the rest of the output: a step that yields `tokens` of the tokens left
// carries that fraction of it (all of it when fewer are left).
int32_t expected_best_k(const SpecSeqCase& c, int32_t k_max, double min_gain) {
    auto goodput = [&](int k) {
        double tokens = 1;
        for (int i = 1; i <= k; i++) tokens += std::pow(c.acceptance, i);
        const double left = c.max_tokens - c.n_generated;
        const double catch_up = k == 0 ? 0.0 : c.catch_up_ms * std::min(1.0, tokens / left);
        return (c.batch - 1 + tokens) / (c.plain_ms + k * (c.verify_ms_per_token + c.draft_ms_per_token) + catch_up);
    };
    int32_t best = 0;
    for (int k = 1; k <= k_max; k++)
        if (goodput(k) > goodput(best)) best = k;
    return goodput(best) - goodput(0) >= (min_gain - 1) * goodput(0) / c.batch ? best : 0;
}

}  // namespace

TEST_CASE("adaptive picks the draft length of the best predicted goodput, long when drafts are accepted and 0 when "
          "they are not",
          "[plugins]") {
    Speculator s(builtin_path("speculation", "adaptive"), {{"k_max", int64_t(8)}, {"min_gain", 1.05}});
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    uint64_t id = 100;
    for (double a : {0.0, 0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.97}) {
        for (double draft_ms : {0.0, 1.0, 4.0}) {
            for (int32_t batch : {1, 4, 64, 256}) {
                SpecSeqCase c;
                c.id = ++id;  // a new sequence: no hysteresis yet
                c.acceptance = a;
                c.draft_ms_per_token = draft_ms;
                c.batch = batch;
                INFO("acceptance " << a << " draft_ms " << draft_ms << " batch " << batch);
                CHECK(adaptive_budget(s, c) == expected_best_k(c, 8, 1.05));
            }
        }
    }
    SpecSeqCase high;
    high.id = 1;
    high.acceptance = 0.95;
    high.draft_ms_per_token = 0.5;
    CHECK(adaptive_budget(s, high) >= 6);
    SpecSeqCase low;
    low.id = 2;
    low.acceptance = 0.1;
    CHECK(adaptive_budget(s, low) == 0);
    // A memory-bound step of a large batch (40 ms for 256 sequences, 0.05 ms per extra verified
    // token): a well-accepted sequence still drafts; a batch-wide 5% threshold ruled that out.
    SpecSeqCase big = high;
    big.id = 5;
    big.batch = 256;
    big.plain_ms = 40;
    big.verify_ms_per_token = 0.05;
    big.draft_ms_per_token = 0.02;
    CHECK(adaptive_budget(s, big) >= 4);
    SpecSeqCase big_low = big;
    big_low.id = 6;
    big_low.acceptance = 0.05;
    CHECK(adaptive_budget(s, big_low) == 0);
    // Capped by the host's limit and by the tokens the sequence has left.
    SpecSeqCase capped = high;
    capped.id = 3;
    capped.max_budget = 3;
    CHECK(adaptive_budget(s, capped) == 3);
    SpecSeqCase ending = high;
    ending.id = 4;
    ending.n_generated = 997;  // 3 left: 2 drafts + the verified token
    CHECK(adaptive_budget(s, ending) == 2);
}

TEST_CASE("adaptive does not flap when the acceptance wavers around its threshold, and follows a lasting change",
          "[plugins]") {
    Speculator s(builtin_path("speculation", "adaptive"),
                 {{"k_max", int64_t(4)}, {"min_gain", 1.0}, {"margin", 0.05}, {"patience", int64_t(4)},
                  {"probe_every", int64_t(0)}});
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    // With plain 10 ms and 5 ms per draft token (verify 1 + draft 4), k = 1 pays from acceptance
    // 0.5 on (1.5 / 15 = 1 / 10): the threshold. Waver 2% around it, every step.
    SpecSeqCase c;
    c.id = 42;
    c.draft_ms_per_token = 4;
    int n_switches = 0, last = -1;
    for (int step = 0; step < 200; step++) {
        c.acceptance = step % 2 ? 0.51 : 0.49;
        const int32_t k = adaptive_budget(s, c);
        if (last >= 0 && k != last) n_switches++;
        last = k;
    }
    CHECK(n_switches == 0);
    // A lasting change wins after `patience` steps, and not before.
    c.acceptance = 0.95;
    const int32_t before = last;
    std::vector<int32_t> ks;
    for (int step = 0; step < 6; step++) ks.push_back(adaptive_budget(s, c));
    CHECK(ks[0] == before);
    CHECK(ks[2] == before);
    CHECK(ks[3] == expected_best_k(c, 4, 1.0));
    CHECK(ks[5] == ks[3]);
}

TEST_CASE("adaptive probes every probe_every steps at k = 0 and refuses out-of-range parameters", "[plugins]") {
    Speculator s(builtin_path("speculation", "adaptive"),
                 {{"probe_every", int64_t(5)}, {"probe_k", int64_t(2)}, {"probe_backoff", 1.0}});
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    SpecSeqCase c;
    c.id = 9;
    c.acceptance = 0.0;
    std::vector<int32_t> ks;
    for (int step = 0; step < 10; step++) ks.push_back(adaptive_budget(s, c));
    CHECK(ks == std::vector<int32_t>{0, 0, 0, 0, 2, 0, 0, 0, 0, 2});
    // With backoff 2 (the default) the waits double after each probe that fails: 5, 10, 20, capped
    // at probe_every_max 16.
    Speculator back(builtin_path("speculation", "adaptive"),
                    {{"probe_every", int64_t(5)}, {"probe_k", int64_t(2)}, {"probe_every_max", int64_t(16)}});
    REQUIRE(back.rc == STEWARD_PLUGIN_OK);
    std::vector<int> probes;
    for (int step = 1; step <= 80; step++)
        if (adaptive_budget(back, c) > 0) probes.push_back(step);
    CHECK(probes == std::vector<int>{5, 15, 31, 47, 63, 79});
    Speculator bad(builtin_path("speculation", "adaptive"), {{"min_gain", 0.5}});
    CHECK(bad.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(bad.err, "'min_gain'"));
    Speculator bad_k(builtin_path("speculation", "adaptive"), {{"k_max", int64_t(17)}});
    CHECK(bad_k.rc == STEWARD_PLUGIN_ERR_PARAM);
    CHECK(contains(bad_k.err, "'k_max'"));
}

TEST_CASE("adaptive neither drafts nor probes when even a draft accepted at every position would not pay, and "
          "probes again when the times change",
          "[plugins]") {
    Speculator s(builtin_path("speculation", "adaptive"), {{"probe_every", int64_t(4)}});
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    // A draft model as slow per token as the target's whole step (plain 10 ms, verify 1 ms and draft
    // 10 ms per token): by brute force no k pays even at acceptance 1.
    SpecSeqCase c;
    c.id = 77;
    c.acceptance = 1.0;
    c.draft_ms_per_token = 10;
    REQUIRE(expected_best_k(c, 8, 1.05) == 0);
    int n_drafting = 0;
    for (int step = 0; step < 100; step++) n_drafting += adaptive_budget(s, c) > 0;
    CHECK(n_drafting == 0);
    // Zero acceptance at a cheap draft's times is not hopeless: the probes come back.
    c.acceptance = 0.0;
    c.draft_ms_per_token = 0.5;
    REQUIRE(expected_best_k(SpecSeqCase{.acceptance = 1.0, .draft_ms_per_token = 0.5}, 8, 1.05) > 0);
    for (int step = 0; step < 10; step++) n_drafting += adaptive_budget(s, c) > 0;
    CHECK(n_drafting >= 1);
}

TEST_CASE("adaptive pays a draft model's catch-up once over the tokens left: a long prompt early in a long output "
          "still drafts, the same catch-up near the end does not, nor does a probe there",
          "[plugins]") {
    Speculator s(builtin_path("speculation", "adaptive"), {{"k_max", int64_t(8)}, {"min_gain", 1.05}});
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    uint64_t id = 500;
    int n_checked_off = 0;
    for (double a : {0.5, 0.7, 0.9}) {
        for (double catch_up : {0.0, 20.0, 200.0, 2000.0}) {
            for (int32_t n_generated : {10, 900, 980, 995}) {
                SpecSeqCase c;
                c.id = ++id;
                c.acceptance = a;
                c.catch_up_ms = catch_up;
                c.n_generated = n_generated;
                INFO("acceptance " << a << " catch-up " << catch_up << " ms, " << (c.max_tokens - n_generated) << " left");
                // No more drafts than the tokens left less the verified one.
                const int32_t k_top = std::min(8, c.max_tokens - n_generated - 1);
                const int32_t want = expected_best_k(c, k_top, 1.05);
                CHECK(adaptive_budget(s, c) == want);
                SpecSeqCase free = c;
                free.catch_up_ms = 0;
                free.id = ++id;
                if (want == 0 && expected_best_k(free, k_top, 1.05) > 0) n_checked_off++;
            }
        }
    }
    CHECK(n_checked_off >= 3);  // cases where only the catch-up turns speculation off
    // At k = 0 with a probe due every 4 steps: with 20 tokens left, a 500 ms catch-up cannot pay
    // back even at full acceptance, so no probe is made; without it the probes come.
    Speculator p(builtin_path("speculation", "adaptive"), {{"probe_every", int64_t(4)}, {"probe_backoff", 1.0}});
    REQUIRE(p.rc == STEWARD_PLUGIN_OK);
    SpecSeqCase c;
    c.id = 900;
    c.acceptance = 0.0;
    c.n_generated = 980;
    c.catch_up_ms = 500;
    int n_probes = 0;
    for (int step = 0; step < 12; step++) n_probes += adaptive_budget(p, c) > 0;
    CHECK(n_probes == 0);
    c.catch_up_ms = 0;
    for (int step = 0; step < 12; step++) n_probes += adaptive_budget(p, c) > 0;
    CHECK(n_probes >= 2);
}

TEST_CASE("adaptive reads only the fields the host's steward_spec_seq has: an early ABI 2 host gets the prior model",
          "[plugins]") {
    Speculator s(builtin_path("speculation", "adaptive"),
                 {{"prior_acceptance", 0.9}, {"verify_token_share", 0.1}, {"draft_token_share", 0.3}});
    REQUIRE(s.rc == STEWARD_PLUGIN_OK);
    steward_spec_seq q{};
    q.size = (uint32_t)offsetof(steward_spec_seq, accept_pos);  // the struct before the goodput fields
    q.request_id = 5;
    q.max_budget = 8;
    q.max_tokens = 100;
    q.batch_size = 1;
    q.recent_acceptance = -1;
    q.plain_step_ms = 1e9;  // past the host's size: must not be read
    int32_t b = -1;
    REQUIRE(s.table->draft_budget_seq(s.self, &q, &b) == STEWARD_PLUGIN_OK);
    // By hand: acceptance 0.9, a draft token costs 0.1 + 0.3 of the plain step; G(k) = E(k) / (1 + 0.4k).
    SpecSeqCase c;
    c.acceptance = 0.9;
    c.plain_ms = 1;
    c.verify_ms_per_token = 0.1;
    c.draft_ms_per_token = 0.3;
    CHECK(b == expected_best_k(c, 8, 1.05));
    CHECK(b > 0);
}
