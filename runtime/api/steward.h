/* steward.h: the C API over steward::Runtime (runtime/api/runtime.h), for other languages. Opaque
 * handles, init/free pairs, one status enum; no C++ type or exception crosses this line.
 *
 * Ownership: strings this API returns (steward_generate's text, steward_metrics_json) belong to the
 * caller and are freed with steward_string_free. Everything passed in is only read during the call
 * (a request's strings may be freed as soon as steward_submit returns). A steward_result and the
 * pieces handed to callbacks are views valid only while the callback runs: copy what you keep.
 *
 * Thread-safety: every function may be called from any thread at once, except steward_runtime_free,
 * which must not run concurrently with any other call on the same runtime. Callbacks run on runtime
 * threads; one request's callbacks never run concurrently with each other, but different requests'
 * callbacks may. A callback must return quickly and must not call steward_generate, steward_drain or
 * steward_runtime_free (they wait for callbacks, so they would deadlock); steward_cancel,
 * steward_submit, steward_end_session and steward_metrics_json are fine.
 */
#ifndef STEWARD_H
#define STEWARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to a struct's layout or a function's meaning. */
#define STEWARD_API_VERSION 1

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
    const char *prompt;        /* UTF-8, NUL-terminated; ignored when n_prompt_ids > 0. NULL: "" */
    const int32_t *prompt_ids; /* token ids of the routed pool's vocabulary (n_prompt_ids of them) */
    size_t n_prompt_ids;
    const char *tenant;          /* NULL or "": "default". Tenants never share KV, except public prefixes */
    const char *session;         /* NULL or "": none. Else the conversation's KV stays pinned between turns */
    const char *bucket_hint;     /* NULL: none; e.g. "short_qa". The config's rules decide */
    const char *response_format; /* NULL or "": none; "json" (classifies only: output is not
                                    constrained yet); anything else: STEWARD_ERR_INVALID_ARGUMENT */
    int32_t max_tokens;          /* 0: the config's limits.max_tokens_default; >= 0 */
    float temperature;           /* 0: greedy; >= 0 */
    float top_p;                 /* (0, 1] */
    int32_t top_k;               /* 0: off; >= 0 */
    uint64_t seed;
    int tools;   /* non-zero: tools present (an agent turn) */
    int add_bos; /* non-zero: prepend BOS when the vocabulary wants it */
} steward_request;

/* The defaults: greedy, top_p 1, add_bos 1, everything else 0/NULL. Thread-safe. */
steward_request steward_request_default(void);

/* A request's own figures (METRICS.md). */
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
    const char *pool;
    steward_request_metrics metrics;
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

/* Cancels what is still running (each request's finish callback runs, with "cancelled", before this
 * returns), stops the runtime and frees it. NULL is a no-op. Must not run concurrently with another
 * call on the same runtime, nor from a callback. */
void steward_runtime_free(steward_runtime *rt);

/* Submits a request and returns at once; the result always arrives through on_finish, exactly once,
 * on a runtime thread (possibly before this function returns). on_token may be NULL; on_finish may
 * be NULL (fire and forget). The request's strings and ids are copied: free them when this returns.
 * *out_handle (when out_handle is not NULL) receives the handle for steward_cancel.
 * Errors (no callback will run): STEWARD_ERR_INVALID_ARGUMENT (rt or req NULL, prompt_ids NULL with
 * n_prompt_ids > 0, max_tokens < 0, temperature < 0, top_p outside (0, 1], top_k < 0, a
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
