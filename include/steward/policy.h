/* steward/policy.h: the C ABI of Steward's policy plugins, the only header a plugin needs.
 *
 * A plugin is a shared library exporting ONE function, steward_plugin_entry (see the end of this
 * file), which returns a description of the plugin: the ABI version it was built against, its kind
 * (routing, eviction or speculation), its name and a table of function pointers for that kind.
 * Instances are opaque to the host; the host's data is passed in plain C structs that live only for
 * the duration of the call. No C++ type or exception crosses the line: a plugin written in C++ must
 * catch everything inside its functions.
 *
 * Versions (what a version buys: an older plugin keeps loading, as with redismodule.h and llama.h).
 *  - ABI version. The host loads a plugin built for any ABI version from STEWARD_POLICY_ABI_VERSION_MIN
 *    up to its own. It calls steward_plugin_entry with its own version first and then with each older
 *    version it still speaks, newest first, and takes the first answer that is not NULL (a plugin of
 *    ABI 1 answers only 1). A plugin newer than the host is refused with a message.
 *  - Tables. Every table opens with its version and its size (the plugin's sizeof). Functions are only
 *    ever appended; a function pointer that lies at or past the table's size is absent (NULL) for the
 *    host, so a table from an older header simply lacks the newer functions. A table must hold at least
 *    the version 1 fields (STEWARD_*_TABLE_SIZE_V1 bytes).
 *  - Data the host passes TO a plugin. The structs of version 1 are frozen: a v1 plugin reads them with
 *    its own layout. Newer data travels in newer structs, through newer functions (route_v2,
 *    choose_victim_v2, draft_budget_seq, on_outcome), so a v1 plugin never sees them. Each newer struct
 *    opens with `size` (the host's sizeof) so that a later host may append fields: a plugin reads a
 *    field only when STEWARD_HAS_FIELD says the host's struct reaches it. ARRAYS ARE NEVER EXTENDED:
 *    appending a field would change the stride a plugin indexes with (steward_pool_view is passed as an
 *    array); per-element data of a newer version goes into a new parallel array (steward_pool_extra,
 *    steward_pool_load).
 *  - Data a plugin writes (decisions, budgets) is pre-filled by the host with the safe default.
 *  - The host API (steward_host_api) keeps version 1 and only appends functions (gate them on its size):
 *    v1 plugins compare its version for equality.
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
 * Time budgets. Each decision (route, route_v2, check_upgrade, on_outcome, choose_victim*,
 * draft_budget*) runs on a thread of the instance's own and the host waits for it at most a budget
 * ([plugins] decision_budget_ms, 50 ms by default, for routing; step_decision_budget_ms, 20 ms, for
 * decisions inside an engine step). Past it the host uses the safe default and counts it
 * (steward_plugin_timed_out_decisions_total); the call is not interrupted, and until it returns the
 * instance gets no further calls (their answers are the safe default). Inputs stay valid until the
 * call returns, also after the host gave up waiting. create() and destroy() have no budget.
 *
 * Errors. Functions return STEWARD_PLUGIN_OK or an error code. A decision function that returns an error,
 * or returns a decision the host finds invalid (a pool that does not exist, a victim that is not an
 * evictable block, a draft budget outside [0, max]), is logged once per instance, counted in the
 * metrics (steward_plugin_invalid_decisions_total) and replaced by the safe default: the bucket's
 * configured pool, the least recently used block, a draft budget of 0. Decisions must be quick: they
 * run on the request path (routing) or inside a scheduler step (eviction, speculation). An eviction
 * plugin declining every candidate (choose_victim_v2, STEWARD_EVICT_NO_VICTIM) is not an error: it is
 * counted apart and the engine preempts or queues instead.
 *
 * Status names: STEWARD_PLUGIN_* (steward_plugin_status), distinct from the C API's steward_status in
 * steward.h so that both headers can be included in one translation unit. The numbers are those of
 * ABI 1 (whose header called them STEWARD_OK, STEWARD_ERR, ...), so binaries of either agree.
 */
#ifndef STEWARD_POLICY_H
#define STEWARD_POLICY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes, and the oldest one a host built from it still loads (see Versions
 * above). 2: route_v2 / on_outcome, choose_victim_v2 (names, declining), draft_budget_seq, the
 * STEWARD_PLUGIN_* status names. */
#define STEWARD_POLICY_ABI_VERSION 2
#define STEWARD_POLICY_ABI_VERSION_MIN 1

/* Versions of the per-kind tables (each table's first field). */
#define STEWARD_ROUTING_TABLE_VERSION 2
#define STEWARD_EVICTION_TABLE_VERSION 2
#define STEWARD_SPECULATION_TABLE_VERSION 2
/* Unchanged in ABI 2: plugins built against ABI 1 refuse any other host API version. */
#define STEWARD_HOST_API_VERSION 1

/* Whether a struct that opens with `uint32_t size` (the writer's sizeof) holds FIELD. */
#define STEWARD_HAS_FIELD(ptr, type, field) \
    ((ptr)->size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Export the entry point with default visibility even when the library is built with
 * -fvisibility=hidden (recommended). */
#if defined(_WIN32)
#define STEWARD_PLUGIN_EXPORT __declspec(dllexport)
#else
#define STEWARD_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Return codes of every function in this ABI (ABI 1 named them STEWARD_OK, STEWARD_ERR, ...: same
 * numbers). */
typedef enum steward_plugin_status {
    STEWARD_PLUGIN_OK = 0,
    STEWARD_PLUGIN_ERR = 1,           /* generic failure: the host uses the safe default */
    STEWARD_PLUGIN_ERR_PARAM = 2,     /* a parameter is missing, of the wrong type or out of range */
    STEWARD_PLUGIN_ERR_NOMEM = 3,     /* allocation failed */
    STEWARD_PLUGIN_ERR_NOT_FOUND = 4  /* (host API) the parameter key is absent */
} steward_plugin_status;

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

    /* Read a parameter. Returns STEWARD_PLUGIN_OK, STEWARD_PLUGIN_ERR_NOT_FOUND when the key is absent (the plugin
     * then uses its default), or STEWARD_PLUGIN_ERR_PARAM when the value has another type (an integer is
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
     * pools of its config generation, in config order): STEWARD_PLUGIN_OK, or STEWARD_PLUGIN_ERR_NOT_FOUND, so a
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
    double est_cost;            /* this request's expected cost on this pool (currency units): the
                                   prompt tokens the pool already holds (steward_pool_extra) at the
                                   cached price, the rest at the prompt price, max_tokens of output */
    double est_latency_ms;      /* expected end-to-end latency: queue + prefill + max_tokens x TPOT */
    double est_ttft_ms;         /* this request's expected TTFT: prompt tokens the pool does not hold
                                   yet x the pool's live prefill time per token (a prior before any
                                   request finished) */
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

/* ---- routing, version 2 */

/* What ABI 2 adds per pool: a parallel array to pools[] (steward_pool_view is frozen, see Versions). */
typedef struct steward_pool_extra {
    int32_t n_cached_prompt_tokens; /* this request's prompt tokens this pool already holds for its
                                       tenant (prefix cache or the session's KV); -1: unknown */
} steward_pool_extra;

/* Each pool's load on the worker process hosting it (a pool is one worker's copy of a model):
 * route_v2's ctx->loads[i] goes with pools[i]. Appended within ABI 2 (see steward_route_context). A
 * figure the host does not know reads -1; the host fills what its workers report. */
typedef struct steward_pool_load {
    int32_t n_kv_blocks_used;   /* KV blocks in use on the pool (its worker); -1: unknown */
    int32_t n_kv_blocks_total;  /* KV blocks the pool has; -1: unknown */
    int32_t block_size;         /* tokens per KV block; <= 0: unknown */
    int32_t n_inflight;         /* runs the front has sent there and not yet seen end; -1: unknown */
    const char* worker;         /* "host:port" of the worker hosting the pool; "" local. Lives for the call */
} steward_pool_load;

/* What ABI 2 adds per request. Strings are NUL-terminated; everything lives for the call. */
typedef struct steward_route_context {
    uint32_t size;               /* sizeof(steward_route_context) of the host (STEWARD_HAS_FIELD) */
    const char* session;         /* the caller's session (agent conversation) id; "" for none */
    int32_t session_pool;        /* the pool holding the session's KV (it served the session's last
                                    turn), an index into pools[]; -1: none or unknown */
    int32_t priority;            /* the bucket's priority: higher runs first, lowest is preempted first */
    double slo_ttft_ms;          /* the bucket's targets; 0: none */
    double slo_tpot_ms;
    double deadline_ms;          /* time left before the request times out; 0: no deadline */
    const steward_pool_extra* pools; /* [n_pools], parallel to route_v2's pools[] */

    /* ---- appended within ABI 2 (load across worker processes): read with STEWARD_HAS_FIELD(ctx,
     * steward_route_context, loads); a host of the first ABI 2 release passes a struct that ends above. */
    const steward_pool_load* loads; /* [n_pools], parallel to route_v2's pools[]; NULL: unknown */
} steward_route_context;

/* How a request ended, for on_outcome. */
typedef enum steward_finish_reason {
    STEWARD_FINISH_STOP = 0,      /* end of sequence */
    STEWARD_FINISH_LENGTH = 1,    /* max_tokens or the context */
    STEWARD_FINISH_CANCELLED = 2,
    STEWARD_FINISH_TIMEOUT = 3,
    STEWARD_FINISH_ERROR = 4,
    STEWARD_FINISH_OVERLOADED = 5 /* refused: the pool's queue was full */
} steward_finish_reason;

typedef struct steward_route_outcome {
    uint32_t size;                  /* sizeof(steward_route_outcome) of the host (STEWARD_HAS_FIELD) */
    int32_t pool;                   /* the pool whose run answered (after an upgrade, the upgrade pool),
                                       an index as in route_v2's pools[]; -1: it never ran */
    int32_t finish_reason;          /* a steward_finish_reason */
    int32_t upgraded;               /* 1: check_upgrade moved it to the upgrade pool */
    int32_t n_prompt_tokens;
    int32_t n_cached_prompt_tokens; /* served from the prefix cache or the session */
    int32_t n_output_tokens;
    double ttft_ms;                 /* arrival to first token; -1: no token */
    double tpot_ms;                 /* mean time per output token after the first; -1: fewer than 2 */
    double e2e_ms;                  /* arrival to finish */
    double cost;                    /* currency units, every pool the request ran on */
} steward_route_outcome;

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
     * (none available), leave the default and return STEWARD_PLUGIN_OK. Required unless route_v2 is
     * given (the host calls route_v2 when both are). */
    int (*route)(steward_policy* self, const steward_route_request* req, const steward_pool_view* pools,
                 uint32_t n_pools, steward_route_decision* out);
    /* After check_after_tokens tokens on decision.pool: set *upgrade to 1 to stop there and re-run the
     * request on decision.upgrade_pool, 0 to continue. Optional (NULL: never upgrade). */
    int (*check_upgrade)(steward_policy* self, const steward_route_request* req,
                         const steward_token_view* tokens, int32_t* upgrade);

    /* ---- version 2 (absent from a version 1 table: its size ends before them) */

    /* route with what ABI 2 adds: the session, the pool holding its KV, cached prompt tokens per pool
     * (ctx->pools[i] goes with pools[i]), each pool's load (ctx->loads[i], when the host's struct has
     * the field and it is not NULL), priority, SLO and deadline. Same contract as route. */
    int (*route_v2)(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                    const steward_pool_view* pools, uint32_t n_pools, steward_route_decision* out);
    /* Called once per finished request that this instance routed (also a failed or cancelled one),
     * after the caller has its answer, so a router can learn. req and ctx are what route_v2 was given
     * (ctx->pools and ctx->loads are NULL here: the per-pool figures were those of routing time). The
     * return code is only logged. Optional. Called on the request's thread: keep it short, and remember
     * the host serialises it with route_v2 on the same instance. */
    int (*on_outcome)(steward_policy* self, const steward_route_request* req, const steward_route_context* ctx,
                      const steward_route_outcome* outcome);
} steward_routing_table;

/* The size of a version 1 routing table (create .. check_upgrade). */
#define STEWARD_ROUTING_TABLE_SIZE_V1 offsetof(steward_routing_table, route_v2)

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

/* ---- eviction, version 2 */

/* choose_victim_v2's answer for "none of these": the allocation fails, and the engine frees an idle
 * session, preempts a lower-priority sequence or queues the request instead, exactly as when no block
 * is free at all. Counted apart (not an invalid decision). So that a pool never stalls, a request that
 * nothing else could make room for (nothing running to preempt or wait for) gets its block from the
 * least recently used candidate after all. */
#define STEWARD_EVICT_NO_VICTIM UINT32_MAX

/* What ABI 2 adds to an eviction question: names, not only small ids. Lives for the call. */
typedef struct steward_evict_request {
    uint32_t size;                    /* sizeof(steward_evict_request) of the host (STEWARD_HAS_FIELD) */
    const char* bucket;               /* the bucket of the request that needs the block */
    const char* tenant;               /* its tenant's name; "" unknown */
    const char* const* tenant_names;  /* [ctx->n_tenants]: the name of ctx->tenants[i]; "" unknown */
    /* Added after the first ABI 2 release (read it only when STEWARD_HAS_FIELD(req, steward_evict_request,
     * tier)): where the candidates are. 0: the pool's own KV blocks; 1: its host-memory KV tier; 2: its
     * disk KV tier ([pool.kv_tiers]; a tier's victim moves down a tier or is dropped, never lost silently:
     * the pool's victim is demoted into the host tier). In a tier, cands[i].block is -1. */
    int32_t tier;
    /* Added later still (read it only when STEWARD_HAS_FIELD(req, steward_evict_request,
     * reuse_priority)): [n] per candidate, 1 when the block holds referenced documents or the prompt
     * before them (docs/reuse.md: their KV is kept warm), else 0. The default LRU takes blocks at 1
     * only when no block at 0 is left; a plugin that ignores it treats them like any other. */
    const int32_t* reuse_priority;
} steward_evict_request;

typedef struct steward_eviction_table {
    uint32_t version; /* STEWARD_EVICTION_TABLE_VERSION */
    uint32_t size;    /* sizeof(steward_eviction_table) */
    int (*create)(const steward_host_api* host, const steward_params* params, steward_policy** out,
                  char* err, size_t err_len);
    void (*destroy)(steward_policy* self);
    /* Picks the block to reclaim: writes an index into cands[0..n) to *victim. cands is ordered least
     * recently used first and never empty; it lives for the call. Required unless choose_victim_v2 is
     * given (the host calls choose_victim_v2 when both are). */
    int (*choose_victim)(steward_policy* self, const steward_evict_context* ctx,
                         const steward_evict_candidate* cands, uint32_t n, uint32_t* victim);

    /* ---- version 2 */

    /* choose_victim with the requesting bucket and tenant names (req); *victim may also be
     * STEWARD_EVICT_NO_VICTIM to decline every candidate (e.g. to protect a tenant's blocks). */
    int (*choose_victim_v2)(steward_policy* self, const steward_evict_context* ctx, const steward_evict_request* req,
                            const steward_evict_candidate* cands, uint32_t n, uint32_t* victim);
} steward_eviction_table;

#define STEWARD_EVICTION_TABLE_SIZE_V1 offsetof(steward_eviction_table, choose_victim_v2)

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

/* ---- speculation, version 2: per step, per sequence.
 *
 * The contract (the speculative-decoding engine implements the calling side): before each decode
 * step, for every sequence of the step's batch whose bucket names the plugin, the host asks
 * draft_budget_seq for the number of draft tokens to propose for THAT sequence in THAT step, passing
 * the sequence's running acceptance statistics. The answer must lie in [0, seq->max_budget]; anything
 * else (or an error code) is counted as invalid and replaced by 0 (no drafts for that sequence in that
 * step). 0 is always safe: the step decodes one token as without speculation. A v1 plugin (no
 * draft_budget_seq) is asked draft_budget instead, with a steward_spec_stats derived from the
 * sequence (max_budget, last_budget, batch_size, n_steps, mean_accepted; no histogram or timings). */
typedef struct steward_spec_seq {
    uint32_t size;             /* sizeof(steward_spec_seq) of the host (STEWARD_HAS_FIELD) */
    uint64_t request_id;
    const char* bucket;
    const char* tenant;
    int32_t max_budget;        /* the host's limit (limits.max_draft_tokens): a budget above it is invalid */
    int32_t last_budget;       /* this sequence's budget at its previous step; 0 at its first */
    int32_t position;          /* tokens in the sequence so far (prompt + output): the next token's index */
    int32_t n_generated;       /* output tokens so far */
    int32_t max_tokens;        /* the request's output limit */
    int32_t batch_size;        /* sequences in this step's batch */
    int64_t n_steps;           /* speculative steps of this sequence so far */
    int64_t n_proposed;        /* draft tokens proposed for this sequence so far */
    int64_t n_accepted;        /* of which the target model accepted */
    double recent_acceptance;  /* accepted / proposed over the sequence's recent steps; -1: none yet */
    double temperature;

    /* ---- appended within ABI 2 (goodput inputs): read each with STEWARD_HAS_FIELD(seq,
     * steward_spec_seq, field); a host of the first ABI 2 release passes a struct that ends above.
     * Times are the host's measurements on this pool (wall clock, running means); -1: not measured
     * yet (the plugin uses its own prior). */
    const double* accept_pos;     /* [n_accept_pos]: this sequence's conditional acceptance per draft
                                     position, P(position i accepted | positions < i were), a running
                                     mean started from the bucket's; an entry < 0: that position
                                     was never observed; NULL / 0: none */
    uint32_t n_accept_pos;
    const double* bucket_accept_pos; /* [n_bucket_accept_pos]: the same over the bucket's sequences on
                                        this pool */
    uint32_t n_bucket_accept_pos;
    double draft_ms_per_token;    /* drafting time per draft token with this sequence's draft source
                                     (a draft model's forward; ~0 for n-gram lookup) */
    double verify_ms;             /* mean target forward time of the steps that verified drafts */
    double verify_ms_per_token;   /* what one more token in the step's forward adds (a fit of the
                                     forward time against its token count) */
    double plain_step_ms;         /* this step's forward predicted without any draft token: the step
                                     time without speculation */
    int32_t draft_source;         /* a steward_spec_source */

    /* ---- appended within ABI 2 (a draft model's catch-up): read with STEWARD_HAS_FIELD. Before
     * its first draft token a draft model computes the tokens of the sequence it has not seen: the
     * whole prompt at a sequence's first draft, the output since its last draft after steps at
     * k = 0 (a probe). One forward over them, paid once in this step, on top of the per-token cost
     * above; the following steps draft from there. */
    int32_t draft_catch_up_tokens; /* tokens the draft must compute first if this step drafts (0: none
                                      beyond the per-token cost, e.g. a model-free source) */
    double draft_catch_up_ms;      /* their predicted time (a fit of the host's catch-ups on this
                                      pool); 0 when there is none; -1 not measured yet */
} steward_spec_seq;

/* Where a sequence's draft tokens come from (steward_spec_seq.draft_source). */
typedef enum steward_spec_source {
    STEWARD_SPEC_SOURCE_NONE = 0,
    STEWARD_SPEC_SOURCE_NGRAM = 1, /* prompt lookup: no model, drafting is ~free */
    STEWARD_SPEC_SOURCE_DRAFT = 2, /* a draft model: one draft forward per draft token (per tree depth) */
    STEWARD_SPEC_SOURCE_SELF = 3,  /* the target's first layers: as DRAFT, sharing the target's weights */
    STEWARD_SPEC_SOURCE_SUFFIX = 4 /* suffix decoding: no model, the tenant's recent outputs; drafting is ~free */
} steward_spec_source;

typedef struct steward_speculation_table {
    uint32_t version; /* STEWARD_SPECULATION_TABLE_VERSION */
    uint32_t size;    /* sizeof(steward_speculation_table) */
    int (*create)(const steward_host_api* host, const steward_params* params, steward_policy** out,
                  char* err, size_t err_len);
    void (*destroy)(steward_policy* self);
    /* Writes the draft budget (tokens per sequence, 0 = no speculation) for the bucket's next steps
     * to *budget (ABI 1: per bucket). Required unless draft_budget_seq is given. */
    int (*draft_budget)(steward_policy* self, const steward_spec_stats* stats, int32_t* budget);

    /* ---- version 2 */

    /* Writes the draft budget of one sequence for the next step to *budget (see the contract above).
     * The host calls it instead of draft_budget when both are given (also for a per-bucket question,
     * with a sequence at position 0 and no history). */
    int (*draft_budget_seq)(steward_policy* self, const steward_spec_seq* seq, int32_t* budget);
} steward_speculation_table;

#define STEWARD_SPECULATION_TABLE_SIZE_V1 offsetof(steward_speculation_table, draft_budget_seq)

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
 * an ABI version the host speaks (its own first, then older ones: see Versions); return NULL to
 * refuse it. A plugin answers every version at or above the one it was built with (a newer host loads
 * older plugins). The returned struct has static storage. */
#define STEWARD_PLUGIN_ENTRY_NAME "steward_plugin_entry"
typedef const steward_plugin* (*steward_plugin_entry_fn)(uint32_t host_abi_version);
STEWARD_PLUGIN_EXPORT const steward_plugin* steward_plugin_entry(uint32_t host_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* STEWARD_POLICY_H */
