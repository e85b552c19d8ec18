// Fuzzes the Jinja interpreter (runtime/template): the input is a template, then a NUL byte and a
// small JSON context (a default conversation with tools when there is none or it does not parse).
// Invariants: compile and render never throw or crash, stay within their limits, and every error
// names a template line ("line N, column M: ...") or the input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "template/jinja.h"

using namespace steward;

namespace {

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_jinja invariant broken: %s: %s\n", what, detail.c_str());
    std::abort();
}

const nlohmann::ordered_json& default_context() {
    static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <think>x</think> é"},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "tool_call_id": "call12345", "content": "21"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}}}}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})");
    return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size > 16384) return 0;
    std::string input(reinterpret_cast<const char*>(data), size);
    size_t nul = input.find('\0');
    std::string source = input.substr(0, nul);
    nlohmann::ordered_json ctx = default_context();
    if (nul != std::string::npos && size - nul - 1 <= 4096) {
        auto j = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, false);
        if (!j.is_discarded() && j.is_object()) ctx = std::move(j);
    }
    jinja::RenderOptions opt;
    opt.now_unix = 0;
    opt.limits.max_steps = 200'000;  // keeps each run short; the bounds themselves are what is tested
    opt.limits.max_output_bytes = 1u << 20;
    opt.limits.max_total_bytes = 16u << 20;
    opt.limits.max_list_items = 1u << 16;
    try {
        auto t = jinja::Template::compile(source);
        if (!t) {
            if (t.error().message.rfind("line ", 0) != 0) fail("a compile error without its line", t.error().message);
            return 0;
        }
        // Twice: a compiled template renders the same each time (no state kept between renders).
        auto a = (*t)->render(ctx, opt);
        auto b = (*t)->render(ctx, opt);
        if (a.ok() != b.ok()) fail("two renders disagree", a.ok() ? b.error().message : a.error().message);
        if (a.ok()) {
            if (*a != *b) fail("two renders differ", *a);
            if (a->size() > opt.limits.max_output_bytes) fail("output over the limit", std::to_string(a->size()));
        } else if (a.error().message.rfind("line ", 0) != 0 && a.error().message.rfind("the variable", 0) != 0) {
            fail("a render error without its line", a.error().message);
        }
    } catch (const std::exception& e) {
        fail("an exception escaped", e.what());
    }
    return 0;
}
