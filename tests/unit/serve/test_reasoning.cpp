// Reasoning output: a thinking template's <think> block split into reasoning_content, whole and
// streamed in every split of the text, on the real Qwen3 and DeepSeek-R1 templates (shared
// testdata chat_templates). Expected splits are written out by hand.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "serve/openai_api.h"
#include "serve/reasoning.h"
#include "test_paths.h"

using namespace steward;
using namespace steward::serve;

namespace {

struct Case {
    const char* text;
    bool opened;
    const char* reasoning;
    const char* content;
    bool had;
};
const Case k_cases[] = {
    {"<think>\nLet me see.\n</think>\n\nHello!", false, "Let me see.", "Hello!", true},
    {"  <think>a</think>b", false, "a", "b", true},
    {"Hello <think>no</think>", false, "", "Hello <think>no</think>", false},
    {"Let me see.\n</think>\n\nHi", true, "Let me see.", "Hi", true},
    {"<think>\ncut short", false, "cut short", "", true},
    {"<thinker>x", false, "", "<thinker>x", false},
    {"<think></think>answer", false, "", "answer", true},
    {"<think>a </thin b</think>c", false, "a </thin b", "c", true},
};

std::string read_file(const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}
std::string rtrim_newlines(std::string s) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
}

}  // namespace

TEST_CASE("think blocks split into reasoning and content", "[serve][reasoning]") {
    for (const Case& c : k_cases) {
        INFO(c.text);
        ReasoningSplit s = split_reasoning(c.text, c.opened);
        CHECK(s.reasoning == c.reasoning);
        CHECK(s.content == c.content);
        CHECK(s.had_reasoning == c.had);
    }
}

TEST_CASE("streamed think blocks split alike at every cut", "[serve][reasoning]") {
    for (const Case& c : k_cases) {
        const std::string t = c.text;
        for (size_t i = 0; i <= t.size(); i++)
            for (size_t j = i; j <= t.size(); j++) {
                INFO(c.text << " cut at " << i << ", " << j);
                ReasoningStream rs(c.opened);
                std::string reasoning, content;
                for (auto piece : {t.substr(0, i), t.substr(i, j - i), t.substr(j)}) {
                    auto parts = rs.feed(piece);
                    for (auto& [r, s] : parts) (r ? reasoning : content) += s;
                }
                for (auto& [r, s] : rs.finish()) (r ? reasoning : content) += s;
                CHECK(rtrim_newlines(reasoning) == c.reasoning);
                CHECK(content == c.content);
            }
    }
}

TEST_CASE("real thinking templates: reasoning_content", "[serve][reasoning]") {
    const std::string dir = std::string(STEWARD_TESTDATA_DIR) + "/chat_templates/";
    const std::string qwen3 = read_file(dir + "Qwen-Qwen3-0.6B.jinja");
    const std::string r1 = read_file(dir + "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    const std::string qwen25 = read_file(dir + "Qwen-Qwen2.5-7B-Instruct.jinja");
    REQUIRE(!qwen3.empty());
    REQUIRE(!r1.empty());
    CHECK(thinking_template(qwen3));
    CHECK(thinking_template(r1));
    CHECK(!thinking_template(qwen25));

    ApiError err;
    auto req = parse_openai_request(R"({"messages": [{"role": "user", "content": "hi"}]})", true, err);
    REQUIRE(req);
    PoolInfo p3, pr1, p25;
    p3.chat_template = qwen3, pr1.chat_template = r1, p25.chat_template = qwen25;
    pr1.bos_token = "<｜begin▁of▁sentence｜>";
    // Qwen3: the model opens the block itself. This DeepSeek-R1 template closes the block in the
    // prompt unless enable_thinking is true; then its prompt ends inside it ("<think>\n").
    auto out3 = parse_choice_output(*req, &p3, "<think>\nhmm\n</think>\n\nHello", 0);
    CHECK(out3.has_reasoning);
    CHECK(out3.reasoning == "hmm");
    CHECK(out3.content == "Hello");
    auto closed = render_prompt(pr1, *req);
    REQUIRE(closed);
    CHECK(!prompt_opens_think(*closed));
    CHECK(parse_choice_output(*req, &pr1, "Hello", 0).content == "Hello");
    req = parse_openai_request(R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": true}})",
                               true, err);
    REQUIRE(req);
    auto rendered = render_prompt(pr1, *req);
    REQUIRE(rendered);
    CHECK(prompt_opens_think(*rendered));
    auto out1 = parse_choice_output(*req, &pr1, "hmm\n</think>\n\nHello", 0);
    CHECK(out1.reasoning == "hmm");
    CHECK(out1.content == "Hello");
    // No thinking template, or reasoning_format "none": all content.
    CHECK(parse_choice_output(*req, &p25, "<think>x</think>y", 0).content == "<think>x</think>y");
    auto none = parse_openai_request(R"({"messages": [{"role": "user", "content": "hi"}], "reasoning_format": "none"})", true, err);
    REQUIRE(none);
    CHECK(parse_choice_output(*none, &p3, "<think>x</think>y", 0).content == "<think>x</think>y");
    CHECK(!parse_openai_request(R"({"messages": [{"role": "user", "content": "hi"}], "reasoning_format": "x"})", true, err));
    CHECK(err.param == "reasoning_format");

    // Streamed through the chat's output: reasoning_content deltas, then content deltas.
    StreamOutput so(*req, &pr1, 0);
    std::string reasoning, content;
    for (const char* piece : {"hm", "m\n</th", "ink>\n", "\nHel", "lo"})
        for (const auto& d : so.feed(piece)) {
            if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
            if (d.contains("content")) content += d["content"].get<std::string>();
        }
    for (const auto& d : so.finish())
        if (d.contains("content")) content += d["content"].get<std::string>();
    CHECK(rtrim_newlines(reasoning) == "hmm");
    CHECK(content == "Hello");
}
