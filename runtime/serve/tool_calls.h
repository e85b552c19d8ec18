// Tool calls in a model's output: which format a chat template trains its model to emit, and a
// streaming parser that splits the generated text into content and OpenAI-shaped tool-call deltas.
// A plain core (no HTTP, no actors): the server feeds it each text piece of a request's stream.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <steward/expected.h>

namespace steward {

// The output formats the common chat templates render tool calls in (and so what their models emit):
//   llama3_json: the whole output is {"name": N, "parameters": {...}} (or "arguments"), optionally
//                after <|python_tag|>, several separated by ';'; also <|python_tag|>N.call(k="v", ...)
//                (Llama 3.1's built-in tools);
//   hermes:      <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>, any number, with
//                content around them (Hermes 3, Qwen2.5, Qwen3);
//   mistral:     [TOOL_CALLS][{"name": N, "arguments": {...}, "id": "abcDEF123"}, ...] (Mistral Nemo).
enum class ToolCallFormat { none, llama3_json, hermes, mistral };

// The format a chat template's text renders assistant tool calls in: "<tool_call>" -> hermes,
// "[TOOL_CALLS]" -> mistral, "<|python_tag|>" or Llama 3's ipython header -> llama3_json, else none.
// Pure; thread-safe.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

// "none", "llama3_json", "hermes", "mistral".
const char* tool_call_format_name(ToolCallFormat format);

// One call as OpenAI's non-streaming response carries it. arguments is a JSON object serialized
// (compact, UTF-8 kept), as OpenAI's `function.arguments` string.
struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;
};

// One piece of the stream, in OpenAI's chat.completion.chunk shape: either content text, or a
// tool call (index; id and name; arguments). A call is emitted in one delta once it is complete and
// its JSON parsed: a call is never half sent and then found malformed (see ToolCallParser).
struct ToolCallDelta {
    enum class Kind { content, tool_call };
    Kind kind = Kind::content;
    std::string content;     // kind == content
    int32_t index = 0;       // kind == tool_call: 0, 1, ... in the order of the output
    std::string id;          // kind == tool_call
    std::string name;        // kind == tool_call
    std::string arguments;   // kind == tool_call: the whole arguments string
};

struct ParsedOutput {
    std::string content;              // the text that is not a tool call (empty when none)
    std::vector<ToolCall> tool_calls; // in output order
};

// Ids: OpenAI style "call_" + 24 alphanumerics for llama3_json and hermes; for mistral the model's
// own id when it is 9 alphanumerics, else 9 generated ones (Mistral's template refuses any other id
// when the conversation comes back). Generated ids are a pure function of (id_seed, call index), so
// the streaming parser and parse_tool_calls agree; the server seeds each request differently.
std::string make_tool_call_id(ToolCallFormat format, uint64_t id_seed, int32_t index);

// The streaming parser. feed() takes each text piece as generated and returns what is decided;
// text that may still become a tool call (a marker's first bytes such as "<tool_c", a call's body
// before its closing tag, a llama3 output that opens with '{') is held back until it is decided;
// finish() decides the rest. Malformed calls (JSON that does not parse, no "name", arguments not an
// object, a body cut off by the end of the output) stay content, byte for byte: text is never lost.
// The only text dropped is the whitespace that separates tool calls from each other and from the
// content (and the markers of calls that parsed). The deltas concatenated equal parse_tool_calls()
// of the whole text, however the text is split into pieces.
// Not thread-safe (one per request stream); feed() after finish() is a logic error.
class ToolCallParser {
public:
    explicit ToolCallParser(ToolCallFormat format, uint64_t id_seed = 0);

    std::vector<ToolCallDelta> feed(std::string_view text_piece);
    std::vector<ToolCallDelta> finish();

    int32_t n_tool_calls() const { return n_calls_; }

private:
    enum class State {
        text,        // content; watching for a marker (hermes, mistral) or, for llama3, the start
        body,        // hermes: inside <tool_call>, waiting for </tool_call>
        array,       // mistral: after [TOOL_CALLS], scanning the JSON array
        llama_start, // llama3: leading whitespace, maybe <|python_tag|>, then '{' or a .call(
        llama_object,// llama3: scanning a JSON object
        llama_call,  // llama3: scanning name.call(...) after <|python_tag|>
        llama_after, // llama3: after a call: whitespace and ';' are dropped until the next '{'
        after_call,  // hermes / mistral: dropping the whitespace right after a call
        passthrough, // everything from here on is content
    };

    void step(std::vector<ToolCallDelta>& out);
    void emit_content(std::vector<ToolCallDelta>& out, std::string_view text);
    void emit_call(std::vector<ToolCallDelta>& out, ToolCall call);
    // A segment that turned out not to be a call: its marker becomes content and the text after the
    // marker is scanned again (it may hold the next, well-formed call).
    void fail_segment(std::vector<ToolCallDelta>& out);
    void decide_llama_start(std::vector<ToolCallDelta>& out, bool at_end);

    ToolCallFormat format_;
    uint64_t id_seed_;
    State state_;
    bool finished_ = false;
    bool at_end_ = false;
    int32_t n_calls_ = 0;
    std::string buf_;      // undecided text, from the start of the current segment
    size_t seg_ws_ = 0;    // hermes / mistral: bytes of whitespace before the marker in buf_
    size_t scan_pos_ = 0;  // bytes of buf_ already scanned for the current segment's end
    // JSON extent scanner state (mistral array, llama3 object and .call parentheses).
    std::string stack_;
    bool in_string_ = false;
    bool escape_ = false;
    size_t seg_start_ = 0; // llama3: where the current object starts in buf_
};

// The whole output at once: the reference the streaming parser is tested against (written
// separately, over the complete text). Pure; thread-safe.
ParsedOutput parse_tool_calls(ToolCallFormat format, std::string_view text, uint64_t id_seed = 0);

// The grammar (GBNF) of an output that is exactly one tool call in `format`, as the parser above
// extracts it: hermes <tool_call>\n{"name": N, "arguments": A}\n</tool_call>, mistral
// [TOOL_CALLS][{"name": N, "arguments": A}], llama3_json {"name": N, "parameters": A}; N one of
// the OpenAI `tools` (only `only_name` when given: tool_choice naming a function), A an object
// matching that function's `parameters` JSON Schema (absent: {}; a schema without "type" is
// taken as an object's). Errors name the tool ("tools[i].function...") or the format and the fix.
Expected<std::string> tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                     std::string_view only_name = {});

}  // namespace steward
