// Chat rendering: the variables transformers passes to a chat template (messages, tools,
// add_generation_prompt, bos_token, eos_token, extra keywords) and error messages that say so.
#include "template/chat_template.h"

namespace steward {

Expected<std::shared_ptr<const CompiledTemplate>> compile_template(const std::string& source) {
    auto t = jinja::Template::compile(source);
    if (!t) return make_error("chat template: ", t.error().message);
    return t;
}

Expected<std::string> render_chat_template(const CompiledTemplate& tmpl, const ChatTemplateInputs& in) {
    if (!in.messages.is_array()) return make_error("chat template: messages must be a JSON array, not ", in.messages.type_name());
    if (!in.extra.is_object() && !in.extra.is_null())
        return make_error("chat template: the extra variables must be a JSON object, not ", in.extra.type_name());
    nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
    // Extra keywords first, so that the standard variables win as in apply_chat_template.
    if (in.extra.is_object())
        for (auto it = in.extra.begin(); it != in.extra.end(); ++it) ctx[it.key()] = it.value();
    ctx["messages"] = in.messages;
    if (in.tools) ctx["tools"] = *in.tools;
    ctx["add_generation_prompt"] = in.add_generation_prompt;
    ctx["bos_token"] = in.bos_token;
    ctx["eos_token"] = in.eos_token;
    jinja::RenderOptions opt;
    opt.now_unix = in.now_unix;
    auto r = tmpl.render(ctx, opt);
    if (!r) return make_error("chat template: ", r.error().message);
    return r;
}

Expected<std::string> render_chat_template(const std::string& source, const ChatTemplateInputs& in) {
    auto t = compile_template(source);
    if (!t) return t.error();
    return render_chat_template(**t, in);
}

}  // namespace steward
