/* routing/rules: the static policy. Every request runs on its bucket's configured pool, which the
 * host has already written into the decision: route() leaves it as it is. No parameters. */
#include "plugin_util.h"

struct steward_policy {
    int unused;
};

static int rules_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                        char* err, size_t err_len) {
    (void)params;
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_OK) return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_ERR_NOMEM;
    *out = self;
    return STEWARD_OK;
}

static void rules_destroy(steward_policy* self) { free(self); }

static int rules_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                       uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools, (void)out;
    return STEWARD_OK;
}

static const steward_routing_table table = {
    STEWARD_ROUTING_TABLE_VERSION, sizeof(steward_routing_table), rules_create, rules_destroy, rules_route, NULL,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_ROUTING, "rules", "the bucket's configured pool, always", table)
