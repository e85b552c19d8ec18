// The tokenizer fuzz targets' shared body: encode the input with one real vocabulary and check what
// the tokenizer promises (tests/unit/model/test_tokenizer.cpp asserts the same on fixed texts):
// ids in range, decode(encode(x)) == x for any bytes (SPM: with U+2581 read as a space) (ill-formed UTF-8 comes back byte for byte),
// BOS first when asked for, and a StreamDecoder that never emits ill-formed UTF-8 and, for
// well-formed input, streams exactly the decoded text.
#pragma once
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "model/tokenizer.h"

namespace steward_fuzz {

inline void fail(const char* what, std::string_view input) {
    std::fprintf(stderr, "tokenizer invariant broken: %s (input of %zu bytes)\n", what, input.size());
    std::abort();
}

inline bool is_valid_utf8(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t i = 0, n = s.size();
    while (i < n) {
        unsigned char c = p[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; ++k)
            if ((p[i + k] & 0xC0) != 0x80) return false;
        if (c == 0xE0 && p[i + 1] < 0xA0) return false;
        if (c == 0xED && p[i + 1] > 0x9F) return false;
        if (c == 0xF0 && p[i + 1] < 0x90) return false;
        if (c == 0xF4 && p[i + 1] > 0x8F) return false;
        i += len;
    }
    return true;
}

inline std::unique_ptr<steward::Tokenizer> load_vocab(const char* name) {
    spdlog::set_level(spdlog::level::off);
    const std::string path = std::string(STEWARD_TESTDATA_DIR) + "/tokenizers/ggml-vocab-" + name + ".gguf";
    auto tok = steward::Tokenizer::load(path);
    if (!tok) {
        std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), tok.error().message.c_str());
        std::exit(2);
    }
    return std::move(*tok);
}

inline void check_tokenizer(const steward::Tokenizer& tok, const uint8_t* data, size_t size) {
    if (size > 4096) return;  // long inputs only slow the search down
    const std::string_view text(reinterpret_cast<const char*>(data), size);

    // SentencePiece writes a space as U+2581 and decodes U+2581 as a space (llama.cpp too), so a
    // U+2581 in the input comes back as a space: that is the round trip SPM promises.
    std::string expect(text);
    if (tok.kind() == steward::TokenizerKind::SPM)
        for (size_t at; (at = expect.find("\xE2\x96\x81")) != std::string::npos;) expect.replace(at, 3, " ");

    const auto ids = tok.encode(text, false);
    for (int32_t id : ids)
        if (id < 0 || id >= tok.n_vocab()) fail("encode gave an id out of range", text);
    if (tok.decode(ids) != expect) fail("decode(encode(x)) != x", text);

    const auto with_bos = tok.encode(text, true);
    if (tok.bos() >= 0 && (with_bos.empty() || with_bos.front() != tok.bos())) fail("add_bos did not put BOS first", text);
    if (tok.decode(with_bos) != expect) fail("decode(encode(x, add_bos)) != x", text);

    const auto special = tok.encode(text, false, true);
    for (int32_t id : special)
        if (id < 0 || id >= tok.n_vocab()) fail("encode with parse_special gave an id out of range", text);
    (void)tok.decode(special);

    steward::StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) {
        const std::string part = stream.push(id);
        if (!is_valid_utf8(part)) fail("StreamDecoder::push emitted ill-formed UTF-8", text);
        streamed += part;
    }
    const std::string rest = stream.flush();
    if (!is_valid_utf8(rest)) fail("StreamDecoder::flush emitted ill-formed UTF-8", text);
    streamed += rest;
    if (is_valid_utf8(text) && streamed != expect) fail("the stream of well-formed text differs from the text", text);
    // Ids the model may produce that the text never would: any id, in any order.
    steward::StreamDecoder raw(tok);
    for (size_t i = 0; i + 2 <= size && i < 64; i += 2) {
        const int32_t id = (int32_t)(((unsigned)data[i] << 8 | data[i + 1]) % (unsigned)tok.n_vocab());
        if (!is_valid_utf8(raw.push(id))) fail("StreamDecoder::push of arbitrary ids emitted ill-formed UTF-8", text);
    }
    if (!is_valid_utf8(raw.flush())) fail("StreamDecoder::flush of arbitrary ids emitted ill-formed UTF-8", text);
}

}  // namespace steward_fuzz
