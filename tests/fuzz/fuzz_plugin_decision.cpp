// Fuzzes the host's validation of plugin decisions (runtime/plugin/policies.*): RoutingPolicy,
// PluginEvictionPolicy and SpeculationPolicy over fake plugins (fake_plugin.c, ABI 1 and ABI 2
// tables) whose every answer (pools, victims, budgets, error codes) comes from the fuzz input, on
// questions (pools, availability, candidates, tenants, limits) that come from it too.
// Invariants: a decision the host lets through is valid (an available pool, another available pool
// to upgrade or shadow on with check_after_tokens > 0 and a check_upgrade to ask, a victim index in
// range or "no victim" from ABI 2, a budget in [0, max]); a rejected one is exactly the safe default;
// the invalid counter moves by one exactly when a decision was replaced.
#include <fuzzer/FuzzedDataProvider.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "plugin/plugin_loader.h"
#include "plugin/policies.h"

using namespace steward;

namespace {

FuzzedDataProvider* g_fdp = nullptr;

void fail(const char* what) {
    std::fprintf(stderr, "fuzz_plugin_decision invariant broken: %s\n", what);
    std::abort();
}

struct Policies {
    std::vector<std::string> pool_names;
    PolicySpec spec;
    std::unique_ptr<RoutingPolicy> routing[2];
    std::unique_ptr<PluginEvictionPolicy> eviction[2];
    std::unique_ptr<SpeculationPolicy> speculation[2];
};
Policies* g = nullptr;

std::shared_ptr<PluginLibrary> open_fake(const std::string& name, PolicyKind kind) {
    const std::string path = std::string(STEWARD_FUZZ_PLUGIN_DIR) + "/fake_" + name + ".so";
    auto lib = PluginLibrary::open(path, kind);
    if (!lib) {
        std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), lib.error().message.c_str());
        std::exit(2);
    }
    return *lib;
}

template <typename T>
T must(Expected<T> e) {
    if (!e) {
        std::fprintf(stderr, "cannot create a fake policy: %s\n", e.error().message.c_str());
        std::exit(2);
    }
    return std::move(*e);
}

std::shared_ptr<PolicyCounters> counters(const char* kind) {
    auto c = std::make_shared<PolicyCounters>();
    c->bucket = "fuzz", c->kind = kind, c->plugin = "fake";
    return c;
}

void fuzz_route(RoutingPolicy& p, FuzzedDataProvider& fdp) {
    const int n = fdp.ConsumeIntegralInRange(1, 8);
    std::vector<steward_pool_view> pools(n);
    for (int i = 0; i < n; i++) {
        pools[i] = steward_pool_view{};
        pools[i].name = g->pool_names[i].c_str();
        pools[i].available = fdp.ConsumeBool();
        pools[i].est_cost = fdp.ConsumeFloatingPoint<double>();
    }
    RouteInput in;
    in.request_id = fdp.ConsumeIntegral<uint64_t>();
    in.bucket = fdp.ConsumeRandomLengthString(8);
    in.tenant = fdp.ConsumeRandomLengthString(8);
    in.session = fdp.ConsumeRandomLengthString(8);
    in.session_pool = fdp.ConsumeIntegral<int32_t>();
    in.n_prompt_tokens = fdp.ConsumeIntegral<int32_t>();
    in.max_tokens = fdp.ConsumeIntegral<int32_t>();
    in.n_cached_prompt_tokens.resize(fdp.ConsumeIntegralInRange(0, n));
    for (auto& c : in.n_cached_prompt_tokens) c = fdp.ConsumeIntegral<int32_t>();
    const int32_t def = fdp.ConsumeIntegralInRange(0, n - 1);

    const int64_t invalid_before = p.counters()->n_invalid;
    bool fallback = true;
    const steward_route_decision d = p.route(in, pools, def, &fallback);
    if (p.counters()->n_invalid - invalid_before != (fallback ? 1 : 0)) fail("route: the invalid count does not match the fallback");
    auto usable = [&](int32_t i) { return i >= 0 && i < n && pools[i].available; };
    if (fallback) {
        if (d.pool != def || d.upgrade_pool != -1 || d.check_after_tokens != 0 || d.shadow_pool != -1)
            fail("route: a rejected decision is not the safe default");
    } else {
        if (!usable(d.pool)) fail("route: a pool that is not available got through");
        if (d.upgrade_pool != -1 &&
            (!usable(d.upgrade_pool) || d.upgrade_pool == d.pool || d.check_after_tokens <= 0 || !p.has_check_upgrade()))
            fail("route: an invalid upgrade got through");
        if (d.shadow_pool != -1 && (!usable(d.shadow_pool) || d.shadow_pool == d.pool))
            fail("route: an invalid shadow pool got through");
    }

    std::vector<int32_t> tokens(fdp.ConsumeIntegralInRange(0, 16));
    for (auto& t : tokens) t = fdp.ConsumeIntegral<int32_t>();
    std::vector<float> logprobs(tokens.size(), -1.0f);
    const steward_token_view tv{tokens.data(), logprobs.data(), (uint32_t)tokens.size(), fdp.ConsumeBool() ? 1 : 0};
    const int64_t before_check = p.counters()->n_invalid;
    bool fb2 = true;
    const bool up = p.check_upgrade(in, tv, &fb2);
    if (p.counters()->n_invalid - before_check != (fb2 ? 1 : 0)) fail("check_upgrade: the invalid count does not match");
    if (fb2 && up) fail("check_upgrade: a rejected answer upgraded");

    RouteOutcome o;
    o.pool = fdp.ConsumeIntegral<int32_t>();
    o.finish = (FinishReason)fdp.ConsumeIntegralInRange(0, n_finish_reasons - 1);
    o.n_output_tokens = fdp.ConsumeIntegral<int32_t>();
    const int64_t before_outcome = p.counters()->n_invalid;
    p.on_outcome(in, o);
    if (p.counters()->n_invalid != before_outcome) fail("on_outcome: counted as an invalid decision");
}

void fuzz_evict(PluginEvictionPolicy& p, bool v2, FuzzedDataProvider& fdp) {
    std::vector<EvictionCandidate> cands(fdp.ConsumeIntegralInRange(1, 16));
    for (size_t i = 0; i < cands.size(); i++) {
        cands[i].block = (int32_t)i;
        cands[i].tenant = fdp.ConsumeIntegralInRange(-2, 6);
        cands[i].is_public = fdp.ConsumeBool();
        cands[i].last_access_tick = fdp.ConsumeIntegral<int64_t>();
        cands[i].depth = fdp.ConsumeIntegral<int32_t>();
    }
    std::vector<TenantBlocks> tenants(fdp.ConsumeIntegralInRange(0, 5));
    for (auto& t : tenants) {
        t.tenant = fdp.ConsumeIntegralInRange(-2, 6);
        t.n_held = fdp.ConsumeIntegral<int32_t>();
        t.quota_blocks = fdp.ConsumeIntegral<int32_t>();
    }
    std::vector<std::string> names(fdp.ConsumeIntegralInRange(0, 4));
    for (auto& s : names) s = fdp.ConsumeRandomLengthString(8);
    EvictionContext ctx;
    ctx.now_tick = fdp.ConsumeIntegral<int64_t>();
    ctx.n_blocks_total = fdp.ConsumeIntegral<int32_t>();
    ctx.requesting_tenant = fdp.ConsumeIntegralInRange(-2, 6);
    ctx.tenants = tenants;
    ctx.tenant_names = fdp.ConsumeBool() ? &names : nullptr;

    const int64_t invalid_before = p.counters()->n_invalid, declined_before = p.counters()->n_declined;
    const size_t v = p.choose_victim(ctx, cands);
    const int64_t d_invalid = p.counters()->n_invalid - invalid_before, d_declined = p.counters()->n_declined - declined_before;
    if (v == EvictionPolicy::k_no_victim) {
        if (!v2) fail("choose_victim: an ABI 1 plugin declined");
        if (d_declined != 1 || d_invalid != 0) fail("choose_victim: a decline was not counted as one");
    } else {
        if (v >= cands.size()) fail("choose_victim: a victim out of range got through");
        if (d_declined != 0 || d_invalid > 1) fail("choose_victim: counted twice");
        if (d_invalid == 1 && v != 0) fail("choose_victim: a rejected answer is not the LRU block");
    }
}

void fuzz_speculate(SpeculationPolicy& p, FuzzedDataProvider& fdp) {
    std::vector<int64_t> hist(fdp.ConsumeIntegralInRange(0, 8));
    for (auto& h : hist) h = fdp.ConsumeIntegral<int64_t>();
    steward_spec_stats st{};
    st.max_budget = fdp.ConsumeIntegralInRange(0, 64);
    st.last_budget = fdp.ConsumeIntegral<int32_t>();
    st.batch_size = fdp.ConsumeIntegral<int32_t>();
    st.n_steps = fdp.ConsumeIntegral<int64_t>();
    st.accepted_hist = hist.data();
    st.n_hist = (uint32_t)hist.size();
    int64_t before = p.counters()->n_invalid;
    bool fallback = true;
    int32_t b = p.draft_budget(st, &fallback);
    if (b < 0 || b > st.max_budget) fail("draft_budget: a budget outside [0, max] got through");
    if (p.counters()->n_invalid - before != (fallback ? 1 : 0) || (fallback && b != 0))
        fail("draft_budget: a rejected budget is not 0, counted once");

    const std::string tenant = fdp.ConsumeRandomLengthString(8);
    SpecSeqStats q;
    q.request_id = fdp.ConsumeIntegral<uint64_t>();
    q.tenant = tenant.c_str();
    q.max_budget = fdp.ConsumeIntegralInRange(0, 64);
    q.n_steps = fdp.ConsumeIntegral<int64_t>();
    q.n_accepted = fdp.ConsumeIntegral<int64_t>();
    q.recent_acceptance = fdp.ConsumeFloatingPoint<double>();
    before = p.counters()->n_invalid;
    b = p.draft_budget_seq(q, &fallback);
    if (b < 0 || b > q.max_budget) fail("draft_budget_seq: a budget outside [0, max] got through");
    if (p.counters()->n_invalid - before != (fallback ? 1 : 0) || (fallback && b != 0))
        fail("draft_budget_seq: a rejected budget is not 0, counted once");
}

}  // namespace

// What the fake plugins call for each answer they give. Past the input's end: 0.
extern "C" __attribute__((visibility("default"))) int32_t steward_fuzz_answer(void) {
    return g_fdp && g_fdp->remaining_bytes() ? g_fdp->ConsumeIntegral<int32_t>() : 0;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    spdlog::set_level(spdlog::level::off);
    g = new Policies();  // lives for the process
    for (int i = 0; i < 8; i++) g->pool_names.push_back("p" + std::to_string(i));
    g->spec.plugin = "fake";
    g->spec.where = "fuzz.toml:1:1";
    const char* v[2] = {"v1", "v2"};
    for (int i = 0; i < 2; i++) {
        g->routing[i] = must(RoutingPolicy::create(open_fake(std::string("routing_") + v[i], PolicyKind::ROUTING), g->spec,
                                                   "fuzz", counters("routing"), g->pool_names));
        g->eviction[i] = must(PluginEvictionPolicy::create(open_fake(std::string("eviction_") + v[i], PolicyKind::EVICTION),
                                                           g->spec, "fuzz", counters("eviction"), g->pool_names));
        g->speculation[i] = must(SpeculationPolicy::create(
            open_fake(std::string("speculation_") + v[i], PolicyKind::SPECULATION), g->spec, "fuzz", counters("speculation"),
            g->pool_names));
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider fdp(data, size);
    g_fdp = &fdp;
    for (int n_questions = 0; fdp.remaining_bytes() > 0 && n_questions < 32; n_questions++) {
        const int which = fdp.ConsumeIntegralInRange(0, 5);
        const int v = which & 1;  // 0: the ABI 1 table, 1: ABI 2
        switch (which >> 1) {
            case 0: fuzz_route(*g->routing[v], fdp); break;
            case 1: fuzz_evict(*g->eviction[v], v == 1, fdp); break;
            default: fuzz_speculate(*g->speculation[v], fdp); break;
        }
    }
    g_fdp = nullptr;
    return 0;
}
