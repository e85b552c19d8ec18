// Reuse priority and invalidation of documents' KV (docs/reuse.md#kv-priority-and-invalidation):
// the block pool's default choice against a naive reference over random operations, what an
// eviction policy sees, invalidation at once or at the last reference, the KV manager's marking
// by token span, and the tiers' eviction and invalidation.
#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <unistd.h>
#include <zlib.h>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_manager.h"
#include "kv/kv_tier.h"

using namespace steward;
namespace fs = std::filesystem;

namespace {

ReuseKeys keys_of(std::vector<uint64_t> k) { return std::make_shared<const std::vector<uint64_t>>(std::move(k)); }

// A cached evictable block of `pool`: allocated, published under hash h, marked, unreferenced.
int32_t cached_block(BlockPool& pool, BlockHash h, int32_t priority, ReuseKeys keys = nullptr) {
    const auto b = pool.allocate();
    REQUIRE(b);
    REQUIRE(pool.publish(*b, h, 0, false) == *b);
    if (priority > 0 || keys) pool.mark_reuse(*b, priority, keys);
    pool.unref(*b);
    return *b;
}

}  // namespace

TEST_CASE("The default eviction takes blocks with reuse priority only when no other is left, as a naive model says",
          "[kv][reuse]") {
    // Reference: every evictable block with its last touch (a counter this test keeps) and its
    // priority; the victim is the least recently touched block without priority, else the least
    // recently touched with it.
    std::mt19937 rng(20261205);
    for (int round = 0; round < 40; round++) {
        const int32_t n = 4 + (int32_t)(rng() % 12);
        BlockPool pool(n);
        struct Ref {
            BlockHash hash = 0;
            int32_t priority = 0;
            int64_t touched = 0;
        };
        std::map<int32_t, Ref> evictable;  // block -> reference state
        std::vector<int32_t> held;         // referenced blocks this test holds
        int64_t clock = 0, n_priority_evicted = 0;
        BlockHash next_hash = 1000;
        for (int step = 0; step < 300; step++) {
            const int op = (int)(rng() % 4);
            if (op <= 1) {  // allocate one, publish it, maybe mark it, keep or release it
                std::optional<int32_t> want;  // the reference's victim when no uncached block is free
                if (pool.n_free() > 0 && pool.n_evictable() == pool.n_free() && !evictable.empty()) {
                    auto best = evictable.end();
                    for (auto it = evictable.begin(); it != evictable.end(); ++it) {
                        if (best == evictable.end()) {
                            best = it;
                            continue;
                        }
                        const auto key = [](const Ref& r) { return std::make_pair(r.priority, r.touched); };
                        if (key(it->second) < key(best->second)) best = it;
                    }
                    want = best->first;
                }
                const std::vector<BlockHash> cached_before = pool.cached_hashes();
                const auto b = pool.allocate();
                if (!b) {
                    CHECK(pool.n_free() == 0);
                    continue;
                }
                if (want) {
                    CHECK(*b == *want);
                    const Ref gone = evictable.at(*want);
                    CHECK_FALSE(pool.peek_cached(gone.hash));
                    n_priority_evicted += gone.priority > 0;
                    evictable.erase(*want);
                    for (const auto& [blk, r] : evictable) CHECK(pool.peek_cached(r.hash) == blk);
                } else {
                    CHECK(pool.cached_hashes().size() == cached_before.size());
                }
                const BlockHash h = next_hash++;
                REQUIRE(pool.publish(*b, h, 0, false) == *b);
                const int32_t priority = rng() % 3 == 0 ? 1 : 0;
                if (priority) pool.mark_reuse(*b, 1, nullptr);
                if (rng() % 3 == 0) {
                    held.push_back(*b);  // a running sequence's: not evictable until released
                } else {
                    pool.unref(*b);
                    evictable[*b] = {h, priority, ++clock};
                }
            } else if (op == 2 && !held.empty()) {  // release a held block
                const size_t i = rng() % held.size();
                const int32_t b = held[i];
                held.erase(held.begin() + (long)i);
                const BlockInfo info = pool.info(b);
                pool.unref(b);
                if (info.hash) evictable[b] = {*info.hash, info.reuse_priority, ++clock};
            } else if (op == 3 && !evictable.empty()) {  // a prefix hit touches an evictable block
                auto it = evictable.begin();
                std::advance(it, (long)(rng() % evictable.size()));
                REQUIRE(pool.find_cached(it->second.hash) == it->first);
                it->second.touched = ++clock;
            }
            const std::string bad = pool.check_invariants();
            INFO(bad);
            REQUIRE(bad.empty());
        }
        CHECK(pool.stats().n_priority_evictions == n_priority_evicted);
        for (int32_t b : held) pool.unref(b);
        CHECK(pool.check_invariants() == "");
    }
}

TEST_CASE("An eviction policy sees each candidate's reuse priority, merged by recency", "[kv][reuse]") {
    struct Recorder : EvictionPolicy {
        std::vector<EvictionCandidate> seen;
        size_t choose_victim(const EvictionContext&, std::span<const EvictionCandidate> c) override {
            seen.assign(c.begin(), c.end());
            return 0;  // the least recently used, whatever its priority
        }
    };
    BlockPool pool(3);
    auto rec = std::make_unique<Recorder>();
    Recorder* r = rec.get();
    pool.set_eviction_policy(std::move(rec));
    const int32_t a = cached_block(pool, 11, 1);
    const int32_t b = cached_block(pool, 12, 0);
    const int32_t c = cached_block(pool, 13, 1);
    CHECK(pool.evictable_lru() == std::vector<int32_t>{a, b, c});
    const auto got = pool.allocate();
    REQUIRE(got);
    CHECK(*got == a);  // the policy's choice stands: priority is what it weighs, not a veto
    REQUIRE(r->seen.size() == 3);
    CHECK(r->seen[0].block == a);
    CHECK(r->seen[0].reuse_priority == 1);
    CHECK(r->seen[1].block == b);
    CHECK(r->seen[1].reuse_priority == 0);
    CHECK(r->seen[2].reuse_priority == 1);
    CHECK(pool.stats().n_priority_evictions == 1);
    CHECK(pool.check_invariants() == "");
}

TEST_CASE("Invalidating a document's key uncaches its evictable blocks at once and its referenced ones at their last reference",
          "[kv][reuse]") {
    BlockPool pool(6);
    pool.set_record_events(true);
    const ReuseKeys k1 = keys_of({101}), k12 = keys_of({101, 202}), k2 = keys_of({202});
    const int32_t a = cached_block(pool, 1, 1, k1);
    const int32_t b = cached_block(pool, 2, 0, k12);
    const int32_t c = cached_block(pool, 3, 1, k2);
    const int32_t d = cached_block(pool, 4, 1);  // priority, no key (the system prompt before them)
    // e: held by a running sequence.
    const auto e = pool.allocate();
    REQUIRE(e);
    REQUIRE(pool.publish(*e, 5, 0, false) == *e);
    pool.mark_reuse(*e, 1, k1);
    CHECK(pool.n_priority() == 4);
    (void)pool.take_events();

    const std::vector<uint64_t> gone = {101};
    CHECK(pool.invalidate_reuse(gone) == 3);  // a, b and (later) e
    CHECK_FALSE(pool.peek_cached(1));
    CHECK_FALSE(pool.peek_cached(2));
    CHECK(pool.peek_cached(3) == c);
    CHECK(pool.peek_cached(4) == d);
    CHECK(pool.peek_cached(5) == *e);  // still in use: findable until its last reference goes
    CHECK(pool.info(*e).doomed);
    CHECK(pool.info(*e).reuse_priority == 0);
    CHECK(pool.n_priority() == 2);  // c and d
    CHECK(pool.info(a).ref_count == 0);
    CHECK_FALSE(pool.is_cached(a));
    CHECK_FALSE(pool.is_cached(b));
    CHECK(pool.check_invariants() == "");
    pool.mark_reuse(*e, 1, k1);  // an invalidated block is not marked again
    CHECK(pool.info(*e).reuse_priority == 0);
    pool.unref(*e);
    CHECK_FALSE(pool.peek_cached(5));
    CHECK(pool.n_evictable() == 2);
    CHECK(pool.stats().n_invalidated == 3);
    const auto ev = pool.take_events();
    CHECK(ev == std::vector<KvEvent>{{KvEventKind::REMOVED, 1}, {KvEventKind::REMOVED, 2}, {KvEventKind::REMOVED, 5}});
    // The freed blocks are reused before any cached one is evicted.
    for (int i = 0; i < 3; i++) CHECK(pool.allocate());
    CHECK(pool.stats().n_evictions == 0);
    CHECK(pool.check_invariants() == "");
}

TEST_CASE("The KV manager marks a sequence's blocks by its documents' token span and drops them on invalidation",
          "[kv][reuse]") {
    KvManager m(32, 4);
    std::vector<int32_t> prompt(41);
    for (int i = 0; i < 41; i++) prompt[(size_t)i] = 100 + i;
    const SeqId s = m.add_seq(0, prompt);
    // Documents at tokens [9, 22): blocks ending at or before 22 keep priority (0..4), blocks
    // ending past 9 carry the key (2..9).
    m.set_reuse(s, 22, 9, keys_of({77}));
    REQUIRE(m.get_computed_blocks(s) == 0);
    REQUIRE(m.allocate_slots(s, 41));
    m.commit_computed(s, 41);
    REQUIRE(m.publish_full_blocks(s) == 10);
    const SeqKv& kv = m.seq(s);
    for (int b = 0; b < 10; b++) {
        const BlockInfo info = m.pool().info(kv.blocks[(size_t)b]);
        INFO("block " << b);
        CHECK(info.reuse_priority == (b <= 4 ? 1 : 0));
        CHECK((info.reuse_keys != nullptr) == (b >= 2));
    }
    CHECK(m.stats().n_blocks_priority == 5);
    // A second sequence with the same prompt and no documents finds the blocks and leaves them as they are.
    const SeqId t = m.add_seq(0, prompt);
    CHECK(m.get_computed_blocks(t) == 40);
    m.free(t);
    m.free(s);
    CHECK(m.stats().n_blocks_priority == 5);
    const std::vector<uint64_t> gone = {77};
    CHECK(m.invalidate_reuse(gone) == 8);
    CHECK(m.stats().n_reuse_invalidated == 8);
    CHECK(m.stats().n_blocks_priority == 2);
    const SeqId u = m.add_seq(0, prompt);
    CHECK(m.get_computed_blocks(u) == 8);  // blocks 0 and 1: before the documents
    CHECK(m.pool().check_invariants() == "");
}

namespace {

class TierDir {
public:
    TierDir() {
        static std::atomic<int> n{0};
        root_ = fs::temp_directory_path() / ("steward-reuse-tier-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
        fs::remove_all(root_);
        fs::create_directories(root_);
    }
    ~TierDir() {
        std::error_code ec;
        fs::remove_all(root_, ec);
    }
    std::string dir() const { return (root_ / "tier").string(); }

private:
    fs::path root_;
};

const KvTierIdentity k_tid{0x2b2b000000000001ull, 0x3c3c000000000001ull, 32};
constexpr int64_t k_tfile = (int64_t)k_tier_header_bytes + 32;

TierBlockMeta tmeta(BlockHash h, int32_t priority, ReuseKeys keys = nullptr) {
    TierBlockMeta m;
    m.hash = h;
    m.tenant = 0;
    m.reuse_priority = priority;
    m.reuse_keys = std::move(keys);
    return m;
}

}  // namespace

TEST_CASE("A KV tier evicts blocks with reuse priority last and drops a changed document's blocks", "[kv][reuse][kv_tier]") {
    TierDir d;
    auto opened = KvTiers::open({2 * 32, 8 * k_tfile, d.dir()}, k_tid);
    REQUIRE(opened.ok());
    KvTiers& t = **opened;
    const std::vector<uint8_t> bytes(32, 7);
    t.demote(tmeta(1, 1, keys_of({5})), bytes);  // the oldest, with priority
    t.demote(tmeta(2, 0), bytes);
    t.demote(tmeta(3, 0, keys_of({5})), bytes);  // the host tier is full: 2 goes to disk, not 1
    CHECK(t.peek(1) == KvTier::HOST);
    CHECK(t.peek(2) == KvTier::DISK);
    CHECK(t.peek(3) == KvTier::HOST);
    t.demote(tmeta(4, 0), bytes);  // 3 goes to disk (1 still stays)
    CHECK(t.peek(1) == KvTier::HOST);
    CHECK(t.peek(3) == KvTier::DISK);
    const std::string f3 = d.dir() + "/" + tier_file_name(k_tid.layout, 3);
    CHECK(fs::exists(f3));
    const std::vector<uint64_t> gone = {5};
    CHECK(t.invalidate_reuse(gone) == 2);
    CHECK_FALSE(t.peek(1));
    CHECK_FALSE(t.peek(3));
    CHECK_FALSE(fs::exists(f3));
    CHECK(t.peek(2) == KvTier::DISK);
    CHECK(t.peek(4) == KvTier::HOST);
    CHECK(t.stats().n_invalidated == 2);
    CHECK(t.check_invariants() == "");
}

TEST_CASE("A block file keeps its reuse priority, and refuses any other value than 0 or 1", "[kv][reuse][kv_tier]") {
    TierFileHeader h;
    h.layout = k_tid.layout, h.salts = k_tid.salts;
    h.meta = tmeta(9, 1);
    h.payload_bytes = 32;
    auto p = parse_tier_header(encode_tier_header(h));
    REQUIRE(p.ok());
    CHECK(p->meta.reuse_priority == 1);
    // Byte 52 set to 2, the header CRC made right again (zlib's CRC-32 of bytes 0..91): refused by the field's check.
    auto b = encode_tier_header(h);
    b[52] = 2;
    const uLong crc = ::crc32(::crc32(0L, Z_NULL, 0), b.data(), 92);
    for (int i = 0; i < 4; i++) b[92 + (size_t)i] = (uint8_t)(crc >> (8 * i));
    const auto bad = parse_tier_header(b);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("reuse_priority") != std::string::npos);
}
