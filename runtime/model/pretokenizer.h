// The regex pre-tokenizers of byte-level BPE vocabularies (GPT-2, Llama 3, Qwen2, DeepSeek, Falcon,
// StarCoder, GPT-4o, ...): they split text into words before merges apply, as llama.cpp does for
// each `tokenizer.ggml.pre`.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <steward/expected.h>

namespace steward {

// A regex set: one or more regexes applied in turn, each splitting the words the previous left.
// Many `tokenizer.ggml.pre` names share one set (the table is in pretokenizer.cpp).
enum class PreType {
    GPT2,
    DEFAULT,
    LLAMA3,
    QWEN2,
    QWEN35,
    DEEPSEEK_LLM,
    DEEPSEEK_CODER,
    DEEPSEEK3,
    FALCON,
    STARCODER,
    GPT4O
};

class Pretokenizer {
public:
    // Maps a `tokenizer.ggml.pre` name to its regex. Unknown names yield an Error; the caller
    // decides whether to fall back (see Tokenizer::from_gguf).
    static Expected<PreType> type_from_name(std::string_view name);
    // llama.cpp's `ignore_merges` (and default add_bos): the Llama 3 names take a whole word as one
    // token when the vocabulary has it. A property of the name, not of the regex set: dbrx and
    // smaug-bpe share Llama 3's regex but merge every word.
    static bool ignores_merges(std::string_view name);
    // Compiles the regexes once (PCRE2, UTF + UCP, JIT when available). Errors are internal.
    static Expected<Pretokenizer> create(PreType type);
    Pretokenizer(Pretokenizer&& other) noexcept;
    Pretokenizer& operator=(Pretokenizer&& other) noexcept;
    Pretokenizer(const Pretokenizer&) = delete;
    Pretokenizer& operator=(const Pretokenizer&) = delete;
    ~Pretokenizer();

    // Appends the words of text to words (views into text). Text a regex does not match (and
    // invalid UTF-8 bytes) becomes words of its own, so the words always tile text. With several
    // regexes, each one sees only one word of the previous split at a time (its ^, $ and
    // look-arounds stop at the word's ends), as llama.cpp's unicode_regex_split does.
    // Thread-safe: the compiled pattern is shared read-only, match state is per thread.
    void split(std::string_view text, std::vector<std::string_view>& words) const;
    PreType type() const { return type_; }

private:
    Pretokenizer() = default;
    PreType type_ = PreType::GPT2;
    std::vector<void*> codes_;  // pcre2_code_8*, applied in order
};

}  // namespace steward
