// Reuse beyond the prefix over HTTP (docs/reuse.md), as a client meets it: documents registered with
// PUT /v1/documents/{id} and referenced by chats (shared KV wherever the chat listed them; 403 / 404
// / 409 when they may not be used), and tool results answered from the cache (resolve: in the same
// request, with the same greedy output as the client's own round trip; hint: the call carries the
// result), each tenant's and scope's own.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include <steward/runtime.h>

#include "config/config.h"
#include "http_client.h"
#include "process_temp_dir.h"
#include "test_paths.h"

using namespace steward;
using namespace steward_test;
using json = nlohmann::json;

namespace {

const std::filesystem::path& temp_dir() {
    static const steward_test::ProcessTempDir dir("steward_test_reuse_http_");
    return dir.path();
}

// Pool "chat" (ChatML) and pool "hermes" (Hermes 3's tool-use template); tenants alice (may claim
// team:* and user:* labels, caches get_weather per label set) and bob.
Served serve_reuse() {
    const std::string dir = temp_dir().string();
    const std::string text = fmt::format(R"(
[limits]
request_timeout_ms = 60000
[reload]
watch = false
[server]
host = "127.0.0.1"
port = 0

[[tenant]]
name = "alice"
api_keys = ["key-alice"]
allowed_labels = ["team:*", "user:*"]
[[tenant.tool_cache]]
tool = "get_weather"
ttl_s = 600
scope = "tenant"
key = ["city"]
[[tenant.tool_cache]]
tool = "get_time"
ttl_s = 3
scope = "tenant"

[[tenant]]
name = "bob"
api_keys = ["key-bob"]
[[tenant.tool_cache]]
tool = "get_weather"
ttl_s = 600
scope = "tenant"

[[pool]]
chat_template_fallback = "chatml"
name = "chat"
model = "{0}/chat.gguf"
threads = 1
kv_blocks = 256
block_size = 16
max_batch_tokens = 512
[pool.synth]
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 2048
seed = 11

[[pool]]
name = "hermes"
model = "{0}/hermes.gguf"
threads = 1
kv_blocks = 256
block_size = 16
max_batch_tokens = 512
chat_template_file = "{1}/chat_templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
[pool.synth]
dim = 64
layers = 1
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 4096
seed = 5

[[bucket]]
name = "tools"
pool = "hermes"
[bucket.match]
hint = "tools"

[[bucket]]
name = "default"
pool = "chat"
)",
                                         dir, STEWARD_TESTDATA_DIR);
    auto c = parse_config(text, (temp_dir() / "reuse.toml").string());
    if (!c) FAIL(c.error().message);
    return serve_config(*c);
}

std::vector<std::pair<std::string, std::string>> key(const std::string& k) { return {{"Authorization", "Bearer " + k}}; }

Reply put(uint16_t port, const std::string& target, const json& body, const std::string& k) {
    return request(port, http_client::http::verb::put, target, body.dump(), key(k));
}

int cached_of(const Reply& r) {
    INFO(r.body.substr(0, 600));
    REQUIRE(r.status == 200);
    return r.j()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
}

const std::string k_policy_v1 =
    "Expense policy. Meals are reimbursed up to forty euros a day with receipts. Travel is booked through the portal "
    "at least ten days ahead; economy class for flights under six hours. Hotels up to one hundred and twenty euros a "
    "night in most cities, one hundred and eighty in capitals. Claims are filed within thirty days of the trip.";
const std::string k_policy_v2 =
    "Expense policy, revised. Meals are reimbursed up to fifty euros a day with receipts. Travel is booked through "
    "the portal at least fourteen days ahead. Claims are filed within twenty days of the trip.";

}  // namespace

TEST_CASE("a document shared by two chats of a tenant is prefilled once, wherever they list it", "[reuse][http][documents]") {
    auto s = serve_reuse();
    // Registered by alice, readable by team:legal only.
    const Reply p = put(s.port, "/v1/documents/policy", {{"text", k_policy_v1}, {"acl", {"team:legal"}}}, "key-alice");
    INFO(p.body);
    REQUIRE(p.status == 201);
    CHECK(p.j()["version"] == 1);

    // Chat 1 lists it as a content part of its user message; chat 2 in "documents", after a
    // different earlier turn. Both put it right after the system prompt.
    const json chat1 = {{"model", "chat"}, {"max_tokens", 4}, {"temperature", 0}, {"labels", {"team:legal"}},
                        {"messages",
                         {{{"role", "system"}, {"content", "You are a helpful assistant."}},
                          {{"role", "user"},
                           {"content", {{{"type", "document"}, {"id", "policy"}}, {{"type", "text"}, {"text", "What is the meal limit?"}}}}}}}};
    const json chat2 = {{"model", "chat"}, {"max_tokens", 4}, {"temperature", 0}, {"labels", {"team:legal"}},
                        {"documents", {{{"id", "policy"}, {"version", 1}}}},
                        {"messages",
                         {{{"role", "system"}, {"content", "You are a helpful assistant."}},
                          {{"role", "user"}, {"content", "Hello."}},
                          {{"role", "assistant"}, {"content", "Hi! How can I help?"}},
                          {{"role", "user"}, {"content", "How far ahead must travel be booked?"}}}}};
    CHECK(cached_of(post(s.port, "/v1/chat/completions", chat1, key("key-alice"))) == 0);
    const int cached2 = cached_of(post(s.port, "/v1/chat/completions", chat2, key("key-alice")));
    // The prompt up to the document's end, as ChatML renders it (the block is docs/reuse.md's format).
    const std::string prefix = "<|im_start|>system\nYou are a helpful assistant.\n\n<document id=\"policy\" version=\"1\">\n" +
                               k_policy_v1 + "\n</document>";
    const Reply t = post(s.port, "/tokenize", {{"model", "chat"}, {"content", prefix}, {"add_special", true}}, key("key-alice"));
    REQUIRE(t.status == 200);
    const int n_prefix = (int)t.j()["tokens"].size();
    REQUIRE(n_prefix > 200);
    CHECK(cached2 >= n_prefix / 16 * 16 - 16);  // every full block through the document (one block of slack)
    {
        // Its decision trace names the document it used.
        const Reply again = post(s.port, "/v1/chat/completions", chat2, key("key-alice"));
        REQUIRE(again.status == 200);
        const std::string id = again.j()["id"].get<std::string>();
        const Reply tr = request(s.port, http_client::http::verb::get, "/admin/requests/" + id, "", key("key-alice"));
        INFO(tr.body);
        REQUIRE(tr.status == 200);
        CHECK(tr.j()["reuse"]["documents"][0]["id"] == "policy");
        CHECK(tr.j()["reuse"]["documents"][0]["version"] == 1);
    }

    // A caller of the tenant without the label: 403 naming the document, never its text.
    json no_label = chat2;
    no_label.erase("labels");
    const Reply f = post(s.port, "/v1/chat/completions", no_label, key("key-alice"));
    check_error(f, 403, "documents", "document_forbidden", "'policy'");
    CHECK(f.body.find("forty euros") == std::string::npos);
    // A label the tenant may not claim.
    json claimed = chat2;
    claimed["labels"] = {"admin:root"};
    check_error(post(s.port, "/v1/chat/completions", claimed, key("key-alice")), 403, "labels", "label_not_allowed");
    // Another tenant: the document is not there (404, its existence not told), and the same text
    // inline in bob's prompt finds none of alice's blocks.
    json chat2_bob = chat2;
    chat2_bob.erase("labels");  // bob may claim no label
    check_error(post(s.port, "/v1/chat/completions", chat2_bob, key("key-bob")), 404, "documents", "document_not_found");
    json inline_bob = {{"model", "chat"}, {"max_tokens", 4}, {"temperature", 0},
                       {"messages",
                        {{{"role", "system"},
                          {"content", "You are a helpful assistant.\n\n<document id=\"policy\" version=\"1\">\n" + k_policy_v1 + "\n</document>"}},
                         {{"role", "user"}, {"content", "What is the meal limit?"}}}}};
    CHECK(cached_of(post(s.port, "/v1/chat/completions", inline_bob, key("key-bob"))) == 0);
    // GET: the text only for a caller whose labels cover the acl; bob sees nothing.
    CHECK(request(s.port, http_client::http::verb::get, "/v1/documents/policy", "", key("key-alice")).j().count("text") == 0);
    {
        auto hk = key("key-alice");
        hk.emplace_back("x-steward-labels", "team:legal");
        CHECK(request(s.port, http_client::http::verb::get, "/v1/documents/policy", "", hk).j()["text"] == k_policy_v1);
    }
    CHECK(request(s.port, http_client::http::verb::get, "/v1/documents/policy", "", key("key-bob")).status == 404);

    // A new version: the old one is refused (409), the new one served, never the old blocks.
    const Reply p2 = put(s.port, "/v1/documents/policy", {{"text", k_policy_v2}, {"acl", {"team:legal"}}}, "key-alice");
    REQUIRE(p2.status == 200);
    CHECK(p2.j()["version"] == 2);
    CHECK(p2.j()["replaced_version"] == 1);
    check_error(post(s.port, "/v1/chat/completions", chat2, key("key-alice")), 409, "documents", "document_version_conflict", "version 1");
    json current = chat2;
    current["documents"] = {{{"id", "policy"}}};
    const std::string before_doc = "<|im_start|>system\nYou are a helpful assistant.\n\n<document id=\"policy\" version=\"";
    const Reply tb = post(s.port, "/tokenize", {{"model", "chat"}, {"content", before_doc}, {"add_special", true}}, key("key-alice"));
    CHECK(cached_of(post(s.port, "/v1/chat/completions", current, key("key-alice"))) <= (int)tb.j()["tokens"].size());

    // An expired TTL: never served (404 document_expired), counted.
    REQUIRE(put(s.port, "/v1/documents/news", {{"text", "Today: the office is closed."}, {"ttl_s", 0.2}}, "key-alice").status == 201);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    json news = {{"model", "chat"}, {"max_tokens", 2}, {"documents", {{{"id", "news"}}}},
                 {"messages", {{{"role", "user"}, {"content", "Is the office open?"}}}}};
    check_error(post(s.port, "/v1/chat/completions", news, key("key-alice")), 404, "documents", "document_expired");

    const json m = json::parse(s.rt->metrics_json());
    const json& d = m["all"]["reuse"]["documents"];
    CHECK(d["hits"] == 4);  // chat1, chat2 (twice), current
    CHECK(d["refused_permission"] == 1);
    CHECK(d["expired"] == 1);
    // chat2's cached tokens inside the document's block, twice (chat1 had none; the new version's are outside it).
    const Reply td = post(s.port, "/tokenize", {{"model", "chat"}, {"content", k_policy_v1}, {"add_special", false}}, key("key-alice"));
    const int n_doc = (int)td.j()["tokens"].size();
    CHECK(d["saved_prefill_tokens"].get<int>() >= 2 * (n_doc - 20));  // chat2, twice
    // At most the whole block as rendered (docs/reuse.md: from its <document ...> header through the text).
    const Reply tblk = post(s.port, "/tokenize",
                            {{"model", "chat"}, {"content", "<document id=\"policy\" version=\"1\">\n" + k_policy_v1}, {"add_special", false}},
                            key("key-alice"));
    CHECK(d["saved_prefill_tokens"].get<int>() <= 2 * ((int)tblk.j()["tokens"].size() + 4));
    const Reply prom = request(s.port, http_client::http::verb::get, "/metrics", "", key("key-alice"));
    CHECK(prom.body.find("steward_reuse_document_hits_total{bucket=\"default\"} 4") != std::string::npos);
}

namespace {

// get_weather takes one city of two; the tool-call grammar of tool_choice "required" makes even
// random weights call it with valid arguments.
const json k_tools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","description":"The weather in a city","parameters":
    {"type":"object","properties":{"city":{"enum":["Paris"]}},"required":["city"],"additionalProperties":false}}}])");

json weather_chat(const std::string& mode, bool stream = false) {
    json b = {{"model", "tools"}, {"max_tokens", 120}, {"temperature", 0}, {"tools", k_tools}, {"tool_choice", "required"},
              {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}}};
    if (!mode.empty()) b["tool_cache"] = mode;
    if (stream) b["stream"] = true;
    return b;
}

std::vector<json> sse(const std::string& body) {
    std::vector<json> out;
    size_t at = 0;
    while (true) {
        const size_t b = body.find("data: ", at);
        if (b == std::string::npos) break;
        const size_t e = body.find("\n\n", b);
        REQUIRE(e != std::string::npos);
        const std::string x = body.substr(b + 6, e - b - 6);
        if (x != "[DONE]") out.push_back(json::parse(x));
        at = e + 2;
    }
    return out;
}

}  // namespace

TEST_CASE("a cached tool result is resolved in the same request, as the client round trip would", "[reuse][http][tools]") {
    auto s = serve_reuse();
    // Nothing cached yet: the call goes to the client.
    const Reply first = post(s.port, "/v1/chat/completions", weather_chat("resolve"), key("key-alice"));
    INFO(first.body);
    REQUIRE(first.status == 200);
    const json call = first.j()["choices"][0]["message"]["tool_calls"][0];
    CHECK(call["function"]["name"] == "get_weather");
    CHECK(!first.j()["choices"][0]["message"].contains("steward_resolved_tool_calls"));

    // The client runs the tool and sends the result back: Steward learns it from the conversation.
    json round_trip = weather_chat("");
    round_trip["tool_choice"] = "auto";
    round_trip["messages"].push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
    round_trip["messages"].push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "Sunny, 21 C."}});
    const Reply rt = post(s.port, "/v1/chat/completions", round_trip, key("key-alice"));
    INFO(rt.body);
    REQUIRE(rt.status == 200);
    const std::string client_answer = rt.j()["choices"][0]["message"]["content"].is_string()
                                          ? rt.j()["choices"][0]["message"]["content"].get<std::string>() : "";

    // Now resolved in one request: the call and the cached result are shown, and the answer is the
    // round trip's (greedy: same conversation, same output).
    const Reply resolved = post(s.port, "/v1/chat/completions", weather_chat("resolve"), key("key-alice"));
    INFO(resolved.body);
    REQUIRE(resolved.status == 200);
    const json msg = resolved.j()["choices"][0]["message"];
    REQUIRE(msg.contains("steward_resolved_tool_calls"));
    const json& rc = msg["steward_resolved_tool_calls"][0];
    CHECK(rc["tool_call"]["function"]["name"] == "get_weather");
    CHECK(json::parse(rc["tool_call"]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}});
    CHECK(rc["content"] == "Sunny, 21 C.");
    CHECK(rc["cached"] == true);
    CHECK(rc["age_s"].get<double>() >= 0);
    CHECK((msg["content"].is_string() ? msg["content"].get<std::string>() : "") == client_answer);
    CHECK(resolved.j()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() > 0);

    // Streamed: the call, then the tool-result event (cached, with its age), then the same answer.
    const Reply streamed = post(s.port, "/v1/chat/completions", weather_chat("resolve", true), key("key-alice"));
    REQUIRE(streamed.status == 200);
    std::string content;
    int n_calls = 0, n_results = 0, order_ok = 0;
    for (const json& ev : sse(streamed.body)) {
        if (!ev.contains("choices") || ev["choices"].empty()) continue;
        const json& d = ev["choices"][0]["delta"];
        if (d.contains("tool_calls")) n_calls++;
        if (d.value("role", "") == "tool") {
            n_results++;
            CHECK(d["cached"] == true);
            CHECK(d["content"] == "Sunny, 21 C.");
            CHECK(d.contains("age_s"));
            order_ok += n_calls > 0;
        } else if (d.contains("content") && d["content"].is_string()) {
            if (n_results > 0) content += d["content"].get<std::string>();
        }
    }
    CHECK(n_calls >= 1);
    CHECK(n_results == 1);
    CHECK(order_ok == 1);
    CHECK(content == client_answer);

    // hint: the call goes to the client, carrying the cached result.
    const Reply hint = post(s.port, "/v1/chat/completions", weather_chat("hint"), key("key-alice"));
    REQUIRE(hint.status == 200);
    const json hc = hint.j()["choices"][0]["message"]["tool_calls"][0];
    CHECK(hc["cached_result"]["content"] == "Sunny, 21 C.");
    CHECK(hint.j()["choices"][0]["finish_reason"] == "tool_calls");

    // Other scopes see nothing: another tenant, and alice's callers with another label set.
    const Reply bob = post(s.port, "/v1/chat/completions", weather_chat("resolve"), key("key-bob"));
    REQUIRE(bob.status == 200);
    CHECK(!bob.j()["choices"][0]["message"].contains("steward_resolved_tool_calls"));
    json labelled = weather_chat("hint");
    labelled["labels"] = {"user:42"};
    const Reply other = post(s.port, "/v1/chat/completions", labelled, key("key-alice"));
    REQUIRE(other.status == 200);
    CHECK(!other.j()["choices"][0]["message"]["tool_calls"][0].contains("cached_result"));

    const json m = json::parse(s.rt->metrics_json());
    const json& t = m["buckets"]["tools"]["reuse"]["tools"];
    CHECK(t["round_trips_saved"] == 2);
    CHECK(t["hits"] == 3);
    CHECK(t["resolved_tokens_saved"].get<int>() > 0);
    CHECK(t["age_at_use_p50_s"].is_number());
}

TEST_CASE("a tool result past its TTL is never served, and PUT /v1/tool_results is scoped", "[reuse][http][tools]") {
    auto s = serve_reuse();
    const json tools = json::parse(R"([{"type":"function","function":{"name":"get_time","description":"The time in a zone","parameters":
        {"type":"object","properties":{"zone":{"enum":["UTC"]}},"required":["zone"],"additionalProperties":false}}}])");
    json chat = {{"model", "tools"}, {"max_tokens", 100}, {"temperature", 0}, {"tools", tools}, {"tool_choice", "required"},
                 {"tool_cache", "hint"}, {"messages", {{{"role", "user"}, {"content", "What time is it?"}}}}};
    const Reply put_ok = put(s.port, "/v1/tool_results", {{"tool", "get_time"}, {"arguments", {{"zone", "UTC"}}}, {"result", "12:00"}}, "key-alice");
    INFO(put_ok.body);
    REQUIRE(put_ok.status == 200);
    const Reply fresh = post(s.port, "/v1/chat/completions", chat, key("key-alice"));
    INFO(fresh.body);
    REQUIRE(fresh.status == 200);
    CHECK(fresh.j()["choices"][0]["message"]["tool_calls"][0]["cached_result"]["content"] == "12:00");
    // Past ttl_s = 3 (long enough that a loaded sanitizer build serves the first chat within it).
    std::this_thread::sleep_for(std::chrono::milliseconds(3100));
    const Reply stale = post(s.port, "/v1/chat/completions", chat, key("key-alice"));
    REQUIRE(stale.status == 200);
    CHECK(!stale.j()["choices"][0]["message"]["tool_calls"][0].contains("cached_result"));
    const json m = json::parse(s.rt->metrics_json());
    CHECK(m["all"]["reuse"]["tools"]["stale_refused"] == 1);

    // A tool the tenant did not declare cacheable, and a request claiming the public scope.
    check_error(put(s.port, "/v1/tool_results", {{"tool", "get_time"}, {"arguments", {{"zone", "UTC"}}}, {"result", "x"}}, "key-bob"),
                404, "tool", "tool_not_cacheable");
    json pub = chat;
    pub["tools"][0]["cache"] = {{"scope", "public"}};
    check_error(post(s.port, "/v1/chat/completions", pub, key("key-alice")), 400, "tools[0].cache.scope", "invalid_value", "operator");
}

TEST_CASE("the C++ API registers documents and a text prompt shares their KV", "[reuse][documents]") {
    auto s = serve_reuse();
    Runtime& rt = *s.rt;
    std::string text;
    for (int i = 0; i < 40; i++) text += "Clause " + std::to_string(i) + " of the contract says the parties agree. ";
    auto v = rt.put_document("alice", "contract", {text, 0, 0, {"team:legal"}});
    REQUIRE(v.ok());
    CHECK(*v == 1);
    CHECK(!rt.put_document("alice", "contract", {text, 1, 0, {}}).ok());  // not above the current version
    GenerationRequest g;
    g.tenant = "alice";
    g.pool = "chat";
    g.max_tokens = 2;
    g.labels = {"team:legal"};
    g.documents = {{"contract", 0}};
    g.prompt = "Question one?";
    const GenerationResult a = rt.generate(g);
    REQUIRE(a.ok());
    g.prompt = "Another question entirely?";
    const GenerationResult b = rt.generate(g);
    REQUIRE(b.ok());
    auto n_doc = rt.tokenize("chat", text, false);
    REQUIRE(n_doc.ok());
    CHECK(b.metrics.cached_tokens >= (int)n_doc->size() - 16);
    const json trace = json::parse(rt.request_trace_json(b.id, "alice"));
    CHECK(trace["reuse"]["documents"][0]["id"] == "contract");
    // Without the label: refused, naming the document.
    g.labels.clear();
    const GenerationResult c = rt.generate(g);
    CHECK(c.finish == FinishReason::ERROR);
    CHECK(c.error.find("'contract'") != std::string::npos);
    CHECK(c.error.find("Clause") == std::string::npos);
    CHECK(rt.remove_document("alice", "contract"));
    CHECK(!rt.remove_document("alice", "contract"));
}

namespace {

// The pool's documents' KV figures (docs/reuse.md#kv-priority-and-invalidation), polled until
// `done` holds (the invalidation reaches the pool as a message) or 10 s pass.
json reuse_kv(Runtime& rt, const std::function<bool(const json&)>& done = {}) {
    json k;
    for (int i = 0; i < 200; i++) {
        k = json::parse(rt.metrics_json())["reuse_kv"]["chat"];
        if (!done || done(k)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return k;
}

}  // namespace

TEST_CASE("a document's KV outlives a flood of one-off prompts, and a new version, an expiry or a DELETE drops it",
          "[reuse][documents][kv]") {
    auto s = serve_reuse();
    Runtime& rt = *s.rt;
    std::string text;
    for (int i = 0; i < 40; i++) text += "Section " + std::to_string(i) + " of the handbook sets the rule. ";
    REQUIRE(rt.put_document("alice", "handbook", {text, 0, 0, {}}).ok());
    auto n_doc = rt.tokenize("chat", text, false);
    REQUIRE(n_doc.ok());
    GenerationRequest g;
    g.tenant = "alice";
    g.pool = "chat";
    g.max_tokens = 1;
    g.documents = {{"handbook", 0}};
    g.prompt = "First question?";
    REQUIRE(rt.generate(g).ok());
    // The same text as a plain prompt: the same size of KV, without the priority.
    GenerationRequest plain = g;
    plain.documents.clear();
    plain.prompt = "A copy. " + text;
    REQUIRE(rt.generate(plain).ok());
    const json before = reuse_kv(rt);
    CHECK(before["priority_blocks"].get<int>() >= (int)n_doc->size() / 16 - 1);

    // One-off prompts of 1.5 pools' worth of tokens (the pool holds 256 blocks of 16).
    int64_t flooded = 0;
    for (int i = 0; flooded < 256 * 16 * 3 / 2; i++) {
        GenerationRequest f = plain;
        f.prompt.clear();
        for (int w = 0; w < 120; w++) f.prompt += "r" + std::to_string(i) + "w" + std::to_string(w) + " ";
        auto n = rt.tokenize("chat", f.prompt, true);
        REQUIRE(n.ok());
        REQUIRE(n->size() < 2000);
        flooded += (int64_t)n->size();
        REQUIRE(rt.generate(f).ok());
    }
    const GenerationResult plain_again = rt.generate(plain);
    REQUIRE(plain_again.ok());
    CHECK(plain_again.metrics.cached_tokens < 32);  // the plain copy went, least recently used
    g.prompt = "Second question?";
    const GenerationResult doc_again = rt.generate(g);
    REQUIRE(doc_again.ok());
    CHECK(doc_again.metrics.cached_tokens >= (int)n_doc->size() - 16);  // the document's stayed
    const json flood = reuse_kv(rt);
    CHECK(flood["priority_evictions"] == 0);

    // A new version: the old version's blocks are dropped (from the document's first token on).
    const int64_t invalidated0 = flood["invalidated_blocks"].get<int64_t>();
    REQUIRE(rt.put_document("alice", "handbook", {"A much shorter handbook.", 0, 0, {}}).ok());
    const json replaced = reuse_kv(rt, [&](const json& k) { return k["invalidated_blocks"].get<int64_t>() > invalidated0; });
    CHECK(replaced["invalidated_blocks"].get<int64_t>() - invalidated0 >= (int64_t)n_doc->size() / 16 - 1);
    CHECK(replaced["priority_blocks"].get<int>() <= 2);  // at most the blocks before the document
    g.prompt = "First question?";

    // An expiry drops the blocks without any request (the sweeper), and so does a DELETE.
    std::string notice;
    for (int i = 0; i < 20; i++) notice += "Notice " + std::to_string(i) + ": the office moves. ";
    // Counted before the PUT: under a slow build the expiry may come before the request returns.
    const int64_t invalidated1 = reuse_kv(rt)["invalidated_blocks"].get<int64_t>();
    REQUIRE(rt.put_document("alice", "notice", {notice, 0, 2.0, {}}).ok());
    GenerationRequest n = g;
    n.documents = {{"notice", 0}};
    REQUIRE(rt.generate(n).ok());
    const json expired = reuse_kv(rt, [&](const json& k) { return k["invalidated_blocks"].get<int64_t>() > invalidated1; });
    CHECK(expired["invalidated_blocks"].get<int64_t>() > invalidated1);
    REQUIRE(rt.put_document("alice", "memo", {notice + " Memo.", 0, 0, {}}).ok());
    n.documents = {{"memo", 0}};
    REQUIRE(rt.generate(n).ok());
    const int64_t invalidated2 = reuse_kv(rt)["invalidated_blocks"].get<int64_t>();
    CHECK(rt.remove_document("alice", "memo"));
    const json deleted = reuse_kv(rt, [&](const json& k) { return k["invalidated_blocks"].get<int64_t>() > invalidated2; });
    CHECK(deleted["invalidated_blocks"].get<int64_t>() > invalidated2);
    const Reply prom = request(s.port, http_client::http::verb::get, "/metrics", "", key("key-alice"));
    CHECK(prom.body.find("steward_reuse_kv_invalidated_blocks_total{pool=\"chat\"}") != std::string::npos);
}
