/* speculation/off: never speculates (a draft budget of 0). No parameters. */
#include "plugin_util.h"

struct steward_policy {
    int unused;
};

static int off_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                      char* err, size_t err_len) {
    (void)params;
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_OK) return rc;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_ERR_NOMEM;
    *out = self;
    return STEWARD_OK;
}

static void off_destroy(steward_policy* self) { free(self); }

static int off_draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)self, (void)stats;
    *budget = 0;
    return STEWARD_OK;
}

static const steward_speculation_table table = {
    STEWARD_SPECULATION_TABLE_VERSION, sizeof(steward_speculation_table), off_create, off_destroy, off_draft_budget,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_SPECULATION, "off", "no speculative decoding", table)
