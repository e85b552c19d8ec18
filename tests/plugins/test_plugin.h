/* test_plugin.h: the boilerplate shared by the deliberately broken or minimal test plugins: an
 * instance with no state, created from any parameters. */
#ifndef STEWARD_TEST_PLUGIN_H
#define STEWARD_TEST_PLUGIN_H

#include <steward/policy.h>

#include <stdlib.h>

struct steward_policy {
    int64_t value; /* a parameter, for the plugins that read one */
    int mode;
};

static inline int tp_create(const steward_host_api* host, const steward_params* params, steward_policy** out,
                            char* err, size_t err_len) {
    (void)host, (void)params, (void)err, (void)err_len;
    steward_policy* self = (steward_policy*)calloc(1, sizeof *self);
    if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    *out = self;
    return STEWARD_PLUGIN_OK;
}

static inline void tp_destroy(steward_policy* self) { free(self); }

#endif
