/* eviction/cost_aware: evicts what is cheapest to recompute per byte held and keeps long, hot,
 * shared prefixes. Params: hit_weight (default 1, >= 0), attn_ratio (default 0.01, >= 0),
 * priority_weight (default 4, >= 0).
 *
 * Score of a block (the minimum is evicted; ties to the lowest index, i.e. the least recently used):
 *   recompute(depth) = block_size * (1 + attn_ratio * (depth + 0.5) * block_size)
 *   score            = recompute(depth) * (1 + hit_weight * n_hits) * (1 + priority_weight * reuse_priority)
 *                      / block_bytes
 * recompute() is the prefill work to rebuild the block: a linear part per token (weights, MLP) and
 * an attention part over the prefix before it, which grows with depth (attn_ratio is the attention
 * cost of one key relative to the linear cost of one token). The hit factor is the evidence that
 * the block is reused, and every reuse would pay that recompute again.
 *
 * Trade-off: unlike LRU, a burst of one-off prompts cannot flush a long system prompt or an agent's
 * shared context, and a re-read of a deep block saves more than one of a shallow block. In exchange,
 * recency only breaks ties: hits never decay, so a block that was hot long ago outlives newer ones
 * until colder blocks are gone; and in a hash-chained prefix cache, evicting a shallow cold block
 * strands the deeper blocks of its chain (they then stay unreachable until they are evicted in turn).
 * block_bytes is the same for every candidate of one pool, so it does not change the choice; it
 * keeps the score in "recompute work per byte" for comparing pools. */
#include "plugin_util.h"

struct steward_policy {
    double hit_weight;
    double attn_ratio;
    double priority_weight;
};

static int ca_create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                     size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    steward_policy p = {0};
    if ((rc = sp_param_double(host, params, "hit_weight", 1.0, 0.0, 0, INFINITY, 0, &p.hit_weight, err, err_len)) ||
        (rc = sp_param_double(host, params, "attn_ratio", 0.01, 0.0, 0, INFINITY, 0, &p.attn_ratio, err, err_len)) ||
        (rc = sp_param_double(host, params, "priority_weight", 4.0, 0.0, 0, INFINITY, 0, &p.priority_weight, err, err_len)))
        return rc;
    steward_policy* self = (steward_policy*)malloc(sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    *self = p;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static void ca_destroy(steward_policy* self) { free(self); }

static int ca_choose_victim_v2(steward_policy* self, const steward_evict_context* ctx, const steward_evict_request* req,
                               const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    const int32_t* priority =
        req && STEWARD_HAS_FIELD(req, steward_evict_request, reuse_priority) ? req->reuse_priority : NULL;
    const double block_size = ctx->block_size > 0 ? (double)ctx->block_size : 1.0;
    const double block_bytes = ctx->block_bytes > 0.0 ? ctx->block_bytes : 1.0;
    uint32_t best = 0;
    double best_score = INFINITY;
    for (uint32_t i = 0; i < n; ++i) {
        const double depth = cands[i].depth > 0 ? (double)cands[i].depth : 0.0;
        const double hits = cands[i].n_hits > 0 ? (double)cands[i].n_hits : 0.0;
        const double recompute = block_size * (1.0 + self->attn_ratio * (depth + 0.5) * block_size);
        const double kept = priority && priority[i] > 0 ? 1.0 + self->priority_weight : 1.0;
        const double score = recompute * (1.0 + self->hit_weight * hits) * kept / block_bytes;
        if (score < best_score) {
            best = i;
            best_score = score;
        }
    }
    *victim = best;
    return STEWARD_PLUGIN_OK;
}

static int ca_choose_victim(steward_policy* self, const steward_evict_context* ctx,
                            const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    return ca_choose_victim_v2(self, ctx, NULL, cands, n, victim);
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof(steward_eviction_table),
    .create = ca_create,
    .destroy = ca_destroy,
    .choose_victim = ca_choose_victim,
    .choose_victim_v2 = ca_choose_victim_v2,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_EVICTION, "cost_aware",
                "cheapest to recompute per byte first; keeps deep, hot, shared prefixes and documents", table)
