// Every real chat template in ../shared/testdata/chat_templates/ (and the one in the Qwen2 vocab
// GGUF) over a set of conversations, rendered by the interpreter and by Python's jinja2 (set up as
// transformers does, run at test time): byte-for-byte equal, or both fail.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "model/gguf.h"
#include "reference.h"
#include "template/chat_template.h"

using nlohmann::ordered_json;
using steward_test::ReferenceCase;

namespace {

std::string slurp(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

ordered_json msg(const char* role, ordered_json content) { return {{"role", role}, {"content", std::move(content)}}; }

ordered_json weather_tools() {
    return ordered_json::parse(R"([
      {"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "  The unit  "},
            "days": {"type": "integer", "description": "Days ahead"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags"},
            "extra": {"type": ["string", "null"], "description": "Either"},
            "opts": {"type": "object", "additionalProperties": {"type": "number"}, "description": "Options"}},
          "required": ["location"]},
        "return": {"type": "string", "description": "A report"}}},
      {"type": "function", "function": {"name": "search", "description": "Search the web \"quoted\" — ü.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}}}}
    ])");
}

ordered_json tool_call(const char* id, const char* name, ordered_json args) {
    return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", std::move(args)}}}};
}

struct Conversation {
    std::string name;
    ordered_json messages;
    bool with_tools = false;
};

std::vector<Conversation> conversations() {
    std::vector<Conversation> c;
    c.push_back({"one user turn", ordered_json::array({msg("user", "Hello!")})});
    c.push_back({"system and multi-turn",
                 ordered_json::array({msg("system", "You are a terse assistant."), msg("user", "What is 2+2?"),
                                      msg("assistant", "4."), msg("user", "And 3+3?")})});
    c.push_back({"multi-turn without system",
                 ordered_json::array({msg("user", "  Hi  "), msg("assistant", " Hello. "), msg("user", "Bye\n")})});
    c.push_back({"unicode, quotes and escapes",
                 ordered_json::array({msg("system", "Réponds en français — «ok» 'single' \"double\""),
                                      msg("user", "日本語 😀 \\ back\\slash\nnew line\ttab </s> {{ not jinja }}"),
                                      msg("assistant", "Ça va ✓"), msg("user", "ünïcödé")})});
    ordered_json tool_conv = ordered_json::array(
        {msg("system", "Use tools when needed."), msg("user", "Weather in Paris?"),
         {{"role", "assistant"}, {"content", ""},
          {"tool_calls", ordered_json::array({tool_call("call12345", "get_weather", {{"location", "Paris"}, {"unit", "celsius"}})})}},
         {{"role", "tool"}, {"tool_call_id", "call12345"}, {"name", "get_weather"}, {"content", "{\"temp\": 21, \"sky\": \"clear\"}"}},
         msg("assistant", "It is 21 °C and clear."), msg("user", "Thanks")});
    c.push_back({"tools, a tool call and its result", tool_conv, true});
    c.push_back({"tools offered, plain chat", ordered_json::array({msg("user", "Just chat, please.")}), true});
    ordered_json str_args = ordered_json::array(
        {msg("user", "Search for cats"),
         {{"role", "assistant"}, {"content", ""},
          {"tool_calls", ordered_json::array({tool_call("abcdefghi", "search", "{\"q\": \"cats\"}")})}},
         {{"role", "tool"}, {"tool_call_id", "abcdefghi"}, {"content", "Cats are mammals."}}});
    c.push_back({"tool call with string arguments", str_args, true});
    ordered_json two_calls = ordered_json::array(
        {msg("user", "Weather in Paris and Rome?"),
         {{"role", "assistant"}, {"content", ""},
          {"tool_calls", ordered_json::array({tool_call("call00001", "get_weather", {{"location", "Paris"}}),
                                              tool_call("call00002", "get_weather", {{"location", "Rome"}})})}},
         {{"role", "tool"}, {"tool_call_id", "call00001"}, {"content", "20"}},
         {{"role", "tool"}, {"tool_call_id", "call00002"}, {"content", "25"}}, msg("assistant", "Paris 20, Rome 25.")});
    c.push_back({"two tool calls and two results", two_calls, true});
    c.push_back({"assistant content null with a tool call",
                 ordered_json::array({msg("user", "Weather?"),
                                      {{"role", "assistant"}, {"content", nullptr},
                                       {"tool_calls", ordered_json::array({tool_call("call12345", "get_weather", {{"location", "Oslo"}})})}}}),
                 true});
    c.push_back({"thinking in assistant turns",
                 ordered_json::array({msg("user", "Think first: 1+1?"),
                                      msg("assistant", "<think>\nOne plus one.\n</think>\n\n2"), msg("user", "And 2+2?"),
                                      {{"role", "assistant"}, {"content", "4"}, {"reasoning_content", "Two and two."}},
                                      msg("user", "ok")})});
    c.push_back({"roles that do not alternate", ordered_json::array({msg("user", "a"), msg("user", "b")})});
    c.push_back({"system only", ordered_json::array({msg("system", "Only a system prompt.")})});
    c.push_back({"no messages", ordered_json::array()});
    c.push_back({"ends with the assistant (prefill)",
                 ordered_json::array({msg("user", "Write a haiku"), msg("assistant", "Autumn moonlight—")})});
    return c;
}

struct Named {
    std::string name;
    std::string source;
};

std::vector<Named> real_templates() {
    std::vector<Named> t;
    const std::filesystem::path dir = std::filesystem::path(STEWARD_TESTDATA_DIR) / "chat_templates";
    for (auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".jinja") t.push_back({e.path().filename().string(), slurp(e.path())});
    std::sort(t.begin(), t.end(), [](auto& a, auto& b) { return a.name < b.name; });
    auto gguf = steward::GgufFile::open(std::string(STEWARD_TESTDATA_DIR) + "/tokenizers/ggml-vocab-qwen2.gguf");
    if (gguf) {
        if (auto s = (*gguf)->get_string("tokenizer.chat_template")) t.push_back({"ggml-vocab-qwen2.gguf", std::string(*s)});
    }
    return t;
}

}  // namespace

TEST_CASE("every real chat template renders every conversation exactly as Python's jinja2 does", "[template][reference]") {
    auto templates = real_templates();
    REQUIRE(templates.size() >= 10);  // the nine files and the GGUF's
    auto convs = conversations();
    std::vector<ReferenceCase> cases;
    std::vector<steward::ChatTemplateInputs> inputs;
    const ordered_json extras[] = {ordered_json::object(), {{"enable_thinking", true}}, {{"enable_thinking", false}}};
    for (auto& t : templates)
        for (auto& c : convs)
            for (bool gen : {false, true})
                for (auto& extra : extras) {
                    steward::ChatTemplateInputs in;
                    in.messages = c.messages;
                    if (c.with_tools) in.tools = weather_tools();
                    in.add_generation_prompt = gen;
                    in.bos_token = "<s>";
                    in.eos_token = "</s>";
                    in.extra = extra;
                    in.now_unix = 1735732800;
                    ordered_json ctx = extra;
                    ctx["messages"] = in.messages;
                    if (in.tools) ctx["tools"] = *in.tools;
                    ctx["add_generation_prompt"] = gen;
                    ctx["bos_token"] = in.bos_token;
                    ctx["eos_token"] = in.eos_token;
                    cases.push_back({t.name + " / " + c.name + (gen ? " / generation prompt" : "") + " / " + extra.dump(),
                                     t.source, ctx, 1735732800});
                    inputs.push_back(std::move(in));
                }
    std::string error;
    auto ref = steward_test::run_reference(cases, error);
    if (!error.empty()) FAIL(error);
    REQUIRE(ref.size() == cases.size());
    size_t n_equal = 0, n_both_failed = 0, n_rendered = 0;
    std::map<std::string, std::shared_ptr<const steward::CompiledTemplate>> compiled;
    for (auto& t : templates) {
        auto c = steward::compile_template(t.source);
        INFO(t.name << ": " << (c ? "" : c.error().message));
        REQUIRE(c.ok());
        compiled[t.source] = *c;
    }
    for (size_t k = 0; k < cases.size(); k++) {
        auto got = steward::render_chat_template(*compiled[cases[k].source], inputs[k]);
        INFO(cases[k].label);
        INFO("reference: " << (ref[k].ok ? "rendered" : "failed: " + ref[k].text));
        INFO("steward:   " << (got ? "rendered" : "failed: " + got.error().message));
        REQUIRE(got.ok() == ref[k].ok);
        if (got.ok()) {
            CHECK(*got == ref[k].text);
            n_equal += *got == ref[k].text;
            n_rendered++;
        } else {
            n_both_failed++;
        }
    }
    WARN(cases.size() << " renderings compared with jinja2 over " << templates.size() << " templates: " << n_rendered
                      << " rendered (" << n_equal << " byte-for-byte equal), " << n_both_failed << " failed in both");
    CHECK(n_rendered > cases.size() / 2);
}

TEST_CASE("one compiled template renders the same from many threads at once", "[template]") {
    auto templates = real_templates();
    REQUIRE(!templates.empty());
    auto qwen3 = std::find_if(templates.begin(), templates.end(), [](auto& t) { return t.name.find("Qwen3") != std::string::npos; });
    REQUIRE(qwen3 != templates.end());
    auto compiled = steward::compile_template(qwen3->source);
    REQUIRE(compiled.ok());
    auto convs = conversations();
    steward::ChatTemplateInputs in;
    in.messages = convs[4].messages;  // tools, a tool call and its result
    in.tools = weather_tools();
    in.add_generation_prompt = true;
    auto expected = steward::render_chat_template(**compiled, in);
    REQUIRE(expected.ok());
    std::vector<std::thread> threads;
    std::atomic<int> n_equal{0};
    for (int t = 0; t < 4; t++)
        threads.emplace_back([&] {
            for (int k = 0; k < 50; k++) {
                auto r = steward::render_chat_template(**compiled, in);
                if (r.ok() && *r == *expected) n_equal++;
            }
        });
    for (auto& t : threads) t.join();
    CHECK(n_equal == 200);
}
