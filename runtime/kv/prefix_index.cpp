// The prefix index: a hash set per pool, fed by KV events, walked along a prompt's block chain.
#include "kv/prefix_index.h"


namespace steward {

std::vector<BlockHash> lookup_block_hashes(std::span<const int32_t> prompt, int block_size, int32_t tenant,
                                           uint64_t salt, std::span<const std::vector<int32_t>> public_prefixes) {
    if (block_size <= 0 || prompt.empty()) return {};
    const uint64_t s = salt != k_public_salt ? salt : tenant_salt(tenant);  // as KvManager::add_seq
    const size_t n_lookup = (prompt.size() - 1) / static_cast<size_t>(block_size);
    // Only the looked-up blocks are hashed, but the public prefix is matched against the whole
    // prompt (a prefix ending inside the last block still makes the blocks before it public).
    const int n_public = public_prefix_length(prompt, public_prefixes);
    std::vector<BlockHash> out;
    out.reserve(n_lookup);
    BlockHash parent = k_root_block_hash;
    for (size_t b = 0; b < n_lookup; ++b) {
        const bool is_public = static_cast<int>((b + 1) * block_size) <= n_public;
        parent = hash_block(parent, prompt.subspan(b * block_size, block_size), is_public ? k_public_salt : s);
        out.push_back(parent);
    }
    return out;
}

void PrefixIndex::apply(PoolId pool, std::span<const KvEvent> events) {
    auto& held = pools_[pool];
    for (const KvEvent& e : events) {
        const int t = static_cast<int>(e.tier);
        if (t < 0 || t > 2) continue;  // not a tier this index knows (a newer peer's): ignored
        const auto bit = static_cast<uint8_t>(1u << t);
        if (e.kind == KvEventKind::STORED) {
            held[e.hash] |= bit;
        } else if (auto it = held.find(e.hash); it != held.end()) {
            it->second &= static_cast<uint8_t>(~bit);
            if (it->second == 0) held.erase(it);
        }
    }
    n_events_ += static_cast<int64_t>(events.size());
}

void PrefixIndex::reset(PoolId pool) { pools_.erase(pool); }

int PrefixIndex::n_leading_blocks(PoolId pool, std::span<const BlockHash> chain) const {
    auto it = pools_.find(pool);
    if (it == pools_.end()) return 0;
    int n = 0;
    for (BlockHash h : chain) {
        if (!it->second.count(h)) break;
        ++n;
    }
    return n;
}

int PrefixIndex::cached_tokens(PoolId pool, std::span<const BlockHash> chain, int block_size, TierWeights w) const {
    auto it = pools_.find(pool);
    if (it == pools_.end()) return 0;
    double n = 0;
    for (BlockHash h : chain) {
        auto b = it->second.find(h);
        if (b == it->second.end()) break;
        const uint8_t m = b->second;
        n += (m & 1u) ? 1.0 : (m & 2u) ? w.host : w.disk;
    }
    return static_cast<int>(n * block_size);
}

bool PrefixIndex::holds(PoolId pool, BlockHash hash) const {
    auto it = pools_.find(pool);
    return it != pools_.end() && it->second.count(hash) != 0;
}

std::optional<KvTier> PrefixIndex::tier_of(PoolId pool, BlockHash hash) const {
    auto it = pools_.find(pool);
    if (it == pools_.end()) return std::nullopt;
    auto b = it->second.find(hash);
    if (b == it->second.end()) return std::nullopt;
    return (b->second & 1u) ? KvTier::POOL : (b->second & 2u) ? KvTier::HOST : KvTier::DISK;
}

int64_t PrefixIndex::n_blocks(PoolId pool) const {
    auto it = pools_.find(pool);
    return it == pools_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace steward
