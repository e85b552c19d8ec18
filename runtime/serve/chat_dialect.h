// A chat API other than OpenAI's chat completions, served over the same request core: its body has
// become an OpenAiRequest (chat), and its answers (a whole object, or a stream of SSE events) are
// built by a ChatDialect from the same results and parsed outputs. /v1/responses
// (serve/responses_api.h) and Anthropic's /v1/messages (serve/anthropic_api.h) are the two.
#pragma once
#include <steward/request.h>

#include <nlohmann/json.hpp>
#include <string>

#include "serve/openai_api.h"

namespace steward::serve {

// One request's answer in its API's shape. The server calls it on the request's connection strand
// only (not thread-safe), for exactly one choice (these APIs have no `n`): either answer() once,
// or stream_open(), stream_delta() for each decided piece, then stream_finish() or stream_error().
class ChatDialect {
public:
    virtual ~ChatDialect() = default;
    // The non-streamed answer. out: the output split into content and OpenAI-shaped tool calls
    // (parse_choice_output); stop: the stop string that ended the output, "" when none did.
    virtual nlohmann::json answer(const GenerationResult& r, const ChoiceOutput& out, const std::string& stop) = 0;
    // Streaming, as SSE bytes ("event: T\ndata: {...}\n\n" ...): the opening events; one
    // StreamOutput delta ({"content": text} or {"tool_calls": [one whole call]}); the closing
    // events of a finished output (r.ok()); the events of a failure after the stream opened.
    virtual std::string stream_open() = 0;
    virtual std::string stream_delta(const nlohmann::json& delta) = 0;
    virtual std::string stream_finish(const GenerationResult& r, const std::string& stop) = 0;
    virtual std::string stream_error(const ApiError& e) = 0;
};

// "event: <type>\ndata: <json>\n\n": the framing both APIs use (the official SDKs read the event line).
std::string sse_typed_event(const std::string& type, const nlohmann::json& data);

// The stop string that ended an output: `text` is what the runtime answered (it ends before the
// first stop string), `full` the detokenization of all its output tokens (which include the stop
// string's). The stop that occurs first in `full` at or past where `text` ends; "" when none does
// (the output ended at end-of-sequence).
std::string matched_stop(const std::string& text, const std::string& full, const std::vector<std::string>& stops);

// A tool call's arguments in a chat message the template renders: the JSON object the string holds
// (templates write `arguments | tojson`, and transformers' docs ask for a dict; vLLM converts so
// too), else the string as sent.
nlohmann::ordered_json template_arguments(const std::string& arguments);

// "a string", "an object", ...: what a refused value is, for messages.
const char* json_kind(const nlohmann::ordered_json& v);

// n random alphanumerics (ids: resp_..., msg_...). Thread-safe (a generator per thread).
std::string random_id(size_t n);

}  // namespace steward::serve
