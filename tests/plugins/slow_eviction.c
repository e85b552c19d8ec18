/* slow_eviction.so: an eviction plugin whose choose_victim() sleeps sleep_ms (default 2000), then picks
 * the last candidate: a decision inside an engine step that overruns the host's budget. */
#include "test_plugin.h"

#include <time.h>

static int create(const steward_host_api* host, const steward_params* params, steward_policy** out, char* err,
                  size_t err_len) {
    (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    self->value = 2000;
    host->param_int(params, "sleep_ms", &self->value);
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static int choose_victim(steward_policy* self, const steward_evict_context* ctx, const steward_evict_candidate* cands,
                         uint32_t n, uint32_t* out) {
    (void)ctx, (void)cands;
    struct timespec ts = {(time_t)(self->value / 1000), (long)(self->value % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
    *out = n ? n - 1 : 0;
    return STEWARD_PLUGIN_OK;
}

static const steward_eviction_table table = {
    .version = STEWARD_EVICTION_TABLE_VERSION, .size = sizeof table, .create = create, .destroy = tp_destroy,
    .choose_victim = choose_victim,
};

STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) {
    static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, STEWARD_POLICY_EVICTION, "slow_eviction",
                                          "choose_victim sleeps sleep_ms", &table};
    return host_abi_version == STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;
}
