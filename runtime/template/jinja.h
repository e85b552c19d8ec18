// A Jinja interpreter for the subset chat templates use (the Hugging Face transformers dialect:
// trim_blocks, lstrip_blocks, loopcontrols, an immutable sandbox). Parse once, render many; every
// failure is an Error naming the template line and column, never an exception or a crash.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <steward/expected.h>

namespace steward::jinja {

// Bounds that keep a hostile template from exhausting the stack, memory or time. Rendering stops
// with an Error naming the bound when one is reached.
struct RenderLimits {
    int max_call_depth = 64;                          // nested macro calls
    int max_eval_depth = 400;                         // nested statement / expression evaluations
    size_t max_output_bytes = 16u << 20;              // the rendering, and any one string value
    size_t max_total_bytes = 256u << 20;              // all strings and lists created by one render
    uint64_t max_steps = 5'000'000;                   // evaluation steps (loop iterations, scans by size)
    size_t max_list_items = 1u << 20;                 // elements of one list
};

struct RenderOptions {
    RenderLimits limits;
    // strftime_now() formats this instant (UTC) when set; otherwise the local time now.
    std::optional<int64_t> now_unix;
};

struct Program;  // the parsed template (jinja.cpp)

// A parsed template. Immutable once compiled: render() may be called from many threads at once.
class Template {
public:
    // Parses `source`. Errors name the line and column ("line 3, column 7: unexpected 'endfor'").
    static Expected<std::shared_ptr<const Template>> compile(const std::string& source);

    // Renders with `context` (an object: its keys are the template's variables; insertion order
    // is kept, e.g. for tojson). Errors (undefined values used, type errors, raise_exception,
    // limits) name the line and column they happened at.
    Expected<std::string> render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

    ~Template();

private:
    Template() = default;
    std::unique_ptr<Program> program_;
};

}  // namespace steward::jinja
