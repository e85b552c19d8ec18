/* v1_routing.so: a routing plugin built against the FROZEN ABI 1 header (tests/plugins/v1/steward/
 * policy.h, a copy of the header before ABI 2), as a plugin compiled before ABI 2 existed would be:
 * its entry point answers only host version 1, its table is a version 1 table. It routes to the pool
 * index given by its int param pick (default 1). Shows that the host still loads and calls it. */
#include <steward/policy.h>

#include <stdio.h>
#include <stdlib.h>

struct steward_policy {
    int32_t pick;
};

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    if (host == NULL || host->version != STEWARD_HOST_API_VERSION) {
        snprintf(err, err_len, "unsupported host API");
        return STEWARD_ERR;
    }
    int64_t pick = 1;
    int rc = host->param_int(params, "pick", &pick);
    if (rc == STEWARD_ERR_NOT_FOUND) pick = 1;
    else if (rc != STEWARD_OK || pick < 0 || pick > 1000) {
        snprintf(err, err_len, "parameter 'pick' must be an integer in [0, 1000]");
        return STEWARD_ERR_PARAM;
    }
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_ERR_NOMEM;
    self->pick = (int32_t)pick;
    *out = self;
    return STEWARD_OK;
}

static void destroy(steward_policy* self) { free(self); }

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)req;
    /* Reads every view with the v1 stride: a host passing a longer struct would break this. */
    if ((uint32_t)self->pick < n_pools && pools[self->pick].available && pools[self->pick].name != NULL)
        out->pool = self->pick;
    return STEWARD_OK;
}

static const steward_routing_table table = {STEWARD_ROUTING_TABLE_VERSION, sizeof table, create, destroy, route, NULL};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "v1_routing",
                                          "ABI 1: the pool named by the param pick", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
