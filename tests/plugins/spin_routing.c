/* spin_routing.so: a routing plugin whose route() spins (a busy loop, no system call) until the int at
 * address release_flag (a parameter: a test passes the address of its own volatile int) is non-zero;
 * without the parameter it spins forever. A plugin stuck in an endless loop. */
#include "test_plugin.h"

#include <stdint.h>

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    host->param_int(params, "release_flag", &self->value);
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)req, (void)pools, (void)n_pools;
    static volatile int never = 0;
    volatile int* flag = self->value ? (volatile int*)(intptr_t)self->value : &never;
    while (!*flag) {
    }
    out->pool = 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION, .size = sizeof table, .create = create, .destroy = tp_destroy, .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "spin_routing",
                                          "route spins until released", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
