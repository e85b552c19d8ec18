// Regex pre-tokenizers for byte-level BPE, on PCRE2 (its \p{L} / \p{N} are real Unicode classes).
#include "model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "util/utf8.h"

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
// Qwen3.5: Qwen2's, with combining marks (\p{M}) kept inside letter runs.
constexpr const char* k_regex_qwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM (v1/v2): HF's Split pre-tokenizers in order. The letter class is an explicit list of
// cased-letter ranges (not \p{L}), so CJK, Arabic etc. are not letters here; the CJK/Hangul run
// regex and the any-length digit run come after.
constexpr const char* k_deepseek_llm_letters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
// ASCII punctuation and symbols, their full-width forms, curly quotes, ideographic space/comma/stop.
constexpr const char* k_deepseek_llm_punct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
constexpr const char* k_deepseek_cjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr const char* k_deepseek_v3_main =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o (o200k): llama.cpp's rewrite of \p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M} as "a letter that is not
// a-z" / "not A-Z", kept as llama.cpp runs it so that splits agree with it.
constexpr const char* k_regex_gpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The regexes of each set, in the order they apply (llama.cpp's llm_tokenizer_bpe regex_exprs).
std::vector<const char*> regexes_of(PreType type) {
    switch (type) {
        case PreType::GPT2: return {k_regex_gpt2};
        case PreType::DEFAULT: return {R"([\p{P}\$\+<=>\^~\|]+)", k_regex_gpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
        case PreType::LLAMA3: return {k_regex_llama3};
        case PreType::QWEN2: return {k_regex_qwen2};
        case PreType::QWEN35: return {k_regex_qwen35};
        case PreType::DEEPSEEK_LLM:
            return {R"([\r\n])", k_deepseek_llm_letters, k_deepseek_llm_punct, R"(\s+$)", k_deepseek_cjk, R"(\p{N}+)"};
        case PreType::DEEPSEEK_CODER: return {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", k_deepseek_cjk, R"(\p{N})"};
        case PreType::DEEPSEEK3:
            return {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", k_deepseek_v3_main};
        case PreType::FALCON: return {R"([\p{P}\$\+<=>\^~\|`]+)", k_regex_gpt2, "[0-9][0-9][0-9]"};
        case PreType::STARCODER: return {R"(\p{N})", k_regex_gpt2};
        case PreType::GPT4O: return {k_regex_gpt4o};
    }
    return {k_regex_gpt2};
}

// `tokenizer.ggml.pre` name -> regex set, as llama.cpp's llama_vocab::load groups them:
//   GPT2           gpt-2 (gpt2), phi-2, mpt, olmo, jais, jina-es, jina-de, jina-v2-es, jina-v2-de,
//                  gigachat, a.x-4.0, mellum, modern-bert, exaone4, trillion, granite-docling;
//                  also a missing key (llama.cpp would warn and use DEFAULT; we keep gpt-2 as before)
//   DEFAULT        default (llama.cpp's fallback set: punctuation runs, GPT-2, digit runs, threes)
//   LLAMA3         llama-bpe, llama3, llama-v3, falcon3, falcon-h1, pixtral, midm-2.0, lfm2,
//                  dbrx, smaug-bpe
//   QWEN2          qwen2, deepseek-r1-qwen, kormo, f2llmv2, stablelm2, megrez, hunyuan, solar-open
//   QWEN35         qwen35
//   DEEPSEEK_LLM   deepseek-llm
//   DEEPSEEK_CODER deepseek-coder
//   DEEPSEEK3      deepseek-v3, hunyuan-dense, joyai-llm
//   FALCON         falcon
//   STARCODER      starcoder, refact, command-r, smollm, codeshell, exaone, minerva-7b, mellum2
//   GPT4O          gpt-4o (Phi-4-mini), llama4, kanana2, minimax-m2
// SentencePiece vocabularies (tokenizer.ggml.model = llama: Llama 2, Mistral v0.1-v0.3, Phi-3,
// Gemma...) have no pre-tokenizer regex; they never reach this table.
struct NamedSet {
    std::string_view name;
    PreType type;
};
constexpr NamedSet k_names[] = {
    {"", PreType::GPT2},
    {"default", PreType::DEFAULT},
    {"gpt-2", PreType::GPT2},
    {"gpt2", PreType::GPT2},
    {"phi-2", PreType::GPT2},
    {"mpt", PreType::GPT2},
    {"olmo", PreType::GPT2},
    {"jais", PreType::GPT2},
    {"jina-es", PreType::GPT2},
    {"jina-de", PreType::GPT2},
    {"jina-v2-es", PreType::GPT2},
    {"jina-v2-de", PreType::GPT2},
    {"gigachat", PreType::GPT2},
    {"a.x-4.0", PreType::GPT2},
    {"mellum", PreType::GPT2},
    {"modern-bert", PreType::GPT2},
    {"exaone4", PreType::GPT2},
    {"trillion", PreType::GPT2},
    {"granite-docling", PreType::GPT2},
    {"llama-bpe", PreType::LLAMA3},
    {"llama3", PreType::LLAMA3},
    {"llama-v3", PreType::LLAMA3},
    {"falcon3", PreType::LLAMA3},
    {"falcon-h1", PreType::LLAMA3},
    {"pixtral", PreType::LLAMA3},
    {"midm-2.0", PreType::LLAMA3},
    {"lfm2", PreType::LLAMA3},
    {"dbrx", PreType::LLAMA3},
    {"smaug-bpe", PreType::LLAMA3},
    {"qwen2", PreType::QWEN2},
    {"deepseek-r1-qwen", PreType::QWEN2},
    {"kormo", PreType::QWEN2},
    {"f2llmv2", PreType::QWEN2},
    {"stablelm2", PreType::QWEN2},
    {"megrez", PreType::QWEN2},
    {"hunyuan", PreType::QWEN2},
    {"solar-open", PreType::QWEN2},
    {"qwen35", PreType::QWEN35},
    {"deepseek-llm", PreType::DEEPSEEK_LLM},
    {"deepseek-coder", PreType::DEEPSEEK_CODER},
    {"deepseek-v3", PreType::DEEPSEEK3},
    {"hunyuan-dense", PreType::DEEPSEEK3},
    {"joyai-llm", PreType::DEEPSEEK3},
    {"falcon", PreType::FALCON},
    {"starcoder", PreType::STARCODER},
    {"refact", PreType::STARCODER},
    {"command-r", PreType::STARCODER},
    {"smollm", PreType::STARCODER},
    {"codeshell", PreType::STARCODER},
    {"exaone", PreType::STARCODER},
    {"minerva-7b", PreType::STARCODER},
    {"mellum2", PreType::STARCODER},
    {"gpt-4o", PreType::GPT4O},
    {"llama4", PreType::GPT4O},
    {"kanana2", PreType::GPT4O},
    {"minimax-m2", PreType::GPT4O},
};

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
    for (const NamedSet& n : k_names)
        if (n.name == name) return n.type;
    return make_error("unknown pre-tokenizer tokenizer.ggml.pre = '", std::string(name),
                      "' (supported: gpt-2, llama-bpe, qwen2, qwen35, deepseek-llm, deepseek-coder, deepseek-v3, "
                      "falcon, starcoder, refact, command-r, smollm, mpt, phi-2, gpt-4o and their aliases)");
}

bool Pretokenizer::ignores_merges(std::string_view name) {
    return name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "falcon3" || name == "falcon-h1" ||
           name == "pixtral" || name == "midm-2.0" || name == "lfm2";
}

Expected<Pretokenizer> Pretokenizer::create(PreType type) {
    Pretokenizer p;
    p.type_ = type;
    for (const char* pattern : regexes_of(type)) {
        int err = 0;
        PCRE2_SIZE err_off = 0;
        // MATCH_INVALID_UTF: invalid UTF-8 bytes never match, so they land in the gaps between
        // matches and still reach the byte-level BPE unchanged. DOLLAR_ENDONLY: $ is the end of the
        // word only, as in the ECMAScript regexes llama.cpp runs (not also before a final \n).
        pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err,
                                         &err_off, nullptr);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            return make_error("pre-tokenizer regex '", pattern, "' failed to compile at offset ",
                              std::to_string(err_off), ": ", reinterpret_cast<const char*>(msg),
                              " (is libpcre2-8 built with Unicode support?)");
        }
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
        p.codes_.push_back(code);                     // p frees it on any later error
    }
    return p;
}

Pretokenizer::Pretokenizer(Pretokenizer&& other) noexcept
    : type_(other.type_), codes_(std::exchange(other.codes_, {})) {}

Pretokenizer& Pretokenizer::operator=(Pretokenizer&& other) noexcept {
    if (this != &other) {
        for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
        type_ = other.type_;
        codes_ = std::exchange(other.codes_, {});
    }
    return *this;
}

Pretokenizer::~Pretokenizer() {
    for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

namespace {

// One regex over one word: the matches and the gaps between them, in order.
void split_with(const pcre2_code* code, std::string_view text, std::vector<std::string_view>& words) {
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
            while (m_end < n && utf8::is_continuation(text[m_end])) ++m_end;
        }
        words.push_back(text.substr(m_begin, m_end - m_begin));
        pos = m_end;
    }
}

}  // namespace

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
    if (codes_.size() == 1) {
        split_with(static_cast<const pcre2_code*>(codes_[0]), text, words);
        return;
    }
    // Later regexes refine the words of earlier ones; each word is its own subject.
    thread_local std::vector<std::string_view> cur, next;
    cur.assign(1, text);
    for (void* c : codes_) {
        next.clear();
        for (std::string_view w : cur) split_with(static_cast<const pcre2_code*>(c), w, next);
        std::swap(cur, next);
    }
    words.insert(words.end(), cur.begin(), cur.end());
}

}  // namespace steward
