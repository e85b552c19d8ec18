/* plugin_util.h: small static helpers shared by the built-in plugins (parameter reading with
 * range checks and helpful messages, deterministic per-request sampling, the entry point).
 * Private to this directory: not part of the plugin ABI, not installed. */
#ifndef STEWARD_PLUGIN_UTIL_H
#define STEWARD_PLUGIN_UTIL_H

#include <steward/policy.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Formats a message into err[err_len] (when there is room) and returns STEWARD_PLUGIN_ERR_PARAM. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int sp_fail(char* err, size_t err_len, const char* fmt, ...) {
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return STEWARD_PLUGIN_ERR_PARAM;
}

/* The host API must be the one this header describes or a newer one (which only appends functions). */
static inline int sp_check_host(const steward_host_api* host, char* err, size_t err_len) {
    if (host == NULL || host->version < STEWARD_HOST_API_VERSION || host->size < sizeof(*host) ||
        host->param_double == NULL || host->param_int == NULL || host->param_bool == NULL ||
        host->param_string == NULL)
        return sp_fail(err, err_len, "unsupported host API (version %u, plugin expects %u or newer)",
                       host ? (unsigned)host->version : 0u, (unsigned)STEWARD_HOST_API_VERSION);
    return STEWARD_PLUGIN_OK;
}

/* Reads a finite double parameter within [lo, hi] (absent: *out = def, unchecked). lo_open/hi_open
 * make a bound exclusive. Returns STEWARD_PLUGIN_OK or STEWARD_PLUGIN_ERR_PARAM with a message naming the key. */
static inline int sp_param_double(const steward_host_api* host, const steward_params* params,
                                  const char* key, double def, double lo, int lo_open, double hi,
                                  int hi_open, double* out, char* err, size_t err_len) {
    double v = def;
    int rc = host->param_double(params, key, &v);
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND) {
        *out = def;
        return STEWARD_PLUGIN_OK;
    }
    if (rc != STEWARD_PLUGIN_OK) return sp_fail(err, err_len, "parameter '%s' must be a number", key);
    if (!isfinite(v)) return sp_fail(err, err_len, "parameter '%s' must be a finite number", key);
    if ((lo_open ? v <= lo : v < lo) || (hi_open ? v >= hi : v > hi)) {
        char range[96];
        if (isinf(hi))
            snprintf(range, sizeof range, "%s %g", lo_open ? ">" : ">=", lo);
        else
            snprintf(range, sizeof range, "in %s%g, %g%s", lo_open ? "(" : "[", lo, hi,
                     hi_open ? ")" : "]");
        return sp_fail(err, err_len, "parameter '%s' must be %s (got %g)", key, range, v);
    }
    *out = v;
    return STEWARD_PLUGIN_OK;
}

/* Reads an integer parameter within [lo, hi] (absent: *out = def). */
static inline int sp_param_int(const steward_host_api* host, const steward_params* params,
                               const char* key, int64_t def, int64_t lo, int64_t hi, int64_t* out,
                               char* err, size_t err_len) {
    int64_t v = def;
    int rc = host->param_int(params, key, &v);
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND) v = def;
    else if (rc != STEWARD_PLUGIN_OK)
        return sp_fail(err, err_len, "parameter '%s' must be an integer", key);
    if (v < lo || v > hi)
        return sp_fail(err, err_len, "parameter '%s' must be in [%lld, %lld] (got %lld)", key,
                       (long long)lo, (long long)hi, (long long)v);
    *out = v;
    return STEWARD_PLUGIN_OK;
}

/* Reads a boolean parameter (absent: *out = def). */
static inline int sp_param_bool(const steward_host_api* host, const steward_params* params, const char* key, int def,
                                int* out, char* err, size_t err_len) {
    int v = def;
    int rc = host->param_bool(params, key, &v);
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND) v = def;
    else if (rc != STEWARD_PLUGIN_OK)
        return sp_fail(err, err_len, "parameter '%s' must be true or false", key);
    *out = v ? 1 : 0;
    return STEWARD_PLUGIN_OK;
}

/* Reads a string parameter and copies it into a malloc'ed string (absent: *out = NULL, which is
 * not an error). Empty strings are refused. */
static inline int sp_param_string_dup(const steward_host_api* host, const steward_params* params,
                                      const char* key, char** out, char* err, size_t err_len) {
    const char* s = NULL;
    *out = NULL;
    int rc = host->param_string(params, key, &s);
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND) return STEWARD_PLUGIN_OK;
    if (rc != STEWARD_PLUGIN_OK || s == NULL)
        return sp_fail(err, err_len, "parameter '%s' must be a string", key);
    size_t n = strlen(s);
    if (n == 0) return sp_fail(err, err_len, "parameter '%s' must not be empty", key);
    char* copy = (char*)malloc(n + 1);
    if (copy == NULL) return STEWARD_PLUGIN_ERR_NOMEM;
    memcpy(copy, s, n + 1);
    *out = copy;
    return STEWARD_PLUGIN_OK;
}

/* Reads a pool-list parameter: pool names separated by commas (spaces around a name ignored),
 * resolved with host->pool_index, so a misnamed pool is refused at load time with a message naming
 * it. Absent or "": *out = NULL, *n_out = 0 (every pool). Else *out is a malloc'ed array of *n_out
 * pool indices, ascending, without duplicates (the caller frees it). */
static inline int sp_param_pool_list(const steward_host_api* host, const steward_params* params, const char* key,
                                     int32_t** out, uint32_t* n_out, char* err, size_t err_len) {
    const char* s = NULL;
    *out = NULL;
    *n_out = 0;
    int rc = host->param_string(params, key, &s);
    if (rc == STEWARD_PLUGIN_ERR_NOT_FOUND) return STEWARD_PLUGIN_OK;
    if (rc != STEWARD_PLUGIN_OK || s == NULL)
        return sp_fail(err, err_len, "parameter '%s' must be a string of pool names separated by commas", key);
    size_t len = strlen(s), n_max = 1;
    while (len > 0 && s[len - 1] == ' ') len--;
    if (len == 0) return STEWARD_PLUGIN_OK;
    if (host->pool_index == NULL)
        return sp_fail(err, err_len, "parameter '%s' needs a host that can look pool names up (pool_index)", key);
    for (size_t i = 0; i < len; i++) n_max += s[i] == ',';
    int32_t* idx = (int32_t*)malloc(n_max * sizeof *idx);
    char* name = (char*)malloc(len + 1);
    if (idx == NULL || name == NULL) {
        free(idx);
        free(name);
        return STEWARD_PLUGIN_ERR_NOMEM;
    }
    uint32_t n = 0;
    for (size_t at = 0; at <= len && rc == STEWARD_PLUGIN_OK;) {
        size_t end = at;
        while (end < len && s[end] != ',') end++;
        size_t b = at, e = end;
        while (b < e && s[b] == ' ') b++;
        while (e > b && s[e - 1] == ' ') e--;
        memcpy(name, s + b, e - b);
        name[e - b] = 0;
        int32_t k = -1;
        if (e == b)
            rc = sp_fail(err, err_len, "parameter '%s' has an empty pool name in \"%s\"", key, s);
        else if (host->pool_index(params, name, &k) != STEWARD_PLUGIN_OK || k < 0)
            rc = sp_fail(err, err_len, "parameter '%s' names pool \"%s\", which the config does not define", key,
                         name);
        else { /* insert in order, once */
            uint32_t j = 0;
            while (j < n && idx[j] < k) j++;
            if (j == n || idx[j] != k) {
                memmove(idx + j + 1, idx + j, (n - j) * sizeof *idx);
                idx[j] = k;
                n++;
            }
        }
        at = end + 1;
    }
    free(name);
    if (rc != STEWARD_PLUGIN_OK) {
        free(idx);
        return rc;
    }
    *out = idx;
    *n_out = n;
    return STEWARD_PLUGIN_OK;
}

/* A uniform number in [0, 1) from a request id (splitmix64 finaliser, top 53 bits): the same id
 * always gives the same number, consecutive ids look independent. */
static inline double sp_unit_hash(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* A policy without parameters or state: create() hands out one zeroed instance (the host needs a
 * handle), destroy() frees it. Defines struct steward_policy and PREFIX##_create / PREFIX##_destroy. */
#define SP_DEFINE_STATELESS(PREFIX)                                                                    \
    struct steward_policy {                                                                            \
        int unused;                                                                                    \
    };                                                                                                 \
    static int PREFIX##_create(const steward_host_api* host, const steward_params* params,            \
                               steward_policy** out, char* err, size_t err_len) {                      \
        (void)params;                                                                                  \
        int rc = sp_check_host(host, err, err_len);                                                    \
        if (rc != STEWARD_PLUGIN_OK) return rc;                                                               \
        steward_policy* self = (steward_policy*)calloc(1, sizeof *self);                               \
        if (self == NULL) return STEWARD_PLUGIN_ERR_NOMEM;                                                    \
        *out = self;                                                                                   \
        return STEWARD_PLUGIN_OK;                                                                             \
    }                                                                                                  \
    static void PREFIX##_destroy(steward_policy* self) { free(self); }

/* The entry point: returns the description to a host of this ABI version or a newer one (which
 * loads older plugins), NULL to an older host. */
#define SP_DEFINE_ENTRY(KIND, NAME, DESCRIPTION, TABLE)                                        \
    STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version) { \
        static const steward_plugin plugin = {STEWARD_POLICY_ABI_VERSION, (uint32_t)(KIND), (NAME), \
                                              (DESCRIPTION), &(TABLE)};                         \
        return host_abi_version >= STEWARD_POLICY_ABI_VERSION ? &plugin : NULL;                  \
    }

#endif /* STEWARD_PLUGIN_UTIL_H */
