// The regex pre-tokenizers of byte-level BPE vocabularies (GPT-2, Llama 3, Qwen2): they split
// text into words before merges apply, as llama.cpp does for each `tokenizer.ggml.pre`.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace steward {

enum class PreType { GPT2, LLAMA3, QWEN2 };

class Pretokenizer {
public:
    // Maps a `tokenizer.ggml.pre` name to its regex. Unknown names yield an Error; the caller
    // decides whether to fall back (see Tokenizer::from_gguf).
    static Expected<PreType> type_from_name(std::string_view name);
    // Compiles the regex once (PCRE2, UTF + UCP, JIT when available). Errors are internal.
    static Expected<Pretokenizer> create(PreType type);
    Pretokenizer(Pretokenizer&& other) noexcept;
    Pretokenizer& operator=(Pretokenizer&& other) noexcept;
    Pretokenizer(const Pretokenizer&) = delete;
    Pretokenizer& operator=(const Pretokenizer&) = delete;
    ~Pretokenizer();

    // Appends the words of text to words (views into text). Text the regex does not match
    // (and invalid UTF-8 bytes) becomes words of its own, so the words always tile text.
    // Thread-safe: the compiled pattern is shared read-only, match state is per thread.
    void split(std::string_view text, std::vector<std::string_view>& words) const;
    PreType type() const { return type_; }

private:
    Pretokenizer() = default;
    PreType type_ = PreType::GPT2;
    void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace steward
