// The OpenAI-compatible API as plain values (no sockets, no Boost): request bodies parsed and
// validated into OpenAiRequest (an error names the field), the `model` field resolved to a pool or
// bucket, the prompt rendered, and every response body (objects, SSE chunks, errors) built as JSON.
// The HTTP server (http_server.cpp) moves bytes; everything it answers is decided here.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <steward/config.h>
#include <steward/expected.h>
#include <steward/request.h>
#include <steward/runtime.h>

#include "reuse/document_store.h"
#include "reuse/tool_cache.h"
#include "serve/reasoning.h"
#include "serve/tool_calls.h"

namespace steward::serve {

// obj[key] where obj is an object holding a string there, else "": what obj.value(key, "") gives
// for a well-formed body, without throwing where a client sent another type ({"type": 6}) or a
// non-object.
template <class Json>
std::string string_field(const Json& obj, const char* key) {
    if (!obj.is_object()) return {};
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->template get<std::string>() : std::string();
}

// An answer that is not a success: the HTTP status and OpenAI's error object
// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;
    std::string code;
};
std::string error_body(const ApiError& e);

// What a /v1/chat/completions or /v1/completions body asks, validated: the GenerationRequest it
// runs as (the fields the runtime reads are parsed into it, nothing copied between them), plus what
// only the transport reads (n, stream, echo, the chat's messages and tools, the reuse references).
// Defaults are OpenAI's (temperature 1). to_generation_request hands the base on with the prompt,
// tenant and target filled in.
struct OpenAiRequest : GenerationRequest {
    OpenAiRequest() { temperature = 1.0f; }
    bool chat = false;
    std::string model;
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // chat: as sent (the template sees them)
    std::optional<nlohmann::ordered_json> tool_specs;                    // chat: OpenAI `tools`, as sent (base `tools`: present)
    bool prompt_is_ids = false;        // completion: prompt given as an array of integers (prompt_ids)
    // completion: a batch ("prompt": ["a", "b"] or [[1, 2], [3]]): every prompt (prompt / prompt_ids
    // hold the first). Choice index = prompt index x n + choice, as OpenAI numbers them.
    std::vector<std::string> batch_prompts;
    std::vector<std::vector<int32_t>> batch_ids;
    int n_prompts() const { return std::max<int>(1, (int)std::max(batch_prompts.size(), batch_ids.size())); }
    // This request for prompt p of the batch alone (p = 0 without a batch).
    OpenAiRequest for_prompt(int p) const;
    int n = 1;
    bool logprobs = false;             // chat: logprobs true; completion: logprobs N given (top_logprobs = N)
    std::string user;
    bool stream = false;
    bool include_usage = false;        // stream_options.include_usage
    bool echo = false;                 // completion: the prompt text precedes the output
    // chat: OpenAI tool_choice: "none" (the output is not parsed for calls), "auto" (unconstrained),
    // "required" or "function" (tool_choice_name): the output is constrained to one call, see apply_tool_choice.
    std::string tool_choice = "auto";
    std::string tool_choice_name;
    // chat: extra variables for the chat template (vLLM's extension), e.g. {"enable_thinking": false}
    nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
    // chat: llama-server's reasoning_format: "auto" / "deepseek" split a thinking template's
    // <think>...</think> into message.reasoning_content (serve/reasoning.h); "none" leaves it in content.
    std::string reasoning_format = "auto";
    // Reuse beyond the prefix (docs/reuse.md). document_refs: the "documents" field's references
    // and the messages' {"type": "document"} content parts (removed from the messages), in order;
    // resolved by the server into resolved_documents (the base's `documents` once resolved).
    // `labels` (the base's): the caller's own permission labels (the tenant's key must allow them).
    // tool_cache: "off", "hint" (a call to a cached tool carries the cached result) or "resolve"
    // (answered in the same request). tool_policies: tools declaring {"cache": {...}}, by name.
    std::vector<reuse::DocumentRef> document_refs;
    std::string tool_cache = "off";
    std::map<std::string, reuse::ToolCachePolicy> tool_policies;
    // Set by the server once the references resolved: rendered after the system prompt (render_prompt).
    std::vector<std::shared_ptr<const reuse::Document>> resolved_documents;
};

// Limits on what one request may ask (the runtime's own bounds, checked here to answer 400 early).
inline constexpr int k_max_n = 16;
inline constexpr int k_max_stop = 16;
inline constexpr size_t k_max_stop_bytes = 256;
inline constexpr int k_max_json_depth = 64;
inline constexpr int k_max_prompts = 32;        // prompts in one /v1/completions batch
inline constexpr int k_max_batch_choices = 64;  // prompts x n

// Parses a body (chat = /v1/chat/completions); nullopt with err filled when it is refused. Malformed JSON, nesting deeper than
// k_max_json_depth, a wrong type or an out-of-range value is a 400 whose param names the field;
// response_format is {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict"}}; a top-level `grammar` (GBNF) is llama.cpp's. The
// schema or grammar is compiled here (cached): an invalid one is a 400 naming the position (JSON
// pointer or line:column) and the fix, code invalid_json_schema / invalid_grammar. Unknown fields
// are ignored, as OpenAI's server does.
std::optional<OpenAiRequest> parse_openai_request(std::string_view body, bool chat, ApiError& err);
// Parses any JSON body with the depth bound above; nullopt (and err filled) when malformed.
std::optional<nlohmann::json> parse_json_body(std::string_view body, ApiError& err);

// The `model` field: "steward" (or empty) routes; a pool's name pins the pool; a bucket's name is
// the bucket hint. Anything else is a 404 with code "model_not_found".
struct ModelTarget {
    std::string pool;         // non-empty: pinned
    std::string bucket_hint;  // non-empty: a bucket name
};
inline constexpr const char* k_routed_model = "steward";
std::optional<ModelTarget> resolve_model(const std::string& model, const std::vector<PoolInfo>& pools,
                                         const Config& config, ApiError& err);
// GET /v1/models: every pool first (steward_kind "pool", root: its model file, max_model_len: its
// context), then the routes: "steward" (steward_kind "routed") and every bucket ("bucket").
nlohmann::json models_list(const std::vector<PoolInfo>& pools, const Config& config, int64_t created);

// The chat prompt for a pool: its template rendered over the messages (and tools), with the
// generation prompt. A pool without a template (PoolInfo::chat_template empty; [[pool]]
// chat_template_fallback = "chatml" gives it ChatML's) is an error naming chat_template_file.
Expected<std::string> render_prompt(const PoolInfo& pool, const OpenAiRequest& req);
// Where the documents lie in a rendered prompt: [begin, end) byte offsets from the first document
// (its <document ...> header, or its text when the template rendered them its own way) to the last
// one's end; nullopt without documents or when the template did not render them.
std::optional<std::pair<size_t, size_t>> documents_span(const std::string& prompt,
                                                        const std::vector<std::shared_ptr<const reuse::Document>>& docs);

// With tool_choice "required" or a named function: `grammar` becomes the pool's tool-call grammar
// (serve/tool_calls.h tool_call_gbnf: exactly one call in the template's format, its arguments
// matching the function's parameters schema). False with a 400 in err when it cannot be built
// (a template with no tool-call format, a parameters schema the grammar compiler refuses).
bool apply_tool_choice(OpenAiRequest& req, const PoolInfo& pool, ApiError& err);

// A chat's prompt for one pool: render_prompt with that pool's template and, with tool_choice
// "required" or a function, that template's tool-call grammar (apply_tool_choice's). A pool that
// cannot take the chat gives `error`: its 400 (code template_error on messages, or invalid_value on
// tool_choice), text and grammar empty.
struct PoolRendering {
    std::string text, grammar;
    std::optional<ApiError> error;
};
PoolRendering render_for_pool(const OpenAiRequest& req, const PoolInfo& pool);

// One chat's renderings, rendered after routing: the runtime asks for the prompt of the pool it
// routed the chat to (and of the candidates whose prefix cache the router weighs) through
// GenerationRequest::render, on its threads; the server reads what came of it when it answers.
// Each pool is rendered once for all n choices. Thread-safe.
class ChatRenderer {
public:
    explicit ChatRenderer(OpenAiRequest req) : req_(std::move(req)) {}
    // GenerationRequest::render: `pool`'s rendering (kept; an error is PoolPrompt::error).
    PoolPrompt render(const PromptPool& pool);
    // The pool as it was rendered for (name, template, BOS / EOS: what parse_choice_output and
    // StreamOutput read), nullopt when it never was.
    std::optional<PoolInfo> pool(const std::string& name) const;
    // The prompt text rendered for `name`, nullopt when it never was (or refused).
    std::optional<std::string> text(const std::string& name) const;
    // Why `name`'s rendering refused the chat, nullopt when it did not (or never ran).
    std::optional<ApiError> error(const std::string& name) const;

private:
    const OpenAiRequest req_;
    mutable std::mutex mu_;
    std::map<std::string, std::pair<PoolInfo, PoolRendering>, std::less<>> by_pool_;
};

// The runtime request of `req` (its n choices are Runtime::submit_choices', which samples choice i
// with seed + i; no seed given: 0). A completion's prompt is the request's; a chat's is
// rendered_prompt, or with a renderer, each pool's own rendering after routing.
GenerationRequest to_generation_request(const OpenAiRequest& req, const ModelTarget& target, const std::string& tenant,
                                        const std::string& rendered_prompt);
GenerationRequest to_generation_request(const OpenAiRequest& req, const ModelTarget& target, const std::string& tenant,
                                        std::shared_ptr<ChatRenderer> renderer);

// A finished choice's text split into content and tool calls (all of it content without tools in a
// chat request, with tool_choice "none", or when the pool's template has no tool-call format).
struct ChoiceOutput {
    std::string reasoning;  // reasoning_content (a thinking template's <think> block); has_reasoning: there was one
    bool has_reasoning = false;
    std::string content;
    nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI's [{id, type, function{name, arguments}}]
};
// With `tools` in a chat request, the output is parsed in the pool's chat-template format
// (serve/tool_calls.h: Llama 3 JSON / python_tag, Hermes and Qwen <tool_call>, Mistral [TOOL_CALLS]);
// id_seed makes the call ids (distinct per request and choice).
ChoiceOutput parse_choice_output(const OpenAiRequest& req, const PoolInfo* pool, const std::string& text,
                                 uint64_t id_seed = 0);
// The streaming twin: pieces in, delta objects out ({"content": ...} or {"tool_calls": [...]}). Text
// that may become a tool call is held back until decided; a call goes out in one delta.
class StreamOutput {
public:
    StreamOutput(const OpenAiRequest& req, const PoolInfo* pool, uint64_t id_seed);
    std::vector<nlohmann::json> feed(const std::string& piece);
    std::vector<nlohmann::json> finish();
    bool saw_tool_calls() const { return saw_tool_calls_; }

private:
    std::vector<nlohmann::json> deltas(std::vector<ToolCallDelta> d);
    std::vector<nlohmann::json> content(const std::string& piece);
    bool chat_;
    std::optional<ReasoningStream> reasoning_;  // a thinking template's chat: <think> ... </think> first
    std::optional<ToolCallParser> parser_;  // chat with tools and a known format
    bool saw_tool_calls_ = false;
};

// Token texts for logprobs: one piece per id (the caller detokenizes).
struct TokenText {
    int32_t id = 0;
    std::string text;
};

// "stop", "length", "tool_calls" (a stop whose output held tool calls).
const char* openai_finish_reason(FinishReason r, bool tool_calls);
// The HTTP answer for a request the runtime did not serve (OVERLOADED 429, TIMEOUT 504, ERROR 400,
// CANCELLED 503).
ApiError error_for_result(const GenerationResult& r);

// usage: prompt tokens once (the n choices share it), completion tokens summed, cached tokens of
// the first choice.
// A batch of prompts (per_prompt choices each, in order): each prompt's tokens counted once.
nlohmann::json usage_json(const std::vector<GenerationResult>& results, int per_prompt = 0);

// The id a response carries: "chatcmpl-<handle>" / "cmpl-<handle>"; parse_request_id accepts
// those and a bare handle (GET /admin/requests/{id}), 0 when it is neither.
std::string response_id(bool chat, uint64_t handle);
uint64_t parse_request_id(std::string_view id);

// HTTP/1.1 framing the server accepts (RFC 9112 6.1): no Transfer-Encoding, or one field holding
// "chunked" alone (any case, spaces around). Anything else leaves the body's length unknown and is
// refused: the answer is 501 and the connection closes, so that a body is never read as a request.
// `values`: every Transfer-Encoding field's value, in order. nullopt: accepted; else the message.
std::optional<std::string> transfer_coding_refusal(const std::vector<std::string>& values);

// The whole non-streaming response. texts[i] are choice i's token texts (logprobs), may be empty.
// pool: the pool whose template's tool-call format the chat's choices are parsed in; or per choice
// (choice_pools[i], the pool that answered it; null: not parsed).
nlohmann::json completion_response(const OpenAiRequest& req, uint64_t handle, int64_t created,
                                   const std::vector<GenerationResult>& results,
                                   const std::vector<std::vector<TokenText>>& token_texts,
                                   const std::vector<std::vector<std::vector<TokenText>>>& top_texts,
                                   const PoolInfo* pool);
nlohmann::json completion_response(const OpenAiRequest& req, uint64_t handle, int64_t created,
                                   const std::vector<GenerationResult>& results,
                                   const std::vector<std::vector<TokenText>>& token_texts,
                                   const std::vector<std::vector<std::vector<TokenText>>>& top_texts,
                                   const std::vector<const PoolInfo*>& choice_pools);
// One SSE chunk (without "data: "): a delta for choice `index` (chat) or text (completion), and a
// finish_reason when non-null.
nlohmann::json stream_chunk(const OpenAiRequest& req, uint64_t handle, int64_t created, int index,
                            const nlohmann::json& delta_or_text, const char* finish_reason,
                            const nlohmann::json& logprobs = nullptr);
// A streamed chunk's logprobs (RequestCallbacks::on_logprobs's tokens since the last chunk): chat's
// {"content": [{token, logprob, bytes, top_logprobs}]}, a completion's {tokens, token_logprobs,
// top_logprobs, text_offset} with offsets from text_offset0 (the choice's text so far).
nlohmann::json stream_logprobs(const OpenAiRequest& req, const std::vector<float>& logprobs,
                               const std::vector<std::vector<TokenLogprob>>& top, const std::vector<TokenText>& texts,
                               const std::vector<std::vector<TokenText>>& top_texts, size_t text_offset0);
// The final usage chunk (stream_options.include_usage): empty choices.
nlohmann::json stream_usage_chunk(const OpenAiRequest& req, uint64_t handle, int64_t created,
                                  const std::vector<GenerationResult>& results);
// "data: <json>\n\n"
std::string sse_event(const nlohmann::json& j);
inline constexpr std::string_view k_sse_done = "data: [DONE]\n\n";

// POST /tokenize {"model", "prompt"|"content", "add_special"} and /detokenize {"model", "tokens"}.
struct TokenizeRequest {
    std::string model, text;
    bool add_special = true;
};
std::optional<TokenizeRequest> parse_tokenize_request(std::string_view body, ApiError& err);
struct DetokenizeRequest {
    std::string model;
    std::vector<int32_t> tokens;
};
std::optional<DetokenizeRequest> parse_detokenize_request(std::string_view body, ApiError& err);

}  // namespace steward::serve
