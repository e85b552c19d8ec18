// util/utf8.h against glibc's iconv(3): every code point's encoding, the strict decoder over every
// 1-2 byte input and the 3-4 byte inputs around each lead byte's edges (overlongs, surrogates, past
// U+10FFFF, truncated sequences, stray continuation bytes), and the loose decoder's bit patterns.
#include <iconv.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "util/utf8.h"

using namespace steward;

namespace {

// One iconv(3) conversion descriptor, reset before each call.
class Iconv {
public:
    Iconv(const char* to, const char* from) : cd_(iconv_open(to, from)) {
        if (cd_ == (iconv_t)-1) FAIL("iconv_open(" << to << ", " << from << ") failed: is glibc's gconv installed?");
    }
    ~Iconv() { iconv_close(cd_); }
    Iconv(const Iconv&) = delete;
    Iconv& operator=(const Iconv&) = delete;
    // Converts all of in; false when iconv refuses any of it (EILSEQ, EINVAL).
    bool convert(const std::string& in, std::string& out) {
        iconv(cd_, nullptr, nullptr, nullptr, nullptr);
        out.assign(in.size() * 4 + 16, '\0');
        char* ip = const_cast<char*>(in.data());
        size_t il = in.size();
        char* op = out.data();
        size_t ol = out.size();
        if (iconv(cd_, &ip, &il, &op, &ol) == (size_t)-1) return false;
        out.resize(out.size() - ol);
        return il == 0;
    }

private:
    iconv_t cd_;
};

std::string utf32le(uint32_t cp) {
    std::string s(4, '\0');
    for (int k = 0; k < 4; ++k) s[k] = char((cp >> (8 * k)) & 0xFF);
    return s;
}

std::string hex(const std::string& s) {
    std::string out;
    char b[4];
    for (unsigned char c : s) {
        std::snprintf(b, sizeof b, "%02X ", c);
        out += b;
    }
    return out;
}

// The bytes of s[0, k) with k in the top bits: a key no other byte string shares.
uint64_t key(const std::string& s, size_t k) {
    uint64_t v = k;
    for (size_t j = 0; j < k; ++j) v = v << 8 | (unsigned char)s[j];
    return v << (8 * (4 - k));
}

// iconv's UTF-8 of every code point it accepts (U+0000-U+10FFFF less the surrogates, if iconv is
// right), and from it the whole well-formed characters (UTF-8 is a prefix code: a byte string is
// one iff it is one of these) and their starts (the proper prefixes of these).
struct Reference {
    std::vector<std::string> utf8_of;              // by code point, 0..0x10FFFF + 16; "" where iconv refused
    std::unordered_map<uint64_t, uint32_t> cp_of;  // key(a character's bytes) -> its code point
    std::unordered_set<uint64_t> starts;           // key(a proper prefix of a character)

    Reference() {
        Iconv to_utf8("UTF-8", "UTF-32LE");
        utf8_of.resize(0x110010);
        cp_of.reserve(0x110000);
        std::string out;
        for (uint32_t cp = 0; cp < utf8_of.size(); ++cp) {
            if (!to_utf8.convert(utf32le(cp), out)) continue;
            utf8_of[cp] = out;
            cp_of.emplace(key(out, out.size()), cp);
            for (size_t k = 1; k < out.size(); ++k) starts.insert(key(out, k));
        }
    }
    // What a strict decoder must say about s (the whole input): the prefix that is a whole
    // character (ok), else the longest that starts one: all of s, truncated; else invalid, that
    // start (at least one byte) being the maximal ill-formed subpart.
    utf8::Decoded expect(const std::string& s) const {
        for (size_t k = 1; k <= std::min<size_t>(s.size(), 4); ++k)
            if (auto it = cp_of.find(key(s, k)); it != cp_of.end()) return {it->second, (uint32_t)k, utf8::Status::ok};
        size_t k = 0;
        while (k < std::min<size_t>(s.size(), 3) && starts.count(key(s, k + 1))) ++k;
        if (k == s.size()) return {0, (uint32_t)k, utf8::Status::truncated};
        return {0, (uint32_t)std::max<size_t>(k, 1), utf8::Status::invalid};
    }
};

Reference& reference() {
    static Reference r;
    return r;
}

const char* status_name(utf8::Status s) {
    return s == utf8::Status::ok ? "ok" : s == utf8::Status::truncated ? "truncated" : "invalid";
}

// Compares decode(s) with the reference, at offset 0 of s and at offset 2 after two ASCII bytes,
// and decoding all of s with iconv's decoder (both accept it, with the same code points, or both
// refuse it); counts mismatches and reports the first few.
struct StrictCheck {
    size_t n_checked = 0, n_bad = 0;
    Iconv to_utf32{"UTF-32LE", "UTF-8"};
    std::string u32;
    std::vector<uint32_t> cps;

    void operator()(const std::string& s) {
        const bool iconv_ok = to_utf32.convert(s, u32);
        bool ok = true;
        cps.clear();
        for (size_t i = 0; i < s.size() && ok;) {
            const utf8::Decoded d = utf8::decode(s, i);
            ok = d.status == utf8::Status::ok;
            cps.push_back(d.cp);
            i += d.len;
        }
        bool same = ok == iconv_ok && (!ok || u32.size() == 4 * cps.size());
        for (size_t j = 0; same && ok && j < cps.size(); ++j)
            same = cps[j] == ((unsigned char)u32[4 * j] | (unsigned char)u32[4 * j + 1] << 8 |
                              (unsigned char)u32[4 * j + 2] << 16 | (uint32_t)(unsigned char)u32[4 * j + 3] << 24);
        if (!same && ++n_bad <= 8)
            FAIL_CHECK("decoding " << hex(s) << (ok ? "succeeds" : "fails") << " (" << cps.size()
                                   << " characters); iconv's " << (iconv_ok ? "succeeds: " + hex(u32) : "fails"));

        const utf8::Decoded want = reference().expect(s);
        for (const std::string& text : {s, "ab" + s}) {
            const size_t at = text.size() - s.size();
            const utf8::Decoded got = utf8::decode(text, at);
            ++n_checked;
            if (got.status == want.status && got.len == want.len && got.cp == want.cp) continue;
            if (++n_bad <= 8)
                FAIL_CHECK("decode(" << hex(s) << "at " << at << ") = " << status_name(got.status) << " len " << got.len
                                     << " cp " << got.cp << "; iconv says " << status_name(want.status) << " len "
                                     << want.len << " cp " << want.cp);
        }
    }
};

// The loose decoder by its definition: the count of leading one bits n of the lead byte (2-4) and n-1
// continuation bytes make a character of n bytes, whatever its value; anything else is one byte.
uint32_t loose_by_definition(const std::string& s, size_t& i) {
    const auto c = (unsigned char)s[i];
    const int n = std::countl_one(c);
    bool whole = n >= 2 && n <= 4 && i + n <= s.size();
    for (int k = 1; whole && k < n; ++k) whole = ((unsigned char)s[i + k] >> 6) == 2;
    if (!whole) return ++i, c;
    uint32_t cp = c & ((1u << (7 - n)) - 1);
    for (int k = 1; k < n; ++k) cp = cp * 64 + ((unsigned char)s[i + k] - 0x80);
    i += n;
    return cp;
}

// Bytes at the edges of every range in Unicode's table of well-formed sequences, plus ASCII.
const std::vector<unsigned char> k_edge_bytes = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1,
                                                 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xF7, 0xF8, 0xFF};

}  // namespace

TEST_CASE("utf8::encode writes iconv's UTF-8 for every scalar value, surrogates as their three bytes", "[utf8]") {
    Reference& ref = reference();
    size_t n_bad = 0, n_scalar = 0;
    std::string got;
    for (uint32_t cp = 0; cp < ref.utf8_of.size(); ++cp) {
        const bool scalar = !ref.utf8_of[cp].empty();
        n_scalar += scalar;
        if (scalar != utf8::is_scalar_value(cp) && ++n_bad <= 8)
            FAIL_CHECK("is_scalar_value(" << cp << ") = " << !scalar << ", iconv " << (scalar ? "encodes" : "refuses")
                                          << " it");
        if (!scalar) continue;
        got.clear();
        utf8::encode(cp, got);
        if (got != ref.utf8_of[cp] && ++n_bad <= 8)
            FAIL_CHECK("encode(" << cp << ") = " << hex(got) << "; iconv: " << hex(ref.utf8_of[cp]));
    }
    CHECK(n_bad == 0);
    CHECK(n_scalar == 0x110000 - 0x800);  // iconv itself: every code point but the 2048 surrogates
    got.clear();
    utf8::encode(0xD800, got);
    utf8::encode(0xDFFF, got);
    CHECK(got == "\xED\xA0\x80\xED\xBF\xBF");
}

TEST_CASE("utf8 byte classes agree with iconv's encodings", "[utf8]") {
    Reference& ref = reference();
    std::vector<int> length_of_lead(256, 0);  // the lengths of the encodings each byte leads
    std::vector<uint32_t> min_cp_of_length(5, UINT32_MAX);
    size_t n_continuations = 0, n_lead_continuations = 0;
    for (uint32_t cp = 0; cp < ref.utf8_of.size(); ++cp) {
        const std::string& s = ref.utf8_of[cp];
        if (s.empty()) continue;
        length_of_lead[(unsigned char)s[0]] = (int)s.size();
        min_cp_of_length[s.size()] = std::min(min_cp_of_length[s.size()], cp);
        for (size_t k = 1; k < s.size(); ++k) n_lead_continuations += utf8::is_continuation(s[k]);
        n_continuations += s.size() - 1;
    }
    CHECK(n_lead_continuations == n_continuations);
    for (int b = 0; b < 256; ++b) {
        INFO("byte " << b);
        CHECK(utf8::sequence_length((unsigned char)b) == length_of_lead[b]);
        CHECK(utf8::is_continuation((unsigned char)b) == (b >= 0x80 && b <= 0xBF));
    }
    for (int n = 1; n <= 4; ++n) CHECK(utf8::min_code_point(n) == min_cp_of_length[n]);
    // lead_bits: the lead byte's share of each length's first and last code point.
    CHECK(utf8::lead_bits(0xC2, 2) == (0x80u >> 6));
    CHECK(utf8::lead_bits(0xDF, 2) == (0x7FFu >> 6));
    CHECK(utf8::lead_bits(0xE0, 3) == (0x800u >> 12));
    CHECK(utf8::lead_bits(0xEF, 3) == (0xFFFFu >> 12));
    CHECK(utf8::lead_bits(0xF0, 4) == (0x10000u >> 18));
    CHECK(utf8::lead_bits(0xF4, 4) == (0x10FFFFu >> 18));
    CHECK(utf8::lead_bits('A', 1) == 'A');
}

TEST_CASE("utf8::decode agrees with iconv on every 1-2 byte input", "[utf8]") {
    StrictCheck check;
    for (int a = 0; a < 256; ++a) {
        check(std::string(1, char(a)));
        for (int b = 0; b < 256; ++b) check(std::string{char(a), char(b)});
    }
    CHECK(check.n_bad == 0);
    CHECK(check.n_checked == 2 * (256 + 65536));
}

TEST_CASE("utf8::decode agrees with iconv on 3-4 byte inputs around every lead byte's edges", "[utf8]") {
    StrictCheck check;
    // Every lead byte, then edge bytes: each 3-byte lead's second-byte range (overlongs under E0 A0,
    // surrogates at ED A0-BF), each 4-byte lead's (F0 80-8F overlong, F4 90+ past U+10FFFF, F5+
    // never), and truncated, stray or missing third and fourth bytes.
    for (int a = 0xC0; a < 0x100; ++a)
        for (unsigned char b : k_edge_bytes)
            for (unsigned char c : k_edge_bytes) {
                check(std::string{char(a), char(b), char(c)});
                for (unsigned char d : k_edge_bytes) check(std::string{char(a), char(b), char(c), char(d)});
            }
    // Every third byte behind the 3-byte leads' edges, and every fourth behind the 4-byte leads'.
    for (int a : {0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF})
        for (int b : {0x80, 0x9F, 0xA0, 0xBF})
            for (int c = 0; c < 256; ++c) check(std::string{char(a), char(b), char(c)});
    for (int a : {0xF0, 0xF1, 0xF3, 0xF4})
        for (int b : {0x80, 0x8F, 0x90, 0xBF})
            for (int d = 0; d < 256; ++d) check(std::string{char(a), char(b), char(0x80), char(d)});
    CHECK(check.n_bad == 0);
}

TEST_CASE("utf8::decode reads back every code point iconv encodes", "[utf8]") {
    Reference& ref = reference();
    size_t n_bad = 0;
    for (uint32_t cp = 0; cp < ref.utf8_of.size(); ++cp) {
        const std::string& s = ref.utf8_of[cp];
        if (s.empty()) continue;
        const utf8::Decoded d = utf8::decode(s, 0);
        if ((d.status != utf8::Status::ok || d.cp != cp || d.len != s.size()) && ++n_bad <= 8)
            FAIL_CHECK("decode(" << hex(s) << ") = " << status_name(d.status) << " cp " << d.cp << ", iconv: " << cp);
    }
    CHECK(n_bad == 0);
}

TEST_CASE("utf8::decode's invalid lengths are Unicode's maximal subparts (its U+FFFD example)", "[utf8]") {
    // Unicode 15, section 3.9, table 3-8: "61 F1 80 80 E1 80 C2 62 80 63 80 BF 64" decodes to
    // a, FFFD (F1 80 80), FFFD (E1 80), FFFD (C2), b, FFFD, c, FFFD, FFFD, d.
    const std::string s = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    std::string out;
    for (size_t i = 0; i < s.size();) {
        const utf8::Decoded d = utf8::decode(s, i);
        REQUIRE(d.len >= 1);
        out += d.status == utf8::Status::ok ? std::string(1, char(d.cp)) : std::string("?");
        i += d.len;
    }
    CHECK(out == "a???b?c??d");
}

TEST_CASE("utf8::decode_loose: iconv's code points on well-formed text, bit patterns beyond", "[utf8]") {
    Reference& ref = reference();
    size_t n_bad = 0;
    std::string all;
    std::vector<uint32_t> want;
    for (uint32_t cp = 0; cp < ref.utf8_of.size(); ++cp)
        if (!ref.utf8_of[cp].empty()) all += ref.utf8_of[cp], want.push_back(cp);
    size_t i = 0, k = 0;
    while (i < all.size() && k < want.size()) n_bad += utf8::decode_loose(all, i) != want[k++];
    CHECK(n_bad == 0);
    CHECK(i == all.size());
    CHECK(k == want.size());

    // Written by hand: surrogates, overlongs and past U+10FFFF decode by their bits; a byte that
    // leads nothing, a truncated character or a missing continuation byte is one byte, its value.
    const std::vector<std::pair<std::string, std::vector<uint32_t>>> cases = {
        {"\xED\xA0\x80\xED\xBF\xBF", {0xD800, 0xDFFF}},
        {"\xC0\x80\xC1\xBF\xE0\x80\x80\xF0\x80\x80\x80", {0, 0x7F, 0, 0}},
        {"\xF4\x90\x80\x80\xF7\xBF\xBF\xBF", {0x110000, 0x1FFFFF}},
        {"\x80\xBF\xF8\xFF", {0x80, 0xBF, 0xF8, 0xFF}},
        {"\xE2\x82", {0xE2, 0x82}},
        {"\xC3\x41\xE2\x82\x42", {0xC3, 'A', 0xE2, 0x82, 'B'}},
    };
    for (const auto& [s, cps] : cases) {
        INFO(hex(s));
        std::vector<uint32_t> got;
        for (size_t j = 0; j < s.size();) got.push_back(utf8::decode_loose(s, j));
        CHECK(got == cps);
    }

    // Every input of edge bytes up to 4 long, against the definition written another way.
    size_t n_checked = 0;
    n_bad = 0;
    std::string s;
    const auto walk = [&](const std::string& text) {
        size_t a = 0, b = 0;
        while (a < text.size()) {
            const uint32_t x = utf8::decode_loose(text, a), y = loose_by_definition(text, b);
            ++n_checked;
            if ((x != y || a != b) && ++n_bad <= 8)
                FAIL_CHECK("decode_loose(" << hex(text) << ") = " << x << ", want " << y);
            if (a != b) return;
        }
    };
    for (unsigned char a : k_edge_bytes)
        for (unsigned char b : k_edge_bytes)
            for (unsigned char c : k_edge_bytes)
                for (unsigned char d : k_edge_bytes) {
                    walk(std::string{char(a)});
                    walk(std::string{char(a), char(b)});
                    walk(std::string{char(a), char(b), char(c)});
                    walk(std::string{char(a), char(b), char(c), char(d)});
                }
    CHECK(n_bad == 0);
    CHECK(n_checked > 0);

    // encode then decode_loose gives every value up to 0x1FFFFF back.
    n_bad = 0;
    for (uint32_t cp = 0; cp <= 0x1FFFFF; ++cp) {
        s.clear();
        utf8::encode(cp, s);
        size_t j = 0;
        n_bad += utf8::decode_loose(s, j) != cp || j != s.size();
    }
    CHECK(n_bad == 0);
}
