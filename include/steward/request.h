// steward/request.h (public): what a caller asks and gets back: a generation request, its
// callbacks, its result and figures. Plain value types (copy freely; not synchronised: one thread
// at a time per object), shared by the embedding API (steward/runtime.h) and the runtime's cores.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <steward/finish_reason.h>

namespace steward {

// The pool a prompt is rendered for (GenerationRequest::render): what a chat template needs of it.
struct PromptPool {
    std::string name;
    std::string chat_template;         // the pool's ([[pool]] chat_template_file), else the GGUF's; "" none
    std::string template_source;       // where it came from, for traces: "chat_template_file PATH",
                                       // "config chat_template", "GGUF tokenizer.chat_template" or "none"
    std::string bos_token, eos_token;  // their text ("" when the vocabulary has none)
};

// The prompt as rendered for one pool (what GenerationRequest::render returns).
struct PoolPrompt {
    std::string text;     // encoded with that pool's tokenizer (add_bos, parse_special as the request says)
    std::string grammar;  // non-empty: GBNF constraining the output on that pool (e.g. a tool call in its
                          // template's format); it replaces the request's grammar / json_schema / json_object
    std::string error;    // non-empty: that pool cannot serve the request; a run routed there finishes ERROR with it
    // Where in `text` the request's documents are (GenerationRequest::documents, placed by the
    // renderer): bytes [documents_begin, documents_end). Their KV, and the prompt's before them, gets
    // reuse priority in the pool; blocks from documents_begin on are dropped when a document changes
    // (docs/reuse.md). Equal: none.
    size_t documents_begin = 0;
    size_t documents_end = 0;
};

// A registered document a request references (Runtime::put_document; docs/reuse.md).
struct DocumentReference {
    std::string id;
    uint64_t version = 0;  // 0: the current one; another than the current is refused
};

// What to generate, for Runtime::submit / generate. The defaults are a greedy request of the
// config's default length for tenant "default".
struct GenerationRequest {
    std::string prompt;               // text; ignored when prompt_ids is non-empty
    std::vector<int32_t> prompt_ids;  // token ids of the routed pool's vocabulary
    std::string tenant = "default";
    std::string session;              // non-empty: the conversation's KV stays pinned between turns
    std::string bucket_hint;          // e.g. "short_qa"; the config's rules decide
    int max_tokens = 0;               // 0: the config's limits.max_tokens_default; -1: the rest of the pool's context
    float temperature = 0.0f;         // 0: greedy
    float top_p = 1.0f;
    int top_k = 0;
    uint64_t seed = 0;
    bool tools = false;               // tools present (an agent turn)
    std::string response_format;      // "" or "json": what the bucket rules match (classification);
                                      // anything else finishes with ERROR. The output is constrained
                                      // by the three fields below, not by this one.
    // Structured output (at most one of the three; the output is constrained token by token):
    // grammar: GBNF text (llama.cpp's), root rule `root`; json_schema: a JSON Schema as JSON text,
    // the output one JSON document valid against it; json_object: the output is one JSON object.
    // An invalid grammar or schema finishes with ERROR naming the position (line:column or JSON
    // pointer) and the fix. A constrained request ends (STOP) when the grammar allows nothing more.
    std::string grammar;
    std::string json_schema;
    bool json_object = false;
    bool add_bos = true;              // prepend BOS when the vocabulary wants it
    bool parse_special = false;       // special-token spellings in the prompt text (<|im_start|>) are
                                      // those tokens: a rendered chat template
    bool ignore_eos = false;          // generate max_tokens even past end-of-sequence (benchmarks)
    // Non-empty: served by this pool (an OpenAI `model` naming a pool). The request is still
    // classified into a bucket (its figures), but no routing policy, upgrade or shadow runs.
    std::string pool;
    // Stop strings (at most 16, each 1-256 bytes): the output ends before the first occurrence of any,
    // also across token boundaries, with finish STOP; neither the text nor on_token includes it (text
    // that might begin one is held back until it cannot).
    std::vector<std::string> stop;
    int top_logprobs = 0;             // 0-20: the most likely alternatives per output token (result)
    float presence_penalty = 0.0f;    // OpenAI's, in [-2, 2]: minus this for every id already output
    float frequency_penalty = 0.0f;   // OpenAI's, in [-2, 2]: minus this times the id's output count
    std::vector<std::pair<int32_t, float>> logit_bias;  // id -> added to its logit, in [-100, 100]
    // Non-null: the prompt depends on the pool that runs it (a chat, rendered with each pool's own
    // template; pools may differ in template and vocabulary), and `prompt` / `prompt_ids` are
    // ignored. The runtime classifies and routes first, then runs each pool's own rendering,
    // tokenized once with that pool's tokenizer. Routing needs token ids before it knows the pool:
    // the router's prefix-cache lookup renders every pool that has a prefix cache (per-candidate
    // rendering), and the bucket rules' prompt_tokens is the first pool's rendering's count (an
    // estimate when the routed pool renders otherwise). Called on a runtime thread, at most once
    // per pool of the request's config generation; it must be thread-safe, return quickly and not
    // call the runtime's waiting members (generate, drain, ~Runtime).
    std::function<PoolPrompt(const PromptPool& pool)> render;
    // Registered documents (docs/reuse.md) the prompt uses: the runtime puts them, sorted by id, each
    // once, before `prompt` (a text prompt), so requests naming the same documents share their KV;
    // with a render callback the renderer places them itself and says where (PoolPrompt::
    // documents_begin / documents_end). Either way their KV gets reuse priority and is dropped when
    // one of them changes. A reference the caller's `labels` do not cover (the document's acl), an
    // unknown or expired one, or an old version finishes the request with ERROR naming the document.
    std::vector<DocumentReference> documents;
    std::vector<std::string> labels;
    // What reuse the caller did for this request (a JSON object, e.g. the documents and cached tool
    // results it used): shown in its decision trace under "reuse". "" none.
    std::string reuse_trace;
};

// What reuse beyond the prefix did for one request (docs/reuse.md), recorded per bucket with
// Runtime::record_reuse by the layer that resolves documents and tool results (the HTTP server).
struct ReuseCounts {
    int64_t document_hits = 0;               // documents a request referenced and was served
    int64_t document_saved_prefill_tokens = 0;  // prompt tokens of those documents found cached
    int64_t document_refused_permission = 0; // references refused (403: labels do not cover the acl)
    int64_t document_expired = 0;            // references to an expired document (404)
    int64_t tool_hits = 0;                   // calls answered from the tool-result cache (resolved or hinted)
    int64_t tool_round_trips_saved = 0;      // calls resolved in the same request (no client round trip)
    int64_t tool_resolved_tokens_saved = 0;  // prompt tokens the continuations found cached (no re-prefill)
    int64_t tool_stale_refused = 0;          // cached results too old to serve
    std::vector<double> tool_age_at_use_s;   // each hit's age
};

// One alternative for an output position: a token id and its log-probability.
struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// The request's own figures (docs/metrics.md), filled in the finish callback.
struct RequestMetrics {
    double ttft_ms = -1;       // arrival -> first token handed to the caller (-1: none)
    double e2e_ms = 0;
    double queue_ms = -1;      // arrival -> first scheduled
    double tpot_ms = -1;       // (last - first token) / (n - 1); -1 for fewer than 2 tokens
    int prompt_tokens = 0;
    int cached_tokens = 0;     // prompt tokens served from the prefix cache or the session
    int completion_tokens = 0;
    int recomputed_tokens = 0; // recomputed after preemption
    double cost = 0;           // from the pool's prices
    uint64_t config_generation = 0;
};

// A finished request, handed to on_finish exactly once (also on error, cancel, timeout, overload).
struct GenerationResult {
    uint64_t id = 0;                // the RequestHandle submit returned
    std::string text;               // the whole output (possibly cut short by the finish)
    std::vector<int32_t> tokens;    // the output's ids
    std::vector<float> logprobs;    // one per token: log-probability of the sampled id
    // With top_logprobs > 0: per output token, that many alternatives, most likely first.
    std::vector<std::vector<TokenLogprob>> top_logprobs;
    FinishReason finish = FinishReason::STOP;  // as text: finish_reason_name(finish)
    std::string error;          // empty unless finish is ERROR, TIMEOUT, OVERLOADED or CANCELLED
    std::string bucket, pool;   // pool: the one that answered
    bool upgraded = false;      // started on a cheaper pool, answered by a stronger one
    bool fallback = false;      // a routing plugin's decision was rejected; the bucket's pool served it
    RequestMetrics metrics;
    bool ok() const { return finish_reason_ok(finish); }
};

// How a submitted request reports back. Both run on runtime threads; one request's callbacks never
// run concurrently with each other. They must return quickly and must not call Runtime::generate,
// drain or ~Runtime (those wait for callbacks).
struct RequestCallbacks {
    // A piece of text (complete UTF-8 characters only) and the ids that produced it. May be null.
    std::function<void(const std::string& piece, const std::vector<int32_t>& ids)> on_token;
    // Exactly once per submitted request, also on error, cancel, timeout or overload.
    std::function<void(const GenerationResult&)> on_finish;
    // The pool whose run the answer comes from, before that run's first on_token (and again should
    // the answer move to another pool, e.g. a retry after its worker was lost). May be null.
    std::function<void(const std::string& pool)> on_pool;
    // Just before an on_token with ids: each id's log-probability and (with top_logprobs) its
    // alternatives, as GenerationResult::logprobs / top_logprobs hold them. May be null.
    std::function<void(const std::vector<int32_t>& ids, const std::vector<float>& logprobs,
                       const std::vector<std::vector<TokenLogprob>>& top)>
        on_logprobs;
};

}  // namespace steward
