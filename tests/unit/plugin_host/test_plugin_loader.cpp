// The host side of policy plugins: PluginLibrary::open's refusals, PluginLoader's name resolution
// and reload-on-change, the validation of every decision by RoutingPolicy / PluginEvictionPolicy /
// SpeculationPolicy (an invalid answer falls back to the safe default and is counted), parameter
// checking at create(), create_policies over a parsed config, and the config errors parse_config
// and check_config_file report. The plugins themselves are tested through raw dlopen in
// tests/unit/builtin_plugins/; here they are only driven through the runtime's loader.
#include <catch2/catch.hpp>
#include "pool/config_check.h"
#include "test_paths.h"

#include <steward/policy.h>
#include <steward/runtime.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "kv/block_pool.h"
#include "kv/kv_manager.h"
#include "plugin/plugin_loader.h"
#include "plugin/policies.h"
#include "plugin/policy_set.h"

using namespace steward;
namespace fs = std::filesystem;

namespace {

std::string test_plugin(const std::string& name) { return std::string(STEWARD_TEST_PLUGIN_DIR) + "/" + name + ".so"; }
std::string builtin(const std::string& kind, const std::string& name) {
    return std::string(STEWARD_PLUGIN_BUILD_DIR) + "/steward_" + kind + "_" + name + ".so";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
    fs::path path;
    TempDir() {
        std::string tmpl = (fs::temp_directory_path() / "steward-plugin-loader-test-XXXXXX").string();
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    REQUIRE(out.good());
    out << text;
}

PolicySpec spec_of(const std::string& plugin, std::map<std::string, PolicyParam> params = {}) {
    PolicySpec s;
    s.plugin = plugin;
    s.params = std::move(params);
    s.where = "test.toml:1:1";
    return s;
}

steward_pool_view pool_view(const char* name, int32_t available = 1) {
    steward_pool_view v{};
    v.name = name;
    v.available = available;
    v.n_layers = 4;
    v.n_params = 1e6;
    v.quality = 0.5;
    return v;
}
std::vector<steward_pool_view> three_pools() { return {pool_view("a"), pool_view("b"), pool_view("c")}; }
const std::vector<std::string> kPoolNames = {"a", "b", "c"};

RouteInput request() {
    RouteInput r;
    r.request_id = 7;
    r.bucket = "chat";
    r.tenant = "t";
    r.n_prompt_tokens = 10;
    r.max_tokens = 20;
    return r;
}

std::shared_ptr<PluginLibrary> load_ok(PluginLoader& loader, const std::string& plugin, PolicyKind kind,
                                       const std::vector<std::string>& dirs = {}) {
    auto lib = loader.load(plugin, kind, dirs);
    INFO(plugin << ": " << (lib ? "" : lib.error().message));
    REQUIRE(lib.ok());
    return *lib;
}

std::unique_ptr<RoutingPolicy> routing(PluginLoader& loader, const PolicySpec& spec,
                                       std::shared_ptr<PolicyCounters> counters = std::make_shared<PolicyCounters>()) {
    auto p = RoutingPolicy::create(load_ok(loader, spec.plugin, PolicyKind::ROUTING), spec, "chat", counters, kPoolNames);
    INFO(spec.plugin << ": " << (p ? "" : p.error().message));
    REQUIRE(p.ok());
    return std::move(*p);
}

std::string open_error(const std::string& path, PolicyKind kind) {
    auto lib = PluginLibrary::open(path, kind);
    REQUIRE_FALSE(lib.ok());
    return lib.error().message;
}

std::vector<EvictionCandidate> candidates(std::vector<int64_t> hits) {
    std::vector<EvictionCandidate> c;
    for (size_t i = 0; i < hits.size(); i++) {
        EvictionCandidate e;
        e.block = int32_t(10 + i);
        e.tenant = 0;
        e.last_access_tick = int64_t(i);
        e.n_hits = hits[i];
        e.depth = int32_t(i);
        c.push_back(e);
    }
    return c;
}

steward_spec_stats spec_stats(int32_t max_budget) {
    steward_spec_stats s{};
    s.max_budget = max_budget;
    s.batch_size = 1;
    return s;
}

}  // namespace

// ---- 1. refusals

TEST_CASE("a plugin built for another ABI version is refused, naming the file and asking for a rebuild",
          "[plugin_loader]") {
    const std::string path = test_plugin("bad_abi");
    const std::string msg = open_error(path, PolicyKind::ROUTING);
    INFO(msg);
    CHECK(contains(msg, path));
    CHECK(contains(msg, "ABI version " + std::to_string(STEWARD_POLICY_ABI_VERSION + 1)));
    CHECK(contains(msg, "rebuild"));
}

TEST_CASE("a library without steward_plugin_entry is refused, naming the missing entry point", "[plugin_loader]") {
    const std::string path = test_plugin("no_entry");
    const std::string msg = open_error(path, PolicyKind::ROUTING);
    INFO(msg);
    CHECK(contains(msg, path));
    CHECK(contains(msg, "no entry point 'steward_plugin_entry'"));
}

TEST_CASE("an eviction plugin loaded as a routing policy is refused, naming both kinds", "[plugin_loader]") {
    const std::string path = test_plugin("kind_eviction");
    const std::string msg = open_error(path, PolicyKind::ROUTING);
    INFO(msg);
    CHECK(contains(msg, path));
    CHECK(contains(msg, "is of kind 'eviction', but the config uses it as a routing policy"));
    // The same file as the kind it declares loads.
    auto lib = PluginLibrary::open(path, PolicyKind::EVICTION);
    REQUIRE(lib.ok());
    CHECK((*lib)->kind() == PolicyKind::EVICTION);
    CHECK((*lib)->name() == "kind_eviction");
}

TEST_CASE("a routing table of a newer version is refused, naming the versions read and asking for a rebuild",
          "[plugin_loader]") {
    const std::string path = test_plugin("bad_table_version");
    const std::string msg = open_error(path, PolicyKind::ROUTING);
    INFO(msg);
    CHECK(contains(msg, path));
    CHECK(contains(msg, "routing table of version 99"));
    CHECK(contains(msg, "reads versions 1 to " + std::to_string(STEWARD_ROUTING_TABLE_VERSION)));
    CHECK(contains(msg, "rebuild"));
}

TEST_CASE("a plugin path that does not exist is refused, naming the path", "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("missing.so");
    const std::string msg = open_error(path, PolicyKind::ROUTING);
    INFO(msg);
    CHECK(contains(msg, "'" + path + "' does not exist"));
    // Through the loader too (a path is not searched for).
    PluginLoader loader;
    auto lib = loader.load(path, PolicyKind::ROUTING, {STEWARD_TEST_PLUGIN_DIR});
    REQUIRE_FALSE(lib.ok());
    CHECK(contains(lib.error().message, "'" + path + "' does not exist"));
}

TEST_CASE("a file that is not a shared library is refused as not loadable", "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("garbage.so");
    write_file(path, std::string("this is not an ELF file\x01\x02\x03\xff", 27) + std::string(4096, '\x5a'));
    const std::string msg = open_error(path, PolicyKind::ROUTING);
    INFO(msg);
    CHECK(contains(msg, "cannot load plugin '" + path + "'"));
    CHECK(contains(msg, "must be a shared library"));
    PluginLoader loader;
    auto lib = loader.load(path, PolicyKind::SPECULATION, {});
    REQUIRE_FALSE(lib.ok());
    CHECK(contains(lib.error().message, "cannot load plugin"));
}

TEST_CASE("a plugin name found in no directory is refused, listing the file names and directories searched",
          "[plugin_loader]") {
    TempDir a, b;
    PluginLoader loader;
    const std::vector<std::string> dirs = {a.path.string(), b.path.string()};
    auto lib = loader.load("no_such_router", PolicyKind::ROUTING, dirs);
    REQUIRE_FALSE(lib.ok());
    const std::string& msg = lib.error().message;
    INFO(msg);
    CHECK(contains(msg, "no routing plugin named 'no_such_router'"));
    CHECK(contains(msg, "steward_routing_no_such_router.so"));
    CHECK(contains(msg, "libno_such_router.so"));
    CHECK(contains(msg, a.path.string()));
    CHECK(contains(msg, b.path.string()));
    // The configured directories come first in the list.
    CHECK(msg.find(a.path.string()) < msg.find(b.path.string()));
    for (const auto& d : PluginLoader::default_dirs()) {
        CHECK(contains(msg, d));
        CHECK(msg.find(b.path.string()) < msg.find(d));
    }
}

// ---- 2. name resolution

TEST_CASE("a built-in name resolves to steward_<kind>_<name>.so in a configured directory", "[plugin_loader]") {
    PluginLoader loader;
    auto path = loader.resolve("lru", PolicyKind::EVICTION, {STEWARD_PLUGIN_BUILD_DIR});
    REQUIRE(path.ok());
    CHECK(fs::path(*path).lexically_normal().string() == fs::path(builtin("eviction", "lru")).lexically_normal().string());
    auto lib = load_ok(loader, "lru", PolicyKind::EVICTION, {STEWARD_PLUGIN_BUILD_DIR});
    CHECK(lib->name() == "lru");
    CHECK(lib->kind() == PolicyKind::EVICTION);
    CHECK(lib->path() == *path);
    // The kind is part of the file name: there is no routing plugin called lru.
    auto wrong_kind = loader.resolve("lru", PolicyKind::ROUTING, {STEWARD_PLUGIN_BUILD_DIR});
    REQUIRE_FALSE(wrong_kind.ok());
    // The likely mix-up is named: a built-in of another kind goes by that name.
    CHECK(wrong_kind.error().message.find("'lru' is a plugin of kind eviction: use it under [bucket.eviction]") !=
          std::string::npos);
}

TEST_CASE("a plugin name is looked up in the configured directories before the default ones", "[plugin_loader]") {
    // <dir of the test binary>/plugins holds the built-in routing/rules; a configured directory with
    // another file of the same name wins.
    TempDir tmp;
    fs::copy_file(test_plugin("swap_v2"), tmp.path / "steward_routing_rules.so");
    PluginLoader loader;
    auto path = loader.resolve("rules", PolicyKind::ROUTING, {tmp.path.string()});
    REQUIRE(path.ok());
    CHECK(*path == tmp.file("steward_routing_rules.so"));
    CHECK(load_ok(loader, "rules", PolicyKind::ROUTING, {tmp.path.string()})->name() == "swap_v2");
    // <name>.so is found as well.
    fs::copy_file(test_plugin("param_routing"), tmp.path / "my_router.so");
    auto plain = loader.resolve("my_router", PolicyKind::ROUTING, {tmp.path.string()});
    REQUIRE(plain.ok());
    CHECK(*plain == tmp.file("my_router.so"));
}

TEST_CASE("a plugin given as a path is taken as is, not searched for", "[plugin_loader]") {
    PluginLoader loader;
    for (const std::string p : {test_plugin("param_routing"), std::string("/nowhere/x.so"), std::string("rel/dir/x"),
                                std::string("lru.so")}) {
        auto path = loader.resolve(p, PolicyKind::EVICTION, {STEWARD_PLUGIN_BUILD_DIR});
        REQUIRE(path.ok());
        CHECK(*path == p);
    }
    // "lru.so" is a path (relative to the working directory), not the built-in lru.
    CHECK_FALSE(loader.load("lru.so", PolicyKind::EVICTION, {STEWARD_PLUGIN_BUILD_DIR}).ok());
    auto lib = load_ok(loader, test_plugin("param_routing"), PolicyKind::ROUTING);
    CHECK(lib->path() == test_plugin("param_routing"));
    CHECK(lib->name() == "param_routing");
}

// ---- 3. invalid decisions fall back and are counted

TEST_CASE("an invalid routing decision falls back to the bucket's pool and is counted per call", "[plugin_loader]") {
    PluginLoader loader;
    const auto pools = three_pools();
    const auto req = request();
    for (const std::string mode : {"pool", "upgrade_pool", "shadow_pool"}) {
        SECTION("mode " + mode) {
            auto counters = std::make_shared<PolicyCounters>();
            auto r = routing(loader, spec_of(test_plugin("invalid_routing"), {{"mode", mode}}), counters);
            for (int call = 1; call <= 3; call++) {
                bool fallback = false;
                const steward_route_decision d = r->route(req, pools, 2, &fallback);
                CHECK(fallback);
                CHECK(d.pool == 2);
                CHECK(d.upgrade_pool == -1);
                CHECK(d.shadow_pool == -1);
                CHECK(counters->n_invalid.load() == call);
                CHECK(counters->n_calls.load() == call);
            }
            CHECK(r->counters() == counters);
        }
    }
}

TEST_CASE("a routing plugin whose route() returns an error falls back and is counted", "[plugin_loader]") {
    PluginLoader loader;
    auto counters = std::make_shared<PolicyCounters>();
    auto r = routing(loader, spec_of(test_plugin("error_routing")), counters);
    const auto pools = three_pools();
    for (int call = 1; call <= 2; call++) {
        bool fallback = false;
        const steward_route_decision d = r->route(request(), pools, 1, &fallback);
        CHECK(fallback);
        CHECK(d.pool == 1);  // not the 999 the plugin wrote before failing
        CHECK(d.upgrade_pool == -1);
        CHECK(d.shadow_pool == -1);
        CHECK(counters->n_invalid.load() == call);
        CHECK(counters->n_calls.load() == call);
    }
    // No check_upgrade in its table: never upgrade, and that is no fallback.
    CHECK_FALSE(r->has_check_upgrade());
    bool fallback = true;
    const steward_token_view tokens{nullptr, nullptr, 0, 1};
    CHECK_FALSE(r->check_upgrade(request(), tokens, &fallback));
    CHECK_FALSE(fallback);
    CHECK(counters->n_invalid.load() == 2);
}

TEST_CASE("a routing decision naming a pool that is missing or unavailable falls back", "[plugin_loader]") {
    PluginLoader loader;
    auto pools = three_pools();
    bool fallback = false;
    {
        auto counters = std::make_shared<PolicyCounters>();
        auto r = routing(loader, spec_of(test_plugin("param_routing"), {{"pick", int64_t(1)}}), counters);
        CHECK(r->route(request(), pools, 0, &fallback).pool == 1);
        CHECK_FALSE(fallback);
        pools[1].available = 0;
        CHECK(r->route(request(), pools, 0, &fallback).pool == 0);
        CHECK(fallback);
        CHECK(counters->n_invalid.load() == 1);
        CHECK(counters->n_calls.load() == 2);
    }
    {
        auto counters = std::make_shared<PolicyCounters>();
        auto r = routing(loader, spec_of(test_plugin("param_routing"), {{"pick", int64_t(3)}}), counters);
        CHECK(r->route(request(), pools, 2, &fallback).pool == 2);
        CHECK(fallback);
        CHECK(counters->n_invalid.load() == 1);
    }
}

TEST_CASE("a check_upgrade that returns an error answers no upgrade, falls back and is counted", "[plugin_loader]") {
    PluginLoader loader;
    auto counters = std::make_shared<PolicyCounters>();
    auto r = routing(loader, spec_of(test_plugin("invalid_routing"), {{"mode", std::string("check")}}), counters);
    const auto pools = three_pools();
    bool fallback = true;
    const steward_route_decision d = r->route(request(), pools, 0, &fallback);
    CHECK_FALSE(fallback);  // the cascade itself is valid
    CHECK(d.pool == 0);
    CHECK(d.upgrade_pool == 1);
    CHECK(d.check_after_tokens == 1);
    CHECK(counters->n_invalid.load() == 0);
    REQUIRE(r->has_check_upgrade());
    const int32_t ids[2] = {5, 6};
    const float lps[2] = {-3.0f, -4.0f};
    const steward_token_view tokens{ids, lps, 2, 0};
    fallback = false;
    CHECK_FALSE(r->check_upgrade(request(), tokens, &fallback));  // the plugin wrote upgrade = 1, then failed
    CHECK(fallback);
    CHECK(counters->n_invalid.load() == 1);
    CHECK(counters->n_calls.load() == 2);
}

TEST_CASE("a valid routing plugin's decision is kept and nothing is counted as invalid", "[plugin_loader]") {
    PluginLoader loader;
    const auto pools = three_pools();
    bool fallback = true;
    {
        auto counters = std::make_shared<PolicyCounters>();
        auto r = routing(loader, spec_of("rules"), counters);  // a name: found next to the test binary
        const steward_route_decision d = r->route(request(), pools, 1, &fallback);
        CHECK_FALSE(fallback);
        CHECK(d.pool == 1);
        CHECK(d.upgrade_pool == -1);
        CHECK(d.shadow_pool == -1);
        CHECK(counters->n_calls.load() == 1);
        CHECK(counters->n_invalid.load() == 0);
    }
    {
        auto counters = std::make_shared<PolicyCounters>();
        auto r = routing(loader, spec_of(test_plugin("param_routing"), {{"pick", int64_t(2)}}), counters);
        fallback = true;
        CHECK(r->route(request(), pools, 0, &fallback).pool == 2);
        CHECK_FALSE(fallback);
        CHECK(counters->n_invalid.load() == 0);
    }
}

TEST_CASE("an out-of-range eviction victim falls back to the least recently used block and is counted",
          "[plugin_loader]") {
    PluginLoader loader;
    const auto cands = candidates({5, 5, 5});
    EvictionContext ctx;
    ctx.now_tick = 10;
    ctx.n_blocks_total = 8;
    ctx.block_size = 16;
    {
        auto counters = std::make_shared<PolicyCounters>();
        auto p = PluginEvictionPolicy::create(load_ok(loader, test_plugin("invalid_eviction"), PolicyKind::EVICTION),
                                              spec_of(test_plugin("invalid_eviction")), "chat", counters, kPoolNames);
        REQUIRE(p.ok());
        CHECK((*p)->choose_victim(ctx, cands) == 0);
        CHECK((*p)->choose_victim(ctx, cands) == 0);
        CHECK(counters->n_invalid.load() == 2);
        CHECK(counters->n_calls.load() == 2);
    }
    {
        // A valid plugin's choice is kept: lfu picks the block with the fewest hits.
        auto counters = std::make_shared<PolicyCounters>();
        auto p = PluginEvictionPolicy::create(load_ok(loader, "lfu", PolicyKind::EVICTION, {STEWARD_PLUGIN_BUILD_DIR}),
                                              spec_of("lfu"), "chat", counters, kPoolNames);
        REQUIRE(p.ok());
        CHECK((*p)->choose_victim(ctx, candidates({5, 7, 1, 3})) == 2);
        CHECK(counters->n_invalid.load() == 0);
        CHECK(counters->n_calls.load() == 1);
    }
}

TEST_CASE("a draft budget outside [0, max_budget] falls back to 0 and is counted", "[plugin_loader]") {
    PluginLoader loader;
    const auto lib = load_ok(loader, test_plugin("invalid_speculation"), PolicyKind::SPECULATION);
    for (const std::string mode : {"negative", "over_max"}) {
        SECTION("mode " + mode) {
            auto counters = std::make_shared<PolicyCounters>();
            auto p = SpeculationPolicy::create(lib, spec_of(test_plugin("invalid_speculation"), {{"mode", mode}}), "chat",
                                               counters, kPoolNames);
            REQUIRE(p.ok());
            for (int call = 1; call <= 2; call++) {
                bool fallback = false;
                CHECK((*p)->draft_budget(spec_stats(4), &fallback) == 0);
                CHECK(fallback);
                CHECK(counters->n_invalid.load() == call);
                CHECK(counters->n_calls.load() == call);
            }
        }
    }
}

TEST_CASE("a valid draft budget is kept while the built-in fixed budget above the host's limit falls back",
          "[plugin_loader]") {
    PluginLoader loader;
    const auto lib = load_ok(loader, "fixed", PolicyKind::SPECULATION, {STEWARD_PLUGIN_BUILD_DIR});
    auto counters = std::make_shared<PolicyCounters>();
    auto three = SpeculationPolicy::create(lib, spec_of("fixed", {{"budget", int64_t(3)}}), "chat", counters, kPoolNames);
    REQUIRE(three.ok());
    bool fallback = true;
    CHECK((*three)->draft_budget(spec_stats(4), &fallback) == 3);
    CHECK_FALSE(fallback);
    CHECK(counters->n_invalid.load() == 0);
    // Default budget 4 against a limit of 2.
    auto dflt = SpeculationPolicy::create(lib, spec_of("fixed"), "chat", counters, kPoolNames);
    REQUIRE(dflt.ok());
    CHECK((*dflt)->draft_budget(spec_stats(4), &fallback) == 4);
    CHECK_FALSE(fallback);
    CHECK((*dflt)->draft_budget(spec_stats(2), &fallback) == 0);
    CHECK(fallback);
    CHECK(counters->n_invalid.load() == 1);
    CHECK(counters->n_calls.load() == 3);
}

TEST_CASE("the per-sequence draft budget is validated to [0, max_budget] for built-ins, ABI 1-style and invalid plugins",
          "[plugin_loader]") {
    PluginLoader loader;
    auto seq = [](int32_t max_budget, int32_t n_generated = 0, int32_t max_tokens = 64) {
        SpecSeqStats q;
        q.request_id = 9;
        q.bucket = "chat";
        q.tenant = "t";
        q.max_budget = max_budget;
        q.position = 20 + n_generated;
        q.n_generated = n_generated;
        q.max_tokens = max_tokens;
        q.n_steps = 4;
        q.n_proposed = 12;
        q.n_accepted = 8;
        q.recent_acceptance = 0.5;
        return q;
    };
    auto counters = std::make_shared<PolicyCounters>();
    auto make = [&](const std::string& plugin, std::map<std::string, PolicyParam> params = {}) {
        auto lib = load_ok(loader, plugin, PolicyKind::SPECULATION, {STEWARD_PLUGIN_BUILD_DIR});
        auto p = SpeculationPolicy::create(lib, spec_of(plugin, std::move(params)), "chat", counters, kPoolNames);
        REQUIRE(p.ok());
        return std::move(*p);
    };
    bool fallback = true;
    auto off = make("off");
    CHECK(off->draft_budget_seq(seq(4), &fallback) == 0);
    CHECK_FALSE(fallback);
    auto fixed = make("fixed", {{"budget", int64_t(3)}});
    CHECK(fixed->draft_budget_seq(seq(4), &fallback) == 3);
    CHECK_FALSE(fallback);
    CHECK(fixed->draft_budget_seq(seq(4, 62, 64), &fallback) == 1);  // 2 tokens left
    CHECK_FALSE(fallback);
    CHECK(counters->n_invalid.load() == 0);
    // Above the host's limit: refused, 0, counted.
    CHECK(fixed->draft_budget_seq(seq(2), &fallback) == 0);
    CHECK(fallback);
    CHECK(counters->n_invalid.load() == 1);
    // A plugin without draft_budget_seq answers through its per-bucket draft_budget, validated alike.
    auto over = make(test_plugin("invalid_speculation"), {{"mode", std::string("over_max")}});
    REQUIRE(over->library().speculation()->draft_budget_seq == nullptr);
    CHECK(over->draft_budget_seq(seq(4), &fallback) == 0);
    CHECK(fallback);
    auto neg = make(test_plugin("invalid_speculation"));
    CHECK(neg->draft_budget_seq(seq(4), &fallback) == 0);
    CHECK(fallback);
    CHECK(counters->n_invalid.load() == 3);
    CHECK(counters->n_calls.load() == 6);
}

TEST_CASE("a step's draft budgets asked together answer what one question each answers, each validated and counted",
          "[plugin_loader]") {
    PluginLoader loader;
    auto counters = std::make_shared<PolicyCounters>();
    auto lib = load_ok(loader, test_plugin("slow_speculation"), PolicyKind::SPECULATION);
    auto p = SpeculationPolicy::create(lib, spec_of(test_plugin("slow_speculation")), "chat", counters, kPoolNames);
    REQUIRE(p.ok());
    (*p)->set_budget_ms(50);
    (*p)->set_step_budget_ms(2000);  // on the decision thread, well within its budget
    std::vector<SpecSeqStats> qs(20);
    std::vector<std::string> tenants(20);
    for (size_t i = 0; i < qs.size(); i++) {
        tenants[i] = "tenant" + std::to_string(i);
        qs[i].request_id = 5 + i;  // 13 answers -1
        qs[i].bucket = "chat";
        qs[i].tenant = tenants[i].c_str();
        qs[i].max_budget = 1 + (int32_t)(i % 5);
        qs[i].n_generated = (int32_t)(3 * i);
        qs[i].max_tokens = 1000;
    }
    std::vector<int32_t> out(qs.size(), 99);
    std::vector<uint8_t> fb(qs.size(), 9);
    (*p)->draft_budgets(qs, out, fb);
    for (size_t i = 0; i < qs.size(); i++) {
        // The plugin's rule, worked out here: (request id + generated) mod (max + 1); id 13 invalid.
        const bool bad = qs[i].request_id == 13;
        CHECK(fb[i] == (bad ? 1 : 0));
        CHECK(out[i] == (bad ? 0 : (int32_t)((qs[i].request_id + (uint64_t)qs[i].n_generated) % (uint64_t)(qs[i].max_budget + 1))));
    }
    CHECK(counters->n_calls.load() == 20);
    CHECK(counters->n_invalid.load() == 1);
    CHECK(counters->n_timed_out.load() == 0);
    // One at a time answers the same.
    for (size_t i = 0; i < qs.size(); i++) {
        bool f = false;
        CHECK((*p)->draft_budget_seq(qs[i], &f) == out[i]);
        CHECK(f == (fb[i] == 1));
    }
}

TEST_CASE("a step's draft budgets past the step budget all take the safe default, each counted, and the next step "
          "waits for no abandoned call",
          "[plugin_loader]") {
    PluginLoader loader;
    auto counters = std::make_shared<PolicyCounters>();
    auto lib = load_ok(loader, test_plugin("slow_speculation"), PolicyKind::SPECULATION);
    auto p = SpeculationPolicy::create(lib, spec_of(test_plugin("slow_speculation"), {{"sleep_ms", int64_t(150)}}), "chat",
                                       counters, kPoolNames);
    REQUIRE(p.ok());
    (*p)->set_budget_ms(5000);     // the router's budget: not the one a step's asks run under
    (*p)->set_step_budget_ms(20);  // 4 questions of 150 ms each cannot answer within it
    std::vector<SpecSeqStats> qs(4);
    for (size_t i = 0; i < qs.size(); i++) qs[i].request_id = 1 + i, qs[i].max_budget = 4;
    std::vector<int32_t> out(4, 7);
    std::vector<uint8_t> fb(4, 0);
    (*p)->draft_budgets(qs, out, fb);
    for (size_t i = 0; i < 4; i++) {
        CHECK(out[i] == 0);
        CHECK(fb[i] == 1);
    }
    CHECK(counters->n_calls.load() == 4);
    CHECK(counters->n_timed_out.load() == 4);
    // The abandoned batch still runs: the next step's questions get the safe default at once.
    REQUIRE((*p)->busy());
    (*p)->draft_budgets(qs, out, fb);
    for (size_t i = 0; i < 4; i++) CHECK(fb[i] == 1);
    CHECK(counters->n_timed_out.load() == 8);
    CHECK(counters->n_calls.load() == 4);  // questions answered while busy are not calls, as one at a time
    // Once it has returned, the policy answers again (one question: the plugin's own rule).
    while ((*p)->busy()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (*p)->set_step_budget_ms(5000);
    bool f = true;
    CHECK((*p)->draft_budget_seq(qs[2], &f) == (int32_t)((3 + 0) % 5));
    CHECK_FALSE(f);
}

// ---- ABI 2: older plugins, newer entry points

TEST_CASE("an ABI 1 plugin built against the frozen v1 header loads, and its table's missing v2 functions read NULL",
          "[plugin_loader]") {
    PluginLoader loader;
    auto rlib = load_ok(loader, test_plugin("v1_routing"), PolicyKind::ROUTING);
    CHECK(rlib->abi_version() == 1);
    CHECK(rlib->routing()->version == 1);
    CHECK(rlib->routing()->route != nullptr);
    CHECK(rlib->routing()->route_v2 == nullptr);
    CHECK(rlib->routing()->on_outcome == nullptr);
    auto counters = std::make_shared<PolicyCounters>();
    auto r = RoutingPolicy::create(rlib, spec_of(test_plugin("v1_routing"), {{"pick", int64_t(2)}}), "chat", counters,
                                   kPoolNames);
    REQUIRE(r.ok());
    bool fallback = true;
    RouteInput in = request();
    in.session = "s";
    in.session_pool = 0;
    CHECK((*r)->route(in, three_pools(), 0, &fallback).pool == 2);
    CHECK_FALSE(fallback);
    CHECK_FALSE((*r)->has_outcome());
    (*r)->on_outcome(in, RouteOutcome{});  // absent: nothing is called
    CHECK(counters->n_outcomes.load() == 0);

    auto elib = load_ok(loader, test_plugin("v1_eviction"), PolicyKind::EVICTION);
    CHECK(elib->eviction()->choose_victim_v2 == nullptr);
    auto e = PluginEvictionPolicy::create(elib, spec_of(test_plugin("v1_eviction")), "chat", counters, kPoolNames);
    REQUIRE(e.ok());
    EvictionContext ctx;
    ctx.n_blocks_total = 8;
    CHECK((*e)->choose_victim(ctx, candidates({1, 1, 1, 1})) == 3);  // most recently used, not LRU's 0
    CHECK(counters->n_invalid.load() == 0);
}

TEST_CASE("a v2 router is told its outcomes: the learning test router alternates pools only when they arrive",
          "[plugin_loader]") {
    PluginLoader loader;
    auto counters = std::make_shared<PolicyCounters>();
    auto r = routing(loader, spec_of(test_plugin("outcome_routing")), counters);
    REQUIRE(r->has_outcome());
    const RouteInput in = request();
    bool fallback = true;
    CHECK(r->route(in, three_pools(), 2, &fallback).pool == 0);
    CHECK_FALSE(fallback);
    RouteOutcome served;
    served.pool = 0;
    served.finish = FinishReason::STOP;
    served.n_prompt_tokens = 10;
    served.n_output_tokens = 4;
    served.ttft_ms = 5;
    served.tpot_ms = 1;
    served.e2e_ms = 9;
    served.cost = 1e-6;
    r->on_outcome(in, served);
    CHECK(r->route(in, three_pools(), 2, &fallback).pool == 1);
    r->on_outcome(in, served);
    CHECK(r->route(in, three_pools(), 2, &fallback).pool == 2);
    CHECK(counters->n_outcomes.load() == 2);
    CHECK(counters->n_invalid.load() == 0);
    // A report of a request that never ran reaches it with pool -1 and the finish reason mapped.
    RouteOutcome failed = served;
    failed.pool = -1;
    failed.finish = FinishReason::OVERLOADED;
    r->on_outcome(in, failed);
    CHECK(r->route(in, three_pools(), 2, &fallback).pool == 2);  // the plugin's error: the default
    CHECK(fallback);
    CHECK(counters->n_invalid.load() == 1);
}

TEST_CASE("an eviction plugin declining every candidate answers no victim, counted as declined and not invalid",
          "[plugin_loader]") {
    PluginLoader loader;
    auto counters = std::make_shared<PolicyCounters>();
    auto p = PluginEvictionPolicy::create(load_ok(loader, test_plugin("decline_eviction"), PolicyKind::EVICTION),
                                          spec_of(test_plugin("decline_eviction")), "chat", counters, kPoolNames);
    REQUIRE(p.ok());
    const std::vector<std::string> names = {"", "acme", "globex"};
    const TenantBlocks held[] = {{1, 3, -1}, {2, 1, 4}};
    EvictionContext ctx;
    ctx.n_blocks_total = 8;
    ctx.requesting_tenant = 2;
    ctx.tenants = held;
    ctx.tenant_names = &names;
    CHECK((*p)->choose_victim(ctx, candidates({1, 2})) == EvictionPolicy::k_no_victim);
    CHECK(counters->n_declined.load() == 1);
    CHECK(counters->n_invalid.load() == 0);
    // Without tenant names the test plugin answers an error: LRU, counted as invalid.
    ctx.tenant_names = nullptr;
    CHECK((*p)->choose_victim(ctx, candidates({1, 2})) == 0);
    CHECK(counters->n_declined.load() == 1);
    CHECK(counters->n_invalid.load() == 1);
}

TEST_CASE("a block pool whose policy declines answers no room, counts it, and allocates again once a block is free",
          "[plugin_loader]") {
    struct Decline : EvictionPolicy {
        int n = 0;
        size_t choose_victim(const EvictionContext&, std::span<const EvictionCandidate>) override { return n++, k_no_victim; }
    };
    KvManager mgr(3, 4);  // a sequence of 2 cached blocks and one free block
    Decline decline;
    const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
    const SeqId a = mgr.add_seq(1, toks);
    REQUIRE(mgr.allocate_slots(a, 8).has_value());
    mgr.commit_computed(a, 8);
    mgr.publish_full_blocks(a);
    mgr.free(a);  // its 2 blocks cached and evictable; 1 block uncached and free
    const std::vector<int32_t> other = {9, 10, 11, 12, 13};
    const SeqId b = mgr.add_seq(1, other);
    mgr.set_active_eviction(&decline, 1);
    CHECK_FALSE(mgr.allocate_slots(b, 5).has_value());  // declined on its second block: the first goes back
    CHECK(decline.n == 1);
    CHECK(mgr.seq(b).blocks.empty());
    CHECK(mgr.pool().stats().n_declined == 1);
    CHECK(mgr.pool().check_invariants().empty());
    mgr.set_active_eviction(nullptr, 1);  // LRU, as the engine does for a request nothing else can help
    CHECK(mgr.allocate_slots(b, 5).has_value());
    CHECK(mgr.seq(b).blocks.size() == 2);
}

// ---- 4. parameters

TEST_CASE("a parameter the plugin never reads is refused as unknown, at the key's location", "[plugin_loader]") {
    PluginLoader loader;
    SECTION("a plugin without parameters") {
        PolicySpec s = spec_of("rules", {{"weight", 0.5}});
        s.param_where["weight"] = "test.toml:7:1";
        auto p = RoutingPolicy::create(load_ok(loader, "rules", PolicyKind::ROUTING, {STEWARD_PLUGIN_BUILD_DIR}), s,
                                       "chat", std::make_shared<PolicyCounters>(), kPoolNames);
        REQUIRE_FALSE(p.ok());
        const std::string& msg = p.error().message;
        INFO(msg);
        CHECK(contains(msg, "unknown parameter 'weight'"));
        CHECK(contains(msg, "test.toml:7:1"));
        CHECK(contains(msg, "bucket 'chat'"));
        CHECK(contains(msg, "it reads: none"));
    }
    SECTION("a misspelt key next to a known one") {
        PolicySpec s = spec_of(test_plugin("param_routing"), {{"pick", int64_t(1)}, {"pik", int64_t(1)}});
        auto p = RoutingPolicy::create(load_ok(loader, s.plugin, PolicyKind::ROUTING), s, "chat",
                                       std::make_shared<PolicyCounters>(), kPoolNames);
        REQUIRE_FALSE(p.ok());
        const std::string& msg = p.error().message;
        INFO(msg);
        CHECK(contains(msg, "unknown parameter 'pik'"));
        CHECK(contains(msg, "it reads: pick"));
    }
}

TEST_CASE("a plugin's own parameter error is reported with its message and the bucket name", "[plugin_loader]") {
    PluginLoader loader;
    auto lib = load_ok(loader, "fixed", PolicyKind::SPECULATION, {STEWARD_PLUGIN_BUILD_DIR});
    auto p = SpeculationPolicy::create(lib, spec_of("fixed", {{"budget", int64_t(-1)}}), "long_answers",
                                       std::make_shared<PolicyCounters>(), kPoolNames);
    REQUIRE_FALSE(p.ok());
    const std::string& msg = p.error().message;
    INFO(msg);
    CHECK(contains(msg, "parameter 'budget' must be in [0,"));
    CHECK(contains(msg, "bucket 'long_answers'"));
    CHECK(contains(msg, "test.toml:1:1"));
    // A plugin that refuses without a message: the error code is reported instead.
    auto q = RoutingPolicy::create(load_ok(loader, test_plugin("invalid_routing"), PolicyKind::ROUTING),
                                   spec_of(test_plugin("invalid_routing"), {{"mode", std::string("bogus")}}), "chat",
                                   std::make_shared<PolicyCounters>(), kPoolNames);
    REQUIRE_FALSE(q.ok());
    CHECK(contains(q.error().message, "create() returned error " + std::to_string(STEWARD_PLUGIN_ERR_PARAM)));
    CHECK(contains(q.error().message, "bucket 'chat'"));
}

// ---- 5. one plugin, two buckets

TEST_CASE("two buckets with different parameters of one plugin get two instances of one library that decide "
          "differently",
          "[plugin_loader]") {
    const std::string toml = std::string(R"(
[plugins]
dirs = [")") + STEWARD_TEST_PLUGIN_DIR + R"("]

[[pool]]
name = "small"
model = "/nonexistent/small.gguf"

[[pool]]
name = "big"
model = "/nonexistent/big.gguf"

[[bucket]]
name = "first"
pool = "big"
[bucket.match]
hint = "first"
[bucket.routing]
plugin = "param_routing"
pick = 0

[[bucket]]
name = "second"
pool = "small"
[bucket.routing]
plugin = ")" + test_plugin("param_routing") + R"("
pick = 1
)";
    auto config = parse_config(toml, "two_buckets.toml");
    INFO((config ? "" : config.error().message));
    REQUIRE(config.ok());
    REQUIRE(config->buckets.size() == 2);
    PluginLoader loader;
    PolicyCounterRegistry registry;
    auto policies = create_policies(*config, loader, registry);
    INFO((policies ? "" : policies.error().message));
    REQUIRE(policies.ok());
    REQUIRE(policies->size() == 2);
    const BucketPolicies& first = (*policies)[0];
    const BucketPolicies& second = (*policies)[1];
    REQUIRE(first.routing);
    REQUIRE(second.routing);
    CHECK_FALSE(first.eviction);
    CHECK_FALSE(first.speculation);

    const std::vector<steward_pool_view> pools = {pool_view("small"), pool_view("big")};
    const auto req = request();
    bool fallback = true;
    // Each against its own bucket's pool as the default, so the plugin's answer is what is seen.
    CHECK(first.routing->route(req, pools, 1, &fallback).pool == 0);
    CHECK_FALSE(fallback);
    CHECK(second.routing->route(req, pools, 0, &fallback).pool == 1);
    CHECK_FALSE(fallback);

    CHECK(first.routing.get() != second.routing.get());
    CHECK(&first.routing->library() == &second.routing->library());
    CHECK(first.routing->bucket() == "first");
    CHECK(second.routing->bucket() == "second");
    CHECK(first.routing->counters() != second.routing->counters());
    CHECK(first.routing->counters()->n_calls.load() == 1);
    CHECK(registry.all().size() == 2);

    // A second generation from the same loader reuses the loaded library; its counters carry on.
    auto again = create_policies(*config, loader, registry);
    REQUIRE(again.ok());
    CHECK(&(*again)[0].routing->library() == &first.routing->library());
    CHECK((*again)[0].routing.get() != first.routing.get());
    CHECK((*again)[0].routing->counters() == first.routing->counters());
}

// ---- 6. reload of a changed file

TEST_CASE("the loader loads a changed plugin file afresh while instances of the old code keep working",
          "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("swap.so");
    fs::copy_file(test_plugin("swap_v1"), path);
    PluginLoader loader;
    const std::vector<steward_pool_view> pools = {pool_view("a"), pool_view("b")};
    const auto req = request();
    bool fallback = true;

    auto lib1 = load_ok(loader, path, PolicyKind::ROUTING);
    CHECK(lib1->name() == "swap_v1");
    CHECK(load_ok(loader, path, PolicyKind::ROUTING).get() == lib1.get());  // unchanged: cached
    const PolicySpec spec = spec_of(path);
    auto old_instance = RoutingPolicy::create(lib1, spec, "chat", std::make_shared<PolicyCounters>(), {"a", "b"});
    REQUIRE(old_instance.ok());
    CHECK((*old_instance)->route(req, pools, 1, &fallback).pool == 0);
    CHECK_FALSE(fallback);

    // Replace the file: a new inode (written beside it, then renamed over it) and another mtime.
    struct stat before {};
    REQUIRE(::stat(path.c_str(), &before) == 0);
    const auto old_mtime = fs::last_write_time(path);
    const std::string next = tmp.file("swap.so.new");
    fs::copy_file(test_plugin("swap_v2"), next);
    fs::last_write_time(next, old_mtime + std::chrono::seconds(5));
    fs::rename(next, path);
    struct stat after {};
    REQUIRE(::stat(path.c_str(), &after) == 0);
    REQUIRE(after.st_ino != before.st_ino);

    auto lib2 = load_ok(loader, path, PolicyKind::ROUTING);
    CHECK(lib2.get() != lib1.get());
    CHECK(lib2->load_serial() != lib1->load_serial());
    CHECK(lib2->name() == "swap_v2");
    CHECK(load_ok(loader, path, PolicyKind::ROUTING).get() == lib2.get());  // the new one is cached now
    auto new_instance = RoutingPolicy::create(lib2, spec, "chat", std::make_shared<PolicyCounters>(), {"a", "b"});
    REQUIRE(new_instance.ok());
    CHECK((*new_instance)->route(req, pools, 0, &fallback).pool == 1);
    CHECK_FALSE(fallback);

    // The old instance holds the old library, even with every other reference gone.
    lib1.reset();
    CHECK((*old_instance)->library().name() == "swap_v1");
    CHECK((*old_instance)->route(req, pools, 1, &fallback).pool == 0);
    CHECK_FALSE(fallback);
}

TEST_CASE("the loader's private copy makes a plugin file removed after loading irrelevant", "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("router.so");
    fs::copy_file(test_plugin("param_routing"), path);
    PluginLoader loader;
    auto lib = load_ok(loader, path, PolicyKind::ROUTING);
    fs::remove(path);
    auto p = RoutingPolicy::create(lib, spec_of(path, {{"pick", int64_t(1)}}), "chat",
                                   std::make_shared<PolicyCounters>(), kPoolNames);
    REQUIRE(p.ok());
    bool fallback = true;
    CHECK((*p)->route(request(), three_pools(), 0, &fallback).pool == 1);
    CHECK_FALSE(fallback);
    CHECK_FALSE(loader.load(path, PolicyKind::ROUTING, {}).ok());  // gone from disk: not served from the cache
}

// ---- 7. config errors

TEST_CASE("a bucket policy table without plugin is refused, asking for plugin =", "[plugin_loader]") {
    auto c = parse_config(R"([[pool]]
name = "p"
model = "m.gguf"

[[bucket]]
name = "chat"
[bucket.eviction]
capacity = 3
)",
                          "cfg.toml");
    REQUIRE_FALSE(c.ok());
    const std::string& msg = c.error().message;
    INFO(msg);
    CHECK(contains(msg, "cfg.toml:7:"));
    CHECK(contains(msg, "[bucket.eviction]"));
    CHECK(contains(msg, "'chat'"));
    CHECK(contains(msg, "plugin = "));
}

TEST_CASE("a plugin parameter that is not a scalar is refused at its file:line:column", "[plugin_loader]") {
    auto c = parse_config(R"([[pool]]
name = "p"
model = "m.gguf"

[[bucket]]
name = "chat"
[bucket.routing]
plugin = "cost_quality"
weights = [1, 2]
)",
                          "cfg.toml");
    REQUIRE_FALSE(c.ok());
    const std::string& msg = c.error().message;
    INFO(msg);
    CHECK(contains(msg, "cfg.toml:9:11"));
    CHECK(contains(msg, "weights"));
    CHECK(contains(msg, "plugin parameters must be strings, numbers or booleans"));
}

TEST_CASE("parsed plugin parameters keep their TOML type and location", "[plugin_loader]") {
    auto c = parse_config(R"([[pool]]
name = "p"
model = "m.gguf"

[[bucket]]
name = "chat"
[bucket.speculation]
plugin = "fixed"
budget = 3
scale = 0.5
on = true
label = "x"
)",
                          "cfg.toml");
    INFO((c ? "" : c.error().message));
    REQUIRE(c.ok());
    REQUIRE(c->buckets[0].speculation);
    const PolicySpec& s = *c->buckets[0].speculation;
    CHECK(s.plugin == "fixed");
    CHECK(s.params.size() == 4);
    CHECK(std::get<int64_t>(s.params.at("budget")) == 3);
    CHECK(std::get<double>(s.params.at("scale")) == 0.5);
    CHECK(std::get<bool>(s.params.at("on")));
    CHECK(std::get<std::string>(s.params.at("label")) == "x");
    CHECK(s.param_where.at("budget") == "cfg.toml:9:1");
    CHECK(contains(s.where, "cfg.toml:7:"));
}

namespace {
// A config whose pools synthesize their model (the file does not exist and nothing is loaded).
std::string synth_config(const TempDir& tmp, const std::string& buckets) {
    return "[plugins]\ndirs = [\"" + std::string(STEWARD_PLUGIN_BUILD_DIR) + "\"]\n\n[[pool]]\nname = \"p\"\nmodel = \"" +
           tmp.file("models/not_yet.gguf") + "\"\n[pool.synth]\ndim = 64\nlayers = 1\nheads = 2\nkv_heads = 2\n" +
           "ffn = 128\nvocab = 512\nctx = 128\n\n" + buckets;
}
}  // namespace

TEST_CASE("check_config_file refuses a bucket naming a plugin that does not exist, naming it", "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("steward.toml");
    write_file(path, synth_config(tmp, "[[bucket]]\nname = \"chat\"\n[bucket.routing]\nplugin = \"no_such_router\"\n"));
    auto r = check_config(path);
    REQUIRE_FALSE(r.ok());
    const std::string& msg = r.error().message;
    INFO(msg);
    CHECK(contains(msg, "no routing plugin named 'no_such_router'"));
    CHECK(contains(msg, "bucket 'chat'"));
    CHECK(contains(msg, path + ":"));
}

TEST_CASE("check_config_file refuses a plugin's bad parameter, naming the file, bucket and key", "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("steward.toml");
    write_file(path, synth_config(tmp, "[[bucket]]\nname = \"chat\"\n[bucket.speculation]\nplugin = \"fixed\"\nbudget = -2\n"));
    auto r = check_config(path);
    REQUIRE_FALSE(r.ok());
    const std::string& msg = r.error().message;
    INFO(msg);
    CHECK(contains(msg, path + ":"));
    CHECK(contains(msg, "bucket 'chat'"));
    CHECK(contains(msg, "parameter 'budget'"));
}

TEST_CASE("check_config_file accepts a config whose buckets use built-in plugins", "[plugin_loader]") {
    TempDir tmp;
    const std::string path = tmp.file("steward.toml");
    write_file(path, synth_config(tmp, R"([[bucket]]
name = "chat"
[bucket.routing]
plugin = "rules"
[bucket.eviction]
plugin = "lru"
[bucket.speculation]
plugin = "fixed"
budget = 2
)"));
    auto r = check_config(path);
    INFO((r ? "" : r.error().message));
    REQUIRE(r.ok());
    CHECK(contains(*r, path + ": ok"));
    CHECK(contains(*r, "3 plugin instances"));
}
