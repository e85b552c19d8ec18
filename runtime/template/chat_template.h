// Chat rendering: a model's Jinja chat template (tokenizer.chat_template) over OpenAI-style
// messages, with the variables transformers' apply_chat_template passes.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <steward/expected.h>

#include "template/jinja.h"

namespace steward {

struct ChatTemplateInputs {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content", ...}]
    std::optional<nlohmann::ordered_json> tools;  // absent: the template sees `tools` undefined
    bool add_generation_prompt = false;
    std::string bos_token, eos_token;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables, e.g. {"enable_thinking": false}
    std::optional<int64_t> now_unix;  // strftime_now() renders this instant (UTC) when set
};

// A parsed chat template; immutable, shareable across threads (a server renders per request).
using CompiledTemplate = jinja::Template;

// Parses a template once. Errors name the line and column.
Expected<std::shared_ptr<const CompiledTemplate>> compile_template(const std::string& source);

// Renders a compiled template. Errors (including the template's own raise_exception) name the
// template line. Thread-safe for one template rendered from many threads.
Expected<std::string> render_chat_template(const CompiledTemplate& tmpl, const ChatTemplateInputs& in);

// Parses and renders in one call.
Expected<std::string> render_chat_template(const std::string& source, const ChatTemplateInputs& in);

}  // namespace steward
