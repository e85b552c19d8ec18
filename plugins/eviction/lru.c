/* eviction/lru: reclaims the least recently used block (the host orders the candidates least
 * recently used first), keeping blocks with reuse priority (referenced documents and the prompt
 * before them, docs/reuse.md) until no other block is left: the built-in default's choice. No
 * parameters. A host older than the reuse_priority field gets plain LRU. */
#include "plugin_util.h"

SP_DEFINE_STATELESS(lru)

static int lru_choose_victim(steward_policy* self, const steward_evict_context* ctx,
                             const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx, (void)cands, (void)n;
    *victim = 0;
    return STEWARD_PLUGIN_OK;
}

static int lru_choose_victim_v2(steward_policy* self, const steward_evict_context* ctx, const steward_evict_request* req,
                                const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx, (void)cands;
    *victim = 0;
    if (req && STEWARD_HAS_FIELD(req, steward_evict_request, reuse_priority) && req->reuse_priority)
        for (uint32_t i = 0; i < n; ++i)
            if (req->reuse_priority[i] == 0) {
                *victim = i;
                break;
            }
    return STEWARD_PLUGIN_OK;
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof(steward_eviction_table),
    .create = lru_create,
    .destroy = lru_destroy,
    .choose_victim = lru_choose_victim,
    .choose_victim_v2 = lru_choose_victim_v2,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_EVICTION, "lru", "least recently used block first; documents' blocks last", table)
