/* eviction/lru: reclaims the least recently used block, i.e. the first candidate (the host orders
 * them least recently used first). No parameters. */
#include "plugin_util.h"

SP_DEFINE_STATELESS(lru)

static int lru_choose_victim(steward_policy* self, const steward_evict_context* ctx,
                             const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx, (void)cands, (void)n;
    *victim = 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof(steward_eviction_table),
    .create = lru_create,
    .destroy = lru_destroy,
    .choose_victim = lru_choose_victim,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_EVICTION, "lru", "least recently used block first", table)
