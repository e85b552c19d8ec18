/* steward/steward.h (public): the C API over steward::Runtime (steward/runtime.h), for C and other
 * languages, in libsteward. Opaque handles, init/free pairs, one status enum; no C++ type or
 * exception crosses this line. C99; includes only <stddef.h> and <stdint.h>; may be included with
 * <steward/policy.h> in one translation unit (distinct names throughout). Build against an installed
 * Steward with find_package(steward) and target_link_libraries(app steward::runtime); a C program
 * links with the C compiler alone (`cc app.c -lsteward`): libsteward.so records its C++ runtime.
 *
 * Ownership: strings this API returns (steward_generate's text, steward_metrics_json,
 * steward_metrics_prometheus, steward_metrics_table, steward_check_config's summary,
 * steward_detokenize's text) belong to the caller and are freed with steward_string_free; ids
 * steward_tokenize returns, with steward_ids_free; vectors steward_embed returns, with
 * steward_floats_free. Everything passed in is only read during the call
 * (a request's strings may be freed as soon as steward_submit returns). A steward_result and the
 * pieces handed to callbacks are views valid only while the callback runs: copy what you keep.
 *
 * Thread-safety: every function may be called from any thread at once, except steward_runtime_free,
 * which must not run concurrently with any other call on the same runtime. Callbacks run on runtime
 * threads; one request's callbacks never run concurrently with each other, but different requests'
 * callbacks may. A callback must return quickly and must not call steward_generate, steward_drain,
 * steward_embed or steward_runtime_free (they wait, so they would deadlock); steward_cancel,
 * steward_submit, steward_submit_ext, steward_end_session, steward_tokenize, steward_detokenize,
 * steward_config_generation and the steward_metrics_* functions are fine.
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
 *    steward_check_config, steward_runtime_start_with_options, steward_route_sighup_to_reload.
 * 3: steward_request_ext (stop strings, grammar / json_schema / json_object, top_logprobs, pool,
 *    logit_bias, penalties, parse_special, on_logprobs) with steward_submit_ext and steward_generate_ext;
 *    steward_result.top_logprobs; steward_tokenize, steward_detokenize, steward_ids_free;
 *    steward_embed, steward_floats_free; steward_request.max_tokens -1 (the rest of the context).
 *    Every API 2 struct and function is unchanged: a program built against API 2 runs as before. */
#define STEWARD_API_VERSION 3

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
    const char *response_format; /* NULL or "": none; "json": what the config's bucket rules match
                                    (classification only; the output is constrained by
                                    steward_request_ext's grammar, json_schema or json_object);
                                    anything else: STEWARD_ERR_INVALID_ARGUMENT */
    int32_t max_tokens;          /* 0: the config's limits.max_tokens_default; -1: the rest of the pool's context (API 3); >= -1 */
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

/* One alternative for an output position: a token id and its log-probability. API 3. */
typedef struct steward_token_logprob {
    int32_t id;
    float logprob; /* <= 0 */
} steward_token_logprob;

/* An output token's alternatives (steward_result.top_logprobs), most likely first. API 3. */
typedef struct steward_top_logprobs {
    const steward_token_logprob *items; /* n_items of them; NULL when n_items is 0 */
    size_t n_items;                     /* steward_request_ext.top_logprobs (fewer only if the vocabulary is smaller) */
} steward_top_logprobs;

/* Streamed log-probabilities (steward_request_ext.on_logprobs): called just before an on_token
 * that has ids, with those n_ids ids, each one's log-probability and, when the request asked for
 * top_logprobs, each one's alternatives (top NULL otherwise). Views valid only during the call; runs
 * as the token callback does (never concurrently with the request's other callbacks). API 3. */
typedef void (*steward_logprobs_cb)(const int32_t *ids, const float *logprobs, const steward_top_logprobs *top,
                                    size_t n_ids, void *user);

/* A token id and what is added to its logit before sampling (steward_request_ext.logit_bias). API 3. */
typedef struct steward_logit_bias {
    int32_t id;  /* of the serving pool's vocabulary; outside it the request finishes with an error */
    float bias;  /* [-100, 100]: -100 all but bans the id, +100 all but forces it */
} steward_logit_bias;

/* What a request asks beyond steward_request (the rest of the C++ GenerationRequest): passed with
 * it to steward_submit_ext / steward_generate_ext. Start from steward_request_ext_default(), which
 * sets size. Fields are only ever appended, and the library reads the first `size` bytes: a
 * program built against an older steward.h keeps working (the fields it does not know keep their
 * defaults); a size larger than the library's (built against a newer header) is
 * STEWARD_ERR_INVALID_ARGUMENT. The strings and arrays are copied by the call. API 3. */
typedef struct steward_request_ext {
    size_t size; /* sizeof(steward_request_ext) as the caller was compiled; steward_request_ext_default() sets it */
    /* Stop strings (at most 16, each 1-256 bytes): the output ends before the first occurrence of
     * any, also across tokens, with finish STOP; neither the text nor on_token includes it (text
     * that might begin one is held back until it cannot). */
    const char *const *stop;
    size_t n_stop;
    /* Structured output, at most one of the three (docs/structured-output.md); the output is
     * constrained token by token and the request ends (STOP) when the grammar allows nothing more.
     * grammar: GBNF (llama.cpp's), root rule `root`; json_schema: a JSON Schema as JSON text, the
     * output one JSON document valid against it; json_object non-zero: one JSON object. NULL or "":
     * none. An invalid grammar or schema is STEWARD_ERR_INVALID_ARGUMENT naming line:column or the
     * JSON pointer. */
    const char *grammar;
    const char *json_schema;
    int json_object;
    int32_t top_logprobs; /* 0-20: per output token, that many alternatives (steward_result.top_logprobs) */
    /* NULL or "": routed. Else served by this pool: still classified into a bucket (its figures),
     * but no routing policy, upgrade or shadow runs; an unknown pool finishes with an error naming
     * the pools. */
    const char *pool;
    const steward_logit_bias *logit_bias; /* n_logit_bias entries (at most 1024); may be NULL when 0 */
    size_t n_logit_bias;
    float presence_penalty;  /* OpenAI's, [-2, 2]: minus this for every id already output */
    float frequency_penalty; /* OpenAI's, [-2, 2]: minus this times the id's output count */
    int parse_special;       /* non-zero: special-token spellings in the prompt (<|im_start|>) are those tokens */
    steward_logprobs_cb on_logprobs; /* NULL: none. Streamed logprobs, with steward_submit_ext's `user` */
} steward_request_ext;

/* The defaults: size set, everything else 0/NULL (none of the above). Thread-safe. API 3. */
steward_request_ext steward_request_ext_default(void);

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
 * never NULL (possibly ""). Fields are only ever appended (the library owns this struct), so a
 * program built against an older header reads the fields it knows. */
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
    /* With steward_request_ext.top_logprobs > 0: row i holds output token i's alternatives
     * (n_top_logprobs == n_tokens); else NULL and 0. API 3 */
    const steward_top_logprobs *top_logprobs;
    size_t n_top_logprobs;
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
 * n_prompt_ids > 0, prompt NULL with n_prompt_ids 0, a prompt that is not UTF-8, max_tokens < -1, temperature < 0, top_p outside (0, 1], top_k < 0, a
 * response_format other than NULL, "" or "json"),
 * STEWARD_ERR_OUT_OF_MEMORY, STEWARD_ERR_INTERNAL. Overload, timeout and generation errors are not
 * returned here: they arrive as the result's status. Thread-safe. */
steward_status steward_submit(steward_runtime *rt, const steward_request *req, steward_token_cb on_token,
                              steward_finish_cb on_finish, void *user, uint64_t *out_handle);

/* steward_submit with the fields of steward_request_ext (ext NULL: none, as steward_submit), and
 * the reason for a refusal: when err is not NULL and err_len > 0, err holds a NUL-terminated message
 * naming the field, the value and the rule (truncated to err_len - 1 bytes), "" on success.
 * Errors (no callback will run): as steward_submit, and STEWARD_ERR_INVALID_ARGUMENT for an ext
 * whose size is 0 or larger than the library's, stop NULL with n_stop > 0 or a NULL stop string,
 * logit_bias NULL with n_logit_bias > 0, and any field outside its range above (more than 16 stop
 * strings or one of 0 or over 256 bytes, top_logprobs outside 0-20, a penalty outside [-2, 2], a
 * bias outside [-100, 100] or a negative id, two of grammar / json_schema / json_object, a grammar
 * or schema that does not compile). Compiling a grammar or schema runs on the calling thread
 * (compiled once: the run reuses it). Thread-safe; callable from a callback (better without a
 * grammar or schema there: its compile would hold up that runtime thread). API 3. */
steward_status steward_submit_ext(steward_runtime *rt, const steward_request *req, const steward_request_ext *ext,
                                  steward_token_cb on_token, steward_finish_cb on_finish, void *user,
                                  uint64_t *out_handle, char *err, size_t err_len);

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

/* steward_generate with the fields of steward_request_ext (ext NULL: none; its on_logprobs is not
 * called: nothing streams). Returns, errors and thread-safety as steward_generate; an invalid ext as
 * steward_submit_ext (err says why). API 3. */
steward_status steward_generate_ext(steward_runtime *rt, const steward_request *req, const steward_request_ext *ext,
                                    char **out_text, steward_request_metrics *out_metrics, char *err, size_t err_len);

/* Drops a session's pinned KV now (otherwise it expires after limits.session_ttl_ms). Unknown
 * sessions are ignored. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt or session NULL),
 * STEWARD_ERR_INTERNAL. Thread-safe; callable from a callback. */
steward_status steward_end_session(steward_runtime *rt, const char *session);

/* Registers tenant's document `id` (docs/reuse.md; a new version when it exists): its text, version (0:
 * the current + 1), ttl_s (0: never expires) and acl (n_acl permission labels; 0: the whole tenant).
 * *out_version (may be NULL) gets the version stored. Errors: STEWARD_ERR_INVALID_ARGUMENT (a NULL
 * argument, or the store refused: a version not above the current one, an invalid id, label or
 * text, a bound; err says which), STEWARD_ERR_INTERNAL. Thread-safe. */
steward_status steward_put_document(steward_runtime *rt, const char *tenant, const char *id, const char *text,
                                    uint64_t version, double ttl_s, const char *const *acl, size_t n_acl,
                                    uint64_t *out_version, char *err, size_t err_len);
/* Removes tenant's document `id`. Errors: STEWARD_ERR_INVALID_ARGUMENT (a NULL argument),
 * STEWARD_ERR_NOT_FOUND (no such document). Thread-safe. */
steward_status steward_remove_document(steward_runtime *rt, const char *tenant, const char *id);

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

/* Text -> token ids with a pool's tokenizer (pool NULL or "": the config's first pool); add_special
 * non-zero: BOS when the vocabulary wants it. On success *out_ids holds *out_n ids (NULL when 0) the
 * caller frees with steward_ids_free. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt, text, out_ids or
 * out_n NULL, text not UTF-8, an unknown pool: err names it), STEWARD_ERR_OUT_OF_MEMORY,
 * STEWARD_ERR_INTERNAL; then *out_ids is NULL and *out_n 0. Thread-safe; callable from a callback.
 * API 3. */
steward_status steward_tokenize(steward_runtime *rt, const char *pool, const char *text, int add_special,
                                int32_t **out_ids, size_t *out_n, char *err, size_t err_len);

/* Token ids -> text with a pool's tokenizer (pool NULL or "": the first pool). On success *out_text
 * is NUL-terminated (*out_len bytes when out_len is not NULL; the text may hold NUL bytes) and the
 * caller frees it with steward_string_free. Errors: STEWARD_ERR_INVALID_ARGUMENT (rt or out_text
 * NULL, ids NULL with n_ids > 0, an unknown pool, an id outside the vocabulary: err says which),
 * STEWARD_ERR_OUT_OF_MEMORY, STEWARD_ERR_INTERNAL; then *out_text is NULL. Thread-safe; callable
 * from a callback. API 3. */
steward_status steward_detokenize(steward_runtime *rt, const char *pool, const int32_t *ids, size_t n_ids,
                                  char **out_text, size_t *out_len, char *err, size_t err_len);

/* Frees ids steward_tokenize returned. NULL is a no-op. Thread-safe. API 3. */
void steward_ids_free(int32_t *ids);

/* Embeds n_texts texts (Runtime::embed): one unit-length vector each, the pool's model's final-norm
 * hidden states pooled as the pool declares ([[pool]] pooling, else the GGUF's, else last token;
 * docs/http-api.md#embeddings), computed on the pool's embedding thread, beside its engine. pool
 * NULL or "": the first pool that can embed (a cpu pool). On success *out_vectors holds
 * n_texts x *out_n_embd floats, row i text i's vector, that the caller frees with
 * steward_floats_free; *out_prompt_tokens (when not NULL) the inputs' tokens together.
 * Errors: STEWARD_ERR_INVALID_ARGUMENT (rt, texts, out_vectors or out_n_embd NULL, n_texts 0, a
 * NULL, empty or non-UTF-8 text, a text past the pool's context, an unknown pool, a pool that
 * cannot embed: simulated, remote or cuda; err names which and why), STEWARD_ERR_GENERATION (the
 * runtime stopped, or the model changed under the forward), STEWARD_ERR_OUT_OF_MEMORY,
 * STEWARD_ERR_INTERNAL; then *out_vectors is NULL and *out_n_embd 0. Thread-safe; must not be
 * called from a callback (it waits for the embedding). API 3. */
steward_status steward_embed(steward_runtime *rt, const char *pool, const char *const *texts, size_t n_texts,
                             float **out_vectors, size_t *out_n_embd, int64_t *out_prompt_tokens, char *err,
                             size_t err_len);

/* Frees vectors steward_embed returned. NULL is a no-op. Thread-safe. API 3. */
void steward_floats_free(float *p);

/* Frees a string this API returned. NULL is a no-op. Thread-safe. */
void steward_string_free(char *s);

#ifdef __cplusplus
}
#endif

#endif /* STEWARD_H */
