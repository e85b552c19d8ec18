/* routing/round_robin: each request goes to the next available candidate pool after the one the
 * previous request went to (in pool order, wrapping), whatever the loads and caches say: the
 * baseline kv_aware is measured against. A pool that is unavailable is skipped, not queued for. */
#include "plugin_util.h"

struct steward_policy {
    int32_t* candidates; /* [n_candidates] pool indices, ascending; NULL: every pool */
    uint32_t n_candidates;
    int32_t last; /* the pool of the previous decision; -1: none yet */
};

static void rr_destroy(steward_policy* self) {
    if (self == NULL) return;
    free(self->candidates);
    free(self);
}

static int rr_create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                     size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    self->last = -1;
    if ((rc = sp_param_pool_list(host, params, "pools", &self->candidates, &self->n_candidates, err, err_len))) {
        rr_destroy(self);
        return rc;
    }
    *out = self;
    return STEWARD_PLUGIN_OK;
}

/* The host serialises calls per instance, so `last` needs no lock. Following the previous pool
 * (rather than counting calls) keeps the rotation even when a pool drops out or comes back. */
static int rr_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                    uint32_t n_pools, steward_route_decision* out) {
    (void)req;
    const uint32_t n = self->candidates != NULL ? self->n_candidates : n_pools;
    int32_t first = -1, next = -1;
    for (uint32_t c = 0; c < n && next < 0; ++c) {
        const int32_t i = self->candidates != NULL ? self->candidates[c] : (int32_t)c;
        if (i < 0 || (uint32_t)i >= n_pools || !pools[i].available) continue;
        if (first < 0) first = i;
        if (i > self->last) next = i;
    }
    if (next < 0) next = first;
    if (next < 0) return STEWARD_PLUGIN_OK; /* no candidate available: keep the host's default */
    self->last = next;
    out->pool = next;
    out->upgrade_pool = -1;
    out->check_after_tokens = 0;
    out->shadow_pool = -1;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof(steward_routing_table),
    .create = rr_create,
    .destroy = rr_destroy,
    .route = rr_route,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_ROUTING, "round_robin", "the next available candidate pool, in turn", table)
