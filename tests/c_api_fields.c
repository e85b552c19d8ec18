/* Every field of the C API's request (steward_request_ext, API 3), one check each, through
 * libsteward.so from C, on a real trained model (TinyStories-656K, F32) against llama.cpp's greedy
 * ids (shared/testdata/real/greedy.tsv), never against the API's own earlier output.
 * steward_embed against llama.cpp's llama-embedding vectors (tests/data/embeddings).
 * Run: build/c_api_fields $PWD/../shared/testdata $PWD/tests/data/embeddings/llama_embedding.tsv WORK_DIR
 * (absolute paths; ctest runs it as c_api_request_fields). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <steward/steward.h>

static int n_failed = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "c_api_fields: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            n_failed++;                                                              \
        }                                                                            \
    } while (0)

#define MAX_TOKENS 64
#define MAX_TOP 20

/* What a finished request left, copied in its finish callback (the result is a view). */
typedef struct outcome {
    int n_finish_calls;
    steward_status status;
    steward_result_finish finish;
    char text[4096];
    char streamed[4096]; /* the on_token pieces, concatenated */
    char error[1024];
    char pool[64];
    char bucket[64];
    int32_t tokens[MAX_TOKENS];
    float logprobs[MAX_TOKENS];
    int n_tokens;
    steward_token_logprob top[MAX_TOKENS][MAX_TOP];
    int n_top[MAX_TOKENS];
    int n_top_rows;
    /* What on_logprobs streamed, in order. */
    int32_t streamed_ids[MAX_TOKENS];
    float streamed_logprobs[MAX_TOKENS];
    steward_token_logprob streamed_top[MAX_TOKENS]; /* each token's first alternative */
    int n_streamed;
    int n_streamed_top_rows;
    steward_request_metrics metrics;
} outcome;

static void copy_str(char *dst, size_t cap, const char *src, size_t n) {
    if (n > cap - 1) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void on_token(const char *piece, size_t piece_len, const int32_t *ids, size_t n_ids, void *user) {
    outcome *o = (outcome *)user;
    size_t have = strlen(o->streamed);
    (void)ids;
    (void)n_ids;
    copy_str(o->streamed + have, sizeof o->streamed - have, piece, piece_len);
}

static void on_logprobs(const int32_t *ids, const float *logprobs, const steward_top_logprobs *top, size_t n_ids,
                        void *user) {
    outcome *o = (outcome *)user;
    size_t i;
    for (i = 0; i < n_ids && o->n_streamed < MAX_TOKENS; i++, o->n_streamed++) {
        o->streamed_ids[o->n_streamed] = ids[i];
        o->streamed_logprobs[o->n_streamed] = logprobs ? logprobs[i] : 1.0f;
        if (top && top[i].n_items > 0) {
            o->streamed_top[o->n_streamed] = top[i].items[0];
            o->n_streamed_top_rows++;
        }
    }
}

static void on_finish(const steward_result *r, void *user) {
    outcome *o = (outcome *)user;
    size_t i, j;
    o->n_finish_calls++;
    o->status = r->status;
    o->finish = r->finish;
    copy_str(o->text, sizeof o->text, r->text, r->text_len);
    copy_str(o->error, sizeof o->error, r->error, strlen(r->error));
    copy_str(o->pool, sizeof o->pool, r->pool, strlen(r->pool));
    copy_str(o->bucket, sizeof o->bucket, r->bucket, strlen(r->bucket));
    o->n_tokens = (int)(r->n_tokens < MAX_TOKENS ? r->n_tokens : MAX_TOKENS);
    for (i = 0; i < (size_t)o->n_tokens; i++) {
        o->tokens[i] = r->tokens[i];
        o->logprobs[i] = r->logprobs[i];
    }
    o->n_top_rows = (int)(r->n_top_logprobs < MAX_TOKENS ? r->n_top_logprobs : MAX_TOKENS);
    for (i = 0; i < (size_t)o->n_top_rows; i++) {
        o->n_top[i] = (int)(r->top_logprobs[i].n_items < MAX_TOP ? r->top_logprobs[i].n_items : MAX_TOP);
        for (j = 0; j < (size_t)o->n_top[i]; j++) o->top[i][j] = r->top_logprobs[i].items[j];
    }
    o->metrics = r->metrics;
}

/* Submits one request and waits for it (steward_drain orders its callbacks before the reads). */
static steward_status run(steward_runtime *rt, const steward_request *req, const steward_request_ext *ext, outcome *o) {
    char err[1024];
    steward_status s;
    memset(o, 0, sizeof *o);
    s = steward_submit_ext(rt, req, ext, on_token, on_finish, o, NULL, err, sizeof err);
    if (s != STEWARD_OK) {
        copy_str(o->error, sizeof o->error, err, strlen(err));
        return s;
    }
    CHECK(steward_drain(rt) == STEWARD_OK);
    CHECK(o->n_finish_calls == 1);
    if (o->status != STEWARD_OK) fprintf(stderr, "c_api_fields: request finished %d: %s\n", (int)o->status, o->error);
    return o->status;
}

/* llama.cpp's reference for one prompt of the F32 model: its prompt ids (BOS first) and 32 greedy ids. */
typedef struct reference {
    char prompt[256];
    int32_t prompt_ids[64];
    int n_prompt_ids;
    int32_t greedy[64];
    int n_greedy;
} reference;

static int parse_ids(char *s, int32_t *out, int cap) {
    int n = 0;
    char *tok = strtok(s, " ");
    while (tok && n < cap) {
        out[n++] = (int32_t)atoi(tok);
        tok = strtok(NULL, " ");
    }
    return n;
}

static int read_references(const char *path, reference *refs, int cap) {
    char line[4096];
    int n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        char *file = line, *prompt, *pids, *gids;
        line[strcspn(line, "\r\n")] = '\0';
        if (!(prompt = strchr(file, '\t'))) continue;
        *prompt++ = '\0';
        if (!(pids = strchr(prompt, '\t'))) continue;
        *pids++ = '\0';
        if (!(gids = strchr(pids, '\t'))) continue;
        *gids++ = '\0';
        if (strcmp(file, "TinyStories-656K.f32.gguf") != 0) continue;
        copy_str(refs[n].prompt, sizeof refs[n].prompt, prompt, strlen(prompt));
        refs[n].n_prompt_ids = parse_ids(pids, refs[n].prompt_ids, 64);
        refs[n].n_greedy = parse_ids(gids, refs[n].greedy, 64);
        n++;
    }
    fclose(f);
    return n;
}

static int same_ids(const int32_t *a, const int32_t *b, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* How many of the first n ids already occurred earlier among them. */
static int n_repeats(const int32_t *ids, int n) {
    int i, j, r = 0;
    for (i = 1; i < n; i++)
        for (j = 0; j < i; j++)
            if (ids[j] == ids[i]) {
                r++;
                break;
            }
    return r;
}

/* ---- a small JSON parser: does the whole text hold exactly one JSON value (RFC 8259)? */

static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static const char *json_value(const char *p, int depth);

static const char *json_string(const char *p) {
    if (*p != '"') return NULL;
    for (p++; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                int i;
                for (i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i]) return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *json_number(const char *p) {
    const char *start;
    if (*p == '-') p++;
    if (*p == '0') {
        p++;
    } else {
        start = p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == start) return NULL;
    }
    if (*p == '.') {
        start = ++p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == start) return NULL;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        start = p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == start) return NULL;
    }
    return p;
}

static const char *json_value(const char *p, int depth) {
    if (depth > 64) return NULL;
    p = json_ws(p);
    if (*p == '{' || *p == '[') {
        const char close = *p == '{' ? '}' : ']';
        const int object = *p == '{';
        p = json_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (object) {
                if (!(p = json_string(json_ws(p)))) return NULL;
                p = json_ws(p);
                if (*p++ != ':') return NULL;
            }
            if (!(p = json_value(p, depth + 1))) return NULL;
            p = json_ws(p);
            if (*p == close) return p + 1;
            if (*p++ != ',') return NULL;
        }
    }
    if (*p == '"') return json_string(p);
    if (strncmp(p, "true", 4) == 0) return p + 4;
    if (strncmp(p, "false", 5) == 0) return p + 5;
    if (strncmp(p, "null", 4) == 0) return p + 4;
    return json_number(p);
}

static int json_parses(const char *text) {
    const char *end = json_value(text, 0);
    return end && *json_ws(end) == '\0';
}

/* The text without JSON whitespace (for documents whose strings hold none). */
static void strip_ws(const char *in, char *out, size_t cap) {
    size_t n = 0;
    for (; *in && n + 1 < cap; in++)
        if (!strchr(" \t\r\n", *in)) out[n++] = *in;
    out[n] = '\0';
}

/* llama.cpp's mean-pooled, normalised vectors for the F32 model's first n prompts. */
typedef struct embedding_reference {
    char prompt[512];
    float vec[256];
    int n;
} embedding_reference;

static int read_embedding_references(const char *path, embedding_reference *refs, int cap) {
    static char line[16384];
    int n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        char *cols[5];
        char *p = line, *tok;
        int i;
        line[strcspn(line, "\r\n")] = '\0';
        for (i = 0; i < 5 && p; i++) {
            cols[i] = p;
            p = strchr(p, '\t');
            if (p) *p++ = '\0';
        }
        if (i < 5 || strcmp(cols[0], "TinyStories-656K.f32.gguf") != 0 || strcmp(cols[1], "mean") != 0) continue;
        if (strlen(cols[2]) >= sizeof refs[n].prompt) continue;
        copy_str(refs[n].prompt, sizeof refs[n].prompt, cols[2], strlen(cols[2]));
        refs[n].n = 0;
        for (tok = strtok(cols[4], " "); tok && refs[n].n < 256; tok = strtok(NULL, " ")) refs[n].vec[refs[n].n++] = (float)atof(tok);
        n++;
    }
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    char path[1024], err[1024];
    reference refs[8];
    int n_refs, i;
    FILE *f;
    steward_runtime *rt = NULL;
    steward_request req;
    steward_request_ext ext;
    outcome o, o2;
    char greedy_text[4096];
    const reference *once;

    if (argc != 4) {
        fprintf(stderr, "usage: c_api_fields TESTDATA_DIR LLAMA_EMBEDDING_TSV WORK_DIR\n");
        return 2;
    }
    snprintf(path, sizeof path, "%s/real/greedy.tsv", argv[1]);
    n_refs = read_references(path, refs, 8);
    if (n_refs < 3) {
        fprintf(stderr, "c_api_fields: %s: expected 3 rows for TinyStories-656K.f32.gguf, found %d\n", path, n_refs);
        return 1;
    }
    once = &refs[0]; /* "Once upon a time": its greedy text repeats ids (94 1030 94 1030 ...) */

    /* Two pools: "story" (the real model; no prefix cache, so that cached tokens come from a
     * session alone) serves the default bucket; "tiny" (a synthetic model with byte tokens, which
     * can spell JSON) only when pinned. */
    snprintf(path, sizeof path, "%s/c_api_fields.toml", argv[3]);
    f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "c_api_fields: cannot write %s\n", path);
        return 1;
    }
    fprintf(f,
            "[limits]\nrequest_timeout_ms = 120000\nsession_ttl_ms = 600000\nmax_tokens_default = 32\n\n"
            "[[pool]]\nname = \"story\"\nmodel = \"%s/real/TinyStories-656K.f32.gguf\"\nthreads = 1\n"
            "kv_blocks = 128\nblock_size = 16\nmax_batch = 8\nmax_batch_tokens = 256\nprefix_cache = false\n"
            "pooling = \"mean\"\n\n"
            "[[pool]]\nname = \"tiny\"\nmodel = \"%s/c_api_fields_tiny.gguf\"\nthreads = 1\nkv_blocks = 128\n"
            "block_size = 16\nmax_batch = 8\nmax_batch_tokens = 256\n"
            "[pool.synth]\ndim = 64\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 128\nvocab = 512\nctx = 1024\nseed = 7\n\n"
            "[[bucket]]\nname = \"short\"\npool = \"story\"\n[bucket.match]\nhint = \"short_qa\"\n\n"
            "[[bucket]]\nname = \"agent\"\npool = \"story\"\n[bucket.match]\ntools = true\n\n"
            "[[bucket]]\nname = \"structured\"\npool = \"story\"\n[bucket.match]\nresponse_format = \"json\"\n\n"
            "[[bucket]]\nname = \"default\"\npool = \"story\"\n",
            argv[1], argv[3]);
    fclose(f);
    if (steward_runtime_start(path, &rt, err, sizeof err) != STEWARD_OK) {
        fprintf(stderr, "c_api_fields: cannot start %s: %s\n", path, err);
        return 1;
    }
    CHECK(steward_api_version() == 3 && STEWARD_API_VERSION == 3);

    /* tokenize: llama.cpp's prompt ids for every reference prompt (BOS added). */
    for (i = 0; i < n_refs; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(steward_tokenize(rt, NULL, refs[i].prompt, 1, &ids, &n, err, sizeof err) == STEWARD_OK);
        CHECK((int)n == refs[i].n_prompt_ids && same_ids(ids, refs[i].prompt_ids, (int)n));
        steward_ids_free(ids);
    }
    {
        int32_t *ids = NULL;
        size_t n = 7;
        CHECK(steward_tokenize(rt, "nope", "hi", 1, &ids, &n, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
        CHECK(ids == NULL && n == 0 && strstr(err, "nope") != NULL);
    }
    /* detokenize: the text of llama.cpp's greedy ids, the reference for the texts below. */
    {
        char *text = NULL;
        size_t len = 0;
        int32_t bad = 1 << 20;
        CHECK(steward_detokenize(rt, "story", once->greedy, (size_t)once->n_greedy, &text, &len, err, sizeof err) == STEWARD_OK);
        CHECK(text != NULL && len == strlen(text) && len > 40);
        copy_str(greedy_text, sizeof greedy_text, text ? text : "", text ? len : 0);
        steward_string_free(text);
        CHECK(steward_detokenize(rt, NULL, &bad, 1, &text, &len, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
        CHECK(text == NULL);
        printf("greedy reference: \"%s\"\n", greedy_text);
    }

    /* Greedy through steward_submit_ext with the defaults: llama.cpp's ids, for every prompt. */
    for (i = 0; i < n_refs; i++) {
        req = steward_request_default();
        req.prompt = refs[i].prompt;
        req.max_tokens = refs[i].n_greedy;
        ext = steward_request_ext_default();
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.n_tokens == refs[i].n_greedy && same_ids(o.tokens, refs[i].greedy, refs[i].n_greedy));
        CHECK(strcmp(o.pool, "story") == 0);
        CHECK(o.n_top_rows == 0); /* none asked */
    }

    /* stop: the greedy text cut before the first occurrence of a stop string; the streamed pieces
     * hold neither it nor anything after it. */
    {
        const char *stops[2];
        char stop[16], want[4096];
        const char *at;
        copy_str(stop, sizeof stop, greedy_text + strlen(greedy_text) / 2, 6);
        at = strstr(greedy_text, stop);
        copy_str(want, sizeof want, greedy_text, (size_t)(at - greedy_text));
        stops[0] = "zebra-never";
        stops[1] = stop;
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = once->n_greedy;
        ext = steward_request_ext_default();
        ext.stop = stops;
        ext.n_stop = 2;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.finish == STEWARD_RESULT_STOP);
        CHECK(strcmp(o.text, want) == 0);
        CHECK(strcmp(o.streamed, want) == 0);
        printf("stop \"%s\": \"%s\"\n", stop, o.text);
        /* Refused at the edge: NULL entries, an empty string, more than 16. */
        stops[0] = NULL;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "stop[0]") != NULL);
        stops[0] = "";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "1 to 256 bytes") != NULL);
        ext.n_stop = 17;
        ext.stop = NULL;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    /* logit_bias: -100 on the greedy first id changes the first token; +100 on an id forces it at
     * every position. */
    {
        steward_logit_bias bias[1];
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 4;
        ext = steward_request_ext_default();
        bias[0].id = once->greedy[0];
        bias[0].bias = -100.0f;
        ext.logit_bias = bias;
        ext.n_logit_bias = 1;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.n_tokens == 4 && o.tokens[0] != once->greedy[0]);
        bias[0].id = 1000;
        bias[0].bias = 100.0f;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.n_tokens == 4);
        for (i = 0; i < o.n_tokens; i++) CHECK(o.tokens[i] == 1000);
        bias[0].bias = 101.0f;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "100") != NULL);
        ext.logit_bias = NULL;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    /* grammar (GBNF): the output is one of the sentences it allows, and the request ends there. */
    {
        const char *allowed[4] = {"The cat was happy.", "The cat was sad.", "The dog was happy.", "The dog was sad."};
        int matched = 0;
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 32;
        ext = steward_request_ext_default();
        ext.grammar = "root ::= \"The \" (\"cat\" | \"dog\") \" was \" (\"happy\" | \"sad\") \".\"";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.finish == STEWARD_RESULT_STOP);
        for (i = 0; i < 4; i++) matched |= strcmp(o.text, allowed[i]) == 0;
        CHECK(matched);
        printf("grammar: \"%s\"\n", o.text);
        ext.grammar = "root ::= \"unterminated";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "1:") != NULL);
        /* At most one of grammar, json_schema, json_object. */
        ext.grammar = "root ::= \"a\"";
        ext.json_object = 1;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    /* json_schema: on the real model a boolean (its vocabulary cannot spell braces); on the
     * byte-level synthetic pool an object with a required boolean, which parses and matches. */
    {
        char compact[4096];
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 16;
        ext = steward_request_ext_default();
        ext.json_schema = "{\"type\": \"boolean\"}";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.finish == STEWARD_RESULT_STOP && json_parses(o.text));
        strip_ws(o.text, compact, sizeof compact);
        CHECK(strcmp(compact, "true") == 0 || strcmp(compact, "false") == 0);
        ext.json_schema = "{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, \"required\": [\"ok\"], "
                          "\"additionalProperties\": false}";
        ext.pool = "tiny";
        req.max_tokens = 200;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.finish == STEWARD_RESULT_STOP && json_parses(o.text));
        strip_ws(o.text, compact, sizeof compact);
        CHECK(strcmp(compact, "{\"ok\":true}") == 0 || strcmp(compact, "{\"ok\":false}") == 0);
        printf("json_schema: %s\n", o.text);
        ext.json_schema = "{\"type\": \"object\", \"required\": 7}";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "required") != NULL);
    }

    /* json_object: one JSON object on the synthetic pool; on the real model, whose vocabulary
     * cannot spell '{' (shared/testdata/real/README.md), an error saying so, not a hang. The random
     * weights' greedy path loops inside a string; penalties break the loop so the object closes. */
    {
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 400;
        ext = steward_request_ext_default();
        ext.json_object = 1;
        ext.pool = "tiny";
        ext.frequency_penalty = 1.0f;
        ext.presence_penalty = 1.0f;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.finish == STEWARD_RESULT_STOP && json_parses(o.text) && o.text[0] == '{');
        printf("json_object: %d tokens, finish %d\n", o.n_tokens, (int)o.finish);
        ext.pool = NULL;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_GENERATION);
        CHECK(o.finish == STEWARD_RESULT_ERROR && strstr(o.error, "grammar") != NULL);
    }

    /* top_logprobs: per output token, sorted, the greedy (llama.cpp's) pick first, log-probabilities
     * <= 0 whose probabilities sum to at most 1, and the sampled token's logprob the top one's. */
    {
        int ok_sorted = 1, ok_pick = 1, ok_range = 1, ok_sum = 1, ok_rows = 1;
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 12;
        ext = steward_request_ext_default();
        ext.top_logprobs = 5;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.n_tokens == 12 && o.n_top_rows == 12);
        for (i = 0; i < o.n_top_rows; i++) {
            double sum = 0;
            int j;
            ok_rows &= o.n_top[i] == 5;
            ok_pick &= o.top[i][0].id == once->greedy[i] && o.tokens[i] == once->greedy[i];
            ok_pick &= fabsf(o.top[i][0].logprob - o.logprobs[i]) < 1e-4f;
            for (j = 0; j < o.n_top[i]; j++) {
                ok_range &= o.top[i][j].logprob <= 0.0f;
                if (j > 0) ok_sorted &= o.top[i][j].logprob <= o.top[i][j - 1].logprob;
                sum += exp(o.top[i][j].logprob);
            }
            ok_sum &= sum <= 1.0 + 1e-4;
        }
        CHECK(ok_rows);
        CHECK(ok_sorted);
        CHECK(ok_pick);
        CHECK(ok_range);
        CHECK(ok_sum);
        /* on_logprobs streams the same figures, token by token, before each piece. */
        ext.on_logprobs = on_logprobs;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.n_streamed == o.n_tokens && o.n_streamed_top_rows == o.n_tokens);
        for (i = 0; i < o.n_streamed; i++) {
            CHECK(o.streamed_ids[i] == once->greedy[i]);
            CHECK(o.streamed_logprobs[i] == o.logprobs[i]);
            CHECK(o.streamed_top[i].id == o.top[i][0].id && o.streamed_top[i].logprob == o.top[i][0].logprob);
        }
        ext.top_logprobs = 0;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK && o.n_streamed == o.n_tokens && o.n_streamed_top_rows == 0);
        ext.top_logprobs = 21;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "top_logprobs") != NULL);
    }

    /* Penalties: llama.cpp's greedy text repeats ids among its first 24; with a penalty it repeats
     * fewer, and the output leaves the greedy path. */
    {
        const int n = 24;
        const int greedy_repeats = n_repeats(once->greedy, n);
        CHECK(greedy_repeats >= 4);
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = n;
        ext = steward_request_ext_default();
        ext.frequency_penalty = 2.0f;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.n_tokens == n && !same_ids(o.tokens, once->greedy, n));
        CHECK(n_repeats(o.tokens, n) < greedy_repeats);
        printf("frequency_penalty 2: %d repeats among the first %d (greedy: %d)\n", n_repeats(o.tokens, n), n, greedy_repeats);
        ext = steward_request_ext_default();
        ext.presence_penalty = 2.0f;
        CHECK(run(rt, &req, &ext, &o2) == STEWARD_OK);
        CHECK(o2.n_tokens == n && !same_ids(o2.tokens, once->greedy, n));
        CHECK(n_repeats(o2.tokens, n) < greedy_repeats);
        printf("presence_penalty 2: %d repeats among the first %d\n", n_repeats(o2.tokens, n), n);
        ext.presence_penalty = 2.5f;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "presence_penalty") != NULL);
    }

    /* pool: the result names the pinned pool; routed requests go to the default bucket's; an
     * unknown pool finishes with an error naming the pools. */
    {
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 4;
        ext = steward_request_ext_default();
        ext.pool = "tiny";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK && strcmp(o.pool, "tiny") == 0);
        ext.pool = "story";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK && strcmp(o.pool, "story") == 0);
        CHECK(o.n_tokens == 4 && same_ids(o.tokens, once->greedy, 4));
        ext.pool = "nope";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_GENERATION && strstr(o.error, "nope") != NULL);
    }

    /* Sessions: the second turn (the first turn's prompt and output, as ids, and more) is served
     * from the session's KV, and continues llama.cpp's greedy ids exactly; without the session (no
     * prefix cache on this pool) nothing is cached; after steward_end_session neither. */
    {
        int32_t turn2[128];
        const int n1 = 16;
        int n2 = 0;
        req = steward_request_default();
        req.prompt_ids = once->prompt_ids;
        req.n_prompt_ids = (size_t)once->n_prompt_ids;
        req.add_bos = 0;
        req.max_tokens = n1;
        req.session = "c-fields-session";
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && o.metrics.cached_tokens == 0);
        CHECK(o.n_tokens == n1 && same_ids(o.tokens, once->greedy, n1));
        memcpy(turn2, once->prompt_ids, sizeof(int32_t) * (size_t)once->n_prompt_ids);
        n2 = once->n_prompt_ids;
        memcpy(turn2 + n2, once->greedy, sizeof(int32_t) * (size_t)n1);
        n2 += n1;
        req.prompt_ids = turn2;
        req.n_prompt_ids = (size_t)n2;
        req.max_tokens = once->n_greedy - n1;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK);
        CHECK(o.metrics.cached_tokens >= once->n_prompt_ids + n1 - 1);
        CHECK(o.n_tokens == once->n_greedy - n1 && same_ids(o.tokens, once->greedy + n1, once->n_greedy - n1));
        printf("session turn 2: %d of %d prompt tokens cached\n", o.metrics.cached_tokens, o.metrics.prompt_tokens);
        req.session = NULL;
        CHECK(run(rt, &req, NULL, &o2) == STEWARD_OK && o2.metrics.cached_tokens == 0);
        CHECK(steward_end_session(rt, "c-fields-session") == STEWARD_OK);
        req.session = "c-fields-session";
        CHECK(run(rt, &req, NULL, &o2) == STEWARD_OK && o2.metrics.cached_tokens == 0);
        CHECK(steward_end_session(rt, "c-fields-session") == STEWARD_OK);
    }

    /* parse_special: "<|start_story|>" in the text is the BOS token (its spelling in this GGUF), so
     * the prompt is llama.cpp's ids exactly (a space prefix after a special token, as llama.cpp
     * adds) and the output its greedy ids; without it the spelling is plain text (which this
 * vocabulary, trained on such text, spells with a token of its own). */
    {
        char prompt[300];
        snprintf(prompt, sizeof prompt, "<|start_story|>%s", once->prompt);
        req = steward_request_default();
        req.prompt = prompt;
        req.add_bos = 0;
        req.max_tokens = 8;
        ext = steward_request_ext_default();
        ext.parse_special = 1;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK);
        CHECK(o.metrics.prompt_tokens == once->n_prompt_ids && same_ids(o.tokens, once->greedy, 8));
        ext.parse_special = 0;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK && o.metrics.prompt_tokens != once->n_prompt_ids);
    }

    /* The classification fields (steward_request, API 1): each lands its request in the bucket the
     * config's rules name; a JSON constraint classifies as response_format "json". */
    {
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 2;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && strcmp(o.bucket, "default") == 0);
        req.bucket_hint = "short_qa";
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && strcmp(o.bucket, "short") == 0);
        req.bucket_hint = NULL;
        req.tools = 1;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && strcmp(o.bucket, "agent") == 0);
        req.tools = 0;
        req.response_format = "json";
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && strcmp(o.bucket, "structured") == 0);
        req.response_format = NULL;
        ext = steward_request_ext_default();
        ext.json_schema = "{\"type\": \"boolean\"}";
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK && strcmp(o.bucket, "structured") == 0);
    }

    /* max_tokens -1: the rest of the context, so an ignore_eos request ends by length exactly there
     * (the model's 512 positions less the prompt's). */
    {
        req = steward_request_default();
        req.prompt_ids = once->prompt_ids;
        req.n_prompt_ids = (size_t)once->n_prompt_ids;
        req.add_bos = 0;
        req.max_tokens = -1;
        req.ignore_eos = 1;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && o.finish == STEWARD_RESULT_LENGTH);
        CHECK(o.metrics.completion_tokens == 512 - once->n_prompt_ids);
        req.max_tokens = -2;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "max_tokens") != NULL);
    }

    /* Sampling fields: top_k 1 at temperature 1 is greedy whatever the seed (llama.cpp's ids); a
     * seed makes sampling repeatable. */
    {
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 16;
        req.temperature = 1.0f;
        req.top_k = 1;
        req.seed = 12345;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && same_ids(o.tokens, once->greedy, 16));
        req.top_k = 0;
        CHECK(run(rt, &req, NULL, &o) == STEWARD_OK && o.n_tokens == 16);
        CHECK(run(rt, &req, NULL, &o2) == STEWARD_OK && o2.n_tokens == 16 && same_ids(o.tokens, o2.tokens, 16));
        CHECK(!same_ids(o.tokens, once->greedy, 16));
    }

    /* The struct's size: a caller built against an older header (a shorter struct) gets the
     * defaults for what it does not pass; size 0 or larger than the library's is refused. */
    {
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = 8;
        ext = steward_request_ext_default();
        CHECK(ext.size == sizeof(steward_request_ext));
        ext.size = offsetof(steward_request_ext, top_logprobs);
        ext.top_logprobs = 99; /* beyond size: not read */
        ext.frequency_penalty = 99.0f;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_OK && o.n_top_rows == 0 && same_ids(o.tokens, once->greedy, 8));
        ext.size = 0;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT && strstr(o.error, "size") != NULL);
        ext.size = sizeof(steward_request_ext) + 8;
        CHECK(run(rt, &req, &ext, &o) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    /* steward_generate_ext: the blocking path takes the same fields (stop, here). */
    {
        char *text = NULL;
        const char *stops[1];
        char stop[16], want[4096];
        steward_request_metrics m;
        copy_str(stop, sizeof stop, greedy_text + strlen(greedy_text) / 3, 5);
        copy_str(want, sizeof want, greedy_text, (size_t)(strstr(greedy_text, stop) - greedy_text));
        stops[0] = stop;
        req = steward_request_default();
        req.prompt = once->prompt;
        req.max_tokens = once->n_greedy;
        ext = steward_request_ext_default();
        ext.stop = stops;
        ext.n_stop = 1;
        CHECK(steward_generate_ext(rt, &req, &ext, &text, &m, err, sizeof err) == STEWARD_OK);
        CHECK(text != NULL && strcmp(text, want) == 0);
        steward_string_free(text);
        text = NULL;
        ext.top_logprobs = -1;
        CHECK(steward_generate_ext(rt, &req, &ext, &text, &m, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
        CHECK(text == NULL && strstr(err, "top_logprobs") != NULL);
    }

    /* steward_embed: llama.cpp's mean-pooled unit vectors (cosine >= 0.9999), two texts in one call;
     * an unknown pool is refused naming it. */
    {
        static embedding_reference erefs[2];
        const char *texts[2];
        float *vecs = NULL;
        size_t n_embd = 0;
        int64_t n_prompt = 0;
        int k;
        CHECK(read_embedding_references(argv[2], erefs, 2) == 2);
        texts[0] = erefs[0].prompt;
        texts[1] = erefs[1].prompt;
        CHECK(steward_embed(rt, "story", texts, 2, &vecs, &n_embd, &n_prompt, err, sizeof err) == STEWARD_OK);
        CHECK(vecs != NULL && (int)n_embd == erefs[0].n && n_prompt > 0);
        for (k = 0; vecs && k < 2 && (int)n_embd == erefs[k].n; k++) {
            double dot = 0, na = 0, nb = 0;
            size_t j;
            for (j = 0; j < n_embd; j++) {
                dot += (double)vecs[(size_t)k * n_embd + j] * erefs[k].vec[j];
                na += (double)vecs[(size_t)k * n_embd + j] * vecs[(size_t)k * n_embd + j];
                nb += (double)erefs[k].vec[j] * erefs[k].vec[j];
            }
            CHECK(fabs(sqrt(na) - 1.0) < 1e-4);
            CHECK(dot / sqrt(na * nb) >= 0.9999);
            printf("embed \"%s\": cosine %.6f with llama.cpp's\n", erefs[k].prompt, dot / sqrt(na * nb));
        }
        steward_floats_free(vecs);
        vecs = NULL;
        CHECK(steward_embed(rt, "nope", texts, 1, &vecs, &n_embd, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
        CHECK(vecs == NULL && n_embd == 0 && strstr(err, "nope") != NULL);
        CHECK(steward_embed(rt, NULL, texts, 0, &vecs, &n_embd, NULL, err, sizeof err) == STEWARD_ERR_INVALID_ARGUMENT);
    }

    steward_runtime_free(rt);
    if (n_failed) {
        fprintf(stderr, "c_api_fields: %d check(s) failed\n", n_failed);
        return 1;
    }
    printf("c_api_fields: all checks passed\n");
    return 0;
}
