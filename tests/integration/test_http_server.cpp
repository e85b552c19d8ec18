// The HTTP server end to end: a real HTTP client (Beast's client side, and raw sockets for the
// misbehaving ones) in this process against HttpServer on an ephemeral port over a Runtime of
// synthetic models. Answers are checked against the runtime itself (generate, tokenize, the
// metrics' admission figures); clients never sleep to synchronise, only the slowloris client
// drips bytes on purpose.
#include <fmt/format.h>
#include <poll.h>
#include "test_paths.h"

#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it under C++20
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include <steward/runtime.h>

#include "config/config.h"
#include "forward_gate.h"
#include "process_temp_dir.h"
#include "sched/engine.h"
#include "http_client.h"
#include "serve/http_server.h"

using namespace steward;
using namespace steward_test;
using json = nlohmann::json;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

const std::filesystem::path& temp_dir() {
    static const steward_test::ProcessTempDir dir("steward_test_http_");
    return dir.path();
}

// Two pools: "tiny" (fast) and "slow" (a larger model, so that a stream outlives a disconnect);
// bucket "slow_b" (hint "slow_b") routes to "slow", everything else to "tiny".
std::string base_toml(const std::string& extra, const ServerConfig& s, int max_connections) {
    const std::string dir = temp_dir().string();
    return fmt::format(R"(
[limits]
request_timeout_ms = 60000
max_tokens_default = 8

[reload]
watch = false

[server]
host = "127.0.0.1"
port = 0
io_threads = 2
max_body_bytes = {}
max_header_bytes = {}
read_timeout_ms = {}
idle_timeout_ms = {}
write_timeout_ms = {}
max_connections = {}
max_stream_buffer_bytes = {}

[[pool]]
chat_template_fallback = "chatml"
name = "tiny"
model = "{}/tiny.gguf"
threads = 1
kv_blocks = 64
block_size = 16
max_batch = 16
max_batch_tokens = 64
[pool.synth]
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 512
seed = 7

[[pool]]
chat_template_fallback = "chatml"
name = "slow"
model = "{}/slow.gguf"
threads = 1
kv_blocks = 64
block_size = 16
max_batch = 16
max_batch_tokens = 64
[pool.synth]
dim = 256
layers = 6
heads = 4
kv_heads = 4
ffn = 768
vocab = 512
ctx = 512
seed = 9

[[bucket]]
name = "slow_b"
pool = "slow"
[bucket.match]
hint = "slow_b"

[[bucket]]
name = "default"
pool = "tiny"
{}
)",
                       s.max_body_bytes, s.max_header_bytes, s.read_timeout_ms, s.idle_timeout_ms, s.write_timeout_ms, max_connections, s.max_stream_buffer_bytes, dir, dir,
                       extra);
}

ServerConfig test_server_config() {
    ServerConfig s;
    s.max_body_bytes = 64 * 1024;
    s.max_header_bytes = 4096;
    s.read_timeout_ms = 1500;
    s.idle_timeout_ms = 5000;
    s.write_timeout_ms = 5000;
    return s;
}

Served serve_with(const std::string& extra = "", const ServerConfig& s = test_server_config(), int max_connections = 1024) {
    // On disk: POST /admin/reload re-reads the file.
    const std::string path = (temp_dir() / "http.toml").string();
    const std::string text = base_toml(extra, s, max_connections);
    {
        std::ofstream f(path);
        f << text;
    }
    auto c = parse_config(text, path);
    if (!c) FAIL(c.error().message);
    return serve_config(*c);
}

// The SSE events of a streamed body ("data: X\n\n" each), X as text.
std::vector<std::string> sse_events(const std::string& body) {
    std::vector<std::string> out;
    size_t at = 0;
    while (true) {
        const size_t b = body.find("data: ", at);
        if (b == std::string::npos) break;
        const size_t e = body.find("\n\n", b);
        REQUIRE(e != std::string::npos);
        out.push_back(body.substr(b + 6, e - b - 6));
        at = e + 2;
    }
    return out;
}

std::string greedy_text(Runtime& rt, const std::string& prompt, int max_tokens) {
    GenerationRequest g;
    g.prompt = prompt;
    g.max_tokens = max_tokens;
    const GenerationResult r = rt.generate(g);
    REQUIRE(r.ok());
    return r.text;
}

// Sums every "by_finish_reason"[reason] in the metrics JSON (one per bucket).
int64_t finished_with(const json& j, const std::string& reason) {
    int64_t n = 0;
    if (j.is_object()) {
        for (const auto& [k, v] : j.items()) {
            if (k == "by_finish_reason" && v.contains(reason)) n += v[reason].get<int64_t>();
            else n += finished_with(v, reason);
        }
    } else if (j.is_array()) {
        for (const auto& v : j) n += finished_with(v, reason);
    }
    return n;
}

int64_t blocks_reserved(const json& metrics) {
    int64_t n = 0;
    for (const auto& [pool, tenants] : metrics["admission"].items())
        for (const auto& [t, a] : tenants.items()) n += a["blocks_reserved"].get<int64_t>();
    return n;
}

}  // namespace

TEST_CASE("a chat completion answers OpenAI's object with usage and the request id in a header", "[http]") {
    auto s = serve_with();
    const Reply r = post(s.port, "/v1/chat/completions",
                         {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 6}, {"temperature", 0}});
    INFO(r.body);
    REQUIRE(r.status == 200);
    const json j = r.j();
    CHECK(j["object"] == "chat.completion");
    const std::string id = j["id"];
    CHECK(id == "chatcmpl-" + std::string(r.headers["x-steward-request-id"]));
    REQUIRE(j["choices"].size() == 1);
    CHECK(j["choices"][0]["index"] == 0);
    CHECK(j["choices"][0]["message"]["role"] == "assistant");
    // The ChatML rendering of the one message, generated greedily by the runtime itself.
    const std::string prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
    GenerationRequest g;
    g.prompt = prompt;
    g.max_tokens = 6;
    g.parse_special = true;
    const GenerationResult ref = s.rt->generate(g);
    CHECK(j["choices"][0]["message"]["content"] == ref.text);
    CHECK(j["choices"][0]["finish_reason"] == (ref.finish == FinishReason::LENGTH ? "length" : "stop"));
    CHECK(j["usage"]["completion_tokens"] == ref.metrics.completion_tokens);
    CHECK(j["usage"]["prompt_tokens"] == ref.metrics.prompt_tokens);
    CHECK(j["usage"]["total_tokens"] == ref.metrics.prompt_tokens + ref.metrics.completion_tokens);
    CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST_CASE("a streamed completion is SSE chunks whose text is the greedy output, then a usage chunk and [DONE]", "[http]") {
    auto s = serve_with();
    const Reply r = post(s.port, "/v1/completions",
                         {{"prompt", "once upon a time"}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true},
                          {"stream_options", {{"include_usage", true}}}, {"unknown_field", {1, 2}}});
    REQUIRE(r.status == 200);
    CHECK(std::string(r.headers["Content-Type"]) == "text/event-stream");
    const auto events = sse_events(r.body);
    REQUIRE(events.size() >= 3);
    CHECK(events.back() == "[DONE]");
    std::string text;
    std::string finish;
    for (size_t i = 0; i + 2 < events.size(); i++) {
        const json c = json::parse(events[i]);
        CHECK(c["object"] == "text_completion");
        CHECK(c["id"] == "cmpl-" + std::string(r.headers["x-steward-request-id"]));
        REQUIRE(c["choices"].size() == 1);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    CHECK(text == greedy_text(*s.rt, "once upon a time", 12));
    CHECK((finish == "length" || finish == "stop"));
    const json usage = json::parse(events[events.size() - 2]);
    CHECK(usage["choices"].empty());
    CHECK(usage["usage"]["completion_tokens"].get<int>() >= 1);
    CHECK(usage["usage"]["prompt_tokens"].get<int>() >= 4);
}

TEST_CASE("a streamed chat completion opens with the assistant role and ends each choice with a finish_reason", "[http]") {
    auto s = serve_with();
    const Reply r = post(s.port, "/v1/chat/completions",
                         {{"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
                          {"max_tokens", 5}, {"temperature", 0}, {"stream", true}, {"n", 2}});
    REQUIRE(r.status == 200);
    const auto events = sse_events(r.body);
    REQUIRE(events.back() == "[DONE]");
    std::map<int, std::string> text;
    std::map<int, int> n_finish, n_role;
    for (size_t i = 0; i + 1 < events.size(); i++) {
        const json c = json::parse(events[i]);
        CHECK(c["object"] == "chat.completion.chunk");
        const json& ch = c["choices"][0];
        const int idx = ch["index"];
        if (ch["delta"].contains("role")) n_role[idx]++;
        if (ch["delta"].contains("content")) text[idx] += ch["delta"]["content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) n_finish[idx]++;
    }
    CHECK(n_role == std::map<int, int>{{0, 1}, {1, 1}});
    CHECK(n_finish == std::map<int, int>{{0, 1}, {1, 1}});
    // Greedy: both choices are the same text.
    CHECK(text[0] == text[1]);
    CHECK(!text[0].empty());
}

TEST_CASE("n > 1 answers n choices indexed in order, usage counting the prompt once", "[http]") {
    auto s = serve_with();
    const Reply one = post(s.port, "/v1/completions", {{"prompt", "abc def"}, {"max_tokens", 4}, {"temperature", 0}});
    const Reply three = post(s.port, "/v1/completions", {{"prompt", "abc def"}, {"max_tokens", 4}, {"temperature", 0}, {"n", 3}});
    REQUIRE(one.status == 200);
    REQUIRE(three.status == 200);
    const json a = one.j(), b = three.j();
    REQUIRE(b["choices"].size() == 3);
    for (int i = 0; i < 3; i++) {
        CHECK(b["choices"][i]["index"] == i);
        CHECK(b["choices"][i]["text"] == a["choices"][0]["text"]);
    }
    CHECK(b["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"]);
    CHECK(b["usage"]["completion_tokens"] == 3 * a["usage"]["completion_tokens"].get<int>());
    // A bucket's name as the model is its hint: bucket slow_b routes to pool slow.
    const Reply by_bucket = post(s.port, "/v1/completions", {{"model", "slow_b"}, {"prompt", "abc"}, {"max_tokens", 1}});
    REQUIRE(by_bucket.status == 200);
    CHECK(std::string(by_bucket.headers["x-steward-pool"]) == "slow");
}

TEST_CASE("logprobs have OpenAI's shape: completion tokens and offsets, chat content entries", "[http]") {
    auto s = serve_with();
    const Reply c = post(s.port, "/v1/completions", {{"prompt", "the cat"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 0}});
    REQUIRE(c.status == 200);
    const json lp = c.j()["choices"][0]["logprobs"];
    const std::string text = c.j()["choices"][0]["text"];
    REQUIRE(lp["tokens"].size() == 4);
    REQUIRE(lp["token_logprobs"].size() == 4);
    REQUIRE(lp["text_offset"].size() == 4);
    std::string joined;
    for (size_t i = 0; i < 4; i++) {
        CHECK(lp["text_offset"][i] == joined.size());
        joined += lp["tokens"][i].get<std::string>();
        CHECK(lp["token_logprobs"][i].get<double>() <= 0.0);
    }
    CHECK(joined.size() == text.size());
    const Reply ch = post(s.port, "/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", true}});
    REQUIRE(ch.status == 200);
    const json content = ch.j()["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == 3);
    for (const auto& e : content) {
        CHECK(e["token"].is_string());
        CHECK(e["logprob"].get<double>() <= 0.0);
        CHECK(e["bytes"].size() == e["token"].get<std::string>().size());
        CHECK(e["top_logprobs"].is_array());
    }
    // Without logprobs asked: null.
    const Reply none = post(s.port, "/v1/completions", {{"prompt", "the cat"}, {"max_tokens", 2}});
    CHECK(none.j()["choices"][0]["logprobs"].is_null());
}

TEST_CASE("top_logprobs gives that many alternatives per token, the sampled one's logprob among them", "[http][runtime_fields]") {
    auto s = serve_with();
    const Reply c = post(s.port, "/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}});
    REQUIRE(c.status == 200);
    const json cj = c.j();  // the range-for must not run over a temporary's member
    for (const auto& e : cj["choices"][0]["logprobs"]["content"]) {
        REQUIRE(e["top_logprobs"].size() == 3);
        // Greedy: the sampled token is the most likely.
        CHECK(e["top_logprobs"][0]["logprob"].get<double>() == Approx(e["logprob"].get<double>()));
    }
}

TEST_CASE("a second identical request shows its prompt served from the cache", "[http]") {
    auto s = serve_with();
    const json body = {{"prompt", std::string(200, 'a') + " the same long prompt"}, {"max_tokens", 2}, {"temperature", 0}};
    const Reply first = post(s.port, "/v1/completions", body);
    const Reply second = post(s.port, "/v1/completions", body);
    REQUIRE(first.status == 200);
    REQUIRE(second.status == 200);
    CHECK(first.j()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    CHECK(second.j()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() > 0);
}

TEST_CASE("/v1/models lists the routed name, the pools and the buckets, /health, /metrics and tokenize answer", "[http]") {
    auto s = serve_with();
    const Reply m = request(s.port, http::verb::get, "/v1/models");
    REQUIRE(m.status == 200);
    std::vector<std::string> ids;
    const json models = m.j();
    for (const auto& e : models["data"]) ids.push_back(e["id"]);
    // Pools first (a client taking the first entry gets a model), then the routed name and the buckets.
    CHECK(ids == std::vector<std::string>{"tiny", "slow", "steward", "slow_b", "default"});
    CHECK(request(s.port, http::verb::get, "/health").status == 200);
    const Reply metrics = request(s.port, http::verb::get, "/metrics");
    CHECK(metrics.status == 200);
    CHECK_THAT(metrics.body, Catch::Contains("# TYPE"));
    const Reply t = post(s.port, "/tokenize", {{"model", "tiny"}, {"content", "hello world"}, {"add_special", false}});
    REQUIRE(t.status == 200);
    auto ids_ref = s.rt->tokenize("tiny", "hello world", false);
    REQUIRE(ids_ref.ok());
    CHECK(t.j()["tokens"].get<std::vector<int32_t>>() == *ids_ref);
    const Reply d = post(s.port, "/detokenize", {{"model", "tiny"}, {"tokens", *ids_ref}});
    REQUIRE(d.status == 200);
    CHECK(d.j()["content"] == "hello world");
    check_error(post(s.port, "/detokenize", {{"tokens", {99999}}}), 400, "tokens", "invalid_token", "outside pool 'tiny'");
    const Reply reload = request(s.port, http::verb::post, "/admin/reload");
    CHECK(reload.status == 200);
    CHECK(reload.j()["generation"].get<uint64_t>() == s.rt->config_generation());
    s.server->set_draining(true);
    CHECK(request(s.port, http::verb::get, "/health").status == 503);
}

TEST_CASE("every refused request answers its status and OpenAI's error object naming the field", "[http]") {
    auto s = serve_with();
    const auto chat = [&](json body) { return post(s.port, "/v1/chat/completions", body); };
    const json msgs = {{{"role", "user"}, {"content", "hi"}}};
    check_error(request(s.port, http::verb::post, "/v1/chat/completions", "{\"messages\": ["), 400, "", "invalid_json");
    check_error(request(s.port, http::verb::post, "/v1/completions", std::string(100, '[') + std::string(100, ']')), 400, "",
                "invalid_json", "deeper than 64");
    check_error(chat({{"messages", msgs}, {"max_tokens", "ten"}}), 400, "max_tokens", "invalid_type", "must be an integer, not a string");
    check_error(chat({{"messages", msgs}, {"temperature", 7}}), 400, "temperature", "invalid_value", "in [0, 2]");
    check_error(chat({{"messages", "hi"}}), 400, "messages", "invalid_type");
    check_error(chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400, "messages[0].role", "invalid_value");
    check_error(chat(json::object()), 400, "messages", "missing_field");
    check_error(chat({{"messages", msgs}, {"stop", {1}}}), 400, "stop", "invalid_type");
    check_error(chat({{"messages", msgs}, {"logit_bias", {{"x", 1}}}}), 400, "logit_bias", "invalid_value");
    check_error(chat({{"messages", msgs}, {"n", 0}}), 400, "n", "invalid_value");
    check_error(chat({{"messages", msgs}, {"response_format", {{"type", "yaml"}}}}), 400, "response_format",
                "unsupported_response_format", "json_schema");
    check_error(post(s.port, "/v1/completions", {{"prompt", {"a", 7}}}), 400, "prompt", "invalid_type", "prompt[1]");
    check_error(post(s.port, "/v1/completions", {{"prompt", std::vector<std::string>(33, "a")}}), 400, "prompt", "invalid_value",
                "at most 32");
    check_error(post(s.port, "/v1/completions", {{"prompt", {"a", "b", "c", "d", "e"}}, {"n", 16}}), 400, "n", "invalid_value", "80 choices");
    check_error(post(s.port, "/v1/completions", {{"prompt", "x"}, {"logprobs", true}}), 400, "logprobs", "invalid_type");
    const Reply unknown = chat({{"model", "gpt-9"}, {"messages", msgs}});
    check_error(unknown, 404, "model", "model_not_found", "gpt-9");
    // Over the context (512): both lengths named.
    std::vector<int> ids(600, 300);
    check_error(post(s.port, "/v1/completions", {{"prompt", ids}}), 400, "prompt", "context_length_exceeded", "600 tokens");
    check_error(post(s.port, "/v1/completions", {{"prompt", ids}}), 400, "prompt", "context_length_exceeded", "512 tokens");
    // Over [server] max_body_bytes (64 KiB here).
    check_error(post(s.port, "/v1/completions", {{"prompt", std::string(70000, 'a')}}), 413, "", "body_too_large");
    check_error(request(s.port, http::verb::get, "/v2/nothing"), 404, "", "not_found");
    const Reply wrong_method = request(s.port, http::verb::get, "/v1/chat/completions");
    check_error(wrong_method, 405, "", "method_not_allowed");
    CHECK(std::string(wrong_method.headers["Allow"]) == "POST");
    check_error(request(s.port, http::verb::delete_, "/health"), 405, "", "method_not_allowed");
    check_error(request(s.port, http::verb::get, "/admin/requests/cmpl-987654"), 404, "id", "not_found");
}

TEST_CASE("structured output: a bad schema or grammar is a 400 naming where, json_schema and grammar outputs parse", "[http][grammar]") {
    auto s = serve_with();
    const auto chat = [&](json body) { return post(s.port, "/v1/chat/completions", body); };
    const json msgs = {{{"role", "user"}, {"content", "give me JSON"}}};
    const json bad_schema = {{"type", "object"}, {"properties", {{"a", {{"type", "strnig"}}}}}};
    check_error(chat({{"messages", msgs},
                      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", bad_schema}}}}}}),
                400, "response_format.json_schema.schema", "invalid_json_schema", "/properties/a");
    check_error(chat({{"messages", msgs}, {"response_format", {{"type", "json_schema"}}}}), 400, "response_format.json_schema",
                "invalid_value", "json_schema");
    check_error(post(s.port, "/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= \"a"}}), 400, "grammar",
                "invalid_grammar", "grammar:1:");
    check_error(post(s.port, "/v1/completions", {{"prompt", "x"}, {"grammar", "start ::= \"a\""}}), 400, "grammar",
                "invalid_grammar", "root");
    check_error(post(s.port, "/v1/completions", {{"prompt", "x"}, {"grammar", 5}}), 400, "grammar", "invalid_type");

    // A json_schema chat answer's content parses and has the schema's shape (random weights: noise
    // without the constraint). Greedy and sampled.
    const json schema = json::parse(R"({"type":"object","properties":{"answer":{"enum":["yes","no"]},
        "n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":2}},
        "required":["answer","n","tags"],"additionalProperties":false})");
    for (double temp : {0.0, 1.0}) {
        const Reply r = chat({{"messages", msgs}, {"max_tokens", 300}, {"temperature", temp}, {"seed", 3},
                              {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}, {"strict", true}}}}}});
        INFO(r.body);
        REQUIRE(r.status == 200);
        const json j = r.j();
        CHECK(j["choices"][0]["finish_reason"] == "stop");
        const json doc = json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
        REQUIRE(doc.is_object());
        CHECK(doc.size() == 3);
        CHECK((doc["answer"] == "yes" || doc["answer"] == "no"));
        CHECK(doc["n"].is_number_integer());
        REQUIRE(doc["tags"].is_array());
        CHECK(doc["tags"].size() <= 2);
    }
    // llama.cpp's grammar field on /v1/completions.
    const Reply g = post(s.port, "/v1/completions",
                         {{"prompt", "x"}, {"max_tokens", 50}, {"grammar", "root ::= \"{\\\"ok\\\": \" (\"true\" | \"false\") \"}\""}});
    INFO(g.body);
    REQUIRE(g.status == 200);
    const json gj = g.j();
    CHECK(gj["choices"][0]["finish_reason"] == "stop");
    const json gdoc = json::parse(gj["choices"][0]["text"].get<std::string>(), nullptr, false);
    REQUIRE(gdoc.is_object());
    CHECK(gdoc["ok"].is_boolean());
}

TEST_CASE("with api keys a request needs a tenant's key: missing or wrong is 401, a quota refusal is 429 with Retry-After", "[http][tenants]") {
    auto s = serve_with(R"(
[[tenant]]
name = "small"
api_keys = ["sk-small"]
kv_quota = 0.0625

[[tenant]]
name = "big"
api_keys = ["sk-big-1", "sk-big-2"]
)");
    const json body = {{"prompt", "hello"}, {"max_tokens", 4}};
    check_error(post(s.port, "/v1/completions", body), 401, "", "invalid_api_key");
    check_error(post(s.port, "/v1/completions", body, {{"Authorization", "Bearer sk-nope"}}), 401, "", "invalid_api_key");
    check_error(request(s.port, http::verb::get, "/v1/models", "", {{"Authorization", "sk-big-1"}}), 401, "", "invalid_api_key");
    CHECK(post(s.port, "/v1/completions", body, {{"Authorization", "Bearer sk-big-2"}}).status == 200);
    CHECK(request(s.port, http::verb::get, "/health").status == 200);  // load balancers have no key
    // The tenant is the key's, whatever `user` says: tenant small's quota (4 of 64 blocks) refuses 7 blocks.
    const json over = {{"prompt", "hello"}, {"max_tokens", 100}, {"user", "big"}};
    const Reply refused = post(s.port, "/v1/completions", over, {{"Authorization", "Bearer sk-small"}});
    check_error(refused, 429, "", "overloaded", "quota");
    CHECK(std::string(refused.headers["Retry-After"]) == "1");
    const Reply refused_stream = post(s.port, "/v1/chat/completions",
                                      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 100}, {"stream", true}},
                                      {{"Authorization", "Bearer sk-small"}});
    check_error(refused_stream, 429, "", "overloaded");
    CHECK(post(s.port, "/v1/completions", over, {{"Authorization", "Bearer sk-big-1"}}).status == 200);
    s.rt->drain();
    const json a = json::parse(s.rt->metrics_json())["admission"]["tiny"];
    CHECK(a["small"]["refused_tenant_quota"] == 2);
    CHECK(a["big"]["admitted"] == 2);
}

TEST_CASE("a tenant reads its own request's decision trace and never another tenant's", "[http][tenants][runtime_fields]") {
    auto s = serve_with(R"(
[[tenant]]
name = "a"
api_keys = ["sk-a"]

[[tenant]]
name = "b"
api_keys = ["sk-b"]
)");
    const Reply r = post(s.port, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 2}}, {{"Authorization", "Bearer sk-a"}});
    REQUIRE(r.status == 200);
    const std::string id = r.j()["id"];
    const Reply own = request(s.port, http::verb::get, "/admin/requests/" + id, "", {{"Authorization", "Bearer sk-a"}});
    CHECK(own.status == 200);
    CHECK(own.j().is_object());
    const Reply other = request(s.port, http::verb::get, "/admin/requests/" + id, "", {{"Authorization", "Bearer sk-b"}});
    CHECK(other.status == 404);
}

TEST_CASE("request fields the runtime enforces: model pins the pool, stop strings end the text, logit_bias forces a token", "[http][runtime_fields]") {
    auto s = serve_with();
    const Reply pinned = post(s.port, "/v1/completions", {{"model", "slow"}, {"prompt", "abc"}, {"max_tokens", 2}, {"temperature", 0}});
    REQUIRE(pinned.status == 200);
    CHECK(std::string(pinned.headers["x-steward-pool"]) == "slow");
    // The first pool's own greedy text; stopping at its third character cuts it there.
    const std::string full = greedy_text(*s.rt, "stop here", 12);
    REQUIRE(full.size() > 4);
    const std::string stop = full.substr(2, 2);
    const Reply stopped = post(s.port, "/v1/completions", {{"model", "tiny"}, {"prompt", "stop here"}, {"max_tokens", 12}, {"temperature", 0}, {"stop", stop}});
    REQUIRE(stopped.status == 200);
    CHECK(stopped.j()["choices"][0]["text"] == full.substr(0, full.find(stop)));
    CHECK(stopped.j()["choices"][0]["finish_reason"] == "stop");
    const Reply biased = post(s.port, "/v1/completions",
                              {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 4}, {"temperature", 0}, {"logit_bias", {{"335", 100}}}, {"logprobs", 0}});
    REQUIRE(biased.status == 200);
    auto forced = s.rt->detokenize("tiny", {335});
    REQUIRE(forced.ok());
    const json bj = biased.j();
    for (const auto& t : bj["choices"][0]["logprobs"]["tokens"]) CHECK(t == *forced);
}

TEST_CASE("a client that disconnects mid-stream cancels its request and its KV blocks go back", "[http]") {
    auto s = serve_with();
    // The forwards past the 32nd (the prompt's and 31 tokens') wait until the client has hung up:
    // the request is mid-stream then on any machine, however late this thread reads.
    steward_test::ForwardGate gate(32);
    net::io_context io;
    {
        tcp::socket sock = connect(io, s.port);
        const std::string body = json{{"model", "slow_b"}, {"prompt", "a long story"}, {"max_tokens", 480}, {"stream", true}}.dump();
        const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
        net::write(sock, net::buffer(req));
        // Read until two events have arrived, then hang up.
        std::string got;
        char chunk[4096];
        while (std::count(got.begin(), got.end(), '\n') < 12) {
            beast::error_code ec;
            const size_t n = sock.read_some(net::buffer(chunk), ec);
            REQUIRE(!ec);
            got.append(chunk, n);
        }
        CHECK_THAT(got, Catch::Contains("data: {"));
        const json mid = json::parse(s.rt->metrics_json());
        CHECK(blocks_reserved(mid) > 0);
    }  // closed
    gate.release();
    s.rt->drain();
    const json m = json::parse(s.rt->metrics_json());
    CHECK(blocks_reserved(m) == 0);
    CHECK(m["buckets"]["slow_b"]["requests"]["by_finish_reason"]["cancelled"] == 1);
    CHECK(finished_with(m["all"], "cancelled") == 1);
}

TEST_CASE("a client dripping its headers (slowloris) is dropped after the read timeout", "[http][limits]") {
    auto s = serve_with();
    net::io_context io;
    tcp::socket sock = connect(io, s.port);
    const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    beast::error_code ec;
    // One byte every 200 ms (the dripping is the test, not a synchronisation); the server's read
    // timeout is 1.5 s, so it hangs up long before the 40 bytes (8 s) are sent.
    int n_sent = 0;
    for (; n_sent < 40 && !ec; n_sent++) {
        net::write(sock, net::buffer(head.substr(n_sent % head.size(), 1)), ec);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        pollfd p{sock.native_handle(), POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) break;  // EOF (or RST) is readable
    }
    CHECK(n_sent < 40);
    char c;
    const size_t n = sock.read_some(net::buffer(&c, 1), ec);
    CHECK(n == 0);
    CHECK((ec == net::error::eof || ec == net::error::connection_reset));
    // The server still serves others.
    CHECK(request(s.port, http::verb::get, "/health").status == 200);
}

TEST_CASE("headers over the limit are answered 431 and the connection closed", "[http][limits]") {
    auto s = serve_with();
    const Reply r = request(s.port, http::verb::get, "/health", "", {{"X-Big", std::string(8000, 'x')}});
    check_error(r, 431, "", "headers_too_large", "4096");
    CHECK(request(s.port, http::verb::get, "/health").status == 200);
}

TEST_CASE("a client that half-closes after its request still gets the whole answer", "[http][limits]") {
    auto s = serve_with();
    for (const bool stream : {false, true}) {
        INFO("stream " << stream);
        net::io_context io;
        tcp::socket sock = connect(io, s.port);
        const std::string body = json{{"prompt", "half"}, {"max_tokens", 3}, {"temperature", 0}, {"stream", stream}}.dump();
        const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                                "\r\n\r\n" + body;
        net::write(sock, net::buffer(req));
        sock.shutdown(tcp::socket::shutdown_send);
        beast::flat_buffer buf;
        http::response_parser<http::string_body> p;
        beast::error_code ec;
        http::read(sock, buf, p, ec);
        if (stream) {
            // A streaming client that hangs up its side has gone: its request is cancelled.
            s.rt->drain();
            CHECK(blocks_reserved(json::parse(s.rt->metrics_json())) == 0);
            continue;
        }
        REQUIRE(!ec);
        CHECK(p.get().result_int() == 200);
        CHECK(json::parse(p.get().body())["choices"][0]["text"] == greedy_text(*s.rt, "half", 3));
        // Whether the answer says `Connection: close` depends on whether the server saw the EOF
        // before it wrote the answer (a race); either way it closes the connection after it.
        char c;
        sock.read_some(net::buffer(&c, 1), ec);
        CHECK(ec == net::error::eof);
    }
}

TEST_CASE("a keep-alive connection serves requests one after another", "[http]") {
    auto s = serve_with();
    net::io_context io;
    tcp::socket sock = connect(io, s.port);
    beast::flat_buffer buf;
    for (int i = 0; i < 3; i++) {
        http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
        req.set(http::field::host, "x");
        req.body() = json{{"prompt", "k" + std::to_string(i)}, {"max_tokens", 2}, {"stream", i == 1}}.dump();
        req.prepare_payload();
        http::write(sock, req);
        http::response<http::string_body> res;
        http::read(sock, buf, res);
        CHECK(res.result_int() == 200);
        CHECK(res.keep_alive());
    }
}

TEST_CASE("presence and frequency penalties change a greedy output that repeats tokens", "[http][runtime_fields]") {
    auto s = serve_with();
    const json plain_body = {{"model", "tiny"}, {"prompt", "a a a a"}, {"max_tokens", 24}, {"temperature", 0}, {"logprobs", 0}};
    const Reply plain = post(s.port, "/v1/completions", plain_body);
    REQUIRE(plain.status == 200);
    const json tokens = plain.j()["choices"][0]["logprobs"]["tokens"];
    std::set<std::string> distinct(tokens.begin(), tokens.end());
    REQUIRE(distinct.size() < tokens.size());  // the reference repeats itself
    for (const char* field : {"presence_penalty", "frequency_penalty"}) {
        INFO(field);
        json body = plain_body;
        body[field] = 2.0;
        const Reply penalised = post(s.port, "/v1/completions", body);
        REQUIRE(penalised.status == 200);
        CHECK(penalised.j()["choices"][0]["text"] != plain.j()["choices"][0]["text"]);
    }
}

TEST_CASE("connections past max_connections are closed at once, the others are served", "[http][limits]") {
    auto s = serve_with("", test_server_config(), 2);
    net::io_context io;
    tcp::socket a = connect(io, s.port), b = connect(io, s.port);
    // a and b are idle, accepted connections (a request on each proves it).
    for (tcp::socket* sock : {&a, &b}) {
        http::request<http::string_body> req(http::verb::get, "/health", 11);
        req.set(http::field::host, "x");
        http::write(*sock, req);
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        http::read(*sock, buf, res);
        CHECK(res.result_int() == 200);
    }
    tcp::socket c = connect(io, s.port);
    char ch;
    beast::error_code ec;
    const size_t n = c.read_some(net::buffer(&ch, 1), ec);
    CHECK(n == 0);
    CHECK((ec == net::error::eof || ec == net::error::connection_reset));
}

TEST_CASE("a streaming client that stops reading is cancelled once its unread output passes the bound", "[http][limits]") {
    ServerConfig sc = test_server_config();
    sc.max_stream_buffer_bytes = 4096;
    auto s = serve_with("", sc);
    net::io_context io;
    tcp::socket sock(io);
    sock.open(tcp::v4());
    sock.set_option(net::socket_base::receive_buffer_size(2048));  // a small window: the server's writes stall
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), s.port));
    // 16 choices of up to 480 tokens: megabytes of events, far more than the socket buffers take.
    const std::string body = json{{"model", "tiny"}, {"prompt", "go"}, {"max_tokens", 480}, {"n", 16}, {"stream", true}}.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(sock, net::buffer(req));
    // The first event proves the requests run; from then on the client reads nothing more.
    std::string got;
    char chunk[256];
    while (got.find("data: ") == std::string::npos) {
        beast::error_code ec;
        const size_t n = sock.read_some(net::buffer(chunk), ec);
        REQUIRE(!ec);
        got.append(chunk, n);
    }
    s.rt->drain();  // the server must give up on its own
    const json m = json::parse(s.rt->metrics_json());
    CHECK(blocks_reserved(m) == 0);
    CHECK(finished_with(m["all"], "cancelled") >= 1);
}

TEST_CASE("a client sending Expect: 100-continue gets the go-ahead, then its answer", "[http]") {
    auto s = serve_with();
    net::io_context io;
    tcp::socket sock = connect(io, s.port);
    const std::string body = json{{"prompt", "continue"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n";
    net::write(sock, net::buffer(head));
    std::string got;
    char chunk[256];
    while (got.find("\r\n\r\n") == std::string::npos) {
        beast::error_code ec;
        const size_t n = sock.read_some(net::buffer(chunk), ec);
        REQUIRE(!ec);
        got.append(chunk, n);
    }
    CHECK(got.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0);
    net::write(sock, net::buffer(body));
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(sock, buf, res);
    CHECK(res.result_int() == 200);
    CHECK(json::parse(res.body())["choices"][0]["text"] == greedy_text(*s.rt, "continue", 2));
}

TEST_CASE("an HTTP/1.0 client's stream is plain events ending with the connection", "[http]") {
    auto s = serve_with();
    net::io_context io;
    tcp::socket sock = connect(io, s.port);
    const std::string body = json{{"prompt", "old client"}, {"max_tokens", 3}, {"temperature", 0}, {"stream", true}}.dump();
    const std::string req = "POST /v1/completions HTTP/1.0\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(sock, net::buffer(req));
    std::string got;
    char chunk[4096];
    beast::error_code ec;
    while (!ec) {
        const size_t n = sock.read_some(net::buffer(chunk), ec);
        got.append(chunk, n);
    }
    CHECK(ec == net::error::eof);
    CHECK(got.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
    CHECK_THAT(got, !Catch::Contains("chunked"));
    const std::string events = got.substr(got.find("\r\n\r\n") + 4);
    const auto ev = sse_events(events);
    REQUIRE(!ev.empty());
    CHECK(ev.back() == "[DONE]");
    CHECK(events.rfind("data: ", 0) == 0);  // no chunk sizes between the events
}

TEST_CASE("before a runtime is attached every endpoint answers 503 and /health says loading", "[http]") {
    ServerConfig sc = test_server_config();
    sc.port = 0;
    auto srv = serve::HttpServer::start(nullptr, sc);
    REQUIRE(srv.ok());
    const uint16_t port = (*srv)->port();
    const Reply h = request(port, http::verb::get, "/health");
    CHECK(h.status == 503);
    CHECK(h.j()["status"] == "loading");
    const Reply c = post(port, "/v1/completions", {{"prompt", "x"}});
    check_error(c, 503, "", "loading");
    CHECK(std::string(c.headers["Retry-After"]) == "1");
    check_error(request(port, http::verb::get, "/nowhere"), 404, "", "not_found");
    auto s = serve_with();
    (*srv)->attach(*s.rt);
    CHECK(request(port, http::verb::get, "/health").status == 200);
    CHECK(post(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}).status == 200);
    (*srv)->stop();  // before s.rt goes
}

TEST_CASE("concurrent streaming and plain clients all get whole, correct answers", "[http]") {
    auto s = serve_with();
    const std::string want = greedy_text(*s.rt, "many clients", 6);
    constexpr int n_clients = 24;
    std::vector<std::string> texts(n_clients);
    std::vector<int> statuses(n_clients);
    std::vector<std::thread> threads;
    for (int c = 0; c < n_clients; c++)
        threads.emplace_back([&, c] {
            const bool stream = c % 2 == 0;
            const Reply r = post(s.port, "/v1/completions", {{"prompt", "many clients"}, {"max_tokens", 6}, {"temperature", 0}, {"stream", stream}});
            statuses[c] = r.status;
            if (r.status != 200) return;
            if (!stream) {
                texts[c] = json::parse(r.body)["choices"][0]["text"];
                return;
            }
            std::string t;
            bool done = false;
            size_t at = 0;
            while ((at = r.body.find("data: ", at)) != std::string::npos) {
                const size_t e = r.body.find("\n\n", at);
                const std::string ev = r.body.substr(at + 6, e - at - 6);
                at = e;
                if (ev == "[DONE]") done = true;
                else t += json::parse(ev)["choices"][0]["text"].get<std::string>();
            }
            texts[c] = done ? t : "(no [DONE])";
        });
    for (auto& t : threads) t.join();
    for (int c = 0; c < n_clients; c++) {
        INFO("client " << c);
        CHECK(statuses[c] == 200);
        CHECK(texts[c] == want);
    }
    s.rt->drain();
    CHECK(blocks_reserved(json::parse(s.rt->metrics_json())) == 0);
}

namespace {

// A pool that renders prompts with Hermes 3's real chat template (tools in <tools>, calls in
// <tool_call> tags; its system block alone is ~900 tokens of the synthetic vocabulary, hence 4k context).
const std::string k_hermes_pool = fmt::format(R"(
[[pool]]
chat_template_fallback = "chatml"
name = "hermes"
model = "{}/hermes.gguf"
threads = 1
kv_blocks = 256
block_size = 16
max_batch = 16
max_batch_tokens = 512
chat_template_file = "{}/chat_templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
[pool.synth]
dim = 64
layers = 1
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 4096
seed = 5
)",
                                              temp_dir().string(), STEWARD_TESTDATA_DIR);

const json k_weather_tool = {{"type", "function"},
                             {"function",
                              {{"name", "get_weather"},
                               {"description", "The weather in a city"},
                               {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};

// Forces the model's output to `text` then end-of-sequence, for as long as it lives.
struct ForcedOutput {
    ForcedOutput(Runtime& rt, const std::string& pool, const std::string& text) {
        auto ids = rt.tokenize(pool, text, false);
        REQUIRE(ids);
        auto back = rt.detokenize(pool, *ids);
        REQUIRE(back);
        REQUIRE(*back == text);  // the vocabulary spells it exactly
        const auto info = rt.pools();
        std::string eos;
        for (const auto& p : info)
            if (p.name == pool) eos = p.eos_token;
        auto e = rt.tokenize(pool, eos, true);
        REQUIRE(e);
        const int32_t eos_id = e->back();
        set_forced_token_hook([ids = *ids, eos_id](int n) { return n < (int)ids.size() ? ids[(size_t)n] : eos_id; });
    }
    ~ForcedOutput() { set_forced_token_hook({}); }
};

}  // namespace

TEST_CASE("a chat with tools renders the pool's real template and parses the model's tool call", "[http][tools]") {
    auto s = serve_with(k_hermes_pool);
    const std::string out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    ForcedOutput forced(*s.rt, "hermes", out);
    const json body = {{"model", "hermes"},
                       {"messages", {{{"role", "user"}, {"content", "weather in Paris?"}}}},
                       {"tools", {k_weather_tool}},
                       {"max_tokens", 256},
                       {"temperature", 0}};
    const Reply r = post(s.port, "/v1/chat/completions", body);
    INFO(r.body);
    REQUIRE(r.status == 200);
    const json j = r.j();
    const json& msg = j["choices"][0]["message"];
    CHECK(msg["content"] == "Let me check.");
    REQUIRE(msg["tool_calls"].size() == 1);
    const json& call = msg["tool_calls"][0];
    CHECK(call["type"] == "function");
    CHECK(call["function"]["name"] == "get_weather");
    CHECK(json::parse(call["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}});
    CHECK_THAT(call["id"].get<std::string>(), Catch::StartsWith("call_"));
    CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
    // The prompt went through Hermes' template: its tool block is in the rendered text the runtime
    // saw (more prompt tokens than the ChatML of the one message).
    auto chatml = s.rt->tokenize("hermes", "<|im_start|>user\nweather in Paris?<|im_end|>\n<|im_start|>assistant\n", true);
    REQUIRE(chatml);
    CHECK(j["usage"]["prompt_tokens"].get<size_t>() > chatml->size() + 50);

    // Streamed: the content first, then the call in one delta, then finish_reason tool_calls.
    json sbody = body;
    sbody["stream"] = true;
    const Reply sr = post(s.port, "/v1/chat/completions", sbody);
    REQUIRE(sr.status == 200);
    std::string content, finish;
    std::vector<json> calls;
    for (const auto& e : sse_events(sr.body)) {
        if (e == "[DONE]") break;
        const json c = json::parse(e);
        const json& ch = c["choices"][0];
        if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) content += ch["delta"]["content"].get<std::string>();
        if (ch["delta"].contains("tool_calls"))
            for (const auto& t : ch["delta"]["tool_calls"]) calls.push_back(t);
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    CHECK(content == "Let me check.");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0]["index"] == 0);
    CHECK(calls[0]["function"]["name"] == "get_weather");
    CHECK(json::parse(calls[0]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}});
    CHECK(finish == "tool_calls");
}

TEST_CASE("a tool result message renders through the template, and a malformed call stays content", "[http][tools]") {
    auto s = serve_with(k_hermes_pool);
    const std::string out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>";
    ForcedOutput forced(*s.rt, "hermes", out);
    const json body = {
        {"model", "hermes"},
        {"messages",
         {{{"role", "user"}, {"content", "weather in Paris?"}},
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls", {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
          {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny, 21 C"}},
          {{"role", "user"}, {"content", "and tomorrow?"}}}},
        {"tools", {k_weather_tool}},
        {"max_tokens", 256},
        {"temperature", 0}};
    const Reply r = post(s.port, "/v1/chat/completions", body);
    INFO(r.body);
    REQUIRE(r.status == 200);
    const json j = r.j();
    CHECK(j["choices"][0]["message"]["content"] == out);  // not lost, not a call
    CHECK(!j["choices"][0]["message"].contains("tool_calls"));
    CHECK(j["choices"][0]["finish_reason"] == "stop");
    // A template that fails on the conversation (Hermes does not, so use a broken kwarg type) is a 400.
    json bad = body;
    bad["chat_template_kwargs"] = "yes";
    check_error(post(s.port, "/v1/chat/completions", bad), 400, "chat_template_kwargs", "invalid_type");
}

TEST_CASE("tool_choice required or a named function: random weights still give a call whose arguments validate", "[http][tools][grammar]") {
    auto s = serve_with(k_hermes_pool);
    const json tools = json::parse(R"([
      {"type":"function","function":{"name":"get_weather","description":"The weather","parameters":{"type":"object","properties":{
         "city":{"type":"string","maxLength":10},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}}},
      {"type":"function","function":{"name":"set_alarm","description":"An alarm","parameters":{"type":"object","properties":{
         "hour":{"type":"integer","minimum":0,"maximum":23},"tag":{"enum":["work","home"]}},"required":["hour","tag"]}}}])");
    // Written from the schemas above, independently of the grammar compiler.
    auto valid = [](const std::string& name, const json& a) {
        if (!a.is_object()) return false;
        if (name == "get_weather") {
            if (a.size() != 2 || !a.contains("city") || !a["city"].is_string() || !a.contains("days") ||
                !a["days"].is_number_integer())
                return false;
            size_t n = 0;
            for (unsigned char c : a["city"].get<std::string>()) n += (c & 0xC0) != 0x80;
            return n <= 10 && a["days"].get<int64_t>() >= 1 && a["days"].get<int64_t>() <= 7;
        }
        if (name == "set_alarm")
            return a.size() == 2 && a.contains("hour") && a["hour"].is_number_integer() && a["hour"].get<int64_t>() >= 0 &&
                   a["hour"].get<int64_t>() <= 23 && (a["tag"] == "work" || a["tag"] == "home");
        return false;
    };
    const json msgs = {{{"role", "user"}, {"content", "weather in Paris?"}}};
    for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "set_alarm"}}}}}) {
        for (int seed = 1; seed <= 4; ++seed) {
            const Reply r = post(s.port, "/v1/chat/completions",
                                 {{"model", "hermes"}, {"messages", msgs}, {"tools", tools}, {"tool_choice", choice},
                                  {"max_tokens", 600}, {"temperature", 1.0}, {"seed", seed}});
            INFO(choice.dump() << " seed " << seed << ": " << r.body);
            REQUIRE(r.status == 200);
            const json j = r.j();
            CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
            const json& msg = j["choices"][0]["message"];
            REQUIRE(msg.contains("tool_calls"));
            REQUIRE(msg["tool_calls"].size() == 1);
            const json& fn = msg["tool_calls"][0]["function"];
            const std::string name = fn["name"].get<std::string>();
            if (choice.is_object()) CHECK(name == "set_alarm");
            const json args = json::parse(fn["arguments"].get<std::string>(), nullptr, false);
            REQUIRE_FALSE(args.is_discarded());
            CHECK(valid(name, args));
        }
    }
    // What cannot be enforced is a 400 naming tool_choice.
    check_error(post(s.port, "/v1/chat/completions", {{"model", "hermes"}, {"messages", msgs}, {"tool_choice", "required"}}),
                400, "tool_choice", "invalid_value", "needs 'tools'");
    check_error(post(s.port, "/v1/chat/completions",
                     {{"model", "hermes"}, {"messages", msgs}, {"tools", tools},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
                400, "tool_choice", "invalid_value", "\"nope\"");
    check_error(post(s.port, "/v1/chat/completions", {{"model", "hermes"}, {"messages", msgs}, {"tools", tools}, {"tool_choice", "always"}}),
                400, "tool_choice", "invalid_value", "'always'");
    auto plain = serve_with();  // no chat template: no tool-call format to enforce
    check_error(post(plain.port, "/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"tool_choice", "required"}}),
                400, "tool_choice", "invalid_value", "tool_choice \"auto\"");
}

TEST_CASE("n > 1 shares the prompt's full blocks: choices after the first attach to what it computed", "[http]") {
    // Pool "hermes" takes 512 tokens a step: the 4 prompts would all be prefilled in one step, each
    // computing its own blocks, if they were submitted together.
    auto s = serve_with(k_hermes_pool);
    std::string prompt;
    for (int i = 0; i < 24; i++) prompt += "word" + std::to_string(i) + " ";
    auto ids = s.rt->tokenize("hermes", prompt, true);
    REQUIRE(ids);
    // The full blocks before the prompt's last token (that one is always computed: its logits answer).
    const int64_t full_blocks_tokens = (int64_t)((ids->size() - 1) / 16) * 16;
    REQUIRE(full_blocks_tokens >= 48);
    REQUIRE(4 * ids->size() <= 512);
    const Reply r = post(s.port, "/v1/completions",
                         {{"model", "hermes"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0.8}, {"seed", 3}, {"n", 4}});
    INFO(r.body);
    REQUIRE(r.status == 200);
    REQUIRE(r.j()["choices"].size() == 4);
    // Choice 0 computed the prompt; each of the 3 others found every full block of it cached.
    const json m = json::parse(s.rt->metrics_json());
    CHECK(m["all"]["tokens"]["cached_prompt"].get<int64_t>() >= 3 * full_blocks_tokens);
    CHECK(m["all"]["tokens"]["prompt"].get<int64_t>() == 4 * (int64_t)ids->size());
}

TEST_CASE("a streamed stop string spanning several tokens is never sent, and the stream ends with stop", "[http][runtime_fields]") {
    auto s = serve_with();
    ForcedOutput forced(*s.rt, "tiny", "Hello there <END> and more text after it");
    auto ids = s.rt->tokenize("tiny", "<END>", false);
    REQUIRE(ids);
    REQUIRE(ids->size() >= 2);  // the stop string is split across tokens
    const Reply r = post(s.port, "/v1/chat/completions",
                         {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 60},
                          {"stop", {"<END>", "never"}}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
    REQUIRE(r.status == 200);
    std::string text, finish;
    int completion_tokens = -1;
    for (const auto& e : sse_events(r.body)) {
        if (e == "[DONE]") break;
        const json c = json::parse(e);
        if (c.contains("usage") && c["usage"].is_object()) completion_tokens = c["usage"]["completion_tokens"];
        if (c["choices"].empty()) continue;
        const json& d = c["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    CHECK(text == "Hello there ");
    CHECK(finish == "stop");
    CHECK(completion_tokens > 0);
}

namespace {
// Everything the server sends on `sock` until it closes (or `timeout_ms` of silence).
std::string read_until_close(tcp::socket& sock, int timeout_ms = 5000) {
    std::string got;
    char buf[4096];
    while (true) {
        pollfd p{sock.native_handle(), POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) <= 0) break;
        beast::error_code ec;
        const size_t n = sock.read_some(net::buffer(buf), ec);
        if (ec || n == 0) break;
        got.append(buf, n);
    }
    return got;
}
size_t count_of(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) n++;
    return n;
}
}  // namespace

TEST_CASE("Transfer-Encoding other than chunked: 501, the connection closed, the body never read as a request", "[http][limits]") {
    auto s = serve_with();
    // The body is a whole second request: a server that read on would answer it too.
    const std::string smuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (const std::string te : {"gzip", "identity", "deflate", "chunked, identity", "gzip, chunked"}) {
        INFO("Transfer-Encoding: " << te);
        net::io_context io;
        tcp::socket sock = connect(io, s.port);
        const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + te + "\r\n\r\n" + smuggled;
        net::write(sock, net::buffer(req));
        const std::string got = read_until_close(sock);
        CHECK(got.rfind("HTTP/1.1 501", 0) == 0);
        CHECK(got.find("unsupported_transfer_encoding") != std::string::npos);
        CHECK(count_of(got, "HTTP/1.1 ") == 1);  // the smuggled GET got no answer
        CHECK(got.find("Connection: close") != std::string::npos);
    }
    // Two Transfer-Encoding fields are refused the same way.
    {
        net::io_context io;
        tcp::socket sock = connect(io, s.port);
        net::write(sock, net::buffer("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled));
        const std::string got = read_until_close(sock);
        INFO(got);
        CHECK((got.rfind("HTTP/1.1 501", 0) == 0 || got.rfind("HTTP/1.1 400", 0) == 0));  // the parser may refuse it first
        CHECK(count_of(got, "HTTP/1.1 ") == 1);
        CHECK(got.find("Connection: close") != std::string::npos);
    }
    // chunked alone is HTTP/1.1's own framing: it works, and the next request on the connection too.
    {
        net::io_context io;
        tcp::socket sock = connect(io, s.port);
        const std::string body = json{{"prompt", "te"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
        char size[16];
        std::snprintf(size, sizeof size, "%zx", body.size());
        net::write(sock, net::buffer("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(size) +
                                     "\r\n" + body + "\r\n0\r\n\r\n"));
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        http::read(sock, buf, res);
        CHECK(res.result_int() == 200);
        CHECK(json::parse(res.body())["choices"][0]["text"] == greedy_text(*s.rt, "te", 2));
        CHECK(res.keep_alive());
    }
}

TEST_CASE("requests pipelined before a half-close are all answered in order", "[http][limits]") {
    auto s = serve_with();
    net::io_context io;
    tcp::socket sock = connect(io, s.port);
    std::string all;
    const int n = 10;
    for (int i = 0; i < n; i++) {
        const std::string body = json{{"prompt", "p" + std::to_string(i)}, {"max_tokens", 2}, {"temperature", 0}}.dump();
        all += "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    }
    net::write(sock, net::buffer(all));
    sock.shutdown(tcp::socket::shutdown_send);
    beast::flat_buffer buf;
    for (int i = 0; i < n; i++) {
        INFO("response " << i);
        http::response<http::string_body> res;
        beast::error_code ec;
        http::read(sock, buf, res, ec);
        REQUIRE(!ec);
        CHECK(res.result_int() == 200);
        CHECK(json::parse(res.body())["choices"][0]["text"] == greedy_text(*s.rt, "p" + std::to_string(i), 2));
    }
    char c;
    beast::error_code ec;
    sock.read_some(net::buffer(&c, 1), ec);
    CHECK(ec == net::error::eof);
}

TEST_CASE("admin scope: only an admin key reloads, /metrics shows a tenant its own series and the aggregates", "[http][tenants]") {
    auto s = serve_with(R"(
[[tenant]]
name = "acme"
api_keys = ["sk-acme"]

[[tenant]]
name = "globex"
api_keys = ["sk-globex"]

[[tenant]]
name = "ops"
api_keys = ["sk-ops"]
admin = true
)");
    for (const auto& [key, tenant] : {std::pair{"sk-acme", "acme"}, std::pair{"sk-globex", "globex"}})
        REQUIRE(post(s.port, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 2}}, {{"Authorization", std::string("Bearer ") + key}}).status == 200);
    s.rt->drain();
    const uint64_t g0 = s.rt->config_generation();
    check_error(request(s.port, http::verb::post, "/admin/reload", "", {{"Authorization", "Bearer sk-acme"}}), 403, "", "permission_denied", "admin");
    CHECK(s.rt->config_generation() == g0);
    check_error(request(s.port, http::verb::post, "/admin/reload", ""), 401, "", "invalid_api_key");
    const Reply reloaded = request(s.port, http::verb::post, "/admin/reload", "", {{"Authorization", "Bearer sk-ops"}});
    CHECK(reloaded.status == 200);
    CHECK(s.rt->config_generation() == g0 + 1);

    // Which tenants a scrape names, read from its sample lines.
    const auto tenants_in = [](const std::string& text) {
        std::set<std::string> seen;
        for (size_t at = text.find("tenant=\""); at != std::string::npos; at = text.find("tenant=\"", at + 1))
            seen.insert(text.substr(at + 8, text.find('"', at + 8) - at - 8));
        return seen;
    };
    const Reply acme = request(s.port, http::verb::get, "/metrics", "", {{"Authorization", "Bearer sk-acme"}});
    REQUIRE(acme.status == 200);
    CHECK(tenants_in(acme.body) == std::set<std::string>{"acme"});
    CHECK(acme.body.find("steward_request_success_total{") != std::string::npos);  // the aggregate series stay
    const Reply globex = request(s.port, http::verb::get, "/metrics", "", {{"Authorization", "Bearer sk-globex"}});
    CHECK(tenants_in(globex.body) == std::set<std::string>{"globex"});
    const Reply ops = request(s.port, http::verb::get, "/metrics", "", {{"Authorization", "Bearer sk-ops"}});
    CHECK(tenants_in(ops.body).count("acme") == 1);
    CHECK(tenants_in(ops.body).count("globex") == 1);
}

TEST_CASE("values that used to pass silently are refused naming the value", "[http][runtime_fields]") {
    auto s = serve_with();
    // The pools' vocabulary has 512 ids: 512 names none of them.
    const Reply bias = post(s.port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"logit_bias", {{"512", 5}}}});
    CHECK(bias.status == 400);
    CHECK_THAT(bias.body, Catch::Contains("logit_bias names token id 512") && Catch::Contains("vocabulary of 512"));
    CHECK(post(s.port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"logit_bias", {{"511", 5}}}}).status == 200);
    const Reply big = post(s.port, "/detokenize", {{"tokens", {1, 2147483648LL}}});
    check_error(big, 400, "tokens", "invalid_value", "2147483648, which is no token id");
    const Reply email = post(s.port, "/v1/chat/completions", json::parse(R"({"messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema":
            {"type": "object", "properties": {"e": {"type": "string", "format": "email"}}}}}})"));
    CHECK(email.status == 400);
    CHECK_THAT(email.body, Catch::Contains("'email' is not a format"));
    check_error(post(s.port, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", nullptr}}}}}), 400, "messages[0].content",
                "invalid_type", "is null");
    check_error(post(s.port, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", {1}}}), 400, "tools[0]",
                "invalid_type");
}
