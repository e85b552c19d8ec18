// Reasoning output of thinking models: the text between <think> and </think> goes to
// `reasoning_content`, the rest to `content`, as llama-server (--reasoning-format deepseek) and
// vLLM's reasoning parsers answer. Pure functions over text; the chat layer decides when they run
// (a pool whose template uses think tags, and the request's reasoning_format).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace steward::serve {

inline constexpr std::string_view k_think_open = "<think>";
inline constexpr std::string_view k_think_close = "</think>";

// A template whose conversations carry think tags (Qwen3, DeepSeek-R1, QwQ, ...).
bool thinking_template(std::string_view chat_template);
// The rendered prompt ends inside a think block (DeepSeek-R1's generation prompt ends with
// "<think>\n"): the output starts as reasoning without an opening tag.
bool prompt_opens_think(std::string_view rendered_prompt);

struct ReasoningSplit {
    std::string reasoning;  // without the tags, surrounding newlines trimmed
    std::string content;    // the rest, leading newlines trimmed
    bool had_reasoning = false;
};
// The whole output: an opening <think> (after leading whitespace) or `opened` starts reasoning,
// which runs to </think> (or to the end, cut short). Without either, all of it is content.
ReasoningSplit split_reasoning(std::string_view text, bool opened);

// The streaming twin: pieces in, (is_reasoning, text) parts out. A piece that may be the start of a
// tag is held back until decided; the parts, joined per kind, equal split_reasoning's fields except
// that the streamed reasoning keeps its trailing newlines.
class ReasoningStream {
public:
    explicit ReasoningStream(bool opened) : state_(opened ? State::reasoning_start : State::before) {}
    std::vector<std::pair<bool, std::string>> feed(std::string_view piece);
    std::vector<std::pair<bool, std::string>> finish();

private:
    enum class State { before, reasoning_start, reasoning, content_start, content };
    void step(std::vector<std::pair<bool, std::string>>& out, bool final);
    State state_;
    std::string buf_;
};

}  // namespace steward::serve
