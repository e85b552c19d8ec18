#include "serve/reuse_api.h"

#include <cmath>
#include <map>

namespace steward::serve {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

ApiError bad(std::string message, std::string param, std::string code = "invalid_value") {
    return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

std::optional<json> parse_object(std::string_view body, ApiError& err) {
    auto j = parse_json_body(body, err);
    if (!j) return std::nullopt;
    if (!j->is_object()) {
        err = bad("the body must be a JSON object", "", "invalid_type");
        return std::nullopt;
    }
    return j;
}

bool label_allowed(const std::string& label, const TenantConfig& t) {
    for (const auto& l : t.labels)
        if (l == label) return true;
    for (const auto& p : t.allowed_labels) {
        if (!p.empty() && p.back() == '*' && label.compare(0, p.size() - 1, p, 0, p.size() - 1) == 0) return true;
        if (p == label) return true;
    }
    return false;
}

// A tool call's function arguments as an object: OpenAI's JSON text, or an object as some clients
// send it; discarded (or not an object) otherwise.
template <class J>
json call_arguments(const J& fn) {
    auto a = fn.find("arguments");
    if (a == fn.end()) return json(nullptr);
    if (a->is_string()) return json::parse(a->template get<std::string>(), nullptr, false);
    return a->is_object() ? json::parse(a->dump()) : json(nullptr);
}

}  // namespace

std::optional<reuse::DocumentStore::Put> parse_document_put(std::string_view body, ApiError& err) {
    auto j = parse_object(body, err);
    if (!j) return std::nullopt;
    reuse::DocumentStore::Put p;
    auto text = j->find("text");
    if (text == j->end() || !text->is_string()) {
        err = bad("'text' is required: the document's text (a string)", "text", text == j->end() ? "missing_field" : "invalid_type");
        return std::nullopt;
    }
    p.text = text->get<std::string>();
    if (auto v = j->find("version"); v != j->end() && !v->is_null()) {
        if (!v->is_number_unsigned() || v->get<uint64_t>() == 0) {
            err = bad("'version' must be a positive integer greater than the current one (or omitted: the next one)", "version");
            return std::nullopt;
        }
        p.version = v->get<uint64_t>();
    }
    if (auto t = j->find("ttl_s"); t != j->end() && !t->is_null()) {
        if (!t->is_number() || !std::isfinite(t->get<double>()) || t->get<double>() < 0) {
            err = bad("'ttl_s' must be a number of seconds >= 0 (0 or omitted: never expires)", "ttl_s");
            return std::nullopt;
        }
        p.ttl_s = t->get<double>();
    }
    if (auto a = j->find("acl"); a != j->end() && !a->is_null()) {
        if (!a->is_array()) {
            err = bad("'acl' must be an array of permission labels, e.g. [\"team:legal\", \"user:42\"]", "acl", "invalid_type");
            return std::nullopt;
        }
        for (const auto& l : *a) {
            if (!l.is_string()) {
                err = bad("'acl' must hold strings (permission labels)", "acl", "invalid_type");
                return std::nullopt;
            }
            p.acl.push_back(l.get<std::string>());
        }
    }
    return p;
}

json document_json(const reuse::Document& d, double now, bool with_text) {
    json j = {{"object", "document"},
              {"id", d.id},
              {"version", d.version},
              {"ttl_s", d.ttl_s},
              {"expires_in_s", d.ttl_s > 0 ? json(std::max(0.0, d.registered_at + d.ttl_s - now)) : json(nullptr)},
              {"acl", d.acl},
              {"bytes", d.text.empty() ? d.bytes : d.text.size()}};
    if (with_text) j["text"] = d.text;
    return j;
}

ApiError document_error(const reuse::DocumentRefusal& r) {
    const char* type = r.status == 403 ? "permission_error" : r.status == 404 ? "not_found_error" : "invalid_request_error";
    return {r.status ? r.status : 400, r.message, type, "documents", r.code};
}

std::optional<std::vector<std::string>> caller_labels(const Config& config, const std::string& tenant,
                                                      const std::vector<std::string>& requested, ApiError& err) {
    const TenantConfig* t = config.find_tenant(tenant);
    std::vector<std::string> out = t ? t->labels : std::vector<std::string>{};
    for (const auto& l : requested) {
        if (t && !label_allowed(l, *t)) {
            err = {403,
                   "the label '" + l + "' is not one tenant '" + tenant +
                       "' may claim: add it (or a pattern like \"user:*\") to its [[tenant]] allowed_labels, or leave it out of 'labels'",
                   "permission_error", "labels", "label_not_allowed"};
            return std::nullopt;
        }
        out.push_back(l);
    }
    return out;
}

std::optional<reuse::ToolCachePolicy> tool_policy(const Config& config, const std::string& tenant, const OpenAiRequest& req,
                                                  const std::string& tool) {
    if (const TenantConfig* t = config.find_tenant(tenant))
        for (const auto& c : t->tool_cache)
            if (c.tool == tool) {
                reuse::ToolCachePolicy p;
                p.tool = c.tool;
                p.ttl_s = c.ttl_s;
                p.scope = reuse::parse_tool_scope(c.scope).value_or(reuse::ToolScope::SESSION);
                p.key = c.key;
                return p;
            }
    if (auto it = req.tool_policies.find(tool); it != req.tool_policies.end()) return it->second;
    return std::nullopt;
}

int learn_tool_results(const OpenAiRequest& req, const Config& config, const reuse::ToolCaller& caller,
                       reuse::ToolResultCache& cache, double now) {
    // The calls made so far, by id: (tool, arguments).
    std::map<std::string, std::pair<std::string, json>> calls;
    int stored = 0;
    for (const auto& m : req.messages) {
        const std::string role = string_field(m, "role");
        if (role == "assistant") {
            auto tc = m.find("tool_calls");
            if (tc == m.end() || !tc->is_array()) continue;
            for (const auto& c : *tc) {
                if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
                const auto& f = c["function"];
                const std::string id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
                const std::string name = f.contains("name") && f["name"].is_string() ? f["name"].get<std::string>() : "";
                if (id.empty() || name.empty()) continue;
                json args = call_arguments(f);
                if (args.is_discarded() || !args.is_object()) continue;
                calls[id] = {name, std::move(args)};
            }
        } else if (role == "tool") {
            const std::string id = m.contains("tool_call_id") && m["tool_call_id"].is_string() ? m["tool_call_id"].get<std::string>() : "";
            auto it = calls.find(id);
            if (it == calls.end()) continue;
            auto policy = tool_policy(config, caller.tenant, req, it->second.first);
            if (!policy) continue;
            std::string content;
            if (auto c = m.find("content"); c != m.end() && c->is_string()) content = c->get<std::string>();
            else if (c != m.end() && c->is_array())
                for (const auto& part : *c)
                    if (part.is_object() && part.contains("text") && part["text"].is_string()) content += part["text"].get<std::string>();
            if (cache.store(*policy, caller, it->second.second, content, now)) stored++;
        }
    }
    return stored;
}

std::optional<ToolResultPut> parse_tool_result_put(std::string_view body, const Config& config, const std::string& tenant,
                                                   ApiError& err) {
    auto j = parse_object(body, err);
    if (!j) return std::nullopt;
    ToolResultPut out;
    auto tool = j->find("tool");
    if (tool == j->end() || !tool->is_string() || tool->get<std::string>().empty()) {
        err = bad("'tool' is required: the function's name", "tool", tool == j->end() ? "missing_field" : "invalid_value");
        return std::nullopt;
    }
    auto policy = tool_policy(config, tenant, OpenAiRequest{}, tool->get<std::string>());
    if (!policy) {
        err = {404,
               "tool '" + tool->get<std::string>() + "' is not cacheable for tenant '" + tenant +
                   "': declare it with [[tenant.tool_cache]] tool = \"" + tool->get<std::string>() + "\" (ttl_s, scope, key)",
               "not_found_error", "tool", "tool_not_cacheable"};
        return std::nullopt;
    }
    out.policy = *policy;
    auto args = j->find("arguments");
    if (args == j->end() || !(args->is_object() || args->is_string())) {
        err = bad("'arguments' is required: the call's arguments (a JSON object, or its text)", "arguments",
                  args == j->end() ? "missing_field" : "invalid_type");
        return std::nullopt;
    }
    out.arguments = args->is_string() ? json::parse(args->get<std::string>(), nullptr, false) : *args;
    if (out.arguments.is_discarded() || !out.arguments.is_object()) {
        err = bad("'arguments' must be a JSON object (or the text of one)", "arguments");
        return std::nullopt;
    }
    auto result = j->find("result");
    if (result == j->end() || !result->is_string()) {
        err = bad("'result' is required: the tool's result as the tool message's content (a string)", "result",
                  result == j->end() ? "missing_field" : "invalid_type");
        return std::nullopt;
    }
    out.result = result->get<std::string>();
    if (auto s = j->find("session"); s != j->end() && !s->is_null()) {
        if (!s->is_string()) {
            err = bad("'session' must be a string", "session", "invalid_type");
            return std::nullopt;
        }
        out.session = s->get<std::string>();
    }
    if (out.policy.scope == reuse::ToolScope::SESSION && out.session.empty()) {
        err = bad("tool '" + out.policy.tool + "' caches per session: give 'session' (the conversation's session id)", "session",
                  "missing_field");
        return std::nullopt;
    }
    if (auto l = j->find("labels"); l != j->end() && !l->is_null()) {
        if (!l->is_array()) {
            err = bad("'labels' must be an array of strings", "labels", "invalid_type");
            return std::nullopt;
        }
        for (const auto& v : *l) {
            if (!v.is_string()) {
                err = bad("'labels' must hold strings", "labels", "invalid_type");
                return std::nullopt;
            }
            out.labels.push_back(v.get<std::string>());
        }
    }
    return out;
}

std::vector<CachedCall> lookup_calls(const json& tool_calls, const Config& config, const std::string& tenant,
                                     const OpenAiRequest& req, const reuse::ToolCaller& caller,
                                     reuse::ToolResultCache& cache, double now) {
    std::vector<CachedCall> out;
    if (!tool_calls.is_array()) return out;
    for (const auto& c : tool_calls) {
        CachedCall cc{c, std::nullopt, false};
        const std::string name = c.contains("function") ? string_field(c["function"], "name") : "";
        auto policy = tool_policy(config, tenant, req, name);
        json args = c.contains("function") && c["function"].is_object() ? call_arguments(c["function"]) : json();
        if (policy && !args.is_discarded() && args.is_object()) cc.hit = cache.lookup(*policy, caller, args, now, &cc.stale);
        out.push_back(std::move(cc));
    }
    return out;
}

OpenAiRequest continue_with_results(const OpenAiRequest& req, const std::string& content, const std::vector<CachedCall>& calls) {
    OpenAiRequest next = req;
    ojson assistant = {{"role", "assistant"}, {"content", content.empty() ? ojson(nullptr) : ojson(content)}};
    ojson tc = ojson::array();
    for (const auto& c : calls) tc.push_back(ojson::parse(c.call.dump()));
    assistant["tool_calls"] = std::move(tc);
    next.messages.push_back(std::move(assistant));
    for (const auto& c : calls)
        next.messages.push_back({{"role", "tool"}, {"tool_call_id", string_field(c.call, "id")}, {"content", c.hit ? c.hit->result : ""}});
    if (next.tool_choice == "required" || next.tool_choice == "function") {
        next.tool_choice = "auto";
        next.tool_choice_name.clear();
    }
    return next;
}

json resolved_call_json(const CachedCall& c) {
    return {{"tool_call", c.call},
            {"content", c.hit ? c.hit->result : ""},
            {"cached", true},
            {"age_s", c.hit ? c.hit->age_s : 0.0},
            {"scope", c.hit ? reuse::tool_scope_name(c.hit->scope) : "session"}};
}

json tool_result_delta(const CachedCall& c) {
    return {{"role", "tool"},
            {"tool_call_id", string_field(c.call, "id")},
            {"name", c.call.contains("function") ? string_field(c.call["function"], "name") : ""},
            {"content", c.hit ? c.hit->result : ""},
            {"cached", true},
            {"age_s", c.hit ? c.hit->age_s : 0.0}};
}

}  // namespace steward::serve
