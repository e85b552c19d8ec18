// Tests for runtime/serve/tool_calls: each format's parse worked out by hand, then the streaming
// parser against the whole-text parse (a separate implementation) at every split point, byte by
// byte and in random chunkings; format detection on the real chat templates.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#include "test_paths.h"

#include "serve/tool_calls.h"

using namespace steward;

namespace {

constexpr uint64_t k_seed = 42;

// The deltas put back together: content concatenated, calls by index (each index once, in order).
ParsedOutput collect(const std::vector<ToolCallDelta>& deltas) {
    ParsedOutput out;
    for (const auto& d : deltas) {
        if (d.kind == ToolCallDelta::Kind::content) {
            REQUIRE_FALSE(d.content.empty());
            out.content += d.content;
        } else {
            REQUIRE(d.index == (int32_t)out.tool_calls.size());
            out.tool_calls.push_back({d.id, d.name, d.arguments});
        }
    }
    return out;
}

ParsedOutput stream(ToolCallFormat f, const std::vector<std::string>& pieces) {
    ToolCallParser parser(f, k_seed);
    std::vector<ToolCallDelta> all;
    for (const auto& p : pieces) {
        auto d = parser.feed(p);
        all.insert(all.end(), d.begin(), d.end());
    }
    auto d = parser.finish();
    all.insert(all.end(), d.begin(), d.end());
    auto out = collect(all);
    REQUIRE(parser.n_tool_calls() == (int32_t)out.tool_calls.size());
    return out;
}

void require_same(const ParsedOutput& got, const ParsedOutput& want) {
    REQUIRE(got.content == want.content);
    REQUIRE(got.tool_calls.size() == want.tool_calls.size());
    for (size_t i = 0; i < want.tool_calls.size(); ++i) {
        REQUIRE(got.tool_calls[i].id == want.tool_calls[i].id);
        REQUIRE(got.tool_calls[i].name == want.tool_calls[i].name);
        REQUIRE(got.tool_calls[i].arguments == want.tool_calls[i].arguments);
    }
}

// Streaming == whole-text parse: byte by byte, at every single split point, and random chunkings.
void require_streaming_agrees(ToolCallFormat f, const std::string& text) {
    INFO("format " << tool_call_format_name(f) << ", text: " << text);
    const ParsedOutput want = parse_tool_calls(f, text, k_seed);
    require_same(stream(f, {text}), want);
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    require_same(stream(f, bytes), want);
    for (size_t cut = 1; cut < text.size(); ++cut) {
        INFO("cut at " << cut);
        require_same(stream(f, {text.substr(0, cut), text.substr(cut)}), want);
    }
    std::mt19937 rng(7);
    for (int round = 0; round < 30; ++round) {
        std::vector<std::string> pieces;
        for (size_t i = 0; i < text.size();) {
            size_t n = 1 + rng() % 7;
            pieces.push_back(text.substr(i, n));
            i += n;
        }
        require_same(stream(f, pieces), want);
    }
}

ParsedOutput parse(ToolCallFormat f, const std::string& text) {
    ParsedOutput out = parse_tool_calls(f, text, k_seed);
    require_streaming_agrees(f, text);
    return out;
}

std::string read_template(const std::string& name) {
    std::ifstream in(std::string(STEWARD_TESTDATA_DIR) + "/chat_templates/" + name);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

TEST_CASE("The tool-call format is detected from each real chat template", "[serve]") {
    CHECK(detect_tool_call_format(read_template("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")) == ToolCallFormat::hermes);
    CHECK(detect_tool_call_format(read_template("Qwen-Qwen2.5-7B-Instruct.jinja")) == ToolCallFormat::hermes);
    CHECK(detect_tool_call_format(read_template("Qwen-Qwen3-0.6B.jinja")) == ToolCallFormat::hermes);
    CHECK(detect_tool_call_format(read_template("mistralai-Mistral-Nemo-Instruct-2407.jinja")) == ToolCallFormat::mistral);
    CHECK(detect_tool_call_format(read_template("meta-llama-Llama-3.1-8B-Instruct.jinja")) == ToolCallFormat::llama3_json);
    CHECK(detect_tool_call_format(read_template("meta-llama-Llama-3.2-3B-Instruct.jinja")) == ToolCallFormat::llama3_json);
    CHECK(detect_tool_call_format(read_template("google-gemma-2-2b-it.jinja")) == ToolCallFormat::none);
    CHECK(detect_tool_call_format(read_template("microsoft-Phi-3.5-mini-instruct.jinja")) == ToolCallFormat::none);
    CHECK(detect_tool_call_format(read_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")) == ToolCallFormat::none);
    CHECK(detect_tool_call_format("") == ToolCallFormat::none);
}

TEST_CASE("Tool-call ids are OpenAI style, deterministic per seed and index, and 9 alphanumerics for Mistral", "[serve]") {
    const std::string a = make_tool_call_id(ToolCallFormat::hermes, 1, 0);
    REQUIRE(a.size() == 5 + 24);
    REQUIRE(a.rfind("call_", 0) == 0);
    for (char c : a.substr(5)) REQUIRE(std::isalnum((unsigned char)c));
    CHECK(a == make_tool_call_id(ToolCallFormat::hermes, 1, 0));
    CHECK(a != make_tool_call_id(ToolCallFormat::hermes, 1, 1));
    CHECK(a != make_tool_call_id(ToolCallFormat::hermes, 2, 0));
    const std::string m = make_tool_call_id(ToolCallFormat::mistral, 1, 0);
    REQUIRE(m.size() == 9);
    for (char c : m) REQUIRE(std::isalnum((unsigned char)c));
}

TEST_CASE("Hermes / Qwen <tool_call> blocks become calls, with the text before them as content", "[serve]") {
    const auto f = ToolCallFormat::hermes;
    SECTION("one call, as Qwen2.5's template renders it") {
        auto out = parse(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
        CHECK(out.content.empty());
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.tool_calls[0].name == "get_weather");
        CHECK(out.tool_calls[0].arguments == R"({"city":"Paris"})");
        CHECK(out.tool_calls[0].id == make_tool_call_id(f, k_seed, 0));
    }
    SECTION("content before, several calls in a row, whitespace between them dropped") {
        auto out = parse(f, "Let me check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                            "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2, {\"y\": null}]}}\n</tool_call>\n");
        CHECK(out.content == "Let me check both.");
        REQUIRE(out.tool_calls.size() == 2);
        CHECK(out.tool_calls[0].name == "a");
        CHECK(out.tool_calls[0].arguments == "{}");
        CHECK(out.tool_calls[1].name == "b");
        CHECK(out.tool_calls[1].arguments == R"({"x":[1,2,{"y":null}]})");
        CHECK(out.tool_calls[1].id == make_tool_call_id(f, k_seed, 1));
    }
    SECTION("content after a call is kept") {
        auto out = parse(f, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> done");
        CHECK(out.content == "done");
        CHECK(out.tool_calls.size() == 1);
    }
    SECTION("malformed JSON stays content byte for byte") {
        const std::string text = "ok <tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call> after";
        auto out = parse(f, text);
        CHECK(out.content == text);
        CHECK(out.tool_calls.empty());
    }
    SECTION("a call without a name, or whose arguments are not an object, stays content") {
        for (std::string text : {"<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>",
                                 "<tool_call>{\"name\": \"a\"}</tool_call>", "<tool_call>[1]</tool_call>"}) {
            auto out = parse(f, text);
            CHECK(out.content == text);
            CHECK(out.tool_calls.empty());
        }
    }
    SECTION("a malformed block does not hide a well-formed one after it") {
        auto out = parse(f, "<tool_call>oops <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>");
        CHECK(out.content == "<tool_call>oops");
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.tool_calls[0].name == "a");
        CHECK(out.tool_calls[0].id == make_tool_call_id(f, k_seed, 0));
    }
    SECTION("a body the end of the output cuts off parses if its JSON is whole, else stays content") {
        auto out = parse(f, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 1}}\n");
        CHECK(out.content.empty());
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.tool_calls[0].arguments == R"({"q":1})");
        const std::string cut = "text <tool_call>\n{\"name\": \"a\", \"argum";
        auto out2 = parse(f, cut);
        CHECK(out2.content == cut);
        CHECK(out2.tool_calls.empty());
    }
    SECTION("marker look-alikes are content") {
        for (std::string text : {"a < b", "<tool_cal", "<tool_call", "x <tool_ca> y", "</tool_call>", "  \n"}) {
            auto out = parse(f, text);
            CHECK(out.content == text);
        }
    }
    SECTION("unicode, nested braces and quotes inside argument strings, string arguments") {
        auto out = parse(f, "Voilà ☕ <tool_call>{\"name\": \"say\", \"arguments\": {\"text\": \"日本 {not} \\\"q\\\" [x] </tool\", "
                            "\"n\": {\"deep\": {\"er\": \"}}\"}}}}</tool_call>");
        CHECK(out.content == "Voilà ☕");
        REQUIRE(out.tool_calls.size() == 1);
        auto args = nlohmann::json::parse(out.tool_calls[0].arguments);
        CHECK(args["text"] == "日本 {not} \"q\" [x] </tool");
        CHECK(args["n"]["deep"]["er"] == "}}");
        auto out2 = parse(f, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>");
        REQUIRE(out2.tool_calls.size() == 1);
        CHECK(out2.tool_calls[0].arguments == "{\"k\": 1}");
    }
}

TEST_CASE("Mistral [TOOL_CALLS] arrays become calls and keep the model's 9-character ids", "[serve]") {
    const auto f = ToolCallFormat::mistral;
    SECTION("one call with its id, as Mistral Nemo's template renders it") {
        auto out = parse(f, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}]");
        CHECK(out.content.empty());
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.tool_calls[0].id == "abcDEF123");
        CHECK(out.tool_calls[0].name == "get_weather");
        CHECK(out.tool_calls[0].arguments == R"({"city":"Paris"})");
    }
    SECTION("several calls, content before, a missing or wrong id generated") {
        auto out = parse(f, "Sure. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"k\": \"v\"}, \"id\": \"short\"}]");
        CHECK(out.content == "Sure.");
        REQUIRE(out.tool_calls.size() == 2);
        CHECK(out.tool_calls[0].id == make_tool_call_id(f, k_seed, 0));
        CHECK(out.tool_calls[1].id == make_tool_call_id(f, k_seed, 1));
        CHECK(out.tool_calls[0].id.size() == 9);
        CHECK(out.tool_calls[1].name == "b");
    }
    SECTION("malformed arrays stay content") {
        for (std::string text : {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {]}]", "[TOOL_CALLS] nothing", "[TOOL_CALLS][]",
                                 "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}", "[TOOL_CALLS][{\"name\": 1, \"arguments\": {}}]",
                                 "[TOOL_CALLS", "[TOOL_CALLS]"}) {
            auto out = parse(f, text);
            CHECK(out.content == text);
            CHECK(out.tool_calls.empty());
        }
    }
    SECTION("brackets and quotes inside strings, unicode, content after") {
        auto out = parse(f, "[TOOL_CALLS][{\"name\": \"s\", \"arguments\": {\"q\": \"]}[{ \\\"ü\\\" \\\\\"}}] thanks");
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(nlohmann::json::parse(out.tool_calls[0].arguments)["q"] == "]}[{ \"ü\" \\");
        CHECK(out.content == "thanks");
    }
}

TEST_CASE("Llama 3 JSON outputs and <|python_tag|> calls become calls, other outputs stay content", "[serve]") {
    const auto f = ToolCallFormat::llama3_json;
    SECTION("the whole output is one call, with \"parameters\" as Llama 3.1's template asks") {
        auto out = parse(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
        CHECK(out.content.empty());
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.tool_calls[0].name == "get_weather");
        CHECK(out.tool_calls[0].arguments == R"({"city":"Paris"})");
        CHECK(out.tool_calls[0].id == make_tool_call_id(f, k_seed, 0));
    }
    SECTION("after <|python_tag|>, with \"arguments\", several separated by ';'") {
        auto out = parse(f, "\n<|python_tag|>{\"name\": \"a\", \"arguments\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}\n");
        CHECK(out.content.empty());
        REQUIRE(out.tool_calls.size() == 2);
        CHECK(out.tool_calls[0].name == "a");
        CHECK(out.tool_calls[1].name == "b");
        CHECK(out.tool_calls[1].arguments == "{}");
    }
    SECTION("Llama 3.1's built-in tool form: name.call(k=\"v\")") {
        auto out = parse(f, "<|python_tag|>brave_search.call(query=\"weather in \\\"SF\\\", today\", n=3)");
        CHECK(out.content.empty());
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.tool_calls[0].name == "brave_search");
        auto args = nlohmann::json::parse(out.tool_calls[0].arguments);
        CHECK(args["query"] == "weather in \"SF\", today");
        CHECK(args["n"] == 3);
    }
    SECTION("plain text, a JSON answer that is no call, malformed JSON and a bare tag stay content, whole") {
        for (std::string text : {"Hello there.", "  {\"answer\": 42}", "{\"name\": \"a\", \"parameters\": {\"x\": }}",
                                 "{\"name\": \"a\", \"parameters\": {}", "<|python_tag|>", "<|python_tag|>print(1)",
                                 "<|python_tag|>brave_search.call(query=\"x\"", "<|python_t", "x {\"name\": \"a\", \"parameters\": {}}",
                                 "{\"name\": \"a\", \"parameters\": {}]"}) {
            auto out = parse(f, text);
            CHECK(out.content == text);
            CHECK(out.tool_calls.empty());
        }
    }
    SECTION("text after a call is content; a second malformed object stays content") {
        auto out = parse(f, "{\"name\": \"a\", \"parameters\": {}} That was it.");
        REQUIRE(out.tool_calls.size() == 1);
        CHECK(out.content == "That was it.");
        auto out2 = parse(f, "{\"name\": \"a\", \"parameters\": {}};{\"nope\": 1}");
        REQUIRE(out2.tool_calls.size() == 1);
        CHECK(out2.content == "{\"nope\": 1}");
    }
    SECTION("unicode, nested braces and quotes inside argument strings") {
        auto out = parse(f, "{\"name\": \"t\", \"parameters\": {\"s\": \"{\\\"a\\\": [}] 🚀 é\", \"o\": {\"p\": [[{}]]}}}");
        REQUIRE(out.tool_calls.size() == 1);
        auto args = nlohmann::json::parse(out.tool_calls[0].arguments);
        CHECK(args["s"] == "{\"a\": [}] 🚀 é");
        CHECK(args["o"]["p"][0][0].is_object());
    }
}

TEST_CASE("With no tool-call format every byte is content, streamed as it comes", "[serve]") {
    ToolCallParser parser(ToolCallFormat::none, 1);
    auto d = parser.feed("<tool_call>{\"name\"");
    REQUIRE(d.size() == 1);
    CHECK(d[0].content == "<tool_call>{\"name\"");
    CHECK(parser.finish().empty());
    CHECK(parse_tool_calls(ToolCallFormat::none, "[TOOL_CALLS][]").content == "[TOOL_CALLS][]");
}

TEST_CASE("Content streams without waiting for the end once it cannot start a call", "[serve]") {
    ToolCallParser hermes(ToolCallFormat::hermes, 1);
    auto d = hermes.feed("Hello <tool_c");
    REQUIRE(d.size() == 1);
    CHECK(d[0].content == "Hello");  // " <tool_c" is held: it may open a call
    d = hermes.feed("ar is a word");
    REQUIRE(d.size() == 1);
    CHECK(d[0].content == " <tool_car is a word");
    ToolCallParser llama(ToolCallFormat::llama3_json, 1);
    CHECK(llama.feed("  ").empty());
    d = llama.feed("Hi");
    REQUIRE(d.size() == 1);
    CHECK(d[0].content == "  Hi");
}

TEST_CASE("Streaming agrees with the whole-text parse on random mixes of calls, noise and markers", "[serve]") {
    // Outputs assembled from fragments that exercise every state: markers whole, cut and malformed,
    // whitespace, JSON with strings holding brackets, and plain words.
    const std::vector<std::string> frags = {
        "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", " ", "\n", ";", "text", "é",
        "{\"name\": \"f\", \"arguments\": {\"a\": \"]}{\"}}", "{\"name\": \"g\", \"parameters\": {}}",
        "[{\"name\": \"m\", \"arguments\": {}}]", "[{\"name\": \"m\", \"arguments\": {}, \"id\": \"AAAAbbbb9\"}]",
        "{", "}", "[", "]", "\"", "<tool_", "[TOOL", "f.call(x=\"1\")", "{\"bad\": 1}"};
    std::mt19937 rng(11);
    for (auto f : {ToolCallFormat::hermes, ToolCallFormat::mistral, ToolCallFormat::llama3_json}) {
        for (int round = 0; round < 150; ++round) {
            std::string text;
            for (int n = 1 + (int)(rng() % 6); n > 0; --n) text += frags[rng() % frags.size()];
            const ParsedOutput want = parse_tool_calls(f, text, k_seed);
            INFO("format " << tool_call_format_name(f) << ", text: " << text);
            require_same(stream(f, {text}), want);
            std::vector<std::string> bytes;
            for (char c : text) bytes.emplace_back(1, c);
            require_same(stream(f, bytes), want);
            // The text is never lost: what is not a call is there byte for byte, in order.
            if (want.tool_calls.empty()) REQUIRE(want.content == text);
        }
    }
}
