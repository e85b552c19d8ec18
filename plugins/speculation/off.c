/* speculation/off: never speculates (a draft budget of 0). No parameters. */
#include "plugin_util.h"

SP_DEFINE_STATELESS(off)

static int off_draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)self, (void)stats;
    *budget = 0;
    return STEWARD_OK;
}

static const steward_speculation_table table = {
    STEWARD_SPECULATION_TABLE_VERSION, sizeof(steward_speculation_table), off_create, off_destroy, off_draft_budget,
};

SP_DEFINE_ENTRY(STEWARD_POLICY_SPECULATION, "off", "no speculative decoding", table)
