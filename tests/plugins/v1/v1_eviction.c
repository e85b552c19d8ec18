/* v1_eviction.so: an eviction plugin built against the FROZEN ABI 1 header (see v1_routing.c). It
 * evicts the most recently used candidate (the last one), so its choices differ from the host's LRU
 * default and a test can tell that it was asked. */
#include <steward/policy.h>

#include <stdlib.h>

struct steward_policy {
    int unused;
};

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)host, (void)params, (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_ERR_NOMEM;
    *out = self;
    return STEWARD_OK;
}

static void destroy(steward_policy* self) { free(self); }

static int choose_victim(steward_policy* self, const steward_evict_context* ctx, const steward_evict_candidate* cands,
                         uint32_t n, uint32_t* victim) {
    (void)self, (void)ctx, (void)cands;
    *victim = n - 1;
    return STEWARD_OK;
}

static const steward_eviction_table table = {STEWARD_EVICTION_TABLE_VERSION, sizeof table, create, destroy,
                                             choose_victim};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_EVICTION, "v1_eviction",
                                          "ABI 1: evicts the most recently used candidate", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
