/* invalid_eviction.so: an eviction plugin whose victim is out of range (index n). */
#include "test_plugin.h"

static int choose_victim(steward_policy* self, const steward_evict_context* ctx,
                         const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx, (void)cands;
    *victim = n;
    return STEWARD_PLUGIN_OK;
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof table,
    .create = tp_create,
    .destroy = tp_destroy,
    .choose_victim = choose_victim,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_EVICTION, "invalid_eviction",
                                          "victim out of range", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
