// The prefix index: which pool holds which prefix blocks, rebuilt from the pools' KV events (block
// stored / removed), and how many leading tokens of a prompt each pool could serve from its cache.
// The cache actor's core; routing reads its answers (KV-aware routing). A worker's pools feed it too:
// their executors send their KV events to the front's cache actor.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_event.h"

namespace steward {

using PoolId = uint64_t;  // a pool instance (a reload that replaces a pool gives the new one a new id)

// The hashes of the blocks of `prompt` that KvManager::get_computed_blocks could find, with the same
// rules as KvManager::add_seq: salt is the tenant's configured salt, or tenant_salt(tenant) when 0;
// blocks fully inside the longest declared-public prefix the prompt starts with use k_public_salt;
// never the block holding the last token ((n - 1) / block_size blocks), which is always computed.
// Pure, thread-safe. O(prompt tokens + public prefix tokens).
std::vector<BlockHash> lookup_block_hashes(std::span<const int32_t> prompt, int block_size, int32_t tenant,
                                           uint64_t salt, std::span<const std::vector<int32_t>> public_prefixes);

// What a cached token is worth to routing, per tier it would come from: a token in the pool's own KV
// costs nothing; one in a tier costs its promotion (a host-memory copy, a file read), cheaper than
// computing it but not free. Routing counts tier hits at these fractions of a pool hit.
struct TierWeights {
    double host = 0.8;
    double disk = 0.5;
};

// Not thread-safe: one owner (the cache actor, or a test).
class PrefixIndex {
public:
    // Replays a pool's events in order: stored adds the event's tier to the hash, removed takes it
    // away (a hash in no tier is forgotten). A pool's events must arrive in the order the pool
    // recorded them for each tier (one sender per pool keeps that).
    void apply(PoolId pool, std::span<const KvEvent> events);
    // Forgets everything the pool held (the pool was replaced or stopped).
    void reset(PoolId pool);

    // Leading hashes of `chain` the pool holds in any tier: the walk stops at the first missing
    // block, as the prefix match in the engine does (a tier hit continues it). O(answer + 1).
    int n_leading_blocks(PoolId pool, std::span<const BlockHash> chain) const;
    // The leading blocks' tokens, each block weighted by the cheapest tier holding it (1 for the
    // pool's own KV): what routing compares across pools. Rounded down.
    int cached_tokens(PoolId pool, std::span<const BlockHash> chain, int block_size, TierWeights w = {}) const;
    bool holds(PoolId pool, BlockHash hash) const;  // in any tier
    // The cheapest tier holding hash; nullopt when none.
    std::optional<KvTier> tier_of(PoolId pool, BlockHash hash) const;
    int64_t n_blocks(PoolId pool) const;  // hashes the pool holds now, in any tier
    size_t n_pools() const { return pools_.size(); }
    int64_t n_events() const { return n_events_; }  // applied since construction

private:
    // Per pool: hash -> the tiers holding it (bit 1 << tier).
    std::unordered_map<PoolId, std::unordered_map<BlockHash, uint8_t>> pools_;
    int64_t n_events_ = 0;
};

}  // namespace steward
