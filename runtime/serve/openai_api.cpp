// The OpenAI-compatible API's bodies: parsing and validation of requests, the model field, the
// prompt, and the responses, chunks and errors the HTTP server sends (openai_api.h).
#include "serve/openai_api.h"

#include <charconv>
#include <cmath>
#include <map>
#include <mutex>

#include "grammar/constraint.h"
#include "template/chat_template.h"

namespace steward::serve {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool fail(ApiError& err, int status, std::string message, std::string param = "", std::string code = "") {
    err.status = status;
    err.message = std::move(message);
    err.type = status == 404 ? "invalid_request_error" : err.type;
    err.param = std::move(param);
    err.code = std::move(code);
    return false;
}

// Nesting deeper than k_max_json_depth is refused before parsing: responses echo nothing of the
// body, but a value this deep means nothing in these APIs and costs stack in any later recursion.
bool depth_ok(std::string_view s) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (char c : s) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > k_max_json_depth) return false;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return true;
}

const char* type_name(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned: return "an integer";
        case json::value_t::number_float: return "a number";
        case json::value_t::string: return "a string";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        default: return "a value";
    }
}

// Typed optional fields of one JSON object; null counts as absent (clients send explicit nulls).
class Fields {
public:
    Fields(const json& obj, ApiError& err) : o_(obj), err_(err) {}
    const json* find(const char* key) const {
        auto it = o_.find(key);
        if (it == o_.end() || it->is_null()) return nullptr;
        return &*it;
    }
    bool wrong(const char* key, const json& v, const char* want) {
        return fail(err_, 400, std::string("'") + key + "' must be " + want + ", not " + type_name(v), key, "invalid_type");
    }
    bool range(const char* key, const std::string& value, const char* want) {
        return fail(err_, 400, std::string("'") + key + "' is " + value + "; it must be " + want, key, "invalid_value");
    }
    bool str(const char* key, std::string& out) {
        const json* v = find(key);
        if (!v) return true;
        if (!v->is_string()) return wrong(key, *v, "a string");
        out = v->get<std::string>();
        return true;
    }
    bool boolean(const char* key, bool& out) {
        const json* v = find(key);
        if (!v) return true;
        if (!v->is_boolean()) return wrong(key, *v, "a boolean");
        out = v->get<bool>();
        return true;
    }
    template <typename T>
    bool integer(const char* key, T& out, int64_t lo, int64_t hi) {
        const json* v = find(key);
        if (!v) return true;
        int64_t x = 0;
        if (v->is_number_unsigned()) {
            const uint64_t u = v->get<uint64_t>();
            if (u > (uint64_t)INT64_MAX) return range(key, std::to_string(u), ("in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
            x = (int64_t)u;
        } else if (v->is_number_integer()) {
            x = v->get<int64_t>();
        } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                   std::fabs(v->get<double>()) < 9e15) {
            x = (int64_t)v->get<double>();  // 2.0 is an integer in JSON's eyes
        } else {
            return wrong(key, *v, "an integer");
        }
        if (x < lo || x > hi) return range(key, std::to_string(x), ("in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
        out = (T)x;
        return true;
    }
    bool number(const char* key, float& out, double lo, double hi, const char* want) {
        const json* v = find(key);
        if (!v) return true;
        if (!v->is_number()) return wrong(key, *v, "a number");
        const double x = v->get<double>();
        if (!(x >= lo && x <= hi)) return range(key, dump(*v), want);
        out = (float)x;
        return true;
    }

private:
    const json& o_;
    ApiError& err_;
};

bool parse_stop(const json& body, OpenAiRequest& r, ApiError& err) {
    auto it = body.find("stop");
    if (it == body.end() || it->is_null()) return true;
    std::vector<std::string> stop;
    if (it->is_string()) {
        stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
        for (const auto& s : *it) {
            if (!s.is_string()) return fail(err, 400, std::string("'stop' must be a string or an array of strings; it holds ") + type_name(s), "stop", "invalid_type");
            stop.push_back(s.get<std::string>());
        }
    } else {
        return fail(err, 400, std::string("'stop' must be a string or an array of strings, not ") + type_name(*it), "stop", "invalid_type");
    }
    if ((int)stop.size() > k_max_stop)
        return fail(err, 400, "'stop' has " + std::to_string(stop.size()) + " strings; at most " + std::to_string(k_max_stop), "stop", "invalid_value");
    for (const auto& s : stop)
        if (s.empty() || s.size() > k_max_stop_bytes)
            return fail(err, 400, "'stop' strings must be 1 to " + std::to_string(k_max_stop_bytes) + " bytes; one is " + std::to_string(s.size()), "stop", "invalid_value");
    r.stop = std::move(stop);
    return true;
}

bool parse_logit_bias(const json& body, OpenAiRequest& r, ApiError& err) {
    auto it = body.find("logit_bias");
    if (it == body.end() || it->is_null()) return true;
    if (!it->is_object()) return fail(err, 400, std::string("'logit_bias' must be an object of token id -> bias, not ") + type_name(*it), "logit_bias", "invalid_type");
    for (const auto& [k, v] : it->items()) {
        int32_t id = -1;
        auto [p, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
        if (ec != std::errc() || p != k.data() + k.size() || id < 0)
            return fail(err, 400, "'logit_bias' key '" + k + "' is not a token id (a non-negative integer)", "logit_bias", "invalid_value");
        if (!v.is_number()) return fail(err, 400, "'logit_bias' value for " + k + " must be a number, not " + type_name(v), "logit_bias", "invalid_type");
        const double b = v.get<double>();
        if (!(b >= -100 && b <= 100)) return fail(err, 400, "'logit_bias' value for " + k + " is " + dump(v) + "; it must be in [-100, 100]", "logit_bias", "invalid_value");
        r.logit_bias.emplace_back(id, (float)b);
    }
    return true;
}

bool parse_messages(const json& body, OpenAiRequest& r, ApiError& err) {
    auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return fail(err, 400, "'messages' is required: an array of {role, content}", "messages", "missing_field");
    if (!it->is_array()) return fail(err, 400, std::string("'messages' must be an array, not ") + type_name(*it), "messages", "invalid_type");
    if (it->empty()) return fail(err, 400, "'messages' is empty; give at least one message", "messages", "invalid_value");
    for (size_t i = 0; i < it->size(); i++) {
        const json& m = (*it)[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return fail(err, 400, "'" + at + "' must be an object, not " + type_name(m), at, "invalid_type");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string())
            return fail(err, 400, "'" + at + ".role' must be a string", at + ".role", "invalid_type");
        const std::string rs = role->get<std::string>();
        if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer")
            return fail(err, 400, "'" + at + ".role' is '" + rs + "'; it must be system, developer, user, assistant or tool", at + ".role", "invalid_value");
        auto c = m.find("content");
        // An assistant message may go without content (a tool call, or an empty turn); the others may not.
        if ((c == m.end() || c->is_null()) && rs != "assistant")
            return fail(err, 400, "'" + at + ".content' is " + (c == m.end() ? "missing" : "null") + "; a " + rs +
                                      " message needs content (a string or text parts; only an assistant message may omit it)",
                        at + ".content", c == m.end() ? "missing_field" : "invalid_type");
        if (c != m.end() && !c->is_null() && !c->is_string()) {
            if (!c->is_array()) return fail(err, 400, "'" + at + ".content' must be a string or an array of parts, not " + type_name(*c), at + ".content", "invalid_type");
            for (const auto& part : *c) {
                // A registered document by reference (docs/reuse.md): taken out by parse_reuse_fields.
                if (part.is_object() && string_field(part, "type") == "document") continue;
                if (!part.is_object() || string_field(part, "type") != "text" || !part.contains("text") || !part["text"].is_string())
                    return fail(err, 400, "'" + at + ".content' parts must be {\"type\": \"text\", \"text\": ...} or {\"type\": \"document\", \"id\": ...}: other parts (images, audio) are not supported", at + ".content", "invalid_value");
            }
        }
    }
    r.messages = ojson::parse(it->dump());
    if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
        if (!t->is_array()) return fail(err, 400, std::string("'tools' must be an array, not ") + type_name(*t), "tools", "invalid_type");
        for (size_t i = 0; i < t->size(); i++) {
            const json& tool = (*t)[i];
            const std::string at = "tools[" + std::to_string(i) + "]";
            const std::string want = " (a tool is {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}})";
            if (!tool.is_object()) return fail(err, 400, "'" + at + "' must be an object, not " + type_name(tool) + want, at, "invalid_type");
            if (tool.value("type", json()) != "function")
                return fail(err, 400, "'" + at + ".type' must be \"function\"" + want, at + ".type", "invalid_value");
            auto fn = tool.find("function");
            if (fn == tool.end() || !fn->is_object())
                return fail(err, 400, "'" + at + ".function' must be an object" + want, at + ".function", "invalid_type");
            auto name = fn->find("name");
            if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
                return fail(err, 400, "'" + at + ".function.name' must be a non-empty string" + want, at + ".function.name",
                            name == fn->end() ? "missing_field" : "invalid_value");
            if (auto p = fn->find("parameters"); p != fn->end() && !p->is_object())
                return fail(err, 400, "'" + at + ".function.parameters' must be a JSON Schema object, not " + type_name(*p), at + ".function.parameters", "invalid_type");
            if (auto d = fn->find("description"); d != fn->end() && !d->is_string() && !d->is_null())
                return fail(err, 400, "'" + at + ".function.description' must be a string, not " + type_name(*d), at + ".function.description", "invalid_type");
        }
        if (!t->empty()) r.tool_specs = ojson::parse(t->dump());
    }
    return true;
}

// One document reference ({"id": ..., "version": ...}) at `at`.
bool parse_document_ref(const json& d, const std::string& at, std::vector<reuse::DocumentRef>& out, ApiError& err) {
    if (!d.is_object()) return fail(err, 400, "'" + at + "' must be an object {\"id\": ..., \"version\": ...}, not " + type_name(d), at, "invalid_type");
    auto id = d.find("id");
    if (id == d.end() || !id->is_string() || id->get<std::string>().empty())
        return fail(err, 400, "'" + at + ".id' must be a registered document's id (PUT /v1/documents/{id})", at + ".id",
                    id == d.end() ? "missing_field" : "invalid_value");
    reuse::DocumentRef ref{id->get<std::string>(), std::nullopt};
    if (auto v = d.find("version"); v != d.end() && !v->is_null()) {
        if (!v->is_number_unsigned() || v->get<uint64_t>() == 0)
            return fail(err, 400, "'" + at + ".version' must be a positive integer (or omitted: the current version)", at + ".version", "invalid_value");
        ref.version = v->get<uint64_t>();
    }
    if (out.size() >= 64) return fail(err, 400, "at most 64 documents go in one request", at, "invalid_value");
    out.push_back(std::move(ref));
    return true;
}

// The reuse extensions of a chat (docs/reuse.md): "documents", document content parts (removed
// from the messages, whose template sees text only), "labels", "tool_cache" and the tools'
// "cache" declarations.
bool parse_reuse_fields(const json& body, OpenAiRequest& r, ApiError& err) {
    if (auto d = body.find("documents"); d != body.end() && !d->is_null()) {
        if (!d->is_array()) return fail(err, 400, std::string("'documents' must be an array of {\"id\", \"version\"}, not ") + type_name(*d), "documents", "invalid_type");
        for (size_t i = 0; i < d->size(); i++)
            if (!parse_document_ref((*d)[i], "documents[" + std::to_string(i) + "]", r.document_refs, err)) return false;
    }
    for (size_t i = 0; i < r.messages.size(); i++) {
        auto c = r.messages[i].find("content");
        if (c == r.messages[i].end() || !c->is_array()) continue;
        ojson kept = ojson::array();
        for (size_t k = 0; k < c->size(); k++) {
            const ojson& part = (*c)[k];
            if (string_field(part, "type") != "document") {
                kept.push_back(part);
                continue;
            }
            if (!parse_document_ref(json::parse(part.dump()), "messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "]",
                                    r.document_refs, err))
                return false;
        }
        *c = std::move(kept);
    }
    if (auto l = body.find("labels"); l != body.end() && !l->is_null()) {
        if (!l->is_array()) return fail(err, 400, std::string("'labels' must be an array of strings, not ") + type_name(*l), "labels", "invalid_type");
        for (const auto& v : *l) {
            if (!v.is_string()) return fail(err, 400, "'labels' must hold strings only", "labels", "invalid_type");
            if (auto why = reuse::label_problem(v.get<std::string>())) return fail(err, 400, "'labels': " + *why, "labels", "invalid_value");
            r.labels.push_back(v.get<std::string>());
        }
        if (r.labels.size() > 64) return fail(err, 400, "'labels' holds more than 64 labels", "labels", "invalid_value");
    }
    if (auto t = body.find("tool_cache"); t != body.end() && !t->is_null()) {
        if (!t->is_string() || (*t != "off" && *t != "hint" && *t != "resolve"))
            return fail(err, 400, "'tool_cache' must be \"off\", \"hint\" (a call to a cached tool carries its cached result) or \"resolve\" (Steward answers it from the cache and continues)",
                        "tool_cache", "invalid_value");
        r.tool_cache = t->get<std::string>();
    }
    if (auto tools = body.find("tools"); tools != body.end() && tools->is_array())
        for (size_t i = 0; i < tools->size(); i++) {
            const json& tool = (*tools)[i];
            auto cache = tool.find("cache");
            if (cache == tool.end() || cache->is_null()) continue;
            const std::string at = "tools[" + std::to_string(i) + "].cache";
            if (!cache->is_object()) return fail(err, 400, "'" + at + "' must be an object {\"ttl_s\", \"scope\", \"key\"}", at, "invalid_type");
            reuse::ToolCachePolicy p;
            p.tool = tool["function"]["name"].get<std::string>();
            if (auto ttl = cache->find("ttl_s"); ttl != cache->end()) {
                if (!ttl->is_number() || !(ttl->get<double>() > 0) || ttl->get<double>() > 1e9)
                    return fail(err, 400, "'" + at + ".ttl_s' must be a number of seconds > 0", at + ".ttl_s", "invalid_value");
                p.ttl_s = ttl->get<double>();
            }
            if (auto sc = cache->find("scope"); sc != cache->end()) {
                auto scope = sc->is_string() ? reuse::parse_tool_scope(sc->get<std::string>()) : std::nullopt;
                if (!scope) return fail(err, 400, "'" + at + ".scope' must be \"session\" or \"tenant\"", at + ".scope", "invalid_value");
                if (*scope == reuse::ToolScope::PUBLIC)
                    return fail(err, 400, "'" + at + ".scope' \"public\" is declared by the operator only ([[tenant.tool_cache]] scope = \"public\"): a request may not share results with other tenants",
                                at + ".scope", "invalid_value");
                p.scope = *scope;
            }
            if (auto k = cache->find("key"); k != cache->end()) {
                if (!k->is_array()) return fail(err, 400, "'" + at + ".key' must be an array of argument names", at + ".key", "invalid_type");
                for (const auto& f : *k) {
                    if (!f.is_string()) return fail(err, 400, "'" + at + ".key' must hold argument names (strings)", at + ".key", "invalid_type");
                    p.key.push_back(f.get<std::string>());
                }
            }
            r.tool_policies[p.tool] = std::move(p);
        }
    // The template sees the tools as OpenAI defines them: the extension stays out of the prompt.
    if (r.tool_specs)
        for (auto& tool : *r.tool_specs)
            if (tool.is_object()) tool.erase("cache");
    if (r.tool_cache != "off" && r.n > 1)
        return fail(err, 400, "'tool_cache' \"" + r.tool_cache + "\" takes n = 1 (one conversation continues)", "tool_cache", "invalid_value");
    return true;
}

bool parse_prompt(const json& body, OpenAiRequest& r, ApiError& err) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return fail(err, 400, "'prompt' is required: a string or an array of token ids", "prompt", "missing_field");
    if (it->is_string()) {
        r.prompt = it->get<std::string>();
        return true;
    }
    if (it->is_array()) {
        if (it->size() > (size_t)k_max_prompts && (it->front().is_string() || it->front().is_array()))
            return fail(err, 400, "'prompt' holds " + std::to_string(it->size()) + " prompts; at most " + std::to_string(k_max_prompts) +
                                      " go in one request: split the batch", "prompt", "invalid_value");
        if (!it->empty() && (it->front().is_string() || it->front().is_array())) {
            // A batch: strings, or arrays of token ids; each is a prompt of its own.
            for (size_t k = 0; k < it->size(); k++) {
                const json& v = (*it)[k];
                const std::string at = "'prompt[" + std::to_string(k) + "]'";
                if (it->front().is_string()) {
                    if (!v.is_string())
                        return fail(err, 400, at + " is " + type_name(v) + "; a batch holds strings only, or token-id arrays only", "prompt", "invalid_type");
                    r.batch_prompts.push_back(v.get<std::string>());
                    continue;
                }
                if (!v.is_array() || v.empty())
                    return fail(err, 400, at + " must be a non-empty array of token ids like the first, not " + (v.is_array() ? std::string("an empty array") : type_name(v)), "prompt", "invalid_type");
                std::vector<int32_t> ids;
                for (const auto& t : v) {
                    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > (uint64_t)INT32_MAX) ||
                        t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
                        return fail(err, 400, at + " holds " + dump(t) + ", which is no token id (ids are 0 to the vocabulary's size - 1)", "prompt", "invalid_value");
                    ids.push_back((int32_t)t.get<int64_t>());
                }
                r.batch_ids.push_back(std::move(ids));
            }
            if (!r.batch_prompts.empty()) r.prompt = r.batch_prompts[0];
            if (!r.batch_ids.empty()) r.prompt_ids = r.batch_ids[0], r.prompt_is_ids = true;
            if (r.n_prompts() == 1) r.batch_prompts.clear(), r.batch_ids.clear();  // one prompt: no batch
            return true;
        }
        for (const auto& v : *it) {
            if (!v.is_number_integer())
                return fail(err, 400, std::string("'prompt' as an array must hold token ids (non-negative integers); it holds ") + type_name(v), "prompt", "invalid_type");
            if ((v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)INT32_MAX) || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
                return fail(err, 400, "'prompt' holds " + dump(v) + ", which is no token id (ids are 0 to the vocabulary's size - 1)", "prompt", "invalid_value");
            r.prompt_ids.push_back((int32_t)v.get<int64_t>());
        }
        if (r.prompt_ids.empty()) return fail(err, 400, "'prompt' is an empty array; give text or token ids", "prompt", "invalid_value");
        r.prompt_is_ids = true;
        return true;
    }
    return fail(err, 400, std::string("'prompt' must be a string or an array of token ids, not ") + type_name(*it), "prompt", "invalid_type");
}

}  // namespace

OpenAiRequest OpenAiRequest::for_prompt(int p) const {
    OpenAiRequest r = *this;
    r.batch_prompts.clear();
    r.batch_ids.clear();
    if (p < (int)batch_prompts.size()) r.prompt = batch_prompts[(size_t)p];
    if (p < (int)batch_ids.size()) r.prompt_ids = batch_ids[(size_t)p];
    return r;
}

namespace {

std::string message_text(const ojson& m) {
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) return "";
    if (c->is_string()) return c->get<std::string>();
    std::string s;
    for (const auto& part : *c)
        if (part.is_object() && part.contains("text") && part["text"].is_string()) s += part["text"].get<std::string>();
    return s;
}

std::vector<int> utf8_bytes(const std::string& s) {
    std::vector<int> b;
    for (unsigned char c : s) b.push_back(c);
    return b;
}

}  // namespace

std::string error_body(const ApiError& e) {
    json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
    if (!e.param.empty()) err["param"] = e.param;
    if (!e.code.empty()) err["code"] = e.code;
    return dump(json{{"error", err}});
}

std::optional<json> parse_json_body(std::string_view body, ApiError& err) {
    if (!depth_ok(body)) {
        fail(err, 400, "the body nests deeper than " + std::to_string(k_max_json_depth) + " levels", "", "invalid_json");
        return std::nullopt;
    }
    json j = json::parse(body.begin(), body.end(), nullptr, false);
    if (j.is_discarded()) {
        fail(err, 400, "the body is not valid JSON", "", "invalid_json");
        return std::nullopt;
    }
    return j;
}

std::optional<OpenAiRequest> parse_openai_request(std::string_view body, bool chat, ApiError& err) {
    auto parsed = parse_json_body(body, err);
    if (!parsed) return std::nullopt;
    const json& j = *parsed;
    if (!j.is_object()) {
        fail(err, 400, std::string("the body must be a JSON object, not ") + type_name(j), "", "invalid_type");
        return std::nullopt;
    }
    OpenAiRequest r;
    r.chat = chat;
    Fields f(j, err);
    // OpenAI's completions take logprobs as a count (0-5), chat as a flag with top_logprobs.
    bool ok = f.str("model", r.model) && (chat ? parse_messages(j, r, err) : parse_prompt(j, r, err)) &&
              f.integer("max_tokens", r.max_tokens, 1, 1 << 20) &&
              f.integer("max_completion_tokens", r.max_tokens, 1, 1 << 20) &&
              f.number("temperature", r.temperature, 0, 2, "in [0, 2]") && f.number("top_p", r.top_p, 0, 1, "in [0, 1]") &&
              f.integer("top_k", r.top_k, 0, 1 << 20) && f.integer("n", r.n, 1, k_max_n) && parse_stop(j, r, err) &&
              f.number("presence_penalty", r.presence_penalty, -2, 2, "in [-2, 2]") &&
              f.number("frequency_penalty", r.frequency_penalty, -2, 2, "in [-2, 2]") && parse_logit_bias(j, r, err) &&
              f.str("user", r.user) && f.str("session", r.session) && f.boolean("stream", r.stream) &&
              f.boolean("ignore_eos", r.ignore_eos);
    if (!ok) return std::nullopt;
    if (r.n_prompts() > 1 && r.n_prompts() * r.n > k_max_batch_choices) {
        fail(err, 400, std::to_string(r.n_prompts()) + " prompts x n " + std::to_string(r.n) + " are " +
                           std::to_string(r.n_prompts() * r.n) + " choices; at most " + std::to_string(k_max_batch_choices) +
                           " go in one request: split the batch or lower n", "n", "invalid_value");
        return std::nullopt;
    }
    if (chat) {
        // The template sees messages and tools with their keys in the order sent (tojson shows it),
        // as transformers' Python dicts keep it; json sorts keys, so read them again ordered.
        const ojson o = ojson::parse(body, nullptr, false);
        if (o.is_object()) {
            if (auto m = o.find("messages"); m != o.end()) r.messages = *m;
            if (auto t = o.find("tools"); r.tool_specs && t != o.end()) r.tool_specs = *t;
            if (auto rf = o.find("reasoning_format"); rf != o.end() && !rf->is_null()) {
                if (!rf->is_string() || (*rf != "auto" && *rf != "deepseek" && *rf != "none")) {
                    fail(err, 400, "'reasoning_format' must be \"auto\", \"deepseek\" (the think block goes to reasoning_content) or \"none\" (it stays in content)",
                         "reasoning_format", "invalid_value");
                    return std::nullopt;
                }
                r.reasoning_format = rf->get<std::string>();
            }
            if (auto k = o.find("chat_template_kwargs"); k != o.end() && !k->is_null()) {
                if (!k->is_object()) {
                    fail(err, 400, std::string("'chat_template_kwargs' must be an object, not ") + type_name(*j.find("chat_template_kwargs")),
                         "chat_template_kwargs", "invalid_type");
                    return std::nullopt;
                }
                r.chat_template_kwargs = *k;
            }
        }
        if (!parse_reuse_fields(j, r, err)) return std::nullopt;
    } else if (!parse_reuse_fields(j, r, err)) {  // documents and labels (the runtime puts the documents before the prompt)
        return std::nullopt;
    }
    if (const json* s = f.find("seed")) {
        if (!s->is_number_integer()) {
            f.wrong("seed", *s, "an integer");
            return std::nullopt;
        }
        r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : (uint64_t)s->get<int64_t>();
    }
    if (chat) {
        if (!f.boolean("logprobs", r.logprobs) || !f.integer("top_logprobs", r.top_logprobs, 0, 20)) return std::nullopt;
        if (r.top_logprobs > 0 && !r.logprobs) {
            fail(err, 400, "'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value");
            return std::nullopt;
        }
    } else {
        if (const json* lp = f.find("logprobs"); lp && lp->is_boolean()) {
            f.wrong("logprobs", *lp, "an integer (0-5) for /v1/completions");
            return std::nullopt;
        }
        int n_lp = -1;
        if (!f.integer("logprobs", n_lp, 0, 5) || !f.boolean("echo", r.echo)) return std::nullopt;
        if (n_lp >= 0) r.logprobs = true, r.top_logprobs = n_lp;
    }
    if (const json* so = f.find("stream_options")) {
        if (!so->is_object()) {
            f.wrong("stream_options", *so, "an object");
            return std::nullopt;
        }
        Fields sf(*so, err);
        if (!sf.boolean("include_usage", r.include_usage)) {
            err.param = "stream_options.include_usage";
            return std::nullopt;
        }
    }
    if (const json* rf = f.find("response_format"); rf && !rf->is_null()) {
        if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string()) {
            f.wrong("response_format", *rf, "an object {\"type\": ...}");
            return std::nullopt;
        }
        const std::string t = (*rf)["type"].get<std::string>();
        if (t == "json_object") {
            r.json_object = true;
        } else if (t == "json_schema") {
            const json* js = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
            if (!js || !js->is_object()) {
                fail(err, 400,
                     "response_format json_schema needs a 'json_schema' object: {\"type\": \"json_schema\", "
                     "\"json_schema\": {\"name\": \"...\", \"schema\": {...}}}",
                     "response_format.json_schema", "invalid_value");
                return std::nullopt;
            }
            if (js->contains("name") && !(*js)["name"].is_string()) {
                fail(err, 400, std::string("response_format.json_schema.name must be a string, not ") + type_name((*js)["name"]),
                     "response_format.json_schema.name", "invalid_type");
                return std::nullopt;
            }
            if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null()) {
                fail(err, 400, std::string("response_format.json_schema.strict must be a boolean, not ") + type_name((*js)["strict"]),
                     "response_format.json_schema.strict", "invalid_type");
                return std::nullopt;
            }
            if (!js->contains("schema") || !((*js)["schema"].is_object() || (*js)["schema"].is_boolean())) {
                fail(err, 400,
                     "response_format.json_schema needs a 'schema': a JSON Schema object (e.g. {\"type\": \"object\", "
                     "\"properties\": {...}})",
                     "response_format.json_schema.schema", "invalid_value");
                return std::nullopt;
            }
            // The schema as sent (property order matters: the output follows it).
            const ojson o = ojson::parse(body, nullptr, false);
            r.json_schema = o.is_object() ? o["response_format"]["json_schema"]["schema"].dump() : (*js)["schema"].dump();
        } else if (t != "text") {
            fail(err, 400, "response_format type '" + t + "' is not supported; use \"text\", \"json_object\" or \"json_schema\"",
                 "response_format", "unsupported_response_format");
            return std::nullopt;
        }
    }
    if (const json* g = f.find("grammar"); g && !g->is_null()) {
        if (!g->is_string()) {
            f.wrong("grammar", *g, "a string (GBNF)");
            return std::nullopt;
        }
        r.grammar = g->get<std::string>();
        if (r.grammar.empty()) {
            fail(err, 400, "'grammar' is empty; give a GBNF grammar with a root rule (root ::= ...) or leave it out",
                 "grammar", "invalid_grammar");
            return std::nullopt;
        }
        if (r.json_object || !r.json_schema.empty()) {
            fail(err, 400, "'grammar' and a JSON response_format both constrain the output; send only one of them",
                 "grammar", "invalid_value");
            return std::nullopt;
        }
    }
    // Compiled now (cached for the run): a bad schema or grammar is this request's 400.
    if (!r.json_schema.empty())
        if (auto c = compile_constraint(ConstraintKind::JSON_SCHEMA, r.json_schema); !c) {
            fail(err, 400, "response_format.json_schema.schema is not a usable JSON Schema: " + c.error().message,
                 "response_format.json_schema.schema", "invalid_json_schema");
            return std::nullopt;
        }
    if (!r.grammar.empty())
        if (auto c = compile_constraint(ConstraintKind::GBNF, r.grammar); !c) {
            fail(err, 400, "'grammar' does not compile: " + c.error().message, "grammar", "invalid_grammar");
            return std::nullopt;
        }
    // tool_choice: "none", "auto" (the default), "required", or {"type": "function", "function": {"name": N}}.
    if (const json* tc = f.find("tool_choice"); tc && !tc->is_null()) {
        if (!chat) {
            fail(err, 400, "'tool_choice' is for /v1/chat/completions (with 'tools'); remove it", "tool_choice", "invalid_value");
            return std::nullopt;
        }
        if (tc->is_string()) {
            r.tool_choice = tc->get<std::string>();
            if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tool_choice != "required") {
                fail(err, 400, "'tool_choice' is '" + r.tool_choice + "'; use \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice", "invalid_value");
                return std::nullopt;
            }
        } else if (tc->is_object() && string_field(*tc, "type") == "function" && tc->contains("function") &&
                   (*tc)["function"].is_object() && (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
            r.tool_choice = "function";
            r.tool_choice_name = (*tc)["function"]["name"].get<std::string>();
        } else {
            fail(err, 400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}", "tool_choice", "invalid_value");
            return std::nullopt;
        }
        const bool forced = r.tool_choice == "required" || r.tool_choice == "function";
        if (forced && !r.tool_specs) {
            fail(err, 400, "'tool_choice' " + r.tool_choice + " needs 'tools' to call; add them or remove tool_choice",
                 "tool_choice", "invalid_value");
            return std::nullopt;
        }
        if (forced && (r.json_object || !r.json_schema.empty() || !r.grammar.empty())) {
            fail(err, 400, "'tool_choice' " + r.tool_choice + " constrains the output to a tool call, as does "
                           "response_format or grammar; send only one of them", "tool_choice", "invalid_value");
            return std::nullopt;
        }
        if (r.tool_choice == "function") {
            bool known = false;
            for (const auto& t : *r.tool_specs)
                known = known || (t.is_object() && t.contains("function") && t["function"].is_object() &&
                                  string_field(t["function"], "name") == r.tool_choice_name);
            if (!known) {
                fail(err, 400, "'tool_choice' names \"" + r.tool_choice_name + "\", which is none of 'tools'; name one of them",
                     "tool_choice", "invalid_value");
                return std::nullopt;
            }
        }
    }
    return r;
}

bool apply_tool_choice(OpenAiRequest& req, const PoolInfo& pool, ApiError& err) {
    if (!req.chat || !req.tool_specs || (req.tool_choice != "required" && req.tool_choice != "function")) return true;
    auto g = tool_call_gbnf(detect_tool_call_format(pool.chat_template), *req.tool_specs, req.tool_choice_name);
    if (!g) return fail(err, 400, "'tool_choice' " + req.tool_choice + " cannot be enforced: " + g.error().message, "tool_choice", "invalid_value");
    if (auto c = compile_constraint(ConstraintKind::GBNF, *g); !c)
        return fail(err, 400, "'tool_choice' " + req.tool_choice + ": the tools' parameters give no usable grammar: " + c.error().message,
                    "tool_choice", "invalid_value");
    req.grammar = std::move(*g);
    return true;
}

std::optional<ModelTarget> resolve_model(const std::string& model, const std::vector<PoolInfo>& pools, const Config& config,
                                         ApiError& err) {
    ModelTarget t;
    if (model.empty() || model == k_routed_model) return t;
    for (const auto& p : pools)
        if (p.name == model) return t.pool = model, t;
    for (const auto& b : config.buckets)
        if (b.name == model) return t.bucket_hint = model, t;
    std::string names = k_routed_model;
    for (const auto& p : pools) names += ", " + p.name;
    for (const auto& b : config.buckets) names += ", " + b.name;
    fail(err, 404, "The model '" + model + "' does not exist (models: " + names + ")", "model", "model_not_found");
    return std::nullopt;
}

json models_list(const std::vector<PoolInfo>& pools, const Config& config, int64_t created) {
    json data = json::array();
    auto entry = [&](const std::string& id, const char* kind) -> json& {
        data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "steward"}, {"steward_kind", kind}});
        return data.back();
    };
    // Pools first: a client that takes the first entry gets a model, not a route.
    for (const auto& p : pools) {
        json& e = entry(p.name, "pool");
        e["root"] = p.model_path;
        if (p.n_ctx > 0) e["max_model_len"] = p.n_ctx;  // vLLM's field
    }
    entry(k_routed_model, "routed")["steward_route"] = "the config's buckets and routing pick the pool";
    for (const auto& b : config.buckets) entry(b.name, "bucket")["steward_route"] = "bucket '" + b.name + "': its routing picks the pool";
    return {{"object", "list"}, {"data", data}};
}

namespace {

// One compiled template per distinct source (a pool's, usually one or two per process): compiling
// costs about as much as rendering, and a server renders per request.
Expected<std::shared_ptr<const CompiledTemplate>> compiled_template(const std::string& source) {
    static std::mutex mu;
    static std::map<std::string, std::shared_ptr<const CompiledTemplate>, std::less<>> cache;
    std::lock_guard<std::mutex> lk(mu);
    if (auto it = cache.find(source); it != cache.end()) return it->second;
    auto t = compile_template(source);
    if (!t) return t.error();
    if (cache.size() >= 64) cache.clear();
    cache.emplace(source, *t);
    return *t;
}

}  // namespace

std::optional<std::pair<size_t, size_t>> documents_span(const std::string& prompt,
                                                        const std::vector<std::shared_ptr<const reuse::Document>>& docs) {
    if (docs.empty()) return std::nullopt;
    const size_t t = prompt.find(docs.front()->text);
    if (t == std::string::npos) return std::nullopt;
    // From the block's header (<document id=.. version=..>: it names the version) when the documents
    // are rendered as reuse::documents_block; a template's own rendering: from the first text.
    size_t b = prompt.rfind("<document id=\"" + docs.front()->id + "\"", t);
    if (b == std::string::npos) b = t;
    const size_t e = prompt.find(docs.back()->text, b);
    if (e == std::string::npos) return std::nullopt;
    return std::make_pair(b, e + docs.back()->text.size());
}

Expected<std::string> render_prompt(const PoolInfo& pool, const OpenAiRequest& req) {
    // Text parts of a content array become one string: real templates expect content as text.
    ojson messages = req.messages;
    for (auto& m : messages)
        if (auto c = m.find("content"); c != m.end() && c->is_array()) *c = message_text(m);
    // Referenced documents (docs/reuse.md) go at one canonical place, whatever message listed them:
    // a template that takes `documents` (transformers' RAG convention) renders them itself; for the
    // rest they follow the system prompt (appended to a leading system message, else one of their
    // own). The same system prompt and documents then make the same prefix, so their KV is shared.
    const bool template_takes_documents = pool.chat_template.find("documents") != std::string::npos;
    if (!req.resolved_documents.empty() && !template_takes_documents) {
        const std::string block = reuse::documents_block(req.resolved_documents);
        if (!messages.empty() && string_field(messages[0], "role") == "system") {
            std::string c = messages[0].contains("content") && messages[0]["content"].is_string() ? messages[0]["content"].get<std::string>() : "";
            messages[0]["content"] = c.empty() ? block : c + "\n\n" + block;
        } else {
            messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", block}});
        }
    }
    if (!pool.chat_template.empty()) {
        auto t = compiled_template(pool.chat_template);
        if (!t) return make_error("the chat template of pool '", pool.name, "' does not parse: ", t.error().message);
        ChatTemplateInputs in;
        in.messages = std::move(messages);
        in.tools = req.tool_specs;
        in.add_generation_prompt = true;
        in.bos_token = pool.bos_token;
        in.eos_token = pool.eos_token;
        in.extra = req.chat_template_kwargs;
        if (!req.resolved_documents.empty() && template_takes_documents) {
            ojson docs = ojson::array();
            for (const auto& d : req.resolved_documents)
                docs.push_back({{"id", d->id}, {"title", d->id}, {"version", d->version}, {"text", d->text}});
            in.extra["documents"] = std::move(docs);
        }
        auto r = render_chat_template(**t, in);
        if (!r) return make_error("the chat template of pool '", pool.name, "' failed on these messages: ", r.error().message);
        return r;
    }
    return make_error("pool '", pool.name, "' has no chat template (its GGUF has no tokenizer.chat_template): give it one with ",
                      "[[pool]] chat_template_file = \"FILE.jinja\" (steward serve --chat-template-file FILE), or render ChatML ",
                      "with [[pool]] chat_template_fallback = \"chatml\"; /v1/completions takes a raw prompt");
}

PoolRendering render_for_pool(const OpenAiRequest& req, const PoolInfo& pool) {
    PoolRendering out;
    // The tool-call grammar is the pool's template's format: built on a copy, per pool.
    OpenAiRequest r = req;
    ApiError err;
    if (!apply_tool_choice(r, pool, err)) {
        err.message = "pool '" + pool.name + "': " + err.message;
        out.error = std::move(err);
        return out;
    }
    auto text = render_prompt(pool, r);
    if (!text) {
        out.error = ApiError{400, text.error().message, "invalid_request_error", "messages",
                             pool.chat_template.empty() ? "chat_template_missing" : "template_error"};
        return out;
    }
    out.text = std::move(*text);
    if (r.grammar != req.grammar) out.grammar = std::move(r.grammar);
    return out;
}

PoolPrompt ChatRenderer::render(const PromptPool& p) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_pool_.find(p.name);
    // A pool of the same name in another generation may have another template: rendered again.
    if (it == by_pool_.end() || it->second.first.chat_template != p.chat_template || it->second.first.bos_token != p.bos_token ||
        it->second.first.eos_token != p.eos_token) {
        PoolInfo info;
        info.name = p.name;
        info.chat_template = p.chat_template;
        info.chat_template_source = p.template_source;
        info.bos_token = p.bos_token;
        info.eos_token = p.eos_token;
        PoolRendering r = render_for_pool(req_, info);
        it = by_pool_.insert_or_assign(p.name, std::make_pair(std::move(info), std::move(r))).first;
    }
    const PoolRendering& r = it->second.second;
    PoolPrompt out{r.text, r.grammar, r.error ? r.error->message : std::string()};
    if (!r.error)
        if (const auto span = documents_span(r.text, req_.resolved_documents)) {
            out.documents_begin = span->first;
            out.documents_end = span->second;
        }
    return out;
}

std::optional<PoolInfo> ChatRenderer::pool(const std::string& name) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_pool_.find(name);
    if (it == by_pool_.end()) return std::nullopt;
    return it->second.first;
}

std::optional<std::string> ChatRenderer::text(const std::string& name) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_pool_.find(name);
    if (it == by_pool_.end() || it->second.second.error) return std::nullopt;
    return it->second.second.text;
}

std::optional<ApiError> ChatRenderer::error(const std::string& name) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_pool_.find(name);
    if (it == by_pool_.end()) return std::nullopt;
    return it->second.second.error;
}

GenerationRequest to_generation_request(const OpenAiRequest& req, const ModelTarget& target, const std::string& tenant,
                                        std::shared_ptr<ChatRenderer> renderer) {
    GenerationRequest g = to_generation_request(req, target, tenant, std::string());
    if (req.chat && renderer) g.render = [renderer = std::move(renderer)](const PromptPool& p) { return renderer->render(p); };
    return g;
}

GenerationRequest to_generation_request(const OpenAiRequest& req, const ModelTarget& target, const std::string& tenant,
                                        const std::string& rendered_prompt) {
    GenerationRequest g = req;  // what the body asked of the run, parsed into it
    if (req.chat) g.prompt = rendered_prompt;
    // The documents (parsed as document_refs, resolved by the server): the runtime puts them before a
    // completion's text prompt; a chat's renderer has placed them (PoolPrompt::documents_begin / end).
    // Either way the runtime keys their KV.
    for (const auto& d : req.resolved_documents) g.documents.push_back({d->id, d->version});
    g.tenant = tenant;
    g.bucket_hint = target.bucket_hint;
    g.pool = target.pool;
    g.tools = req.tool_specs.has_value();
    g.parse_special = req.chat;  // a rendered template spells its special tokens
    g.response_format = req.json_object || !req.json_schema.empty() ? "json" : "";  // the structured bucket's rule
    return g;
}

namespace {

ToolCallFormat tool_format_of(const OpenAiRequest& req, const PoolInfo* pool) {
    if (!req.chat || !req.tool_specs || !pool || req.tool_choice == "none") return ToolCallFormat::none;
    return detect_tool_call_format(pool->chat_template);
}

json tool_call_json(const std::string& id, const std::string& name, const std::string& arguments) {
    return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

}  // namespace

namespace {

// A chat to a pool whose template thinks, and reasoning_format not "none": its output's think block
// is reasoning_content. opened: the rendered prompt ends inside the block (DeepSeek-R1's "<think>\n").
bool reasoning_on(const OpenAiRequest& req, const PoolInfo* pool) {
    return req.chat && req.reasoning_format != "none" && pool && thinking_template(pool->chat_template);
}
bool reasoning_opened(const OpenAiRequest& req, const PoolInfo& pool) {
    auto p = render_prompt(pool, req);
    return p && prompt_opens_think(*p);
}

}  // namespace

ChoiceOutput parse_choice_output(const OpenAiRequest& req, const PoolInfo* pool, const std::string& whole, uint64_t id_seed) {
    ChoiceOutput out;
    std::string text = whole;
    if (reasoning_on(req, pool)) {
        ReasoningSplit s = split_reasoning(whole, reasoning_opened(req, *pool));
        out.reasoning = std::move(s.reasoning);
        out.has_reasoning = s.had_reasoning;
        text = std::move(s.content);
    }
    const ToolCallFormat f = tool_format_of(req, pool);
    if (f == ToolCallFormat::none) {
        out.content = text;
        return out;
    }
    ParsedOutput p = parse_tool_calls(f, text, id_seed);
    out.content = std::move(p.content);
    for (const ToolCall& c : p.tool_calls) out.tool_calls.push_back(tool_call_json(c.id, c.name, c.arguments));
    return out;
}

StreamOutput::StreamOutput(const OpenAiRequest& req, const PoolInfo* pool, uint64_t id_seed) : chat_(req.chat) {
    if (const ToolCallFormat f = tool_format_of(req, pool); f != ToolCallFormat::none) parser_.emplace(f, id_seed);
    if (reasoning_on(req, pool)) reasoning_.emplace(reasoning_opened(req, *pool));
}

std::vector<json> StreamOutput::deltas(std::vector<ToolCallDelta> d) {
    std::vector<json> out;
    for (ToolCallDelta& x : d) {
        if (x.kind == ToolCallDelta::Kind::content) {
            if (!x.content.empty()) out.push_back(json{{"content", std::move(x.content)}});
        } else {
            saw_tool_calls_ = true;
            json call = tool_call_json(x.id, x.name, x.arguments);
            call["index"] = x.index;
            out.push_back(json{{"tool_calls", json::array({std::move(call)})}});
        }
    }
    return out;
}

std::vector<json> StreamOutput::content(const std::string& piece) {
    if (parser_) return deltas(parser_->feed(piece));
    if (piece.empty()) return {};
    return {chat_ ? json{{"content", piece}} : json(piece)};
}

std::vector<json> StreamOutput::feed(const std::string& piece) {
    if (!reasoning_) return content(piece);
    std::vector<json> out;
    for (auto& [is_reasoning, text] : reasoning_->feed(piece)) {
        if (is_reasoning) {
            out.push_back(json{{"reasoning_content", std::move(text)}});
            continue;
        }
        for (json& d : content(text)) out.push_back(std::move(d));
    }
    return out;
}

std::vector<json> StreamOutput::finish() {
    std::vector<json> out;
    if (reasoning_)
        for (auto& [is_reasoning, text] : reasoning_->finish()) {
            if (is_reasoning) out.push_back(json{{"reasoning_content", std::move(text)}});
            else
                for (json& d : content(text)) out.push_back(std::move(d));
        }
    if (parser_)
        for (json& d : deltas(parser_->finish())) out.push_back(std::move(d));
    return out;
}

const char* openai_finish_reason(FinishReason r, bool tool_calls) {
    if (r == FinishReason::LENGTH) return "length";
    return tool_calls ? "tool_calls" : "stop";
}

ApiError error_for_result(const GenerationResult& r) {
    ApiError e;
    e.message = r.error.empty() ? std::string("the request finished ") + finish_reason_name(r.finish) : r.error;
    switch (r.finish) {
        case FinishReason::OVERLOADED:
            e.status = 429, e.type = "rate_limit_error", e.code = "overloaded";
            break;
        case FinishReason::TIMEOUT:
            e.status = 504, e.type = "timeout_error", e.code = "timeout";
            break;
        case FinishReason::CANCELLED:
            e.status = 503, e.type = "server_error", e.code = "cancelled";
            break;
        default:
            e.status = 400, e.type = "invalid_request_error", e.code = "generation_failed";
            break;
    }
    return e;
}

json usage_json(const std::vector<GenerationResult>& results, int per_prompt) {
    int prompt = 0, cached = 0, completion = 0;
    if (per_prompt <= 0) per_prompt = std::max<int>(1, (int)results.size());
    for (size_t k = 0; k < results.size(); k += (size_t)per_prompt)
        prompt += results[k].metrics.prompt_tokens, cached += results[k].metrics.cached_tokens;
    for (const auto& r : results) completion += r.metrics.completion_tokens;
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string response_id(bool chat, uint64_t handle) { return (chat ? "chatcmpl-" : "cmpl-") + std::to_string(handle); }

uint64_t parse_request_id(std::string_view id) {
    for (std::string_view prefix : {"chatcmpl-", "cmpl-"})
        if (id.substr(0, prefix.size()) == prefix) {
            id.remove_prefix(prefix.size());
            break;
        }
    uint64_t h = 0;
    auto [p, ec] = std::from_chars(id.data(), id.data() + id.size(), h);
    if (id.empty() || ec != std::errc() || p != id.data() + id.size()) return 0;
    return h;
}

namespace {

json chat_logprobs(const GenerationResult& r, const std::vector<TokenText>& texts, const std::vector<std::vector<TokenText>>& tops) {
    json content = json::array();
    for (size_t i = 0; i < texts.size() && i < r.logprobs.size(); i++) {
        json alts = json::array();
        if (i < tops.size() && i < r.top_logprobs.size())
            for (size_t k = 0; k < tops[i].size() && k < r.top_logprobs[i].size(); k++)
                alts.push_back({{"token", tops[i][k].text}, {"logprob", r.top_logprobs[i][k].logprob}, {"bytes", utf8_bytes(tops[i][k].text)}});
        content.push_back({{"token", texts[i].text}, {"logprob", r.logprobs[i]}, {"bytes", utf8_bytes(texts[i].text)}, {"top_logprobs", alts}});
    }
    return {{"content", content}};
}

json completion_logprobs(const GenerationResult& r, const std::vector<TokenText>& texts, const std::vector<std::vector<TokenText>>& tops,
                         size_t text_offset0) {
    json tokens = json::array(), lps = json::array(), top = json::array(), offsets = json::array();
    size_t off = text_offset0;
    for (size_t i = 0; i < texts.size() && i < r.logprobs.size(); i++) {
        tokens.push_back(texts[i].text);
        lps.push_back(r.logprobs[i]);
        offsets.push_back(off);
        off += texts[i].text.size();
        json alts = json::object();
        if (i < tops.size() && i < r.top_logprobs.size())
            for (size_t k = 0; k < tops[i].size() && k < r.top_logprobs[i].size(); k++) alts[tops[i][k].text] = r.top_logprobs[i][k].logprob;
        top.push_back(alts);
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", top}, {"text_offset", offsets}};
}

}  // namespace

json completion_response(const OpenAiRequest& req, uint64_t handle, int64_t created, const std::vector<GenerationResult>& results,
                         const std::vector<std::vector<TokenText>>& token_texts,
                         const std::vector<std::vector<std::vector<TokenText>>>& top_texts, const PoolInfo* pool) {
    return completion_response(req, handle, created, results, token_texts, top_texts,
                               std::vector<const PoolInfo*>(results.size(), pool));
}

json completion_response(const OpenAiRequest& req, uint64_t handle, int64_t created, const std::vector<GenerationResult>& results,
                         const std::vector<std::vector<TokenText>>& token_texts,
                         const std::vector<std::vector<std::vector<TokenText>>>& top_texts,
                         const std::vector<const PoolInfo*>& choice_pools) {
    static const std::vector<TokenText> no_texts;
    static const std::vector<std::vector<TokenText>> no_tops;
    json choices = json::array();
    for (size_t i = 0; i < results.size(); i++) {
        const GenerationResult& r = results[i];
        const auto& texts = i < token_texts.size() ? token_texts[i] : no_texts;
        const auto& tops = i < top_texts.size() ? top_texts[i] : no_tops;
        if (req.chat) {
            const PoolInfo* pool = i < choice_pools.size() ? choice_pools[i] : nullptr;
            ChoiceOutput out = parse_choice_output(req, pool, r.text, handle * 16 + i);
            json message = {{"role", "assistant"}, {"content", out.content}};
            if (out.has_reasoning) message["reasoning_content"] = out.reasoning;
            const bool has_tools = !out.tool_calls.empty();
            if (has_tools) {
                message["tool_calls"] = out.tool_calls;
                if (out.content.empty()) message["content"] = nullptr;  // as OpenAI answers a pure tool call
            }
            choices.push_back({{"index", i},
                               {"message", message},
                               {"logprobs", req.logprobs ? chat_logprobs(r, texts, tops) : json(nullptr)},
                               {"finish_reason", openai_finish_reason(r.finish, has_tools)}});
        } else {
            const size_t p = i / (size_t)std::max(1, req.n);  // the batch's prompt of this choice
            const std::string prefix =
                req.echo && !req.prompt_is_ids ? (p < req.batch_prompts.size() ? req.batch_prompts[p] : req.prompt) : "";
            choices.push_back({{"index", i},
                               {"text", prefix + r.text},
                               {"logprobs", req.logprobs ? completion_logprobs(r, texts, tops, prefix.size()) : json(nullptr)},
                               {"finish_reason", openai_finish_reason(r.finish, false)}});
        }
    }
    return {{"id", response_id(req.chat, handle)},
            {"object", req.chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", req.model.empty() ? std::string(k_routed_model) : req.model},  // the name asked for
            {"system_fingerprint", "steward"},
            {"choices", choices},
            {"usage", usage_json(results, req.n)}};
}

json stream_logprobs(const OpenAiRequest& req, const std::vector<float>& logprobs,
                     const std::vector<std::vector<TokenLogprob>>& top, const std::vector<TokenText>& texts,
                     const std::vector<std::vector<TokenText>>& top_texts, size_t text_offset0) {
    GenerationResult r;
    r.logprobs = logprobs;
    r.top_logprobs = top;
    return req.chat ? chat_logprobs(r, texts, top_texts) : completion_logprobs(r, texts, top_texts, text_offset0);
}

json stream_chunk(const OpenAiRequest& req, uint64_t handle, int64_t created, int index, const json& delta_or_text,
                  const char* finish_reason, const json& logprobs) {
    json choice = {{"index", index}};
    if (req.chat) choice["delta"] = delta_or_text.is_null() ? json::object() : delta_or_text;
    else choice["text"] = delta_or_text.is_null() ? json("") : delta_or_text;
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
    return {{"id", response_id(req.chat, handle)},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model.empty() ? std::string(k_routed_model) : req.model},
            {"choices", json::array({choice})}};
}

json stream_usage_chunk(const OpenAiRequest& req, uint64_t handle, int64_t created, const std::vector<GenerationResult>& results) {
    return {{"id", response_id(req.chat, handle)},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model.empty() ? std::string(k_routed_model) : req.model},
            {"choices", json::array()},
            {"usage", usage_json(results, req.n)}};
}

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

std::optional<TokenizeRequest> parse_tokenize_request(std::string_view body, ApiError& err) {
    auto j = parse_json_body(body, err);
    if (!j) return std::nullopt;
    if (!j->is_object()) {
        fail(err, 400, "the body must be a JSON object", "", "invalid_type");
        return std::nullopt;
    }
    TokenizeRequest r;
    Fields f(*j, err);
    if (!f.str("model", r.model) || !f.boolean("add_special", r.add_special)) return std::nullopt;
    const char* key = f.find("content") ? "content" : "prompt";
    if (!f.find(key)) {
        fail(err, 400, "'content' (or 'prompt') is required: the text to tokenize", "content", "missing_field");
        return std::nullopt;
    }
    if (!f.str(key, r.text)) return std::nullopt;
    return r;
}

std::optional<DetokenizeRequest> parse_detokenize_request(std::string_view body, ApiError& err) {
    auto j = parse_json_body(body, err);
    if (!j) return std::nullopt;
    if (!j->is_object()) {
        fail(err, 400, "the body must be a JSON object", "", "invalid_type");
        return std::nullopt;
    }
    DetokenizeRequest r;
    Fields f(*j, err);
    if (!f.str("model", r.model)) return std::nullopt;
    const json* t = f.find("tokens");
    if (!t || !t->is_array()) {
        fail(err, 400, "'tokens' is required: an array of token ids", "tokens", t ? "invalid_type" : "missing_field");
        return std::nullopt;
    }
    for (const auto& v : *t) {
        if (!v.is_number_integer()) {
            fail(err, 400, std::string("'tokens' must hold integers (token ids); it holds ") + type_name(v), "tokens", "invalid_type");
            return std::nullopt;
        }
        if ((v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)INT32_MAX) || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
            fail(err, 400, "'tokens' holds " + dump(v) + ", which is no token id (ids are 0 to the vocabulary's size - 1)", "tokens", "invalid_value");
            return std::nullopt;
        }
        r.tokens.push_back((int32_t)v.get<int64_t>());
    }
    return r;
}

std::optional<std::string> transfer_coding_refusal(const std::vector<std::string>& values) {
    if (values.empty()) return std::nullopt;
    const auto trimmed = [](const std::string& v) {
        const size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
        return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
    };
    const auto lower = [](std::string v) {
        for (char& c : v) c = (char)std::tolower((unsigned char)c);
        return v;
    };
    if (values.size() == 1 && lower(trimmed(values[0])) == "chunked") return std::nullopt;
    const std::string what = values.size() == 1 ? "'" + trimmed(values[0]) + "'" : std::to_string(values.size()) + " Transfer-Encoding fields";
    return "Transfer-Encoding " + what + " is not supported: send the body with Content-Length or 'Transfer-Encoding: chunked' alone";
}

}  // namespace steward::serve
