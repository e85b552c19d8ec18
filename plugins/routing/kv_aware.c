/* routing/kv_aware: for pools spread over worker processes (one pool = one worker's copy of a model),
 * picks the candidate pool with the lowest
 *   cost = prefill_weight * prefill_blocks + decode_blocks
 * where prefill_blocks are the KV blocks this prompt still has to compute there (the prompt tokens the
 * pool does not hold yet) and decode_blocks the KV blocks already busy there (Dynamo's KV router).
 * Cache affinity is only worth so much: when the candidates' loads are imbalanced (max - min >
 * balance_abs and max > balance_rel * min) the request goes to the least loaded one instead
 * (SGLang's cache-aware router). An agent session stays on the pool holding its KV unless that pool
 * is itself overloaded (load > balance_rel * min + balance_abs). Ties go to the lower pool index. */
#include "plugin_util.h"

/* Tokens per KV block when the host does not say. */
#define KV_DEFAULT_BLOCK_SIZE 16

struct steward_policy {
    int32_t* candidates; /* [n_candidates] pool indices, ascending; NULL: every pool */
    uint32_t n_candidates;
    double prefill_weight, balance_abs, balance_rel;
    int session_sticky;
};

static void kv_destroy(steward_policy* self) {
    if (self == NULL) return;
    free(self->candidates);
    free(self);
}

static int kv_create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                     size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    const double inf = INFINITY;
    if ((rc = sp_param_pool_list(host, params, "pools", &self->candidates, &self->n_candidates, err, err_len)) ||
        (rc = sp_param_double(host, params, "prefill_weight", 1.0, 0.0, 0, inf, 0, &self->prefill_weight, err,
                              err_len)) ||
        (rc = sp_param_double(host, params, "balance_abs", 4.0, 0.0, 0, inf, 0, &self->balance_abs, err, err_len)) ||
        (rc = sp_param_double(host, params, "balance_rel", 1.5, 1.0, 0, inf, 0, &self->balance_rel, err, err_len)) ||
        (rc = sp_param_bool(host, params, "session_sticky", 1, &self->session_sticky, err, err_len))) {
        kv_destroy(self);
        return rc;
    }
    *out = self;
    return STEWARD_PLUGIN_OK;
}

/* The i-th pool to consider (i < kv_n_considered): a candidate, or every pool when none is named. */
static uint32_t kv_n_considered(const steward_policy* self, uint32_t n_pools) {
    return self->candidates != NULL ? self->n_candidates : n_pools;
}
static int32_t kv_considered(const steward_policy* self, uint32_t i) {
    return self->candidates != NULL ? self->candidates[i] : (int32_t)i;
}

static int32_t kv_ceil_div(int32_t a, int32_t b) {
    return a <= 0 ? 0 : (int32_t)(((int64_t)a + b - 1) / b);
}

static void kv_decide(steward_route_decision* out, int32_t pool) {
    out->pool = pool;
    out->upgrade_pool = -1;
    out->check_after_tokens = 0;
    out->shadow_pool = -1;
}

static double kv_view_load(const steward_pool_view* p) {
    return (double)(p->n_waiting > 0 ? p->n_waiting : 0) + (double)(p->n_running > 0 ? p->n_running : 0);
}

/* ABI 1 gives no cache or worker figures: the least loaded candidate. */
static int kv_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                    uint32_t n_pools, steward_route_decision* out) {
    (void)req;
    int32_t best = -1;
    double best_load = 0.0;
    for (uint32_t c = 0; c < kv_n_considered(self, n_pools); ++c) {
        const int32_t i = kv_considered(self, c);
        if (i < 0 || (uint32_t)i >= n_pools || !pools[i].available) continue;
        const double load = kv_view_load(&pools[i]);
        if (best < 0 || load < best_load) best = i, best_load = load;
    }
    if (best >= 0) kv_decide(out, best);
    return STEWARD_PLUGIN_OK;
}

static int kv_route_v2(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                       const steward_pool_view* pools, uint32_t n_pools, steward_route_decision* out) {
    if (ctx == NULL) return kv_route(self, req, pools, n_pools, out);
    const steward_pool_load* loads = STEWARD_HAS_FIELD(ctx, steward_route_context, loads) ? ctx->loads : NULL;
    const int32_t n_prompt = req->n_prompt_tokens > 0 ? req->n_prompt_tokens : 0;
    const int32_t n_max = req->max_tokens > 0 ? req->max_tokens : 0;
    const int32_t n_total = n_prompt > INT32_MAX - n_max ? INT32_MAX : n_prompt + n_max;

    int32_t best = -1, least = -1;
    double best_cost = 0.0, min_load = 0.0, max_load = 0.0, session_load = -1.0;
    for (uint32_t c = 0; c < kv_n_considered(self, n_pools); ++c) {
        const int32_t i = kv_considered(self, c);
        if (i < 0 || (uint32_t)i >= n_pools || !pools[i].available) continue;
        const steward_pool_load* l = loads != NULL ? &loads[i] : NULL;
        const int32_t block_size = l != NULL && l->block_size > 0 ? l->block_size : KV_DEFAULT_BLOCK_SIZE;
        const int32_t cached =
            ctx->pools != NULL && ctx->pools[i].n_cached_prompt_tokens > 0 ? ctx->pools[i].n_cached_prompt_tokens : 0;
        const int32_t prefill_blocks = kv_ceil_div(n_prompt - (cached < n_prompt ? cached : n_prompt), block_size);
        const double load = l != NULL && l->n_inflight >= 0 ? (double)l->n_inflight : kv_view_load(&pools[i]);
        const double decode_blocks = l != NULL && l->n_kv_blocks_used >= 0
                                         ? (double)l->n_kv_blocks_used
                                         : load * (double)kv_ceil_div(n_total, block_size);
        const double cost = self->prefill_weight * (double)prefill_blocks + decode_blocks;
        if (best < 0 || cost < best_cost) best = i, best_cost = cost;
        if (least < 0 || load < min_load) least = i, min_load = load;
        if (load > max_load) max_load = load;
        if (i == ctx->session_pool) session_load = load;
    }
    if (best < 0) return STEWARD_PLUGIN_OK; /* no candidate available: keep the host's default */

    /* The session's KV saves a whole conversation's prefill, so it outweighs a few requests of queue;
     * past balance_rel * min + balance_abs the wait there costs more than the prefill elsewhere. */
    if (self->session_sticky && session_load >= 0.0 &&
        !(session_load > self->balance_rel * min_load + self->balance_abs)) {
        kv_decide(out, ctx->session_pool);
        return STEWARD_PLUGIN_OK;
    }
    const int imbalanced = max_load - min_load > self->balance_abs && max_load > self->balance_rel * min_load;
    kv_decide(out, imbalanced ? least : best);
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof(steward_routing_table),
    .create = kv_create,
    .destroy = kv_destroy,
    .route = kv_route,
    .route_v2 = kv_route_v2,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_ROUTING, "kv_aware",
                "lowest prefill + busy KV blocks over worker pools; least loaded when loads are imbalanced", table)
