/* swap_v1.so / swap_v2.so (this file compiled with SWAP_VERSION=1 or 2): a routing plugin that
 * picks pool SWAP_VERSION-1 (pool 0 if there are not that many) and sets nothing else; for hot-swap
 * tests, which replace one file by the other. */
#include "test_plugin.h"

#ifndef SWAP_VERSION
#error "compile with -DSWAP_VERSION=1 or 2"
#endif
#define SWAP_STR2(x) #x
#define SWAP_STR(x) SWAP_STR2(x)

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools;
    out->pool = n_pools > SWAP_VERSION - 1 ? SWAP_VERSION - 1 : 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof table,
    .create = tp_create,
    .destroy = tp_destroy,
    .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING,
                                          "swap_v" SWAP_STR(SWAP_VERSION), "pool " SWAP_STR(SWAP_VERSION) " - 1",
                                          &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
