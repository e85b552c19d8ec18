// `steward template render`: a chat template (from a GGUF's tokenizer.chat_template or a file)
// rendered over messages from a JSON file, printed to stdout: a user's debugging tool.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "template/chat_template.h"

namespace steward {

namespace {

Expected<std::string> read_file(const std::string& path, const char* what) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return make_error(what, " '", path, "' cannot be read: check the path");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

Expected<nlohmann::ordered_json> read_json(const std::string& path, const char* what) {
    auto text = read_file(path, what);
    if (!text) return text.error();
    auto j = nlohmann::ordered_json::parse(*text, nullptr, false);
    if (j.is_discarded()) return make_error(what, " '", path, "' is not valid JSON");
    return j;
}

}  // namespace

int cmd_template_render(const TemplateRenderOptions& o) {
    if (o.model_path.empty() == o.template_path.empty())
        return cli_fail("template render needs exactly one of -m MODEL.gguf or --template FILE.jinja");
    ChatTemplateInputs in;
    std::string source;
    if (!o.model_path.empty()) {
        auto file = GgufFile::open(o.model_path);
        if (!file) return cli_fail(file.error().message);
        auto tmpl = (*file)->get_string("tokenizer.chat_template");
        if (!tmpl)
            return cli_fail("the model '" + o.model_path +
                            "' has no tokenizer.chat_template; give one with --template FILE.jinja");
        source = std::string(*tmpl);
        // BOS/EOS texts from the vocabulary, when it has one (a template-only GGUF may not).
        auto tok = Tokenizer::from_gguf(**file);
        if (tok) {
            const Tokenizer& t = **tok;
            if (t.bos() >= 0 && t.bos() < t.n_vocab()) in.bos_token = t.token_text(t.bos());
            if (t.eos() >= 0 && t.eos() < t.n_vocab()) in.eos_token = t.token_text(t.eos());
        }
    } else {
        auto text = read_file(o.template_path, "the template");
        if (!text) return cli_fail(text.error().message);
        source = std::move(*text);
    }
    auto messages = read_json(o.messages_path, "the messages file");
    if (!messages) return cli_fail(messages.error().message);
    // Either a bare array of messages or an OpenAI request body with "messages" (and "tools").
    if (messages->is_object() && messages->contains("messages")) {
        if (messages->contains("tools") && o.tools_path.empty()) in.tools = (*messages)["tools"];
        in.messages = (*messages)["messages"];
    } else {
        in.messages = std::move(*messages);
    }
    if (!in.messages.is_array())
        return cli_fail("the messages file '" + o.messages_path + "' must hold a JSON array of messages");
    if (!o.tools_path.empty()) {
        auto tools = read_json(o.tools_path, "the tools file");
        if (!tools) return cli_fail(tools.error().message);
        if (!tools->is_array()) return cli_fail("the tools file '" + o.tools_path + "' must hold a JSON array");
        in.tools = std::move(*tools);
    }
    in.add_generation_prompt = o.add_generation_prompt;
    if (!o.kwargs.empty()) {
        auto kw = nlohmann::ordered_json::parse(o.kwargs, nullptr, false);
        if (kw.is_discarded() || !kw.is_object())
            return cli_fail("--kwargs '" + o.kwargs + "' must be a JSON object, e.g. '{\"enable_thinking\": false}'");
        for (auto it = kw.begin(); it != kw.end(); ++it) {
            if (it.key() == "bos_token" && it.value().is_string()) in.bos_token = it.value().get<std::string>();
            else if (it.key() == "eos_token" && it.value().is_string()) in.eos_token = it.value().get<std::string>();
            else in.extra[it.key()] = it.value();
        }
    }
    if (o.now_unix >= 0) in.now_unix = o.now_unix;
    auto out = render_chat_template(source, in);
    if (!out) return cli_fail(out.error().message);
    std::fwrite(out->data(), 1, out->size(), stdout);
    return 0;
}

}  // namespace steward
