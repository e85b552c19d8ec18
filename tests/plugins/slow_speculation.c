/* slow_speculation.so: a speculation plugin whose draft_budget_seq() sleeps sleep_ms (default 0) and
 * answers (request_id + n_generated) % (max_budget + 1), or -1 (invalid) for request id 13: answers a
 * test can work out from the question alone. */
#include "test_plugin.h"

#include <time.h>

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    int64_t v = 0;
    host->param_int(params, "sleep_ms", &v);
    self->value = v;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static int draft_budget(steward_policy* self, const steward_spec_stats* stats, int32_t* budget) {
    (void)self;
    *budget = stats->max_budget;
    return STEWARD_PLUGIN_OK;
}

static int draft_budget_seq(steward_policy* self, const steward_spec_seq* seq, int32_t* budget) {
    if (self->value > 0) {
        struct timespec ts = {(time_t)(self->value / 1000), (long)(self->value % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    *budget = seq->request_id == 13 ? -1 : (int32_t)((seq->request_id + (uint64_t)seq->n_generated) % (uint64_t)(seq->max_budget + 1));
    return STEWARD_PLUGIN_OK;
}

static const steward_speculation_table table = {
    .version = STEWARD_SPECULATION_TABLE_VERSION,
    .size = sizeof table,
    .create = create,
    .destroy = tp_destroy,
    .draft_budget = draft_budget,
    .draft_budget_seq = draft_budget_seq,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_SPECULATION, "slow_speculation",
                                          "draft_budget_seq sleeps sleep_ms", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
