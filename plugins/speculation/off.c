/* speculation/off: never speculates (a draft budget of 0, per bucket and per sequence). No parameters. */
#include "plugin_util.h"

SP_DEFINE_STATELESS(off)

static int off_draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)self, (void)stats;
    *budget = 0;
    return STEWARD_PLUGIN_OK;
}

static int off_draft_budget_seq(steward_policy* self, const steward_spec_seq* seq, int32_t* budget) {
    (void)self, (void)seq;
    *budget = 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_speculation_table table = {
    .version = STEWARD_SPECULATION_TABLE_VERSION,
    .size = sizeof(steward_speculation_table),
    .create = off_create,
    .destroy = off_destroy,
    .draft_budget = off_draft_budget,
    .draft_budget_seq = off_draft_budget_seq,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_SPECULATION, "off", "no speculative decoding", table)
