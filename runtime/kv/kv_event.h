// KV events (as NVIDIA Dynamo's): a block's chained hash became findable in a pool (stored) or stopped
// being findable (removed), in the pool or in one of its tiers. The block pool and the tiers record
// them when asked; the cache actor's prefix index replays them to know which pool holds which prefix
// blocks, and where.
#pragma once
#include <cstdint>

#include "kv/block_hash.h"

namespace steward {

enum class KvEventKind : int32_t { STORED = 0, REMOVED = 1 };

// Where a block is: the pool's own KV, or a tier below it (kv/kv_tier.h). A prefix hit in a lower
// tier costs a promotion (a copy from host memory, a file read), cheaper than recompute but not free.
enum class KvTier : int32_t { POOL = 0, HOST = 1, DISK = 2 };

struct KvEvent {
    KvEventKind kind = KvEventKind::STORED;
    BlockHash hash = 0;
    KvTier tier = KvTier::POOL;  // the tier the block was stored in or removed from
    bool operator==(const KvEvent&) const = default;
};

}  // namespace steward
