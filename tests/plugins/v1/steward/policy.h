/* steward/policy.h: the C ABI of Steward's policy plugins, the only header a plugin needs.
 *
 * A plugin is a shared library exporting ONE function, steward_plugin_entry (see the end of this
 * file), which returns a description of the plugin: the ABI version it was built against, its kind
 * (routing, eviction or speculation), its name and a table of function pointers for that kind.
 * Every table opens with its own version and size, so the host can refuse (or, later, adapt to) a
 * table from an older header. Instances are opaque to the host; the host's data is passed in plain
 * C structs that live only for the duration of the call. No C++ type or exception crosses the line:
 * a plugin written in C++ must catch everything inside its functions.
 *
 * Lifecycle. The host dlopens a private copy of the library (so a rebuilt file at the same path is a
 * new library at the next config reload), calls steward_plugin_entry once, checks the versions and
 * the kind, then calls create() once per workload bucket that names the plugin, with that bucket's
 * parameters. destroy() is called when the last request that started under the config generation
 * of that instance has finished. The library is unloaded after its last instance is destroyed.
 *
 * Threading. The host never calls one instance from two threads at once (it serialises calls per
 * instance), but different instances of the same library may be called concurrently from different
 * threads: keep mutable state in the instance, not in globals.
 *
 * Errors. Functions return STEWARD_OK or an error code. A decision function that returns an error,
 * or returns a decision the host finds invalid (a pool that does not exist, a victim that is not an
 * evictable block, a draft budget outside [0, max]), is logged once per instance, counted in the
 * metrics (steward_plugin_invalid_decisions_total) and replaced by the safe default: the bucket's
 * configured pool, the least recently used block, a draft budget of 0. Decisions must be quick: they
 * run on the request path (routing) or inside a scheduler step (eviction, speculation).
 */
#ifndef STEWARD_POLICY_H
#define STEWARD_POLICY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change to this header. The host refuses a plugin whose
 * steward_plugin.abi_version differs from its own. */
#define STEWARD_POLICY_ABI_VERSION 1

/* Versions of the per-kind tables (each table's first field). */
#define STEWARD_ROUTING_TABLE_VERSION 1
#define STEWARD_EVICTION_TABLE_VERSION 1
#define STEWARD_SPECULATION_TABLE_VERSION 1
#define STEWARD_HOST_API_VERSION 1

/* Export the entry point with default visibility even when the library is built with
 * -fvisibility=hidden (recommended). */
#if defined(_WIN32)
#define STEWARD_PLUGIN_EXPORT __declspec(dllexport)
#else
#define STEWARD_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Return codes of every function in this ABI. */
typedef enum steward_status {
    STEWARD_OK = 0,
    STEWARD_ERR = 1,           /* generic failure: the host uses the safe default */
    STEWARD_ERR_PARAM = 2,     /* a parameter is missing, of the wrong type or out of range */
    STEWARD_ERR_NOMEM = 3,     /* allocation failed */
    STEWARD_ERR_NOT_FOUND = 4  /* (host API) the parameter key is absent */
} steward_status;

typedef enum steward_policy_kind {
    STEWARD_POLICY_ROUTING = 1,     /* which pool a request runs on; when to upgrade */
    STEWARD_POLICY_EVICTION = 2,    /* which cached, unreferenced KV block to reclaim */
    STEWARD_POLICY_SPECULATION = 3  /* how many draft tokens to propose per step */
} steward_policy_kind;

/* An instance of a policy: defined by the plugin, opaque to the host. */
typedef struct steward_policy steward_policy;
/* A bucket's parameters (the keys of its [bucket.routing] / [bucket.eviction] /
 * [bucket.speculation] table other than "plugin"): opaque, read through steward_host_api. The
 * param_* and pool_index functions answer only during create(); the handle itself stays valid until
 * destroy(), so an instance may keep it to call log(). */
typedef struct steward_params steward_params;

/* Services the host offers a plugin. Passed to create(); the pointer stays valid until destroy(). */
typedef struct steward_host_api {
    uint32_t version; /* STEWARD_HOST_API_VERSION */
    uint32_t size;    /* sizeof(steward_host_api) of the host */

    /* Read a parameter. Returns STEWARD_OK, STEWARD_ERR_NOT_FOUND when the key is absent (the plugin
     * then uses its default), or STEWARD_ERR_PARAM when the value has another type (an integer is
     * accepted where a double is asked). A string stays valid until create() returns. Keys the
     * plugin never reads are reported to the user as unknown parameters. */
    int (*param_double)(const steward_params* params, const char* key, double* out);
    int (*param_int)(const steward_params* params, const char* key, int64_t* out);
    int (*param_bool)(const steward_params* params, const char* key, int* out);
    int (*param_string)(const steward_params* params, const char* key, const char** out);

    /* Writes a line to the host's log (level: 0 debug, 1 info, 2 warning, 3 error), prefixed with
     * the plugin and bucket. Thread-safe; callable until destroy(). msg is copied. */
    void (*log)(const steward_params* params, int level, const char* msg);

    /* The index of the pool called `name` in the pools[] a routing instance will be given (the
     * pools of its config generation, in config order): STEWARD_OK, or STEWARD_ERR_NOT_FOUND, so a
     * plugin can refuse a misnamed pool at load time. During create() only. */
    int (*pool_index)(const steward_params* params, const char* name, int32_t* out);
} steward_host_api;

/* ---------------------------------------------------------------------------------------------
 * Routing: called once per request (route) and, when the decision asks for it, once more after
 * the first tokens (check_upgrade). */

/* The request being routed. Strings are NUL-terminated and live for the call. */
typedef struct steward_route_request {
    uint64_t request_id;         /* unique per runtime; stable for deterministic sampling */
    const char* bucket;          /* the bucket the classifier put it in */
    const char* tenant;
    int32_t n_prompt_tokens;
    int32_t max_tokens;
    double temperature;
    int32_t tools;               /* 1: the request carries tools (an agent turn) */
    const char* response_format; /* "" or "json" */
} steward_route_request;

/* One pool as the router sees it: configured prices and live estimates from the metrics. Pools are
 * indexed 0..n_pools-1; a decision names a pool by index. */
typedef struct steward_pool_view {
    const char* name;
    int32_t available;          /* 0: draining or over capacity, do not pick */
    int32_t n_layers;           /* model depth: a rough capacity signal */
    double n_params;            /* model parameters */
    double price_prompt;        /* per million tokens */
    double price_output;        /* per million tokens */
    double est_cost;            /* this request's expected cost on this pool (currency units) */
    double est_latency_ms;      /* expected end-to-end latency: queue + prefill + max_tokens x TPOT */
    double est_ttft_ms;         /* this request's expected TTFT: prompt tokens x the pool's live
                                   prefill time per token (a prior before any request finished) */
    double est_tpot_ms;         /* live mean TPOT (or a prior) */
    double quality;             /* [0, 1]: measured agreement with the strongest pool on shadowed
                                   requests of this bucket, else the configured prior */
    double risk;                /* [0, 1]: queue fill and the recent error rate */
    int32_t n_waiting;          /* queued requests */
    int32_t n_running;          /* requests in the running batch */
} steward_pool_view;

typedef struct steward_route_decision {
    int32_t pool;               /* required: the pool to start on, an index of an available pool */
    int32_t upgrade_pool;       /* -1: none; else the pool to re-run on if check_upgrade says so */
    int32_t check_after_tokens; /* > 0 with upgrade_pool: call check_upgrade after this many
                                   output tokens (or at the end if the request finishes first) */
    int32_t shadow_pool;        /* -1: none; else also run the request on this pool (its output is
                                   discarded) to measure the started pool's agreement with it */
} steward_route_decision;

/* The first output tokens of a request, for check_upgrade. */
typedef struct steward_token_view {
    const int32_t* tokens;   /* [n] */
    const float* logprobs;   /* [n] natural-log probability of each sampled token */
    uint32_t n;
    int32_t finished;        /* 1: the request ended before check_after_tokens tokens */
} steward_token_view;

typedef struct steward_routing_table {
    uint32_t version; /* STEWARD_ROUTING_TABLE_VERSION */
    uint32_t size;    /* sizeof(steward_routing_table) */

    /* Creates an instance from a bucket's parameters. On failure returns an error code and writes a
     * message (what is wrong and how to fix it) into err[err_len]; *out is then ignored. Required. */
    int (*create)(const steward_host_api* host, const steward_params* params, steward_policy** out,
                  char* err, size_t err_len);
    /* Frees the instance. Required. Never called twice. */
    void (*destroy)(steward_policy* self);

    /* Fills *out for one request. The host pre-fills *out with the safe default (the bucket's
     * configured pool, no upgrade, no shadow). pools[n_pools] live for the call. When no pool fits
     * (none available), leave the default and return STEWARD_OK. Required. */
    int (*route)(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out);
    /* After check_after_tokens tokens on decision.pool: set *upgrade to 1 to stop there and re-run the
     * request on decision.upgrade_pool, 0 to continue. Optional (NULL: never upgrade). */
    int (*check_upgrade)(steward_policy* self, const steward_route_request* req,
                         const steward_token_view* tokens, int32_t* upgrade);
} steward_routing_table;

/* ---------------------------------------------------------------------------------------------
 * Eviction: called inside a scheduler step when a pool needs a block and no uncached free block
 * is left. The candidates are every evictable block (reference count 0, holding cached KV). */

typedef struct steward_evict_candidate {
    int32_t block;             /* physical block id (informational) */
    int32_t tenant;            /* small id of the tenant that wrote it */
    int32_t is_public;         /* 1: inside a declared-public prefix, shared across tenants */
    int32_t depth;             /* the block's index in its sequence: 0 = the first block of a prompt */
    int64_t last_access_tick;  /* pool tick of the last use; larger = more recent */
    int64_t n_hits;            /* prefix-cache hits since it was cached */
} steward_evict_candidate;

typedef struct steward_evict_tenant {
    int32_t tenant;         /* small id, as in steward_evict_candidate.tenant */
    int32_t n_blocks_held;  /* blocks this tenant wrote that are cached or in use */
    int32_t quota_blocks;   /* the tenant's configured KV quota in blocks; -1: none */
} steward_evict_tenant;

typedef struct steward_evict_context {
    int64_t now_tick;            /* the pool's current tick */
    int32_t n_blocks_total;      /* blocks in the pool */
    int32_t block_size;          /* token slots per block */
    double block_bytes;          /* bytes one block holds (K and V, every layer) */
    int32_t requesting_tenant;   /* tenant of the request that needs the block (-1: unknown) */
    const steward_evict_tenant* tenants; /* [n_tenants]: every tenant holding blocks */
    uint32_t n_tenants;
} steward_evict_context;

typedef struct steward_eviction_table {
    uint32_t version; /* STEWARD_EVICTION_TABLE_VERSION */
    uint32_t size;    /* sizeof(steward_eviction_table) */
    int (*create)(const steward_host_api* host, const steward_params* params, steward_policy** out,
                  char* err, size_t err_len);
    void (*destroy)(steward_policy* self);
    /* Picks the block to reclaim: writes an index into cands[0..n) to *victim. cands is ordered least
     * recently used first and never empty; it lives for the call. Required. */
    int (*choose_victim)(steward_policy* self, const steward_evict_context* ctx,
                         const steward_evict_candidate* cands, uint32_t n, uint32_t* victim);
} steward_eviction_table;

/* ---------------------------------------------------------------------------------------------
 * Speculation: asked for the number of draft tokens to propose per sequence for the next step. */

typedef struct steward_spec_stats {
    int32_t max_budget;           /* the host's limit: a budget above it is invalid */
    int32_t last_budget;          /* the budget of the previous step */
    int32_t batch_size;           /* sequences in the batch */
    int64_t n_steps;              /* speculative steps so far in this bucket */
    double mean_accepted;         /* mean accepted draft tokens per step (recent window) */
    const int64_t* accepted_hist; /* [n_hist]: steps that accepted k tokens, k = 0..n_hist-1 */
    uint32_t n_hist;
    double step_ms;               /* mean wall time of a step (recent window) */
    double draft_ms;              /* of which drafting */
    double verify_ms;             /* of which verifying */
} steward_spec_stats;

typedef struct steward_speculation_table {
    uint32_t version; /* STEWARD_SPECULATION_TABLE_VERSION */
    uint32_t size;    /* sizeof(steward_speculation_table) */
    int (*create)(const steward_host_api* host, const steward_params* params, steward_policy** out,
                  char* err, size_t err_len);
    void (*destroy)(steward_policy* self);
    /* Writes the draft budget (tokens per sequence, 0 = no speculation) to *budget. Required. */
    int (*draft_budget)(steward_policy* self, const steward_spec_stats* stats, int32_t* budget);
} steward_speculation_table;

/* ---------------------------------------------------------------------------------------------
 * The entry point. */

typedef struct steward_plugin {
    uint32_t abi_version; /* STEWARD_POLICY_ABI_VERSION the plugin was built with */
    uint32_t kind;        /* a steward_policy_kind */
    const char* name;     /* short name, e.g. "lru"; informational (the config names the file) */
    const char* description;
    /* Points to a steward_routing_table, steward_eviction_table or steward_speculation_table,
     * matching kind. Static storage: it must outlive the library's use. */
    const void* table;
} steward_plugin;

/* Every plugin exports exactly this function (C linkage, default visibility). host_abi_version is
 * the host's STEWARD_POLICY_ABI_VERSION; return NULL to refuse to load. The returned struct has
 * static storage. */
#define STEWARD_PLUGIN_ENTRY_NAME "steward_plugin_entry"
typedef const steward_plugin* (*steward_plugin_entry_fn)(uint32_t host_abi_version);
STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* STEWARD_POLICY_H */
