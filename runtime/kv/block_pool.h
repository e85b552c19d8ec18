// The block pool: ref counts of a pool's physical KV block ids, the free queue, the hash -> block map of
// cached full blocks, and eviction (vLLM v1's BlockPool). The KV bytes live in kv/kv_storage.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_event.h"

// Invariant check that stays on in release builds: a broken invariant aborts with a message, it never
// turns into undefined behaviour. Used by kv/ for caller bugs (unref of a free block, unknown sequence).
#define STEWARD_KV_CHECK(cond, msg) \
    ((cond) ? static_cast<void>(0) : ::steward::kv_check_failed(#cond, (msg), __FILE__, __LINE__))

namespace steward {

[[noreturn]] void kv_check_failed(const char* expr, const char* msg, const char* file, int line);

// What an eviction policy sees of one evictable block (ref count 0, holding a cached hash).
struct EvictionCandidate {
    int32_t block = -1;
    BlockHash hash = 0;
    int32_t tenant = -1;           // the tenant that first wrote (published) it
    bool is_public = false;        // inside a declared-public prefix
    int64_t last_access_tick = 0;  // pool tick of the last allocate/ref/unref/find_cached touching it
    int64_t n_hits = 0;            // find_cached hits since it was published
    int32_t depth = 0;             // the block's index in the sequence that published it
    int32_t reuse_priority = 0;    // 1: the system prompt and documents of a request that referenced
                                   // documents (docs/reuse.md); the default LRU takes these last
};

// The reuse keys of a cached block (reuse::document_key of the documents its tokens follow), shared by
// the blocks of one sequence. invalidate_reuse drops the blocks holding a key.
using ReuseKeys = std::shared_ptr<const std::vector<uint64_t>>;

// Blocks a tenant holds (cached or in use, by writer) and its quota, for eviction policies.
struct TenantBlocks {
    int32_t tenant = -1;
    int32_t n_held = 0;
    int32_t quota_blocks = -1;  // -1: none configured
};

// What else an eviction policy may weigh: who is asking and what each tenant holds.
struct EvictionContext {
    int64_t now_tick = 0;
    int32_t n_blocks_total = 0;
    int32_t requesting_tenant = -1;
    int32_t block_size = 0;   // token slots per block (0: unknown)
    double block_bytes = 0;   // bytes of KV one block holds (0: unknown)
    std::span<const TenantBlocks> tenants;
    const std::vector<std::string>* tenant_names = nullptr;  // by tenant id (may be shorter; null: unknown)
    KvTier tier = KvTier::POOL;  // where the candidates are: the pool's blocks or a tier's (kv/kv_tier.h)
};

// Chooses which evictable block to reclaim. The hook for eviction plugins; the default (no policy set)
// is LRU among blocks without reuse priority, then LRU among those with it. Called only from BlockPool::allocate, on the pool's thread.
class EvictionPolicy {
public:
    virtual ~EvictionPolicy() = default;
    // `candidates` holds every evictable block, least recently used first; never empty.
    // Returns an index into it. An index out of range is counted (n_invalid_victims) and replaced by 0 (LRU).
    // k_no_victim declines every candidate: allocate() fails (counted in n_declined), as when no block is free.
    static constexpr size_t k_no_victim = SIZE_MAX;
    virtual size_t choose_victim(const EvictionContext& ctx, std::span<const EvictionCandidate> candidates) = 0;
};

// A cached block the pool evicted, as it was just before: what a KV tier needs to keep it (its bytes
// stay intact in KV storage until the block's new owner writes it).
struct EvictedBlock {
    int32_t block = -1;
    BlockHash hash = 0;
    int32_t tenant = -1;
    bool is_public = false;
    int32_t depth = 0;
    int64_t n_hits = 0;
    int32_t reuse_priority = 0;
    ReuseKeys reuse_keys;
};

// A snapshot of one block's bookkeeping (tests, metrics, policies).
struct BlockInfo {
    int32_t ref_count = 0;
    std::optional<BlockHash> hash;  // set while the block is cached (findable by hash)
    int32_t tenant = -1;
    bool is_public = false;
    int64_t last_access_tick = 0;
    int64_t n_hits = 0;
    int32_t depth = 0;
    int32_t reuse_priority = 0;
    ReuseKeys reuse_keys;
    bool doomed = false;  // invalidated while referenced: uncached when its last reference goes
};

struct BlockPoolStats {
    int64_t n_allocations = 0;      // successful allocate() calls
    int64_t n_alloc_failures = 0;   // allocate() calls that returned nullopt
    int64_t n_evictions = 0;        // cached unreferenced blocks reclaimed by allocate()
    int64_t n_cache_lookups = 0;    // find_cached() calls
    int64_t n_cache_hits = 0;       // find_cached() calls that found a block
    int64_t n_publishes = 0;        // publish() calls that mapped a new hash
    int64_t n_publish_dedupes = 0;  // publish() calls whose hash already mapped to another block
    int64_t n_invalid_victims = 0;  // eviction policy answers out of range (replaced by LRU)
    int64_t n_declined = 0;         // allocate() calls failed because the policy declined every candidate
    int64_t n_invalidated = 0;      // cached blocks invalidate_reuse() uncached (now or at their last unref)
    int64_t n_priority_evictions = 0;  // evictions of blocks with reuse priority
};

// Not thread-safe: one owner (the kv_allocator actor, or a test) calls it. Every block id argument must
// be in [0, n_total()); a violated precondition aborts via STEWARD_KV_CHECK.
class BlockPool {
public:
    explicit BlockPool(int32_t n_blocks);

    // A block with ref count 1, or nullopt when every block is referenced (an ordinary answer: the
    // scheduler preempts). Takes an uncached free block first; otherwise evicts the victim of the
    // eviction policy (default: least recently used evictable block), dropping its hash.
    std::optional<int32_t> allocate();
    // ref count + 1. A block at ref count 0 may only be revived if it is cached (it then leaves the
    // evictable queue); reviving an uncached free block is a caller bug and aborts.
    void ref(int32_t block);
    // ref count - 1; at 0 the block joins the free queue: a cached one at the most-recently-used end of
    // the evictable queue, keeping its hash. Aborts on a block already at 0.
    void unref(int32_t block);

    // The block cached under `hash`, or nullopt. A hit counts as an access: it bumps the block's hit count
    // and tick and, if the block is evictable, moves it to the most-recently-used end. Does not ref it.
    std::optional<int32_t> find_cached(BlockHash hash);
    // Same lookup without touching anything (tests, invariant checks, routers peeking).
    std::optional<int32_t> peek_cached(BlockHash hash) const;
    // Makes referenced full `block` findable under `hash`, recording its first writer. Returns the block
    // that now holds `hash`: `block` itself, or the block that already held it (then `block` stays
    // uncached; the caller keeps using it, without double-mapping). Publishing a block again under the
    // same hash is a no-op; under a different hash it aborts (cached blocks are immutable).
    // `depth` is the block's index in its sequence (what cost-aware policies weigh).
    int32_t publish(int32_t block, BlockHash hash, int32_t tenant, bool is_public, int32_t depth = 0);
    // The reuse standing of referenced cached `block` (docs/reuse.md): its priority is raised to
    // `priority` (never lowered here) and it takes `keys` when it holds none. The KV manager calls it
    // when a sequence that referenced documents publishes or reuses the block.
    void mark_reuse(int32_t block, int32_t priority, const ReuseKeys& keys);
    // A document changed (new version, expired, deleted): every cached block holding one of `keys`
    // stops being findable. An evictable one is uncached now (a REMOVED event); a referenced one
    // loses its priority and is uncached when its last reference goes. Returns the blocks affected.
    // O(blocks in the pool).
    int32_t invalidate_reuse(std::span<const uint64_t> keys);

    // nullptr restores the default LRU choice.
    void set_eviction_policy(std::unique_ptr<EvictionPolicy> policy);
    // For the allocations that follow: the policy of the request that needs blocks (a per-bucket
    // plugin; nullptr: the pool's policy) and its tenant (recorded as the new blocks' writer). Not owned.
    void set_active_eviction(EvictionPolicy* policy, int32_t requesting_tenant) {
        active_policy_ = policy;
        requesting_tenant_ = requesting_tenant;
    }
    // Tenant names by id, for eviction policies (not owned; must outlive the pool's allocations).
    void set_tenant_names(const std::vector<std::string>* names) { tenant_names_ = names; }
    // What eviction policies see of a block's size.
    void set_block_geometry(int32_t block_size, double block_bytes) {
        block_size_ = block_size;
        block_bytes_ = block_bytes;
    }
    // A tenant's KV quota in blocks (eviction policies see it); -1 removes it.
    void set_tenant_quota(int32_t tenant, int32_t quota_blocks);
    // KV events: while on, every hash publish() maps and every hash eviction drops is recorded, in order,
    // until take_events() hands them over (off by default: pools nobody indexes pay nothing).
    void set_record_events(bool on) { record_events_ = on; }
    std::vector<KvEvent> take_events() { return std::exchange(events_, {}); }
    // Evicted blocks: while on, every cached block allocate() reclaims is recorded until take_evicted()
    // hands them over (the KV tiers demote them; off by default).
    void set_record_evicted(bool on) { record_evicted_ = on; }
    std::vector<EvictedBlock> take_evicted() { return std::exchange(evicted_, {}); }

    int32_t n_total() const { return static_cast<int32_t>(blocks_.size()); }
    int32_t n_free() const { return n_total() - n_used_; }  // ref count 0: uncached free + evictable
    int32_t n_used() const { return n_used_; }              // ref count > 0
    int32_t n_cached() const { return static_cast<int32_t>(hash_to_block_.size()); }  // holding a hash
    // Every hash a block holds now (what a new subscriber to the events starts from), any order.
    std::vector<BlockHash> cached_hashes() const {
        std::vector<BlockHash> v;
        v.reserve(hash_to_block_.size());
        for (const auto& [h, b] : hash_to_block_) v.push_back(h);
        return v;
    }
    int32_t n_priority() const { return n_priority_; }  // cached blocks with reuse priority
    int32_t n_evictable() const { return n_evictable_; }                              // ref count 0 and holding a hash
    int32_t ref_count(int32_t block) const;
    bool is_cached(int32_t block) const;  // holds a hash (referenced or evictable)
    BlockInfo info(int32_t block) const;
    // Evictable blocks, least recently used first (both priority classes, merged by tick).
    std::vector<int32_t> evictable_lru() const;
    const BlockPoolStats& stats() const { return stats_; }
    int64_t tick() const { return tick_; }

    // Walks every structure and returns a description of the first inconsistency, or "" when none:
    // free queues vs ref counts, the hash map vs block hashes, LRU list links and tick order, counters.
    std::string check_invariants() const;

private:
    struct Block {
        int32_t ref_count = 0;
        bool has_hash = false;
        BlockHash hash = 0;
        int32_t tenant = -1;
        bool is_public = false;
        int64_t last_access_tick = 0;
        int64_t n_hits = 0;
        int32_t depth = 0;
        int32_t reuse_priority = 0;  // > 0: in the priority queue while evictable
        ReuseKeys reuse_keys;
        bool doomed = false;
        // Intrusive doubly linked evictable queue of its class (LRU at head); -1 ends it.
        bool in_evictable = false;
        int32_t prev = -1;
        int32_t next = -1;
    };

    void check_block(int32_t block) const;
    void evictable_push_back(int32_t block);
    void evictable_remove(int32_t block);
    int32_t choose_victim();  // a block of the evictable queues; -1 when the policy declined
    static int queue_of(const Block& b) { return b.reuse_priority > 0 ? 1 : 0; }
    void uncache_free(int32_t block);  // an evictable block leaves the queue and its hash: uncached free

    std::vector<Block> blocks_;
    std::vector<int32_t> uncached_free_;  // stack; popped from the back, seeded so block 0 comes first
    // Two evictable queues: [0] blocks without reuse priority, [1] with it; each LRU at its head.
    int32_t lru_head_[2] = {-1, -1};
    int32_t lru_tail_[2] = {-1, -1};
    int32_t n_evictable_ = 0;
    int32_t n_priority_ = 0;
    int32_t n_used_ = 0;
    std::unordered_map<BlockHash, int32_t> hash_to_block_;
    std::unique_ptr<EvictionPolicy> policy_;
    EvictionPolicy* active_policy_ = nullptr;
    const std::vector<std::string>* tenant_names_ = nullptr;
    int32_t requesting_tenant_ = -1;
    int32_t block_size_ = 0;
    double block_bytes_ = 0;
    std::unordered_map<int32_t, int32_t> tenant_quota_;
    int64_t tick_ = 0;
    BlockPoolStats stats_;
    bool record_events_ = false;
    std::vector<KvEvent> events_;
    bool record_evicted_ = false;
    std::vector<EvictedBlock> evicted_;
};

}  // namespace steward
