/* eviction/lru: reclaims the least recently used block, i.e. the first candidate (the host orders
 * them least recently used first). No parameters. */
#include "plugin_util.h"

struct steward_policy {
    int unused;
};

static int lru_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                      char* err, size_t err_len) {
    (void)params;
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_OK) return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_ERR_NOMEM;
    *out = self;
    return STEWARD_OK;
}

static void lru_destroy(steward_policy* self) { free(self); }

static int lru_choose_victim(steward_policy* self, const steward_evict_context* ctx,
                             const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx, (void)cands, (void)n;
    *victim = 0;
    return STEWARD_OK;
}

static const steward_eviction_table table = {
    STEWARD_EVICTION_TABLE_VERSION, sizeof(steward_eviction_table), lru_create, lru_destroy, lru_choose_victim,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_EVICTION, "lru", "least recently used block first", table)
