/* bad_abi.so: a routing plugin built "against" a newer ABI (STEWARD_POLICY_ABI_VERSION + 1); it
 * returns its description to any host, so the host itself must refuse it. */
#include "test_plugin.h"

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools, (void)out;
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
    (void)host_abi_version;
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION + 1, STEWARD_POLICY_ROUTING, "bad_abi",
                                          "built against a future ABI", &table};
    return &plugin;
}
