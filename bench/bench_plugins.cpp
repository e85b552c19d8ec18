// Plugin bench: what a decision costs through the C ABI (vs the same choice compiled into the host),
// and what the eviction policies buy: the prefix-cache hit rate and the prefill tokens computed by
// one Engine under a tight KV pool, replaying a workload of hot shared prefixes among one-off prompts;
// and what a route decision costs in-process and in a plugin host process (isolation = "process").
// Run: ./build/bench_plugins [--quick]   (built-in plugins are found in build/plugins)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "model/model.h"
#include "model/synth.h"
#include "plugin/plugin_loader.h"
#include "plugin/policies.h"
#include "sched/engine.h"

using namespace steward;
using clk = std::chrono::steady_clock;

namespace {

// The host's own least-recently-used choice behind the same virtual interface: the baseline for
// what crossing the C ABI (and converting the candidate list) adds.
struct HostLru : EvictionPolicy {
    size_t choose_victim(const EvictionContext&, std::span<const EvictionCandidate>) override { return 0; }
};

// Loads a built-in plugin and creates one instance with default parameters; exits on error.
template <typename Policy>
std::shared_ptr<Policy> make_plugin(PluginLoader& loader, const std::string& name, PolicyKind kind,
                                    const InstanceIsolation& iso = {}) {
    PolicySpec spec;
    spec.plugin = name;
    spec.where = "bench";
    auto lib = loader.load(name, kind, {});
    if (!lib) {
        std::fprintf(stderr, "bench_plugins: %s\n", lib.error().message.c_str());
        std::exit(1);
    }
    auto p = Policy::create(*lib, spec, "bench", std::make_shared<PolicyCounters>(), {"large", "small"}, iso);
    if (!p) {
        std::fprintf(stderr, "bench_plugins: %s\n", p.error().message.c_str());
        std::exit(1);
    }
    return std::shared_ptr<Policy>(std::move(*p));
}

std::shared_ptr<PluginEvictionPolicy> eviction_plugin(PluginLoader& loader, const std::string& name) {
    return make_plugin<PluginEvictionPolicy>(loader, name, PolicyKind::EVICTION);
}

std::shared_ptr<RoutingPolicy> routing_plugin(PluginLoader& loader, const std::string& name) {
    return make_plugin<RoutingPolicy>(loader, name, PolicyKind::ROUTING);
}

using bench::cpu_model;

template <typename F>
double ns_per_call(int n, F&& f) {
    const auto t0 = clk::now();
    for (int i = 0; i < n; i++) f(i);
    return std::chrono::duration<double, std::nano>(clk::now() - t0).count() / n;
}

// ns per route decision of p over `views`: n timed calls after `warm` untimed ones; *fell_back: any
// answered by the safe default.
double route_ns(RoutingPolicy& p, const std::vector<steward_pool_view>& views, int warm, int n, bool* fell_back) {
    RouteInput rq;
    rq.bucket = "bench";
    rq.tenant = "t";
    rq.n_prompt_tokens = 100;
    rq.max_tokens = 32;
    uint64_t sink = 0;
    *fell_back = false;
    auto one = [&](int i) {
        bool fb = false;
        rq.request_id = (uint64_t)i;
        sink += (uint64_t)p.route(rq, views, 0, &fb).pool;
        *fell_back |= fb;
    };
    if (warm > 0) ns_per_call(warm, one);
    const double ns = ns_per_call(n, one);
    if (sink == (uint64_t)-1) std::printf("!");
    return ns;
}

// One replay through an Engine: returns (hit rate, prompt tokens computed).
struct Replay {
    double hit_rate = 0;
    int64_t computed = 0;
    int64_t evictions = 0;
};

Replay replay(const Model& m, const std::vector<std::vector<int32_t>>& prompts, std::shared_ptr<EvictionPolicy> policy,
              int n_blocks) {
    EngineOptions eo;
    eo.n_blocks = n_blocks;
    eo.block_size = 16;
    eo.max_batch = 4;
    eo.max_batch_tokens = 512;
    eo.n_threads = 1;
    Engine e(m, eo);
    int64_t n_prompt = 0, n_cached = 0;
    uint64_t id = 1;
    for (const auto& p : prompts) {
        EngineRequest r;
        r.id = id++;
        r.prompt = p;
        r.max_tokens = 1;
        r.stop_at_eos = false;
        r.eviction = policy;
        r.bucket = "bench";
        if (!e.submit(std::move(r))) std::exit(1);
        // One request at a time: the cache holds what the policy kept from the ones before.
        while (e.has_work())
            for (const EngineEvent& ev : e.step(0.0))
                if (ev.finished) {
                    n_prompt += ev.n_prompt_tokens;
                    n_cached += ev.n_cached_prompt_tokens;
                }
    }
    Replay out;
    out.hit_rate = n_prompt ? (double)n_cached / (double)n_prompt : 0;
    out.computed = n_prompt - n_cached;
    out.evictions = e.stats().kv.n_evictions;
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    PluginLoader loader;

    std::printf("1. decision cost through the C ABI (ns per call, candidate list converted included)\n");
    std::printf("%-28s %10s %10s\n", "eviction policy", "64 cands", "512 cands");
    std::vector<std::pair<std::string, std::shared_ptr<EvictionPolicy>>> ev = {{"host LRU (compiled in)", std::make_shared<HostLru>()}};
    for (const char* n : {"lru", "lfu", "cost_aware", "tenant_fair"}) ev.push_back({std::string("plugin ") + n, eviction_plugin(loader, n)});
    std::mt19937_64 rng(1);
    std::vector<TenantBlocks> tenants = {{1, 100, 80}, {2, 20, -1}, {3, 5, -1}};
    for (auto& [name, p] : ev) {
        double ns[2];
        int k = 0;
        for (int n_cands : {64, 512}) {
            std::vector<EvictionCandidate> c(n_cands);
            for (int i = 0; i < n_cands; i++)
                c[i] = {i, (BlockHash)rng(), 1 + (int32_t)(rng() % 3), false, i, (int64_t)(rng() % 8), (int32_t)(rng() % 16)};
            EvictionContext ctx;
            ctx.n_blocks_total = 1024;
            ctx.block_size = 16;
            ctx.block_bytes = 65536;
            ctx.tenants = tenants;
            size_t sink = 0;
            ns[k++] = ns_per_call(quick ? 2000 : 200000, [&](int) { sink += p->choose_victim(ctx, c); });
            if (sink == (size_t)-1) std::printf("!");
        }
        std::printf("%-28s %10.0f %10.0f\n", name.c_str(), ns[0], ns[1]);
    }
    std::printf("%-28s %10s\n", "routing policy", "2 pools");
    std::vector<steward_pool_view> views(2);
    views[0] = {"large", 1, 8, 3e7, 0.5, 1.5, 1e-4, 800, 50, 10, 1.0, 0.1, 3, 8};
    views[1] = {"small", 1, 2, 8e6, 0.1, 0.3, 2e-5, 300, 20, 3, 0.5, 0.0, 0, 4};
    for (const char* n : {"rules", "cost_quality", "cascade"}) {
        bool fell_back = false;
        const double ns = route_ns(*routing_plugin(loader, n), views, 0, quick ? 2000 : 200000, &fell_back);
        std::printf("%-28s %10.0f\n", (std::string("plugin ") + n).c_str(), ns);
    }

    // 1b. In-process vs a plugin host process under the default routing budget (50 ms): the in-process
    // call hands off to the instance's decision thread (a wake-up each way), the isolated one is a
    // socket round trip to another process (encode, send, the host's read, decode, call, and back).
    // "no budget" is the direct call (decision_budget_ms = 0).
    std::printf("\n1b. route decision cost by isolation (cost_quality, 2 pools, decision_budget_ms = 50) on %s\n", cpu_model().c_str());
    std::printf("%-28s %10s\n", "isolation", "us/decision");
    struct Mode {
        const char* label;
        PluginIsolation where;
        double budget_ms;
    };
    for (const Mode& m : {Mode{"in_process, no budget", PluginIsolation::IN_PROCESS, 0}, Mode{"in_process", PluginIsolation::IN_PROCESS, 50},
                          Mode{"process", PluginIsolation::PROCESS, 50}}) {
        auto p = make_plugin<RoutingPolicy>(loader, "cost_quality", PolicyKind::ROUTING, {m.where, 5000});
        p->set_budget_ms(m.budget_ms);
        bool fell_back = false;
        // Warmed first: the decision thread, the host's pages.
        const double ns = route_ns(*p, views, quick ? 200 : 2000, quick ? 2000 : 50000, &fell_back);
        std::printf("%-28s %10.2f%s\n", m.label, ns / 1000, fell_back ? "  (fell back!)" : "");
    }

    // 2. What eviction buys: 4 hot 96-token prefixes (each re-asked every few requests with a new
    // 16-token question) among one-off 96-token prompts; 24 blocks of 16 hold ~4 prompts.
    SynthSpec spec;
    spec.n_embd = 64;
    spec.n_layer = 2;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ff = 128;
    spec.n_vocab = 512;
    spec.n_ctx = 512;
    spec.seed = 3;
    const std::string path = (std::filesystem::temp_directory_path() / "steward_bench_plugins.gguf").string();
    if (!synth_write(spec, path)) return 1;
    auto model = Model::load(path);
    if (!model) return 1;
    std::mt19937_64 w(7);
    auto random_ids = [&](int n) {
        std::vector<int32_t> v;
        for (int i = 0; i < n; i++) v.push_back(3 + (int32_t)(w() % 500));
        return v;
    };
    std::vector<std::vector<int32_t>> hot;
    for (int i = 0; i < 4; i++) hot.push_back(random_ids(96));
    std::vector<std::vector<int32_t>> prompts;
    const int n_req = quick ? 200 : 1000;
    for (int i = 0; i < n_req; i++) {
        std::vector<int32_t> p = (w() % 100) < 40 ? hot[w() % hot.size()] : random_ids(96);
        auto q = random_ids(16);
        p.insert(p.end(), q.begin(), q.end());
        prompts.push_back(p);
    }
    std::printf("\n2. eviction policies on one engine, %d requests (40%% reuse 4 hot 96-token prefixes), 24 blocks of 16\n", n_req);
    std::printf("%-12s %10s %16s %10s\n", "policy", "hit rate", "prefill tokens", "evictions");
    for (const char* n : {"lru", "lfu", "cost_aware", "tenant_fair"}) {
        const Replay r = replay(**model, prompts, eviction_plugin(loader, n), 24);
        std::printf("%-12s %9.1f%% %16lld %10lld\n", n, r.hit_rate * 100, (long long)r.computed, (long long)r.evictions);
    }
    std::filesystem::remove(path);
    return 0;
}
