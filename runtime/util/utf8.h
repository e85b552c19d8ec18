// UTF-8 for the whole runtime: decoding one character (strictly, by Unicode's well-formed byte
// sequences, or loosely, by the bit patterns), encoding a code point, and the byte classes that a
// decoder fed one byte at a time (the grammar matcher) needs. tests/unit/util/test_utf8.cpp holds it
// against glibc's iconv.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace steward::utf8 {

inline constexpr uint32_t k_max_code_point = 0x10FFFF;
inline constexpr uint32_t k_first_surrogate = 0xD800, k_last_surrogate = 0xDFFF;
inline constexpr std::string_view k_replacement_utf8 = "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER

constexpr bool is_surrogate(uint32_t cp) {
    return cp >= k_first_surrogate && cp <= k_last_surrogate;
}
// What a well-formed character may hold: U+0000-U+10FFFF less the surrogates.
constexpr bool is_scalar_value(uint32_t cp) {
    return cp <= k_max_code_point && !is_surrogate(cp);
}
constexpr bool is_continuation(unsigned char b) {
    return (b & 0xC0) == 0x80;
}

// The bytes of the well-formed character that byte b leads: 1 (b 0x00-0x7F), 2 (0xC2-0xDF),
// 3 (0xE0-0xEF) or 4 (0xF0-0xF4); 0 when b leads none (a continuation byte, 0xC0, 0xC1, 0xF5-0xFF).
constexpr int sequence_length(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xC2 ? 0 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF5 ? 4 : 0;
}
// The code point bits that lead byte b of an n-byte character carries.
constexpr uint32_t lead_bits(unsigned char b, int n) {
    return n <= 1 ? b : b & (0x7Fu >> n);
}
// The smallest code point an n-byte character may hold: anything below it is an overlong form.
constexpr uint32_t min_code_point(int n) {
    return n <= 1 ? 0 : n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
}

enum class Status : uint8_t {
    ok,         // a well-formed character
    truncated,  // the input ends inside a character: every byte to the end is a well-formed start
    invalid,    // no well-formed character starts here
};

struct Decoded {
    uint32_t cp;  // the code point when ok; 0 otherwise
    // ok: the character's bytes (1-4). truncated: the bytes left (1-3, all of them). invalid: the
    // maximal ill-formed subpart (1-3), the bytes one U+FFFD replaces in Unicode's recommended
    // practice (a bad lead byte alone; a good lead with its good continuations up to the bad byte).
    uint32_t len;
    Status status;
};

// Decodes the character at s[i] (i < s.size()) as Unicode's table of well-formed byte sequences
// (3-7) allows: no overlong form, no surrogate, nothing past U+10FFFF.
inline Decoded decode(std::string_view s, size_t i) {
    const auto c = (unsigned char)s[i];
    const int n = sequence_length(c);
    if (n == 1) return {c, 1, Status::ok};
    if (n == 0) return {0, 1, Status::invalid};
    uint32_t cp = lead_bits(c, n);
    for (int k = 1; k < n; ++k) {
        if (i + k >= s.size()) return {0, uint32_t(k), Status::truncated};
        const auto b = (unsigned char)s[i + k];
        unsigned char lo = 0x80, hi = 0xBF;
        if (k == 1) {  // the second byte's range is what excludes overlongs, surrogates and > U+10FFFF
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        }
        if (b < lo || b > hi) return {0, uint32_t(k), Status::invalid};
        cp = (cp << 6) | (b & 0x3F);
    }
    return {cp, uint32_t(n), Status::ok};
}

// Decodes the character at s[i] (i < s.size()) by its bit pattern alone and moves i past it: a lead
// byte 0xC0-0xF7 and its continuation bytes give their code point even when overlong, a surrogate or
// past U+10FFFF (up to 0x1FFFFF), so that text holding a lone surrogate (a Python string's, in the
// chat template engine) reads back as encode wrote it. Any other byte, or a lead byte whose
// continuation bytes are missing or cut off by the end, is one character: the byte's own value.
inline uint32_t decode_loose(std::string_view s, size_t& i) {
    const auto c = (unsigned char)s[i];
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n == 1 || i + n > s.size()) {
        ++i;
        return c;
    }
    uint32_t cp = lead_bits(c, n);
    for (int k = 1; k < n; ++k) {
        const auto b = (unsigned char)s[i + k];
        if (!is_continuation(b)) {
            ++i;
            return c;
        }
        cp = (cp << 6) | (b & 0x3F);
    }
    i += n;
    return cp;
}

// Appends the shortest UTF-8 form of cp (cp <= 0x1FFFFF). Not checked: a surrogate is written as its
// three bytes, which decode_loose reads back and decode refuses.
inline void encode(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

// The offset of the first byte that does not start a well-formed character (a cut-off one at the end
// included); npos when all of s is well-formed UTF-8.
inline size_t invalid_at(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const Decoded d = decode(s, i);
        if (d.status != Status::ok) return i;
        i += d.len;
    }
    return std::string_view::npos;
}

}  // namespace steward::utf8
