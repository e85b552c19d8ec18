/* steward/steward.h (public): the C API over steward::Runtime (steward/runtime.h), for C and other
 * languages, in libsteward. Opaque handles, init/free pairs, one status enum; no C++ type or
 * exception crosses this line. C99; includes only <stddef.h> and <stdint.h>; may be included with
 * <steward/policy.h> in one translation unit (distinct names throughout). Build against an installed
 * Steward with find_package(steward) and target_link_libraries(app steward::runtime); a C program
 * links with the C compiler alone (`cc app.c -lsteward`): libsteward.so records its C++ runtime.
 *
 * Ownership: strings this API returns (steward_generate's text, steward_metrics_json,
 * steward_metrics_prometheus, steward_metrics_table, steward_check_config's summary) belong to the
 * caller and are freed with steward_string_free. Everything passed in is only read during the call
 * (a request's strings may be freed as soon as steward_submit returns). A steward_result and the
 * pieces handed to callbacks are views valid only while the callback runs: copy what you keep.
 *
 * Thread-safety: every function may be called from any thread at once, except steward_runtime_free,
 * which must not run concurrently with any other call on the same runtime. Callbacks run on runtime
 * threads; one request's callbacks never run concurrently with each other, but different requests'
 * callbacks may. A callback must return quickly and must not call steward_generate, steward_drain or
 * steward_runtime_free (they wait for callbacks, so they would deadlock); steward_cancel,
 * steward_submit, steward_end_session, steward_config_generation and the steward_metrics_* functions
 * are fine.
 */
#ifndef STEWARD_H
#define STEWARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to a struct's layout or a function's meaning.
 * 2: steward_request.ignore_eos; steward_result.finish (steward_result_finish), .upgraded, .fallback;
 *    steward_metrics_prometheus, steward_metrics_table, steward_config_generation,
 *    steward_check_config, steward_runtime_start_with_options, steward_route_sighup_to_reload. */
#define STEWARD_API_VERSION 2

typedef enum steward_status {
    STEWARD_OK = 0,
    STEWARD_ERR_INVALID_ARGUMENT = 1, /* a NULL handle or pointer, or a value out of range */
    STEWARD_ERR_CONFIG = 2,           /* the config is unreadable or invalid, or a pool's model failed to load/write */
    STEWARD_ERR_OVERLOADED = 3,       /* the pool's queue was full (max_queue); retry later */
    STEWARD_ERR_TIMEOUT = 4,          /* the request passed limits.request_timeout_ms */
    STEWARD_ERR_CANCELLED = 5,        /* the request was cancelled (steward_cancel or steward_runtime_free) */
    STEWARD_ERR_GENERATION = 6,    /* the request failed (e.g. prompt past the model's context); see the error text */
    STEWARD_ERR_NOT_FOUND = 7,     /* steward_cancel: the handle is unknown or already finished */
    STEWARD_ERR_OUT_OF_MEMORY = 8, /* an allocation failed */
    STEWARD_ERR_INTERNAL = 9       /* an unexpected failure inside the runtime; the error text says what */
} steward_status;

/* A static, NUL-terminated name for a status ("STEWARD_OK", ...); "unknown" for other values.
 * Thread-safe; never NULL; do not free. */
const char *steward_status_name(steward_status status);

/* STEWARD_API_VERSION of the library that was linked; compare it with the header's. */
int steward_api_version(void);

typedef struct steward_runtime steward_runtime; /* opaque */

/* What to generate. Start from steward_request_default() and set fields: a zeroed struct has
 * top_p 0 and add_bos 0, which are probably not what you want. */
typedef struct steward_request {
    const char *prompt;        /* UTF-8, NUL-terminated; ignored when n_prompt_ids > 0. NULL or not UTF-8: INVALID_ARGUMENT */
    const int32_t *prompt_ids; /* token ids of the routed pool's vocabulary (n_prompt_ids of them) */
    size_t n_prompt_ids;
    const char *tenant;          /* NULL or "": "default". Tenants never share KV, except public prefixes */
    const char *session;         /* NULL or "": none. Else the conversation's KV stays pinned between turns */
    const char *bucket_hint;     /* NULL: none; e.g. "short_qa". The config's rules decide */
    const char *response_format; /* NULL or "": none; "json" (classifies only: the C API has no
                                    output constraint; the C++ API's grammar, json_schema and
                                    json_object fields constrain it); anything else:
                                    STEWARD_ERR_INVALID_ARGUMENT */
    int32_t max_tokens;          /* 0: the config's limits.max_tokens_default; >= 0 */
    float temperature;           /* 0: greedy; >= 0 */
    float top_p;                 /* (0, 1] */
    int32_t top_k;               /* 0: off; >= 0 */
    uint64_t seed;
    int tools;      /* non-zero: tools present (an agent turn) */
    int add_bos;    /* non-zero: prepend BOS when the vocabulary wants it */
    int ignore_eos; /* non-zero: generate max_tokens even past end-of-sequence (benchmarks). API 2 */
} steward_request;

/* The defaults: greedy, top_p 1, add_bos 1, everything else 0/NULL. Thread-safe. */
steward_request steward_request_default(void);

/* A request's own figures (docs/metrics.md). */
typedef struct steward_request_metrics {
    double ttft_ms; /* arrival -> first token handed to the caller; -1: none */
    double e2e_ms;
    double queue_ms; /* arrival -> first scheduled; -1: never scheduled */
    double tpot_ms;  /* -1 for fewer than 2 tokens */
    int32_t prompt_tokens;
    int32_t cached_tokens; /* prompt tokens served from the prefix cache or the session */
    int32_t completion_tokens;
    int32_t recomputed_tokens; /* recomputed after preemption */
    double cost;               /* from the pool's prices */
    uint64_t config_generation;
} steward_request_metrics;

/* How a request ended, typed (the same numbers as the finish_reason text's order and as
 * steward_finish_reason of steward/policy.h). Compare this, not the text. API 2. */
typedef enum steward_result_finish {
    STEWARD_RESULT_STOP = 0,      /* end-of-sequence (status STEWARD_OK) */
    STEWARD_RESULT_LENGTH = 1,    /* max_tokens or the model's context (status STEWARD_OK) */
    STEWARD_RESULT_CANCELLED = 2, /* steward_cancel or steward_runtime_free (STEWARD_ERR_CANCELLED) */
    STEWARD_RESULT_TIMEOUT = 3,   /* passed limits.request_timeout_ms (STEWARD_ERR_TIMEOUT) */
    STEWARD_RESULT_ERROR = 4,     /* invalid request or a failure serving it (STEWARD_ERR_GENERATION) */
    STEWARD_RESULT_OVERLOADED = 5 /* refused at admission, retry later (STEWARD_ERR_OVERLOADED) */
} steward_result_finish;

/* A finished request: a view valid only during the finish callback. Strings are NUL-terminated and
 * never NULL (possibly ""). */
typedef struct steward_result {
    uint64_t handle;           /* what steward_submit returned */
    steward_status status;     /* STEWARD_OK for finish_reason stop/length, else the matching error */
    const char *finish_reason; /* stop, length, cancelled, timeout, error, overloaded */
    const char *error;         /* "" unless finish_reason is error/timeout/overloaded/cancelled */
    const char *text;          /* the whole output (text_len bytes; may hold NUL bytes the model produced) */
    size_t text_len;
    const int32_t *tokens; /* n_tokens ids; NULL when n_tokens is 0 */
    const float *logprobs; /* n_tokens log-probabilities; NULL when n_tokens is 0 */
    size_t n_tokens;
    const char *bucket;
    const char *pool;          /* the pool that answered */
    steward_request_metrics metrics;
    steward_result_finish finish; /* the typed finish reason (finish_reason is its name). API 2 */
    int upgraded; /* 1: started on a cheaper pool, answered by a stronger one (cascade). API 2 */
    int fallback; /* 1: a routing plugin's decision was rejected; the bucket's pool served it. API 2 */
} steward_result;

/* A piece of output text (complete UTF-8 characters only, piece_len bytes, NUL-terminated) and the
 * ids that produced it (ids may be NULL when n_ids is 0: the final flush of held-back bytes). Both
 * are views valid only during the call. */
typedef void (*steward_token_cb)(const char *piece, size_t piece_len, const int32_t *ids, size_t n_ids, void *user);
/* Called exactly once per request steward_submit accepted, also on error, cancel, timeout or
 * overload, after its last token callback. `user` is not touched by the runtime after it returns. */
typedef void (*steward_finish_cb)(const steward_result *result, void *user);

/* Starts a runtime from a TOML config (relative model paths are relative to the config's
 * directory; a missing model with a [pool.synth] table is generated first). On success *out owns
 * the runtime: free it with steward_runtime_free. On failure *out is NULL and, when err is not NULL
 * and err_len > 0, err holds a NUL-terminated message (truncated to err_len - 1 bytes) naming the
 * file and the problem.
 * Errors: STEWARD_ERR_INVALID_ARGUMENT (config_path or out NULL), STEWARD_ERR_CONFIG (unreadable or
 * invalid config, a model that cannot be written or loaded), STEWARD_ERR_OUT_OF_MEMORY,
 * STEWARD_ERR_INTERNAL. Thread-safe (each call starts an independent runtime). */
steward_status steward_runtime_start(const char *config_path, steward_runtime **out, char *err, size_t err_len);

/* A public prefix added to the config file's own (steward_runtime_options). */
typedef struct steward_public_prefix {
    const char *name; /* a name the file declares itself keeps the file's text */
    const char *text; /* UTF-8; tokenized per pool; blocks fully inside it are shared across tenants */
} steward_public_prefix;

/* How a runtime is started beyond its config file; applied again at every reload (RuntimeOptions).
 * Zero it for the defaults. API 2. */
typedef struct steward_runtime_options {
    const steward_public_prefix *public_prefixes; /* n_public_prefixes of them; may be NULL when 0 */
    size_t n_public_prefixes;
} steward_runtime_options;

/* steward_runtime_start with options (NULL: none, the same as steward_runtime_start). The options
 * and their strings are copied: free them when this returns. Errors: as steward_runtime_start, and
 * STEWARD_ERR_INVALID_ARGUMENT for public_prefixes NULL with n_public_prefixes > 0, or a NULL or
 * empty name or a NULL text. Thread-safe. API 2. */
steward_status steward_runtime_start_with_options(const char *config_path, const steward_runtime_options *options,
                                                  steward_runtime **out, char *err, size_t err_len);

/* Validates a config file completely without serving (as `steward config check`): TOML, pools
 * (each model loads, or is missing with a [pool.synth] table to write it at start; nothing is
 * written), every bucket's plugins load and accept their parameters. On success *out_summary (when out_summary is not NULL)
 * is a short NUL-terminated summary the caller frees with steward_string_free. Errors:
 * STEWARD_ERR_INVALID_ARGUMENT (config_path NULL), STEWARD_ERR_CONFIG (err says where and what,
 * file:line:column), STEWARD_ERR_OUT_OF_MEMORY, STEWARD_ERR_INTERNAL; then *out_summary is NULL.
 * Thread-safe. API 2. */
steward_status steward_check_config(const char *config_path, char **out_summary, char *err, size_t err_len);

/* Cancels what is still running (each request's finish callback runs, with "cancelled", before this
 * returns), stops the runtime and frees it. NULL is a no-op. Must not run concurrently with another
 * call on the same runtime, nor from a callback. */
void steward_runtime_free(steward_runtime *rt);

/* Submits a request and returns at once; the result always arrives through on_finish, exactly once,
 * on a runtime thread (possibly before this function returns). on_token may be NULL; on_finish may
 * be NULL (fire and forget). The request's strings and ids are copied: free them when this returns.
 * *out_handle (when out_handle is not NULL) receives the handle for steward_cancel.
 * Errors (no callback will run): STEWARD_ERR_INVALID_ARGUMENT (rt or req NULL, prompt_ids NULL with
 * n_prompt_ids > 0, prompt NULL with n_prompt_ids 0, a prompt that is not UTF-8, max_tokens < 0, temperature < 0, top_p outside (0, 1], top_k < 0, a
 * response_format other than NULL, "" or "json"),
 * STEWARD_ERR_OUT_OF_MEMORY, STEWARD_ERR_INTERNAL. Overload, timeout and generation errors are not
 * returned here: they arrive as the result's status. Thread-safe. */
steward_status steward_submit(steward_runtime *rt, const steward_request *req, steward_token_cb on_token,
                              steward_finish_cb on_finish, void *user, uint64_t *out_handle);

/* Cancels a running request; its finish callback comes with "cancelled" (or with its ordinary end,
 * when it finished first). Errors: STEWARD_ERR_INVALID_ARGUMENT (rt NULL), STEWARD_ERR_NOT_FOUND
 * (unknown handle, or the request already finished), STEWARD_ERR_INTERNAL. Thread-safe; callable
 * from a callback. */
steward_status steward_cancel(steward_runtime *rt, uint64_t handle);

/* Blocking convenience: submits and waits for the result. On return from a finished request
 * (STEWARD_OK or any of OVERLOADED, TIMEOUT, CANCELLED, GENERATION), *out_text holds the output so
 * far, NUL-terminated (free it with steward_string_free), *out_metrics (when not NULL) its figures,
 * and err (when not NULL, err_len > 0) the error text or "". On any other error *out_text is NULL.
 * Errors: STEWARD_ERR_INVALID_ARGUMENT (as steward_submit, or out_text NULL), STEWARD_ERR_OVERLOADED,
 * STEWARD_ERR_TIMEOUT, STEWARD_ERR_CANCELLED, STEWARD_ERR_GENERATION, STEWARD_ERR_OUT_OF_MEMORY,
 * STEWARD_ERR_INTERNAL. Thread-safe; must not be called from a callback. */
steward_status steward_generate(steward_runtime *rt, const steward_request *req, char **out_text,
                                steward_request_metrics *out_metrics, char *err, size_t err_len);

/* Drops a session's pinned KV now (otherwise it expires after limits.session_ttl_ms). Unknown
 * sessions are ignored. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt or session NULL),
 * STEWARD_ERR_INTERNAL. Thread-safe; callable from a callback. */
steward_status steward_end_session(steward_runtime *rt, const char *session);

/* The per-bucket figures so far as JSON (Runtime::metrics_json: "all" and "buckets" rows), NUL-terminated;
 * the caller frees *out_json with steward_string_free. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt or
 * out_json NULL), STEWARD_ERR_OUT_OF_MEMORY, STEWARD_ERR_INTERNAL (then *out_json is NULL).
 * Thread-safe; callable from a callback. */
steward_status steward_metrics_json(steward_runtime *rt, char **out_json);

/* The same figures in the Prometheus text exposition format (Runtime::metrics_prometheus: steward_*
 * families with bucket labels), NUL-terminated; the caller frees *out_text with
 * steward_string_free. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt or out_text NULL),
 * STEWARD_ERR_OUT_OF_MEMORY, STEWARD_ERR_INTERNAL (then *out_text is NULL). Thread-safe; callable
 * from a callback. API 2. */
steward_status steward_metrics_prometheus(steward_runtime *rt, char **out_text);

/* The same figures as a text table for people (Runtime::metrics_table, one row per bucket);
 * ownership, errors and thread-safety as steward_metrics_prometheus. API 2. */
steward_status steward_metrics_table(steward_runtime *rt, char **out_text);

/* The live config's generation (1 after start, +1 per successful reload) into *out_generation.
 * Errors: STEWARD_ERR_INVALID_ARGUMENT (rt or out_generation NULL), STEWARD_ERR_INTERNAL.
 * Thread-safe; callable from a callback. API 2. */
steward_status steward_config_generation(steward_runtime *rt, uint64_t *out_generation);

/* Installs a SIGHUP handler that makes every runtime of the process (the first 16 alive) reload
 * its config file (Runtime::route_sighup_to_reload); call once from the program's main thread, before or after
 * starting runtimes. It replaces any SIGHUP handler installed before. Cannot fail. API 2. */
void steward_route_sighup_to_reload(void);

/* Re-reads the config file and swaps it in atomically (Runtime::reload): requests in flight finish
 * with the generation they started with. On success *out_generation (may be NULL) is the new
 * generation. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt NULL), STEWARD_ERR_CONFIG (the file is
 * invalid or a plugin refused: nothing changed; err says where, file:line:column), STEWARD_ERR_INTERNAL.
 * Thread-safe; must not be called from a callback. */
steward_status steward_reload(steward_runtime *rt, uint64_t *out_generation, char *err, size_t err_len);

/* Waits until no request is in flight (every accepted request's finish callback has returned).
 * Errors: STEWARD_ERR_INVALID_ARGUMENT (rt NULL), STEWARD_ERR_INTERNAL. Thread-safe; must not be
 * called from a callback. */
steward_status steward_drain(steward_runtime *rt);

/* Frees a string this API returned. NULL is a no-op. Thread-safe. */
void steward_string_free(char *s);

#ifdef __cplusplus
}
#endif

#endif /* STEWARD_H */
