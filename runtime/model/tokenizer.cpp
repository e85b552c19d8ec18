// Tokenizers from GGUF metadata, reproducing llama.cpp: SentencePiece-style best-score bigram
// merging with byte fallback (`llama`), and GPT-2 byte-level BPE with ranked merges (`gpt2`).
#include "model/tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <optional>
#include <queue>
#include <unordered_map>

#include "model/pretokenizer.h"
#include "util/utf8.h"

namespace steward {

namespace {

// Token types (tokenizer.ggml.token_type); 5, unused, decodes to "" like control.
constexpr int32_t k_type_normal = 1, k_type_unknown = 2, k_type_control = 3, k_type_user = 4, k_type_byte = 6;
constexpr std::string_view k_spm_space = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// A token's text with each U+2581 (SentencePiece's and WordPiece's word-start mark) as a space.
std::string spaces_from_marks(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.compare(i, k_spm_space.size(), k_spm_space) == 0) {
            out += ' ';
            i += k_spm_space.size();
        } else {
            out += text[i++];
        }
    }
    return out;
}

// ---- GPT-2 byte-level alphabet --------------------------------------------------------------

// GPT-2 maps every byte to a printable code point: printable Latin-1 bytes map to themselves,
// the other 68 to U+0100.. in byte order. BPE vocabularies are written in that alphabet.
struct ByteAlphabet {
    std::array<std::string, 256> byte_to_utf8;  // the UTF-8 of each byte's code point
    std::array<int16_t, 324> cp_to_byte;        // inverse; -1 where no byte maps
    ByteAlphabet() {
        cp_to_byte.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            const uint32_t cp = printable ? uint32_t(b) : next++;
            utf8::encode(cp, byte_to_utf8[b]);
            cp_to_byte[cp] = int16_t(b);
        }
    }
};

const ByteAlphabet& byte_alphabet() {
    static const ByteAlphabet table;
    return table;
}

// ---- Vocabulary shared by both models -------------------------------------------------------

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// A piece of the input after special tokens are split out: either a token id or raw text.
struct Fragment {
    int32_t id;  // -1 for raw text
    std::string_view text;
};

// Adjacent symbols of a word during merging: a linked list over byte ranges of one string.
struct Symbol {
    int32_t prev, next;
    uint32_t off, len;  // len == 0: merged into its left neighbour
};

// One symbol per UTF-8 character. An ill-formed byte is a symbol of its own (llama.cpp sizes a
// symbol by its lead byte alone, so a stray 0xFF swallows the next three bytes into byte
// fallback and "▁" comes back as its bytes instead of a space; valid text splits the same).
std::vector<Symbol> split_symbols(std::string_view text) {
    std::vector<Symbol> syms;
    syms.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
        const utf8::Decoded d = utf8::decode(text, off);
        const size_t len = d.status == utf8::Status::ok ? d.len : 1;
        const int32_t i = (int32_t)syms.size();
        syms.push_back({i - 1, i + 1, (uint32_t)off, (uint32_t)len});
        off += len;
    }
    if (!syms.empty()) syms.back().next = -1;
    return syms;
}

// The merge loop llama.cpp's SPM and BPE tokenizers share: symbols start as the characters of
// text, and the adjacent pair with the highest priority (ties: the leftmost) merges until no pair
// qualifies. priority(left, right) gives a pair's priority, or nullopt when it may not merge.
// Returns the symbols; the live ones (len > 0) are linked from index 0 by next.
template <typename Priority>
std::vector<Symbol> merge_symbols(std::string_view text, Priority&& priority) {
    std::vector<Symbol> syms = split_symbols(text);
    struct Bigram {
        double priority;
        int32_t left, right;
        uint32_t size;
    };
    auto worse = [](const Bigram& a, const Bigram& b) {
        return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
    auto try_add = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const Symbol& l = syms[left];
        const Symbol& r = syms[right];
        const std::optional<double> p = priority(text.substr(l.off, l.len), text.substr(r.off, r.len));
        if (p) queue.push({*p, left, right, l.len + r.len});
    };
    for (int32_t i = 1; i < (int32_t)syms.size(); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol& l = syms[b.left];
        Symbol& r = syms[b.right];
        // Stale: one side was merged away, or grew, since this pair was queued.
        if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = b.left;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }
    return syms;
}

class VocabTokenizer : public Tokenizer {
public:
    int32_t find(std::string_view text) const {
        auto it = token_to_id_.find(text);
        return it == token_to_id_.end() ? -1 : it->second;
    }
    // Reads what both models share: tokens, token types, special ids, end-of-generation ids.
    Expected<bool> load_vocab(const GgufFile& file, TokenizerKind kind);

protected:
    // Splits text at occurrences of special tokens, as llama.cpp does: longest token text first,
    // each one cut out of every raw fragment left. Control (and unknown) tokens are split out only
    // with parse_special; user-defined tokens always are (llama.cpp and Hugging Face agree: they
    // are added tokens, not control).
    std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

    StringMap token_to_id_;
    std::vector<int32_t> special_ids_;  // unknown, control and user-defined; longest text first
};

Expected<bool> VocabTokenizer::load_vocab(const GgufFile& file, TokenizerKind kind) {
    const std::string where = " in " + file.path();
    kind_ = kind;
    auto tokens = file.get_string_array("tokenizer.ggml.tokens");
    if (!tokens) {
        if (file.find("tokenizer.ggml.tokens"))
            return make_error("tokenizer.ggml.tokens", where,
                              " is not an array of strings; re-convert the model with llama.cpp's "
                              "convert_hf_to_gguf.py");
        return make_error("tokenizer.ggml.tokens is missing", where,
                          ": the file carries no vocabulary; use a GGUF converted with its "
                          "tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)");
    }
    if (tokens->empty()) return make_error("tokenizer.ggml.tokens is empty", where);
    if (tokens->size() > (size_t)INT32_MAX) return make_error("tokenizer.ggml.tokens has too many entries", where);
    const size_t n = tokens->size();
    tokens_.assign(tokens->begin(), tokens->end());

    token_types_.assign(n, k_type_normal);
    if (file.find("tokenizer.ggml.token_type")) {
        auto types = file.get_i32_array("tokenizer.ggml.token_type");
        if (!types)
            return make_error("tokenizer.ggml.token_type", where, " is not an array of int32; re-convert the model");
        if (types->size() != n)
            return make_error("tokenizer.ggml.token_type has ", std::to_string(types->size()),
                              " entries but tokenizer.ggml.tokens has ", std::to_string(n), where,
                              "; the two arrays must be parallel, re-convert the model");
        token_types_ = std::move(*types);
    }

    token_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) token_to_id_[tokens_[i]] = (int32_t)i;  // last one wins, as in llama.cpp

    // Special ids. Out-of-range ids are an error: a wrong EOS would silently break stopping.
    auto read_id = [&](const char* key, int32_t fallback) -> Expected<int32_t> {
        auto v = file.get_int(key);
        if (!v) {
            if (file.find(key)) return make_error(key, where, " is not an integer");
            return fallback < (int32_t)n ? fallback : -1;
        }
        if (*v < -1 || *v >= (int64_t)n)
            return make_error(key, " = ", std::to_string(*v), where, " is outside the vocabulary of ",
                              std::to_string(n),
                              " tokens; fix the metadata (e.g. with llama.cpp's "
                              "gguf_set_metadata.py) or re-convert the model");
        return (int32_t)*v;
    };
    const bool spm = kind == TokenizerKind::SPM;
    // Defaults when the keys are absent: Llama's <unk>=0, <s>=1, </s>=2 for SPM; none for BPE.
    auto bos = read_id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
    if (!bos) return bos.error();
    auto eos = read_id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
    if (!eos) return eos.error();
    auto unk = read_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
    if (!unk) return unk.error();
    auto eot = read_id("tokenizer.ggml.eot_token_id", -1);
    if (!eot) return eot.error();
    auto eom = read_id("tokenizer.ggml.eom_token_id", -1);
    if (!eom) return eom.error();
    bos_ = *bos, eos_ = *eos, unk_ = *unk, eot_ = *eot;

    // End of generation: EOS, EOT, EOM, plus the end-of-turn control tokens of the common chat
    // templates when the metadata does not name them (Llama 3's <|eot_id|> is often missing from
    // eot_token_id). A short fixed list is a trade-off: simple and predictable, at the cost of
    // missing exotic templates, which can still set tokenizer.ggml.eot_token_id.
    static constexpr std::string_view k_eog_texts[] = {"<|eot_id|>",    "<|eom_id|>",      "<|im_end|>",
                                                       "<|endoftext|>", "<|end_of_text|>", "<|end|>",
                                                       "<end_of_turn>", "<|return|>",      "<|call|>"};
    eog_ids_.clear();
    for (int32_t id : {eos_, eot_, *eom})
        if (id >= 0) eog_ids_.push_back(id);
    for (std::string_view t : k_eog_texts) {
        const int32_t id = find(t);
        if (id >= 0 && token_types_[id] == k_type_control) eog_ids_.push_back(id);
    }
    std::sort(eog_ids_.begin(), eog_ids_.end());
    eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

    special_ids_.clear();
    for (size_t i = 0; i < n; ++i) {
        const int32_t t = token_types_[i];
        if ((t == k_type_unknown || t == k_type_control || t == k_type_user) && !tokens_[i].empty())
            special_ids_.push_back((int32_t)i);
    }
    std::stable_sort(special_ids_.begin(), special_ids_.end(),
                     [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
    return true;
}

std::vector<Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special) const {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, text});
    std::vector<Fragment> next;
    for (int32_t id : special_ids_) {
        if (!parse_special && token_types_[id] != k_type_user) continue;
        const std::string& special = tokens_[id];
        if (text.find(special) == std::string_view::npos) continue;  // cheap common case
        next.clear();
        for (const Fragment& f : frags) {
            if (f.id >= 0) {
                next.push_back(f);
                continue;
            }
            size_t pos = 0;
            for (size_t hit; (hit = f.text.find(special, pos)) != std::string_view::npos;) {
                if (hit > pos) next.push_back({-1, f.text.substr(pos, hit - pos)});
                next.push_back({id, f.text.substr(hit, special.size())});
                pos = hit + special.size();
            }
            if (pos < f.text.size()) next.push_back({-1, f.text.substr(pos)});
        }
        frags.swap(next);
    }
    return frags;
}

// ---- SentencePiece-style (tokenizer.ggml.model = llama) -------------------------------------

class SpmTokenizer final : public VocabTokenizer {
public:
    Expected<bool> load(const GgufFile& file) {
        auto ok = load_vocab(file, TokenizerKind::SPM);
        if (!ok) return ok;
        const std::string where = " in " + file.path();
        auto scores = file.get_f32_array("tokenizer.ggml.scores");
        if (!scores) {
            if (file.find("tokenizer.ggml.scores"))
                return make_error("tokenizer.ggml.scores", where, " is not an array of float32; re-convert the model");
            return make_error("tokenizer.ggml.scores is missing", where,
                              ": a SentencePiece (llama) vocabulary merges by score; re-convert "
                              "the model with its tokenizer.model");
        }
        if (scores->size() != tokens_.size())
            return make_error("tokenizer.ggml.scores has ", std::to_string(scores->size()),
                              " entries but tokenizer.ggml.tokens has ", std::to_string(tokens_.size()), where,
                              "; the arrays must be parallel, re-convert the model");
        scores_ = std::move(*scores);
        add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
        add_space_prefix_ = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
        pre_ = std::string(file.get_string("tokenizer.ggml.pre").value_or("default"));
        byte_ids_.fill(-1);
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof(name), "<0x%02X>", b);
            byte_ids_[b] = find(name);
        }
        return true;
    }

    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
        std::vector<int32_t> out;
        if (add_bos && bos_ >= 0) out.push_back(bos_);
        bool prev_special = true;  // the space prefix goes at the start and after each special token
        std::string buf;
        for (const Fragment& f : partition(text, parse_special)) {
            if (f.id >= 0) {
                out.push_back(f.id);
                prev_special = true;
                continue;
            }
            buf.clear();
            if (add_space_prefix_ && prev_special) buf += k_spm_space;
            for (char c : f.text) {
                if (c == ' ')
                    buf += k_spm_space;
                else
                    buf += c;
            }
            tokenize(buf, out);
            prev_special = false;
        }
        return out;
    }

    std::string token_to_bytes(int32_t id) const override {
        if (id < 0 || id >= n_vocab()) return {};
        const std::string& text = tokens_[id];
        switch (token_types_[id]) {
            case k_type_normal: return spaces_from_marks(text);
            case k_type_unknown: return "\xE2\x96\x85";  // U+2585, as llama.cpp shows <unk>
            case k_type_user: return text;
            case k_type_byte: {
                unsigned v = 0;
                if (std::sscanf(text.c_str(), "<0x%2X>", &v) == 1) return std::string(1, char(v));
                return text;
            }
            default: return {};  // control, unused
        }
    }

private:
    // llama.cpp's llm_tokenizer_spm: start from UTF-8 characters and keep merging the adjacent
    // pair whose concatenation is the highest-scoring token (ties: leftmost); what remains
    // unknown falls back to <0xNN> byte tokens.
    void tokenize(std::string_view text, std::vector<int32_t>& out) const {
        const std::vector<Symbol> syms =
            merge_symbols(text, [&](std::string_view left, std::string_view right) -> std::optional<double> {
                const int32_t id = find(std::string_view(left.data(), left.size() + right.size()));
                if (id < 0) return std::nullopt;
                return scores_[id];  // the higher the score, the earlier the merge
            });
        for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
            const std::string_view piece = text.substr(syms[i].off, syms[i].len);
            const int32_t id = find(piece);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
            // Only single characters get here: every merge made a vocabulary token.
            for (unsigned char c : piece) {
                const int32_t byte_id = byte_ids_[c] >= 0 ? byte_ids_[c] : unk_;
                if (byte_id >= 0) out.push_back(byte_id);
            }
        }
    }

    std::vector<float> scores_;
    std::array<int32_t, 256> byte_ids_{};  // <0xNN> tokens; -1 when absent
};

// ---- GPT-2 byte-level BPE (tokenizer.ggml.model = gpt2) -------------------------------------

// Gemma 4's variant (tokenizer.ggml.model = gemma4), as llama.cpp's: spaces become U+2581, the text
// is split only into runs of newlines and runs of other characters, merges run on raw UTF-8 (no
// byte alphabet), a run of newlines that is a token is that token, a piece the vocabulary lacks
// becomes its <0xNN> byte tokens, and BOS is always added.
class BpeTokenizer final : public VocabTokenizer {
public:
    BpeTokenizer(Pretokenizer pretok, bool ignore_merges, bool spm_style = false)
        : pretok_(std::move(pretok)), ignore_merges_(ignore_merges), spm_style_(spm_style) {}

    Expected<bool> load(const GgufFile& file) {
        auto ok = load_vocab(file, TokenizerKind::BPE);
        if (!ok) return ok;
        const std::string where = " in " + file.path();
        auto merges = file.get_string_array("tokenizer.ggml.merges");
        if (!merges) {
            if (file.find("tokenizer.ggml.merges"))
                return make_error("tokenizer.ggml.merges", where, " is not an array of strings; re-convert the model");
            return make_error("tokenizer.ggml.merges is missing", where,
                              ": a gpt2 (BPE) vocabulary needs its merges; re-convert the model "
                              "with llama.cpp's convert_hf_to_gguf.py");
        }
        ranks_.reserve(merges->size());
        for (size_t i = 0; i < merges->size(); ++i) {
            std::string_view m = (*merges)[i];
            const size_t sp = m.find(' ', 1);
            if (m.size() < 3 || sp == std::string_view::npos || sp + 1 >= m.size())
                return make_error("tokenizer.ggml.merges[", std::to_string(i), "] = '", std::string(m), "'", where,
                                  " is not of the form 'left right'; re-convert the model");
            ranks_.try_emplace(std::string(m), (int32_t)i);  // first rank wins, as in llama.cpp
        }
        // Llama 3 (and the other names llama.cpp gives ignore_merges) take a whole word as one
        // token when it is in the vocabulary, before any merge; they also want BOS by default.
        add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token").value_or(ignore_merges_);
        if (spm_style_) {
            add_bos_ = true;  // llama.cpp overrides a false add_bos_token for Gemma 4
            byte_ids_.fill(-1);
            char buf[8];
            for (int b = 0; b < 256; b++) {
                std::snprintf(buf, sizeof buf, "<0x%02X>", b);
                byte_ids_[(size_t)b] = find(buf);
            }
        }
        return true;
    }

    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
        std::vector<int32_t> out;
        if (add_bos && bos_ >= 0) out.push_back(bos_);
        std::vector<std::string_view> words;
        std::string encoded, key;
        for (const Fragment& f : partition(text, parse_special)) {
            if (f.id >= 0) {
                out.push_back(f.id);
                continue;
            }
            if (spm_style_) {
                std::string esc;
                esc.reserve(f.text.size());
                for (char c : f.text) {
                    if (c == ' ')
                        esc += k_spm_space;
                    else
                        esc += c;
                }
                for (size_t i = 0; i < esc.size();) {  // runs of newlines and runs of the rest
                    const bool nl = esc[i] == '\n';
                    size_t j = i;
                    while (j < esc.size() && (esc[j] == '\n') == nl) j++;
                    const std::string_view w(esc.data() + i, j - i);
                    if (nl) {
                        if (const int32_t id = find(w); id >= 0) {
                            out.push_back(id);
                            i = j;
                            continue;
                        }
                    }
                    tokenize_word(w, encoded, key, out);
                    i = j;
                }
                continue;
            }
            words.clear();
            pretok_.split(f.text, words);
            for (std::string_view w : words) tokenize_word(w, encoded, key, out);
        }
        return out;
    }

    std::string token_to_bytes(int32_t id) const override {
        if (id < 0 || id >= n_vocab()) return {};
        const std::string& text = tokens_[id];
        if (spm_style_) {
            switch (token_types_[id]) {
                case k_type_normal: return spaces_from_marks(text);
                case k_type_byte:
                    if (text.size() == 6 && text.rfind("<0x", 0) == 0)
                        return std::string(1, (char)std::strtol(text.substr(3, 2).c_str(), nullptr, 16));
                    return {};
                case k_type_user: return text;
                default: return {};
            }
        }
        switch (token_types_[id]) {
            case k_type_normal:
            case k_type_byte: {
                const ByteAlphabet& alpha = byte_alphabet();
                std::string out;
                out.reserve(text.size());
                for (size_t i = 0; i < text.size();) {
                    const utf8::Decoded d = utf8::decode(text, i);
                    const size_t len = d.status == utf8::Status::ok ? d.len : 1;
                    const uint32_t cp = d.status == utf8::Status::ok ? d.cp : 0xFFFFFFFF;
                    if (cp < alpha.cp_to_byte.size() && alpha.cp_to_byte[cp] >= 0)
                        out += char(alpha.cp_to_byte[cp]);
                    else
                        out.append(text, i, len);  // not in the byte alphabet: keep as written
                    i += len;
                }
                return out;
            }
            case k_type_user: return text;
            default: return {};  // control, unknown, unused
        }
    }

private:
    // llama.cpp's llm_tokenizer_bpe on one pre-tokenized word: map bytes to the GPT-2 alphabet,
    // then merge the adjacent pair with the lowest merge rank (ties: leftmost) until none applies.
    void tokenize_word(std::string_view word, std::string& enc, std::string& key, std::vector<int32_t>& out) const {
        const ByteAlphabet& alpha = byte_alphabet();
        enc.clear();
        if (spm_style_)
            enc.assign(word);
        else
            for (unsigned char c : word) enc += alpha.byte_to_utf8[c];
        if (ignore_merges_) {
            const int32_t id = find(enc);
            if (id >= 0) {
                out.push_back(id);
                return;
            }
        }
        const std::string_view text = enc;
        const std::vector<Symbol> syms =
            merge_symbols(text, [&](std::string_view left, std::string_view right) -> std::optional<double> {
                key.assign(left);
                key += ' ';
                key.append(right);
                auto it = ranks_.find(std::string_view(key));
                if (it == ranks_.end()) return std::nullopt;
                return -double(it->second);  // the lower the rank, the earlier the merge
            });
        for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
            const std::string_view piece = text.substr(syms[i].off, syms[i].len);
            const int32_t id = find(piece);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
            if (spm_style_) {  // its bytes as <0xNN> tokens (llama.cpp drops a byte without one)
                for (unsigned char c : piece)
                    if (byte_ids_[c] >= 0) out.push_back(byte_ids_[c]);
                continue;
            }
            // A merge produced a string the vocabulary lacks (a malformed vocabulary): fall back
            // to its characters, then to <unk>.
            for (size_t k = 0; k < piece.size();) {
                const utf8::Decoded d = utf8::decode(piece, k);
                const size_t len = d.status == utf8::Status::ok ? d.len : 1;
                const int32_t cid = find(piece.substr(k, len));
                if (cid >= 0)
                    out.push_back(cid);
                else if (unk_ >= 0)
                    out.push_back(unk_);
                k += len;
            }
        }
    }

    Pretokenizer pretok_;
    StringMap ranks_;  // "left right" -> merge rank
    bool ignore_merges_ = false;
    bool spm_style_ = false;                // gemma4
    std::array<int32_t, 256> byte_ids_{};  // gemma4's <0xNN> tokens; -1 when absent
};


// ---- WordPiece (tokenizer.ggml.model = bert) ------------------------------------------------

// llama.cpp's llm_tokenizer_wpm: the text is normalised as BERT's BasicTokenizer does (NFD and
// accent marks dropped when strip_accents, lower case when lowercase, control characters dropped),
// split at white space and around punctuation, ASCII symbols and CJK ideographs, and each word,
// prefixed with U+2581, is covered greedily by the longest vocabulary tokens from its start; a word
// that cannot be covered is one unknown token. Unicode properties and normalisation come from ICU.
class WpmTokenizer final : public VocabTokenizer {
public:
    Expected<bool> load(const GgufFile& file) {
        auto ok = load_vocab(file, TokenizerKind::WPM);
        if (!ok) return ok;
        // BERT's defaults where the keys are absent: [CLS] 101, [UNK] 100, [SEP] 102 (llama.cpp's).
        const int32_t n = n_vocab();
        if (!file.find("tokenizer.ggml.bos_token_id")) bos_ = n > 101 ? 101 : -1;
        if (!file.find("tokenizer.ggml.unknown_token_id")) unk_ = n > 100 ? 100 : -1;
        const auto sep = file.get_int("tokenizer.ggml.seperator_token_id");
        if (!sep && file.find("tokenizer.ggml.seperator_token_id"))
            return make_error("tokenizer.ggml.seperator_token_id in ", file.path(), " is not an integer; re-convert the model");
        if (sep && (*sep < -1 || *sep >= n))
            return make_error("tokenizer.ggml.seperator_token_id = ", std::to_string(*sep), " is outside the vocabulary of ",
                              std::to_string(n), " tokens in ", file.path());
        sep_ = sep ? (int32_t)*sep : (n > 102 ? 102 : -1);
        add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
        lowercase_ = file.get_bool("tokenizer.ggml.normalizer.lowercase").value_or(true);  // llama.cpp's default
        strip_accents_ = file.get_bool("tokenizer.ggml.normalizer.strip_accents").value_or(lowercase_);
        pre_ = std::string(file.get_string("tokenizer.ggml.pre").value_or("default"));
        for (const std::string& t : tokens_) max_len_ = std::max(max_len_, t.size());
        UErrorCode err = U_ZERO_ERROR;
        nfd_ = unorm2_getNFDInstance(&err);
        if (U_FAILURE(err) || !nfd_) return make_error("the ICU NFD normaliser is unavailable (", u_errorName(err), ")");
        return true;
    }

    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
        std::vector<int32_t> out;
        if (add_bos && bos_ >= 0) out.push_back(bos_);
        for (const Fragment& f : partition(text, parse_special)) {
            if (f.id >= 0) {
                out.push_back(f.id);
                continue;
            }
            for (const std::string& word : words(f.text)) tokenize_word(word, out);
        }
        // llama.cpp's add_special for WordPiece: [CLS] before, [SEP] after (add_bos says both).
        if (add_bos && bos_ >= 0 && sep_ >= 0) out.push_back(sep_);
        return out;
    }

    std::string token_to_bytes(int32_t id) const override {
        if (id < 0 || id >= n_vocab()) return {};
        const int32_t type = token_types_[id];
        if (type != k_type_normal && type != k_type_user) return {};
        return spaces_from_marks(tokens_[id]);
    }

private:
    static bool is_chinese_char(UChar32 c) {
        return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
               (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
               (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
    }

    // The code points of text (ill-formed bytes as U+FFFD, which the split drops as llama.cpp does).
    static std::vector<UChar32> code_points(std::string_view text) {
        std::vector<UChar32> cps;
        for (size_t off = 0; off < text.size();) {
            const utf8::Decoded d = utf8::decode(text, off);
            cps.push_back(d.status == utf8::Status::ok ? (UChar32)d.cp : 0xFFFD);
            off += d.status == utf8::Status::ok ? d.len : std::max<size_t>(1, d.len);
        }
        return cps;
    }

    std::vector<UChar32> nfd(const std::vector<UChar32>& cps) const {
        std::u16string u16;
        for (UChar32 c : cps) {
            if (c < 0x10000) {
                u16 += (char16_t)c;
            } else {
                u16 += (char16_t)(0xD800 + ((c - 0x10000) >> 10));
                u16 += (char16_t)(0xDC00 + ((c - 0x10000) & 0x3FF));
            }
        }
        UErrorCode err = U_ZERO_ERROR;
        const int32_t cap = (int32_t)u16.size() * 4 + 16;
        std::u16string out((size_t)cap, u'\0');
        const int32_t n = unorm2_normalize(nfd_, u16.data(), (int32_t)u16.size(), out.data(), cap, &err);
        if (U_FAILURE(err)) return cps;  // cannot happen at 4x; the text unnormalised otherwise
        std::vector<UChar32> res;
        for (int32_t i = 0; i < n;) {
            UChar32 c;
            U16_NEXT(out.data(), i, n, c);
            res.push_back(c);
        }
        return res;
    }

    std::vector<std::string> words(std::string_view text) const {
        std::vector<UChar32> cps = code_points(text);
        if (strip_accents_) cps = nfd(cps);
        std::vector<std::string> words(1);
        for (const UChar32 c : cps) {
            if (u_isUWhiteSpace(c)) {
                if (!words.back().empty()) words.emplace_back();
                continue;
            }
            const int8_t type = u_charType(c);
            const bool control = type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_SURROGATE ||
                                 type == U_PRIVATE_USE_CHAR;
            if (c == 0 || c == 0xFFFD || control) continue;
            const bool accent = type == U_NON_SPACING_MARK || type == U_COMBINING_SPACING_MARK || type == U_ENCLOSING_MARK;
            if (strip_accents_ && accent) continue;
            std::string s;
            utf8::encode((uint32_t)(lowercase_ ? u_tolower(c) : c), s);
            const bool punct = type == U_DASH_PUNCTUATION || type == U_START_PUNCTUATION || type == U_END_PUNCTUATION ||
                               type == U_CONNECTOR_PUNCTUATION || type == U_OTHER_PUNCTUATION ||
                               type == U_INITIAL_PUNCTUATION || type == U_FINAL_PUNCTUATION;
            const bool symbol = type == U_MATH_SYMBOL || type == U_CURRENCY_SYMBOL || type == U_MODIFIER_SYMBOL ||
                                type == U_OTHER_SYMBOL;
            if (punct || (c < 0x7F && symbol) || is_chinese_char(c)) {
                if (!words.back().empty()) words.emplace_back();
                words.back() = s;
                words.emplace_back();
            } else {
                words.back() += s;
            }
        }
        if (words.back().empty()) words.pop_back();
        return words;
    }

    void tokenize_word(const std::string& word, std::vector<int32_t>& out) const {
        if (word.empty()) return;
        const std::string w = std::string(k_spm_space) + word;
        const size_t n = w.size(), before = out.size();
        for (size_t i = 0; i < n; ++i) {
            bool match = false;
            for (size_t j = std::min(n, i + max_len_ + 1); j > i; j--) {
                const int32_t id = find(std::string_view(w).substr(i, j - i));
                if (id >= 0) {
                    out.push_back(id);
                    match = true;
                    i = j - 1;
                    break;
                }
            }
            if (!match) {  // the word cannot be covered: it is one unknown token
                out.resize(before);
                break;
            }
        }
        if (out.size() == before && unk_ >= 0) out.push_back(unk_);
    }

    int32_t sep_ = -1;
    bool lowercase_ = false, strip_accents_ = false;
    size_t max_len_ = 0;
    const UNormalizer2* nfd_ = nullptr;
};
}  // namespace

// ---- Tokenizer ------------------------------------------------------------------------------

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
    auto model = file.get_string("tokenizer.ggml.model");
    if (!model) {
        if (file.find("tokenizer.ggml.model"))
            return make_error("tokenizer.ggml.model in ", file.path(), " is not a string");
        return make_error("tokenizer.ggml.model is missing in ", file.path(),
                          ": the file carries no tokenizer; use a GGUF converted with its "
                          "tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)");
    }
    if (*model == "llama") {
        auto tok = std::make_unique<SpmTokenizer>();
        auto ok = tok->load(file);
        if (!ok) return ok.error();
        return std::unique_ptr<Tokenizer>(std::move(tok));
    }
    if (*model == "gpt2") {
        // An unknown pre-tokenizer falls back to GPT-2's regex with a warning rather than failing:
        // most BPE vocabularies tokenize plain prose the same way, and refusing the model would
        // be worse than a slightly different split of digits or contractions.
        std::string pre(file.get_string("tokenizer.ggml.pre").value_or("gpt-2"));
        auto type = Pretokenizer::type_from_name(pre);
        if (!type) {
            spdlog::warn(
                "{} in {}; falling back to the gpt-2 pre-tokenizer, so tokenization may "
                "differ from the model's own",
                type.error().message, file.path());
            type = PreType::GPT2;
        }
        auto pretok = Pretokenizer::create(*type);
        if (!pretok) return pretok.error();
        auto tok = std::make_unique<BpeTokenizer>(std::move(*pretok), Pretokenizer::ignores_merges(pre));
        auto ok = tok->load(file);
        if (!ok) return ok.error();
        tok->pre_ = std::move(pre);
        return std::unique_ptr<Tokenizer>(std::move(tok));
    }
    if (*model == "gemma4") {
        auto pretok = Pretokenizer::create(PreType::GPT2);  // unused: gemma4 splits at newlines only
        if (!pretok) return pretok.error();
        auto tok = std::make_unique<BpeTokenizer>(std::move(*pretok), false, true);
        auto ok = tok->load(file);
        if (!ok) return ok.error();
        tok->pre_ = "gemma4";
        return std::unique_ptr<Tokenizer>(std::move(tok));
    }
    if (*model == "bert") {
        auto tok = std::make_unique<WpmTokenizer>();
        auto ok = tok->load(file);
        if (!ok) return ok.error();
        return std::unique_ptr<Tokenizer>(std::move(tok));
    }
    return make_error("tokenizer.ggml.model = '", std::string(*model), "' in ", file.path(),
                      " is not supported (supported: 'llama' for SentencePiece, 'gpt2' for "
                      "byte-level BPE, 'gemma4' for Gemma 4's BPE, 'bert' for WordPiece)");
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
    auto file = GgufFile::open(path);
    if (!file) return file.error();
    return from_gguf(**file);  // the tokenizer copies what it keeps; the file closes here
}

std::string Tokenizer::piece_at(int32_t id, bool first_of_text) const {
    std::string piece = token_to_bytes(id);
    if (first_of_text && add_space_prefix_ && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    return piece;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
        if (first && id == bos_ && bos_ >= 0) continue;  // BOS decodes to "" and is not the text's start
        out += piece_at(id, first);
        first = false;
    }
    return out;
}

bool Tokenizer::is_eog(int32_t id) const {
    return id >= 0 && std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

// ---- StreamDecoder --------------------------------------------------------------------------

std::string StreamDecoder::push(int32_t id) {
    if (first_ && id == tok_.bos_ && tok_.bos_ >= 0) return {};
    pending_ += tok_.piece_at(id, first_);
    first_ = false;
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        const utf8::Decoded d = utf8::decode(pending_, i);
        if (d.status == utf8::Status::truncated) break;  // an unfinished character: hold it back
        if (d.status == utf8::Status::ok)
            out.append(pending_, i, d.len);
        else
            out += utf8::k_replacement_utf8;  // one U+FFFD for the maximal ill-formed subpart
        i += d.len;
    }
    pending_.erase(0, i);
    return out;
}

std::string StreamDecoder::flush() {
    if (pending_.empty()) return {};
    pending_.clear();  // only an unfinished character can be held: it will never complete
    return std::string(utf8::k_replacement_utf8);
}

}  // namespace steward
