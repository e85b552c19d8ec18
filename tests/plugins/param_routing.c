/* param_routing.so: a routing plugin that returns the pool index given by its int param pick
 * (default 0, must be >= 0); the host validates the index. Two buckets with different picks show
 * that each instance gets its own parameters. */
#include "test_plugin.h"

#include <stdio.h>

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    int64_t pick = 0;
    int rc = host->param_int(params, "pick", &pick);
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND) pick = 0;
    else if (rc != STEWARD_PLUGIN_OK || pick < 0 || pick > INT32_MAX) {
        if (err != NULL && err_len > 0) snprintf(err, err_len, "parameter 'pick' must be an integer >= 0");
        return STEWARD_PLUGIN_ERR_PARAM;
    }
    if ((rc = tp_create(host, params, out, err, err_len)) != STEWARD_PLUGIN_OK) return rc;
    (*out)->value = pick;
    return STEWARD_PLUGIN_OK;
}

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)req, (void)pools, (void)n_pools;
    out->pool = (int32_t)self->value;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof table,
    .create = create,
    .destroy = tp_destroy,
    .route = route,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "param_routing",
                                          "the pool named by the param pick", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
