/* speculation/fixed: the same draft budget every step. Param budget (integer >= 0, default 4); the
 * host refuses a budget above its max_budget at each step (and uses 0 instead). */
#include "plugin_util.h"

struct steward_policy {
    int32_t budget;
};

static int fixed_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                        char* err, size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_OK) return rc;
    int64_t budget = 4;
    if ((rc = sp_param_int(host, params, "budget", 4, 0, INT32_MAX, &budget, err, err_len))) return rc;
    steward_policy* self = (steward_policy*)malloc(sizeof *self);
    if (self == NULL) return STEWARD_ERR_NOMEM;
    self->budget = (int32_t)budget;
    *out = self;
    return STEWARD_OK;
}

static void fixed_destroy(steward_policy* self) { free(self); }

static int fixed_draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)stats;
    *budget = self->budget;
    return STEWARD_OK;
}

static const steward_speculation_table table = {
    STEWARD_SPECULATION_TABLE_VERSION, sizeof(steward_speculation_table), fixed_create, fixed_destroy,
    fixed_draft_budget,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_SPECULATION, "fixed", "a constant draft budget", table)
