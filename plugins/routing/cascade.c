/* routing/cascade: start on a cheap pool; after k output tokens, re-run on a strong pool when the
 * tokens' log-probabilities (mean or min) fall below a threshold. Pool names are resolved against
 * the pools of each call, since the host API has no pool lookup at create time. */
#include "plugin_util.h"

struct steward_policy {
    char* start_pool;   /* NULL: the available pool with the lowest price_output */
    char* upgrade_pool; /* NULL: the available pool with the most parameters */
    int32_t k;
    double threshold;
    int use_min; /* metric: 0 mean, 1 min */
    double shadow_fraction;
};

static void cascade_destroy(steward_policy* self) {
    if (self == NULL) return;
    free(self->start_pool);
    free(self->upgrade_pool);
    free(self);
}

static int cascade_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                          char* err, size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    int64_t k = 8;
    char* metric = NULL;
    if ((rc = sp_param_string_dup(host, params, "start_pool", &self->start_pool, err, err_len)) ||
        (rc = sp_param_string_dup(host, params, "upgrade_pool", &self->upgrade_pool, err, err_len)) ||
        (rc = sp_param_int(host, params, "k", 8, 1, INT32_MAX, &k, err, err_len)) ||
        (rc = sp_param_double(host, params, "threshold", -2.0, -INFINITY, 0, INFINITY, 0, &self->threshold, err,
                              err_len)) ||
        (rc = sp_param_double(host, params, "shadow_fraction", 0.0, 0.0, 0, 1.0, 0, &self->shadow_fraction, err,
                              err_len)) ||
        (rc = sp_param_string_dup(host, params, "metric", &metric, err, err_len))) {
        cascade_destroy(self);
        return rc;
    }
    self->k = (int32_t)k;
    /* Misnamed pools are refused at load time when the host can look names up. */
    const char* names[2] = {self->start_pool, self->upgrade_pool};
    const char* keys[2] = {"start_pool", "upgrade_pool"};
    for (int i = 0; i < 2 && rc == STEWARD_PLUGIN_OK; i++) {
        int32_t idx = -1;
        if (names[i] != NULL && host->size >= offsetof(steward_host_api, pool_index) + sizeof host->pool_index &&
            host->pool_index != NULL && host->pool_index(params, names[i], &idx) != STEWARD_PLUGIN_OK)
            rc = sp_fail(err, err_len, "parameter '%s' names pool \"%s\", which the config does not define", keys[i],
                         names[i]);
    }
    if (rc != STEWARD_PLUGIN_OK) {
        free(metric);
        cascade_destroy(self);
        return rc;
    }
    if (metric != NULL) {
        if (strcmp(metric, "mean") == 0) self->use_min = 0;
        else if (strcmp(metric, "min") == 0) self->use_min = 1;
        else rc = sp_fail(err, err_len, "parameter 'metric' must be \"mean\" or \"min\" (got \"%s\")", metric);
        free(metric);
        if (rc != STEWARD_PLUGIN_OK) {
            cascade_destroy(self);
            return rc;
        }
    }
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static int32_t find_pool(const steward_pool_view* pools, uint32_t n_pools, const char* name) {
    for (uint32_t i = 0; i < n_pools; ++i)
        if (pools[i].name != NULL && strcmp(pools[i].name, name) == 0) return (int32_t)i;
    return -1;
}

static int cascade_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                         uint32_t n_pools, steward_route_decision* out) {
    int32_t start = -1, strong = -1;
    if (self->start_pool != NULL && (start = find_pool(pools, n_pools, self->start_pool)) < 0)
        return STEWARD_PLUGIN_ERR_PARAM; /* start_pool names no pool */
    if (self->upgrade_pool != NULL && (strong = find_pool(pools, n_pools, self->upgrade_pool)) < 0)
        return STEWARD_PLUGIN_ERR_PARAM; /* upgrade_pool names no pool */
    for (uint32_t i = 0; i < n_pools; ++i) {
        if (!pools[i].available) continue;
        if (self->start_pool == NULL && (start < 0 || pools[i].price_output < pools[start].price_output))
            start = (int32_t)i;
        if (self->upgrade_pool == NULL && (strong < 0 || pools[i].n_params > pools[strong].n_params))
            strong = (int32_t)i;
    }
    const int start_ok = start >= 0 && pools[start].available;
    const int strong_ok = strong >= 0 && pools[strong].available;
    if (!start_ok && !strong_ok) return STEWARD_PLUGIN_ERR; /* nothing to run on: the host's default */

    out->upgrade_pool = -1;
    out->check_after_tokens = 0;
    out->shadow_pool = -1;
    if (!start_ok || !strong_ok || start == strong) { /* no cascade possible: run where we can */
        out->pool = start_ok ? start : strong;
        return STEWARD_PLUGIN_OK;
    }
    out->pool = start;
    out->upgrade_pool = strong;
    out->check_after_tokens = self->k;
    if (self->shadow_fraction > 0.0 && sp_unit_hash(req->request_id) < self->shadow_fraction)
        out->shadow_pool = strong;
    return STEWARD_PLUGIN_OK;
}

static int cascade_check_upgrade(steward_policy* self, const steward_route_request* req,
                                 const steward_token_view* tokens, int32_t* upgrade) {
    (void)req;
    *upgrade = 0;
    if (tokens->n == 0) return STEWARD_PLUGIN_OK;
    if (tokens->logprobs == NULL) return STEWARD_PLUGIN_ERR;
    double sum = 0.0, min = tokens->logprobs[0];
    for (uint32_t i = 0; i < tokens->n; ++i) {
        sum += tokens->logprobs[i];
        if (tokens->logprobs[i] < min) min = tokens->logprobs[i];
    }
    const double metric = self->use_min ? min : sum / (double)tokens->n;
    *upgrade = metric < self->threshold ? 1 : 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof(steward_routing_table),
    .create = cascade_create,
    .destroy = cascade_destroy,
    .route = cascade_route,
    .check_upgrade = cascade_check_upgrade,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_ROUTING, "cascade",
                "cheap pool first; upgrade to a strong pool when the first tokens look unsure", table)
