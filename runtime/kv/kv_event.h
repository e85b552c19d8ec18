// KV events (as NVIDIA Dynamo's): a block's chained hash became findable in a pool (stored) or stopped
// being findable (removed). The block pool records them when asked; the cache actor's prefix index
// replays them to know which pool holds which prefix blocks.
#pragma once
#include <cstdint>

#include "kv/block_hash.h"

namespace steward {

enum class KvEventKind : int32_t { STORED = 0, REMOVED = 1 };

struct KvEvent {
    KvEventKind kind = KvEventKind::STORED;
    BlockHash hash = 0;
    bool operator==(const KvEvent&) const = default;
};

}  // namespace steward
