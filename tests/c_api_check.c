/* Proves steward.h is plain C (compiled as C99 with -Wpedantic -Werror) and that the C API works
 * end to end through libsteward.so: config check, start (with options), generate, submit with
 * callbacks (typed finish, upgraded/fallback flags, ignore_eos), cancel, sessions, reload and the
 * config generation, metrics (JSON, Prometheus, table), free.
 * Run: build/c_api_check configs/test_tiny.toml (ctest runs it as c_api_runs). */
#include <stdio.h>
#include <string.h>

#include <steward/steward.h>

static int n_failed = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "c_api_check: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            n_failed++;                                                             \
        }                                                                           \
    } while (0)

/* One per request: its callbacks never run concurrently, and steward_drain orders them before reads. */
typedef struct request_state {
    int n_token_calls;
    size_t n_piece_bytes;
    int n_finish_calls;
    steward_status status;
    steward_result_finish finish;
    int upgraded, fallback;
    char finish_reason[32];
    int n_tokens;
    int cached_tokens;
} request_state;

static void on_token(const char *piece, size_t piece_len, const int32_t *ids, size_t n_ids, void *user) {
    request_state *st = (request_state *)user;
    (void)ids;
    (void)n_ids;
    if (piece && strlen(piece) <= piece_len) st->n_piece_bytes += piece_len;
    st->n_token_calls++;
}

static void on_finish(const steward_result *r, void *user) {
    request_state *st = (request_state *)user;
    st->n_finish_calls++;
    st->status = r->status;
    st->finish = r->finish;
    st->upgraded = r->upgraded;
    st->fallback = r->fallback;
    strncpy(st->finish_reason, r->finish_reason, sizeof st->finish_reason - 1);
    st->finish_reason[sizeof st->finish_reason - 1] = '\0';
    st->n_tokens = (int)r->n_tokens;
    st->cached_tokens = r->metrics.cached_tokens;
}

int main(int argc, char **argv) {
    char err[512];
    steward_runtime *rt = NULL;
    steward_request req;
    steward_request_metrics m;
    request_state a, b, c, d, e;
    char *text = NULL;
    char *json = NULL;
    uint64_t handle = 0;
    int32_t bad_ids[1];

    if (argc != 2) {
        fprintf(stderr, "usage: c_api_check CONFIG.toml\n");
        return 2;
    }
    CHECK(steward_api_version() == STEWARD_API_VERSION);
    CHECK(strcmp(steward_status_name(STEWARD_ERR_OVERLOADED), "STEWARD_ERR_OVERLOADED") == 0);

    /* Start errors: NULL arguments, a missing config. */
    CHECK(steward_runtime_start(NULL, &rt, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
    CHECK(steward_runtime_start("/nonexistent/steward.toml", &rt, err, sizeof err) == STEWARD_ERR_CONFIG);
    CHECK(rt == NULL && strstr(err, "/nonexistent/steward.toml") != NULL);

    /* Config check: a summary the caller frees, or the error naming the file. */
    CHECK(steward_check_config(argv[1], &text, err, sizeof err) == STEWARD_OK);
    CHECK(text != NULL && strstr(text, "ok") != NULL);
    steward_string_free(text);
    text = NULL;
    CHECK(steward_check_config("/nonexistent/steward.toml", &text, err, sizeof err) == STEWARD_ERR_CONFIG);
    CHECK(text == NULL && strstr(err, "/nonexistent/steward.toml") != NULL);
    CHECK(steward_check_config(NULL, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);

    /* Options: malformed public prefixes are refused, naming the entry. */
    {
        steward_public_prefix prefixes[1];
        steward_runtime_options opts;
        memset(&opts, 0, sizeof opts);
        opts.n_public_prefixes = 1;
        CHECK(steward_runtime_start_with_options(argv[1], &opts, &rt, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
        prefixes[0].name = "";
        prefixes[0].text = "You are a careful agent.";
        opts.public_prefixes = prefixes;
        CHECK(steward_runtime_start_with_options(argv[1], &opts, &rt, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
        CHECK(rt == NULL && strstr(err, "public_prefixes[0]") != NULL);
        prefixes[0].name = "system";
        steward_route_sighup_to_reload(); /* the process now reloads its runtimes on SIGHUP */
        if (steward_runtime_start_with_options(argv[1], &opts, &rt, err, sizeof err) != STEWARD_OK) {
            fprintf(stderr, "c_api_check: cannot start: %s\n", err);
            return 1;
        }
    }
    {
        uint64_t gen = 0;
        CHECK(steward_config_generation(rt, &gen) == STEWARD_OK && gen == 1);
        CHECK(steward_config_generation(rt, NULL) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    /* Blocking generation. */
    req = steward_request_default();
    req.prompt = "The quick brown fox";
    req.max_tokens = 8;
    CHECK(steward_generate(rt, &req, &text, &m, err, sizeof err) == STEWARD_OK);
    CHECK(text != NULL);
    CHECK(m.prompt_tokens > 0 && m.completion_tokens > 0);
    printf("generate: \"%s\" (%d prompt tokens, %d completion tokens)\n", text ? text : "", m.prompt_tokens,
           m.completion_tokens);
    steward_string_free(text);
    text = NULL;

    /* Invalid arguments are refused before anything runs. */
    CHECK(steward_generate(rt, &req, NULL, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
    req.top_p = 0.0f;
    CHECK(steward_submit(rt, &req, NULL, NULL, NULL, &handle) == STEWARD_ERR_INVALID_ARGUMENT);
    req = steward_request_default();
    req.prompt_ids = NULL;
    req.n_prompt_ids = 1;
    CHECK(steward_submit(rt, &req, NULL, NULL, NULL, &handle) == STEWARD_ERR_INVALID_ARGUMENT);
    CHECK(steward_submit(NULL, &req, NULL, NULL, NULL, &handle) == STEWARD_ERR_INVALID_ARGUMENT);
    req = steward_request_default();
    req.prompt = "hello";
    req.response_format = "yaml"; /* not implemented: refused up front, naming the value */
    CHECK(steward_submit(rt, &req, NULL, NULL, NULL, &handle) == STEWARD_ERR_INVALID_ARGUMENT);
    CHECK(steward_generate(rt, &req, &text, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err, "yaml") != NULL);
    /* No prompt at all, or bytes that are not UTF-8: refused, naming the field. */
    req = steward_request_default();
    req.prompt = NULL;
    CHECK(steward_generate(rt, &req, &text, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err, "prompt is NULL") != NULL);
    req.prompt = "caf\xc3"; /* cut inside a character */
    CHECK(steward_generate(rt, &req, &text, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err, "not valid UTF-8 (byte 3") != NULL);
    req.prompt = "\xff\xfe";
    CHECK(steward_submit(rt, &req, NULL, NULL, NULL, &handle) == STEWARD_ERR_INVALID_ARGUMENT);

    /* A generation error arrives as the result's status: a prompt past the model's context. */
    req = steward_request_default();
    bad_ids[0] = 5;
    req.prompt_ids = bad_ids;
    req.n_prompt_ids = 1;
    req.max_tokens = 100000;
    CHECK(steward_generate(rt, &req, &text, NULL, err, sizeof err) == STEWARD_ERR_GENERATION);
    CHECK(strstr(err, "context") != NULL);
    steward_string_free(text);
    text = NULL;

    /* Asynchronous submit with callbacks; a session's second turn reuses its KV. */
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    req = steward_request_default();
    req.prompt = "You are a careful agent. Call the weather tool for Paris, then summarise.";
    req.session = "c-session";
    req.tools = 1;
    req.max_tokens = 12;
    CHECK(steward_submit(rt, &req, on_token, on_finish, &a, &handle) == STEWARD_OK);
    CHECK(handle != 0);
    CHECK(steward_drain(rt) == STEWARD_OK);
    CHECK(a.n_finish_calls == 1 && a.status == STEWARD_OK);
    CHECK(a.finish == STEWARD_RESULT_STOP || a.finish == STEWARD_RESULT_LENGTH);
    CHECK(strcmp(a.finish_reason, a.finish == STEWARD_RESULT_STOP ? "stop" : "length") == 0);
    CHECK(a.upgraded == 0 && a.fallback == 0); /* one pool, routed by rules */
    CHECK(a.n_token_calls > 0);
    CHECK(steward_cancel(rt, handle) == STEWARD_ERR_NOT_FOUND); /* already finished */

    req.prompt = "You are a careful agent. Call the weather tool for Paris, then summarise. Tool: 18C, sunny.";
    CHECK(steward_submit(rt, &req, on_token, on_finish, &b, &handle) == STEWARD_OK);
    CHECK(steward_drain(rt) == STEWARD_OK);
    CHECK(b.n_finish_calls == 1 && b.status == STEWARD_OK);
    CHECK(b.cached_tokens > 0);
    printf("session turn 2: %d cached prompt tokens\n", b.cached_tokens);
    CHECK(steward_end_session(rt, "c-session") == STEWARD_OK);
    CHECK(steward_end_session(rt, NULL) == STEWARD_ERR_INVALID_ARGUMENT);
    {
        uint64_t gen = 0;
        char rerr[256];
        CHECK(steward_reload(rt, &gen, rerr, sizeof rerr) == STEWARD_OK);
        CHECK(gen == 2);
        gen = 0;
        CHECK(steward_config_generation(rt, &gen) == STEWARD_OK && gen == 2);
        CHECK(steward_reload(NULL, &gen, rerr, sizeof rerr) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    /* Cancel right after submit: exactly one finish, cancelled unless it already ended. */
    req = steward_request_default();
    req.prompt = "Count slowly";
    req.max_tokens = 400;
    CHECK(steward_submit(rt, &req, on_token, on_finish, &c, &handle) == STEWARD_OK);
    CHECK(steward_cancel(rt, handle) == STEWARD_OK || c.n_finish_calls == 1);
    CHECK(steward_drain(rt) == STEWARD_OK);
    CHECK(c.n_finish_calls == 1);
    CHECK(c.status == STEWARD_ERR_CANCELLED || c.status == STEWARD_OK);
    CHECK((c.status == STEWARD_ERR_CANCELLED) == (c.finish == STEWARD_RESULT_CANCELLED));

    /* ignore_eos: exactly max_tokens tokens, finished by length (never by end-of-sequence). */
    memset(&e, 0, sizeof e);
    req = steward_request_default();
    req.prompt = "Once upon a time";
    req.max_tokens = 24;
    req.ignore_eos = 1;
    CHECK(steward_submit(rt, &req, NULL, on_finish, &e, &handle) == STEWARD_OK);
    CHECK(steward_drain(rt) == STEWARD_OK);
    CHECK(e.n_finish_calls == 1 && e.status == STEWARD_OK);
    CHECK(e.finish == STEWARD_RESULT_LENGTH && strcmp(e.finish_reason, "length") == 0);
    CHECK(e.n_tokens == 24);
    printf("cancelled request: %s after %d tokens\n", c.finish_reason, c.n_tokens);

    /* Metrics: a JSON document the caller frees. */
    CHECK(steward_metrics_json(rt, &json) == STEWARD_OK);
    CHECK(json != NULL && strstr(json, "\"buckets\"") != NULL);
    steward_string_free(json);
    CHECK(steward_metrics_json(rt, NULL) == STEWARD_ERR_INVALID_ARGUMENT);
    /* ... the same figures as Prometheus text and as a table. */
    CHECK(steward_metrics_prometheus(rt, &text) == STEWARD_OK);
    CHECK(text != NULL && strstr(text, "# TYPE steward_") != NULL && strstr(text, "bucket=\"agent\"") != NULL);
    steward_string_free(text);
    text = NULL;
    CHECK(steward_metrics_prometheus(NULL, &text) == STEWARD_ERR_INVALID_ARGUMENT && text == NULL);
    CHECK(steward_metrics_table(rt, &text) == STEWARD_OK);
    CHECK(text != NULL && strstr(text, "agent") != NULL);
    steward_string_free(text);
    text = NULL;
    CHECK(steward_metrics_table(rt, NULL) == STEWARD_ERR_INVALID_ARGUMENT);

    /* Freeing with a request in flight cancels it; its finish callback has run when free returns. */
    memset(&d, 0, sizeof d);
    req = steward_request_default();
    req.prompt = "Keep talking";
    req.max_tokens = 400;
    CHECK(steward_submit(rt, &req, on_token, on_finish, &d, &handle) == STEWARD_OK);
    steward_runtime_free(rt);
    CHECK(d.n_finish_calls == 1);
    CHECK(d.status == STEWARD_ERR_CANCELLED || d.status == STEWARD_OK);
    steward_runtime_free(NULL);
    if (n_failed) {
        fprintf(stderr, "c_api_check: %d check(s) failed\n", n_failed);
        return 1;
    }
    printf("c_api_check: all checks passed\n");
    return 0;
}
