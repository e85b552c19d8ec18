/* abort_eviction.so: an eviction plugin whose choose_victim() calls abort(): in-process it would kill
 * the server inside an engine step; with isolation = "process" only its plugin host dies, the
 * eviction falls back to LRU and the host is restarted. */
#include "test_plugin.h"

static int choose_victim(steward_policy* self, const steward_evict_context* ctx, const steward_evict_candidate* cands,
                         uint32_t n, uint32_t* out) {
    (void)self, (void)ctx, (void)cands, (void)n, (void)out;
    abort();
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION, .size = sizeof table, .create = tp_create, .destroy = tp_destroy,
    .choose_victim = choose_victim,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_EVICTION, "abort_eviction",
                                          "choose_victim aborts", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
