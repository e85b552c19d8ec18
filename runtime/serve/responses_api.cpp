// OpenAI's Responses API over the chat core (responses_api.h): the body translated into a chat
// body that parse_openai_request validates as /v1/chat/completions would, the Response object and
// its typed events, and the per-tenant store that previous_response_id reads.
#include "serve/responses_api.h"

#include <cstring>

namespace steward::serve {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

bool fail(ApiError& err, std::string message, std::string param, std::string code, int status = 400) {
    err = ApiError{status, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
    return false;
}
bool wrong_type(ApiError& err, const std::string& at, const ojson& v, const std::string& want) {
    return fail(err, "'" + at + "' must be " + want + ", not " + json_kind(v), at, "invalid_type");
}
bool unsupported(ApiError& err, const std::string& at, const std::string& what) {
    return fail(err, "'" + at + "' " + what, at, "unsupported_value");
}

// The top-level fields of OpenAI's create-response body. Those Steward does not implement are
// refused by name when they ask for something (see parse_responses_request); any other name is
// refused as OpenAI's server refuses it ("Unknown parameter").
const char* const k_fields[] = {"model",
                                "input",
                                "instructions",
                                "tools",
                                "tool_choice",
                                "max_output_tokens",
                                "temperature",
                                "top_p",
                                "stream",
                                "store",
                                "previous_response_id",
                                "metadata",
                                "parallel_tool_calls",
                                "text",
                                "user",
                                "reasoning",
                                "include",
                                "truncation",
                                "service_tier",
                                "prompt_cache_key",
                                "safety_identifier",
                                "stream_options",
                                "top_logprobs",
                                "background",
                                "max_tool_calls",
                                "prompt",
                                "conversation"};

// Text of a content array's parts (input_text, output_text; refusal reads as its text).
bool content_text(const ojson& content, const std::string& at, std::string& out, ApiError& err) {
    if (content.is_string()) return out = content.get<std::string>(), true;
    if (!content.is_array()) return wrong_type(err, at, content, "a string or an array of content parts");
    for (size_t j = 0; j < content.size(); j++) {
        const ojson& part = content[j];
        const std::string pat = at + "[" + std::to_string(j) + "]";
        if (!part.is_object())
            return wrong_type(err, pat, part, "an object ({\"type\": \"input_text\", \"text\": ...})");
        const std::string type = string_field(part, "type");
        const char* key = type == "refusal" ? "refusal" : "text";
        if (type == "input_text" || type == "output_text" || type == "text" || type == "refusal") {
            auto t = part.find(key);
            if (t == part.end() || !t->is_string())
                return fail(err, "'" + pat + "." + key + "' must be a string", pat + "." + key, "invalid_type");
            out += t->get<std::string>();
        } else {
            return unsupported(
                err, pat + ".type",
                "is '" + type + "': Steward serves text models; content parts are input_text and output_text");
        }
    }
    return true;
}

// `input` as chat messages. function_call items join the assistant message before them (a turn's
// text and its calls are one chat message); function_call_output items are tool messages.
bool input_messages(const ojson& input, ojson& out, ApiError& err) {
    if (input.is_string()) {
        out.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
        return true;
    }
    if (!input.is_array()) return wrong_type(err, "input", input, "a string or an array of input items");
    if (input.empty())
        return fail(err, "'input' is empty; give a string or at least one item", "input", "invalid_value");
    for (size_t i = 0; i < input.size(); i++) {
        const ojson& item = input[i];
        const std::string at = "input[" + std::to_string(i) + "]";
        if (!item.is_object()) return wrong_type(err, at, item, "an object (an input item)");
        std::string type = "message";
        if (auto t = item.find("type"); t != item.end() && !t->is_null()) {
            if (!t->is_string()) return wrong_type(err, at + ".type", *t, "a string");
            type = t->get<std::string>();
        }
        auto str = [&](const char* key, std::string& v) {
            auto f = item.find(key);
            if (f == item.end() || f->is_null())
                return fail(err, "'" + at + "." + key + "' is required in a " + type + " item", at + "." + key,
                            "missing_field");
            if (!f->is_string()) return wrong_type(err, at + "." + key, *f, "a string");
            v = f->get<std::string>();
            return true;
        };
        if (type == "message") {
            std::string role, text;
            if (!str("role", role)) return false;
            if (role != "user" && role != "assistant" && role != "system" && role != "developer")
                return fail(err, "'" + at + ".role' is '" + role + "'; it must be user, assistant, system or developer",
                            at + ".role", "invalid_value");
            auto c = item.find("content");
            if (c == item.end() || c->is_null())
                return fail(err, "'" + at + ".content' is required", at + ".content", "missing_field");
            if (!content_text(*c, at + ".content", text, err)) return false;
            out.push_back({{"role", role}, {"content", text}});
        } else if (type == "function_call") {
            std::string call_id, name, arguments;
            if (!str("call_id", call_id) || !str("name", name) || !str("arguments", arguments)) return false;
            ojson call = {{"id", call_id},
                          {"type", "function"},
                          {"function", {{"name", name}, {"arguments", template_arguments(arguments)}}}};
            if (!out.empty() && out.back()["role"] == "assistant") {
                ojson& prev = out.back();
                if (!prev.contains("tool_calls")) prev["tool_calls"] = ojson::array();
                prev["tool_calls"].push_back(std::move(call));
            } else {
                out.push_back(
                    {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({std::move(call)})}});
            }
        } else if (type == "function_call_output") {
            std::string call_id, text;
            if (!str("call_id", call_id)) return false;
            auto o = item.find("output");
            if (o == item.end() || o->is_null())
                return fail(err, "'" + at + ".output' is required", at + ".output", "missing_field");
            if (!content_text(*o, at + ".output", text, err)) return false;
            out.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}});
        } else {
            return unsupported(
                err, at + ".type",
                "is '" + type +
                    "', which Steward does not serve; input items are message, function_call and function_call_output");
        }
    }
    return true;
}

// Responses' flat function tools as chat tools ({type, function: {name, description, parameters}}).
bool chat_tools(const ojson& tools, ojson& out, ApiError& err) {
    if (!tools.is_array()) return wrong_type(err, "tools", tools, "an array");
    for (size_t i = 0; i < tools.size(); i++) {
        const ojson& t = tools[i];
        const std::string at = "tools[" + std::to_string(i) + "]";
        if (!t.is_object())
            return wrong_type(err, at, t, "an object ({\"type\": \"function\", \"name\": ..., \"parameters\": {...}})");
        const ojson type = t.value("type", ojson());
        if (!type.is_string())
            return fail(err, "'" + at + ".type' is required: \"function\"", at + ".type", "missing_field");
        if (type != "function")
            return unsupported(err, at + ".type",
                               "is '" + type.get<std::string>() +
                                   "': built-in tools are not supported; Steward serves function tools "
                                   "({\"type\": \"function\", \"name\", \"parameters\"})");
        auto name = t.find("name");
        if (name == t.end() || !name->is_string() || name->get<std::string>().empty())
            return fail(err, "'" + at + ".name' must be a non-empty string", at + ".name",
                        name == t.end() ? "missing_field" : "invalid_value");
        ojson fn = {{"name", *name}};
        if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
            if (!d->is_string()) return wrong_type(err, at + ".description", *d, "a string");
            fn["description"] = *d;
        }
        if (auto p = t.find("parameters"); p != t.end() && !p->is_null()) {
            if (!p->is_object()) return wrong_type(err, at + ".parameters", *p, "a JSON Schema object");
            fn["parameters"] = *p;
        }
        if (auto s = t.find("strict"); s != t.end() && !s->is_null() && !s->is_boolean())
            return wrong_type(err, at + ".strict", *s, "a boolean");
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return true;
}

bool chat_tool_choice(const ojson& tc, ojson& out, ApiError& err) {
    const std::string want = "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}";
    if (tc.is_string()) {
        const std::string s = tc.get<std::string>();
        if (s != "none" && s != "auto" && s != "required")
            return fail(err, "'tool_choice' is '" + s + "'; use " + want, "tool_choice", "invalid_value");
        out = s;
        return true;
    }
    if (!tc.is_object()) return wrong_type(err, "tool_choice", tc, want);
    const ojson type = tc.value("type", ojson());
    if (type != "function")
        return unsupported(err, "tool_choice.type",
                           "is " + type.dump() + ": only function tools are served; use " + want);
    auto name = tc.find("name");
    if (name == tc.end() || !name->is_string())
        return fail(err, "'tool_choice.name' must be a string", "tool_choice.name", "invalid_type");
    out = {{"type", "function"}, {"function", {{"name", *name}}}};
    return true;
}

bool chat_response_format(const ojson& text, ojson& format_out, ojson& chat_body, ApiError& err) {
    if (!text.is_object()) return wrong_type(err, "text", text, "an object ({\"format\": {...}})");
    for (const auto& [k, v] : text.items()) {
        if (k == "format" || v.is_null()) continue;
        if (k == "verbosity")
            return unsupported(err, "text.verbosity", "is not supported: Steward's models take no verbosity setting");
        return fail(err, "'text." + k + "' is not a field of text (it has format)", "text." + k, "unknown_parameter");
    }
    auto f = text.find("format");
    if (f == text.end() || f->is_null()) return true;
    if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
        return wrong_type(err, "text.format", *f,
                          "an object {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
    const std::string type = (*f)["type"].get<std::string>();
    format_out = *f;
    if (type == "text") return true;
    if (type == "json_object") return chat_body["response_format"] = {{"type", "json_object"}}, true;
    if (type != "json_schema")
        return unsupported(err, "text.format.type",
                           "is '" + type + "'; use \"text\", \"json_object\" or \"json_schema\"");
    ojson js = {{"name", f->value("name", ojson("response"))}};
    if (auto s = f->find("schema"); s != f->end()) js["schema"] = *s;
    if (auto s = f->find("strict"); s != f->end()) js["strict"] = *s;
    chat_body["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
    return true;
}

// The chat parser's names for the fields this API spells otherwise.
void rename_params(ApiError& err) {
    static const std::pair<const char*, const char*> names[] = {
        {"max_tokens", "max_output_tokens"}, {"response_format.json_schema", "text.format"}, {"messages", "input"}};
    for (const auto& [from, to] : names) {
        if (err.param.rfind(from, 0) == 0) err.param = to + err.param.substr(strlen(from));
        for (size_t p; (p = err.message.find(from)) != std::string::npos;) err.message.replace(p, strlen(from), to);
    }
}

}  // namespace

std::optional<ResponsesRequest> parse_responses_request(std::string_view body, ApiError& err) {
    auto checked = parse_json_body(body, err);  // the depth bound and JSON syntax, as every body
    if (!checked) return std::nullopt;
    const ojson j = ojson::parse(body, nullptr, false);  // keys in the order sent: templates show them
    if (!j.is_object()) {
        fail(err, std::string("the body must be a JSON object, not ") + json_kind(j), "", "invalid_type");
        return std::nullopt;
    }
    for (const auto& [k, v] : j.items()) {
        bool known = false;
        for (const char* f : k_fields) known = known || k == f;
        if (!known) {
            fail(err, "Unknown parameter: '" + k + "'.", k, "unknown_parameter");
            return std::nullopt;
        }
    }
    auto field = [&](const char* key) -> const ojson* {
        auto it = j.find(key);
        return it == j.end() || it->is_null() ? nullptr : &*it;
    };
    // Fields that ask for what Steward does not do: a 400 naming them (their empty values pass).
    struct Refusal {
        const char* key;
        const char* why;
    };
    static const Refusal refusals[] = {
        {"prompt", "(reusable prompts) is not supported: send instructions and input"},
        {"conversation", "is not supported (no Conversations API): continue with previous_response_id"},
        {"max_tool_calls", "is not supported"},
    };
    for (const Refusal& r : refusals)
        if (field(r.key))
            return fail(err, std::string("'") + r.key + "' " + r.why, r.key, "unsupported_parameter"), std::nullopt;
    if (const ojson* b = field("background"); b && *b != false)
        return unsupported(err, "background",
                           "is not supported: responses run in the foreground (stream for progress)"),
               std::nullopt;
    if (const ojson* r = field("reasoning");
        r && !(r->is_object() &&
               (r->empty() || (r->value("effort", ojson()).is_null() && r->value("summary", ojson()).is_null()))))
        return unsupported(err, "reasoning", "is not supported: Steward's models take no reasoning effort or summary"),
               std::nullopt;
    if (const ojson* inc = field("include"); inc && !(inc->is_array() && inc->empty()))
        return unsupported(err, "include", "is not supported: there is nothing extra to include (" + inc->dump() + ")"),
               std::nullopt;
    if (const ojson* t = field("truncation"); t && *t != "disabled")
        return unsupported(
                   err, "truncation",
                   "is " + t->dump() + "; only \"disabled\" is supported (a conversation over the context is a 400)"),
               std::nullopt;
    if (const ojson* t = field("top_logprobs"); t && *t != 0)
        return unsupported(err, "top_logprobs", "is not supported on /v1/responses (use /v1/chat/completions)"),
               std::nullopt;
    for (const char* key : {"prompt_cache_key", "safety_identifier", "service_tier", "user"})
        if (const ojson* v = field(key); v && !v->is_string())
            return wrong_type(err, key, *v, "a string"), std::nullopt;
    if (const ojson* so = field("stream_options"); so && !so->is_object())
        return wrong_type(err, "stream_options", *so, "an object"), std::nullopt;

    ResponsesRequest r;
    ojson chat = {{"messages", ojson::array()}};
    const ojson* model = field("model");
    if (!model)
        return fail(err, "'model' is required: a pool, a bucket or \"steward\" (GET /v1/models)", "model",
                    "missing_field"),
               std::nullopt;
    if (!model->is_string()) return wrong_type(err, "model", *model, "a string"), std::nullopt;
    chat["model"] = *model;
    const ojson* input = field("input");
    if (!input)
        return fail(err, "'input' is required: a string or an array of input items", "input", "missing_field"),
               std::nullopt;
    if (!input_messages(*input, r.input_messages, err)) return std::nullopt;
    chat["messages"] = r.input_messages;
    if (const ojson* v = field("instructions")) {
        if (!v->is_string()) return wrong_type(err, "instructions", *v, "a string"), std::nullopt;
        r.instructions = v->get<std::string>();
    }
    if (const ojson* v = field("tools")) {
        ojson tools = ojson::array();
        if (!chat_tools(*v, tools, err)) return std::nullopt;
        r.tools = *v;
        if (!tools.empty()) chat["tools"] = std::move(tools);
    }
    if (const ojson* v = field("tool_choice")) {
        ojson tc;
        if (!chat_tool_choice(*v, tc, err)) return std::nullopt;
        r.tool_choice = *v;
        chat["tool_choice"] = std::move(tc);
    }
    if (const ojson* v = field("max_output_tokens")) {
        if (!v->is_number_integer()) return wrong_type(err, "max_output_tokens", *v, "an integer"), std::nullopt;
        if (v->get<int64_t>() < 1 || v->get<int64_t>() > (1 << 20))
            return fail(err, "'max_output_tokens' is " + v->dump() + "; it must be in [1, 1048576]",
                        "max_output_tokens", "invalid_value"),
                   std::nullopt;
        r.max_output_tokens = v->get<int>();
        chat["max_tokens"] = *v;
    }
    for (const char* key : {"temperature", "top_p", "stream", "user"})
        if (const ojson* v = field(key)) chat[key] = *v;  // checked by the chat parser, under the same names
    if (const ojson* v = field("temperature"); v && v->is_number()) r.temperature = v->get<double>();
    if (const ojson* v = field("top_p"); v && v->is_number()) r.top_p = v->get<double>();
    if (const ojson* v = field("service_tier")) r.service_tier = v->get<std::string>();
    auto flag = [&](const char* key, bool& out) {
        const ojson* v = field(key);
        if (!v) return true;
        if (!v->is_boolean()) return wrong_type(err, key, *v, "a boolean");
        out = v->get<bool>();
        return true;
    };
    if (!flag("store", r.store) || !flag("parallel_tool_calls", r.parallel_tool_calls)) return std::nullopt;
    if (const ojson* v = field("previous_response_id")) {
        if (!v->is_string() || v->get<std::string>().empty())
            return wrong_type(err, "previous_response_id", *v, "a response id (\"resp_...\")"), std::nullopt;
        r.previous_response_id = v->get<std::string>();
    }
    if (const ojson* v = field("metadata")) {
        // OpenAI's limits: 16 pairs, keys up to 64 characters, string values up to 512.
        if (!v->is_object()) return wrong_type(err, "metadata", *v, "an object of strings"), std::nullopt;
        if (v->size() > 16)
            return fail(err, "'metadata' has " + std::to_string(v->size()) + " keys; at most 16", "metadata",
                        "invalid_value"),
                   std::nullopt;
        for (const auto& [k, val] : v->items())
            if (k.size() > 64 || !val.is_string() || val.get<std::string>().size() > 512)
                return fail(err,
                            "'metadata." + k + "' must be a string of at most 512 characters under a key of at most 64",
                            "metadata." + k, "invalid_value"),
                       std::nullopt;
        r.metadata = *v;
    }
    if (const ojson* v = field("text"))
        if (!chat_response_format(*v, r.text_format, chat, err)) return std::nullopt;

    auto parsed = parse_openai_request(chat.dump(), true, err);
    if (!parsed) {
        rename_params(err);
        return std::nullopt;
    }
    r.chat = std::move(*parsed);
    return r;
}

ojson conversation_messages(const ConversationTurn* last) {
    std::vector<const ConversationTurn*> turns;
    for (const ConversationTurn* t = last; t; t = t->parent.get()) turns.push_back(t);
    ojson out = ojson::array();
    for (auto it = turns.rbegin(); it != turns.rend(); ++it)
        for (const auto& m : (*it)->messages) out.push_back(m);
    return out;
}

void continue_conversation(ResponsesRequest& req, const ConversationTurn* previous, const std::string& id) {
    ojson messages = ojson::array();
    if (req.instructions) messages.push_back({{"role", "system"}, {"content", *req.instructions}});
    for (auto& m : conversation_messages(previous)) messages.push_back(std::move(m));
    for (const auto& m : req.input_messages) messages.push_back(m);
    // A tool message names its function (Llama 3's and others' templates render it), from the call.
    std::map<std::string, std::string> names;
    for (auto& m : messages) {
        if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array())
            for (const auto& c : *calls) names[string_field(c, "id")] = string_field(c["function"], "name");
        if (string_field(m, "role") == "tool" && !m.contains("name"))
            if (auto n = names.find(string_field(m, "tool_call_id")); n != names.end()) m["name"] = n->second;
    }
    req.chat.messages = std::move(messages);
    req.chat.session = previous ? previous->session : req.store ? "responses/" + id : std::string();
}

void ResponseStore::put(const std::string& tenant, const std::string& id, json response,
                        std::shared_ptr<const ConversationTurn> turn) {
    Entry e{tenant, std::move(response), std::move(turn), 0, std::chrono::steady_clock::now()};
    e.n_bytes = id.size() + e.response.dump().size() + (e.turn ? e.turn->messages.dump().size() : 0);
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = by_id_.find(id); it != by_id_.end()) {
        n_bytes_ -= it->second.first.n_bytes;
        lru_.erase(it->second.second);
        by_id_.erase(it);
    }
    lru_.push_front(id);
    n_bytes_ += e.n_bytes;
    by_id_.emplace(id, std::make_pair(std::move(e), lru_.begin()));
    evict_locked(std::chrono::steady_clock::now());
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& tenant, const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    evict_locked(std::chrono::steady_clock::now());
    auto it = by_id_.find(id);
    if (it == by_id_.end() || it->second.first.tenant != tenant) return std::nullopt;
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return it->second.first;
}

size_t ResponseStore::size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return by_id_.size();
}

void ResponseStore::evict_locked(std::chrono::steady_clock::time_point now) {
    // Over count or bytes: the least recently used go. Expired: scanned from the LRU end, where the
    // oldest usually are (a touch does not renew the ttl: it counts from the store).
    while (!lru_.empty()) {
        auto it = by_id_.find(lru_.back());
        const bool over = by_id_.size() > max_entries_ || n_bytes_ > max_bytes_;
        if (!over && now - it->second.first.stored < ttl_) break;
        n_bytes_ -= it->second.first.n_bytes;
        by_id_.erase(it);
        lru_.pop_back();
    }
    for (auto it = by_id_.begin(); it != by_id_.end();) {
        if (now - it->second.first.stored >= ttl_) {
            n_bytes_ -= it->second.first.n_bytes;
            lru_.erase(it->second.second);
            it = by_id_.erase(it);
        } else {
            ++it;
        }
    }
}

ApiError response_not_found(const std::string& id, const char* param) {
    return ApiError{
        404,
        (std::string(param) == "previous_response_id" ? "Previous response with id '" : "Response with id '") + id +
            "' not found.",
        "invalid_request_error", param,
        std::string(param) == "previous_response_id" ? "previous_response_not_found" : "not_found"};
}

std::string new_response_id() {
    return "resp_" + random_id(32);
}

json responses_usage(const GenerationResult& r) {
    const RequestMetrics& m = r.metrics;
    return {{"input_tokens", m.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", m.cached_tokens}}},
            {"output_tokens", m.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", m.prompt_tokens + m.completion_tokens}};
}

json response_object(const ResponsesRequest& req, const std::string& id, int64_t created_at, const char* status,
                     const json& output, const json& usage) {
    const std::string st = status;
    return {{"id", id},
            {"object", "response"},
            {"created_at", created_at},
            {"status", st},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", st == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"instructions", req.instructions ? json(*req.instructions) : json(nullptr)},
            {"max_output_tokens", req.max_output_tokens ? json(*req.max_output_tokens) : json(nullptr)},
            {"max_tool_calls", nullptr},
            {"metadata", json::parse(req.metadata.dump())},
            {"model", req.chat.model},
            {"output", output},
            {"parallel_tool_calls", req.parallel_tool_calls},
            {"previous_response_id", req.previous_response_id.empty() ? json(nullptr) : json(req.previous_response_id)},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"service_tier", req.service_tier},
            {"store", req.store},
            {"temperature", req.temperature},
            {"text", {{"format", json::parse(req.text_format.dump())}}},
            {"tool_choice", json::parse(req.tool_choice.dump())},
            {"tools", json::parse(req.tools.dump())},
            {"top_logprobs", 0},
            {"top_p", req.top_p},
            {"truncation", "disabled"},
            {"usage", usage},
            {"user", req.chat.user.empty() ? json(nullptr) : json(req.chat.user)}};
}

namespace {

json message_item(const std::string& id, const char* status, const std::string& text) {
    return {{"id", id},
            {"type", "message"},
            {"status", status},
            {"role", "assistant"},
            {"content", json::array({{{"type", "output_text"},
                                      {"text", text},
                                      {"annotations", json::array()},
                                      {"logprobs", json::array()}}})}};
}

json function_call_item(const std::string& id, const char* status, const json& call) {
    return {{"id", id},
            {"type", "function_call"},
            {"status", status},
            {"arguments", call["function"]["arguments"]},
            {"call_id", call["id"]},
            {"name", call["function"]["name"]}};
}

}  // namespace

ResponsesAnswer::ResponsesAnswer(ResponsesRequest req, std::string id, int64_t created_at,
                                 std::shared_ptr<ResponseStore> store, std::string tenant,
                                 std::shared_ptr<const ConversationTurn> previous)
    : req_(std::move(req)),
      id_(std::move(id)),
      created_at_(created_at),
      store_(std::move(store)),
      tenant_(std::move(tenant)),
      previous_(std::move(previous)) {}

void ResponsesAnswer::store_turn(const json& response, const ChoiceOutput& out) {
    if (!req_.store || !store_) return;
    auto turn = std::make_shared<ConversationTurn>();
    turn->parent = previous_;
    turn->session = req_.chat.session;
    turn->messages = req_.input_messages;
    ojson assistant = {{"role", "assistant"}, {"content", out.content}};
    if (!out.tool_calls.empty()) {
        if (out.content.empty()) assistant["content"] = nullptr;
        assistant["tool_calls"] = ojson::array();
        for (const auto& c : out.tool_calls)
            assistant["tool_calls"].push_back(
                {{"id", c["id"]},
                 {"type", "function"},
                 {"function",
                  {{"name", c["function"]["name"]},
                   {"arguments", template_arguments(c["function"]["arguments"].get<std::string>())}}}});
    }
    turn->messages.push_back(std::move(assistant));
    store_->put(tenant_, id_, response, std::move(turn));
}

json ResponsesAnswer::answer(const GenerationResult& r, const ChoiceOutput& out, const std::string&) {
    const bool incomplete = r.finish == FinishReason::LENGTH;
    ChoiceOutput kept = out;
    if (!req_.parallel_tool_calls && kept.tool_calls.size() > 1) kept.tool_calls = json::array({kept.tool_calls[0]});
    json output = json::array();
    const std::string hex = id_.substr(5);
    if (!kept.content.empty() || kept.tool_calls.empty())
        output.push_back(message_item("msg_" + hex, incomplete ? "incomplete" : "completed", kept.content));
    for (size_t i = 0; i < kept.tool_calls.size(); i++)
        output.push_back(function_call_item("fc_" + hex + "_" + std::to_string(i), "completed", kept.tool_calls[i]));
    json response =
        response_object(req_, id_, created_at_, incomplete ? "incomplete" : "completed", output, responses_usage(r));
    store_turn(response, kept);
    return response;
}

std::string ResponsesAnswer::event(const std::string& type, json data) {
    data["type"] = type;
    data["sequence_number"] = seq_++;
    return sse_typed_event(type, data);
}

std::string ResponsesAnswer::stream_open() {
    const json response = response_object(req_, id_, created_at_, "in_progress", json::array(), nullptr);
    std::string s =
        event("response.created", {{"response", response}});  // in turn: each takes the next sequence_number
    return s + event("response.in_progress", {{"response", response}});
}

std::string ResponsesAnswer::open_message() {
    message_open_ = true;
    message_id_ = "msg_" + id_.substr(5);
    if (!output_.empty()) message_id_.append("_").append(std::to_string(output_.size()));
    text_.clear();
    const int index = (int)output_.size();
    json item = message_item(message_id_, "in_progress", "");
    item["content"] = json::array();
    std::string s = event("response.output_item.added", {{"output_index", index}, {"item", item}});
    return s + event("response.content_part.added", {{"item_id", message_id_},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"part",
                                                      {{"type", "output_text"},
                                                       {"text", ""},
                                                       {"annotations", json::array()},
                                                       {"logprobs", json::array()}}}});
}

std::string ResponsesAnswer::close_message(const char* status) {
    message_open_ = false;
    const int index = (int)output_.size();
    json item = message_item(message_id_, status, text_);
    std::string s = event("response.output_text.done", {{"item_id", message_id_},
                                                        {"output_index", index},
                                                        {"content_index", 0},
                                                        {"text", text_},
                                                        {"logprobs", json::array()}});
    s += event("response.content_part.done",
               {{"item_id", message_id_}, {"output_index", index}, {"content_index", 0}, {"part", item["content"][0]}});
    s += event("response.output_item.done", {{"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
    return s;
}

std::string ResponsesAnswer::stream_delta(const json& delta) {
    std::string s;
    if (auto c = delta.find("content"); c != delta.end() && c->is_string()) {
        const std::string piece = c->get<std::string>();
        if (piece.empty()) return s;
        if (!message_open_) s += open_message();
        text_ += piece;
        seen_.content += piece;
        s += event("response.output_text.delta", {{"item_id", message_id_},
                                                  {"output_index", (int)output_.size()},
                                                  {"content_index", 0},
                                                  {"delta", piece},
                                                  {"logprobs", json::array()}});
    }
    if (auto calls = delta.find("tool_calls"); calls != delta.end())
        for (const json& call : *calls) {
            if (!req_.parallel_tool_calls && !seen_.tool_calls.empty()) continue;  // one call, as asked
            if (message_open_) s += close_message("completed");
            const int index = (int)output_.size();
            const std::string item_id = "fc_" + id_.substr(5) + "_" + std::to_string(index);
            json item = function_call_item(item_id, "in_progress", call);
            const std::string arguments = item["arguments"].get<std::string>();
            item["arguments"] = "";
            s += event("response.output_item.added", {{"output_index", index}, {"item", item}});
            s += event("response.function_call_arguments.delta",
                       {{"item_id", item_id}, {"output_index", index}, {"delta", arguments}});
            s += event("response.function_call_arguments.done", {{"item_id", item_id},
                                                                 {"output_index", index},
                                                                 {"name", call["function"]["name"]},
                                                                 {"arguments", arguments}});
            item["arguments"] = arguments;
            item["status"] = "completed";
            s += event("response.output_item.done", {{"output_index", index}, {"item", item}});
            output_.push_back(std::move(item));
            seen_.tool_calls.push_back(call);
        }
    return s;
}

std::string ResponsesAnswer::stream_finish(const GenerationResult& r, const std::string&) {
    const bool incomplete = r.finish == FinishReason::LENGTH;
    std::string s;
    if (!message_open_ && output_.empty())
        s += open_message();  // an empty output is an empty message, as answer() gives
    if (message_open_) s += close_message(incomplete ? "incomplete" : "completed");
    const char* status = incomplete ? "incomplete" : "completed";
    const json response = response_object(req_, id_, created_at_, status, output_, responses_usage(r));
    store_turn(response, seen_);
    return s + event(incomplete ? "response.incomplete" : "response.completed", {{"response", response}});
}

std::string ResponsesAnswer::stream_error(const ApiError& e) {
    // OpenAI's stream reports a failure as an `error` event, then response.failed.
    std::string s = event("error", {{"code", e.code.empty() ? json(nullptr) : json(e.code)},
                                    {"message", e.message},
                                    {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
    json response = response_object(req_, id_, created_at_, "failed", output_, nullptr);
    response["error"] = {{"code", e.code.empty() ? "server_error" : e.code}, {"message", e.message}};
    return s + event("response.failed", {{"response", response}});
}

}  // namespace steward::serve
