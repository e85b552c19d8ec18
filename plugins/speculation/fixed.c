/* speculation/fixed: the same draft budget every step, for every sequence. Param budget (integer >= 0,
 * default 4). Per sequence (ABI 2) the budget is capped at what the sequence may still produce
 * (drafting past max_tokens is wasted work). It is not capped at the host's max_budget: a budget above
 * limits.max_draft_tokens is a config mistake the host refuses and counts (using 0 instead). */
#include "plugin_util.h"

struct steward_policy {
    int32_t budget;
};

static int fixed_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                        char* err, size_t err_len) {
    int rc = sp_check_host(host, err, err_len);
    if (rc != STEWARD_PLUGIN_OK) return rc;
    int64_t budget = 4;
    if ((rc = sp_param_int(host, params, "budget", 4, 0, INT32_MAX, &budget, err, err_len))) return rc;
    steward_policy* self = (steward_policy*)malloc(sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    self->budget = (int32_t)budget;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static void fixed_destroy(steward_policy* self) { free(self); }

static int fixed_draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)stats;
    *budget = self->budget;
    return STEWARD_PLUGIN_OK;
}

static int fixed_draft_budget_seq(steward_policy* self, const steward_spec_seq* seq, int32_t* budget) {
    int32_t b = self->budget;
    if (seq->max_tokens > 0) {
        /* The verify step yields one token beyond the accepted drafts. */
        const int32_t left = seq->max_tokens - seq->n_generated - 1;
        if (b > left) b = left > 0 ? left : 0;
    }
    *budget = b < 0 ? 0 : b;
    return STEWARD_PLUGIN_OK;
}

static const steward_speculation_table table = {
    .version = STEWARD_SPECULATION_TABLE_VERSION,
    .size = sizeof(steward_speculation_table),
    .create = fixed_create,
    .destroy = fixed_destroy,
    .draft_budget = fixed_draft_budget,
    .draft_budget_seq = fixed_draft_budget_seq,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_SPECULATION, "fixed", "a constant draft budget", table)
