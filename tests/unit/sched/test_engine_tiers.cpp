// The engine with KV tiers: blocks the pool evicts are demoted with their bytes and promoted back when
// a prompt needs them, so a repeated prompt is served from a tier (counted as cached) with the same
// greedy output as the single-sequence Generator (an independent code path); another tenant's
// identical prompt gets nothing from any tier; a disk tier written at shutdown answers after a restart.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>

#include "greedy_reference.h"
#include "memory_model.h"
#include "model/synth.h"
#include "process_temp_dir.h"
#include "sched/engine.h"

using namespace steward;

namespace {

const Model& tier_model() {
    static std::unique_ptr<Model> m = [] {
        SynthSpec s;
        s.n_embd = 64; s.n_layer = 2; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 512;
        s.seed = 11;
        return steward_test::memory_model(s);
    }();
    return *m;
}

const std::filesystem::path& temp_dir() {
    static const steward_test::ProcessTempDir dir("steward_test_engine_tiers_");
    return dir.path();
}

std::vector<int32_t> prompt_of(uint64_t seed, int n) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; i++) p.push_back(3 + (int)(rng() % 500));
    return p;
}

struct Done {
    std::vector<int32_t> tokens;
    RunFigures fig;
};

Done run_one(Engine& e, uint64_t id, const std::vector<int32_t>& prompt, int32_t tenant, int max_tokens = 6) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.tenant = tenant;
    REQUIRE(e.submit(r).ok());
    Done d;
    double t = id;
    while (e.has_work())
        for (auto& ev : e.step(t += 0.001)) {
            d.tokens.insert(d.tokens.end(), ev.tokens.begin(), ev.tokens.end());
            if (ev.finished) {
                REQUIRE(ev.finish != FinishReason::ERROR);
                d.fig = ev;
            }
        }
    return d;
}

EngineOptions tier_options(std::shared_ptr<KvTiers> tiers) {
    EngineOptions o;
    o.n_blocks = 16;  // 256 tokens: one 200-token prompt at a time
    o.block_size = 16;
    o.max_batch_tokens = 256;
    o.n_threads = 1;
    o.kv_events = true;
    o.kv_tiers = std::move(tiers);
    return o;
}

std::shared_ptr<KvTiers> open_tiers(int64_t host_bytes, int64_t disk_bytes, const std::string& dir) {
    KvTierIdentity id;
    const KvConfig one = KvStorage::config_for(tier_model().params(), 1, 16, KvDtype::F32);
    id.payload_bytes = kv_bytes(one);  // one block
    id.layout = 0x1234;
    id.salts = 0x5678;
    KvTierOptions o;
    o.host_bytes = host_bytes;
    o.disk_bytes = disk_bytes;
    o.disk_dir = dir;
    auto t = KvTiers::open(o, id);
    REQUIRE(t.ok());
    return std::shared_ptr<KvTiers>(std::move(*t));
}

}  // namespace

TEST_CASE("evicted blocks come back from the host tier with the same output", "[kv_tiers][engine]") {
    auto tiers = open_tiers(int64_t(64) << 20, 0, "");
    Engine e(tier_model(), tier_options(tiers));
    const auto a = prompt_of(1, 200), b = prompt_of(2, 200);
    const Done a1 = run_one(e, 1, a, 0);
    CHECK(a1.tokens == steward_test::greedy_reference(tier_model(), a, 6));
    // b needs the whole pool: a's cached blocks are evicted, so demoted into the host tier.
    run_one(e, 2, b, 0);
    CHECK(tiers->stats().tier[(int)KvTier::HOST].n_stores > 0);
    const Done a2 = run_one(e, 3, a, 0);
    CHECK(a2.tokens == a1.tokens);
    CHECK(a2.fig.n_cached_prompt_tokens == (200 - 1) / 16 * 16);
    // b evicted most of a's blocks (the pool keeps whatever b left): those come from the tier.
    CHECK(a2.fig.n_cached_host_tokens > 0);
    CHECK(a2.fig.n_cached_host_tokens <= a2.fig.n_cached_prompt_tokens);
    CHECK(a2.fig.n_promotions == 1);
    CHECK(a2.fig.n_cached_cross_tenant == 0);
    const EngineStats st = e.stats();
    REQUIRE(st.tiers);
    CHECK(st.n_promoted_host_blocks * 16 == a2.fig.n_cached_host_tokens);
    CHECK(e.kv_manager().pool().check_invariants().empty());
    CHECK(tiers->check_invariants().empty());
    // The events: the tier's stored / removed events follow the pool's, each with its tier.
    bool host_stored = false, host_removed = false;
    for (const KvEvent& ev : e.take_kv_events()) {
        host_stored = host_stored || (ev.tier == KvTier::HOST && ev.kind == KvEventKind::STORED);
        host_removed = host_removed || (ev.tier == KvTier::HOST && ev.kind == KvEventKind::REMOVED);
    }
    CHECK(host_stored);
    CHECK(host_removed);
}

TEST_CASE("another tenant's identical prompt gets nothing from a tier", "[kv_tiers][engine]") {
    auto tiers = open_tiers(int64_t(64) << 20, 0, "");
    Engine e(tier_model(), tier_options(tiers));
    const auto a = prompt_of(3, 200), b = prompt_of(4, 200);
    const Done a1 = run_one(e, 1, a, 0);
    run_one(e, 2, b, 0);  // evicts a's blocks into the tier
    const Done other = run_one(e, 3, a, 1);
    CHECK(other.fig.n_cached_prompt_tokens == 0);
    CHECK(other.fig.n_cached_host_tokens == 0);
    CHECK(other.tokens == a1.tokens);
    // Tenant 0's blocks are still there for tenant 0.
    run_one(e, 4, b, 0);
    const Done again = run_one(e, 5, a, 0);
    CHECK(again.fig.n_cached_prompt_tokens == (200 - 1) / 16 * 16);
    CHECK(again.tokens == a1.tokens);
}

TEST_CASE("a disk tier written at shutdown answers a new engine", "[kv_tiers][engine]") {
    const std::string dir = (temp_dir() / "disk").string();
    const auto a = prompt_of(5, 200);
    Done first;
    {
        auto tiers = open_tiers(0, int64_t(64) << 20, dir);
        Engine e(tier_model(), tier_options(tiers));
        first = run_one(e, 1, a, 0);
        CHECK(first.fig.n_cached_prompt_tokens == 0);
    }  // ~Engine writes the pool's cached blocks to disk
    auto tiers = open_tiers(0, int64_t(64) << 20, dir);
    CHECK(tiers->stats().tier[(int)KvTier::DISK].n_blocks >= (200 - 1) / 16);
    Engine e(tier_model(), tier_options(tiers));
    const Done again = run_one(e, 1, a, 0);
    CHECK(again.tokens == first.tokens);
    CHECK(again.fig.n_cached_disk_tokens == (200 - 1) / 16 * 16);
    CHECK(again.fig.n_cached_prompt_tokens == again.fig.n_cached_disk_tokens);
}

TEST_CASE("a tier whose block size differs from the backend's is refused", "[kv_tiers][engine]") {
    KvTierIdentity id;
    id.payload_bytes = 12345;
    KvTierOptions o;
    o.host_bytes = 1 << 20;
    auto t = KvTiers::open(o, id);
    REQUIRE(t.ok());
    EngineOptions eo = tier_options(std::shared_ptr<KvTiers>(std::move(*t)));
    CHECK_THROWS_WITH(Engine(tier_model(), eo), Catch::Contains("12345"));
}
