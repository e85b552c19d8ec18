// Route, then render: a chat to the routed model ("steward") is classified and routed first, then
// rendered with the chat template of the pool the route chose and tokenized with that pool's
// tokenizer. Two pools with different templates: "a" has none (ChatML), "b" a chat_template_file
// with its own markers, a Hermes tool-call format and a refusal of system messages; buckets
// "greedy_b" (temperature <= 0.5) and "tools_b" (tools given) route to "b", every other request
// goes to "a". Expected prompts
// are written out by hand from the template text below and tokenized with the pool's tokenizer
// (Runtime::tokenize), never taken from the server's own rendering.
#include <fmt/format.h>

#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it under C++20
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <steward/runtime.h>

#include "config/config.h"
#include "process_temp_dir.h"
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
    static const steward_test::ProcessTempDir dir("steward_test_route_render_");
    return dir.path();
}

// Pool b's template: one line, so that trim_blocks / lstrip_blocks leave every character as written.
const std::string k_b_template =
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('pool b takes no system message') }}{% endif %}"
    "[B-TEMPLATE {{ m.role }}] {{ m.content }} [/B-TEMPLATE]{% endfor %}"
    "{% if tools %}[B-TOOLS] answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call> [/B-TOOLS]{% endif %}"
    "{% if add_generation_prompt %}[B-TEMPLATE assistant] {% endif %}";

// What that template renders for one user message, with or without tools (by hand).
std::string b_rendering(const std::string& user, bool tools) {
    return "[B-TEMPLATE user] " + user + " [/B-TEMPLATE]" +
           (tools ? "[B-TOOLS] answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call> [/B-TOOLS]" : "") +
           "[B-TEMPLATE assistant] ";
}

// Pool a has no template: ChatML (the server's fallback).
std::string chatml(const std::string& user) {
    return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

std::string b_template_path() { return (temp_dir() / "b_template.jinja").string(); }

std::string config_toml() {
    const std::string dir = temp_dir().string();
    std::string pools;
    for (const auto& [name, seed, tmpl] : {std::tuple{"a", 3, std::string()},
                                          std::tuple{"b", 4, "chat_template_file = \"" + b_template_path() + "\"\n"}})
        pools += fmt::format(R"(
[[pool]]
chat_template_fallback = "chatml"
name = "{}"
model = "{}/{}.gguf"
threads = 1
kv_blocks = 64
block_size = 16
max_batch = 16
max_batch_tokens = 128
{}[pool.synth]
dim = 64
layers = 1
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 512
seed = {}
)",
                             name, dir, name, tmpl, seed);
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
{}
[[bucket]]
name = "greedy_b"
pool = "b"
[bucket.match]
max_temperature = 0.5

[[bucket]]
name = "tools_b"
pool = "b"
[bucket.match]
tools = true

[[bucket]]
name = "default"
pool = "a"
)",
                       pools);
}

Served serve_two_templates() {
    {
        std::ofstream f(b_template_path());
        f << k_b_template;  // no newline at the end: the rendering ends where the template does
    }
    auto c = parse_config(config_toml(), (temp_dir() / "route_render.toml").string());
    if (!c) FAIL(c.error().message);
    return serve_config(*c);
}

// Its reads give up after 30 s.
Reply chat(uint16_t port, const json& body) { return request(port, http::verb::post, "/v1/chat/completions", body.dump(), {}, 30); }

json trace_of(uint16_t port, const Reply& r) {
    const Reply t = request(port, http::verb::get, "/admin/requests/" + std::string(r.headers["x-steward-request-id"]), "", {}, 30);
    INFO(t.body);
    REQUIRE(t.status == 200);
    return t.j();
}

size_t n_tokens(Runtime& rt, const std::string& pool, const std::string& text) {
    auto ids = rt.tokenize(pool, text, true);
    REQUIRE(ids);
    return ids->size();
}

const json k_weather_tool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "The weather"},
      {"parameters",
       {{"type", "object"}, {"properties", {{"unit", {{"enum", {"c", "f"}}}}}}, {"required", {"unit"}}}}}}};

}  // namespace

TEST_CASE("a chat to the routed model is rendered with the template of the pool its bucket's rule routes to", "[http][route_render]") {
    auto s = serve_two_templates();
    const json msgs = {{{"role", "user"}, {"content", "hello"}}};
    // The two renderings differ in length in b's vocabulary: the count tells which one b ran.
    const size_t b_own = n_tokens(*s.rt, "b", b_rendering("hello", false));
    REQUIRE(b_own != n_tokens(*s.rt, "b", chatml("hello")));

    const Reply r = chat(s.port, {{"model", "steward"}, {"messages", msgs}, {"temperature", 0}, {"max_tokens", 3}});
    INFO(r.body);
    REQUIRE(r.status == 200);
    CHECK(std::string(r.headers["x-steward-pool"]) == "b");
    CHECK(r.j()["usage"]["prompt_tokens"].get<size_t>() == b_own);
    const json t = trace_of(s.port, r);
    INFO(t.dump(2));
    CHECK(t["bucket"]["name"] == "greedy_b");
    CHECK(t["route"]["pool"] == "b");
    const std::string b_names = "pool 'b' chat_template_file " + b_template_path();
    CHECK(t["route"]["template"] == b_names);
    REQUIRE(t["runs"].size() == 1);
    CHECK(t["runs"][0]["pool"] == "b");
    CHECK(t["runs"][0]["template"] == b_names);
    CHECK(t["runs"][0]["prompt_tokens"].get<size_t>() == b_own);

    // Sampled: bucket "default", pool a, ChatML in a's vocabulary.
    const Reply ra = chat(s.port, {{"model", "steward"}, {"messages", msgs}, {"temperature", 1.0}, {"max_tokens", 3}});
    INFO(ra.body);
    REQUIRE(ra.status == 200);
    CHECK(std::string(ra.headers["x-steward-pool"]) == "a");
    CHECK(ra.j()["usage"]["prompt_tokens"].get<size_t>() == n_tokens(*s.rt, "a", chatml("hello")));
    const json ta = trace_of(s.port, ra);
    CHECK(ta["route"]["pool"] == "a");
    CHECK(ta["route"]["template"] == "pool 'a' chat_template_fallback chatml");
}

TEST_CASE("tool_choice required routed to a pool with a tool-call format gets that pool's grammar and parser", "[http][route_render][tools]") {
    auto s = serve_two_templates();
    const json msgs = {{{"role", "user"}, {"content", "weather?"}}};
    // Sampled (bucket tools_b): greedy decoding of these random weights would pick the JSON
    // whitespace the grammar allows forever; sampling leaves it soon enough.
    json body = {{"model", "steward"}, {"messages", msgs},     {"tools", {k_weather_tool}}, {"tool_choice", "required"},
                 {"temperature", 1.0}, {"seed", 1}, {"max_tokens", 360}};
    const Reply r = chat(s.port, body);
    INFO(r.body);
    REQUIRE(r.status == 200);
    const json j = r.j();
    CHECK(std::string(r.headers["x-steward-pool"]) == "b");
    CHECK(trace_of(s.port, r)["bucket"]["name"] == "tools_b");
    CHECK(j["usage"]["prompt_tokens"].get<size_t>() == n_tokens(*s.rt, "b", b_rendering("weather?", true)));
    CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
    const json& msg = j["choices"][0]["message"];
    REQUIRE(msg.contains("tool_calls"));
    REQUIRE(msg["tool_calls"].size() == 1);
    CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
    const json args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
    CHECK((args == json{{"unit", "c"}} || args == json{{"unit", "f"}}));

    // Streamed: the call arrives as a tool_calls delta (parsed in b's format), then finish_reason tool_calls.
    body["stream"] = true;
    const Reply sr = chat(s.port, body);
    REQUIRE(sr.status == 200);
    std::vector<json> calls;
    std::string finish;
    for (size_t at = 0;;) {
        const size_t b = sr.body.find("data: ", at);
        if (b == std::string::npos) break;
        const size_t e = sr.body.find("\n\n", b);
        REQUIRE(e != std::string::npos);
        const std::string ev = sr.body.substr(b + 6, e - b - 6);
        at = e + 2;
        if (ev == "[DONE]") break;
        const json ch = json::parse(ev)["choices"][0];
        if (ch["delta"].contains("tool_calls"))
            for (const auto& c : ch["delta"]["tool_calls"]) calls.push_back(c);
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    REQUIRE(calls.size() == 1);
    CHECK(calls[0]["function"]["name"] == "get_weather");
    CHECK(finish == "tool_calls");

    // On pool a (pinned): no template, so no tool-call format to enforce; the 400 names a.
    body["stream"] = false;
    body["model"] = "a";
    check_error(chat(s.port, body), 400, "tool_choice", "invalid_value", "pool 'a'");
}

TEST_CASE("the routed pool's template refusal and context are that pool's 400s", "[http][route_render]") {
    auto s = serve_two_templates();
    const json sys_msgs = {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}};
    // b's template refuses a system message; a's ChatML takes it.
    check_error(chat(s.port, {{"model", "steward"}, {"messages", sys_msgs}, {"temperature", 0}}), 400, "messages",
                "template_error", "pool b takes no system message");
    CHECK(chat(s.port, {{"model", "steward"}, {"messages", sys_msgs}, {"temperature", 1.0}, {"max_tokens", 2}}).status == 200);
    // A message that fills b's context (512) once rendered there: both lengths named.
    std::string long_text;
    for (int i = 0; i < 400; i++) long_text += "word" + std::to_string(i) + " ";
    const size_t n = n_tokens(*s.rt, "b", b_rendering(long_text, false));
    REQUIRE(n >= 512);
    check_error(chat(s.port, {{"model", "steward"}, {"messages", {{{"role", "user"}, {"content", long_text}}}}, {"temperature", 0}}), 400,
                "messages", "context_length_exceeded", std::to_string(n) + " tokens");
}
