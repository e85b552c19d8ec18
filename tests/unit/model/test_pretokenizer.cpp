// Pre-tokenizer tests: the word splits of each regex set, worked by hand from the regexes llama.cpp
// runs for each `tokenizer.ggml.pre` (the sets without a reference vocabulary in testdata).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "model/pretokenizer.h"

using namespace steward;

namespace {

std::vector<std::string> split_as(PreType type, std::string_view text) {
    auto pretok = Pretokenizer::create(type);
    INFO((pretok ? std::string() : pretok.error().message));
    REQUIRE(pretok.ok());
    std::vector<std::string_view> words;
    pretok->split(text, words);
    return {words.begin(), words.end()};
}

std::vector<std::string> split_named(std::string_view name, std::string_view text) {
    auto type = Pretokenizer::type_from_name(name);
    INFO(std::string(name));
    REQUIRE(type.ok());
    return split_as(*type, text);
}

using Words = std::vector<std::string>;

}  // namespace

TEST_CASE("Each pre-tokenizer name maps to llama.cpp's regex set for it", "[pretokenizer]") {
    const std::pair<const char*, PreType> cases[] = {
        {"gpt-2", PreType::GPT2},
        {"mpt", PreType::GPT2},
        {"phi-2", PreType::GPT2},
        {"olmo", PreType::GPT2},
        {"llama-bpe", PreType::LLAMA3},
        {"dbrx", PreType::LLAMA3},
        {"smaug-bpe", PreType::LLAMA3},
        {"qwen2", PreType::QWEN2},
        {"deepseek-r1-qwen", PreType::QWEN2},
        {"qwen35", PreType::QWEN35},
        {"deepseek-llm", PreType::DEEPSEEK_LLM},
        {"deepseek-coder", PreType::DEEPSEEK_CODER},
        {"deepseek-v3", PreType::DEEPSEEK3},
        {"falcon", PreType::FALCON},
        {"falcon3", PreType::LLAMA3},
        {"starcoder", PreType::STARCODER},
        {"refact", PreType::STARCODER},
        {"command-r", PreType::STARCODER},
        {"smollm", PreType::STARCODER},
        {"gpt-4o", PreType::GPT4O},
        {"llama4", PreType::GPT4O},
        {"default", PreType::DEFAULT},
    };
    for (const auto& [name, type] : cases) {
        INFO(name);
        auto got = Pretokenizer::type_from_name(name);
        REQUIRE(got.ok());
        CHECK(*got == type);
    }
    auto unknown = Pretokenizer::type_from_name("no-such-pre");
    REQUIRE(!unknown.ok());
    CHECK(unknown.error().message.find("no-such-pre") != std::string::npos);
}

TEST_CASE("Only the Llama 3 names take whole words before merging", "[pretokenizer]") {
    for (const char* name : {"llama-bpe", "llama3", "llama-v3", "falcon3"}) CHECK(Pretokenizer::ignores_merges(name));
    // dbrx and smaug-bpe share Llama 3's regex, but llama.cpp merges their words as usual.
    for (const char* name : {"dbrx", "smaug-bpe", "gpt-2", "qwen2", "deepseek-llm", "starcoder"})
        CHECK(!Pretokenizer::ignores_merges(name));
}

TEST_CASE("Digit runs group as each family's regexes say", "[pretokenizer]") {
    // Whole run (\p{N}+), threes (\p{N}{1,3} or falcon's [0-9]{3} after GPT-2's split), single digits.
    CHECK(split_as(PreType::GPT2, "12345") == Words{"12345"});
    CHECK(split_as(PreType::DEEPSEEK_LLM, "12345") == Words{"12345"});
    CHECK(split_as(PreType::LLAMA3, "12345") == Words{"123", "45"});
    CHECK(split_as(PreType::DEFAULT, "12345") == Words{"123", "45"});
    CHECK(split_as(PreType::DEEPSEEK3, "12345") == Words{"123", "45"});
    CHECK(split_as(PreType::FALCON, "12345") == Words{"123", "45"});
    CHECK(split_as(PreType::GPT4O, "12345") == Words{"123", "45"});
    CHECK(split_as(PreType::QWEN2, "12345") == Words{"1", "2", "3", "4", "5"});
    CHECK(split_as(PreType::DEEPSEEK_CODER, "12345") == Words{"1", "2", "3", "4", "5"});
    CHECK(split_as(PreType::STARCODER, "12345") == Words{"1", "2", "3", "4", "5"});
    // Falcon's threes come out of GPT-2's " 2024", so the space and the last digit stand alone.
    CHECK(split_as(PreType::FALCON, " 2024 AD") == Words{" ", "202", "4", " AD"});
    CHECK(split_as(PreType::GPT2, " 2024 AD") == Words{" 2024", " AD"});
    // StarCoder's digits split first; the space before them is then a word of its own.
    CHECK(split_as(PreType::STARCODER, " 2024 AD") == Words{" ", "2", "0", "2", "4", " AD"});
}

TEST_CASE("command-r, refact and smollm split digits off before GPT-2's regex", "[pretokenizer]") {
    const Words expected{"I", "'m", " ", "4", "2", "!"};
    for (const char* name : {"command-r", "refact", "smollm", "starcoder"}) {
        INFO(name);
        CHECK(split_named(name, "I'm 42!") == expected);
    }
    CHECK(split_named("mpt", "I'm 42!") == Words{"I", "'m", " 42", "!"});
}

TEST_CASE("deepseek-coder splits code into lines, letter runs, punctuation runs and digits", "[pretokenizer]") {
    // [\r\n] | \s?\p{L}+ | \s?\p{P}+ | CJK runs | \p{N}, each refining the previous words.
    // '+' is a math symbol, not punctuation: it stays a gap word of its own.
    CHECK(split_named("deepseek-coder", "def f(x):\n\treturn x+1") ==
          Words{"def", " f", "(", "x", "):", "\n", "\treturn", " x", "+", "1"});
}

TEST_CASE("deepseek-llm keeps CJK runs and digit runs apart from its letter class", "[pretokenizer]") {
    // Its letters are cased-letter ranges: 世界 is not one, and falls to the CJK regex.
    CHECK(split_named("deepseek-llm", "Hello, \xE4\xB8\x96\xE7\x95\x8C 123\n") ==
          Words{"Hello", ",", " ", "\xE4\xB8\x96\xE7\x95\x8C", " ", "123", "\n"});
    // The line break is split off first; the spaces before it are then a word of their own.
    CHECK(split_named("deepseek-llm", "ab  \ncd") == Words{"ab", "  ", "\n", "cd"});
}

TEST_CASE("deepseek-v3 joins one ASCII punctuation mark to the letters after it", "[pretokenizer]") {
    CHECK(split_named("deepseek-v3", "Hello, world! 1234567") ==
          Words{"Hello", ",", " world", "!", " ", "123", "456", "7"});
    CHECK(split_named("deepseek-v3", "file.txt") == Words{"file", ".txt"});
}

TEST_CASE("qwen35 keeps combining marks inside words, qwen2 does not", "[pretokenizer]") {
    const std::string text = "cafe\xCC\x81s";  // e + U+0301 COMBINING ACUTE ACCENT
    // Qwen2: the mark is not a letter, so it opens the next word as its optional non-letter prefix.
    CHECK(split_named("qwen2", text) == Words{"cafe", "\xCC\x81s"});
    CHECK(split_named("qwen35", text) == Words{text});
}

TEST_CASE("gpt-4o splits at case changes and keeps contractions on their word", "[pretokenizer]") {
    CHECK(split_named("gpt-4o", "HelloWorld") == Words{"Hello", "World"});
    CHECK(split_named("gpt-4o", "ABCdef") == Words{"ABCdef"});
    CHECK(split_named("gpt-4o", "I'm") == Words{"I'm"});
    CHECK(split_named("gpt-4o", " don't") == Words{" don't"});
    CHECK(split_named("gpt-2", " don't") == Words{" don", "'t"});
}

TEST_CASE("falcon splits punctuation runs off before GPT-2's regex", "[pretokenizer]") {
    CHECK(split_named("falcon", "wait ...ok") == Words{"wait", " ", "...", "ok"});
    CHECK(split_named("gpt-2", "wait ...ok") == Words{"wait", " ...", "ok"});
}

TEST_CASE("default splits punctuation and symbol runs off before GPT-2's regex", "[pretokenizer]") {
    CHECK(split_named("default", " +1") == Words{" ", "+", "1"});
    CHECK(split_named("gpt-2", " +1") == Words{" +", "1"});
}

TEST_CASE("The words of every regex set tile the text, invalid UTF-8 included", "[pretokenizer]") {
    const std::string text = std::string("Grüße, 世界! 🦙 x=42\r\n\tdon't  ") + "\xFF\xFE bad \xE2\x82 end";
    for (PreType type :
         {PreType::GPT2, PreType::DEFAULT, PreType::LLAMA3, PreType::QWEN2, PreType::QWEN35, PreType::DEEPSEEK_LLM,
          PreType::DEEPSEEK_CODER, PreType::DEEPSEEK3, PreType::FALCON, PreType::STARCODER, PreType::GPT4O}) {
        INFO(int(type));
        std::string joined;
        for (const std::string& w : split_as(type, text)) {
            CHECK(!w.empty());
            joined += w;
        }
        CHECK(joined == text);
    }
}
