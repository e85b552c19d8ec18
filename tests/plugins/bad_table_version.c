/* bad_table_version.so: a routing plugin of the right ABI whose table claims version 99. */
#include "test_plugin.h"

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools, (void)out;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = 99,
    .size = sizeof table,
    .create = tp_create,
    .destroy = tp_destroy,
    .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "bad_table_version",
                                          "routing table version 99", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
