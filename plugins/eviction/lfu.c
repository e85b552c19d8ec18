/* eviction/lfu: reclaims the block with the fewest prefix-cache hits; among equals, the least
 * recently used (the lowest index). No parameters. */
#include "plugin_util.h"

SP_DEFINE_STATELESS(lfu)

static int lfu_choose_victim(steward_policy* self, const steward_evict_context* ctx,
                             const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx;
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; ++i)
        if (cands[i].n_hits < cands[best].n_hits) best = i;
    *victim = best;
    return STEWARD_PLUGIN_OK;
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof(steward_eviction_table),
    .create = lfu_create,
    .destroy = lfu_destroy,
    .choose_victim = lfu_choose_victim,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_EVICTION, "lfu", "fewest prefix-cache hits first, then least recently used", table)
