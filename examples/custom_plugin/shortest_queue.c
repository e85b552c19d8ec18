/* shortest_queue: a routing policy plugin for Steward.
 *
 * Sends each request to the available pool with the fewest requests in flight (n_waiting +
 * n_running); ties go to the pool where the request is cheaper (est_cost), then to the lower index.
 *
 * Parameters (the keys of the bucket's [bucket.routing] table):
 *   small_pool               string, optional  the name of a pool reserved for short prompts
 *   max_prompt_tokens_small  int >= 0          prompts longer than this never go to small_pool
 *                                              (required when small_pool is set)
 *
 * The instance is immutable after create(), so route() needs no locking.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <steward/policy.h>

#define POOL_NAME_MAX 128

struct steward_policy {
    char small_pool[POOL_NAME_MAX]; /* "" when no pool is reserved */
    int64_t max_prompt_tokens_small;
};

static int sq_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                     char* err, size_t err_len) {
    if (host == NULL || host->version < 1 || host->size < sizeof(steward_host_api)) {
        snprintf(err, err_len, "shortest_queue: the host API is older than this plugin expects");
        return STEWARD_PLUGIN_ERR;
    }
    steward_policy* self = calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;

    const char* small = NULL;
    int rc = host->param_string(params, "small_pool", &small);
    if (rc == STEWARD_PLUGIN_ERR_PARAM) {
        snprintf(err, err_len, "shortest_queue: small_pool must be a string (a pool name), e.g. small_pool = \"small\"");
        goto fail;
    }
    if (rc == STEWARD_PLUGIN_OK) {
        if (small[0] == '\0' || strlen(small) >= POOL_NAME_MAX) {
            snprintf(err, err_len, "shortest_queue: small_pool must be a pool name of 1 to %d characters",
                     POOL_NAME_MAX - 1);
            rc = STEWARD_PLUGIN_ERR_PARAM;
            goto fail;
        }
        strcpy(self->small_pool, small); /* the string is only valid during create() */
    }

    rc = host->param_int(params, "max_prompt_tokens_small", &self->max_prompt_tokens_small);
    if (rc == STEWARD_PLUGIN_ERR_PARAM || (rc == STEWARD_PLUGIN_OK && self->max_prompt_tokens_small < 0)) {
        snprintf(err, err_len, "shortest_queue: max_prompt_tokens_small must be an integer >= 0 (prompt tokens)");
        rc = STEWARD_PLUGIN_ERR_PARAM;
        goto fail;
    }
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND && self->small_pool[0] != '\0') {
        snprintf(err, err_len,
                 "shortest_queue: small_pool = \"%s\" needs max_prompt_tokens_small (the longest prompt, in "
                 "tokens, that may go to it)",
                 self->small_pool);
        rc = STEWARD_PLUGIN_ERR_PARAM;
        goto fail;
    }
    if (rc == STEWARD_PLUGIN_OK && self->small_pool[0] == '\0') {
        snprintf(err, err_len, "shortest_queue: max_prompt_tokens_small is set but small_pool is not: name the pool");
        rc = STEWARD_PLUGIN_ERR_PARAM;
        goto fail;
    }

    if (host->log != NULL) {
        char msg[256];
        if (self->small_pool[0] != '\0')
            snprintf(msg, sizeof msg, "shortest_queue: prompts over %lld tokens never go to pool '%s'",
                     (long long)self->max_prompt_tokens_small, self->small_pool);
        else
            snprintf(msg, sizeof msg, "shortest_queue: no pool reserved for short prompts");
        host->log(params, 1, msg);
    }
    *out = self;
    return STEWARD_PLUGIN_OK;

fail:
    free(self);
    return rc;
}

static void sq_destroy(steward_policy* self) { free(self); }

static int sq_route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                    uint32_t n_pools, steward_route_decision* out) {
    int32_t best = -1;
    int64_t best_load = 0;
    for (uint32_t i = 0; i < n_pools; i++) {
        const steward_pool_view* p = &pools[i];
        if (!p->available) continue;
        if (self->small_pool[0] != '\0' && req->n_prompt_tokens > self->max_prompt_tokens_small &&
            strcmp(p->name, self->small_pool) == 0)
            continue;
        const int64_t load = (int64_t)p->n_waiting + p->n_running;
        if (best < 0 || load < best_load || (load == best_load && p->est_cost < pools[best].est_cost)) {
            best = (int32_t)i;
            best_load = load;
        }
    }
    /* No eligible pool: keep the host's pre-filled default (the bucket's configured pool). */
    if (best >= 0) out->pool = best;
    return STEWARD_PLUGIN_OK;
}

static const steward_routing_table sq_table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof(steward_routing_table),
    .create = sq_create,
    .destroy = sq_destroy,
    .route = sq_route,
    .check_upgrade = NULL, /* never upgrade */
    /* ABI 2's route_v2 / on_outcome are left out: fields not named here stay NULL (absent). */
};

static const steward_plugin sq_plugin = {
    .abi_version = STEWARD_POLICY_ABI_VERSION,
    .kind = STEWARD_POLICY_ROUTING,
    .name = "shortest_queue",
    .description = "the available pool with the fewest requests in flight; ties to the cheaper one",
    .table = &sq_table,
};

/* A newer runtime still loads this plugin: it asks with its own ABI version, then older ones. */
STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    return host_abi_version >= STEWARD_POLICY_ABI_VERSION ? &sq_plugin : NULL;
}
