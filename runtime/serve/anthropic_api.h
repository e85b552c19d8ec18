// Anthropic's Messages API (POST /v1/messages) over the chat core: a body becomes an OpenAiRequest
// (chat); a result becomes the Message object or its event stream (message_start ...
// message_stop); errors take Anthropic's shape {"type": "error", "error": {"type", "message"}}.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "serve/chat_dialect.h"
#include "serve/openai_api.h"

namespace steward::serve {

struct AnthropicRequest {
    OpenAiRequest chat;
    bool disable_parallel_tool_use = false;  // tool_choice.disable_parallel_tool_use: at most one tool_use block
};

// Parses and validates a body: `model`, `max_tokens` (both required), `messages` (content a string
// or text / tool_use / tool_result blocks), `system` (a string or text blocks), `tools` ({name,
// description, input_schema}), `tool_choice` ({type: auto | any | tool | none}), `stop_sequences`,
// `temperature` (0-1), `top_p`, `top_k`, `stream`, `metadata.user_id`. What Steward does not do
// (images, documents, server tools, extended thinking, unknown fields) is a 400 naming it, as
// Anthropic's server refuses fields it does not know.
std::optional<AnthropicRequest> parse_anthropic_request(std::string_view body, ApiError& err);

// The error body in Anthropic's shape; error.type from the status (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 overloaded_error, 504 timeout_error, other 5xx api_error).
std::string anthropic_error_body(const ApiError& e);
const char* anthropic_error_type(int status);

// A tool_use block's id for a chat tool call's id ("call_X" -> "toolu_X"), and back (the prefix
// dropped, so that a call id a template checks, such as Mistral's nine characters, comes back as
// the model wrote it).
std::string anthropic_tool_id(const std::string& call_id);
std::string chat_tool_id(const std::string& tool_use_id);

// usage: input_tokens (not read from the cache, as Anthropic counts), cache_read_input_tokens,
// cache_creation_input_tokens (0), output_tokens.
nlohmann::json anthropic_usage(const GenerationResult& r);
// "end_turn", "max_tokens", "stop_sequence" (stop non-empty) or "tool_use".
const char* anthropic_stop_reason(FinishReason r, bool tool_use, const std::string& stop);

// One /v1/messages answer (ChatDialect): the Message, or its events (message_start, then per block
// content_block_start, content_block_delta (text_delta / input_json_delta), content_block_stop, a
// ping after the first block starts, then message_delta with stop_reason and usage, message_stop),
// each with an `event:` line.
class AnthropicAnswer : public ChatDialect {
public:
    AnthropicAnswer(AnthropicRequest req, std::string id) : req_(std::move(req)), id_(std::move(id)) {}
    nlohmann::json answer(const GenerationResult& r, const ChoiceOutput& out, const std::string& stop) override;
    std::string stream_open() override;
    std::string stream_delta(const nlohmann::json& delta) override;
    std::string stream_finish(const GenerationResult& r, const std::string& stop) override;
    std::string stream_error(const ApiError& e) override;

private:
    std::string start_block(const nlohmann::json& block);
    std::string stop_block();
    AnthropicRequest req_;
    std::string id_;
    int n_blocks_ = 0;         // started so far
    bool block_open_ = false;  // the last started block is a text block still open
    int n_tool_uses_ = 0;
};

// A new message id: "msg_" and 24 random alphanumerics.
std::string new_message_id();

}  // namespace steward::serve
