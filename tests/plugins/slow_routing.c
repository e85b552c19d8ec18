/* slow_routing.so: a routing plugin whose route() sleeps sleep_ms (default 2000) before choosing pool
 * `pool` (default 0): a decision that overruns the host's time budget. */
#include "test_plugin.h"

#include <time.h>

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    int64_t v = 2000, pool = 0;
    host->param_int(params, "sleep_ms", &v);
    host->param_int(params, "pool", &pool);
    self->value = v;
    self->mode = (int)pool;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)req, (void)pools, (void)n_pools;
    struct timespec ts = {(time_t)(self->value / 1000), (long)(self->value % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
    out->pool = self->mode;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION, .size = sizeof table, .create = create, .destroy = tp_destroy, .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "slow_routing",
                                          "route sleeps sleep_ms", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
