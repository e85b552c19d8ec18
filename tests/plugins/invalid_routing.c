/* invalid_routing.so: a routing plugin whose decisions are invalid; check_upgrade always fails.
 * Param mode (string, default "pool"):
 *   "pool"         route sets pool = 999
 *   "upgrade_pool" pool stays the host's default; upgrade_pool = 999, check_after_tokens = 1
 *   "shadow_pool"  pool stays the host's default; shadow_pool = 999
 *   "check"        a valid cascade (pool = the default, upgrade_pool = the other of pools 0 and 1,
 *                  check_after_tokens = 1) whose check_upgrade then returns STEWARD_PLUGIN_ERR */
#include "test_plugin.h"

#include <string.h>

enum { MODE_POOL, MODE_UPGRADE_POOL, MODE_SHADOW_POOL, MODE_CHECK };

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    const char* mode = "pool";
    int rc = host->param_string(params, "mode", &mode);
    if (rc != STEWARD_PLUGIN_OK && rc != STEWARD_PLUGIN_ERR_NOT_FOUND) return STEWARD_PLUGIN_ERR_PARAM;
    int m;
    if (strcmp(mode, "pool") == 0) m = MODE_POOL;
    else if (strcmp(mode, "upgrade_pool") == 0) m = MODE_UPGRADE_POOL;
    else if (strcmp(mode, "shadow_pool") == 0) m = MODE_SHADOW_POOL;
    else if (strcmp(mode, "check") == 0) m = MODE_CHECK;
    else return STEWARD_PLUGIN_ERR_PARAM;
    if ((rc = tp_create(host, params, out, err, err_len)) != STEWARD_PLUGIN_OK) return rc;
    (*out)->mode = m;
    return STEWARD_PLUGIN_OK;
}

static int route(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out) {
    (void)req, (void)pools;
    switch (self->mode) {
    case MODE_POOL: out->pool = 999; break;
    case MODE_UPGRADE_POOL: out->upgrade_pool = 999, out->check_after_tokens = 1; break;
    case MODE_SHADOW_POOL: out->shadow_pool = 999; break;
    default:
        if (n_pools >= 2) out->upgrade_pool = out->pool == 0 ? 1 : 0, out->check_after_tokens = 1;
        break;
    }
    return STEWARD_PLUGIN_OK;
}

static int check_upgrade(steward_policy* self, const steward_route_request* req, const steward_token_view* tokens,
                         int32_t* upgrade) {
    (void)self, (void)req, (void)tokens;
    *upgrade = 1;
    return STEWARD_PLUGIN_ERR;
}

static const steward_routing_table table = {
    .version = STEWARD_ROUTING_TABLE_VERSION,
    .size = sizeof table,
    .create = create,
    .destroy = tp_destroy,
    .route = route,
    .check_upgrade = check_upgrade,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_ROUTING, "invalid_routing",
                                          "invalid decisions", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
