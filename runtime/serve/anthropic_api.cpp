// Anthropic's Messages API over the chat core (anthropic_api.h): the body translated into a chat
// body that parse_openai_request validates, the Message object, its events and errors.
#include "serve/anthropic_api.h"

#include <cstring>

namespace steward::serve {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

bool fail(ApiError& err, std::string message, std::string param, std::string code) {
    err = ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
    return false;
}
bool wrong_type(ApiError& err, const std::string& at, const ojson& v, const std::string& want) {
    return fail(err, at + ": must be " + want + ", not " + json_kind(v), at, "invalid_type");
}

const char* const k_fields[] = {"model",       "max_tokens", "messages", "system",      "stop_sequences",
                                "temperature", "top_p",      "top_k",    "stream",      "tools",
                                "tool_choice", "metadata",   "thinking", "service_tier"};

// A text block's text (cache_control and citations are hints and references Steward has no use
// for: the prefix cache needs no breakpoints).
bool block_text(const ojson& b, const std::string& at, std::string& out, ApiError& err) {
    auto t = b.find("text");
    if (t == b.end() || !t->is_string())
        return fail(err, at + ".text: a text block needs a string 'text'", at + ".text", "invalid_type");
    out += t->get<std::string>();
    return true;
}

// One Anthropic message as chat messages: a user turn's tool_result blocks become tool messages
// (in order, text between them a user message); an assistant turn's text and tool_use blocks are one
// assistant message with tool_calls.
bool chat_messages(const ojson& m, const std::string& at, ojson& out, ApiError& err) {
    if (!m.is_object()) return wrong_type(err, at, m, "an object {role, content}");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string())
        return fail(err, at + ".role: must be \"user\" or \"assistant\"", at + ".role", "invalid_type");
    const std::string role = role_it->get<std::string>();
    if (role != "user" && role != "assistant")
        return fail(
            err,
            at + ".role: is '" + role + "'; it must be \"user\" or \"assistant\" (a system prompt goes in 'system')",
            at + ".role", "invalid_value");
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) return fail(err, at + ".content: is required", at + ".content", "missing_field");
    if (c->is_string()) {
        out.push_back({{"role", role}, {"content", c->get<std::string>()}});
        return true;
    }
    if (!c->is_array()) return wrong_type(err, at + ".content", *c, "a string or an array of content blocks");
    std::string text;
    ojson calls = ojson::array();
    bool have_text = false;
    auto flush_user_text = [&] {
        if (have_text) out.push_back({{"role", "user"}, {"content", text}});
        text.clear();
        have_text = false;
    };
    for (size_t i = 0; i < c->size(); i++) {
        const ojson& b = (*c)[i];
        const std::string bat = at + ".content." + std::to_string(i);
        if (!b.is_object()) return wrong_type(err, bat, b, "an object (a content block)");
        const std::string type = string_field(b, "type");
        if (type == "text") {
            if (!block_text(b, bat, text, err)) return false;
            have_text = true;
        } else if (type == "tool_use" && role == "assistant") {
            auto id = b.find("id");
            auto name = b.find("name");
            auto input = b.find("input");
            if (id == b.end() || !id->is_string())
                return fail(err, bat + ".id: a tool_use block needs a string 'id'", bat + ".id", "invalid_type");
            if (name == b.end() || !name->is_string())
                return fail(err, bat + ".name: a tool_use block needs a string 'name'", bat + ".name", "invalid_type");
            if (input == b.end() || !input->is_object())
                return fail(err, bat + ".input: a tool_use block needs an object 'input'", bat + ".input",
                            "invalid_type");
            calls.push_back({{"id", chat_tool_id(id->get<std::string>())},
                             {"type", "function"},
                             {"function", {{"name", *name}, {"arguments", *input}}}});
        } else if (type == "tool_result" && role == "user") {
            auto id = b.find("tool_use_id");
            if (id == b.end() || !id->is_string())
                return fail(err, bat + ".tool_use_id: a tool_result block needs a string 'tool_use_id'",
                            bat + ".tool_use_id", "invalid_type");
            std::string result;
            if (auto rc = b.find("content"); rc != b.end() && !rc->is_null()) {
                if (rc->is_string()) {
                    result = rc->get<std::string>();
                } else if (rc->is_array()) {
                    for (size_t k = 0; k < rc->size(); k++) {
                        const ojson& rb = (*rc)[k];
                        const std::string rat = bat + ".content." + std::to_string(k);
                        if (!rb.is_object() || string_field(rb, "type") != "text")
                            return fail(
                                err,
                                rat +
                                    ": a tool_result's content blocks must be text blocks (Steward serves text models)",
                                rat, "unsupported_value");
                        if (!block_text(rb, rat, result, err)) return false;
                    }
                } else {
                    return wrong_type(err, bat + ".content", *rc, "a string or an array of text blocks");
                }
            }
            if (auto e = b.find("is_error"); e != b.end() && !e->is_null() && !e->is_boolean())
                return wrong_type(err, bat + ".is_error", *e, "a boolean");
            flush_user_text();
            out.push_back(
                {{"role", "tool"}, {"tool_call_id", chat_tool_id(id->get<std::string>())}, {"content", result}});
        } else if (type == "tool_use" || type == "tool_result") {
            return fail(err,
                        bat + ".type: a " + type + " block belongs in " +
                            (type == "tool_use" ? "an assistant" : "a user") + " message",
                        bat + ".type", "invalid_value");
        } else {
            return fail(
                err,
                bat + ".type: '" + type +
                    "' blocks are not supported: Steward serves text models (text, tool_use and tool_result blocks)",
                bat + ".type", "unsupported_value");
        }
    }
    if (role == "user") {
        flush_user_text();
        if (c->empty()) out.push_back({{"role", "user"}, {"content", ""}});
        return true;
    }
    ojson a = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) {
        if (text.empty()) a["content"] = nullptr;
        a["tool_calls"] = std::move(calls);
    }
    out.push_back(std::move(a));
    return true;
}

bool chat_tools(const ojson& tools, ojson& out, ApiError& err) {
    if (!tools.is_array()) return wrong_type(err, "tools", tools, "an array");
    for (size_t i = 0; i < tools.size(); i++) {
        const ojson& t = tools[i];
        const std::string at = "tools." + std::to_string(i);
        if (!t.is_object()) return wrong_type(err, at, t, "an object {name, description, input_schema}");
        if (auto type = t.find("type"); type != t.end() && !type->is_null() && *type != "custom")
            return fail(err,
                        at + ".type: '" + (type->is_string() ? type->get<std::string>() : type->dump()) +
                            "' is not supported: server tools are not served; give client tools {name, description, "
                            "input_schema}",
                        at + ".type", "unsupported_value");
        auto name = t.find("name");
        if (name == t.end() || !name->is_string() || name->get<std::string>().empty())
            return fail(err, at + ".name: a non-empty string is required", at + ".name", "invalid_value");
        auto schema = t.find("input_schema");
        if (schema == t.end() || !schema->is_object())
            return fail(err, at + ".input_schema: a JSON Schema object is required", at + ".input_schema",
                        "invalid_value");
        ojson fn = {{"name", *name}};
        if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
            if (!d->is_string()) return wrong_type(err, at + ".description", *d, "a string");
            fn["description"] = *d;
        }
        fn["parameters"] = *schema;
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return true;
}

}  // namespace

std::optional<AnthropicRequest> parse_anthropic_request(std::string_view body, ApiError& err) {
    if (!parse_json_body(body, err)) return std::nullopt;
    const ojson j = ojson::parse(body, nullptr, false);  // keys in the order sent: templates show them
    if (!j.is_object())
        return fail(err, std::string("the body must be a JSON object, not ") + json_kind(j), "", "invalid_type"),
               std::nullopt;
    for (const auto& [k, v] : j.items()) {
        bool known = false;
        for (const char* f : k_fields) known = known || k == f;
        if (!known) return fail(err, k + ": Extra inputs are not permitted", k, "unknown_parameter"), std::nullopt;
    }
    auto field = [&](const char* key) -> const ojson* {
        auto it = j.find(key);
        return it == j.end() || it->is_null() ? nullptr : &*it;
    };
    AnthropicRequest r;
    ojson chat = {{"messages", ojson::array()}};
    const ojson* model = field("model");
    if (!model) return fail(err, "model: Field required", "model", "missing_field"), std::nullopt;
    if (!model->is_string()) return wrong_type(err, "model", *model, "a string"), std::nullopt;
    chat["model"] = *model;
    const ojson* max_tokens = field("max_tokens");
    if (!max_tokens) return fail(err, "max_tokens: Field required", "max_tokens", "missing_field"), std::nullopt;
    if (!max_tokens->is_number_integer()) return wrong_type(err, "max_tokens", *max_tokens, "an integer"), std::nullopt;
    if (max_tokens->get<int64_t>() < 1 || max_tokens->get<int64_t>() > (1 << 20))
        return fail(err, "max_tokens: is " + max_tokens->dump() + "; it must be in [1, 1048576]", "max_tokens",
                    "invalid_value"),
               std::nullopt;
    chat["max_tokens"] = *max_tokens;
    if (const ojson* s = field("system")) {
        std::string text;
        if (s->is_string()) {
            text = s->get<std::string>();
        } else if (s->is_array()) {
            for (size_t i = 0; i < s->size(); i++) {
                const ojson& b = (*s)[i];
                const std::string at = "system." + std::to_string(i);
                if (!b.is_object() || string_field(b, "type") != "text")
                    return fail(err, at + ": system blocks must be text blocks", at, "invalid_value"), std::nullopt;
                if (!block_text(b, at, text, err)) return std::nullopt;
            }
        } else {
            return wrong_type(err, "system", *s, "a string or an array of text blocks"), std::nullopt;
        }
        chat["messages"].push_back({{"role", "system"}, {"content", text}});
    }
    const ojson* messages = field("messages");
    if (!messages) return fail(err, "messages: Field required", "messages", "missing_field"), std::nullopt;
    if (!messages->is_array()) return wrong_type(err, "messages", *messages, "an array"), std::nullopt;
    if (messages->empty())
        return fail(err, "messages: at least one message is required", "messages", "invalid_value"), std::nullopt;
    for (size_t i = 0; i < messages->size(); i++)
        if (!chat_messages((*messages)[i], "messages." + std::to_string(i), chat["messages"], err)) return std::nullopt;
    if (const ojson* v = field("tools")) {
        ojson tools = ojson::array();
        if (!chat_tools(*v, tools, err)) return std::nullopt;
        if (!tools.empty()) chat["tools"] = std::move(tools);
    }
    if (const ojson* tc = field("tool_choice")) {
        if (!tc->is_object() || !tc->contains("type") || !(*tc)["type"].is_string())
            return wrong_type(err, "tool_choice", *tc,
                              "an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}"),
                   std::nullopt;
        const std::string type = (*tc)["type"].get<std::string>();
        if (type == "auto" || type == "none") {
            chat["tool_choice"] = type;
        } else if (type == "any") {
            chat["tool_choice"] = "required";
        } else if (type == "tool") {
            if (!tc->contains("name") || !(*tc)["name"].is_string())
                return fail(err, "tool_choice.name: a tool_choice of type tool needs the tool's name",
                            "tool_choice.name", "missing_field"),
                       std::nullopt;
            chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
        } else {
            return fail(err, "tool_choice.type: is '" + type + "'; it must be auto, any, tool or none",
                        "tool_choice.type", "invalid_value"),
                   std::nullopt;
        }
        if (auto d = tc->find("disable_parallel_tool_use"); d != tc->end() && !d->is_null()) {
            if (!d->is_boolean())
                return wrong_type(err, "tool_choice.disable_parallel_tool_use", *d, "a boolean"), std::nullopt;
            r.disable_parallel_tool_use = d->get<bool>();
        }
    }
    if (const ojson* s = field("stop_sequences")) {
        if (!s->is_array()) return wrong_type(err, "stop_sequences", *s, "an array of strings"), std::nullopt;
        if (!s->empty()) chat["stop"] = *s;
    }
    if (const ojson* t = field("temperature")) {
        if (!t->is_number()) return wrong_type(err, "temperature", *t, "a number"), std::nullopt;
        if (t->get<double>() < 0 || t->get<double>() > 1)
            return fail(err, "temperature: is " + t->dump() + "; it must be in [0, 1]", "temperature", "invalid_value"),
                   std::nullopt;
        chat["temperature"] = *t;
    }
    for (const char* key : {"top_p", "top_k", "stream"})
        if (const ojson* v = field(key)) chat[key] = *v;  // checked by the chat parser, under the same names
    if (const ojson* m = field("metadata")) {
        if (!m->is_object()) return wrong_type(err, "metadata", *m, "an object {\"user_id\": ...}"), std::nullopt;
        for (const auto& [k, v] : m->items()) {
            if (k != "user_id")
                return fail(err, "metadata." + k + ": Extra inputs are not permitted", "metadata." + k,
                            "unknown_parameter"),
                       std::nullopt;
            if (!v.is_null() && !v.is_string()) return wrong_type(err, "metadata.user_id", v, "a string"), std::nullopt;
            if (v.is_string()) chat["user"] = v;
        }
    }
    if (const ojson* t = field("thinking"); t && !(t->is_object() && string_field(*t, "type") == "disabled"))
        return fail(err, "thinking: extended thinking is not supported; leave it out or send {\"type\": \"disabled\"}",
                    "thinking", "unsupported_value"),
               std::nullopt;
    if (const ojson* v = field("service_tier"); v && !v->is_string())
        return wrong_type(err, "service_tier", *v, "a string"), std::nullopt;

    auto parsed = parse_openai_request(chat.dump(), true, err);
    if (!parsed) {
        // The chat parser names its own fields; these are spelled otherwise here.
        if (err.param.rfind("stop", 0) == 0) err.param = "stop_sequences";
        for (size_t p; (p = err.message.find("'stop'")) != std::string::npos;)
            err.message.replace(p, 6, "'stop_sequences'");
        err.message = (err.param.empty() ? "" : err.param + ": ") + err.message;
        return std::nullopt;
    }
    r.chat = std::move(*parsed);
    return r;
}

const char* anthropic_error_type(int status) {
    switch (status) {
        case 401: return "authentication_error";
        case 403: return "permission_error";
        case 404: return "not_found_error";
        case 413: return "request_too_large";
        case 429: return "rate_limit_error";
        case 503: return "overloaded_error";
        case 504: return "timeout_error";
        default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

std::string anthropic_error_body(const ApiError& e) {
    return json{{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.message}}}}.dump(
        -1, ' ', false, json::error_handler_t::replace);
}

std::string anthropic_tool_id(const std::string& call_id) {
    return "toolu_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}
std::string chat_tool_id(const std::string& tool_use_id) {
    return tool_use_id.rfind("toolu_", 0) == 0 ? tool_use_id.substr(6) : tool_use_id;
}

json anthropic_usage(const GenerationResult& r) {
    const RequestMetrics& m = r.metrics;
    return {{"input_tokens", m.prompt_tokens - m.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", m.cached_tokens},
            {"output_tokens", m.completion_tokens}};
}

const char* anthropic_stop_reason(FinishReason r, bool tool_use, const std::string& stop) {
    if (r == FinishReason::LENGTH) return "max_tokens";
    if (tool_use) return "tool_use";
    return stop.empty() ? "end_turn" : "stop_sequence";
}

std::string new_message_id() {
    return "msg_" + random_id(24);
}

namespace {

json tool_use_block(const json& call) {
    json input = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    if (input.is_discarded() || !input.is_object()) input = json::object();
    return {{"type", "tool_use"},
            {"id", anthropic_tool_id(call["id"].get<std::string>())},
            {"name", call["function"]["name"]},
            {"input", input}};
}

}  // namespace

json AnthropicAnswer::answer(const GenerationResult& r, const ChoiceOutput& out, const std::string& stop) {
    json content = json::array();
    if (!out.content.empty()) content.push_back({{"type", "text"}, {"text", out.content}});
    for (const json& call : out.tool_calls) {
        content.push_back(tool_use_block(call));
        if (req_.disable_parallel_tool_use) break;  // one tool_use block at most, as asked
    }
    if (content.empty()) content.push_back({{"type", "text"}, {"text", ""}});  // an empty output is an empty text block
    const bool tool_use = !out.tool_calls.empty();
    return {
        {"id", id_},
        {"type", "message"},
        {"role", "assistant"},
        {"model", req_.chat.model},
        {"content", content},
        {"stop_reason", anthropic_stop_reason(r.finish, tool_use, stop)},
        {"stop_sequence", !tool_use && r.finish != FinishReason::LENGTH && !stop.empty() ? json(stop) : json(nullptr)},
        {"usage", anthropic_usage(r)}};
}

std::string AnthropicAnswer::stream_open() {
    // The prompt's size is known when the output ends: message_start says 0 and message_delta the
    // count (the SDKs take message_delta's usage over message_start's).
    const json message = {{"id", id_},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"model", req_.chat.model},
                          {"content", json::array()},
                          {"stop_reason", nullptr},
                          {"stop_sequence", nullptr},
                          {"usage", {{"input_tokens", 0}, {"output_tokens", 0}}}};
    return sse_typed_event("message_start", {{"type", "message_start"}, {"message", message}});
}

std::string AnthropicAnswer::start_block(const json& block) {
    std::string s = sse_typed_event("content_block_start",
                                    {{"type", "content_block_start"}, {"index", n_blocks_}, {"content_block", block}});
    if (n_blocks_++ == 0) s += sse_typed_event("ping", {{"type", "ping"}});
    return s;
}

std::string AnthropicAnswer::stop_block() {
    block_open_ = false;
    return sse_typed_event("content_block_stop", {{"type", "content_block_stop"}, {"index", n_blocks_ - 1}});
}

std::string AnthropicAnswer::stream_delta(const json& delta) {
    std::string s;
    if (auto c = delta.find("content"); c != delta.end() && c->is_string() && !c->get<std::string>().empty()) {
        if (!block_open_) {
            s += start_block({{"type", "text"}, {"text", ""}});
            block_open_ = true;
        }
        s += sse_typed_event("content_block_delta", {{"type", "content_block_delta"},
                                                     {"index", n_blocks_ - 1},
                                                     {"delta", {{"type", "text_delta"}, {"text", *c}}}});
    }
    if (auto calls = delta.find("tool_calls"); calls != delta.end())
        for (const json& call : *calls) {
            if (req_.disable_parallel_tool_use && n_tool_uses_ > 0) continue;
            n_tool_uses_++;
            if (block_open_) s += stop_block();
            json block = tool_use_block(call);
            const std::string input = block["input"].dump();
            block["input"] = json::object();
            s += start_block(block);
            s += sse_typed_event("content_block_delta",
                                 {{"type", "content_block_delta"},
                                  {"index", n_blocks_ - 1},
                                  {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
            s += stop_block();
        }
    return s;
}

std::string AnthropicAnswer::stream_finish(const GenerationResult& r, const std::string& stop) {
    std::string s;
    if (n_blocks_ == 0) {
        s += start_block({{"type", "text"}, {"text", ""}});
        block_open_ = true;
    }
    if (block_open_) s += stop_block();
    const bool tool_use = n_tool_uses_ > 0;
    json usage = anthropic_usage(r);
    s += sse_typed_event(
        "message_delta",
        {{"type", "message_delta"},
         {"delta",
          {{"stop_reason", anthropic_stop_reason(r.finish, tool_use, stop)},
           {"stop_sequence",
            !tool_use && r.finish != FinishReason::LENGTH && !stop.empty() ? json(stop) : json(nullptr)}}},
         {"usage", usage}});
    return s + sse_typed_event("message_stop", {{"type", "message_stop"}});
}

std::string AnthropicAnswer::stream_error(const ApiError& e) {
    return sse_typed_event("error", json::parse(anthropic_error_body(e)));
}

}  // namespace steward::serve
