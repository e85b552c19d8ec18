/* crash_create.so: a routing plugin whose create() dereferences NULL (SIGSEGV). Loaded in-process it
 * kills the host; tests only load it with [plugins] check_in_child = true, where the child dies. */
#include "test_plugin.h"

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)host, (void)params, (void)out, (void)err, (void)err_len;
    volatile int* p = NULL;
    *p = 1;
    return STEWARD_PLUGIN_ERR;
}

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools;
    out->pool = 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION, .size = sizeof table, .create = create, .destroy = tp_destroy, .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "crash_create",
                                          "create() segfaults", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
