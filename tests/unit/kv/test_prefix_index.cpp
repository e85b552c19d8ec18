// Tests for runtime/kv/prefix_index and the block pool's KV events: the index rebuilt from a pool's
// stored / removed events holds exactly the pool's cached hashes, and its answer for a new prompt equals
// what get_computed_blocks (KvManager, or a real Engine serving prompts) then finds, across evictions.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_manager.h"
#include "kv/prefix_index.h"
#include "memory_model.h"
#include "model/synth.h"
#include "sched/engine.h"

using namespace steward;

namespace {

using Tokens = std::vector<int32_t>;

// Prompts drawn from a few shared stems (so prefixes repeat), cut at random lengths, with random tails.
struct PromptMaker {
    std::mt19937_64 rng;
    std::vector<Tokens> stems;
    PromptMaker(uint64_t seed, int32_t first_token, int32_t n_vocab) : rng(seed) {
        for (int s = 0; s < 3; ++s) {
            Tokens t;
            for (int i = 0; i < 40; ++i) t.push_back(first_token + (int32_t)(rng() % (uint64_t)n_vocab));
            stems.push_back(t);
        }
    }
    Tokens make(const Tokens& public_prefix) {
        Tokens p;
        if (!public_prefix.empty() && rng() % 3 == 0) p = public_prefix;
        const Tokens& stem = stems[rng() % stems.size()];
        p.insert(p.end(), stem.begin(), stem.begin() + (long)(rng() % stem.size()));
        const int tail = 1 + (int)(rng() % 6);
        for (int i = 0; i < tail; ++i) p.push_back(stems[0][rng() % stems[0].size()]);
        return p;
    }
};

}  // namespace

TEST_CASE("The block pool records a stored event per newly mapped hash and a removed event per evicted one", "[kv]") {
    BlockPool pool(2);
    pool.publish(*pool.allocate(), 11, 0, false);  // not recording yet: no event
    pool.set_record_events(true);
    const int32_t a = *pool.allocate();
    CHECK(pool.publish(a, 22, 0, false) == a);
    const int32_t b = *pool.allocate();  // none free: fails, nothing to evict (both referenced)
    (void)b;
    pool.unref(0);
    pool.unref(a);
    const int32_t c = *pool.allocate();  // evicts hash 11 (LRU)
    CHECK(pool.publish(c, 22, 0, false) != c);  // a dedupe maps nothing: no event
    pool.unref(c);
    const std::vector<KvEvent> want = {{KvEventKind::STORED, 22}, {KvEventKind::REMOVED, 11}};
    CHECK(pool.take_events() == want);
    CHECK(pool.take_events().empty());
}

TEST_CASE("The index walks a chain up to the first missing block, per pool, and a reset forgets a pool", "[kv]") {
    PrefixIndex idx;
    const std::vector<KvEvent> ev = {{KvEventKind::STORED, 1}, {KvEventKind::STORED, 3}, {KvEventKind::STORED, 2},
                                     {KvEventKind::REMOVED, 3}, {KvEventKind::STORED, 4}};
    idx.apply(7, ev);
    const std::vector<BlockHash> chain = {1, 2, 3, 4};
    CHECK(idx.n_leading_blocks(7, chain) == 2);  // 4 is held but 3 is missing before it
    CHECK(idx.cached_tokens(7, chain, 16) == 32);
    CHECK(idx.n_leading_blocks(8, chain) == 0);
    CHECK(idx.n_blocks(7) == 3);
    idx.apply(8, std::vector<KvEvent>{{KvEventKind::STORED, 1}});
    idx.reset(7);
    CHECK(idx.n_leading_blocks(7, chain) == 0);
    CHECK(idx.n_leading_blocks(8, chain) == 1);
}

TEST_CASE("A prompt's lookup hashes are the leading blocks of its chain, never the last token's block", "[kv]") {
    const std::vector<Tokens> publics = {{5, 6, 7, 8, 9, 10}};
    Tokens p = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};  // 12 tokens, block 4: 3 full, 2 looked up
    const auto chain = hash_block_chain(p, 4, tenant_salt(3), publics);
    const auto look = lookup_block_hashes(p, 4, 3, 0, publics);
    REQUIRE(look.size() == 2);
    CHECK(look[0] == chain[0]);
    CHECK(look[1] == chain[1]);
    CHECK(lookup_block_hashes(p, 4, 3, 99, publics) != look);  // a configured salt replaces the derived one
    p.pop_back();
    CHECK(lookup_block_hashes(p, 4, 3, 0, publics).size() == 2);
    CHECK(lookup_block_hashes({}, 4, 3, 0, publics).empty());
}

TEST_CASE("Random KV operations: the index equals the pool's cached hashes and predicts get_computed_blocks", "[kv]") {
    const int block_size = 4;
    const int32_t n_blocks = 24;
    const PoolId pool_id = 42;
    for (uint64_t seed : {1u, 2u, 3u, 4u}) {
        CAPTURE(seed);
        KvManager m(n_blocks, block_size);
        m.set_record_kv_events(true);
        PromptMaker pm(seed, 100, 20);
        const Tokens public_prefix = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        m.set_public_prefixes({public_prefix});
        PrefixIndex idx;
        std::mt19937_64 rng(seed * 77);
        std::vector<SeqId> live;
        int n_checked = 0, n_hits = 0;
        auto salt_of = [](int32_t tenant, bool configured) -> uint64_t { return configured ? 1000 + tenant : 0; };
        auto drain = [&] {
            auto ev = m.take_kv_events();
            idx.apply(pool_id, ev);
            // Exactly the pool's cached hashes: same count, and each indexed hash is cached.
            REQUIRE(idx.n_blocks(pool_id) == m.pool().n_cached());
            for (SeqId s : m.seq_ids())
                for (BlockHash h : m.seq(s).block_hashes)
                    REQUIRE(idx.holds(pool_id, h) == m.pool().peek_cached(h).has_value());
        };
        for (int op = 0; op < 600; ++op) {
            const int kind = (int)(rng() % 10);
            if (kind < 5) {
                // A new request: predict from the index, then let the manager answer.
                const int32_t tenant = (int32_t)(rng() % 3);
                const bool configured = rng() % 2;
                const Tokens prompt = pm.make(public_prefix);
                const auto chain = lookup_block_hashes(prompt, block_size, tenant, salt_of(tenant, configured),
                                                       m.public_prefixes());
                const int predicted = idx.cached_tokens(pool_id, chain, block_size);
                const SeqId s = m.add_seq(tenant, prompt, salt_of(tenant, configured));
                const int found = m.get_computed_blocks(s);
                REQUIRE(predicted == found);
                ++n_checked;
                n_hits += found > 0;
                const int rest = (int)prompt.size() - found;
                if (!m.allocate_slots(s, rest)) {
                    m.free(s);
                } else {
                    m.commit_computed(s, rest);
                    m.publish_full_blocks(s);
                    live.push_back(s);
                }
            } else if (kind < 8 && !live.empty()) {
                // Decode a few tokens on a live sequence.
                const SeqId s = live[rng() % live.size()];
                const int n = 1 + (int)(rng() % 5);
                Tokens more;
                for (int i = 0; i < n; ++i) more.push_back(100 + (int32_t)(rng() % 20));
                m.append_tokens(s, more);
                if (m.allocate_slots(s, n)) {
                    m.commit_computed(s, n);
                    m.publish_full_blocks(s);
                } else {
                    m.truncate(s, m.seq(s).n_computed);
                }
            } else if (!live.empty()) {
                const size_t i = rng() % live.size();
                m.free(live[i]);
                live.erase(live.begin() + (long)i);
            }
            drain();
        }
        CHECK(n_checked > 200);
        CHECK(n_hits > 20);                  // the cache was exercised...
        CHECK(m.stats().n_evictions > 50);  // ...and so was eviction
    }
}

namespace {

const Model& tiny_model() { return steward_test::tiny_kv_model(); }

}  // namespace

TEST_CASE("An engine's KV events let the index predict each new request's cached prompt tokens", "[kv]") {
    EngineOptions opt;
    opt.n_blocks = 20;  // small: later requests evict earlier ones' blocks
    opt.block_size = 4;
    opt.max_batch_tokens = 64;
    opt.kv_events = true;
    Engine e(tiny_model(), opt);
    const Tokens public_prefix = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    e.set_public_prefixes({public_prefix});
    PrefixIndex idx;
    PromptMaker pm(9, 10, 100);
    std::mt19937_64 rng(5);
    double t = 0;
    int n_hits = 0;
    for (uint64_t id = 1; id <= 60; ++id) {
        EngineRequest r;
        r.id = id;
        r.tenant = (int32_t)(rng() % 2);
        r.salt = rng() % 2 ? 0 : 500 + r.tenant;
        r.prompt = pm.make(public_prefix);
        r.max_tokens = 1 + (int)(rng() % 4);
        r.stop_at_eos = false;
        const auto chain = lookup_block_hashes(r.prompt, opt.block_size, r.tenant, r.salt, e.kv_manager().public_prefixes());
        const int predicted = idx.cached_tokens(1, chain, opt.block_size);
        REQUIRE(e.submit(r).ok());
        bool first = true;
        while (e.has_work()) {
            for (const EngineEvent& ev : e.step(t += 0.001))
                if (first && (ev.finished || !ev.tokens.empty())) {
                    CHECK(ev.n_cached_prompt_tokens == predicted);
                    n_hits += predicted > 0;
                    first = false;
                }
            idx.apply(1, e.take_kv_events());
        }
        REQUIRE(idx.n_blocks(1) == e.kv_manager().pool().n_cached());
    }
    CHECK(n_hits > 5);
    CHECK(e.stats().kv.n_evictions > 0);
}

TEST_CASE("An engine without kv_events records nothing", "[kv]") {
    EngineOptions opt;
    opt.n_blocks = 16;
    opt.block_size = 4;
    Engine e(tiny_model(), opt);
    EngineRequest r;
    r.id = 1;
    r.prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    r.max_tokens = 2;
    REQUIRE(e.submit(r).ok());
    while (e.has_work()) e.step(0);
    CHECK(e.kv_manager().pool().n_cached() > 0);
    CHECK(e.take_kv_events().empty());
}

TEST_CASE("The index keeps each hash's tiers and weighs tier hits below pool hits", "[kv][kv_tiers]") {
    PrefixIndex idx;
    const std::vector<BlockHash> chain = {11, 12, 13, 14};
    idx.apply(1, std::vector<KvEvent>{{KvEventKind::STORED, 11, KvTier::POOL},
                                      {KvEventKind::STORED, 12, KvTier::HOST},
                                      {KvEventKind::STORED, 13, KvTier::DISK}});
    CHECK(idx.n_leading_blocks(1, chain) == 3);  // a tier hit continues the chain
    // 16 (pool) + 0.8 * 16 (host) + 0.5 * 16 (disk) = 36.8 -> 36
    CHECK(idx.cached_tokens(1, chain, 16) == 36);
    CHECK(idx.cached_tokens(1, chain, 16, TierWeights{1.0, 1.0}) == 48);
    CHECK(idx.tier_of(1, 12) == KvTier::HOST);
    // Promotion: host removed, pool stored; the disk copy of 13 stays beside a pool copy.
    idx.apply(1, std::vector<KvEvent>{{KvEventKind::REMOVED, 12, KvTier::HOST},
                                      {KvEventKind::STORED, 12, KvTier::POOL},
                                      {KvEventKind::STORED, 13, KvTier::POOL}});
    CHECK(idx.tier_of(1, 12) == KvTier::POOL);
    CHECK(idx.cached_tokens(1, chain, 16) == 48);
    idx.apply(1, std::vector<KvEvent>{{KvEventKind::REMOVED, 13, KvTier::POOL}});
    CHECK(idx.tier_of(1, 13) == KvTier::DISK);  // still on disk
    idx.apply(1, std::vector<KvEvent>{{KvEventKind::REMOVED, 13, KvTier::DISK}});
    CHECK_FALSE(idx.holds(1, 13));
    CHECK(idx.n_blocks(1) == 2);
}
