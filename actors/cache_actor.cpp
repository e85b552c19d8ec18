// cache_actor: one per runtime. Keeps the prefix index of every pool from the executors' KV events and
// answers, per request, how many prompt tokens each pool holds. The asker sends the prompt's hashes per
// pool (not its tokens): hashing needs each pool's tokenizer, block size and public prefixes, which the
// asker has; the actor, the one shared point every request crosses, only does set lookups, and a query
// is 8 bytes per block instead of 4 per token.
#include "actors/actors.hpp"
#include "kv/prefix_index.h"

namespace steward {

namespace {

struct cache_state {
    PrefixIndex index;
    static inline const char* name = "cache";
};

// `name` is only there because CAF 0.17 spawns a function actor without arguments through a null
// std::shared_ptr<std::tuple<>> that it dereferences (undefined behaviour UBSan reports).
CacheActor::behavior_type cache_actor(CacheActor::stateful_pointer<cache_state> self, std::string name) {
    (void)name;
    return {
        [=](kv_events_atom, const KvEventBatch& b) { self->state.index.apply(b.pool_id, b.events); },
        [=](kv_drop_atom, uint64_t pool_id) { self->state.index.reset(pool_id); },
        [=](cache_atom, const CacheQuery& q) {
            CachedTokens out;
            out.n_tokens.reserve(q.pools.size());
            for (const CachePoolQuery& p : q.pools)
                out.n_tokens.push_back(self->state.index.cached_tokens(p.pool_id, p.hashes, p.block_size));
            return out;
        },
        [=](stats_atom, const std::vector<uint64_t>& pool_ids) {
            CacheStats s;
            s.pool_ids = pool_ids;
            for (uint64_t id : pool_ids) s.n_blocks.push_back(self->state.index.n_blocks(id));
            s.n_events = self->state.index.n_events();
            return s;
        },
    };
}

}  // namespace

CacheActor spawn_cache(caf::actor_system& sys) { return sys.spawn(cache_actor, std::string("cache")); }

}  // namespace steward
