// KV tiers: where a full, cached KV block goes when its pool evicts it, so that a prefix that left
// the pool is promoted back instead of recomputed (SGLang's HiCache, vLLM's offloading connector,
// llama.cpp's --cache-ram). Two tiers below the pool:
//  - host: a byte budget of blocks in process memory, exclusive of the pool (a block is in the pool
//    or in the host tier, never both); its overflow demotes to disk;
//  - disk: one file per block in a private directory (mode 0700; files written with O_EXCL |
//    O_NOFOLLOW to a temporary name, then renamed), each with a header (what it belongs to) and a
//    CRC-32 of its bytes. Inclusive: a promoted block keeps its file, so a restart finds it. The
//    index is rebuilt at open from the files; a file that is not ours, fails its checks or belongs to
//    another layout (model fingerprint, block size, KV types) or salt set is deleted, never served.
// Blocks are keyed by their chained hash (kv/block_hash.h), which carries the tenant salt: a tenant
// can only ever hash its way to its own blocks and declared-public ones. Not thread-safe: one owner
// (the pool's engine).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <steward/expected.h>

#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/kv_event.h"

namespace steward {

const char* kv_tier_name(KvTier t);  // "pool", "host", "disk"

// What every block of a tier belongs to. A block is only ever served to a pool of equal identity.
struct KvTierIdentity {
    uint64_t layout = 0;         // model fingerprint, block size, KV types, layers, heads, head dim
    uint64_t salts = 0;          // the tenant salt set (a changed salt config invalidates every block)
    int64_t payload_bytes = 0;   // bytes of one block (KvStorage::block_payload_bytes)
};

// What a tier keeps about one block beside its bytes (what the pool's BlockPool knew of it).
struct TierBlockMeta {
    BlockHash hash = 0;
    int32_t tenant = -1;     // the tenant that wrote it
    bool is_public = false;  // inside a declared-public prefix
    int32_t depth = 0;       // its index in the sequence that published it
    int64_t n_hits = 0;      // prefix-cache hits so far
    int32_t reuse_priority = 0;  // 1: a document's block (docs/reuse.md); kept in the disk file
    ReuseKeys reuse_keys;        // the documents it follows (in memory only: a restart forgets them)
};

struct KvTierOptions {
    int64_t host_bytes = 0;  // 0: no host tier
    int64_t disk_bytes = 0;  // 0: no disk tier
    std::string disk_dir;    // required with disk_bytes > 0; created (0700) if absent
};

// Per-tier figures (docs/metrics.md: KV tiers). Index by (int)KvTier::HOST / DISK; [POOL] unused.
struct KvTierCounters {
    int64_t n_blocks = 0;      // held now
    int64_t bytes = 0;         // held now (disk: file sizes)
    int64_t n_stores = 0;      // blocks stored (demotions into this tier)
    int64_t n_removals = 0;    // blocks evicted out of this tier (host: demoted to disk or dropped)
    int64_t n_hits = 0;        // take() calls answered from this tier
    int64_t n_lookups = 0;     // take() calls that reached this tier
};

struct KvTierStats {
    KvTierCounters tier[3];
    int64_t n_disk_reads = 0, n_disk_writes = 0;
    int64_t disk_read_bytes = 0, disk_write_bytes = 0;
    int64_t n_dropped_files = 0;  // files deleted at open or at read: bad header, checksum, layout, salts
    int64_t n_write_errors = 0;   // disk writes that failed (the block is then only lost, never wrong)
    int64_t n_invalidated = 0;    // blocks dropped by invalidate_reuse (host and disk)
};

// The KV tiers of one pool.
class KvTiers {
public:
    // Opens the tiers. With a disk tier: creates disk_dir (0700) or checks the existing one (a
    // directory, not a symlink, owned by this user, no group/other permissions: else an error naming
    // the fix), then indexes its files (dropping, with a warning each, those that fail; see above) and
    // trims the index to disk_bytes (oldest files first). Errors: the directory's.
    static Expected<std::unique_ptr<KvTiers>> open(const KvTierOptions& opt, const KvTierIdentity& id);
    ~KvTiers();

    const KvTierIdentity& identity() const;
    const KvTierOptions& options() const;

    // A block leaving the pool with its bytes (payload_bytes of them). Goes to the host tier if there
    // is one, else to disk; a tier over its budget evicts (the policy's victim among its blocks, the
    // least recently used first; nullptr: LRU) into the next tier down, or drops it from the last.
    // A hash already held is refreshed (its bytes are equal by construction), not stored twice.
    // ctx: what the policy sees (its tier field is set here); may be null without a policy.
    void demote(const TierBlockMeta& meta, std::span<const uint8_t> payload, EvictionPolicy* policy = nullptr,
                const EvictionContext* ctx = nullptr);
    // Every cached block of the pool at shutdown, written to the disk tier only (no host), so a restart
    // finds it; a block already on disk is skipped. No-op without a disk tier.
    void persist(const TierBlockMeta& meta, std::span<const uint8_t> payload);

    // The tier holding hash, without touching anything; nullopt: none.
    std::optional<KvTier> peek(BlockHash hash) const;
    // Promotion: the block's bytes into out (payload_bytes) and its metadata. A host block leaves the
    // host tier (the pool holds it now); a disk block keeps its file. nullopt on a miss, or when the
    // file is gone, unreadable or fails its checksum (then it is deleted, counted in n_dropped_files
    // and a warning logged): the caller recomputes, never reads wrong bytes.
    std::optional<TierBlockMeta> take(BlockHash hash, std::span<uint8_t> out, KvTier* from = nullptr);

    // A document changed (BlockPool::invalidate_reuse): every block of either tier holding one of
    // `keys` is dropped (a disk block's file deleted). Returns the blocks dropped.
    int invalidate_reuse(std::span<const uint64_t> keys);

    // KV events per tier (kv/kv_event.h, with tier set), recorded while on, handed over by take_events.
    void set_record_events(bool on);
    std::vector<KvEvent> take_events();
    // Every hash held now, with its tier (what a new subscriber to the events starts from).
    std::vector<std::pair<BlockHash, KvTier>> held() const;

    const KvTierStats& stats() const;
    // Walks every structure; "" or the first inconsistency (index vs byte counts vs LRU order).
    std::string check_invariants() const;

    struct Impl;

private:
    explicit KvTiers(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// ---- the disk tier's file format (exposed for the fuzz target and tests)
// A file is a 96-byte header then payload_bytes of block bytes. Header, little-endian:
//   magic "STKVBLK1" (8) | version u32 = 1 | header_bytes u32 = 96 | layout u64 | salts u64 | hash u64 |
//   tenant i32 | is_public u32 | depth i32 | reuse_priority u32 (0 or 1) | n_hits i64 | payload_bytes i64 |
//   payload_crc32 u32 | reserved (16 bytes, zero) | header_crc32 u32 (of the 92 bytes before it)
struct TierFileHeader {
    uint64_t layout = 0, salts = 0;
    TierBlockMeta meta;
    int64_t payload_bytes = 0;
    uint32_t payload_crc32 = 0;
};
constexpr size_t k_tier_header_bytes = 96;
std::vector<uint8_t> encode_tier_header(const TierFileHeader& h);
// Checks magic, version, sizes and the header's CRC; the error names what is wrong.
Expected<TierFileHeader> parse_tier_header(std::span<const uint8_t> bytes);
// A whole file's bytes checked against an identity: header, layout, salts, payload size and CRC.
// On success the payload is bytes[k_tier_header_bytes ..]. The error names the first failure.
Expected<TierFileHeader> check_tier_file(std::span<const uint8_t> bytes, const KvTierIdentity& id);
// The file name of a block: 16 hex digits of the layout, '-', 16 of the hash, ".kvb".
std::string tier_file_name(uint64_t layout, BlockHash hash);

}  // namespace steward
