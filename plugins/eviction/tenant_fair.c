/* eviction/tenant_fair: a KV quota per tenant. When a tenant holds more than its quota, its least
 * recently used block goes first (the tenant furthest over quota, by held/quota); otherwise plain
 * LRU. A tenant's public (shared-prefix) blocks go only after its private ones, and within each, its
 * blocks with reuse priority (referenced documents, docs/reuse.md) after the others.
 * Param default_share (in (0, 1], default 1/number of tenants): the quota, as a share of the pool,
 * of a tenant with no configured quota_blocks. */
#include "plugin_util.h"

struct steward_policy {
    double default_share; /* <= 0: 1 / max(1, n_tenants) at each call */
};

static int tf_create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                     size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    double share = 0.0; /* absent: 0, meaning 1 / max(1, n_tenants) at each call */
    if ((rc = sp_param_double(host, params, "default_share", 0.0, 0.0, 1, 1.0, 0, &share, err, err_len)))
        return rc;
    steward_policy* self = (steward_policy*)malloc(sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    self->default_share = share;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static void tf_destroy(steward_policy* self) { free(self); }

/* held / quota of a tenant (0 for a tenant the context does not list; +inf over a zero quota). */
static double over_ratio(const steward_policy* self, const steward_evict_context* ctx, int32_t tenant) {
    for (uint32_t t = 0; t < ctx->n_tenants; ++t) {
        const steward_evict_tenant* te = &ctx->tenants[t];
        if (te->tenant != tenant) continue;
        double quota;
        if (te->quota_blocks >= 0) {
            quota = (double)te->quota_blocks;
        } else {
            const double share =
                self->default_share > 0.0 ? self->default_share : 1.0 / (ctx->n_tenants > 0 ? ctx->n_tenants : 1);
            quota = (double)(int64_t)(share * (double)ctx->n_blocks_total); /* floor: both are >= 0 */
        }
        if (te->n_blocks_held <= 0) return 0.0;
        return quota > 0.0 ? (double)te->n_blocks_held / quota : INFINITY;
    }
    return 0.0;
}

/* A candidate's rank within its tenant: private before public, without reuse priority before with. */
static int rank_of(const steward_evict_candidate* c, const int32_t* priority, uint32_t i) {
    return (c->is_public ? 2 : 0) + (priority && priority[i] > 0 ? 1 : 0);
}

/* The tenant's least recently used candidate of the lowest rank. */
static uint32_t tenant_lru(const steward_evict_candidate* cands, const int32_t* priority, uint32_t n, int32_t tenant) {
    uint32_t best = n;
    for (uint32_t i = 0; i < n; ++i) {
        if (cands[i].tenant != tenant) continue;
        if (best == n || rank_of(&cands[i], priority, i) < rank_of(&cands[best], priority, best)) best = i;
    }
    return best;
}

static int tf_choose_victim_v2(steward_policy* self, const steward_evict_context* ctx, const steward_evict_request* req,
                               const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    const int32_t* priority =
        req && STEWARD_HAS_FIELD(req, steward_evict_request, reuse_priority) ? req->reuse_priority : NULL;
    /* The tenant with candidates furthest over quota; among equals, the one whose block comes first
     * (least recently used). One pass; the tenant lookup is linear in the (few) tenants. Nobody over
     * quota: LRU, i.e. the tenant of the first candidate without reuse priority (else cands[0]'s). */
    uint32_t first = 0;
    while (priority && first < n && priority[first] > 0) ++first;
    if (first == n) first = 0;
    int32_t worst = cands[first].tenant;
    double worst_ratio = over_ratio(self, ctx, worst);
    if (worst_ratio < 1.0) worst_ratio = 1.0; /* "over" means a ratio above 1 */
    for (uint32_t i = 0; i < n; ++i) {
        if (cands[i].tenant == worst) continue;
        const double r = over_ratio(self, ctx, cands[i].tenant);
        if (r > worst_ratio) {
            worst = cands[i].tenant;
            worst_ratio = r;
        }
    }
    *victim = tenant_lru(cands, priority, n, worst);
    return STEWARD_PLUGIN_OK;
}

static int tf_choose_victim(steward_policy* self, const steward_evict_context* ctx,
                            const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    return tf_choose_victim_v2(self, ctx, NULL, cands, n, victim);
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof(steward_eviction_table),
    .create = tf_create,
    .destroy = tf_destroy,
    .choose_victim = tf_choose_victim,
    .choose_victim_v2 = tf_choose_victim_v2,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_EVICTION, "tenant_fair",
                "the LRU block of the tenant furthest over its KV quota, else LRU", table)
