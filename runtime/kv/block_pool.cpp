// The block pool: ref counts, an uncached free stack, an intrusive LRU queue of evictable cached blocks
// and the hash -> block map. Every operation is O(1) except eviction through a custom policy (O(n_evictable)).
#include "kv/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

namespace steward {

void kv_check_failed(const char* expr, const char* msg, const char* file, int line) {
    std::fprintf(stderr, "%s:%d: KV invariant violated: %s (%s)\n", file, line, msg, expr);
    std::abort();
}

BlockPool::BlockPool(int32_t n_blocks) {
    STEWARD_KV_CHECK(n_blocks >= 0, "block pool size must be >= 0");
    blocks_.resize(n_blocks);
    uncached_free_.reserve(n_blocks);
    for (int32_t b = n_blocks - 1; b >= 0; --b) uncached_free_.push_back(b);
}

void BlockPool::check_block(int32_t block) const {
    STEWARD_KV_CHECK(block >= 0 && block < n_total(), "block id out of range");
}

void BlockPool::evictable_push_back(int32_t block) {
    Block& b = blocks_[block];
    const int q = queue_of(b);
    b.in_evictable = true;
    b.prev = lru_tail_[q];
    b.next = -1;
    if (lru_tail_[q] >= 0)
        blocks_[lru_tail_[q]].next = block;
    else
        lru_head_[q] = block;
    lru_tail_[q] = block;
    ++n_evictable_;
}

void BlockPool::evictable_remove(int32_t block) {
    Block& b = blocks_[block];
    const int q = queue_of(b);
    if (b.prev >= 0)
        blocks_[b.prev].next = b.next;
    else
        lru_head_[q] = b.next;
    if (b.next >= 0)
        blocks_[b.next].prev = b.prev;
    else
        lru_tail_[q] = b.prev;
    b.in_evictable = false;
    b.prev = b.next = -1;
    --n_evictable_;
}

void BlockPool::uncache_free(int32_t block) {
    Block& b = blocks_[block];
    if (b.in_evictable) evictable_remove(block);
    if (b.reuse_priority > 0) --n_priority_;
    hash_to_block_.erase(b.hash);
    if (record_events_) events_.push_back({KvEventKind::REMOVED, b.hash});
    b = Block{};
    uncached_free_.push_back(block);
}

int32_t BlockPool::choose_victim() {
    EvictionPolicy* policy = active_policy_ ? active_policy_ : policy_.get();
    // The default: the least recently used block without reuse priority; only when none is left, the
    // least recently used with it (a document's blocks outlive one-off prompts, not each other).
    const int32_t lru = lru_head_[0] >= 0 ? lru_head_[0] : lru_head_[1];
    if (!policy) return lru;
    // A policy sees both queues merged by recency; O(n_evictable) per eviction is the price of letting
    // a plugin weigh hit counts, tenants or reuse priority. The default path above stays O(1).
    std::vector<EvictionCandidate> candidates;
    candidates.reserve(n_evictable_);
    for (int32_t b : evictable_lru()) {
        const Block& m = blocks_[b];
        candidates.push_back({b, m.hash, m.tenant, m.is_public, m.last_access_tick, m.n_hits, m.depth, m.reuse_priority});
    }
    // What each tenant holds (cached or in use), by writer.
    std::unordered_map<int32_t, int32_t> held;
    for (const Block& m : blocks_)
        if (m.tenant >= 0 && (m.ref_count > 0 || m.has_hash)) ++held[m.tenant];
    for (const auto& [t, q] : tenant_quota_) held.try_emplace(t, 0);
    std::vector<TenantBlocks> tenants;
    tenants.reserve(held.size());
    for (const auto& [t, n] : held) {
        auto q = tenant_quota_.find(t);
        tenants.push_back({t, n, q == tenant_quota_.end() ? -1 : q->second});
    }
    std::sort(tenants.begin(), tenants.end(), [](const TenantBlocks& a, const TenantBlocks& b) { return a.tenant < b.tenant; });
    EvictionContext ctx;
    ctx.now_tick = tick_;
    ctx.n_blocks_total = n_total();
    ctx.requesting_tenant = requesting_tenant_;
    ctx.block_size = block_size_;
    ctx.block_bytes = block_bytes_;
    ctx.tenants = tenants;
    ctx.tenant_names = tenant_names_;
    const size_t i = policy->choose_victim(ctx, candidates);
    if (i == EvictionPolicy::k_no_victim) return -1;
    if (i >= candidates.size()) {
        ++stats_.n_invalid_victims;
        return lru;
    }
    return candidates[i].block;
}

std::optional<int32_t> BlockPool::allocate() {
    int32_t block = -1;
    if (!uncached_free_.empty()) {
        block = uncached_free_.back();
        uncached_free_.pop_back();
    } else if (n_evictable_ > 0) {
        block = choose_victim();
        if (block < 0) {  // the policy declined: an ordinary "no room", the scheduler preempts or waits
            ++stats_.n_declined;
            ++stats_.n_alloc_failures;
            return std::nullopt;
        }
        evictable_remove(block);
        hash_to_block_.erase(blocks_[block].hash);
        if (blocks_[block].reuse_priority > 0) {
            ++stats_.n_priority_evictions;
            --n_priority_;
        }
        if (record_evicted_) {
            const Block& v = blocks_[block];
            evicted_.push_back({block, v.hash, v.tenant, v.is_public, v.depth, v.n_hits, v.reuse_priority, v.reuse_keys});
        }
        if (record_events_) events_.push_back({KvEventKind::REMOVED, blocks_[block].hash});
        ++stats_.n_evictions;
    } else {
        ++stats_.n_alloc_failures;
        return std::nullopt;
    }
    Block& b = blocks_[block];
    b = Block{};
    b.ref_count = 1;
    b.tenant = requesting_tenant_;
    b.last_access_tick = ++tick_;
    ++n_used_;
    ++stats_.n_allocations;
    return block;
}

void BlockPool::ref(int32_t block) {
    check_block(block);
    Block& b = blocks_[block];
    if (b.ref_count == 0) {
        STEWARD_KV_CHECK(b.has_hash, "ref of a free uncached block (only cached blocks can be revived)");
        evictable_remove(block);
        ++n_used_;
    }
    ++b.ref_count;
    b.last_access_tick = ++tick_;
}

void BlockPool::unref(int32_t block) {
    check_block(block);
    Block& b = blocks_[block];
    STEWARD_KV_CHECK(b.ref_count > 0, "unref of a block whose ref count is already 0");
    --b.ref_count;
    b.last_access_tick = ++tick_;
    if (b.ref_count > 0) return;
    --n_used_;
    if (b.has_hash && b.doomed)
        uncache_free(block);  // invalidated while in use: its hash goes with its last reference
    else if (b.has_hash)
        evictable_push_back(block);
    else
        uncached_free_.push_back(block);
}

std::optional<int32_t> BlockPool::peek_cached(BlockHash hash) const {
    auto it = hash_to_block_.find(hash);
    if (it == hash_to_block_.end()) return std::nullopt;
    return it->second;
}

std::optional<int32_t> BlockPool::find_cached(BlockHash hash) {
    ++stats_.n_cache_lookups;
    auto found = peek_cached(hash);
    if (!found) return std::nullopt;
    ++stats_.n_cache_hits;
    Block& b = blocks_[*found];
    ++b.n_hits;
    b.last_access_tick = ++tick_;
    if (b.in_evictable) {
        evictable_remove(*found);
        evictable_push_back(*found);
    }
    return found;
}

void BlockPool::mark_reuse(int32_t block, int32_t priority, const ReuseKeys& keys) {
    check_block(block);
    Block& b = blocks_[block];
    STEWARD_KV_CHECK(b.ref_count > 0 && b.has_hash, "mark_reuse of a block that is not cached and referenced");
    if (b.doomed) return;
    if (b.reuse_priority <= 0 && priority > 0) ++n_priority_;
    b.reuse_priority = std::max(b.reuse_priority, priority);
    if (!b.reuse_keys && keys && !keys->empty()) b.reuse_keys = keys;
}

int32_t BlockPool::invalidate_reuse(std::span<const uint64_t> keys) {
    if (keys.empty()) return 0;
    int32_t n = 0;
    for (int32_t i = 0; i < n_total(); ++i) {
        Block& b = blocks_[i];
        if (!b.has_hash || b.doomed || !b.reuse_keys) continue;
        bool hit = false;
        for (uint64_t k : *b.reuse_keys)
            hit = hit || std::find(keys.begin(), keys.end(), k) != keys.end();
        if (!hit) continue;
        ++n;
        ++stats_.n_invalidated;
        if (b.ref_count == 0) {
            uncache_free(i);
        } else {
            b.doomed = true;
            if (b.reuse_priority > 0) --n_priority_;
            b.reuse_priority = 0;
        }
    }
    return n;
}

int32_t BlockPool::publish(int32_t block, BlockHash hash, int32_t tenant, bool is_public, int32_t depth) {
    check_block(block);
    Block& b = blocks_[block];
    STEWARD_KV_CHECK(b.ref_count > 0, "publish of an unreferenced block");
    if (b.has_hash) {
        STEWARD_KV_CHECK(b.hash == hash, "publish of a cached block under a different hash");
        return block;
    }
    auto [it, inserted] = hash_to_block_.try_emplace(hash, block);
    if (!inserted) {
        ++stats_.n_publish_dedupes;
        return it->second;
    }
    b.has_hash = true;
    b.hash = hash;
    b.tenant = tenant;
    b.is_public = is_public;
    b.depth = depth;
    b.n_hits = 0;
    ++stats_.n_publishes;
    if (record_events_) events_.push_back({KvEventKind::STORED, hash});
    return block;
}

void BlockPool::set_eviction_policy(std::unique_ptr<EvictionPolicy> policy) {
    policy_ = std::move(policy);
}

void BlockPool::set_tenant_quota(int32_t tenant, int32_t quota_blocks) {
    if (quota_blocks < 0)
        tenant_quota_.erase(tenant);
    else
        tenant_quota_[tenant] = quota_blocks;
}

int32_t BlockPool::ref_count(int32_t block) const {
    check_block(block);
    return blocks_[block].ref_count;
}

bool BlockPool::is_cached(int32_t block) const {
    check_block(block);
    return blocks_[block].has_hash;
}

BlockInfo BlockPool::info(int32_t block) const {
    check_block(block);
    const Block& b = blocks_[block];
    BlockInfo out;
    out.ref_count = b.ref_count;
    if (b.has_hash) out.hash = b.hash;
    out.tenant = b.tenant;
    out.is_public = b.is_public;
    out.last_access_tick = b.last_access_tick;
    out.n_hits = b.n_hits;
    out.depth = b.depth;
    out.reuse_priority = b.reuse_priority;
    out.reuse_keys = b.reuse_keys;
    out.doomed = b.doomed;
    return out;
}

std::vector<int32_t> BlockPool::evictable_lru() const {
    std::vector<int32_t> out;
    out.reserve(n_evictable_);
    int32_t a = lru_head_[0], p = lru_head_[1];
    while (a >= 0 || p >= 0) {
        const bool take_a = p < 0 || (a >= 0 && blocks_[a].last_access_tick < blocks_[p].last_access_tick);
        int32_t& from = take_a ? a : p;
        out.push_back(from);
        from = blocks_[from].next;
    }
    return out;
}

std::string BlockPool::check_invariants() const {
    auto at = [](const char* what, int32_t block) {
        return std::string(what) + " (block " + std::to_string(block) + ")";
    };
    int32_t n_used = 0, n_hashed = 0, n_should_be_evictable = 0;
    for (int32_t i = 0; i < n_total(); ++i) {
        const Block& b = blocks_[i];
        if (b.ref_count < 0) return at("negative ref count", i);
        if (b.ref_count > 0) ++n_used;
        if (b.has_hash) {
            ++n_hashed;
            auto it = hash_to_block_.find(b.hash);
            if (it == hash_to_block_.end() || it->second != i) return at("cached block missing from the hash map", i);
        }
        const bool should_be_evictable = b.ref_count == 0 && b.has_hash;
        if (b.in_evictable != should_be_evictable) return at("evictable flag disagrees with ref count and hash", i);
        if (should_be_evictable) ++n_should_be_evictable;
    }
    if (n_used != n_used_) return "n_used counter " + std::to_string(n_used_) + " != " + std::to_string(n_used);
    if (n_hashed != n_cached()) return "hash map holds entries for blocks that no longer hold the hash";
    for (const auto& [hash, block] : hash_to_block_) {
        if (block < 0 || block >= n_total() || !blocks_[block].has_hash || blocks_[block].hash != hash)
            return at("hash map entry points at a block not holding that hash", block);
    }
    std::unordered_set<int32_t> seen;
    for (int32_t b : uncached_free_) {
        if (b < 0 || b >= n_total()) return at("uncached free stack holds an invalid id", b);
        if (!seen.insert(b).second) return at("block twice in the uncached free stack", b);
        if (blocks_[b].ref_count != 0 || blocks_[b].has_hash)
            return at("uncached free stack holds a used or cached block", b);
    }
    int32_t n_uncached_free = 0;
    for (const Block& b : blocks_) n_uncached_free += (b.ref_count == 0 && !b.has_hash);
    if (n_uncached_free != static_cast<int32_t>(uncached_free_.size()))
        return "a free uncached block is missing from its stack";
    int32_t n_listed = 0;
    for (int q = 0; q < 2; ++q) {
        int32_t prev = -1;
        for (int32_t b = lru_head_[q]; b >= 0; b = blocks_[b].next) {
            if (++n_listed > n_total()) return "evictable queue has a cycle";
            if (!blocks_[b].in_evictable) return at("evictable queue holds a block not flagged evictable", b);
            if (queue_of(blocks_[b]) != q) return at("evictable block in the queue of the other reuse priority", b);
            if (blocks_[b].prev != prev) return at("evictable queue back link broken", b);
            if (prev >= 0 && blocks_[prev].last_access_tick >= blocks_[b].last_access_tick)
                return at("evictable queue out of LRU order", b);
            prev = b;
        }
        if (prev != lru_tail_[q]) return "evictable queue tail is wrong";
    }
    if (n_listed != n_evictable_ || n_listed != n_should_be_evictable) return "evictable count mismatch";
    int32_t n_priority = 0;
    for (const Block& b : blocks_) n_priority += b.has_hash && b.reuse_priority > 0;
    if (n_priority != n_priority_) return "reuse priority count mismatch";
    for (int32_t i = 0; i < n_total(); ++i)
        if (blocks_[i].doomed && (blocks_[i].ref_count == 0 || !blocks_[i].has_hash))
            return at("an invalidated block outlived its last reference", i);
    return "";
}

}  // namespace steward
