/* segv_routing.so: a routing plugin that picks pool `pool` (default 0) and segfaults (a NULL write) on
 * its instance's `crash_at`-th decision (default 5): in-process it would kill the server; with
 * isolation = "process" its plugin host dies, is restarted, and the new instance counts from 1 again. */
#include "test_plugin.h"

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    int64_t crash_at = 5;
    host->param_int(params, "pool", &self->value);
    host->param_int(params, "crash_at", &crash_at);
    self->mode = (int)crash_at; /* decisions left before the crash */
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)req, (void)pools, (void)n_pools;
    if (--self->mode == 0) {
        volatile int* p = NULL;
        *p = 1;
    }
    out->pool = (int32_t)self->value;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION, .size = sizeof table, .create = create, .destroy = tp_destroy, .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "segv_routing",
                                          "segfaults on its crash_at-th decision", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
