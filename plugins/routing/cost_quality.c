/* routing/cost_quality: picks m* = argmin over available pools of
 *   lambda_cost*cost/max_cost + lambda_latency*latency/max_latency - lambda_quality*quality + lambda_risk*risk,
 * ties to the cheaper pool, then the lower index; shadows a deterministic fraction of requests on the
 * strongest available pool (most parameters) so the host can measure the chosen pool's quality.
 * session_affinity = true (default false): a request of an agent session whose KV a pool holds (the
 * pool that served its last turn, route_v2's ctx->session_pool) stays on that pool while it is
 * available, whatever the scores say: re-prefilling a long conversation elsewhere costs more than
 * the score difference of one turn. The first turn, and a turn whose pool is gone or draining, is
 * scored as usual. */
#include "plugin_util.h"

struct steward_policy {
    double lambda_cost, lambda_latency, lambda_quality, lambda_risk;
    double shadow_fraction;
    int session_affinity;
};

static int cq_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                     char* err, size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    steward_policy p = {0};
    const double inf = INFINITY;
    if ((rc = sp_param_double(host, params, "lambda_cost", 1.0, 0.0, 0, inf, 0, &p.lambda_cost, err, err_len)) ||
        (rc = sp_param_double(host, params, "lambda_latency", 1.0, 0.0, 0, inf, 0, &p.lambda_latency, err, err_len)) ||
        (rc = sp_param_double(host, params, "lambda_quality", 1.0, 0.0, 0, inf, 0, &p.lambda_quality, err, err_len)) ||
        (rc = sp_param_double(host, params, "lambda_risk", 1.0, 0.0, 0, inf, 0, &p.lambda_risk, err, err_len)) ||
        (rc = sp_param_double(host, params, "shadow_fraction", 0.0, 0.0, 0, 1.0, 0, &p.shadow_fraction, err, err_len)) ||
        (rc = sp_param_bool(host, params, "session_affinity", 0, &p.session_affinity, err, err_len)))
        return rc;
    steward_policy* self = (steward_policy*)malloc(sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    *self = p;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static void cq_destroy(steward_policy* self) { free(self); }

static int cq_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                    uint32_t n_pools, steward_route_decision* out) {
    /* Normalisers: the largest cost and latency among available pools (1 when none is positive, so
     * the term is 0 rather than a division by zero). */
    double max_cost = 0.0, max_latency = 0.0;
    int32_t strongest = -1;
    for (uint32_t i = 0; i < n_pools; ++i) {
        if (!pools[i].available) continue;
        if (pools[i].est_cost > max_cost) max_cost = pools[i].est_cost;
        if (pools[i].est_latency_ms > max_latency) max_latency = pools[i].est_latency_ms;
        if (strongest < 0 || pools[i].n_params > pools[strongest].n_params) strongest = (int32_t)i;
    }
    if (!(max_cost > 0.0) || !isfinite(max_cost)) max_cost = 1.0;
    if (!(max_latency > 0.0) || !isfinite(max_latency)) max_latency = 1.0;

    int32_t best = -1;
    double best_score = 0.0;
    for (uint32_t i = 0; i < n_pools; ++i) {
        const steward_pool_view* p = &pools[i];
        if (!p->available) continue;
        double score = self->lambda_cost * (p->est_cost / max_cost) +
                       self->lambda_latency * (p->est_latency_ms / max_latency) -
                       self->lambda_quality * p->quality + self->lambda_risk * p->risk;
        if (!isfinite(score)) continue; /* a broken estimate: never pick on it */
        if (best < 0 || score < best_score ||
            (score == best_score && p->est_cost < pools[best].est_cost)) {
            best = (int32_t)i;
            best_score = score;
        }
    }
    if (best < 0) return STEWARD_PLUGIN_OK; /* nothing available: keep the host's default */

    out->pool = best;
    out->upgrade_pool = -1;
    out->check_after_tokens = 0;
    out->shadow_pool = -1;
    if (self->shadow_fraction > 0.0 && strongest != best && sp_unit_hash(req->request_id) < self->shadow_fraction)
        out->shadow_pool = strongest;
    return STEWARD_PLUGIN_OK;
}

static int cq_route_v2(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                       const steward_pool_view* pools, uint32_t n_pools, steward_route_decision* out) {
    int rc = cq_route(self, req, pools, n_pools, out);
    if (rc != STEWARD_PLUGIN_OK || !self->session_affinity) return rc;
    const int32_t s = ctx->session_pool;
    if (s < 0 || (uint32_t)s >= n_pools || !pools[s].available) return rc;
    out->pool = s;
    if (out->shadow_pool == s) out->shadow_pool = -1;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof(steward_routing_table),
    .create = cq_create,
    .destroy = cq_destroy,
    .route = cq_route,
    .route_v2 = cq_route_v2,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_ROUTING, "cost_quality",
                "argmin of weighted cost, latency, quality and risk over available pools", table)
