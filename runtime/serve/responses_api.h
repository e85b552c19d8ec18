// OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}) over the chat core: a body
// becomes an OpenAiRequest (chat) and the turn it adds to a stored conversation; a result becomes
// the Response object or its stream of typed events. Stored responses live in ResponseStore, per
// tenant, and a chain of them (previous_response_id) runs as one Steward session.
#pragma once
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "serve/chat_dialect.h"
#include "serve/openai_api.h"

namespace steward::serve {

// One turn of a stored conversation: its input and output as chat messages. Turns form a
// persistent list (each holds its parent), so a chain of n responses stores each message once and
// an evicted response's ancestors live on as long as a stored descendant needs them.
struct ConversationTurn {
    std::shared_ptr<const ConversationTurn> parent;
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    std::string session;  // the chain's Steward session (GenerationRequest::session)
};
// The chain's messages, oldest first.
nlohmann::ordered_json conversation_messages(const ConversationTurn* last);

// What a /v1/responses body asks, validated. `chat` is the chat it runs (its messages set by
// continue_conversation); the rest is what the Response object echoes and what is stored.
struct ResponsesRequest {
    OpenAiRequest chat;
    nlohmann::ordered_json input_messages = nlohmann::ordered_json::array();  // this turn's input, as chat messages
    std::optional<std::string> instructions;
    std::string previous_response_id;
    bool store = true;
    bool parallel_tool_calls = true;
    std::optional<int> max_output_tokens;
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as sent (Responses' flat shape)
    nlohmann::ordered_json tool_choice = "auto";                     // as sent
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    nlohmann::ordered_json text_format = {{"type", "text"}};  // text.format, as sent
    double temperature = 1.0, top_p = 1.0;                    // as sent (OpenAI's defaults)
    std::string service_tier = "default";
};

// Parses and validates a body: `input` (a string, or message / function_call /
// function_call_output items), `instructions`, function `tools` ({type, name, description,
// parameters, strict}), `tool_choice`, `max_output_tokens`, `temperature`, `top_p`, `stream`,
// `store`, `previous_response_id`, `metadata`, `parallel_tool_calls`, `text.format`, `user`.
// Anything else that asks for behaviour Steward does not have (built-in tools such as web_search,
// images and files in input, reasoning, background, unknown fields) is a 400 whose param names it.
std::optional<ResponsesRequest> parse_responses_request(std::string_view body, ApiError& err);

// Sets req.chat.messages: the instructions (a system message), then the previous turns (the
// instructions of earlier responses are not carried over, as OpenAI does), then this turn's input.
// A tool message gets the function's name from the call it answers (templates render it). And
// req.chat.session: the previous turn's session (a chain is one Steward session, so its KV stays
// warm between an agent's turns), else "responses/<id>" for a response to be stored, else none.
void continue_conversation(ResponsesRequest& req, const ConversationTurn* previous, const std::string& id);

// Stored responses, per tenant: bounded by count and by the bytes of their own turns (least
// recently used first out) and by age (ttl). Thread-safe.
class ResponseStore {
public:
    struct Entry {
        std::string tenant;
        nlohmann::json response;  // the Response object, as answered
        std::shared_ptr<const ConversationTurn> turn;
        size_t n_bytes = 0;
        std::chrono::steady_clock::time_point stored;
    };
    ResponseStore(size_t max_entries, size_t max_bytes, std::chrono::seconds ttl)
        : max_entries_(max_entries), max_bytes_(max_bytes), ttl_(ttl) {}
    void put(const std::string& tenant, const std::string& id, nlohmann::json response,
             std::shared_ptr<const ConversationTurn> turn);
    // The tenant's response `id` (touched: most recently used), nullopt when unknown, expired or
    // another tenant's (indistinguishable, so that an id's existence is never told across tenants).
    std::optional<Entry> get(const std::string& tenant, const std::string& id);
    size_t size() const;

private:
    void evict_locked(std::chrono::steady_clock::time_point now);
    const size_t max_entries_, max_bytes_;
    const std::chrono::seconds ttl_;
    mutable std::mutex mu_;
    std::list<std::string> lru_;  // most recent first
    std::map<std::string, std::pair<Entry, std::list<std::string>::iterator>, std::less<>> by_id_;
    size_t n_bytes_ = 0;
};
inline constexpr size_t k_max_stored_responses = 4096;
inline constexpr size_t k_max_stored_response_bytes = 256u << 20;
inline constexpr std::chrono::seconds k_stored_response_ttl{3600};

// The 404 for a previous_response_id (or GET id) that is not the tenant's: OpenAI's message and code.
ApiError response_not_found(const std::string& id, const char* param);

// A new response id: "resp_" and 32 random alphanumerics.
std::string new_response_id();

// The Response object of a finished output (or the in-progress one, output empty, for the stream's
// opening events). Pure: ids and time are the caller's.
nlohmann::json response_object(const ResponsesRequest& req, const std::string& id, int64_t created_at,
                               const char* status, const nlohmann::json& output, const nlohmann::json& usage);
// usage: input_tokens (cached included), output_tokens, total_tokens and their details.
nlohmann::json responses_usage(const GenerationResult& r);

// One /v1/responses answer (ChatDialect): the Response object, or its event stream
// (response.created, response.in_progress, then per output item output_item.added, its content
// part / text deltas or function-call arguments, output_item.done, and response.completed or
// response.incomplete; each event with `type` and `sequence_number`). A stored response (`store`)
// is put in the store with its turn when it completes (or is cut short by max_output_tokens).
class ResponsesAnswer : public ChatDialect {
public:
    ResponsesAnswer(ResponsesRequest req, std::string id, int64_t created_at, std::shared_ptr<ResponseStore> store,
                    std::string tenant, std::shared_ptr<const ConversationTurn> previous);
    nlohmann::json answer(const GenerationResult& r, const ChoiceOutput& out, const std::string& stop) override;
    std::string stream_open() override;
    std::string stream_delta(const nlohmann::json& delta) override;
    std::string stream_finish(const GenerationResult& r, const std::string& stop) override;
    std::string stream_error(const ApiError& e) override;

private:
    std::string event(const std::string& type, nlohmann::json data);
    std::string open_message();
    std::string close_message(const char* status);
    void store_turn(const nlohmann::json& response, const ChoiceOutput& out);

    ResponsesRequest req_;
    std::string id_;
    int64_t created_at_;
    std::shared_ptr<ResponseStore> store_;
    std::string tenant_;
    std::shared_ptr<const ConversationTurn> previous_;
    // Streaming state.
    int64_t seq_ = 0;
    nlohmann::json output_ = nlohmann::json::array();  // items done so far
    bool message_open_ = false;
    std::string message_id_, text_;
    ChoiceOutput seen_;  // what the stream decided: content and calls (the stored turn)
};

}  // namespace steward::serve
