// Regex pre-tokenizers for byte-level BPE, on PCRE2 (its \p{L} / \p{N} are real Unicode classes).
#include "model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

namespace steward {

namespace {

// The patterns llama.cpp uses for each pre-type. The originals from the models' tokenizer.json
// use (?i:'s|...) for the contractions; llama.cpp spells the case-insensitivity out, and so do we.
// With PCRE2_UCP, \s is Unicode white space, as in the Rust/Python engines those regexes target.
constexpr const char* k_regex_gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* k_regex_llama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* k_regex_qwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Per-thread match state: the compiled code is shared, match data and the JIT stack are not.
struct MatchState {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    MatchState() {
        if (ctx && jit_stack) pcre2_jit_stack_assign(ctx, nullptr, jit_stack);
    }
    ~MatchState() {
        pcre2_jit_stack_free(jit_stack);
        pcre2_match_context_free(ctx);
        pcre2_match_data_free(data);
    }
    MatchState(const MatchState&) = delete;
    MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
    thread_local MatchState state;
    return state;
}

}  // namespace

Expected<PreType> Pretokenizer::type_from_name(std::string_view name) {
    // Names that share a regex with one of the three, as llama.cpp groups them.
    if (name.empty() || name == "default" || name == "gpt-2" || name == "gpt2" || name == "mpt" || name == "olmo" ||
        name == "jais")
        return PreType::GPT2;
    if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "smaug-bpe" || name == "dbrx" ||
        name == "falcon3")
        return PreType::LLAMA3;
    if (name == "qwen2" || name == "stablelm2") return PreType::QWEN2;
    return make_error("unknown pre-tokenizer tokenizer.ggml.pre = '", std::string(name),
                      "' (supported: gpt-2, llama-bpe, qwen2 and their aliases)");
}

Expected<Pretokenizer> Pretokenizer::create(PreType type) {
    const char* pattern = type == PreType::LLAMA3  ? k_regex_llama3
                          : type == PreType::QWEN2 ? k_regex_qwen2
                                                   : k_regex_gpt2;
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // MATCH_INVALID_UTF: invalid UTF-8 bytes never match, so they land in the gaps between
    // matches and still reach the byte-level BPE unchanged.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return make_error("pre-tokenizer regex failed to compile at offset ", std::to_string(err_off), ": ",
                          reinterpret_cast<const char*>(msg), " (is libpcre2-8 built with Unicode support?)");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
    Pretokenizer p;
    p.type_ = type;
    p.code_ = code;
    return p;
}

Pretokenizer::Pretokenizer(Pretokenizer&& other) noexcept
    : type_(other.type_), code_(std::exchange(other.code_, nullptr)) {}

Pretokenizer& Pretokenizer::operator=(Pretokenizer&& other) noexcept {
    if (this != &other) {
        pcre2_code_free(static_cast<pcre2_code*>(code_));
        type_ = other.type_;
        code_ = std::exchange(other.code_, nullptr);
    }
    return *this;
}

Pretokenizer::~Pretokenizer() {
    pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
    auto* code = static_cast<const pcre2_code*>(code_);
    MatchState& ms = match_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(code, subject, n, pos, 0, ms.data, ms.ctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // pathological input: retry in the interpreter
            rc = pcre2_match(code, subject, n, pos, PCRE2_NO_JIT, ms.data, ms.ctx);
        if (rc < 0) {  // no match (or a resource limit): the rest is one word
            words.push_back(text.substr(pos));
            return;
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
        size_t m_begin = ov[0], m_end = ov[1];
        if (m_begin > pos) words.push_back(text.substr(pos, m_begin - pos));
        if (m_end == m_begin) {  // cannot happen with these patterns; never loop forever
            m_end = m_begin + 1;
            while (m_end < n && (static_cast<unsigned char>(text[m_end]) & 0xC0) == 0x80) ++m_end;
        }
        words.push_back(text.substr(m_begin, m_end - m_begin));
        pos = m_end;
    }
}

}  // namespace steward
