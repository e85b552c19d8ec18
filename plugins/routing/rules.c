/* routing/rules: the static policy. Every request runs on its bucket's configured pool, which the
 * host has already written into the decision: route() leaves it as it is. No parameters. */
#include "plugin_util.h"

SP_DEFINE_STATELESS(rules)

static int rules_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                       uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools, (void)out;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof(steward_routing_table),
    .create = rules_create,
    .destroy = rules_destroy,
    .route = rules_route,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_ROUTING, "rules", "the bucket's configured pool, always", table)
