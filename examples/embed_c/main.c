/* embed_c: the C API from an installed Steward (find_package(steward), steward::runtime), in C99.
 * Starts a runtime from a TOML file, streams one request's tokens, prints its typed finish reason,
 * upgraded/fallback flags and figures, then the runtime's metrics as Prometheus text. Exits 1 on
 * any failure.
 *   build/embed_c configs/test_tiny.toml [PROMPT] */
#include <stdio.h>
#include <string.h>

#include <steward/steward.h>

/* Filled by the callbacks (one request: they never run concurrently; steward_drain orders them
 * before main reads). */
typedef struct stream_state {
    size_t n_ids;
    size_t n_bytes;
    int n_finish_calls;
    steward_status status;
    steward_result_finish finish;
    int upgraded, fallback;
    size_t n_tokens, text_len;
    char finish_reason[16];
    char error[256];
    steward_request_metrics metrics;
} stream_state;

static void on_token(const char *piece, size_t piece_len, const int32_t *ids, size_t n_ids, void *user) {
    stream_state *st = (stream_state *)user;
    (void)piece;
    (void)ids;
    st->n_ids += n_ids;
    st->n_bytes += piece_len;
    printf("token: %zu id(s), %zu byte(s)\n", n_ids, piece_len);
}

/* The result is a view valid only here: copy what is kept. */
static void on_finish(const steward_result *r, void *user) {
    stream_state *st = (stream_state *)user;
    st->n_finish_calls++;
    st->status = r->status;
    st->finish = r->finish;
    st->upgraded = r->upgraded;
    st->fallback = r->fallback;
    st->n_tokens = r->n_tokens;
    st->text_len = r->text_len;
    st->metrics = r->metrics;
    strncpy(st->finish_reason, r->finish_reason, sizeof st->finish_reason - 1);
    strncpy(st->error, r->error, sizeof st->error - 1);
}

static const char *finish_name(steward_result_finish f) {
    switch (f) {
        case STEWARD_RESULT_STOP: return "STEWARD_RESULT_STOP";
        case STEWARD_RESULT_LENGTH: return "STEWARD_RESULT_LENGTH";
        case STEWARD_RESULT_CANCELLED: return "STEWARD_RESULT_CANCELLED";
        case STEWARD_RESULT_TIMEOUT: return "STEWARD_RESULT_TIMEOUT";
        case STEWARD_RESULT_ERROR: return "STEWARD_RESULT_ERROR";
        case STEWARD_RESULT_OVERLOADED: return "STEWARD_RESULT_OVERLOADED";
    }
    return "unknown";
}

int main(int argc, char **argv) {
    char err[512];
    steward_runtime *rt = NULL;
    steward_request req;
    stream_state st;
    uint64_t handle = 0;
    char *prom = NULL;
    steward_status s;
    int ok;

    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: embed_c CONFIG.toml [PROMPT]\n");
        return 2;
    }
    if (steward_api_version() != STEWARD_API_VERSION) {
        fprintf(stderr, "embed_c: built against C API %d, linked with %d\n", STEWARD_API_VERSION, steward_api_version());
        return 1;
    }
    if ((s = steward_runtime_start(argv[1], &rt, err, sizeof err)) != STEWARD_OK) {
        fprintf(stderr, "embed_c: %s: %s\n", steward_status_name(s), err);
        return 1;
    }
    printf("started %s (C API %d)\n", argv[1], steward_api_version());

    memset(&st, 0, sizeof st);
    req = steward_request_default();
    req.prompt = argc == 3 ? argv[2] : "Once upon a time";
    req.max_tokens = 16;
    req.ignore_eos = 1; /* exactly max_tokens tokens, so the output below is checkable */
    if ((s = steward_submit(rt, &req, on_token, on_finish, &st, &handle)) != STEWARD_OK ||
        (s = steward_drain(rt)) != STEWARD_OK) {
        fprintf(stderr, "embed_c: %s\n", steward_status_name(s));
        steward_runtime_free(rt);
        return 1;
    }
    printf("request %llu: status %s, finish %s (%s), upgraded %d, fallback %d\n", (unsigned long long)handle,
           steward_status_name(st.status), st.finish_reason, finish_name(st.finish), st.upgraded, st.fallback);
    printf("metrics: prompt_tokens=%d completion_tokens=%d cached_tokens=%d ttft_ms=%.2f e2e_ms=%.2f\n",
           st.metrics.prompt_tokens, st.metrics.completion_tokens, st.metrics.cached_tokens, st.metrics.ttft_ms,
           st.metrics.e2e_ms);
    ok = st.n_finish_calls == 1 && st.status == STEWARD_OK && st.finish == STEWARD_RESULT_LENGTH &&
         st.n_tokens == 16 && st.n_ids == st.n_tokens && st.n_bytes == st.text_len;
    if (!ok) fprintf(stderr, "embed_c: unexpected result (error: \"%s\")\n", st.error);
    else printf("streamed %zu tokens, %zu bytes: the result agrees\n", st.n_ids, st.n_bytes);

    /* The runtime's figures in the Prometheus text format: the caller frees the string. */
    if ((s = steward_metrics_prometheus(rt, &prom)) != STEWARD_OK) {
        fprintf(stderr, "embed_c: steward_metrics_prometheus: %s\n", steward_status_name(s));
        ok = 0;
    } else {
        const char *line = prom;
        while (*line) {
            const char *end = strchr(line, '\n');
            const size_t n = end ? (size_t)(end - line) : strlen(line);
            if (strncmp(line, "steward_generation_tokens_total", 31) == 0 ||
                strncmp(line, "steward_request_success_total", 29) == 0 ||
                strncmp(line, "steward_config_generation ", 26) == 0)
                printf("%.*s\n", (int)n, line);
            line += n + (end ? 1 : 0);
        }
        steward_string_free(prom);
    }
    steward_runtime_free(rt);
    if (!ok) return 1;
    printf("embed_c: OK\n");
    return 0;
}
