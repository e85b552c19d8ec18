// Reuse beyond the prefix over HTTP, as plain values (docs/reuse.md): the bodies of
// PUT /v1/documents/{id} and PUT /v1/tool_results, a caller's labels, the tool-cache policies that
// apply to a chat, what a conversation teaches the tool cache, and a chat continued with cached
// tool results. The HTTP server (http_server.cpp) moves the bytes and owns the stores.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <steward/config.h>

#include "reuse/document_store.h"
#include "reuse/tool_cache.h"
#include "serve/openai_api.h"

namespace steward::serve {

// PUT /v1/documents/{id} {"text", "version"?, "ttl_s"?, "acl"?}: validated (a 400 names the field).
std::optional<reuse::DocumentStore::Put> parse_document_put(std::string_view body, ApiError& err);
// A document as GET answers it: id, version, ttl_s, expires_in_s (null: never), acl, bytes, and the
// text when with_text.
nlohmann::json document_json(const reuse::Document& d, double now, bool with_text);
// A refusal of the store as the API's error.
ApiError document_error(const reuse::DocumentRefusal& r);

// The caller's labels: the tenant's configured `labels` plus the request's own, each of which must
// match the tenant's allowed_labels (exactly, or a pattern ending in '*' by prefix). A tenant the
// config does not define (an open server) may claim any. nullopt with a 403 naming the label.
std::optional<std::vector<std::string>> caller_labels(const Config& config, const std::string& tenant,
                                                      const std::vector<std::string>& requested, ApiError& err);

// The tool-cache policy for `tool` in this chat: the tenant's [[tenant.tool_cache]] entry (the
// operator's word wins), else the request's tools[].cache; nullopt when the tool is not cacheable.
std::optional<reuse::ToolCachePolicy> tool_policy(const Config& config, const std::string& tenant,
                                                  const OpenAiRequest& req, const std::string& tool);

// Learns from the conversation: every `tool` message answering an assistant's call to a cacheable
// tool stores (tool, arguments) -> its content in `cache`. Returns how many were stored.
int learn_tool_results(const OpenAiRequest& req, const Config& config, const reuse::ToolCaller& caller,
                       reuse::ToolResultCache& cache, double now);

// PUT /v1/tool_results {"tool", "arguments" (object), "result" (string), "session"?, "labels"?}:
// the tool must be cacheable for the tenant ([[tenant.tool_cache]]); nullopt with a 400 / 404.
struct ToolResultPut {
    reuse::ToolCachePolicy policy;
    nlohmann::json arguments;
    std::string result, session;
    std::vector<std::string> labels;
};
std::optional<ToolResultPut> parse_tool_result_put(std::string_view body, const Config& config, const std::string& tenant,
                                                   ApiError& err);

// One tool call of the model's output and what the cache holds for it.
struct CachedCall {
    nlohmann::json call;  // OpenAI's {id, type, function{name, arguments}}
    std::optional<reuse::ToolHit> hit;
    bool stale = false;  // a result was held but too old: not served
};
// Looks every call of `tool_calls` up (a call to a non-cacheable tool, or with arguments that are
// not a JSON object, has no hit).
std::vector<CachedCall> lookup_calls(const nlohmann::json& tool_calls, const Config& config, const std::string& tenant,
                                     const OpenAiRequest& req, const reuse::ToolCaller& caller,
                                     reuse::ToolResultCache& cache, double now);

// The chat continued after `calls` (every one with a hit): the assistant's message (its content,
// null when empty, and the calls) and one `tool` message per call with the cached result, as the
// client would have sent them back. A tool_choice that forced a call becomes "auto" (it forced the
// call just answered).
OpenAiRequest continue_with_results(const OpenAiRequest& req, const std::string& content,
                                    const std::vector<CachedCall>& calls);

// A resolved call as the client sees it: {"tool_call": {...}, "content", "cached": true, "age_s"}.
nlohmann::json resolved_call_json(const CachedCall& c);
// The streamed tool-result event of a resolved call: a chat.completion.chunk whose delta is
// {"role": "tool", "tool_call_id", "name", "content", "cached": true, "age_s"}.
nlohmann::json tool_result_delta(const CachedCall& c);

}  // namespace steward::serve
