// Tokenizers from GGUF metadata: SentencePiece-style (`tokenizer.ggml.model = llama`: scores,
// byte fallback <0xNN>, the leading-space convention) and GPT-2 byte-level BPE (`gpt2`: merges
// by rank, the byte-to-unicode table, the pre-tokenizer named by `tokenizer.ggml.pre`).
// Both reproduce llama.cpp's tokenizations (checked against its reference outputs).
// Thread-safety: a loaded Tokenizer is immutable; every const member may be called from any
// number of threads at once. A StreamDecoder belongs to one stream (one thread at a time).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <steward/expected.h>

#include "model/gguf.h"

namespace steward {

enum class TokenizerKind { SPM, BPE, WPM };

class Tokenizer {
public:
    // Reads tokenizer.ggml.* keys and copies what it keeps (the file may close afterwards).
    // Errors name the missing or malformed key: tokens, token_type, scores (SPM) or merges (BPE)
    // missing or of the wrong length, a model other than llama/gpt2/bert, a special-token id outside
    // the vocabulary. An unknown tokenizer.ggml.pre is not an error: it logs a warning and uses
    // the gpt-2 pre-tokenizer. Defaults: SPM bos/eos/unk = 1/2/0 and add_bos true; BPE has no
    // bos/eos unless set, and add_bos is false except for Llama 3 (`llama-bpe`), as in llama.cpp.
    static Expected<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& file);
    // Opens a GGUF (a model, or a vocabulary-only file with no tensors) just for its tokenizer.
    static Expected<std::unique_ptr<Tokenizer>> load(const std::string& path);
    virtual ~Tokenizer() = default;

    // Text -> ids. add_bos prepends BOS (when the vocabulary has one). With parse_special,
    // the text of control tokens (e.g. "<s>", "<|im_start|>") maps to their ids; without it,
    // they are tokenized as plain text (llama.cpp's default for user text). User-defined tokens
    // (type 4, e.g. added "<think>") are split out either way, as llama.cpp and Hugging Face do.
    // Any bytes are accepted; ill-formed UTF-8 is kept byte for byte (byte tokens).
    virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = false) const = 0;
    // The bytes a token stands for (byte-fallback and byte-level tokens decoded; SPM's U+2581
    // turned into a space). Control tokens give "". Out-of-range ids give "".
    virtual std::string token_to_bytes(int32_t id) const = 0;
    // Ids -> text. As llama.cpp does, the leading space SPM adds to the first word is removed
    // when the sequence starts at BOS or at its first token.
    std::string decode(std::span<const int32_t> ids) const;

    TokenizerKind kind() const { return kind_; }
    int32_t n_vocab() const { return (int32_t)tokens_.size(); }
    int32_t bos() const { return bos_; }  // -1 when the vocabulary has none
    int32_t eos() const { return eos_; }
    bool add_bos_default() const { return add_bos_; }
    // End of generation: EOS, EOT (tokenizer.ggml.eot_token_id), EOM, and the control tokens
    // <|eot_id|>, <|eom_id|>, <|im_end|>, <|endoftext|>, <|end_of_text|>, <|end|>,
    // <end_of_turn>, <|return|>, <|call|> when the vocabulary has them as control tokens.
    bool is_eog(int32_t id) const;
    const std::string& token_text(int32_t id) const { return tokens_.at(id); }
    const std::string& pre() const { return pre_; }

protected:
    TokenizerKind kind_ = TokenizerKind::SPM;
    std::vector<std::string> tokens_;
    std::vector<int32_t> token_types_;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
    int32_t bos_ = -1, eos_ = -1, eot_ = -1, unk_ = -1;
    bool add_bos_ = false;
    std::string pre_;
    // SPM with tokenizer.ggml.add_space_prefix: encode prepends U+2581, decode drops the space
    // it becomes at the start of the text.
    bool add_space_prefix_ = false;
    std::vector<int32_t> eog_ids_;  // sorted: EOS, EOT, EOM and end-of-turn control tokens

    // The bytes of ids[i], without the prefix space when i is the text's first token.
    std::string piece_at(int32_t id, bool first_of_text) const;
    friend class StreamDecoder;
};

// Turns a stream of ids into text without ever emitting half a UTF-8 character: bytes of an
// incomplete character are held back until the rest arrives (or until flush()).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
    // Returns the text that is complete after this token (may be empty).
    std::string push(int32_t id);
    // Returns whatever is held back (invalid bytes become U+FFFD).
    std::string flush();

private:
    const Tokenizer& tok_;
    std::string pending_;
    bool first_ = true;
};

}  // namespace steward
