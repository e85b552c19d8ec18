// `steward template render` as a user runs it: a template from a file or from a GGUF's metadata,
// messages, tools and extra variables from the command line; one error line and exit 1 otherwise.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "run_command.h"

#include "process_temp_dir.h"

namespace {

struct Run {
    int rc;
    std::string out, err;
};

const std::filesystem::path& dir() {
    static steward_test::ProcessTempDir d("steward-template-cmd-");
    return d.path();
}

std::string write(const std::string& name, const std::string& text) {
    auto p = dir() / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
}

Run run(const std::string& args) {
    const std::string err_path = (dir() / "stderr.txt").string();
    auto r = steward_test::run_command(std::string(STEWARD_BINARY) + " template render " + args + " 2>" + err_path);
    REQUIRE(r.rc != -1);
    std::ifstream f(err_path);
    std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return {r.rc, r.out, err};
}

const std::string k_testdata = STEWARD_TESTDATA_DIR;

}  // namespace

TEST_CASE("template render prints a template file's rendering of the messages", "[template][cli]") {
    const std::string msgs = write("m.json", R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi é"}])");
    auto r = run("--template " + k_testdata + "/chat_templates/microsoft-Phi-3.5-mini-instruct.jinja --messages " + msgs +
                 " --add-generation-prompt");
    CHECK(r.rc == 0);
    CHECK(r.out == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi é<|end|>\n<|assistant|>\n");
    // Without the generation prompt this template ends with eos_token, here empty (no model).
    r = run("--template " + k_testdata + "/chat_templates/microsoft-Phi-3.5-mini-instruct.jinja --messages " + msgs +
            " --kwargs '{\"eos_token\": \"<|endoftext|>\"}'");
    CHECK(r.out == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi é<|end|>\n<|endoftext|>");
}

TEST_CASE("template render -m reads the chat template from the GGUF", "[template][cli]") {
    const std::string msgs = write("m2.json", R"([{"role": "user", "content": "Hi"}])");
    auto r = run("-m " + k_testdata + "/tokenizers/ggml-vocab-qwen2.gguf --messages " + msgs + " --add-generation-prompt");
    CHECK(r.rc == 0);
    CHECK(r.out == "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n");
}

TEST_CASE("template render passes tools and extra variables to the template", "[template][cli]") {
    const std::string msgs = write("m3.json", R"([{"role": "user", "content": "Weather?"}])");
    const std::string tools = write("t3.json", R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])");
    const std::string qwen3 = k_testdata + "/chat_templates/Qwen-Qwen3-0.6B.jinja";
    auto r = run("--template " + qwen3 + " --messages " + msgs + " --tools " + tools +
                 " --add-generation-prompt --kwargs '{\"enable_thinking\": false}'");
    CHECK(r.rc == 0);
    CHECK(r.out.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}\n</tools>") !=
          std::string::npos);
    CHECK(r.out.size() > 20);
    CHECK(r.out.substr(r.out.size() - 20) == "\n<think>\n\n</think>\n\n");
}

TEST_CASE("template render errors are one line and exit 1", "[template][cli]") {
    const std::string msgs = write("m4.json", R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
    auto one_line = [](const Run& r) {
        CHECK(r.rc == 1);
        CHECK(r.err.rfind("steward: error: ", 0) == 0);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK(r.out.empty());
    };
    // The template's own raise_exception, naming the template line.
    auto r = run("--template " + k_testdata + "/chat_templates/google-gemma-2-2b-it.jinja --messages " + msgs);
    one_line(r);
    CHECK(r.err.find("line 1, column") != std::string::npos);
    CHECK(r.err.find("Conversation roles must alternate") != std::string::npos);
    // A model without a template.
    r = run("-m " + k_testdata + "/tokenizers/ggml-vocab-gpt-2.gguf --messages " + msgs);
    one_line(r);
    CHECK(r.err.find("has no tokenizer.chat_template") != std::string::npos);
    // A syntax error, bad JSON, bad --kwargs, neither or both sources.
    r = run("--template " + write("bad.jinja", "ok\n{% for x in %}") + " --messages " + msgs);
    one_line(r);
    CHECK(r.err.find("line 2, column") != std::string::npos);
    r = run("--template " + write("ok.jinja", "x") + " --messages " + write("bad.json", "[{"));
    one_line(r);
    r = run("--template " + write("ok2.jinja", "x") + " --messages " + msgs + " --kwargs '[1]'");
    one_line(r);
    r = run("--messages " + msgs);
    one_line(r);
    r = run("--template /nonexistent.jinja --messages " + msgs);
    one_line(r);
}
