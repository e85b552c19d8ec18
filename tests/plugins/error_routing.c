/* error_routing.so: a routing plugin whose route() always fails with STEWARD_PLUGIN_ERR. */
#include "test_plugin.h"

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools;
    out->pool = 999; /* garbage the host must ignore: the call failed */
    return STEWARD_PLUGIN_ERR;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof table,
    .create = tp_create,
    .destroy = tp_destroy,
    .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "error_routing",
                                          "route always fails", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
