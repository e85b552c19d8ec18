// Tests for runtime/kv/block_pool: allocation, ref counts, the LRU evictable queue worked by hand,
// publish dedupe, the eviction-policy hook, and aborts on invariant violations (in a forked child).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "kv/block_pool.h"

using steward::BlockPool;
using steward::EvictionCandidate;
using steward::EvictionPolicy;

namespace {

// Runs f in a forked child with stderr silenced; true when the child died of SIGABRT.
template <typename F>
bool aborts(F f) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        // Catch2's own SIGABRT handler would report a failure from the child: restore the default.
        std::signal(SIGABRT, SIG_DFL);
        const int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        f();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

// Records what it was shown and answers a fixed index.
struct FixedIndexPolicy : EvictionPolicy {
    size_t answer;
    std::vector<EvictionCandidate>* seen;
    FixedIndexPolicy(size_t a, std::vector<EvictionCandidate>* s) : answer(a), seen(s) {}
    size_t choose_victim(const steward::EvictionContext&, std::span<const EvictionCandidate> candidates) override {
        seen->assign(candidates.begin(), candidates.end());
        return answer;
    }
};

}  // namespace

TEST_CASE("A fresh pool hands out every block once, lowest id first, then reports no room", "[kv]") {
    BlockPool pool(5);
    REQUIRE(pool.n_total() == 5);
    REQUIRE(pool.n_free() == 5);
    for (int32_t expected = 0; expected < 5; ++expected) {
        auto b = pool.allocate();
        REQUIRE(b == expected);
        REQUIRE(pool.ref_count(*b) == 1);
    }
    REQUIRE(pool.n_free() == 0);
    REQUIRE(pool.n_used() == 5);
    REQUIRE_FALSE(pool.allocate().has_value());
    REQUIRE(pool.stats().n_alloc_failures == 1);
    REQUIRE(pool.stats().n_allocations == 5);
    REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("Ref counts go up and down and a block returns to the free pool at zero", "[kv]") {
    BlockPool pool(2);
    const int32_t b = *pool.allocate();
    pool.ref(b);
    pool.ref(b);
    REQUIRE(pool.ref_count(b) == 3);
    pool.unref(b);
    pool.unref(b);
    REQUIRE(pool.ref_count(b) == 1);
    REQUIRE(pool.n_free() == 1);
    pool.unref(b);
    REQUIRE(pool.ref_count(b) == 0);
    REQUIRE(pool.n_free() == 2);
    REQUIRE(pool.n_evictable() == 0);  // uncached: simply free
    REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("Cached blocks are evicted least recently used first, as worked out by hand", "[kv]") {
    BlockPool pool(4);
    for (int32_t i = 0; i < 4; ++i) {
        REQUIRE(pool.allocate() == i);
        REQUIRE(pool.publish(i, 100 + i, /*tenant=*/7, false) == i);
    }
    REQUIRE(pool.n_cached() == 4);
    // Release in the order 2, 0, 3, 1: that is the LRU order.
    for (int32_t b : {2, 0, 3, 1}) pool.unref(b);
    REQUIRE(pool.evictable_lru() == std::vector<int32_t>{2, 0, 3, 1});
    REQUIRE(pool.n_free() == 4);
    REQUIRE(pool.n_evictable() == 4);

    // A lookup hit counts as a use: block 0 moves to the most-recently-used end.
    REQUIRE(pool.find_cached(100) == 0);
    REQUIRE(pool.evictable_lru() == std::vector<int32_t>{2, 3, 1, 0});
    REQUIRE_FALSE(pool.find_cached(999).has_value());

    // No uncached block is free, so allocation evicts the LRU block, 2, and forgets its hash.
    REQUIRE(pool.allocate() == 2);
    REQUIRE_FALSE(pool.peek_cached(102).has_value());
    REQUIRE_FALSE(pool.info(2).hash.has_value());
    REQUIRE(pool.stats().n_evictions == 1);
    // The others are still found.
    REQUIRE(pool.peek_cached(103) == 3);
    REQUIRE(pool.peek_cached(101) == 1);

    // Reviving 3 through the cache takes it off the queue.
    REQUIRE(pool.find_cached(103) == 3);
    pool.ref(3);
    REQUIRE(pool.ref_count(3) == 1);
    REQUIRE(pool.evictable_lru() == std::vector<int32_t>{1, 0});

    REQUIRE(pool.allocate() == 1);
    REQUIRE(pool.evictable_lru() == std::vector<int32_t>{0});
    pool.unref(3);  // 3 keeps its hash and goes to the MRU end
    REQUIRE(pool.evictable_lru() == std::vector<int32_t>{0, 3});
    REQUIRE(pool.peek_cached(103) == 3);

    REQUIRE(pool.allocate() == 0);
    REQUIRE(pool.allocate() == 3);
    REQUIRE(pool.stats().n_evictions == 4);
    REQUIRE(pool.n_cached() == 0);
    // Every block is referenced now: only now is there no room.
    REQUIRE_FALSE(pool.allocate().has_value());

    // A re-allocated block is a fresh, uncached block: it goes back to the plain free stack.
    pool.unref(2);
    REQUIRE(pool.n_evictable() == 0);
    REQUIRE(pool.allocate() == 2);
    REQUIRE(pool.stats().n_evictions == 4);
    REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("An uncached free block is taken before any cached block is evicted", "[kv]") {
    BlockPool pool(3);
    for (int32_t i = 0; i < 3; ++i) REQUIRE(pool.allocate() == i);
    pool.publish(0, 42, 1, false);
    pool.unref(0);  // evictable
    pool.unref(1);  // uncached free
    REQUIRE(pool.allocate() == 1);
    REQUIRE(pool.peek_cached(42) == 0);
    REQUIRE(pool.stats().n_evictions == 0);
    REQUIRE(pool.allocate() == 0);  // now the cached one has to go
    REQUIRE(pool.stats().n_evictions == 1);
    REQUIRE_FALSE(pool.peek_cached(42).has_value());
}

TEST_CASE("allocate answers nullopt only when every block is referenced", "[kv]") {
    BlockPool pool(8);
    std::vector<int32_t> held;
    // Fill, cache half of them, release those: allocation must keep succeeding by evicting.
    for (int i = 0; i < 8; ++i) held.push_back(*pool.allocate());
    for (int i = 0; i < 4; ++i) {
        pool.publish(held[i], 1000 + i, 1, false);
        pool.unref(held[i]);
    }
    for (int i = 0; i < 4; ++i) {
        REQUIRE(pool.n_used() < pool.n_total());
        REQUIRE(pool.allocate().has_value());
    }
    REQUIRE(pool.n_used() == pool.n_total());
    REQUIRE_FALSE(pool.allocate().has_value());
}

TEST_CASE("publish keeps the block already holding a hash and leaves the newcomer uncached", "[kv]") {
    BlockPool pool(3);
    const int32_t a = *pool.allocate();
    const int32_t b = *pool.allocate();
    REQUIRE(pool.publish(a, 555, /*tenant=*/1, true) == a);
    REQUIRE(pool.publish(b, 555, /*tenant=*/2, false) == a);
    REQUIRE(pool.stats().n_publish_dedupes == 1);
    REQUIRE_FALSE(pool.is_cached(b));
    REQUIRE(pool.info(a).tenant == 1);  // the first writer stays recorded
    REQUIRE(pool.info(a).is_public);
    // Publishing the same block under the same hash again changes nothing.
    REQUIRE(pool.publish(a, 555, 3, false) == a);
    REQUIRE(pool.info(a).tenant == 1);
    REQUIRE(pool.n_cached() == 1);
    // The newcomer is freed as a plain block; the original is evictable and still findable.
    pool.unref(b);
    pool.unref(a);
    REQUIRE(pool.n_evictable() == 1);
    REQUIRE(pool.peek_cached(555) == a);
    REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("Access ticks and hit counts follow the operations that touch a block", "[kv]") {
    BlockPool pool(2);
    const int32_t a = *pool.allocate();  // tick 1
    REQUIRE(pool.info(a).last_access_tick == 1);
    pool.publish(a, 9, 1, false);  // publishing is not an access
    pool.unref(a);                 // tick 2
    REQUIRE(pool.info(a).last_access_tick == 2);
    REQUIRE(pool.find_cached(9) == a);  // tick 3, hit 1
    REQUIRE(pool.find_cached(9) == a);  // tick 4, hit 2
    REQUIRE(pool.info(a).n_hits == 2);
    REQUIRE(pool.info(a).last_access_tick == 4);
    REQUIRE(pool.stats().n_cache_lookups == 2);
    REQUIRE(pool.stats().n_cache_hits == 2);
    pool.ref(a);  // tick 5
    REQUIRE(pool.info(a).last_access_tick == 5);
    REQUIRE(pool.tick() == 5);
}

TEST_CASE("An eviction policy chooses the victim among evictable blocks shown in LRU order", "[kv]") {
    BlockPool pool(3);
    std::vector<EvictionCandidate> seen;
    for (int32_t i = 0; i < 3; ++i) {
        pool.allocate();
        pool.publish(i, 50 + i, 10 + i, i == 1);
    }
    for (int32_t b : {1, 2, 0}) pool.unref(b);
    pool.find_cached(52);  // 2 gets a hit and becomes most recent: LRU order 1, 0, 2
    pool.set_eviction_policy(std::make_unique<FixedIndexPolicy>(2, &seen));  // pick the MRU one
    REQUIRE(pool.allocate() == 2);
    REQUIRE(seen.size() == 3);
    REQUIRE(seen[0].block == 1);
    REQUIRE(seen[1].block == 0);
    REQUIRE(seen[2].block == 2);
    REQUIRE(seen[0].hash == 51);
    REQUIRE(seen[0].tenant == 11);
    REQUIRE(seen[0].is_public);
    REQUIRE(seen[2].n_hits == 1);
    REQUIRE(seen[0].last_access_tick < seen[1].last_access_tick);
    REQUIRE(seen[1].last_access_tick < seen[2].last_access_tick);
    REQUIRE(pool.stats().n_invalid_victims == 0);

    // An answer out of range is counted and replaced by the LRU block.
    pool.set_eviction_policy(std::make_unique<FixedIndexPolicy>(17, &seen));
    REQUIRE(pool.allocate() == 1);
    REQUIRE(pool.stats().n_invalid_victims == 1);
    // Back to the default.
    pool.set_eviction_policy(nullptr);
    REQUIRE(pool.allocate() == 0);
    REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("Invariant violations abort instead of corrupting the pool", "[kv]") {
    REQUIRE(aborts([] {
        BlockPool pool(2);
        const int32_t b = *pool.allocate();
        pool.unref(b);
        pool.unref(b);  // already at 0
    }));
    REQUIRE(aborts([] {
        BlockPool pool(2);
        pool.ref(1);  // free and uncached: nothing to revive
    }));
    REQUIRE(aborts([] {
        BlockPool pool(2);
        pool.unref(7);  // out of range
    }));
    REQUIRE(aborts([] {
        BlockPool pool(2);
        const int32_t b = *pool.allocate();
        pool.publish(b, 1, 0, false);
        pool.publish(b, 2, 0, false);  // a cached block is immutable
    }));
    REQUIRE(aborts([] {
        BlockPool pool(2);
        pool.publish(0, 1, 0, false);  // unreferenced
    }));
    // The helper itself tells a clean exit from an abort.
    REQUIRE_FALSE(aborts([] {
        BlockPool pool(2);
        pool.unref(*pool.allocate());
    }));
}
