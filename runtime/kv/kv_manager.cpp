// The KV manager: per-sequence block tables over the block pool, prefix lookup, copy-on-write and metrics.
#include "kv/kv_manager.h"

#include <algorithm>
#include <unordered_map>

namespace steward {

KvManager::KvManager(int32_t n_blocks, int block_size) : pool_(n_blocks), block_size_(block_size) {
    STEWARD_KV_CHECK(block_size > 0, "block_size must be > 0");
}

void KvManager::set_public_prefixes(std::vector<std::vector<int32_t>> prefixes) {
    public_prefixes_ = std::move(prefixes);
    for (auto& [id, s] : seqs_) {
        s.public_len = 0;
        s.public_checked_len = 0;  // hashes_public_blocks is kept: refresh_hashes compares against it
    }
}

SeqKv& KvManager::get(SeqId seq) {
    auto it = seqs_.find(seq);
    STEWARD_KV_CHECK(it != seqs_.end(), "unknown sequence id");
    return it->second;
}

const SeqKv& KvManager::seq(SeqId seq) const {
    auto it = seqs_.find(seq);
    STEWARD_KV_CHECK(it != seqs_.end(), "unknown sequence id");
    return it->second;
}

std::vector<SeqId> KvManager::seq_ids() const {
    std::vector<SeqId> ids;
    ids.reserve(seqs_.size());
    for (const auto& [id, s] : seqs_) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    return ids;
}

bool KvManager::needs_cow(int32_t block) const {
    return pool_.ref_count(block) > 1 || pool_.is_cached(block);
}

// Brings the public-prefix match and the hash chain up to tokens.size() / block_size full blocks. Tokens
// only grow between truncations, so only public prefixes longer than the last check need comparing.
void KvManager::refresh_hashes(SeqKv& s) const {
    const int n = s.n_tokens();
    if (s.public_checked_len != n) {
        for (const auto& p : public_prefixes_) {
            const int len = static_cast<int>(p.size());
            if (len <= s.public_len || len <= s.public_checked_len || len > n) continue;
            if (std::equal(p.begin(), p.end(), s.tokens.begin())) s.public_len = len;
        }
        s.public_checked_len = n;
    }
    const int n_public_blocks = s.public_len / block_size_;
    if (n_public_blocks != s.hashes_public_blocks) {
        // The salt of blocks between the old and new public boundary changed, and the chain after them.
        const size_t keep = std::min<size_t>(s.block_hashes.size(), std::min(n_public_blocks, s.hashes_public_blocks));
        s.block_hashes.resize(keep);
        s.hashes_public_blocks = n_public_blocks;
    }
    const size_t n_full = static_cast<size_t>(n / block_size_);
    const std::span<const int32_t> tokens(s.tokens);
    while (s.block_hashes.size() < n_full) {
        const size_t b = s.block_hashes.size();
        const BlockHash parent = b == 0 ? k_root_block_hash : s.block_hashes[b - 1];
        const uint64_t salt = static_cast<int>(b) < n_public_blocks ? k_public_salt : s.salt;
        s.block_hashes.push_back(hash_block(parent, tokens.subspan(b * block_size_, block_size_), salt));
    }
}

SeqId KvManager::add_seq(int32_t tenant, std::span<const int32_t> prompt, uint64_t salt) {
    SeqKv s;
    s.tenant = tenant;
    s.salt = salt != k_public_salt ? salt : tenant_salt(tenant);  // never the public salt
    s.tokens.assign(prompt.begin(), prompt.end());
    const SeqId id = next_id_++;
    seqs_.emplace(id, std::move(s));
    return id;
}

int KvManager::get_computed_blocks(SeqId seq) {
    SeqKv& s = get(seq);
    STEWARD_KV_CHECK(s.blocks.empty() && s.n_computed == 0, "get_computed_blocks on a sequence already holding KV");
    refresh_hashes(s);
    const int n = s.n_tokens();
    const int max_blocks = n > 0 ? (n - 1) / block_size_ : 0;
    int n_hit_blocks = 0, n_cross = 0, n_public = 0;
    for (; n_hit_blocks < max_blocks; ++n_hit_blocks) {
        const auto block = pool_.find_cached(s.block_hashes[n_hit_blocks]);
        if (!block) break;
        pool_.ref(*block);
        s.blocks.push_back(*block);
        const BlockInfo info = pool_.info(*block);
        if (info.tenant != s.tenant) (info.is_public ? n_public : n_cross) += block_size_;
    }
    const int n_hit = n_hit_blocks * block_size_;
    s.n_computed = s.n_cached_tokens = n_hit;
    s.n_cached_cross_tenant_tokens = n_cross;
    s.n_cached_public_tokens = n_public;
    counters_.n_tenant_boundary_hit_tokens += n_cross;
    counters_.n_public_cross_tenant_hit_tokens += n_public;
    counters_.n_prefix_query_tokens += n;
    counters_.n_prefix_hit_tokens += n_hit;
    PrefixCacheCounts& t = counters_.per_tenant[s.tenant];
    t.n_query_tokens += n;
    t.n_hit_tokens += n_hit;
    return n_hit;
}

std::optional<BlockHash> KvManager::next_prompt_block_hash(SeqId seq) {
    SeqKv& s = get(seq);
    STEWARD_KV_CHECK(s.n_computed == static_cast<int>(s.blocks.size()) * block_size_,
                     "tier promotion on a sequence holding more than its cached chain");
    refresh_hashes(s);
    const int n = s.n_tokens();
    const size_t max_blocks = n > 0 ? static_cast<size_t>((n - 1) / block_size_) : 0;
    if (s.blocks.size() >= max_blocks) return std::nullopt;
    return s.block_hashes[s.blocks.size()];
}

// One more block on the cached chain: the counts get_computed_blocks keeps, for one block.
void KvManager::count_promoted(SeqKv& s, int32_t writer, bool is_public) {
    int n_cross = 0, n_public = 0;
    if (writer != s.tenant) (is_public ? n_public : n_cross) = block_size_;
    s.n_computed += block_size_;
    s.n_cached_tokens += block_size_;
    s.n_cached_cross_tenant_tokens += n_cross;
    s.n_cached_public_tokens += n_public;
    counters_.n_tenant_boundary_hit_tokens += n_cross;
    counters_.n_public_cross_tenant_hit_tokens += n_public;
    counters_.n_prefix_hit_tokens += block_size_;
    counters_.per_tenant[s.tenant].n_hit_tokens += block_size_;
}

bool KvManager::pin_next_cached(SeqId seq) {
    const auto h = next_prompt_block_hash(seq);
    if (!h) return false;
    const auto block = pool_.find_cached(*h);
    if (!block) return false;
    SeqKv& s = get(seq);
    pool_.ref(*block);
    s.blocks.push_back(*block);
    const BlockInfo info = pool_.info(*block);
    count_promoted(s, info.tenant, info.is_public);
    return true;
}

std::optional<int32_t> KvManager::adopt_next_block(SeqId seq, int32_t tenant, bool is_public) {
    const auto h = next_prompt_block_hash(seq);
    STEWARD_KV_CHECK(h.has_value(), "adopt_next_block past the prompt's full blocks");
    STEWARD_KV_CHECK(!pool_.peek_cached(*h), "adopt_next_block of a hash the pool holds (pin_next_cached first)");
    const auto block = pool_.allocate();
    if (!block) {
        ++counters_.n_alloc_failures;
        return std::nullopt;
    }
    SeqKv& s = get(seq);
    const int32_t depth = static_cast<int32_t>(s.blocks.size());
    pool_.publish(*block, *h, tenant, is_public, depth);
    s.blocks.push_back(*block);
    mark_reuse(s, depth);
    count_promoted(s, tenant, is_public);
    return block;
}

void KvManager::set_reuse(SeqId seq, int priority_len, int keyed_from, ReuseKeys keys) {
    SeqKv& s = get(seq);
    s.priority_len = std::max(priority_len, 0);
    s.keyed_from = std::max(keyed_from, 0);
    s.reuse_keys = keys && !keys->empty() ? std::move(keys) : nullptr;
}

void KvManager::mark_reuse(const SeqKv& s, int b) {
    if (s.priority_len <= 0 && !s.reuse_keys) return;
    const int end = (b + 1) * block_size_;  // the block's tokens end here
    const int32_t priority = end <= s.priority_len ? 1 : 0;
    static const ReuseKeys none;
    const ReuseKeys& keys = end > s.keyed_from ? s.reuse_keys : none;
    if (priority > 0 || keys) pool_.mark_reuse(s.blocks[b], priority, keys);
}

int KvManager::invalidate_reuse(std::span<const uint64_t> keys) {
    if (keys.empty()) return 0;
    for (auto& [id, s] : seqs_) {
        if (!s.reuse_keys) continue;
        for (uint64_t k : *s.reuse_keys)
            if (std::find(keys.begin(), keys.end(), k) != keys.end()) {
                s.priority_len = 0;
                s.keyed_from = 0;
                s.reuse_keys = nullptr;
                break;
            }
    }
    return pool_.invalidate_reuse(keys);
}

void KvManager::append_tokens(SeqId seq, std::span<const int32_t> tokens) {
    SeqKv& s = get(seq);
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
}

int KvManager::n_blocks_needed(SeqId seq, int n_new) const {
    const SeqKv& s = this->seq(seq);
    STEWARD_KV_CHECK(n_new >= 0, "n_new must be >= 0");
    if (n_new == 0) return 0;
    const int n_blocks_total = (s.n_computed + n_new + block_size_ - 1) / block_size_;
    const int n_have = static_cast<int>(s.blocks.size());
    int n = std::max(0, n_blocks_total - n_have);
    for (int b = s.n_computed / block_size_; b < std::min(n_have, n_blocks_total); ++b) n += needs_cow(s.blocks[b]);
    return n;
}

std::optional<std::vector<BlockCopy>> KvManager::allocate_slots(SeqId seq, int n_new) {
    SeqKv& s = get(seq);
    STEWARD_KV_CHECK(n_new >= 0 && s.n_computed + n_new <= s.n_tokens(), "allocate_slots beyond the known tokens");
    std::vector<BlockCopy> copies;
    if (n_new == 0) return copies;
    if (n_blocks_needed(seq, n_new) > pool_.n_free()) {
        ++counters_.n_alloc_failures;
        return std::nullopt;
    }
    const int n_blocks_total = (s.n_computed + n_new + block_size_ - 1) / block_size_;
    const int n_have = static_cast<int>(s.blocks.size());
    std::vector<int32_t> released;
    std::vector<int> cowed;  // indices of s.blocks replaced by a copy (their sources are in `released`)
    // An eviction policy may decline (the pool then answers nullopt despite n_free): undo this call.
    auto undo = [&]() -> std::optional<std::vector<BlockCopy>> {
        while (static_cast<int>(s.blocks.size()) > n_have) {
            pool_.unref(s.blocks.back());
            s.blocks.pop_back();
        }
        for (size_t k = 0; k < cowed.size(); ++k) {
            pool_.unref(s.blocks[cowed[k]]);
            s.blocks[cowed[k]] = released[k];
            --counters_.n_cow_blocks;
        }
        ++counters_.n_alloc_failures;
        return std::nullopt;
    };
    for (int b = s.n_computed / block_size_; b < std::min(n_have, n_blocks_total); ++b) {
        const int32_t src = s.blocks[b];
        if (!needs_cow(src)) continue;
        const auto dst = pool_.allocate();
        if (!dst) return undo();
        const int n_slots = std::max(0, s.n_computed - b * block_size_);
        if (n_slots > 0) copies.push_back({src, *dst, n_slots});
        s.blocks[b] = *dst;
        released.push_back(src);
        cowed.push_back(b);
        ++counters_.n_cow_blocks;
    }
    while (static_cast<int>(s.blocks.size()) < n_blocks_total) {
        const auto block = pool_.allocate();
        if (!block) return undo();
        s.blocks.push_back(*block);
    }
    // Released only now, so no allocation above can reuse a copy source before the caller copies it.
    for (int32_t src : released) pool_.unref(src);
    return copies;
}

void KvManager::commit_computed(SeqId seq, int n) {
    SeqKv& s = get(seq);
    STEWARD_KV_CHECK(n >= 0 && s.n_computed + n <= s.n_tokens(), "commit_computed beyond the known tokens");
    STEWARD_KV_CHECK(s.n_computed + n <= static_cast<int>(s.blocks.size()) * block_size_,
                     "commit_computed beyond the allocated slots: call allocate_slots first");
    if (n == 0) return;
    const int b_end = (s.n_computed + n + block_size_ - 1) / block_size_;
    for (int b = s.n_computed / block_size_; b < b_end; ++b)
        STEWARD_KV_CHECK(!needs_cow(s.blocks[b]), "write into a shared or cached block: call allocate_slots first");
    s.n_computed += n;
}

int KvManager::publish_full_blocks(SeqId seq) {
    SeqKv& s = get(seq);
    refresh_hashes(s);
    const int n_full = s.n_computed / block_size_;
    int n_mapped = 0;
    for (int b = 0; b < n_full; ++b) {
        const int32_t block = s.blocks[b];
        // Already cached: found in the cache, published before or by a fork sibling, or under a hash from
        // before the public boundary moved. Cached blocks are immutable, so it keeps the hash it has.
        if (pool_.is_cached(block)) {
            mark_reuse(s, b);
            continue;
        }
        const int32_t holder = pool_.publish(block, s.block_hashes[b], s.tenant, b < s.hashes_public_blocks, b);
        if (holder == block) {
            ++n_mapped;
            mark_reuse(s, b);
        } else {
            ++counters_.n_publish_dedupes;
        }
    }
    return n_mapped;
}

void KvManager::truncate(SeqId seq, int n_tokens) {
    SeqKv& s = get(seq);
    STEWARD_KV_CHECK(n_tokens >= 0 && n_tokens <= s.n_tokens(), "truncate to a length outside [0, n_tokens]");
    s.tokens.resize(n_tokens);
    s.n_computed = std::min(s.n_computed, n_tokens);
    s.n_cached_tokens = std::min(s.n_cached_tokens, n_tokens);
    s.n_cached_cross_tenant_tokens = std::min(s.n_cached_cross_tenant_tokens, s.n_cached_tokens);  // keep shares <= the whole
    s.n_cached_public_tokens = std::min(s.n_cached_public_tokens, s.n_cached_tokens);
    const size_t n_keep = static_cast<size_t>((n_tokens + block_size_ - 1) / block_size_);
    while (s.blocks.size() > n_keep) {
        pool_.unref(s.blocks.back());
        s.blocks.pop_back();
    }
    const int n_full = n_tokens / block_size_;
    s.block_hashes.resize(std::min(s.block_hashes.size(), static_cast<size_t>(n_full)));
    if (s.public_len > n_tokens) {
        s.public_len = 0;
        s.public_checked_len = 0;
    } else {
        s.public_checked_len = std::min(s.public_checked_len, n_tokens);
    }
}

SeqId KvManager::fork(SeqId seq) {
    SeqKv child = this->seq(seq);
    // Only blocks holding computed KV are shared; slots reserved for pending tokens stay the source's.
    child.blocks.resize(
        std::min(child.blocks.size(), static_cast<size_t>((child.n_computed + block_size_ - 1) / block_size_)));
    for (int32_t b : child.blocks) pool_.ref(b);
    child.is_fork = true;
    const SeqId id = next_id_++;
    seqs_.emplace(id, std::move(child));
    return id;
}

void KvManager::free(SeqId seq) {
    SeqKv& s = get(seq);
    // Tail first: a chain's later blocks are less likely to be shared, so they should be evicted first
    // (vLLM does the same); losing an early block would orphan every block after it anyway.
    for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.unref(*it);
    seqs_.erase(seq);
}

double KvManager::fragmentation() const {
    std::unordered_map<int32_t, int> filled;  // physical block -> slots holding a computed token
    for (const auto& [id, s] : seqs_) {
        for (size_t i = 0; i < s.blocks.size(); ++i) {
            const int slots = std::clamp(s.n_computed - static_cast<int>(i) * block_size_, 0, block_size_);
            int& f = filled[s.blocks[i]];
            f = std::max(f, slots);
        }
    }
    if (filled.empty()) return 0.0;
    int64_t n_filled = 0;
    for (const auto& [block, f] : filled) n_filled += f;
    const int64_t n_slots = static_cast<int64_t>(filled.size()) * block_size_;
    return static_cast<double>(n_slots - n_filled) / static_cast<double>(n_slots);
}

KvManagerStats KvManager::stats() const {
    KvManagerStats out = counters_;
    out.n_evictions = pool_.stats().n_evictions;
    out.n_blocks_total = pool_.n_total();
    out.n_blocks_in_use = pool_.n_used();
    out.n_blocks_cached = pool_.n_cached();
    out.fragmentation = fragmentation();
    out.n_seqs = static_cast<int32_t>(seqs_.size());
    out.n_branches = 0;
    for (const auto& [id, s] : seqs_) out.n_branches += s.is_fork;
    out.n_blocks_priority = pool_.n_priority();
    out.n_priority_evictions = pool_.stats().n_priority_evictions;
    out.n_reuse_invalidated = pool_.stats().n_invalidated;
    return out;
}

}  // namespace steward
