/* fake_plugin.c: the plugin fuzz_plugin_decision loads. Every answer it gives (decisions, error
 * codes) comes from the fuzz input, through steward_fuzz_answer() which the fuzz binary exports
 * (found with dlsym at create() time). Compiled once per kind (FAKE_KIND 1 routing, 2 eviction,
 * 3 speculation) and table version (FAKE_V1: a version 1 table, so the host takes the ABI 1 paths). */
#define _GNU_SOURCE
#include <steward/policy.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t (*answer_fn)(void);
static answer_fn g_answer;

struct steward_policy {
    int unused;
};

static int32_t answer(void) { return g_answer ? g_answer() : 0; }

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)host, (void)params;
    g_answer = (answer_fn)dlsym(RTLD_DEFAULT, "steward_fuzz_answer");
    if (!g_answer) {
        strncpy(err, "steward_fuzz_answer not found: load this plugin from fuzz_plugin_decision", err_len - 1);
        return STEWARD_PLUGIN_ERR;
    }
    *out = (steward_policy*)calloc(1, sizeof(steward_policy));
    return *out ? STEWARD_PLUGIN_OK : STEWARD_PLUGIN_ERR_NOMEM;
}

static void destroy(steward_policy* self) { free(self); }

/* A return code: mostly OK, sometimes an error code or garbage. */
static int rc(void) {
    int32_t r = answer();
    return (r & 7) == 0 ? r : STEWARD_PLUGIN_OK;
}

#if FAKE_KIND == 1
static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)self, (void)req, (void)pools, (void)n_pools;
    int32_t what = answer();
    if (what & 1) out->pool = answer();
    if (what & 2) out->upgrade_pool = answer();
    if (what & 4) out->check_after_tokens = answer();
    if (what & 8) out->shadow_pool = answer();
    return rc();
}
static int route_v2(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                    const steward_pool_view* pools, uint32_t n_pools, steward_route_decision* out) {
    /* Read what the host promises is there: every ctx->pools[i] for i < n_pools. */
    volatile int32_t sum = 0;
    for (uint32_t i = 0; i < n_pools; i++) sum += ctx->pools[i].n_cached_prompt_tokens + pools[i].available;
    (void)sum, (void)req->bucket[0], (void)req->tenant[0], (void)ctx->session[0];
    return route(self, req, pools, n_pools, out);
}
static int check_upgrade(steward_policy* self, const steward_route_request* req, const steward_token_view* tokens,
                         int32_t* upgrade) {
    (void)self, (void)req;
    volatile int32_t sum = 0;
    for (uint32_t i = 0; i < tokens->n; i++) sum += tokens->tokens[i];
    (void)sum;
    *upgrade = answer();
    return rc();
}
static int on_outcome(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                      const steward_route_outcome* outcome) {
    (void)self, (void)req, (void)ctx, (void)outcome;
    return rc();
}
static const steward_routing_table table = {
#ifdef FAKE_V1
    .version = 1,
    .size = STEWARD_ROUTING_TABLE_SIZE_V1,
#else
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof table,
#endif
    .create = create,
    .destroy = destroy,
    .route = route,
    .check_upgrade = check_upgrade,
    .route_v2 = route_v2,
    .on_outcome = on_outcome,
};
#elif FAKE_KIND == 2
static int choose_victim(steward_policy* self, const steward_evict_context* ctx, const steward_evict_candidate* cands,
                         uint32_t n, uint32_t* victim) {
    (void)self;
    volatile int64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += cands[i].last_access_tick;
    for (uint32_t i = 0; i < ctx->n_tenants; i++) sum += ctx->tenants[i].n_blocks_held;
    (void)sum;
    *victim = (uint32_t)answer();
    return rc();
}
static int choose_victim_v2(steward_policy* self, const steward_evict_context* ctx, const steward_evict_request* req,
                            const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    volatile size_t len = strlen(req->bucket) + strlen(req->tenant);
    for (uint32_t i = 0; i < ctx->n_tenants; i++) len += strlen(req->tenant_names[i]);
    (void)len;
    return choose_victim(self, ctx, cands, n, victim);
}
static const steward_eviction_table table = {
#ifdef FAKE_V1
    .version = 1,
    .size = STEWARD_EVICTION_TABLE_SIZE_V1,
#else
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof table,
#endif
    .create = create,
    .destroy = destroy,
    .choose_victim = choose_victim,
    .choose_victim_v2 = choose_victim_v2,
};
#else
static int draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)self;
    volatile int64_t sum = 0;
    for (uint32_t i = 0; i < stats->n_hist; i++) sum += stats->accepted_hist[i];
    (void)sum;
    *budget = answer();
    return rc();
}
static int draft_budget_seq(steward_policy* self, const steward_spec_seq* seq, int32_t* budget) {
    (void)self;
    volatile size_t len = strlen(seq->bucket) + strlen(seq->tenant);
    (void)len;
    *budget = answer();
    return rc();
}
static const steward_speculation_table table = {
#ifdef FAKE_V1
    .version = 1,
    .size = STEWARD_SPECULATION_TABLE_SIZE_V1,
#else
    .version = STEWARD_SPECULATION_TABLE_VERSION,
    .size = sizeof table,
#endif
    .create = create,
    .destroy = destroy,
    .draft_budget = draft_budget,
    .draft_budget_seq = draft_budget_seq,
};
#endif

static const steward_plugin info = {
#ifdef FAKE_V1
    1,
#else
    STEWARD_POLICY_ABI_VERSION,
#endif
    FAKE_KIND, "fuzz_fake", "answers from the fuzz input", &table};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    return host_abi_version >= info.abi_version ? &info : NULL;
}
