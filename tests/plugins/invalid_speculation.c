/* invalid_speculation.so: a speculation plugin whose budget is invalid. Param mode (string, default
 * "negative"): "negative" returns -1, "over_max" returns the host's max_budget + 1. */
#include "test_plugin.h"

#include <string.h>

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    const char* mode = "negative";
    int rc = host->param_string(params, "mode", &mode);
    if (rc != STEWARD_PLUGIN_OK && rc != STEWARD_PLUGIN_ERR_NOT_FOUND) return STEWARD_PLUGIN_ERR_PARAM;
    if (strcmp(mode, "negative") != 0 && strcmp(mode, "over_max") != 0) return STEWARD_PLUGIN_ERR_PARAM;
    if ((rc = tp_create(host, params, out, err, err_len)) != STEWARD_PLUGIN_OK) return rc;
    (*out)->mode = strcmp(mode, "over_max") == 0;
    return STEWARD_PLUGIN_OK;
}

static int draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    *budget = self->mode ? stats->max_budget + 1 : -1;
    return STEWARD_PLUGIN_OK;
}

static const steward_speculation_table table = {
    .version = STEWARD_SPECULATION_TABLE_VERSION,
    .size = sizeof table,
    .create = create,
    .destroy = tp_destroy,
    .draft_budget = draft_budget,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_SPECULATION,
                                          "invalid_speculation", "budget out of range", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
