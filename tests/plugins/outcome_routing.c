/* outcome_routing.so: an ABI 2 routing plugin that learns from on_outcome: it routes each request to
 * pool (number of outcomes seen) % n_pools, so requests sent one after another alternate between
 * pools only if every finished request was reported. An outcome whose figures are not those of a
 * served request (no pool, no tokens, negative TTFT, no cost), or a route_v2 context without its
 * per-pool array, makes route_v2 answer an error (counted as invalid by the host). */
#include "test_plugin.h"

static int route_v2(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                    const steward_pool_view* pools, uint32_t n_pools, steward_route_decision* out) {
    (void)req, (void)pools;
    if (self->mode != 0 || !STEWARD_HAS_FIELD(ctx, steward_route_context, pools) || ctx->pools == NULL || n_pools == 0)
        return STEWARD_PLUGIN_ERR;
    out->pool = (int32_t)(self->value % (int64_t)n_pools);
    return STEWARD_PLUGIN_OK;
}

static int on_outcome(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                      const steward_route_outcome* o) {
    (void)req, (void)ctx;
    const int served = o->finish_reason == STEWARD_FINISH_STOP || o->finish_reason == STEWARD_FINISH_LENGTH;
    if (!STEWARD_HAS_FIELD(o, steward_route_outcome, cost) || o->pool < 0 || !served || o->n_output_tokens <= 0 ||
        o->ttft_ms < 0 || !(o->e2e_ms > 0) || !(o->cost > 0))
        self->mode = 1; /* a broken report: fail every later route */
    self->value++;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof table,
    .create = tp_create,
    .destroy = tp_destroy,
    .route_v2 = route_v2,
    .on_outcome = on_outcome,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "outcome_routing",
                                          "alternates pools as outcomes arrive", &table};
    return host_abi_version >= STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
