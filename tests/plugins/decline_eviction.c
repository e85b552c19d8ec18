/* decline_eviction.so: an ABI 2 eviction plugin that declines every candidate
 * (STEWARD_EVICT_NO_VICTIM), as a policy protecting every tenant's cache would. It answers an error
 * instead when the host did not tell it the requesting bucket and tenant names, so a test sees the
 * names arrive (an error is counted as invalid, a decline is not).
 * Also the translation unit that includes the plugin header and the C API header together (their
 * status enums have distinct names); built with -Wall -Wextra -Werror. */
#include <steward/policy.h>
#include <steward/steward.h>

#include "test_plugin.h"

/* Both headers' status names, side by side, with the numbers ABI 1 binaries use. */
_Static_assert(STEWARD_PLUGIN_OK == 0 && STEWARD_PLUGIN_ERR == 1 && STEWARD_PLUGIN_ERR_PARAM == 2 &&
                   STEWARD_PLUGIN_ERR_NOMEM == 3 && STEWARD_PLUGIN_ERR_NOT_FOUND == 4,
               "plugin status numbers are part of the ABI");
_Static_assert(STEWARD_OK == 0, "the C API's success code");

static int choose_victim_v2(steward_policy* self, const steward_evict_context* ctx, const steward_evict_request* req,
                            const steward_evict_candidate* cands, uint32_t n, uint32_t* victim) {
    (void)self, (void)cands, (void)n;
    if (!STEWARD_HAS_FIELD(req, steward_evict_request, tenant_names) || req->bucket == NULL || req->bucket[0] == 0 ||
        req->tenant == NULL || req->tenant[0] == 0)
        return STEWARD_PLUGIN_ERR;
    for (uint32_t i = 0; i < ctx->n_tenants; i++)
        if (req->tenant_names[i] == NULL) return STEWARD_PLUGIN_ERR;
    *victim = STEWARD_EVICT_NO_VICTIM;
    return STEWARD_PLUGIN_OK;
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION,
    .size = sizeof table,
    .create = tp_create,
    .destroy = tp_destroy,
    .choose_victim_v2 = choose_victim_v2,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_EVICTION, "decline_eviction",
                                          "declines every candidate", &table};
    return host_abi_version >= STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
