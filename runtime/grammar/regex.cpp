// Regular expression (a practical subset) -> GBNF: the whole output must match the pattern.
#include <cstdio>

#include "grammar/grammar.h"
#include "util/utf8.h"

namespace steward {

namespace {

std::string cp_escape(uint32_t cp) {
    char buf[16];
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == ' ' || cp == '_')
        return std::string(1, (char)cp);
    if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
    else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
    else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
    return buf;
}

// A one-character GBNF literal (built by appends: GCC 12 warns falsely on "\"" + s + "\"").
std::string quoted(uint32_t cp) {
    std::string out(1, '"');
    out += cp_escape(cp);
    out += '"';
    return out;
}

struct RegexParser {
    std::string_view src;
    size_t pos = 0;
    int depth = 0;  // open groups, bounded (hostile input must not exhaust the stack)
    // JSON string content mode: only characters a JSON string holds unescaped (not '"', '\\' or a
    // control below 0x20). Classes lose those characters; a literal needing an escape is an error.
    bool json_mode = false;

    static bool needs_json_escape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }
    // Ranges of a class, sorted and merged; in JSON mode minus the escaped characters.
    std::string class_text(std::vector<std::pair<uint32_t, uint32_t>> rs, bool negated, size_t at, Error* err) const {
        if (json_mode && negated) {
            rs.push_back({0, 0x1F});
            rs.push_back({'"', '"'});
            rs.push_back({'\\', '\\'});
        } else if (json_mode) {
            std::vector<std::pair<uint32_t, uint32_t>> kept;
            for (auto [lo, hi] : rs) {
                // Split [lo, hi] around the excluded points 0x00-0x1F, '"', '\\'.
                const std::pair<uint32_t, uint32_t> holes[] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
                uint32_t cur = lo;
                bool done = false;
                for (auto [hl, hh] : holes) {
                    if (hi < hl) break;
                    if (cur > hh) continue;
                    if (cur < hl) kept.push_back({cur, hl - 1});
                    if (hi <= hh) {
                        done = true;
                        break;
                    }
                    cur = hh + 1;
                }
                if (!done) kept.push_back({cur, hi});
            }
            rs = kept;
            if (rs.empty()) {
                *err = fail(at, "this character class holds only characters that a JSON string must escape ('\"', '\\\\', "
                                "controls); the pattern of a JSON Schema string may only use characters written unescaped");
                return "";
            }
        }
        std::string out = negated ? "[^" : "[";
        for (auto [lo, hi] : rs) out += lo == hi ? cp_escape(lo) : cp_escape(lo) + "-" + cp_escape(hi);
        return out + "]";
    }
    static void shorthand_ranges(char e, std::vector<std::pair<uint32_t, uint32_t>>& rs) {
        switch (e) {
            case 'd': rs.push_back({'0', '9'}); break;
            case 'w': rs.push_back({'0', '9'}); rs.push_back({'A', 'Z'}); rs.push_back({'_', '_'}); rs.push_back({'a', 'z'}); break;
            case 's': rs.push_back({'\t', '\r'}); rs.push_back({' ', ' '}); break;
            default: break;
        }
    }

    Error fail(size_t at, const std::string& what) const {
        return make_error("regex:", at + 1, ": ", what);
    }
    bool at_end() const { return pos >= src.size(); }
    char peek() const { return at_end() ? '\0' : src[pos]; }

    // The pattern's next character, read as the GBNF parser reads a literal (an ill-formed byte is
    // its own value).
    uint32_t next_cp() { return utf8::decode_loose(src, pos); }

    static Expected<uint32_t> simple_escape(char e) {
        switch (e) {
            case 'n': return uint32_t('\n');
            case 't': return uint32_t('\t');
            case 'r': return uint32_t('\r');
            case 'f': return uint32_t('\f');
            case 'v': return uint32_t('\v');
            case '0': return uint32_t(0);
            default:
                if (!((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))) return uint32_t(e);
                return make_error("");
        }
    }

    Expected<std::string> parse_class() {
        const size_t at = pos;
        ++pos;  // [
        bool negated = false;
        std::vector<std::pair<uint32_t, uint32_t>> rs;
        if (peek() == '^') {
            negated = true;
            ++pos;
        }
        bool first = true;
        while (at_end() || peek() != ']' || first) {
            if (at_end()) return fail(at, "character class is not closed; add ']'");
            first = false;
            uint32_t lo;
            if (peek() == '\\') {
                ++pos;
                if (at_end()) return fail(pos, "the pattern ends inside an escape; remove the trailing backslash");
                const char e = src[pos++];
                if (e == 'd' || e == 'w' || e == 's') {
                    shorthand_ranges(e, rs);
                    continue;
                }
                if (e == 'D' || e == 'W' || e == 'S')
                    return fail(pos - 2, std::string("\\") + e + " inside a class is not supported; list the characters instead");
                auto c = simple_escape(e);
                if (!c) return fail(pos - 2, std::string("unknown escape \\") + e + "; escape only punctuation");
                lo = *c;
            } else {
                lo = next_cp();
            }
            if (peek() == '-' && pos + 1 < src.size() && src[pos + 1] != ']') {
                ++pos;
                uint32_t hi;
                if (peek() == '\\') {
                    ++pos;
                    if (at_end()) return fail(pos, "the pattern ends inside an escape; remove the trailing backslash");
                    auto c = simple_escape(src[pos++]);
                    if (!c) return fail(pos - 2, "a range must end at a single character");
                    hi = *c;
                } else {
                    hi = next_cp();
                }
                if (hi < lo) return fail(at, "character range is reversed; write the lower end first, e.g. [a-z]");
                rs.push_back({lo, hi});
            } else {
                rs.push_back({lo, lo});
            }
        }
        ++pos;  // ]
        Error err;
        std::string out = class_text(std::move(rs), negated, at, &err);
        if (out.empty()) return err;
        return out;
    }

    // A one-character literal; in JSON mode refused when a JSON string would escape it.
    Expected<std::string> literal(uint32_t cp, size_t at) const {
        if (json_mode && needs_json_escape(cp))
            return fail(at, "the pattern matches '" + std::string(cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : "a control character") +
                                "', which a JSON string must escape; the pattern of a JSON Schema string may only use "
                                "characters written unescaped (remove it or match it with a class such as [^a])");
        return quoted(cp);
    }

    Expected<std::string> parse_atom() {
        const size_t at = pos;
        const char c = peek();
        if (c == '(') {
            ++pos;
            if (++depth > 256) return fail(at, "groups nest deeper than 256; simplify the pattern");
            if (src.substr(pos, 2) == "?:") pos += 2;
            else if (peek() == '?') return fail(pos, "only (?:...) groups are supported; remove the group flag");
            auto inner = parse_alt();
            if (!inner) return inner;
            if (peek() != ')') return fail(pos, "expected ')' to close the group opened at column " + std::to_string(at + 1));
            ++pos;
            --depth;
            return "(" + *inner + ")";
        }
        if (c == '[') return parse_class();
        if (c == '.') {
            ++pos;
            return std::string("[^\\n]");
        }
        if (c == '^' || c == '$')
            return fail(at, std::string("'") + c + "' is only supported at the start/end of the pattern (the match is always the whole output)");
        if (c == '*' || c == '+' || c == '?' || c == '{')
            return fail(at, std::string("'") + c + "' has nothing to repeat; escape it as \\" + c);
        if (c == '\\') {
            ++pos;
            if (at_end()) return fail(at, "the pattern ends inside an escape; remove the trailing backslash");
            const char e = src[pos++];
            if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
                std::vector<std::pair<uint32_t, uint32_t>> rs;
                shorthand_ranges(char(e | 0x20), rs);
                Error err;
                std::string out = class_text(std::move(rs), e < 'a', at, &err);
                if (out.empty()) return err;
                return out;
            }
            auto cp = simple_escape(e);
            if (!cp) return fail(at, std::string("unknown escape \\") + e + "; escape only punctuation, \\d \\w \\s and \\n \\t \\r");
            return literal(*cp, at);
        }
        return literal(next_cp(), at);
    }

    Expected<std::string> parse_concat() {
        std::string out;
        while (!at_end() && peek() != '|' && peek() != ')') {
            if (peek() == '$' && pos + 1 == src.size()) {
                ++pos;  // trailing anchor
                break;
            }
            auto a = parse_atom();
            if (!a) return a;
            std::string item = *a;
            while (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
                const size_t at = pos;
                std::string q;
                if (peek() == '{') {
                    const size_t close = src.find('}', pos);
                    if (close == std::string_view::npos) return fail(at, "expected '}' to close the repetition");
                    q = std::string(src.substr(pos, close - pos + 1));
                    uint64_t count = 0;  // each bound, checked here so the error points into the regex
                    for (char d : q.substr(1, q.size() - 2)) {
                        if (!(d >= '0' && d <= '9') && d != ',')
                            return fail(at, "a repetition is {m}, {m,} or {m,n} with numbers; escape '{' for a literal brace");
                        count = d == ',' ? 0 : count * 10 + uint64_t(d - '0');
                        if (count > k_max_repetition)
                            return fail(at, "repetition count above " + std::to_string(k_max_repetition) + "; use * or + instead");
                    }
                    pos = close + 1;
                } else {
                    q = std::string(1, src[pos++]);
                }
                if (peek() == '?') ++pos;  // lazy: the same language
                item = "(" + item + ")" + q;
            }
            out += (out.empty() ? "" : " ") + item;
        }
        return out;
    }

    Expected<std::string> parse_alt() {
        auto first = parse_concat();
        if (!first) return first;
        std::string out = *first;
        while (peek() == '|') {
            ++pos;
            auto next = parse_concat();
            if (!next) return next;
            out += " | " + *next;
        }
        return out;
    }
};

}  // namespace

Expected<std::string> regex_to_gbnf(std::string_view pattern) {
    RegexParser p{pattern};
    if (p.peek() == '^') ++p.pos;
    auto body = p.parse_alt();
    if (!body) return body.error();
    if (!p.at_end()) return p.fail(p.pos, "unexpected ')' with no group open; remove it or escape it as \\)");
    return "root ::= " + *body + "\n";
}

Expected<JsonStringPattern> regex_to_json_string_gbnf(std::string_view pattern) {
    JsonStringPattern out;
    RegexParser p{pattern};
    p.json_mode = true;
    if (p.peek() == '^') {
        ++p.pos;
        out.anchored_start = true;
    }
    // A trailing '$' is an anchor unless escaped (an odd run of backslashes before it).
    if (!pattern.empty() && pattern.back() == '$') {
        size_t n_bs = 0;
        for (size_t i = pattern.size() - 1; i-- > 0 && pattern[i] == '\\';) ++n_bs;
        out.anchored_end = n_bs % 2 == 0 && pattern.size() > (out.anchored_start ? 1u : 0u);
    }
    auto body = p.parse_alt();
    if (!body) return body.error();
    if (!p.at_end()) return p.fail(p.pos, "unexpected ')' with no group open; remove it or escape it as \\)");
    // An anchor binds to its alternative only ("^a|b" is "(^a)|(b)"): with a top-level '|' the
    // anchors would be read for the whole pattern, so such a pattern is refused.
    if (out.anchored_start || out.anchored_end) {
        int depth = 0;
        bool in_class = false;
        for (size_t i = 0; i < pattern.size(); ++i) {
            const char c = pattern[i];
            if (c == '\\') {
                ++i;
            } else if (in_class) {
                in_class = c != ']';
            } else if (c == '[') {
                in_class = true;
                if (i + 1 < pattern.size() && pattern[i + 1] == ']') ++i;
                else if (i + 2 < pattern.size() && pattern[i + 1] == '^' && pattern[i + 2] == ']') i += 2;
            } else if (c == '(') {
                ++depth;
            } else if (c == ')') {
                --depth;
            } else if (c == '|' && depth == 0) {
                return p.fail(i, "an anchored pattern with a top-level '|' is ambiguous here (an anchor binds to one "
                                 "alternative); group the alternatives, e.g. ^(?:a|b)$");
            }
        }
    }
    out.gbnf = body->empty() ? std::string("\"\"") : "(" + *body + ")";
    return out;
}

}  // namespace steward
