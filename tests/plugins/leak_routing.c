/* leak_routing.so: a routing plugin whose route() allocates 64 KiB, touches it and never frees it: a
 * plugin that leaks per decision (the check_in_child check measures the heap's growth). */
#include "test_plugin.h"

#include <string.h>

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools;
    static void* volatile last; /* kept where the compiler cannot prove it unused (else malloc is elided) */
    char* p = (char*)malloc(64 * 1024);
    if (p) memset(p, 1, 64 * 1024);
    last = p;
    out->pool = 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION, .size = sizeof table, .create = tp_create, .destroy = tp_destroy, .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "leak_routing",
                                          "route leaks 64 KiB a call", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
