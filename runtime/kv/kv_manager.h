// The KV manager: the per-sequence API over the block pool (vLLM v1's KVCacheManager): prefix lookup and
// pinning, slot allocation with copy-on-write, publishing full blocks, rollback, fork, free, and the
// prefix-cache and KV-cache figures of docs/metrics.md.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"

namespace steward {

using SeqId = int64_t;

// A copy the caller must apply to KV storage before its next allocate_slots call on the same manager:
// slots [0, n_slots) of src_block -> the same slots of dst_block, every layer, K and V
// (KvStorage::copy_slot). Until that call no block is handed out again, so src_block's bytes stay intact.
struct BlockCopy {
    int32_t src_block = -1;
    int32_t dst_block = -1;
    int n_slots = 0;
};

// One sequence's KV state. Read it through KvManager::seq(); only the manager changes it.
struct SeqKv {
    int32_t tenant = 0;
    uint64_t salt = 0;            // tenant_salt(tenant)
    std::vector<int32_t> tokens;  // every known token id: prompt, then sampled or drafted ones
    std::vector<int32_t> blocks;  // block table: logical block i -> physical block id
    int n_computed = 0;           // leading tokens whose KV is written (cache hits included)
    int n_cached_tokens = 0;      // tokens get_computed_blocks found in the prefix cache; of those:
    int n_cached_cross_tenant_tokens = 0;  // on blocks another tenant wrote, not public (a breach: 0)
    int n_cached_public_tokens = 0;        // on declared-public blocks another tenant wrote
    bool is_fork = false;         // created by fork(): counts as a branch while alive
    // Reuse beyond the prefix (docs/reuse.md; set_reuse): full blocks within the first priority_len
    // tokens get reuse priority; full blocks ending past keyed_from tokens carry reuse_keys.
    int priority_len = 0;
    int keyed_from = 0;
    ReuseKeys reuse_keys;
    int n_tokens() const { return static_cast<int>(tokens.size()); }

    // Hashing state, advanced lazily by the manager.
    std::vector<BlockHash> block_hashes;  // chained hashes of the leading full blocks of `tokens`
    int hashes_public_blocks = 0;         // public block count block_hashes were computed with
    int public_len = 0;                   // longest public prefix `tokens` starts with (0: none)
    int public_checked_len = 0;           // tokens.size() when public_len was last brought up to date
};

struct PrefixCacheCounts {
    int64_t n_query_tokens = 0;  // prompt tokens looked up
    int64_t n_hit_tokens = 0;    // prompt tokens found in cached full blocks
};

struct KvManagerStats {
    // Prefix cache (docs/metrics.md), in tokens.
    int64_t n_prefix_query_tokens = 0;
    int64_t n_prefix_hit_tokens = 0;
    std::map<int32_t, PrefixCacheCounts> per_tenant;  // keyed by tenant id
    int64_t n_tenant_boundary_hit_tokens = 0;         // hits on blocks another tenant wrote, not public: must stay 0
    int64_t n_public_cross_tenant_hit_tokens = 0;     // hits on public blocks another tenant wrote
    int64_t n_publish_dedupes = 0;                    // full blocks computed twice; ours kept, not mapped
    // KV cache.
    int64_t n_evictions = 0;
    int32_t n_blocks_total = 0;
    int32_t n_blocks_in_use = 0;  // ref count > 0
    int32_t n_blocks_cached = 0;  // holding a hash (in use or evictable)
    double fragmentation = 0.0;   // allocated token slots not holding a token / allocated token slots
    int32_t n_seqs = 0;
    int32_t n_branches = 0;        // live sequences created by fork()
    int64_t n_cow_blocks = 0;      // blocks replaced by copy-on-write
    int64_t n_alloc_failures = 0;  // allocate_slots calls answered nullopt
    // Reuse beyond the prefix (docs/reuse.md).
    int32_t n_blocks_priority = 0;      // cached blocks with reuse priority (documents and what precedes them)
    int64_t n_priority_evictions = 0;   // of those, evicted (the pool had nothing else to take)
    int64_t n_reuse_invalidated = 0;    // cached blocks dropped because a document changed
};

// Not thread-safe: one owner (the pool's Engine, on its executor's thread, or a test). Unknown sequence ids
// and out-of-range counts are caller bugs and abort via STEWARD_KV_CHECK; running out of blocks is not.
class KvManager {
public:
    KvManager(int32_t n_blocks, int block_size);

    // Token sequences whose full blocks every tenant may share (e.g. a common system prompt). A sequence
    // gets public blocks only when it starts with a whole public prefix; hashes of live sequences are
    // recomputed against the new list at their next lookup or publish.
    void set_public_prefixes(std::vector<std::vector<int32_t>> prefixes);
    const std::vector<std::vector<int32_t>>& public_prefixes() const { return public_prefixes_; }
    void set_eviction_policy(std::unique_ptr<EvictionPolicy> policy) { pool_.set_eviction_policy(std::move(policy)); }
    // See BlockPool::set_active_eviction / set_tenant_quota.
    void set_active_eviction(EvictionPolicy* policy, int32_t requesting_tenant) { pool_.set_active_eviction(policy, requesting_tenant); }
    void set_tenant_quota(int32_t tenant, int32_t quota_blocks) { pool_.set_tenant_quota(tenant, quota_blocks); }
    void set_tenant_names(const std::vector<std::string>* names) { pool_.set_tenant_names(names); }
    void set_block_bytes(double block_bytes) { pool_.set_block_geometry(block_size_, block_bytes); }
    // See BlockPool::set_record_events / take_events: the pool's block stored / removed events.
    void set_record_kv_events(bool on) { pool_.set_record_events(on); }
    std::vector<KvEvent> take_kv_events() { return pool_.take_events(); }
    std::vector<BlockHash> cached_hashes() const { return pool_.cached_hashes(); }
    // See BlockPool::set_record_evicted / take_evicted: cached blocks reclaimed, for the KV tiers.
    void set_record_evicted(bool on) { pool_.set_record_evicted(on); }
    std::vector<EvictedBlock> take_evicted() { return pool_.take_evicted(); }

    // A new sequence of `tenant` knowing `prompt`, holding no KV yet. Ids are never reused.
    // salt: the tenant's prefix-cache salt (from the config); 0 derives one from the tenant id.
    SeqId add_seq(int32_t tenant, std::span<const int32_t> prompt, uint64_t salt = 0);
    // Finds the longest chain of the prompt's full blocks in the prefix cache, pins them (ref + 1) into the
    // block table and returns the number of tokens they hold (n_computed becomes that). Never the whole
    // prompt: at most (n_tokens - 1) / block_size blocks, so the last token is computed and yields logits.
    // Counts queries and hits (per tenant, and on the sequence: n_cached_tokens and its cross-tenant
    // and public shares). Only on a sequence holding no blocks.
    int get_computed_blocks(SeqId seq);
    // Promotion from a KV tier, after get_computed_blocks: the hash of the sequence's next prompt block
    // past its cached chain (within get_computed_blocks' limit: never the block holding the last
    // token), or nullopt when there is none. Only while the sequence holds nothing but cached blocks.
    std::optional<BlockHash> next_prompt_block_hash(SeqId seq);
    // Extends the cached chain by that next block when the pool holds it now (pinned, counted as a
    // hit as in get_computed_blocks); false when it does not.
    bool pin_next_cached(SeqId seq);
    // Extends the cached chain by a fresh block published under the next hash, written by `tenant`
    // (public: inside a declared-public prefix), counted as a prefix hit: the caller must fill its KV
    // (every layer) before any forward reads it. The new block id, or nullopt when no block is free
    // (nothing changed). Evictions it causes are recorded as allocate_slots'.
    std::optional<int32_t> adopt_next_block(SeqId seq, int32_t tenant, bool is_public);
    // The sequence's documents (docs/reuse.md): its full blocks within the first priority_len tokens
    // (the system prompt and the documents) get reuse priority, and those ending past keyed_from
    // tokens (where the documents start) carry `keys` (reuse::document_key of each), so that
    // invalidate_reuse finds them. Applied as its blocks are published or found cached.
    void set_reuse(SeqId seq, int priority_len, int keyed_from, ReuseKeys keys);
    // A document changed: every cached block holding one of `keys` stops being findable (see
    // BlockPool::invalidate_reuse), and live sequences holding one stop marking their blocks. Returns
    // the blocks affected.
    int invalidate_reuse(std::span<const uint64_t> keys);
    // Adds known tokens (sampled, drafted) to the sequence; no KV is allocated.
    void append_tokens(SeqId seq, std::span<const int32_t> tokens);
    // Fresh blocks allocate_slots(seq, n_new) would take: new table entries plus copy-on-write replacements.
    int n_blocks_needed(SeqId seq, int n_new) const;
    // Makes the slots of the next n_new tokens (n_computed + n_new <= n_tokens) writable: grows the block
    // table and replaces every block in the write range that is shared or cached by a fresh one. Returns the
    // copies the caller must apply (see BlockCopy), or nullopt when the pool lacks free blocks; then nothing
    // changed and the scheduler preempts.
    std::optional<std::vector<BlockCopy>> allocate_slots(SeqId seq, int n_new);
    // Records that the KV of the next n tokens has been written (after allocate_slots and the forward).
    void commit_computed(SeqId seq, int n);
    // Publishes every computed full block of the sequence that is not cached yet: hashes it (tenant salt, or
    // salt 0 inside a public prefix) and maps it. If the hash already maps to another block, the sequence
    // keeps its own block, unmapped (tried again at the next call, in case that block has been evicted).
    // Returns the number of blocks newly mapped. O(full blocks of the sequence).
    int publish_full_blocks(SeqId seq);
    // Rollback to the first n_tokens tokens: unrefs blocks past them (the tail first, so it is evicted first);
    // a partly filled last block stays (and is copied on the next write if it is shared or cached).
    void truncate(SeqId seq, int n_tokens);
    // A new sequence sharing the source's tokens and the blocks holding its computed KV (ref + 1 each).
    // Either side's next write into a shared block is copy-on-write (allocate_slots).
    SeqId fork(SeqId seq);
    // Unrefs the sequence's blocks (the tail first); cached ones stay findable until evicted.
    void free(SeqId seq);

    bool has_seq(SeqId seq) const { return seqs_.count(seq) != 0; }
    const SeqKv& seq(SeqId seq) const;
    std::vector<SeqId> seq_ids() const;  // ascending
    int block_size() const { return block_size_; }
    const BlockPool& pool() const { return pool_; }
    // Allocated token slots not holding a computed token / allocated token slots, over the distinct blocks
    // referenced by sequences (a shared block counts once, filled as far as its fullest user). 0 when none.
    double fragmentation() const;
    KvManagerStats stats() const;
    int64_t n_evictions() const { return pool_.stats().n_evictions; }  // cheap, for per-call deltas

private:
    SeqKv& get(SeqId seq);
    bool needs_cow(int32_t block) const;
    void refresh_hashes(SeqKv& s) const;
    void count_promoted(SeqKv& s, int32_t writer, bool is_public);
    void mark_reuse(const SeqKv& s, int b);  // block index b of s: its reuse standing in the pool

    BlockPool pool_;
    int block_size_;
    std::vector<std::vector<int32_t>> public_prefixes_;
    std::unordered_map<SeqId, SeqKv> seqs_;
    SeqId next_id_ = 1;
    KvManagerStats counters_;  // the running counters; stats() adds the gauges
};

}  // namespace steward
