// The Jinja interpreter: a lexer (whitespace control, trim_blocks + lstrip_blocks), a recursive
// descent parser into a small AST, and a tree-walking evaluator over Python-like values. Where
// Python's jinja2 (as transformers sets it up) would raise, this returns an Error.
#include "template/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

#include "util/utf8.h"

namespace steward::jinja {

// ============================================================================ values

struct List;
struct Dict;
struct Callable;

enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Func };

struct Value {
    Type t = Type::Undefined;
    bool tuple = false;  // a List written as a tuple (Python repr "(1, 2)")
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::shared_ptr<const std::string> s;  // String; Undefined: what was missing (for messages)
    std::shared_ptr<List> l;
    std::shared_ptr<Dict> d;  // Dict and Namespace
    std::shared_ptr<Callable> fn;

    static Value none() { Value v; v.t = Type::None; return v; }
    static Value boolean(bool x) { Value v; v.t = Type::Bool; v.b = x; return v; }
    static Value integer(int64_t x) { Value v; v.t = Type::Int; v.i = x; return v; }
    static Value number(double x) { Value v; v.t = Type::Float; v.f = x; return v; }
    static Value str(std::string x) {
        Value v;
        v.t = Type::String;
        v.s = std::make_shared<const std::string>(std::move(x));
        return v;
    }
    static Value undefined(std::string what) {
        Value v;
        v.s = std::make_shared<const std::string>(std::move(what));
        return v;
    }
    const std::string& sv() const { return *s; }
    bool is_str() const { return t == Type::String; }
    bool is_num() const { return t == Type::Int || t == Type::Float || t == Type::Bool; }
    bool is_int() const { return t == Type::Int || t == Type::Bool; }
    int64_t as_int() const { return t == Type::Bool ? (int64_t)b : i; }
    double as_float() const { return t == Type::Float ? f : (double)as_int(); }
};

struct List {
    std::vector<Value> items;
    int depth = 1;
    bool has_ns = false;
};
struct Dict {
    std::vector<std::pair<Value, Value>> items;
    int depth = 1;
    bool has_ns = false;
};

struct CallArgs {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* kwarg(const std::string& name) const {
        for (auto& [k, v] : kw)
            if (k == name) return &v;
        return nullptr;
    }
};

class Renderer;
struct Callable {
    std::string name;
    std::function<Expected<Value>(Renderer&, CallArgs&)> fn;
};

constexpr int k_max_value_depth = 256;

static int depth_of(const Value& v) {
    if (v.t == Type::List) return v.l->depth;
    if (v.t == Type::Dict) return v.d->depth;
    if (v.t == Type::Namespace) return 1;
    return 0;
}
static bool has_ns_of(const Value& v) {
    if (v.t == Type::Namespace) return true;
    if (v.t == Type::List) return v.l->has_ns;
    if (v.t == Type::Dict) return v.d->has_ns;
    return false;
}

static const char* type_name(const Value& v) {
    switch (v.t) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List: return v.tuple ? "tuple" : "list";
    case Type::Dict: return "dict";
    case Type::Namespace: return "Namespace";
    case Type::Func: return "function";
    }
    return "?";
}

// ============================================================================ UTF-8 helpers

// Code points are read with utf8::decode_loose: a lone surrogate reads back as itself (Python strings
// hold them: "\ud800"|length is 1) and an invalid byte is one code point, the byte's value.
static bool is_ascii(const std::string& s) {
    for (unsigned char c : s)
        if (c >= 0x80) return false;
    return true;
}
// Byte offsets of each code point (plus the end), for indexing and slicing by code point as Python.
static std::vector<size_t> cp_offsets(const std::string& s) {
    std::vector<size_t> o;
    size_t i = 0;
    while (i < s.size()) {
        o.push_back(i);
        utf8::decode_loose(s, i);
    }
    o.push_back(s.size());
    return o;
}
static size_t cp_length(const std::string& s) {
    if (is_ascii(s)) return s.size();
    size_t n = 0, i = 0;
    while (i < s.size()) {
        utf8::decode_loose(s, i);
        n++;
    }
    return n;
}
// Python's str.isspace() code points.
static bool is_py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// ============================================================================ Python str() / repr()

static std::string float_repr(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
    std::string sci(buf, r.ptr);  // d.ddde[+-]XX
    size_t e = sci.find('e');
    std::string mant = sci.substr(0, e);
    int exp = std::atoi(sci.c_str() + e + 1);
    bool neg = mant[0] == '-';
    if (neg) mant.erase(0, 1);
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    std::string out = neg ? "-" : "";
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out += "0." + std::string(-exp - 1, '0') + digits;
        } else if ((int)digits.size() <= exp + 1) {
            out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
}

static std::string str_repr(const std::string& s) {
    bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
    char q = has_sq && !has_dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == q || c == '\\') {
            out += '\\';
            out += (char)c;
        } else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else out += (char)c;
    }
    out += q;
    return out;
}

// A repr is cut short past this size (the render's output limit + 1): the caller's size check then
// fails, instead of a list holding one huge string many times being printed in full.
thread_local size_t t_repr_cap = 16u << 20;

static void append_repr(std::string& out, const Value& v);
static void append_str(std::string& out, const Value& v) {
    switch (v.t) {
    case Type::Undefined: return;
    case Type::None: out += "None"; return;
    case Type::Bool: out += v.b ? "True" : "False"; return;
    case Type::Int: out += std::to_string(v.i); return;
    case Type::Float: out += float_repr(v.f); return;
    case Type::String: out += v.sv(); return;
    default: append_repr(out, v);
    }
}
static void append_repr(std::string& out, const Value& v) {
    if (out.size() > t_repr_cap) return;
    switch (v.t) {
    case Type::String: out += str_repr(v.sv()); return;
    case Type::List: {
        out += v.tuple ? '(' : '[';
        for (size_t k = 0; k < v.l->items.size() && out.size() <= t_repr_cap; k++) {
            if (k) out += ", ";
            append_repr(out, v.l->items[k]);
        }
        if (v.tuple && v.l->items.size() == 1) out += ',';
        out += v.tuple ? ')' : ']';
        return;
    }
    case Type::Dict:
    case Type::Namespace: {
        if (v.t == Type::Namespace) out += "<Namespace ";
        out += '{';
        for (size_t k = 0; k < v.d->items.size() && out.size() <= t_repr_cap; k++) {
            if (k) out += ", ";
            append_repr(out, v.d->items[k].first);
            out += ": ";
            append_repr(out, v.d->items[k].second);
        }
        out += '}';
        if (v.t == Type::Namespace) out += '>';
        return;
    }
    case Type::Func: out += "<function " + v.fn->name + ">"; return;
    default: append_str(out, v);
    }
}
static std::string to_str(const Value& v) {
    if (v.t == Type::String) return v.sv();
    std::string s;
    append_str(s, v);
    return s;
}

// ============================================================================ equality, order, truth

static bool truthy(const Value& v) {
    switch (v.t) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return v.b;
    case Type::Int: return v.i != 0;
    case Type::Float: return v.f != 0;
    case Type::String: return !v.sv().empty();
    case Type::List: return !v.l->items.empty();
    case Type::Dict: return !v.d->items.empty();
    default: return true;
    }
}

static bool equal(const Value& a, const Value& b) {
    if (a.is_num() && b.is_num()) {
        if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
        return a.as_float() == b.as_float();
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case Type::Undefined:
    case Type::None: return true;
    case Type::String: return a.sv() == b.sv();
    case Type::List:
        if (a.tuple != b.tuple || a.l->items.size() != b.l->items.size()) return false;
        for (size_t k = 0; k < a.l->items.size(); k++)
            if (!equal(a.l->items[k], b.l->items[k])) return false;
        return true;
    case Type::Dict: {
        if (a.d->items.size() != b.d->items.size()) return false;
        for (auto& [k, v] : a.d->items) {
            bool found = false;
            for (auto& [k2, v2] : b.d->items)
                if (equal(k, k2)) {
                    if (!equal(v, v2)) return false;
                    found = true;
                    break;
                }
            if (!found) return false;
        }
        return true;
    }
    case Type::Namespace: return a.d == b.d;
    case Type::Func: return a.fn == b.fn;
    default: return false;
    }
}

static const Value* dict_find(const Dict& d, const Value& key) {
    for (auto& [k, v] : d.items)
        if (equal(k, key)) return &v;
    return nullptr;
}
static const Value* dict_find(const Dict& d, const std::string& key) {
    for (auto& [k, v] : d.items)
        if (k.t == Type::String && k.sv() == key) return &v;
    return nullptr;
}

// ============================================================================ lexer

enum class Tok : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
    Tok kind;
    std::string text;  // Text: the text; Name/Op: the name or operator; String: the decoded string
    int64_t i = 0;
    double f = 0;
    size_t pos = 0;  // byte offset in the source
};

struct SourceMap {
    std::vector<size_t> line_starts{0};
    explicit SourceMap(const std::string& src) {
        for (size_t k = 0; k < src.size(); k++)
            if (src[k] == '\n') line_starts.push_back(k + 1);
    }
    std::string where(size_t pos) const {
        size_t line = std::upper_bound(line_starts.begin(), line_starts.end(), pos) - line_starts.begin();
        size_t col = pos - line_starts[line - 1] + 1;
        return "line " + std::to_string(line) + ", column " + std::to_string(col);
    }
};

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_name_start(char c) { return std::isalpha((unsigned char)c) || c == '_'; }
static bool is_name_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

class Lexer {
public:
    Lexer(const std::string& src, const SourceMap& map) : src_(src), map_(map) {}

    Expected<std::vector<Token>> run() {
        size_t pos = 0;
        bool line_starting = true;
        bool strip_next = false;  // the previous tag ended with '-': drop the whitespace that follows
        while (pos <= src_.size()) {
            size_t open = find_open(pos);
            std::string text = src_.substr(pos, (open == std::string::npos ? src_.size() : open) - pos);
            if (strip_next) {
                size_t k = 0;
                while (k < text.size() && is_ws(text[k])) k++;
                text.erase(0, k);
                strip_next = false;
            }
            if (open == std::string::npos) {
                push_text(text, pos);
                break;
            }
            char kind = src_[open + 1];  // '{', '%' or '#'
            char mod = open + 2 < src_.size() ? src_[open + 2] : 0;
            if (mod == '-') {
                size_t k = text.size();
                while (k > 0 && is_ws(text[k - 1])) k--;
                text.erase(k);
            } else if (mod != '+' && kind != '{') {
                // lstrip_blocks: whitespace alone between the line's start and a block or comment tag.
                size_t l_pos = text.rfind('\n');
                l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
                if (l_pos > 0 || line_starting) {
                    bool only_ws = true;
                    for (size_t k = l_pos; k < text.size(); k++)
                        if (text[k] != ' ' && text[k] != '\t') only_ws = false;
                    if (only_ws) text.erase(l_pos);
                }
            }
            push_text(text, pos);
            size_t p = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
            std::string end_seen;
            if (kind == '#') {
                size_t e = src_.find("#}", p);
                if (e == std::string::npos) return make_error(map_.where(open), ": comment '{#' is never closed with '#}'");
                bool minus = e > p && src_[e - 1] == '-';
                bool plus = e > p && src_[e - 1] == '+';
                pos = e + 2;
                if (minus) strip_next = true;
                else if (!plus && pos < src_.size() && src_[pos] == '\n') pos++;
                line_starting = src_[pos - 1] == '\n';
                continue;
            }
            if (kind == '%') {
                // {% raw %} ... {% endraw %}: the body is text, untouched.
                size_t q = p;
                while (q < src_.size() && is_ws(src_[q])) q++;
                if (src_.compare(q, 3, "raw") == 0 && (q + 3 >= src_.size() || !is_name_char(src_[q + 3]))) {
                    size_t r = q + 3;
                    while (r < src_.size() && is_ws(src_[r])) r++;
                    bool minus = src_.compare(r, 3, "-%}") == 0;
                    if (minus || src_.compare(r, 2, "%}") == 0) {
                        auto done = lex_raw(open, r + (minus ? 3 : 2), minus, pos, line_starting, strip_next);
                        if (!done) return done.error();
                        continue;
                    }
                }
            }
            tokens_.push_back(Token{kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, open});
            auto r = lex_tag(p, kind == '{');
            if (!r) return r.error();
            pos = *r;
            // lex_tag leaves pos after the end marker, with `end_mod` telling what it was.
            if (end_mod_ == '-') strip_next = true;
            else if (kind == '%' && end_mod_ != '+' && pos < src_.size() && src_[pos] == '\n') pos++;
            line_starting = pos > 0 && src_[pos - 1] == '\n';
        }
        tokens_.push_back(Token{Tok::End, "", 0, 0, src_.size()});
        return std::move(tokens_);
    }

private:
    const std::string& src_;
    const SourceMap& map_;
    std::vector<Token> tokens_;
    char end_mod_ = 0;

    size_t find_open(size_t pos) const {
        while (true) {
            size_t k = src_.find('{', pos);
            if (k == std::string::npos || k + 1 >= src_.size()) return std::string::npos;
            char c = src_[k + 1];
            if (c == '{' || c == '%' || c == '#') return k;
            pos = k + 1;
        }
    }
    void push_text(std::string& text, size_t pos) {
        if (!text.empty()) tokens_.push_back(Token{Tok::Text, std::move(text), 0, 0, pos});
    }

    Expected<bool> lex_raw(size_t open, size_t body, bool strip_body_start, size_t& pos, bool& line_starting,
                           bool& strip_next) {
        size_t k = body;
        while (true) {
            size_t e = src_.find("{%", k);
            if (e == std::string::npos) return make_error(map_.where(open), ": '{% raw %}' is never closed with '{% endraw %}'");
            size_t q = e + 2;
            bool minus_open = q < src_.size() && src_[q] == '-';
            if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) q++;
            while (q < src_.size() && is_ws(src_[q])) q++;
            if (src_.compare(q, 6, "endraw") != 0) {
                k = e + 2;
                continue;
            }
            q += 6;
            while (q < src_.size() && is_ws(src_[q])) q++;
            bool minus_close = src_.compare(q, 3, "-%}") == 0;
            if (!minus_close && src_.compare(q, 2, "%}") != 0) {
                k = e + 2;
                continue;
            }
            std::string text = src_.substr(body, e - body);
            if (strip_body_start) {
                size_t s = 0;
                while (s < text.size() && is_ws(text[s])) s++;
                text.erase(0, s);
            }
            if (minus_open) {
                size_t s = text.size();
                while (s > 0 && is_ws(text[s - 1])) s--;
                text.erase(s);
            }
            push_text(text, body);
            pos = q + (minus_close ? 3 : 2);
            if (minus_close) strip_next = true;
            else if (pos < src_.size() && src_[pos] == '\n') pos++;
            line_starting = src_[pos - 1] == '\n';
            return true;
        }
    }

    // Tokens of one tag from p; returns the position after its end marker.
    Expected<size_t> lex_tag(size_t p, bool is_var) {
        std::vector<char> brackets;
        while (true) {
            while (p < src_.size() && is_ws(src_[p])) p++;
            if (p >= src_.size())
                return make_error(map_.where(p), ": the tag is never closed with '", is_var ? "}}" : "%}", "'");
            if (brackets.empty()) {
                const char* close = is_var ? "}}" : "%}";
                if (src_.compare(p, 2, close) == 0) {
                    end_mod_ = 0;
                    tokens_.push_back(Token{is_var ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, p});
                    return p + 2;
                }
                if ((src_[p] == '-' || (!is_var && src_[p] == '+')) && src_.compare(p + 1, 2, close) == 0) {
                    end_mod_ = src_[p];
                    tokens_.push_back(Token{is_var ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, p});
                    return p + 3;
                }
            }
            char c = src_[p];
            size_t start = p;
            if (is_name_start(c)) {
                while (p < src_.size() && is_name_char(src_[p])) p++;
                tokens_.push_back(Token{Tok::Name, src_.substr(start, p - start), 0, 0, start});
            } else if (std::isdigit((unsigned char)c)) {
                auto r = lex_number(p);
                if (!r) return r.error();
            } else if (c == '\'' || c == '"') {
                auto r = lex_string(p);
                if (!r) return r.error();
            } else {
                static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
                std::string op;
                for (const char* o : ops2)
                    if (src_.compare(p, 2, o) == 0) op = o;
                if (op.empty()) {
                    if (c == 0 || c == '!' || !std::strchr("+-*/%~<>=()[]{}.,:|", c))
                        return make_error(map_.where(p), ": unexpected character '", std::string(1, c), "' in a tag");
                    op = std::string(1, c);
                }
                if (c == '(' || c == '[' || c == '{') brackets.push_back(c);
                if (c == ')' || c == ']' || c == '}') {
                    char want = c == ')' ? '(' : c == ']' ? '[' : '{';
                    if (brackets.empty() || brackets.back() != want)
                        return make_error(map_.where(p), ": unexpected '", op, "'");
                    brackets.pop_back();
                }
                p += op.size();
                tokens_.push_back(Token{Tok::Op, op, 0, 0, start});
            }
        }
    }

    Expected<bool> lex_number(size_t& p) {
        size_t start = p;
        std::string digits;
        auto take_digits = [&] {
            while (p < src_.size() && (std::isdigit((unsigned char)src_[p]) || (src_[p] == '_' && !digits.empty()))) {
                if (src_[p] != '_') digits += src_[p];
                p++;
            }
        };
        take_digits();
        bool is_float = false;
        if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit((unsigned char)src_[p + 1])) {
            // `x.0.1` style attribute chains are not numbers: only a digit run after the dot.
            is_float = true;
            digits += '.';
            p++;
            take_digits();
        }
        if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
            size_t q = p + 1;
            if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) q++;
            if (q < src_.size() && std::isdigit((unsigned char)src_[q])) {
                is_float = true;
                digits += 'e';
                digits += src_.substr(p + 1, q - p - 1);
                p = q;
                take_digits();
            }
        }
        Token t{is_float ? Tok::Float : Tok::Int, src_.substr(start, p - start), 0, 0, start};
        if (is_float) {
            t.f = std::strtod(digits.c_str(), nullptr);
        } else {
            auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
            if (r.ec != std::errc()) return make_error(map_.where(start), ": the integer ", digits, " is too large");
        }
        tokens_.push_back(std::move(t));
        return true;
    }

    Expected<bool> lex_string(size_t& p) {
        size_t start = p;
        char q = src_[p++];
        std::string out;
        while (true) {
            if (p >= src_.size()) return make_error(map_.where(start), ": the string is never closed");
            char c = src_[p];
            if (c == q) {
                p++;
                break;
            }
            if (c != '\\') {
                out += c;
                p++;
                continue;
            }
            if (p + 1 >= src_.size()) return make_error(map_.where(start), ": the string is never closed");
            char e = src_[p + 1];
            p += 2;
            auto hex = [&](int n) -> int64_t {
                if (p + n > src_.size()) return -1;
                int64_t v = 0;
                for (int k = 0; k < n; k++) {
                    char h = src_[p + k];
                    if (!std::isxdigit((unsigned char)h)) return -1;
                    v = v * 16 + (std::isdigit((unsigned char)h) ? h - '0' : (std::tolower(h) - 'a' + 10));
                }
                p += n;
                return v;
            };
            switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case '\n': break;
            case 'x':
            case 'u':
            case 'U': {
                int64_t v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
                if (v < 0 || v > 0x10ffff)
                    return make_error(map_.where(p), ": a truncated or invalid \\", std::string(1, e), " escape");
                utf8::encode((uint32_t)v, out);
                break;
            }
            default:
                if (e >= '0' && e <= '7') {
                    int v = e - '0', n = 1;
                    while (n < 3 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7') {
                        v = v * 8 + (src_[p++] - '0');
                        n++;
                    }
                    utf8::encode((uint32_t)v, out);
                } else {
                    out += '\\';
                    out += e;
                }
            }
        }
        // Adjacent literals concatenate ("a" "b"), as in Python.
        if (!tokens_.empty() && tokens_.back().kind == Tok::String && tokens_.back().i == 1) {
            tokens_.back().text += out;
        } else {
            Token t{Tok::String, std::move(out), 1, 0, start};
            tokens_.push_back(std::move(t));
        }
        return true;
    }
};

// ============================================================================ AST

enum class EK : uint8_t {
    Literal, Name, List, Tuple, Dict, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, Binary, Compare,
    And, Or, Cond, Concat
};

struct Expr {
    EK kind;
    size_t pos = 0;
    std::string name;                          // Name, Attr, Filter, Test, Binary op
    Value literal;                             // Literal
    std::vector<std::unique_ptr<Expr>> kids;   // operands; for Call/Filter/Test: [0] = subject, then args
    std::vector<std::string> kwnames;          // per arg (kids[1..]): "" = positional
    std::vector<std::string> ops;              // Compare: the operators between kids
    bool negated = false;                      // Test: `is not`
    bool has[3] = {false, false, false};       // Slice: which of start/stop/step are present
};
using ExprP = std::unique_ptr<Expr>;

enum class SK : uint8_t { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, Break, Continue, FilterBlock, Body };

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct MacroDef {
    std::string name;
    std::vector<std::string> params;
    std::vector<ExprP> defaults;  // per param, null: required
    Body body;
};

struct Stmt {
    SK kind;
    size_t pos = 0;
    std::string text;               // Text
    ExprP expr;                     // Output, Set value, For iterable, FilterBlock/SetBlock filter chain
    std::vector<ExprP> conds;       // If: one per branch
    std::vector<Body> bodies;       // If: one per branch (+ else); For: [body, else]; others: [body]
    std::vector<std::string> targets;  // For / Set / SetBlock names
    std::string attr;               // Set ns.attr
    ExprP filter;                   // For: the `if` clause
    std::shared_ptr<MacroDef> macro;  // Macro; CallBlock: the caller
    ExprP call;                     // CallBlock: the call expression
};

struct Program {
    std::string source;
    SourceMap map{""};
    Body body;
};

// ============================================================================ parser

class Parser {
public:
    Parser(std::vector<Token> toks, const SourceMap& map) : t_(std::move(toks)), map_(map) {}

    Expected<Body> parse_template() {
        std::string stop;
        auto b = subparse({}, stop);
        if (!b) return b.error();
        return std::move(*b);
    }

private:
    std::vector<Token> t_;
    size_t k_ = 0;
    const SourceMap& map_;
    int depth_ = 0;
    static constexpr int k_max_depth = 100;

    const Token& cur() const { return t_[k_]; }
    const Token& peek(size_t n = 1) const { return t_[std::min(k_ + n, t_.size() - 1)]; }
    Error err(size_t pos, const std::string& msg) const { return make_error(map_.where(pos), ": ", msg); }
    Error err(const std::string& msg) const { return err(cur().pos, msg); }
    bool is_op(const char* op) const { return cur().kind == Tok::Op && cur().text == op; }
    bool is_name(const char* n) const { return cur().kind == Tok::Name && cur().text == n; }
    std::string describe(const Token& t) const {
        switch (t.kind) {
        case Tok::End: return "the end of the template";
        case Tok::BlockEnd: return "'%}'";
        case Tok::VarEnd: return "'}}'";
        case Tok::Text: return "text";
        case Tok::String: return "a string";
        case Tok::Int:
        case Tok::Float: return "a number";
        default: return "'" + t.text + "'";
        }
    }
    Expected<bool> expect_op(const char* op) {
        if (!is_op(op)) return err(std::string("expected '") + op + "', found " + describe(cur()));
        k_++;
        return true;
    }
    Expected<bool> expect_block_end() {
        if (cur().kind != Tok::BlockEnd) return err("expected '%}', found " + describe(cur()));
        k_++;
        return true;
    }
    Expected<std::string> expect_name() {
        if (cur().kind != Tok::Name) return err("expected a name, found " + describe(cur()));
        return t_[k_++].text;
    }

    struct DepthGuard {
        int& d;
        explicit DepthGuard(int& x) : d(x) { d++; }
        ~DepthGuard() { d--; }
    };

    // Statements until a block tag named in `ends`; `stop` receives the name found (the tag's
    // name token is left for the caller).
    Expected<Body> subparse(const std::vector<std::string>& ends, std::string& stop) {
        DepthGuard g(depth_);
        if (depth_ > k_max_depth) return err("blocks are nested more than " + std::to_string(k_max_depth) + " deep");
        Body body;
        while (true) {
            const Token& tk = cur();
            if (tk.kind == Tok::End) {
                if (!ends.empty()) {
                    std::string want;
                    for (auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
                    return err("unexpected end of template: expected " + want);
                }
                return body;
            }
            if (tk.kind == Tok::Text) {
                auto s = std::make_unique<Stmt>();
                s->kind = SK::Text;
                s->pos = tk.pos;
                s->text = tk.text;
                body.push_back(std::move(s));
                k_++;
                continue;
            }
            if (tk.kind == Tok::VarBegin) {
                k_++;
                auto s = std::make_unique<Stmt>();
                s->kind = SK::Output;
                s->pos = tk.pos;
                auto e = parse_tuple(true);
                if (!e) return e.error();
                s->expr = std::move(*e);
                if (cur().kind != Tok::VarEnd) return err("expected '}}', found " + describe(cur()));
                k_++;
                body.push_back(std::move(s));
                continue;
            }
            if (tk.kind != Tok::BlockBegin) return err("unexpected " + describe(tk));
            k_++;
            if (cur().kind != Tok::Name) return err("expected a statement name after '{%', found " + describe(cur()));
            const std::string& name = cur().text;
            if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
                stop = name;
                return body;
            }
            auto s = parse_statement();
            if (!s) return s.error();
            body.push_back(std::move(*s));
        }
    }

    // `%}`, a body, then `{% end %}` (an optional name after `end`, as `{% endmacro m %}`).
    Expected<Body> parse_block_body(const char* end) {
        auto e = expect_block_end();
        if (!e) return e.error();
        std::string stop;
        auto b = parse_body_until({end}, stop);
        if (!b) return b.error();
        k_++;
        if (cur().kind == Tok::Name) k_++;
        e = expect_block_end();
        if (!e) return e.error();
        return std::move(*b);
    }

    Expected<Body> parse_body_until(const std::vector<std::string>& ends, std::string& stop) {
        auto b = subparse(ends, stop);
        if (!b) return b.error();
        return std::move(*b);
    }

    Expected<std::unique_ptr<Stmt>> parse_statement() {
        const Token& tk = cur();
        size_t pos = tk.pos;
        std::string name = tk.text;
        k_++;
        auto s = std::make_unique<Stmt>();
        s->pos = pos;
        if (name == "if") return parse_if(std::move(s));
        if (name == "for") return parse_for(std::move(s));
        if (name == "set") return parse_set(std::move(s));
        if (name == "macro") return parse_macro(std::move(s));
        if (name == "call") return parse_call_block(std::move(s));
        if (name == "filter") return parse_filter_block(std::move(s));
        if (name == "break" || name == "continue") {
            if (loop_depth_ == 0) return err(pos, "'" + name + "' outside a for loop");
            s->kind = name == "break" ? SK::Break : SK::Continue;
            auto e = expect_block_end();
            if (!e) return e.error();
            return s;
        }
        if (name == "generation") {  // transformers' AssistantTracker: renders its body unchanged
            s->kind = SK::Body;
            auto b = parse_block_body("endgeneration");
            if (!b) return b.error();
            s->bodies.push_back(std::move(*b));
            return s;
        }
        return err(pos, "unknown statement '" + name + "' (supported: if, for, set, macro, call, filter, break, "
                        "continue, raw, generation)");
    }

    Expected<std::unique_ptr<Stmt>> parse_if(std::unique_ptr<Stmt> s) {
        s->kind = SK::If;
        while (true) {
            auto c = parse_tuple(true);
            if (!c) return c.error();
            s->conds.push_back(std::move(*c));
            auto e = expect_block_end();
            if (!e) return e.error();
            std::string stop;
            auto b = parse_body_until({"elif", "else", "endif"}, stop);
            if (!b) return b.error();
            s->bodies.push_back(std::move(*b));
            k_++;
            if (stop == "elif") continue;
            if (stop == "else") {
                e = expect_block_end();
                if (!e) return e.error();
                b = parse_body_until({"endif"}, stop);
                if (!b) return b.error();
                s->bodies.push_back(std::move(*b));
                k_++;
            }
            e = expect_block_end();
            if (!e) return e.error();
            return s;
        }
    }

    int loop_depth_ = 0;

    Expected<std::unique_ptr<Stmt>> parse_for(std::unique_ptr<Stmt> s) {
        s->kind = SK::For;
        while (true) {
            auto n = expect_name();
            if (!n) return n.error();
            s->targets.push_back(*n);
            if (!is_op(",")) break;
            k_++;
        }
        if (!is_name("in")) return err("expected 'in' in the for loop, found " + describe(cur()));
        k_++;
        auto it = parse_tuple(false);
        if (!it) return it.error();
        s->expr = std::move(*it);
        if (is_name("if")) {
            k_++;
            auto f = parse_expression(true);
            if (!f) return f.error();
            s->filter = std::move(*f);
        }
        if (is_name("recursive")) return err("recursive for loops are not supported");
        auto e = expect_block_end();
        if (!e) return e.error();
        std::string stop;
        loop_depth_++;
        auto b = parse_body_until({"endfor", "else"}, stop);
        loop_depth_--;
        if (!b) return b.error();
        s->bodies.push_back(std::move(*b));
        k_++;
        if (stop == "else") {
            e = expect_block_end();
            if (!e) return e.error();
            b = parse_body_until({"endfor"}, stop);
            if (!b) return b.error();
            s->bodies.push_back(std::move(*b));
            k_++;
        } else {
            s->bodies.emplace_back();
        }
        e = expect_block_end();
        if (!e) return e.error();
        return s;
    }

    Expected<std::unique_ptr<Stmt>> parse_set(std::unique_ptr<Stmt> s) {
        auto n = expect_name();
        if (!n) return n.error();
        s->targets.push_back(*n);
        if (is_op(".")) {
            k_++;
            auto a = expect_name();
            if (!a) return a.error();
            s->attr = *a;
        } else {
            while (is_op(",")) {
                k_++;
                auto m = expect_name();
                if (!m) return m.error();
                s->targets.push_back(*m);
            }
        }
        if (is_op("=")) {
            k_++;
            s->kind = SK::Set;
            auto v = parse_tuple(true);
            if (!v) return v.error();
            s->expr = std::move(*v);
            auto e = expect_block_end();
            if (!e) return e.error();
            return s;
        }
        if (!s->attr.empty() || s->targets.size() != 1) return err("expected '=' in the set statement");
        // Block set: {% set x %}...{% endset %}, optionally {% set x | filter %}.
        s->kind = SK::SetBlock;
        if (is_op("|")) {
            auto f = parse_filter_chain();
            if (!f) return f.error();
            s->expr = std::move(*f);
        }
        auto b = parse_block_body("endset");
        if (!b) return b.error();
        s->bodies.push_back(std::move(*b));
        return s;
    }

    // `| f(args) | g` applied to a placeholder Name "" (the block's rendering).
    Expected<ExprP> parse_filter_chain() {
        auto base = std::make_unique<Expr>();
        base->kind = EK::Name;
        base->pos = cur().pos;
        return parse_filters(std::move(base));
    }

    Expected<bool> parse_params(MacroDef& m) {
        auto e = expect_op("(");
        if (!e) return e.error();
        while (!is_op(")")) {
            if (!m.params.empty()) {
                e = expect_op(",");
                if (!e) return e.error();
            }
            auto n = expect_name();
            if (!n) return n.error();
            m.params.push_back(*n);
            if (is_op("=")) {
                k_++;
                auto d = parse_expression(true);
                if (!d) return d.error();
                m.defaults.push_back(std::move(*d));
            } else {
                m.defaults.push_back(nullptr);
            }
        }
        k_++;
        return true;
    }

    Expected<std::unique_ptr<Stmt>> parse_macro(std::unique_ptr<Stmt> s) {
        s->kind = SK::Macro;
        s->macro = std::make_shared<MacroDef>();
        auto n = expect_name();
        if (!n) return n.error();
        s->macro->name = *n;
        auto p = parse_params(*s->macro);
        if (!p) return p.error();
        int saved = loop_depth_;
        loop_depth_ = 0;
        auto b = parse_block_body("endmacro");
        loop_depth_ = saved;
        if (!b) return b.error();
        s->macro->body = std::move(*b);
        return s;
    }

    Expected<std::unique_ptr<Stmt>> parse_call_block(std::unique_ptr<Stmt> s) {
        s->kind = SK::CallBlock;
        s->macro = std::make_shared<MacroDef>();
        s->macro->name = "caller";
        if (is_op("(")) {
            auto p = parse_params(*s->macro);
            if (!p) return p.error();
        }
        auto c = parse_expression(true);
        if (!c) return c.error();
        if ((*c)->kind != EK::Call) return err(s->pos, "'call' needs a macro call, e.g. {% call m(x) %}");
        s->call = std::move(*c);
        auto b = parse_block_body("endcall");
        if (!b) return b.error();
        s->macro->body = std::move(*b);
        return s;
    }

    Expected<std::unique_ptr<Stmt>> parse_filter_block(std::unique_ptr<Stmt> s) {
        s->kind = SK::FilterBlock;
        auto base = std::make_unique<Expr>();
        base->kind = EK::Name;
        base->pos = cur().pos;
        // The first filter has no leading '|'.
        auto f = parse_one_filter(std::move(base));
        if (!f) return f.error();
        auto chain = parse_filters(std::move(*f));
        if (!chain) return chain.error();
        s->expr = std::move(*chain);
        auto b = parse_block_body("endfilter");
        if (!b) return b.error();
        s->bodies.push_back(std::move(*b));
        return s;
    }

    // ---- expressions (jinja2's precedence)

    ExprP node(EK k, size_t pos) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->pos = pos;
        return e;
    }

    Expected<ExprP> parse_tuple(bool with_cond) {
        size_t pos = cur().pos;
        auto first = parse_expression(with_cond);
        if (!first) return first.error();
        if (!is_op(",")) return std::move(*first);
        auto t = node(EK::Tuple, pos);
        t->kids.push_back(std::move(*first));
        while (is_op(",")) {
            k_++;
            if (cur().kind == Tok::VarEnd || cur().kind == Tok::BlockEnd || is_name("if")) break;
            auto e = parse_expression(with_cond);
            if (!e) return e.error();
            t->kids.push_back(std::move(*e));
        }
        return t;
    }

    Expected<ExprP> parse_expression(bool with_cond) {
        DepthGuard g(depth_);
        if (depth_ > k_max_depth) return err("the expression is nested more than " + std::to_string(k_max_depth) + " deep");
        size_t pos = cur().pos;
        auto e = parse_or();
        if (!e) return e.error();
        if (!with_cond) return e;
        while (is_name("if")) {
            k_++;
            auto c = parse_or();
            if (!c) return c.error();
            auto n = node(EK::Cond, pos);
            n->kids.push_back(std::move(*c));
            n->kids.push_back(std::move(*e));
            if (is_name("else")) {
                k_++;
                auto o = parse_expression(true);
                if (!o) return o.error();
                n->kids.push_back(std::move(*o));
            }
            e = std::move(n);
        }
        return e;
    }

    // A left-associative level: `next (op next)*`, where `match` names the operator at the current
    // token ("" when there is none).
    template <typename Match>
    Expected<ExprP> parse_chain(Expected<ExprP> (Parser::*next)(), Match match, EK kind) {
        auto l = (this->*next)();
        if (!l) return l;
        while (true) {
            std::string op = match();
            if (op.empty()) return l;
            size_t pos = cur().pos;
            k_++;
            auto r = (this->*next)();
            if (!r) return r;
            auto n = node(kind, pos);
            n->name = op;
            n->kids.push_back(std::move(*l));
            n->kids.push_back(std::move(*r));
            l = std::move(n);
        }
    }
    std::string op_of(std::initializer_list<const char*> ops) const {
        for (const char* o : ops)
            if (is_op(o)) return o;
        return "";
    }
    Expected<ExprP> parse_or() {
        return parse_chain(&Parser::parse_and, [&] { return std::string(is_name("or") ? "or" : ""); }, EK::Or);
    }
    Expected<ExprP> parse_and() {
        return parse_chain(&Parser::parse_not, [&] { return std::string(is_name("and") ? "and" : ""); }, EK::And);
    }
    Expected<ExprP> parse_not() {
        if (is_name("not")) {
            DepthGuard g(depth_);
            if (depth_ > k_max_depth) return err("the expression is nested too deep");
            size_t pos = cur().pos;
            k_++;
            auto x = parse_not();
            if (!x) return x;
            auto n = node(EK::Not, pos);
            n->kids.push_back(std::move(*x));
            return n;
        }
        return parse_compare();
    }
    Expected<ExprP> parse_compare() {
        size_t pos = cur().pos;
        auto first = parse_math1();
        if (!first) return first;
        ExprP cmp;
        while (true) {
            std::string op;
            if (cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                          cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
                op = cur().text;
                k_++;
            } else if (is_name("in")) {
                op = "in";
                k_++;
            } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
                op = "notin";
                k_ += 2;
            } else {
                break;
            }
            auto r = parse_math1();
            if (!r) return r;
            if (!cmp) {
                cmp = node(EK::Compare, pos);
                cmp->kids.push_back(std::move(*first));
            }
            cmp->ops.push_back(op);
            cmp->kids.push_back(std::move(*r));
        }
        if (cmp) return cmp;
        return first;
    }
    Expected<ExprP> parse_math1() { return parse_chain(&Parser::parse_concat, [&] { return op_of({"+", "-"}); }, EK::Binary); }
    Expected<ExprP> parse_concat() {
        size_t pos = cur().pos;
        auto first = parse_math2();
        if (!first) return first;
        if (!is_op("~")) return first;
        auto n = node(EK::Concat, pos);
        n->kids.push_back(std::move(*first));
        while (is_op("~")) {
            k_++;
            auto r = parse_math2();
            if (!r) return r;
            n->kids.push_back(std::move(*r));
        }
        return n;
    }
    Expected<ExprP> parse_math2() {
        return parse_chain(&Parser::parse_pow, [&] { return op_of({"*", "/", "//", "%"}); }, EK::Binary);
    }
    Expected<ExprP> parse_pow() { return parse_chain(&Parser::parse_unary_filtered, [&] { return op_of({"**"}); }, EK::Binary); }
    Expected<ExprP> parse_unary_filtered() { return parse_unary(true); }
    Expected<ExprP> parse_unary(bool with_filter) {
        DepthGuard g(depth_);
        if (depth_ > k_max_depth) return err("the expression is nested more than " + std::to_string(k_max_depth) + " deep");
        size_t pos = cur().pos;
        Expected<ExprP> n = ExprP{};
        if (is_op("-") || is_op("+")) {
            bool neg = is_op("-");
            k_++;
            auto x = parse_unary(false);
            if (!x) return x;
            auto u = node(neg ? EK::Neg : EK::Pos, pos);
            u->kids.push_back(std::move(*x));
            n = std::move(u);
        } else {
            n = parse_primary();
            if (!n) return n;
        }
        n = parse_postfix(std::move(*n));
        if (!n) return n;
        if (with_filter) return parse_filters(std::move(*n));
        return n;
    }

    Expected<ExprP> parse_primary() {
        const Token& tk = cur();
        size_t pos = tk.pos;
        if (tk.kind == Tok::Name) {
            k_++;
            auto lit = node(EK::Literal, pos);
            if (tk.text == "true" || tk.text == "True") lit->literal = Value::boolean(true);
            else if (tk.text == "false" || tk.text == "False") lit->literal = Value::boolean(false);
            else if (tk.text == "none" || tk.text == "None") lit->literal = Value::none();
            else {
                auto n = node(EK::Name, pos);
                n->name = tk.text;
                return n;
            }
            return lit;
        }
        if (tk.kind == Tok::String || tk.kind == Tok::Int || tk.kind == Tok::Float) {
            k_++;
            auto lit = node(EK::Literal, pos);
            lit->literal = tk.kind == Tok::String ? Value::str(tk.text)
                           : tk.kind == Tok::Int  ? Value::integer(tk.i)
                                                  : Value::number(tk.f);
            return lit;
        }
        if (is_op("(")) {
            k_++;
            if (is_op(")")) {
                k_++;
                return node(EK::Tuple, pos);
            }
            auto first = parse_expression(true);
            if (!first) return first;
            if (is_op(")")) {
                k_++;
                return first;
            }
            auto t = node(EK::Tuple, pos);
            t->kids.push_back(std::move(*first));
            while (is_op(",")) {
                k_++;
                if (is_op(")")) break;
                auto e = parse_expression(true);
                if (!e) return e;
                t->kids.push_back(std::move(*e));
            }
            auto c = expect_op(")");
            if (!c) return c.error();
            return t;
        }
        if (is_op("[")) {
            k_++;
            auto l = node(EK::List, pos);
            auto ok = parse_items("]", [&]() -> Expected<bool> {
                auto e = parse_expression(true);
                if (!e) return e.error();
                l->kids.push_back(std::move(*e));
                return true;
            });
            if (!ok) return ok.error();
            return l;
        }
        if (is_op("{")) {
            k_++;
            auto d = node(EK::Dict, pos);
            auto ok = parse_items("}", [&]() -> Expected<bool> {
                auto key = parse_expression(true);
                if (!key) return key.error();
                auto c = expect_op(":");
                if (!c) return c.error();
                auto v = parse_expression(true);
                if (!v) return v.error();
                d->kids.push_back(std::move(*key));
                d->kids.push_back(std::move(*v));
                return true;
            });
            if (!ok) return ok.error();
            return d;
        }
        return err("unexpected " + describe(tk) + " in an expression");
    }

    // Comma-separated items up to `close` (a trailing comma allowed), each read by parse_one; the
    // opening bracket is already consumed, the closing one is consumed here.
    template <class F>
    Expected<bool> parse_items(const char* close, F&& parse_one) {
        bool first = true;
        while (!is_op(close)) {
            if (!first) {
                auto c = expect_op(",");
                if (!c) return c.error();
                if (is_op(close)) break;
            }
            first = false;
            auto ok = parse_one();
            if (!ok) return ok.error();
        }
        k_++;
        return true;
    }

    Expected<bool> parse_call_args(Expr& call) {
        auto e = expect_op("(");
        if (!e) return e.error();
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                e = expect_op(",");
                if (!e) return e.error();
                if (is_op(")")) break;
            }
            first = false;
            std::string kw;
            if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
                kw = cur().text;
                k_ += 2;
            } else if (!call.kwnames.empty() && !call.kwnames.back().empty()) {
                return err("a positional argument follows a keyword argument");
            }
            auto a = parse_expression(true);
            if (!a) return a.error();
            call.kids.push_back(std::move(*a));
            call.kwnames.push_back(kw);
        }
        k_++;
        return true;
    }

    Expected<ExprP> parse_postfix(ExprP n) {
        while (true) {
            if (is_op(".")) {
                size_t pos = cur().pos;
                k_++;
                auto a = node(EK::Attr, pos);
                if (cur().kind == Tok::Name) a->name = cur().text;
                else if (cur().kind == Tok::Int) {
                    // x.0 is x[0]
                    auto idx = node(EK::Literal, pos);
                    idx->literal = Value::integer(cur().i);
                    a->kind = EK::Item;
                    a->kids.push_back(std::move(n));
                    a->kids.push_back(std::move(idx));
                    k_++;
                    n = std::move(a);
                    continue;
                } else return err("expected an attribute name after '.', found " + describe(cur()));
                k_++;
                a->kids.push_back(std::move(n));
                n = std::move(a);
            } else if (is_op("[")) {
                size_t pos = cur().pos;
                k_++;
                auto r = parse_subscript(std::move(n), pos);
                if (!r) return r;
                n = std::move(*r);
            } else if (is_op("(")) {
                auto c = node(EK::Call, n->kind == EK::Name ? n->pos : cur().pos);
                c->kids.push_back(std::move(n));
                c->kwnames.push_back("");
                auto a = parse_call_args(*c);
                if (!a) return a.error();
                n = std::move(c);
            } else {
                return n;
            }
        }
    }

    Expected<ExprP> parse_subscript(ExprP subject, size_t pos) {
        ExprP parts[3];
        bool has[3] = {false, false, false};
        bool is_slice = false;
        int part = 0;
        while (true) {
            if (is_op("]")) break;
            if (is_op(":")) {
                is_slice = true;
                if (++part > 2) return err("a slice has at most three parts");
                k_++;
                continue;
            }
            if (has[part]) return err("expected ':' or ']', found " + describe(cur()));
            auto e = parse_expression(true);
            if (!e) return e;
            parts[part] = std::move(*e);
            has[part] = true;
        }
        k_++;
        if (!is_slice) {
            if (!has[0]) return err(pos, "an empty subscript '[]'");
            auto n = node(EK::Item, pos);
            n->kids.push_back(std::move(subject));
            n->kids.push_back(std::move(parts[0]));
            return n;
        }
        auto n = node(EK::Slice, pos);
        n->kids.push_back(std::move(subject));
        for (int p = 0; p < 3; p++) {
            n->has[p] = has[p];
            n->kids.push_back(has[p] ? std::move(parts[p]) : nullptr);
        }
        return n;
    }

    Expected<ExprP> parse_one_filter(ExprP subject) {
        size_t pos = cur().pos;
        auto name = expect_name();
        if (!name) return name.error();
        auto f = node(EK::Filter, pos);
        f->name = *name;
        while (is_op(".")) {  // dotted filter names are jinja syntax; none exist here but keep the error clear
            k_++;
            auto more = expect_name();
            if (!more) return more.error();
            f->name += "." + *more;
        }
        f->kids.push_back(std::move(subject));
        f->kwnames.push_back("");
        if (is_op("(")) {
            auto a = parse_call_args(*f);
            if (!a) return a.error();
        }
        return f;
    }

    Expected<ExprP> parse_filters(ExprP n) {
        while (true) {
            if (is_op("|")) {
                k_++;
                auto f = parse_one_filter(std::move(n));
                if (!f) return f;
                n = std::move(*f);
            } else if (is_name("is")) {
                size_t pos = cur().pos;
                k_++;
                auto t = node(EK::Test, pos);
                if (is_name("not")) {
                    t->negated = true;
                    k_++;
                }
                // Test names may be keywords (none, true, false, in).
                if (cur().kind != Tok::Name && !(cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" ||
                                                                           cur().text == "<" || cur().text == ">" ||
                                                                           cur().text == "<=" || cur().text == ">=")))
                    return err("expected a test name after 'is', found " + describe(cur()));
                t->name = cur().text;
                k_++;
                t->kids.push_back(std::move(n));
                t->kwnames.push_back("");
                if (is_op("(")) {
                    auto a = parse_call_args(*t);
                    if (!a) return a.error();
                } else if (cur().kind == Tok::String || cur().kind == Tok::Int || cur().kind == Tok::Float ||
                           (cur().kind == Tok::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                            !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")) ||
                           is_op("[") || is_op("{")) {
                    // One argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
                    auto p = parse_primary();
                    if (!p) return p;
                    auto a = parse_postfix(std::move(*p));
                    if (!a) return a;
                    t->kids.push_back(std::move(*a));
                    t->kwnames.push_back("");
                }
                n = std::move(t);
            } else if (is_op("(") && n->kind == EK::Filter) {
                auto c = node(EK::Call, cur().pos);
                c->kids.push_back(std::move(n));
                c->kwnames.push_back("");
                auto a = parse_call_args(*c);
                if (!a) return a.error();
                n = std::move(c);
            } else {
                return n;
            }
        }
    }
};

// ============================================================================ JSON in and out

static Expected<Value> from_json(const nlohmann::ordered_json& j, int depth) {
    if (depth > k_max_value_depth) return make_error("the input is nested more than ", std::to_string(k_max_value_depth), " deep");
    switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
        uint64_t u = j.get<uint64_t>();
        if (u > (uint64_t)INT64_MAX) return Value::number((double)u);
        return Value::integer((int64_t)u);
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
        Value v;
        v.t = Type::List;
        v.l = std::make_shared<List>();
        for (auto& e : j) {
            auto x = from_json(e, depth + 1);
            if (!x) return x;
            v.l->depth = std::max(v.l->depth, depth_of(*x) + 1);
            v.l->items.push_back(std::move(*x));
        }
        return v;
    }
    case nlohmann::ordered_json::value_t::object: {
        Value v;
        v.t = Type::Dict;
        v.d = std::make_shared<Dict>();
        for (auto it = j.begin(); it != j.end(); ++it) {
            auto x = from_json(it.value(), depth + 1);
            if (!x) return x;
            v.d->depth = std::max(v.d->depth, depth_of(*x) + 1);
            v.d->items.emplace_back(Value::str(it.key()), std::move(*x));
        }
        return v;
    }
    default: return Value::none();
    }
}

struct JsonStyle {
    bool has_indent = false;
    std::string indent;
    std::string item_sep = ", ", key_sep = ": ";
    bool sort_keys = false;
    bool ensure_ascii = false;
};

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out += '"';
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') out += "\\\"", i++;
        else if (c == '\\') out += "\\\\", i++;
        else if (c == '\n') out += "\\n", i++;
        else if (c == '\r') out += "\\r", i++;
        else if (c == '\t') out += "\\t", i++;
        else if (c == '\b') out += "\\b", i++;
        else if (c == '\f') out += "\\f", i++;
        else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out += b;
            i++;
        } else if (c >= 0x80 && ensure_ascii) {
            uint32_t cp = utf8::decode_loose(s, i);
            char b[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else {
                std::snprintf(b, sizeof b, "\\u%04x", cp);
            }
            out += b;
        } else {
            out += (char)c;
            i++;
        }
    }
    out += '"';
}

static Expected<bool> to_json(std::string& out, const Value& v, const JsonStyle& st, int level, size_t cap) {
    if (out.size() > cap) return make_error("tojson: the output is over ", std::to_string(cap), " bytes");
    auto newline = [&](int lv) {
        out += '\n';
        for (int k = 0; k < lv; k++) out += st.indent;
    };
    switch (v.t) {
    case Type::None: out += "null"; return true;
    case Type::Bool: out += v.b ? "true" : "false"; return true;
    case Type::Int: out += std::to_string(v.i); return true;
    case Type::Float:
        if (std::isnan(v.f)) out += "NaN";
        else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
        else out += float_repr(v.f);
        return true;
    case Type::String: json_string(out, v.sv(), st.ensure_ascii); return true;
    case Type::List: {
        if (v.l->items.empty()) {
            out += "[]";
            return true;
        }
        out += '[';
        for (size_t k = 0; k < v.l->items.size(); k++) {
            if (k) out += st.item_sep;
            if (st.has_indent) newline(level + 1);
            auto r = to_json(out, v.l->items[k], st, level + 1, cap);
            if (!r) return r;
        }
        if (st.has_indent) newline(level);
        out += ']';
        return true;
    }
    case Type::Dict: {
        if (v.d->items.empty()) {
            out += "{}";
            return true;
        }
        std::vector<const std::pair<Value, Value>*> items;
        for (auto& kv : v.d->items) items.push_back(&kv);
        std::vector<std::string> keys;
        for (auto* kv : items) {
            const Value& k = kv->first;
            if (k.t == Type::String) keys.push_back(k.sv());
            else if (k.t == Type::Int) keys.push_back(std::to_string(k.i));
            else if (k.t == Type::Bool) keys.push_back(k.b ? "true" : "false");
            else if (k.t == Type::None) keys.push_back("null");
            else if (k.t == Type::Float) keys.push_back(float_repr(k.f));
            else return make_error("tojson: keys must be str, int, float, bool or None, not ", type_name(k));
        }
        std::vector<size_t> order(items.size());
        for (size_t k = 0; k < order.size(); k++) order[k] = k;
        if (st.sort_keys) std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
        out += '{';
        for (size_t n = 0; n < order.size(); n++) {
            if (n) out += st.item_sep;
            if (st.has_indent) newline(level + 1);
            json_string(out, keys[order[n]], st.ensure_ascii);
            out += st.key_sep;
            auto r = to_json(out, items[order[n]]->second, st, level + 1, cap);
            if (!r) return r;
        }
        if (st.has_indent) newline(level);
        out += '}';
        return true;
    }
    default: return make_error("tojson: Object of type ", type_name(v), " is not JSON serializable");
    }
}

// ============================================================================ the renderer

enum class Flow { Normal, Break, Continue };

struct Scope {
    std::vector<std::pair<std::string, Value>> vars;
    Value* find(const std::string& n) {
        for (auto& [k, v] : vars)
            if (k == n) return &v;
        return nullptr;
    }
    void set(const std::string& n, Value v) {
        if (Value* p = find(n)) *p = std::move(v);
        else vars.emplace_back(n, std::move(v));
    }
};

class Renderer {
public:
    Renderer(const Program& prog, const RenderOptions& opt) : prog_(prog), opt_(opt), lim_(opt.limits) {
        t_repr_cap = lim_.max_output_bytes + 1;
    }

    Expected<std::string> run(const nlohmann::ordered_json& context) {
        if (!context.is_object() && !context.is_null()) return make_error("the template context must be a JSON object");
        if (context.is_object())
            for (auto it = context.begin(); it != context.end(); ++it) {
                auto v = from_json(it.value(), 1);
                if (!v) return make_error("the variable '", it.key(), "': ", v.error().message);
                globals_.set(it.key(), std::move(*v));
            }
        scopes_.push_back(root_);
        std::string out;
        out_ = &out;
        auto r = exec_body(prog_.body);
        if (!r) return r.error();
        return out;
    }

    // ---- errors
    Error err(size_t pos, const std::string& msg) const { return make_error(prog_.map.where(pos), ": ", msg); }

    size_t cur_pos_ = 0;  // where evaluation is: builtins name it in their errors
    Error err(const std::string& msg) const { return err(cur_pos_, msg); }

    // ---- budget
    Expected<bool> step(size_t pos, uint64_t n = 1) {
        steps_ += n;
        if (steps_ > lim_.max_steps)
            return err(pos, "the rendering took more than " + std::to_string(lim_.max_steps) +
                                " steps (an endless or huge loop?); the limit is RenderLimits::max_steps");
        if (total_bytes_ > lim_.max_total_bytes)
            return err(pos, "the rendering created more than " + std::to_string(lim_.max_total_bytes) +
                                " bytes of values; the limit is RenderLimits::max_total_bytes");
        return true;
    }
    // Work proportional to a value's size (scans, searches, comparisons) counts as steps too, so
    // that a loop over a huge string or list is bounded by time, not only by what it creates.
    static uint64_t size_of(const Value& v) {
        if (v.t == Type::String) return v.sv().size() * 4;
        if (v.t == Type::List) return v.l->items.size() * 16;
        if (v.t == Type::Dict || v.t == Type::Namespace) return v.d->items.size() * 16;
        return 0;
    }
    Expected<bool> charge(const Value& v) {
        uint64_t n = size_of(v) / 64;
        if (n == 0) return true;
        return step(cur_pos_, n);
    }
    Expected<Value> make_string(std::string s) {
        if (s.size() > lim_.max_output_bytes)
            return err("a string of " + std::to_string(s.size()) + " bytes is over the limit of " +
                       std::to_string(lim_.max_output_bytes));
        total_bytes_ += s.size();
        return Value::str(std::move(s));
    }
    Expected<bool> check_size(size_t bytes) {
        if (bytes > lim_.max_output_bytes)
            return err("a string of " + std::to_string(bytes) + " bytes would be over the limit of " +
                       std::to_string(lim_.max_output_bytes));
        return true;
    }
    Expected<Value> make_list(std::vector<Value> items, bool tuple = false) {
        if (items.size() > lim_.max_list_items)
            return err("a list of " + std::to_string(items.size()) + " items is over the limit of " +
                       std::to_string(lim_.max_list_items));
        total_bytes_ += items.size() * sizeof(Value);
        Value v;
        v.t = Type::List;
        v.tuple = tuple;
        v.l = std::make_shared<List>();
        for (auto& x : items) {
            v.l->depth = std::max(v.l->depth, depth_of(x) + 1);
            v.l->has_ns = v.l->has_ns || has_ns_of(x);
        }
        if (v.l->depth > k_max_value_depth)
            return err("values nested more than " + std::to_string(k_max_value_depth) + " deep");
        v.l->items = std::move(items);
        return v;
    }
    Expected<Value> make_dict(std::vector<std::pair<Value, Value>> items, bool ns = false) {
        total_bytes_ += items.size() * 2 * sizeof(Value);
        Value v;
        v.t = ns ? Type::Namespace : Type::Dict;
        v.d = std::make_shared<Dict>();
        for (auto& [k, x] : items) {
            if (ns && has_ns_of(x)) return err("a namespace cannot hold another namespace");
            v.d->depth = std::max({v.d->depth, depth_of(x) + 1, depth_of(k) + 1});
            v.d->has_ns = v.d->has_ns || has_ns_of(x) || has_ns_of(k);
        }
        if (v.d->depth > k_max_value_depth)
            return err("values nested more than " + std::to_string(k_max_value_depth) + " deep");
        // Later duplicates replace earlier ones, keeping the first position (Python dict literal).
        for (auto& kv : items) {
            bool dup = false;
            for (auto& e : v.d->items)
                if (equal(e.first, kv.first)) {
                    e.second = kv.second;
                    dup = true;
                    break;
                }
            if (!dup) v.d->items.push_back(std::move(kv));
        }
        return v;
    }

    Expected<Value> call_value(const Value& f, CallArgs& args, size_t pos) {
        if (f.t == Type::Undefined) return err(pos, "'" + f.sv() + "' is undefined and cannot be called");
        if (f.t != Type::Func) return err(pos, std::string("'") + type_name(f) + "' object is not callable");
        size_t saved = cur_pos_;
        cur_pos_ = pos;
        auto r = f.fn->fn(*this, args);
        cur_pos_ = saved;
        return r;
    }

    // ---- macros
    using Closure = std::vector<std::weak_ptr<Scope>>;

    // The scopes a macro (or a call block's caller) sees besides the top level: those around its
    // definition. Held weakly: a scope that has ended (a macro kept past its loop) is skipped.
    Closure closure() const {
        Closure c;
        for (size_t k = 1; k < scopes_.size(); k++) c.push_back(scopes_[k]);
        return c;
    }

    Expected<Value> call_macro(const std::shared_ptr<MacroDef>& m, const Closure& closure, CallArgs& args,
                               const Value* caller, size_t pos) {
        if (call_depth_ >= lim_.max_call_depth)
            return err(pos, "macro '" + m->name + "' called more than " + std::to_string(lim_.max_call_depth) +
                                " deep (endless recursion?)");
        auto local_p = std::make_shared<Scope>();
        Scope& local = *local_p;
        size_t n_pos = args.pos.size();
        if (n_pos > m->params.size())
            return err(pos, "macro '" + m->name + "' takes " + std::to_string(m->params.size()) +
                                " arguments, " + std::to_string(n_pos) + " given");
        for (size_t k = 0; k < m->params.size(); k++) {
            if (k < n_pos) {
                local.set(m->params[k], args.pos[k]);
                continue;
            }
            const Value* kw = args.kwarg(m->params[k]);
            if (kw) local.set(m->params[k], *kw);
            else if (m->defaults[k]) {
                auto d = eval(*m->defaults[k]);
                if (!d) return d;
                local.set(m->params[k], std::move(*d));
            } else local.set(m->params[k], Value::undefined(m->params[k]));
        }
        for (auto& [k, v] : args.kw)
            if (std::find(m->params.begin(), m->params.end(), k) == m->params.end())
                return err(pos, "macro '" + m->name + "' has no parameter named '" + k + "'");
        if (caller) local.set("caller", *caller);
        std::vector<std::shared_ptr<Scope>> chain{root_};
        for (auto& w : closure)
            if (auto sp = w.lock()) chain.push_back(std::move(sp));
        chain.push_back(local_p);
        std::vector<std::shared_ptr<Scope>> saved_scopes = std::move(scopes_);
        scopes_ = std::move(chain);
        std::string buf;
        std::string* saved_out = out_;
        out_ = &buf;
        call_depth_++;
        auto r = exec_body(m->body);
        call_depth_--;
        out_ = saved_out;
        scopes_ = std::move(saved_scopes);
        if (!r) return r.error();
        return make_string(std::move(buf));
    }

    Value macro_value(const std::shared_ptr<MacroDef>& m) {
        Value v;
        v.t = Type::Func;
        v.fn = std::make_shared<Callable>();
        v.fn->name = m->name;
        v.fn->fn = [m, cl = closure()](Renderer& r, CallArgs& a) -> Expected<Value> {
            // Only the macro a {% call %} block invokes directly receives its caller.
            const Value* caller = r.pending_caller_;
            r.pending_caller_ = nullptr;
            return r.call_macro(m, cl, a, caller, r.cur_pos_);
        };
        return v;
    }

    // ---- statements
    Expected<Flow> exec_body(const Body& body) {
        for (auto& s : body) {
            auto f = exec(*s);
            if (!f) return f;
            if (*f != Flow::Normal) return f;
        }
        return Flow::Normal;
    }

    Expected<bool> emit(const std::string& s, size_t pos) {
        if (out_->size() + s.size() > lim_.max_output_bytes)
            return err(pos, "the rendering is over " + std::to_string(lim_.max_output_bytes) +
                                " bytes; the limit is RenderLimits::max_output_bytes");
        *out_ += s;
        return true;
    }

    struct DepthGuard {
        int& d;
        explicit DepthGuard(int& x) : d(x) { d++; }
        ~DepthGuard() { d--; }
    };

    void assign(const std::string& name, Value v) { scopes_.back()->set(name, std::move(v)); }

    Expected<bool> assign_targets(const std::vector<std::string>& targets, const Value& v, size_t pos) {
        if (targets.size() == 1) {
            assign(targets[0], v);
            return true;
        }
        std::vector<Value> items;
        if (v.t == Type::List) items = v.l->items;
        else if (v.t == Type::String) {
            auto offs = cp_offsets(v.sv());
            for (size_t k = 0; k + 1 < offs.size(); k++) items.push_back(Value::str(v.sv().substr(offs[k], offs[k + 1] - offs[k])));
        } else if (v.t == Type::Dict) {
            for (auto& kv : v.d->items) items.push_back(kv.first);
        } else return err(pos, std::string("cannot unpack a non-iterable ") + type_name(v) + " object");
        if (items.size() != targets.size())
            return err(pos, items.size() > targets.size()
                                ? "too many values to unpack (expected " + std::to_string(targets.size()) + ")"
                                : "not enough values to unpack (expected " + std::to_string(targets.size()) +
                                      ", got " + std::to_string(items.size()) + ")");
        for (size_t k = 0; k < targets.size(); k++) assign(targets[k], items[k]);
        return true;
    }

    Expected<std::vector<Value>> iterate(const Value& v, size_t pos) {
        std::vector<Value> items;
        switch (v.t) {
        case Type::Undefined: return items;
        case Type::List: return v.l->items;
        case Type::Dict:
            for (auto& kv : v.d->items) items.push_back(kv.first);
            return items;
        case Type::String: {
            auto offs = cp_offsets(v.sv());
            for (size_t k = 0; k + 1 < offs.size(); k++)
                items.push_back(Value::str(v.sv().substr(offs[k], offs[k + 1] - offs[k])));
            total_bytes_ += items.size() * sizeof(Value);
            return items;
        }
        default: return err(pos, std::string("'") + type_name(v) + "' object is not iterable");
        }
    }

    Expected<Value> capture(const Body& body) {
        std::string buf;
        std::string* saved = out_;
        out_ = &buf;
        auto r = exec_body(body);
        out_ = saved;
        if (!r) return r.error();
        return make_string(std::move(buf));
    }

    Expected<Value> apply_filter_chain(const Expr& chain, Value input) {
        // The chain's innermost subject is the placeholder Name "": bind it through a scope.
        auto tmp = std::make_shared<Scope>();
        tmp->set("", std::move(input));
        scopes_.push_back(tmp);
        auto r = eval(chain);
        scopes_.pop_back();
        return r;
    }

    Expected<Flow> exec(const Stmt& s) {
        DepthGuard g(eval_depth_);
        if (eval_depth_ > lim_.max_eval_depth)
            return err(s.pos, "evaluation nested more than " + std::to_string(lim_.max_eval_depth) + " deep");
        auto st = step(s.pos);
        if (!st) return st.error();
        switch (s.kind) {
        case SK::Text: {
            auto e = emit(s.text, s.pos);
            if (!e) return e.error();
            return Flow::Normal;
        }
        case SK::Output: {
            auto v = eval(*s.expr);
            if (!v) return v.error();
            if (v->t == Type::String) {
                auto e = emit(v->sv(), s.pos);
                if (!e) return e.error();
            } else {
                std::string str;
                append_str(str, *v);
                auto e = emit(str, s.pos);
                if (!e) return e.error();
            }
            return Flow::Normal;
        }
        case SK::If: {
            for (size_t k = 0; k < s.conds.size(); k++) {
                auto c = eval(*s.conds[k]);
                if (!c) return c.error();
                if (truthy(*c)) return exec_body(s.bodies[k]);
            }
            if (s.bodies.size() > s.conds.size()) return exec_body(s.bodies.back());
            return Flow::Normal;
        }
        case SK::For: return exec_for(s);
        case SK::Set: {
            auto v = eval(*s.expr);
            if (!v) return v.error();
            if (!s.attr.empty()) {
                Value* ns = lookup_ptr(s.targets[0]);
                if (!ns || ns->t != Type::Namespace)
                    return err(s.pos, "cannot assign attribute '" + s.attr + "' on '" + s.targets[0] +
                                          "': it is not a namespace (make it with namespace())");
                if (has_ns_of(*v)) return err(s.pos, "a namespace cannot hold another namespace");
                if (depth_of(*v) + 1 > k_max_value_depth) return err(s.pos, "values nested too deep");
                bool found = false;
                for (auto& [k, x] : ns->d->items)
                    if (k.t == Type::String && k.sv() == s.attr) {
                        x = std::move(*v);
                        found = true;
                        break;
                    }
                if (!found) ns->d->items.emplace_back(Value::str(s.attr), std::move(*v));
                return Flow::Normal;
            }
            auto a = assign_targets(s.targets, *v, s.pos);
            if (!a) return a.error();
            return Flow::Normal;
        }
        case SK::SetBlock: {
            auto v = capture(s.bodies[0]);
            if (!v) return v.error();
            if (s.expr) {
                v = apply_filter_chain(*s.expr, std::move(*v));
                if (!v) return v.error();
            }
            assign(s.targets[0], std::move(*v));
            return Flow::Normal;
        }
        case SK::Macro: assign(s.macro->name, macro_value(s.macro)); return Flow::Normal;
        case SK::CallBlock: {
            // {% call m(args) %}body{% endcall %}: m runs with `caller` bound to the body.
            const Expr& c = *s.call;
            auto f = eval(*c.kids[0]);
            if (!f) return f.error();
            CallArgs args;
            auto a = eval_args(c, args);
            if (!a) return a.error();
            Value caller = macro_value(s.macro);
            pending_caller_ = &caller;
            auto r = call_value(*f, args, c.pos);
            pending_caller_ = nullptr;
            if (!r) return r.error();
            auto e = emit(to_str(*r), s.pos);
            if (!e) return e.error();
            return Flow::Normal;
        }
        case SK::FilterBlock: {
            auto v = capture(s.bodies[0]);
            if (!v) return v.error();
            v = apply_filter_chain(*s.expr, std::move(*v));
            if (!v) return v.error();
            auto e = emit(to_str(*v), s.pos);
            if (!e) return e.error();
            return Flow::Normal;
        }
        case SK::Body: return exec_body(s.bodies[0]);
        case SK::Break: return Flow::Break;
        case SK::Continue: return Flow::Continue;
        }
        return Flow::Normal;
    }

    const Value* pending_caller_ = nullptr;

    Expected<Flow> exec_for(const Stmt& s) {
        auto it = eval(*s.expr);
        if (!it) return it.error();
        if (auto c = charge(*it); !c) return c.error();
        auto items = iterate(*it, s.expr->pos);
        if (!items) return items.error();
        std::vector<Value> kept;
        if (s.filter) {
            for (auto& x : *items) {
                scopes_.push_back(std::make_shared<Scope>());
                auto a = assign_targets(s.targets, x, s.pos);
                Expected<Value> c = a ? eval(*s.filter) : Expected<Value>(a.error());
                scopes_.pop_back();
                if (!c) return c.error();
                if (truthy(*c)) kept.push_back(x);
                auto st = step(s.pos);
                if (!st) return st.error();
            }
        } else {
            kept = std::move(*items);
        }
        if (kept.empty()) {
            if (s.bodies[1].empty()) return Flow::Normal;
            return exec_body(s.bodies[1]);
        }
        // One loop object per loop, updated in place each iteration (as jinja2's LoopContext).
        int64_t n = (int64_t)kept.size();
        auto index0 = std::make_shared<int64_t>(0);
        Value loop = loop_value(kept, index0);
        auto sc = std::make_shared<Scope>();
        // jinja2 runs the else branch unless some iteration reached the end of the body: a loop
        // whose every iteration ended in break or continue runs it too.
        bool completed_one = false;
        for (int64_t k = 0; k < n; k++) {
            auto st = step(s.pos);
            if (!st) return st.error();
            *index0 = k;
            auto& it = loop.d->items;
            it[0].second.i = k + 1;
            it[1].second.i = k;
            it[2].second.i = n - k;
            it[3].second.i = n - k - 1;
            it[4].second.b = k == 0;
            it[5].second.b = k == n - 1;
            it[9].second = k > 0 ? kept[k - 1] : Value::undefined("loop.previtem");
            it[10].second = k + 1 < n ? kept[k + 1] : Value::undefined("loop.nextitem");
            sc->vars.clear();
            scopes_.push_back(sc);
            auto a = assign_targets(s.targets, kept[k], s.pos);
            if (!a) {
                scopes_.pop_back();
                return a.error();
            }
            sc->set("loop", loop);
            auto f = exec_body(s.bodies[0]);
            scopes_.pop_back();
            if (!f) return f;
            if (*f == Flow::Normal) completed_one = true;
            if (*f == Flow::Break) break;
        }
        if (!completed_one && !s.bodies[1].empty()) return exec_body(s.bodies[1]);
        return Flow::Normal;
    }

    Value loop_value(const std::vector<Value>& items, std::shared_ptr<int64_t> index0) {
        int64_t n = (int64_t)items.size();
        Value v;
        v.t = Type::Dict;
        v.d = std::make_shared<Dict>();
        auto put = [&](const char* name, Value x) { v.d->items.emplace_back(Value::str(name), std::move(x)); };
        put("index", Value::integer(1));
        put("index0", Value::integer(0));
        put("revindex", Value::integer(n));
        put("revindex0", Value::integer(n - 1));
        put("first", Value::boolean(true));
        put("last", Value::boolean(n == 1));
        put("length", Value::integer(n));
        put("depth", Value::integer(1));
        put("depth0", Value::integer(0));
        put("previtem", Value::undefined("loop.previtem"));
        put("nextitem", Value::undefined("loop.nextitem"));
        Value cyc;
        cyc.t = Type::Func;
        cyc.fn = std::make_shared<Callable>();
        cyc.fn->name = "loop.cycle";
        cyc.fn->fn = [index0](Renderer& r, CallArgs& a) -> Expected<Value> {
            if (a.pos.empty()) return r.err("loop.cycle() needs at least one argument");
            return a.pos[(size_t)*index0 % a.pos.size()];
        };
        put("cycle", std::move(cyc));
        for (auto& kv : v.d->items) v.d->depth = std::max(v.d->depth, depth_of(kv.second) + 1);
        for (auto& x : items) {  // previtem / nextitem
            v.d->depth = std::max(v.d->depth, depth_of(x) + 1);
            v.d->has_ns = v.d->has_ns || has_ns_of(x);
        }
        return v;
    }

    // ---- names
    Value* lookup_ptr(const std::string& name) {
        for (size_t k = scopes_.size(); k-- > 0;)
            if (Value* v = scopes_[k]->find(name)) return v;
        if (Value* v = globals_.find(name)) return v;
        return nullptr;
    }
    Expected<Value> lookup(const std::string& name) {
        if (const Value* v = lookup_ptr(name)) return *v;
        if (auto b = builtin_global(name)) return *b;
        return Value::undefined(name);
    }
    std::optional<Value> builtin_global(const std::string& name);

    // ---- expressions
    Expected<bool> eval_args(const Expr& e, CallArgs& args) {
        for (size_t k = 1; k < e.kids.size(); k++) {
            auto v = eval(*e.kids[k]);
            if (!v) return v.error();
            if (e.kwnames[k].empty()) args.pos.push_back(std::move(*v));
            else args.kw.emplace_back(e.kwnames[k], std::move(*v));
        }
        return true;
    }

    Expected<Value> eval(const Expr& e) {
        DepthGuard g(eval_depth_);
        if (eval_depth_ > lim_.max_eval_depth)
            return err(e.pos, "evaluation nested more than " + std::to_string(lim_.max_eval_depth) + " deep");
        auto st = step(e.pos);
        if (!st) return st.error();
        switch (e.kind) {
        case EK::Literal: return e.literal;
        case EK::Name: return lookup(e.name);
        case EK::List:
        case EK::Tuple: {
            std::vector<Value> items;
            for (auto& k : e.kids) {
                auto v = eval(*k);
                if (!v) return v;
                items.push_back(std::move(*v));
            }
            cur_pos_ = e.pos;
            return make_list(std::move(items), e.kind == EK::Tuple);
        }
        case EK::Dict: {
            std::vector<std::pair<Value, Value>> items;
            for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
                auto key = eval(*e.kids[k]);
                if (!key) return key;
                if (key->t == Type::List && !key->tuple) return err(e.kids[k]->pos, "unhashable type: 'list'");
                if (key->t == Type::Dict || key->t == Type::Namespace)
                    return err(e.kids[k]->pos, std::string("unhashable type: '") + type_name(*key) + "'");
                auto v = eval(*e.kids[k + 1]);
                if (!v) return v;
                items.emplace_back(std::move(*key), std::move(*v));
            }
            cur_pos_ = e.pos;
            return make_dict(std::move(items));
        }
        case EK::Attr: {
            auto o = eval(*e.kids[0]);
            if (!o) return o;
            cur_pos_ = e.pos;
            return get_attr(*o, e.name, e.pos);
        }
        case EK::Item: {
            auto o = eval(*e.kids[0]);
            if (!o) return o;
            auto k = eval(*e.kids[1]);
            if (!k) return k;
            cur_pos_ = e.pos;
            return get_item(*o, *k, e.pos);
        }
        case EK::Slice: return eval_slice(e);
        case EK::Call: {
            auto f = eval(*e.kids[0]);
            if (!f) return f;
            CallArgs args;
            auto a = eval_args(e, args);
            if (!a) return a.error();
            return call_value(*f, args, e.pos);
        }
        case EK::Filter: {
            auto subject = eval(*e.kids[0]);
            if (!subject) return subject;
            CallArgs args;
            auto a = eval_args(e, args);
            if (!a) return a.error();
            size_t saved = cur_pos_;
            cur_pos_ = e.pos;
            auto r = apply_filter(e.name, *subject, args);
            cur_pos_ = saved;
            return r;
        }
        case EK::Test: {
            auto subject = eval(*e.kids[0]);
            if (!subject) return subject;
            CallArgs args;
            auto a = eval_args(e, args);
            if (!a) return a.error();
            cur_pos_ = e.pos;
            auto r = apply_test(e.name, *subject, args);
            if (!r) return r.error();
            return Value::boolean(*r != e.negated);
        }
        case EK::Neg:
        case EK::Pos: {
            auto x = eval(*e.kids[0]);
            if (!x) return x;
            if (x->t == Type::Undefined) return err(e.pos, "'" + x->sv() + "' is undefined");
            if (!x->is_num())
                return err(e.pos, std::string("bad operand type for unary ") + (e.kind == EK::Neg ? "-" : "+") +
                                      ": '" + type_name(*x) + "'");
            if (e.kind == EK::Pos) return x->t == Type::Bool ? Value::integer(x->as_int()) : *x;
            if (x->t == Type::Float) return Value::number(-x->f);
            if (x->as_int() == INT64_MIN) return err(e.pos, "integer overflow");
            return Value::integer(-x->as_int());
        }
        case EK::Not: {
            auto x = eval(*e.kids[0]);
            if (!x) return x;
            return Value::boolean(!truthy(*x));
        }
        case EK::And:
        case EK::Or: {
            auto l = eval(*e.kids[0]);
            if (!l) return l;
            if (truthy(*l) == (e.kind == EK::Or)) return l;
            return eval(*e.kids[1]);
        }
        case EK::Cond: {
            auto c = eval(*e.kids[0]);
            if (!c) return c;
            if (truthy(*c)) return eval(*e.kids[1]);
            if (e.kids.size() > 2) return eval(*e.kids[2]);
            return Value::undefined("the else branch of an inline if");
        }
        case EK::Concat: {
            std::string s;
            for (auto& k : e.kids) {
                auto v = eval(*k);
                if (!v) return v;
                append_str(s, *v);
                cur_pos_ = e.pos;
                auto c = check_size(s.size());
                if (!c) return c.error();
            }
            cur_pos_ = e.pos;
            return make_string(std::move(s));
        }
        case EK::Binary: {
            auto l = eval(*e.kids[0]);
            if (!l) return l;
            auto r = eval(*e.kids[1]);
            if (!r) return r;
            cur_pos_ = e.pos;
            return binary_op(e.name, *l, *r);
        }
        case EK::Compare: {
            auto l = eval(*e.kids[0]);
            if (!l) return l;
            for (size_t k = 0; k < e.ops.size(); k++) {
                auto r = eval(*e.kids[k + 1]);
                if (!r) return r;
                cur_pos_ = e.kids[k + 1]->pos;
                auto c = compare(e.ops[k], *l, *r);
                if (!c) return c.error();
                if (!*c) return Value::boolean(false);
                l = std::move(r);
            }
            return Value::boolean(true);
        }
        }
        return Value::none();
    }

    Expected<Value> eval_slice(const Expr& e) {
        auto o = eval(*e.kids[0]);
        if (!o) return o;
        if (auto c = charge(*o); !c) return c.error();
        std::optional<int64_t> parts[3];
        for (int p = 0; p < 3; p++) {
            if (!e.has[p]) continue;
            auto v = eval(*e.kids[p + 1]);
            if (!v) return v;
            if (v->t == Type::None) continue;
            if (!v->is_int()) return err(e.kids[p + 1]->pos, "slice indices must be integers or None");
            parts[p] = v->as_int();
        }
        cur_pos_ = e.pos;
        if (o->t == Type::Undefined) return err(e.pos, "'" + o->sv() + "' is undefined");
        int64_t step_v = parts[2].value_or(1);
        if (step_v == 0) return err(e.pos, "slice step cannot be zero");
        if (step_v == INT64_MIN) step_v = -INT64_MAX;
        auto indices = [&](int64_t len) {
            // Python's slice.indices()
            int64_t lo, hi;
            auto clampi = [&](std::optional<int64_t> x, int64_t dflt, bool is_start) {
                if (!x) return dflt;
                int64_t v = *x;
                if (v < 0) {
                    v = v < -len ? (step_v < 0 ? -1 : 0) : v + len;
                } else if (v >= len) {
                    v = step_v < 0 ? len - 1 : len;
                }
                (void)is_start;
                return v;
            };
            if (step_v > 0) {
                lo = clampi(parts[0], 0, true);
                hi = clampi(parts[1], len, false);
            } else {
                lo = clampi(parts[0], len - 1, true);
                hi = clampi(parts[1], -1, false);
            }
            std::vector<int64_t> idx;
            if (step_v > 0)
                for (int64_t k = lo; k < hi; k += step_v) idx.push_back(k);
            else
                for (int64_t k = lo; k > hi; k += step_v) idx.push_back(k);
            return idx;
        };
        if (o->t == Type::List) {
            std::vector<Value> items;
            for (int64_t k : indices((int64_t)o->l->items.size())) items.push_back(o->l->items[k]);
            return make_list(std::move(items), o->tuple);
        }
        if (o->t == Type::String) {
            const std::string& s = o->sv();
            std::string out;
            if (is_ascii(s)) {
                for (int64_t k : indices((int64_t)s.size())) out += s[k];
            } else {
                auto offs = cp_offsets(s);
                for (int64_t k : indices((int64_t)offs.size() - 1)) out.append(s, offs[k], offs[k + 1] - offs[k]);
            }
            return make_string(std::move(out));
        }
        return Value::undefined(std::string("a slice of a ") + type_name(*o));
    }

    Expected<Value> get_attr(const Value& o, const std::string& name, size_t pos);
    Expected<Value> get_item(const Value& o, const Value& key, size_t pos);
    Expected<Value> binary_op(const std::string& op, const Value& l, const Value& r);
    Expected<bool> compare(const std::string& op, const Value& l, const Value& r);
    Expected<bool> contains(const Value& item, const Value& container);
    Expected<Value> apply_filter(const std::string& name, const Value& v, CallArgs& args);
    Expected<bool> apply_test(const std::string& name, const Value& v, CallArgs& args);
    Expected<Value> string_method(const Value& self, const std::string& name, CallArgs& args);
    Expected<Value> percent_format(const std::string& fmt, const std::vector<Value>& args, const Value* mapping);
    Expected<Value> dict_method(const Value& self, const std::string& name, CallArgs& args);

    Value method(const Value& self, const std::string& name) {
        Value v;
        v.t = Type::Func;
        v.fn = std::make_shared<Callable>();
        v.fn->name = name;
        Value captured = self;
        v.fn->fn = [captured, name](Renderer& r, CallArgs& a) -> Expected<Value> {
            if (captured.t == Type::String) return r.string_method(captured, name, a);
            return r.dict_method(captured, name, a);
        };
        return v;
    }

    const Program& prog_;
    const RenderOptions& opt_;
    const RenderLimits& lim_;
    Scope globals_;
    std::shared_ptr<Scope> root_ = std::make_shared<Scope>();
    std::vector<std::shared_ptr<Scope>> scopes_;
    std::string* out_ = nullptr;
    uint64_t steps_ = 0;
    size_t total_bytes_ = 0;
    int call_depth_ = 0;
    int eval_depth_ = 0;
};

// ---- attribute and item access (jinja2: attribute first for `.`, item first for `[]`)

static const char* k_str_methods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                      "replace", "upper", "lower", "title", "capitalize", "find", "rfind", "format",
                                      "join", "count", "splitlines", "isdigit", "isalpha", "isalnum", "isspace",
                                      "isupper", "islower", "index", "swapcase", "center", "ljust", "rjust", "zfill"};
static const char* k_dict_methods[] = {"get", "items", "keys", "values"};

Expected<Value> Renderer::get_attr(const Value& o, const std::string& name, size_t pos) {
    if (auto c = charge(o); !c) return c.error();
    switch (o.t) {
    case Type::Undefined: return err(pos, "'" + o.sv() + "' is undefined (reading its attribute '" + name + "')");
    case Type::String:
        for (const char* m : k_str_methods)
            if (name == m) return method(o, name);
        return Value::undefined("'str object' has no attribute '" + name + "'");
    case Type::Dict: {
        for (const char* m : k_dict_methods)
            if (name == m) return method(o, name);
        if (const Value* v = dict_find(*o.d, name)) return *v;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Type::Namespace:
        if (const Value* v = dict_find(*o.d, name)) return *v;
        return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    default: return Value::undefined(std::string("'") + type_name(o) + " object' has no attribute '" + name + "'");
    }
}

Expected<Value> Renderer::get_item(const Value& o, const Value& key, size_t pos) {
    if (auto c = charge(o); !c) return c.error();
    switch (o.t) {
    case Type::Undefined: return err(pos, "'" + o.sv() + "' is undefined (reading an item of it)");
    case Type::Dict:
        if (const Value* v = dict_find(*o.d, key)) return *v;
        if (key.is_str()) return get_attr(o, key.sv(), pos);
        return Value::undefined("'dict object' has no item " + to_str(key));
    case Type::Namespace:
        if (key.is_str()) return get_attr(o, key.sv(), pos);
        return Value::undefined("an item of a namespace");
    case Type::List:
        if (key.is_int()) {
            int64_t k = key.as_int(), n = (int64_t)o.l->items.size();
            if (k < 0) k += n;
            if (k < 0 || k >= n) return Value::undefined("'list object' has no element " + std::to_string(key.as_int()));
            return o.l->items[k];
        }
        return Value::undefined("'list object' has no attribute " + to_str(key));
    case Type::String:
        if (key.is_int()) {
            const std::string& s = o.sv();
            int64_t k = key.as_int();
            if (is_ascii(s)) {
                int64_t n = (int64_t)s.size();
                if (k < 0) k += n;
                if (k < 0 || k >= n) return Value::undefined("'str object' has no element " + std::to_string(key.as_int()));
                return Value::str(std::string(1, s[k]));
            }
            int64_t n = (int64_t)cp_length(s);
            if (k < 0) k += n;
            if (k < 0 || k >= n) return Value::undefined("'str object' has no element " + std::to_string(key.as_int()));
            size_t i = 0;
            for (int64_t c = 0; c < k; c++) utf8::decode_loose(s, i);
            size_t start = i;
            utf8::decode_loose(s, i);
            return Value::str(s.substr(start, i - start));
        }
        if (key.is_str()) return get_attr(o, key.sv(), pos);
        return Value::undefined("an item of a str");
    default: return Value::undefined(std::string("an item of a ") + type_name(o));
    }
}

// ---- operators

Expected<Value> Renderer::binary_op(const std::string& op, const Value& l, const Value& r) {
    if (l.t == Type::Undefined) return err("'" + l.sv() + "' is undefined");
    if (r.t == Type::Undefined) return err("'" + r.sv() + "' is undefined");
    auto unsupported = [&]() {
        return err("unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
    };
    if (l.is_num() && r.is_num()) {
        bool ints = l.is_int() && r.is_int();
        int64_t a = l.as_int(), b = r.as_int(), out = 0;
        double x = l.as_float(), y = r.as_float();
        if (op == "+") {
            if (!ints) return Value::number(x + y);
            if (__builtin_add_overflow(a, b, &out)) return err("integer overflow in +");
            return Value::integer(out);
        }
        if (op == "-") {
            if (!ints) return Value::number(x - y);
            if (__builtin_sub_overflow(a, b, &out)) return err("integer overflow in -");
            return Value::integer(out);
        }
        if (op == "*") {
            if (!ints) return Value::number(x * y);
            if (__builtin_mul_overflow(a, b, &out)) return err("integer overflow in *");
            return Value::integer(out);
        }
        if (op == "/") {
            if (y == 0) return err("division by zero");
            return Value::number(x / y);
        }
        if (op == "//" || op == "%") {
            if (ints) {
                if (b == 0) return err(op == "//" ? "integer division by zero" : "integer modulo by zero");
                if (a == INT64_MIN && b == -1) return err("integer overflow in " + op);
                int64_t q = a / b, m = a % b;
                if (m != 0 && ((m < 0) != (b < 0))) {
                    q -= 1;
                    m += b;
                }
                return Value::integer(op == "//" ? q : m);
            }
            if (y == 0) return err("float division by zero");
            double q = std::floor(x / y);
            double m = std::fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return Value::number(op == "//" ? q : m);
        }
        if (op == "**") {
            if (ints && b >= 0) {
                int64_t res = 1, base = a;
                int64_t e = b;
                while (e > 0) {
                    if (e & 1)
                        if (__builtin_mul_overflow(res, base, &res)) return err("integer overflow in **");
                    e >>= 1;
                    if (e > 0 && __builtin_mul_overflow(base, base, &base)) return err("integer overflow in **");
                }
                return Value::integer(res);
            }
            if (x == 0 && y < 0) return err("0.0 cannot be raised to a negative power");
            return Value::number(std::pow(x, y));
        }
        return unsupported();
    }
    if (op == "+") {
        if (l.is_str() && r.is_str()) {
            auto c = check_size(l.sv().size() + r.sv().size());
            if (!c) return c.error();
            return make_string(l.sv() + r.sv());
        }
        if (l.t == Type::List && r.t == Type::List && l.tuple == r.tuple) {
            std::vector<Value> items = l.l->items;
            items.insert(items.end(), r.l->items.begin(), r.l->items.end());
            return make_list(std::move(items), l.tuple);
        }
        if (l.is_str() || r.is_str())
            return err(std::string("can only concatenate str (not \"") + type_name(l.is_str() ? r : l) + "\") to str");
        return unsupported();
    }
    if (op == "*") {
        const Value* seq = l.is_int() ? &r : &l;
        const Value* cnt = l.is_int() ? &l : &r;
        if (!cnt->is_int()) return unsupported();
        int64_t n = std::max<int64_t>(0, cnt->as_int());
        if (seq->is_str()) {
            if (n > 0 && seq->sv().size() > 0 && (uint64_t)n > lim_.max_output_bytes / seq->sv().size() + 1)
                return check_size(lim_.max_output_bytes + 1).error();
            auto c = check_size(seq->sv().size() * (size_t)n);
            if (!c) return c.error();
            std::string s;
            s.reserve(seq->sv().size() * n);
            for (int64_t k = 0; k < n; k++) s += seq->sv();
            return make_string(std::move(s));
        }
        if (seq->t == Type::List) {
            size_t m = seq->l->items.size();
            if (m > 0 && (uint64_t)n > lim_.max_list_items / m + 1)
                return err("a list of more than " + std::to_string(lim_.max_list_items) + " items");
            std::vector<Value> items;
            for (int64_t k = 0; k < n; k++) items.insert(items.end(), seq->l->items.begin(), seq->l->items.end());
            return make_list(std::move(items), seq->tuple);
        }
        return unsupported();
    }
    if (op == "%" && l.is_str()) {
        std::vector<Value> args;
        if (r.t == Type::List && r.tuple) args = r.l->items;
        else args.push_back(r);
        return percent_format(l.sv(), args, r.t == Type::Dict ? &r : nullptr);
    }
    return unsupported();
}

// Python's ordering for the types it can order; an Error (TypeError) for the rest.
static int order(const Value& a, const Value& b, bool& ok) {
    if (a.is_num() && b.is_num()) {
        if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
        double x = a.as_float(), y = b.as_float();
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_str() && b.is_str()) return a.sv().compare(b.sv()) < 0 ? -1 : a.sv() == b.sv() ? 0 : 1;
    if (a.t == Type::List && b.t == Type::List && a.tuple == b.tuple) {
        size_t n = std::min(a.l->items.size(), b.l->items.size());
        for (size_t k = 0; k < n; k++) {
            if (equal(a.l->items[k], b.l->items[k])) continue;
            return order(a.l->items[k], b.l->items[k], ok);
        }
        return a.l->items.size() < b.l->items.size() ? -1 : a.l->items.size() > b.l->items.size();
    }
    ok = false;
    return 0;
}

Expected<bool> Renderer::contains(const Value& item, const Value& c) {
    if (auto ch = charge(c); !ch) return ch.error();
    switch (c.t) {
    case Type::String:
        if (!item.is_str())
            return err(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
        return c.sv().find(item.sv()) != std::string::npos;
    case Type::List:
        for (auto& x : c.l->items)
            if (equal(x, item)) return true;
        return false;
    case Type::Dict: return dict_find(*c.d, item) != nullptr;
    case Type::Undefined: return false;
    default: return err(std::string("argument of type '") + type_name(c) + "' is not iterable");
    }
}

Expected<bool> Renderer::compare(const std::string& op, const Value& l, const Value& r) {
    if (auto c = charge(l); !c) return c.error();
    if (auto c = charge(r); !c) return c.error();
    if (op == "==") return equal(l, r);
    if (op == "!=") return !equal(l, r);
    if (op == "in") return contains(l, r);
    if (op == "notin") {
        auto c = contains(l, r);
        if (!c) return c;
        return !*c;
    }
    if (l.t == Type::Undefined) return err("'" + l.sv() + "' is undefined");
    if (r.t == Type::Undefined) return err("'" + r.sv() + "' is undefined");
    bool ok = true;
    int o = order(l, r, ok);
    if (!ok)
        return err("'" + op + "' not supported between instances of '" + type_name(l) + "' and '" + type_name(r) + "'");
    if (op == "<") return o < 0;
    if (op == ">") return o > 0;
    if (op == "<=") return o <= 0;
    return o >= 0;
}

// ---- string methods (Python's)

static std::vector<uint32_t> decode_all(const std::string& s) {
    std::vector<uint32_t> out;
    size_t i = 0;
    while (i < s.size()) out.push_back(utf8::decode_loose(s, i));
    return out;
}

// strip(chars) by code point: which = 1 left, 2 right, 3 both.
static std::string py_strip(const std::string& s, const Value* chars, int which) {
    std::vector<uint32_t> set;
    bool use_set = chars && chars->is_str();
    if (use_set) set = decode_all(chars->sv());
    auto strip_it = [&](uint32_t cp) {
        return use_set ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
    };
    auto offs = cp_offsets(s);
    size_t n = offs.size() - 1, lo = 0, hi = n;
    auto cp_at = [&](size_t k) {
        size_t i = offs[k];
        return utf8::decode_loose(s, i);
    };
    if (which & 1)
        while (lo < hi && strip_it(cp_at(lo))) lo++;
    if (which & 2)
        while (hi > lo && strip_it(cp_at(hi - 1))) hi--;
    return s.substr(offs[lo], offs[hi] - offs[lo]);
}

// Simple case mappings for ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth Latin
// (what chat content mostly holds); other code points have no case here.
static uint32_t cp_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if ((c >= 0xc0 && c <= 0xde && c != 0xd7) || (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) || (c >= 0x410 && c <= 0x42f) ||
        (c >= 0xff21 && c <= 0xff3a))
        return c + 0x20;
    if (c >= 0x400 && c <= 0x40f) return c + 0x50;
    if (c == 0x178) return 0xff;
    if (c == 0x386) return 0x3ac;
    if (c >= 0x388 && c <= 0x38a) return c + 0x25;
    if (c == 0x38c) return 0x3cc;
    if (c == 0x38e || c == 0x38f) return c + 0x3f;
    if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c | 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c + 1 : c;
    return c;
}
static uint32_t cp_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if ((c >= 0xe0 && c <= 0xfe && c != 0xf7) || (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) || (c >= 0x430 && c <= 0x44f) ||
        (c >= 0xff41 && c <= 0xff5a))
        return c - 0x20;
    if (c >= 0x450 && c <= 0x45f) return c - 0x50;
    if (c == 0xff) return 0x178;
    if (c == 0xb5) return 0x39c;
    if (c == 0x131) return 'I';
    if (c == 0x3c2) return 0x3a3;
    if (c == 0x3ac) return 0x386;
    if (c >= 0x3ad && c <= 0x3af) return c - 0x25;
    if (c == 0x3cc) return 0x38c;
    if (c == 0x3cd || c == 0x3ce) return c - 0x3f;
    if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c & ~1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c : c - 1;
    return c;
}
static bool cp_cased(uint32_t c) { return cp_lower(c) != c || cp_upper(c) != c || c == 0xdf; }
static void put_upper(std::string& out, uint32_t c) {
    if (c == 0xdf) out += "SS";  // Python: 'ß'.upper() == 'SS'
    else utf8::encode(cp_upper(c), out);
}

static std::string ascii_lower(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        size_t at = i;
        uint32_t c = utf8::decode_loose(s, i);
        if (c < 0x80 || i - at > 1) utf8::encode(cp_lower(c), out);
        else out += s[at];  // a stray byte stays as it was
    }
    return out;
}
static std::string ascii_upper(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        size_t at = i;
        uint32_t c = utf8::decode_loose(s, i);
        if (c < 0x80 || i - at > 1) put_upper(out, c);
        else out += s[at];
    }
    return out;
}
// Python's str.title(): a cased character after an uncased one starts a word.
static std::string py_title(const std::string& s) {
    std::string out;
    bool prev_cased = false;
    size_t i = 0;
    while (i < s.size()) {
        size_t at = i;
        uint32_t c = utf8::decode_loose(s, i);
        if (c >= 0x80 && i - at == 1) {
            out += s[at];
            prev_cased = false;
            continue;
        }
        bool cased = cp_cased(c);
        if (cased && !prev_cased) put_upper(out, c);
        else if (cased) utf8::encode(cp_lower(c), out);
        else utf8::encode(c, out);
        prev_cased = cased;
    }
    return out;
}
static std::string py_capitalize(const std::string& s) {
    if (s.empty()) return s;
    size_t i = 0;
    uint32_t c = utf8::decode_loose(s, i);
    std::string out;
    if (c >= 0x80 && i == 1) out += s[0];
    else put_upper(out, c);
    return out + ascii_lower(s.substr(i));
}

static std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
    std::vector<std::string> parts;
    if (!sep || sep->t == Type::None) {
        // Runs of whitespace; leading/trailing whitespace gives no empty parts.
        std::vector<std::pair<size_t, size_t>> words;
        size_t i = 0, n = s.size();
        while (i < n) {
            while (i < n && is_ws(s[i])) i++;
            if (i >= n) break;
            size_t j = i;
            while (j < n && !is_ws(s[j])) j++;
            words.emplace_back(i, j);
            i = j;
        }
        if (maxsplit < 0 || (int64_t)words.size() <= maxsplit + 1) {
            for (auto& [a, b] : words) parts.push_back(s.substr(a, b - a));
            return parts;
        }
        if (!from_right) {
            for (int64_t k = 0; k < maxsplit; k++) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
            size_t rest = words[maxsplit].first, end = n;
            while (end > rest && is_ws(s[end - 1])) end--;
            parts.push_back(s.substr(rest, end - rest));
        } else {
            size_t cut = words.size() - maxsplit;
            size_t start = 0;
            while (start < n && is_ws(s[start])) start++;
            parts.push_back(s.substr(start, words[cut - 1].second - start));
            for (size_t k = cut; k < words.size(); k++) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
        }
        return parts;
    }
    const std::string& d = sep->sv();
    if (!from_right) {
        size_t start = 0;
        int64_t n_split = 0;
        while (maxsplit < 0 || n_split < maxsplit) {
            size_t p = s.find(d, start);
            if (p == std::string::npos) break;
            parts.push_back(s.substr(start, p - start));
            start = p + d.size();
            n_split++;
        }
        parts.push_back(s.substr(start));
        return parts;
    }
    size_t end = s.size();
    int64_t n_split = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || n_split < maxsplit) {
        if (end < d.size()) break;
        size_t p = s.rfind(d, end - d.size());
        if (p == std::string::npos) break;
        rev.push_back(s.substr(p + d.size(), end - p - d.size()));
        end = p;
        n_split++;
    }
    rev.push_back(s.substr(0, end));
    return std::vector<std::string>(rev.rbegin(), rev.rend());
}

static std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
    std::string out;
    if (old.empty()) {
        // Python inserts `rep` between code points (and at both ends).
        auto offs = cp_offsets(s);
        int64_t done = 0;
        for (size_t k = 0; k + 1 < offs.size(); k++) {
            if (count < 0 || done < count) {
                out += rep;
                done++;
            }
            out.append(s, offs[k], offs[k + 1] - offs[k]);
        }
        if (count < 0 || done < count) out += rep;
        return out;
    }
    size_t start = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        size_t p = s.find(old, start);
        if (p == std::string::npos) break;
        out.append(s, start, p - start);
        out += rep;
        start = p + old.size();
        done++;
    }
    out.append(s, start);
    return out;
}

static size_t replace_size(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
    if (old.empty()) {
        size_t n = cp_length(s) + 1;
        if (count >= 0) n = std::min<size_t>(n, (size_t)count);
        return s.size() + n * rep.size();
    }
    size_t start = 0, n = 0;
    while (count < 0 || (int64_t)n < count) {
        size_t p = s.find(old, start);
        if (p == std::string::npos) break;
        n++;
        start = p + old.size();
    }
    return s.size() - n * old.size() + n * rep.size();
}

Expected<Value> Renderer::string_method(const Value& self, const std::string& name, CallArgs& a) {
    if (auto c = charge(self); !c) return c.error();
    const std::string& s = self.sv();
    auto arg = [&](size_t k, const char* kw) -> const Value* {
        if (k < a.pos.size()) return &a.pos[k];
        return a.kwarg(kw);
    };
    auto need_str = [&](const Value* v, const char* what) -> Expected<bool> {
        if (!v || !v->is_str()) return err(name + "() needs a string " + what);
        return true;
    };
    auto int_arg = [&](size_t k, const char* kw, int64_t dflt) -> Expected<int64_t> {
        const Value* v = arg(k, kw);
        if (!v || v->t == Type::None) return dflt;
        if (!v->is_int()) return err(name + "(): '" + kw + "' must be an integer");
        return v->as_int();
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* c = arg(0, "chars");
        if (c && c->t != Type::None && !c->is_str()) return err(name + "() arg must be None or str");
        return make_string(py_strip(s, c, name == "strip" ? 3 : name == "lstrip" ? 1 : 2));
    }
    if (name == "split" || name == "rsplit") {
        const Value* sep = arg(0, "sep");
        if (sep && sep->t != Type::None) {
            auto c = need_str(sep, "separator");
            if (!c) return c.error();
            if (sep->sv().empty()) return err("empty separator");
        }
        auto m = int_arg(1, "maxsplit", -1);
        if (!m) return m.error();
        std::vector<Value> items;
        for (auto& p : py_split(s, sep, *m, name == "rsplit")) items.push_back(Value::str(std::move(p)));
        total_bytes_ += s.size();
        return make_list(std::move(items));
    }
    if (name == "splitlines") {
        std::vector<Value> items;
        size_t start = 0;
        for (size_t k = 0; k < s.size(); k++) {
            if (s[k] == '\n' || s[k] == '\r') {
                items.push_back(Value::str(s.substr(start, k - start)));
                if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') k++;
                start = k + 1;
            }
        }
        if (start < s.size()) items.push_back(Value::str(s.substr(start)));
        total_bytes_ += s.size();
        return make_list(std::move(items));
    }
    if (name == "startswith" || name == "endswith") {
        const Value* p = arg(0, "prefix");
        if (!p) return err(name + "() takes at least 1 argument");
        std::vector<std::string> cands;
        if (p->is_str()) cands.push_back(p->sv());
        else if (p->t == Type::List && p->tuple) {
            for (auto& x : p->l->items) {
                if (!x.is_str()) return err(name + "(): the tuple must hold strings");
                cands.push_back(x.sv());
            }
        } else return err(name + std::string("() first arg must be str or a tuple of str, not ") + type_name(*p));
        for (auto& c : cands) {
            if (name == "startswith" ? s.compare(0, c.size(), c) == 0 && s.size() >= c.size()
                                     : s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0)
                return Value::boolean(true);
        }
        return Value::boolean(false);
    }
    if (name == "replace") {
        const Value* o = arg(0, "old");
        const Value* n = arg(1, "new");
        auto c1 = need_str(o, "old");
        if (!c1) return c1.error();
        auto c2 = need_str(n, "new");
        if (!c2) return c2.error();
        auto cnt = int_arg(2, "count", -1);
        if (!cnt) return cnt.error();
        auto c = check_size(replace_size(s, o->sv(), n->sv(), *cnt));
        if (!c) return c.error();
        return make_string(py_replace(s, o->sv(), n->sv(), *cnt));
    }
    if (name == "upper") return make_string(ascii_upper(s));
    if (name == "lower") return make_string(ascii_lower(s));
    if (name == "title") return make_string(py_title(s));
    if (name == "capitalize") return make_string(py_capitalize(s));
    if (name == "swapcase") {
        std::string o = s;
        for (auto& c : o) c = std::isupper((unsigned char)c) ? (char)std::tolower((unsigned char)c) : (char)std::toupper((unsigned char)c);
        return make_string(std::move(o));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
        const Value* sub = arg(0, "sub");
        auto c = need_str(sub, "argument");
        if (!c) return c.error();
        if (name == "count") {
            if (sub->sv().empty()) return Value::integer((int64_t)cp_length(s) + 1);
            int64_t n = 0;
            size_t p = 0;
            while ((p = s.find(sub->sv(), p)) != std::string::npos) {
                n++;
                p += sub->sv().size();
            }
            return Value::integer(n);
        }
        size_t p = name == "rfind" ? s.rfind(sub->sv()) : s.find(sub->sv());
        if (p == std::string::npos) {
            if (name == "index") return err("substring not found");
            return Value::integer(-1);
        }
        return Value::integer((int64_t)cp_length(s.substr(0, p)));
    }
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
        name == "islower") {
        if (s.empty()) return Value::boolean(false);
        bool any_cased = false, ok = true;
        for (unsigned char c : s) {
            if (name == "isdigit") ok = ok && std::isdigit(c);
            else if (name == "isalpha") ok = ok && std::isalpha(c);
            else if (name == "isalnum") ok = ok && std::isalnum(c);
            else if (name == "isspace") ok = ok && is_ws((char)c);
            else if (name == "isupper") {
                if (std::islower(c)) ok = false;
                if (std::isupper(c)) any_cased = true;
            } else {
                if (std::isupper(c)) ok = false;
                if (std::islower(c)) any_cased = true;
            }
        }
        if (name == "isupper" || name == "islower") ok = ok && any_cased;
        return Value::boolean(ok);
    }
    if (name == "join") {
        const Value* it = arg(0, "iterable");
        if (!it) return err("join() takes exactly one argument");
        auto items = iterate(*it, cur_pos_);
        if (!items) return items.error();
        std::string out;
        for (size_t k = 0; k < items->size(); k++) {
            if (!(*items)[k].is_str())
                return err("sequence item " + std::to_string(k) + ": expected str instance, " + type_name((*items)[k]) + " found");
            if (k) out += s;
            out += (*items)[k].sv();
            auto c = check_size(out.size());
            if (!c) return c.error();
        }
        return make_string(std::move(out));
    }
    if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
        auto w = int_arg(0, "width", 0);
        if (!w) return w.error();
        auto c = check_size((size_t)std::max<int64_t>(0, std::min<int64_t>(*w, (int64_t)lim_.max_output_bytes + 1)));
        if (!c) return c.error();
        int64_t len = (int64_t)cp_length(s);
        if (*w <= len) return self;
        int64_t pad = *w - len;
        std::string fill = " ";
        if (name != "zfill" && arg(1, "fillchar") && arg(1, "fillchar")->is_str()) fill = arg(1, "fillchar")->sv();
        auto rep = [&](int64_t n) {
            std::string o;
            for (int64_t k = 0; k < n; k++) o += name == "zfill" ? "0" : fill;
            return o;
        };
        if (name == "ljust") return make_string(s + rep(pad));
        if (name == "rjust" || name == "zfill") return make_string(rep(pad) + s);
        int64_t left = pad / 2 + (pad & *w & 1);
        return make_string(rep(left) + s + rep(pad - left));
    }
    if (name == "format") {
        // {} / {0} / {name} replacement fields, {{ and }} escapes; no format specs.
        std::string out;
        size_t auto_idx = 0;
        for (size_t k = 0; k < s.size(); k++) {
            char c = s[k];
            if (c == '{' && k + 1 < s.size() && s[k + 1] == '{') {
                out += '{';
                k++;
            } else if (c == '}' && k + 1 < s.size() && s[k + 1] == '}') {
                out += '}';
                k++;
            } else if (c == '{') {
                size_t e = s.find('}', k);
                if (e == std::string::npos) return err("format(): a '{' is never closed");
                std::string field = s.substr(k + 1, e - k - 1);
                if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
                    return err("format(): format specs are not supported ('" + field + "')");
                const Value* v = nullptr;
                if (field.empty()) v = auto_idx < a.pos.size() ? &a.pos[auto_idx++] : nullptr;
                else if (std::all_of(field.begin(), field.end(), [](char ch) { return std::isdigit((unsigned char)ch); })) {
                    size_t idx = std::strtoul(field.c_str(), nullptr, 10);
                    v = idx < a.pos.size() ? &a.pos[idx] : nullptr;
                } else v = a.kwarg(field);
                if (!v) return err("format(): no argument for the field '{" + field + "}'");
                append_str(out, *v);
                k = e;
                auto cs = check_size(out.size());
                if (!cs) return cs.error();
            } else if (c == '}') {
                return err("format(): single '}' encountered");
            } else out += c;
        }
        return make_string(std::move(out));
    }
    return err("str has no method '" + name + "'");
}

// Python's printf-style `fmt % args`: %s %r %d %i %f %e %g %x %o %c %% with flags (-+ 0#), width
// and precision, and %(name)s with a mapping.
Expected<Value> Renderer::percent_format(const std::string& fmt, const std::vector<Value>& args, const Value* mapping) {
    std::string out;
    size_t next = 0;
    for (size_t k = 0; k < fmt.size(); k++) {
        if (fmt[k] != '%') {
            out += fmt[k];
            continue;
        }
        if (++k >= fmt.size()) return err("incomplete format");
        const Value* arg = nullptr;
        if (fmt[k] == '(') {
            size_t e = fmt.find(')', k);
            if (e == std::string::npos) return err("incomplete format key");
            if (!mapping) return err("format requires a mapping");
            arg = dict_find(*mapping->d, fmt.substr(k + 1, e - k - 1));
            if (!arg) return err("format: no key '" + fmt.substr(k + 1, e - k - 1) + "'");
            k = e + 1;
        }
        std::string spec = "%";
        while (k < fmt.size() && std::strchr("-+ 0#", fmt[k])) spec += fmt[k++];
        size_t n_digits = 0;
        while (k < fmt.size() && std::isdigit((unsigned char)fmt[k])) spec += fmt[k++], n_digits++;
        if (k < fmt.size() && fmt[k] == '.') {
            spec += fmt[k++];
            while (k < fmt.size() && std::isdigit((unsigned char)fmt[k])) spec += fmt[k++], n_digits++;
        }
        if (n_digits > 4 || spec.size() > 16) return err("format: the width or precision is too large (at most 3 digits)");
        if (k >= fmt.size()) return err("incomplete format");
        char conv = fmt[k];
        if (conv == '%') {
            out += '%';
            continue;
        }
        if (!arg) {
            if (mapping && args.empty()) arg = mapping;
            else if (next < args.size()) arg = &args[next++];
            else return err("not enough arguments for format string");
        }
        char buf[512];
        if (conv == 's' || conv == 'r') {
            std::string text;
            if (conv == 's') append_str(text, *arg);
            else append_repr(text, *arg);
            size_t width = 0, prec = std::string::npos;
            size_t dot = spec.find('.');
            std::string w = spec.substr(1, dot == std::string::npos ? std::string::npos : dot - 1);
            bool left = w.find('-') != std::string::npos;
            w.erase(std::remove_if(w.begin(), w.end(), [](char c) { return !std::isdigit((unsigned char)c); }), w.end());
            if (!w.empty()) width = std::stoul(w);
            if (dot != std::string::npos) prec = spec.size() > dot + 1 ? std::stoul(spec.substr(dot + 1)) : 0;
            if (prec != std::string::npos && prec < text.size()) text = text.substr(0, prec);
            size_t len = cp_length(text);
            if (len < width) text = left ? text + std::string(width - len, ' ') : std::string(width - len, ' ') + text;
            out += text;
        } else if (std::strchr("dixXo", conv)) {
            if (!arg->is_num()) return err(std::string("%") + conv + " format: a number is required, not " + type_name(*arg));
            int64_t x = arg->t == Type::Float ? (int64_t)std::trunc(std::clamp(arg->f, -9.2e18, 9.2e18)) : arg->as_int();
            std::string f = spec + "ll" + (conv == 'i' ? 'd' : conv);
            std::snprintf(buf, sizeof buf, f.c_str(), (long long)x);
            out += buf;
        } else if (std::strchr("feEgG", conv)) {
            if (!arg->is_num()) return err(std::string("%") + conv + " format: a number is required, not " + type_name(*arg));
            std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg->as_float());
            out += buf;
        } else if (conv == 'c') {
            if (arg->is_str() && cp_length(arg->sv()) == 1) out += arg->sv();
            else if (arg->is_int() && arg->as_int() >= 0 && arg->as_int() <= 0x10ffff)
                utf8::encode((uint32_t)arg->as_int(), out);
            else return err("%c requires an int or a single character");
        } else {
            return err(std::string("unsupported format character '") + conv + "'");
        }
        auto c = check_size(out.size());
        if (!c) return c.error();
    }
    if (!mapping && next < args.size()) return err("not all arguments converted during string formatting");
    return make_string(std::move(out));
}

Expected<Value> Renderer::dict_method(const Value& self, const std::string& name, CallArgs& a) {
    const Dict& d = *self.d;
    if (name == "get") {
        if (a.pos.empty()) return err("get() takes at least 1 argument");
        if (const Value* v = dict_find(d, a.pos[0])) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
    }
    std::vector<Value> items;
    for (auto& [k, v] : d.items) {
        if (name == "keys") items.push_back(k);
        else if (name == "values") items.push_back(v);
        else {
            auto pair = make_list({k, v}, true);
            if (!pair) return pair;
            items.push_back(std::move(*pair));
        }
    }
    return make_list(std::move(items));
}

// ---- globals

std::optional<Value> Renderer::builtin_global(const std::string& name) {
    auto fn = [&](std::function<Expected<Value>(Renderer&, CallArgs&)> f) {
        Value v;
        v.t = Type::Func;
        v.fn = std::make_shared<Callable>();
        v.fn->name = name;
        v.fn->fn = std::move(f);
        return v;
    };
    if (name == "raise_exception")
        return fn([](Renderer& r, CallArgs& a) -> Expected<Value> {
            std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
            return r.err("raise_exception: " + msg);
        });
    if (name == "strftime_now")
        return fn([](Renderer& r, CallArgs& a) -> Expected<Value> {
            if (a.pos.empty() || !a.pos[0].is_str()) return r.err("strftime_now() needs a format string");
            const std::string& f = a.pos[0].sv();
            if (f.size() > 256) return r.err("strftime_now(): the format is over 256 bytes");
            std::time_t t = r.opt_.now_unix ? (std::time_t)*r.opt_.now_unix : std::time(nullptr);
            std::tm tm{};
            if (r.opt_.now_unix) gmtime_r(&t, &tm);
            else localtime_r(&t, &tm);
            char buf[4096];
            size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
            if (n == 0 && !f.empty()) return Value::str("");
            return Value::str(std::string(buf, n));
        });
    if (name == "range")
        return fn([](Renderer& r, CallArgs& a) -> Expected<Value> {
            for (auto& x : a.pos)
                if (!x.is_int()) return r.err(std::string("range(): '") + type_name(x) + "' object cannot be interpreted as an integer");
            int64_t start = 0, stop = 0, stp = 1;
            if (a.pos.size() == 1) stop = a.pos[0].as_int();
            else if (a.pos.size() >= 2) {
                start = a.pos[0].as_int();
                stop = a.pos[1].as_int();
                if (a.pos.size() >= 3) stp = a.pos[2].as_int();
            } else return r.err("range() expects 1 to 3 integer arguments");
            if (stp == 0) return r.err("range() arg 3 must not be zero");
            // jinja2's sandbox caps ranges at 100000 items (MAX_RANGE).
            double n = std::ceil(((double)stop - (double)start) / (double)stp);
            if (n > 100000) return r.err("range() is too big: more than 100000 items (the sandbox's MAX_RANGE)");
            std::vector<Value> items;
            for (int64_t k = start; stp > 0 ? k < stop : k > stop; k += stp) items.push_back(Value::integer(k));
            return r.make_list(std::move(items));
        });
    if (name == "namespace" || name == "dict")
        return fn([name](Renderer& r, CallArgs& a) -> Expected<Value> {
            std::vector<std::pair<Value, Value>> items;
            for (auto& p : a.pos) {
                if (p.t != Type::Dict) return r.err(name + "() takes keyword arguments or a dict");
                for (auto& kv : p.d->items) items.push_back(kv);
            }
            for (auto& [k, v] : a.kw) items.emplace_back(Value::str(k), v);
            return r.make_dict(std::move(items), name == "namespace");
        });
    return std::nullopt;
}

// ---- tests

Expected<bool> Renderer::apply_test(const std::string& name, const Value& v, CallArgs& a) {
    auto arg0 = [&]() -> const Value* { return a.pos.empty() ? nullptr : &a.pos[0]; };
    if (name == "defined") return v.t != Type::Undefined;
    if (name == "undefined") return v.t == Type::Undefined;
    if (name == "none") return v.t == Type::None;
    if (name == "boolean") return v.t == Type::Bool;
    if (name == "true") return v.t == Type::Bool && v.b;
    if (name == "false") return v.t == Type::Bool && !v.b;
    if (name == "integer") return v.t == Type::Int;
    if (name == "float") return v.t == Type::Float;
    if (name == "number") return v.is_num();
    if (name == "string") return v.is_str();
    if (name == "mapping") return v.t == Type::Dict;
    if (name == "iterable") return v.t == Type::List || v.t == Type::Dict || v.is_str() || v.t == Type::Undefined;
    if (name == "sequence") return v.t == Type::List || v.t == Type::Dict || v.is_str() || v.t == Type::Undefined;
    if (name == "callable") return v.t == Type::Func;
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") {
        if (!v.is_str()) return false;
        return v.sv() == (name == "lower" ? ascii_lower(v.sv()) : ascii_upper(v.sv()));
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
        if (!v.is_int()) return err(std::string("the test '") + name + "' needs an integer, not " + type_name(v));
        if (name == "odd") return (v.as_int() % 2) != 0;
        if (name == "even") return (v.as_int() % 2) == 0;
        const Value* d = arg0();
        if (!d || !d->is_int() || d->as_int() == 0) return err("divisibleby needs a nonzero integer");
        if (d->as_int() == -1) return true;
        return v.as_int() % d->as_int() == 0;
    }
    if (name == "sameas") {
        const Value* o = arg0();
        if (!o) return err("sameas needs an argument");
        if (v.t != o->t) return false;
        if (v.t == Type::None || v.t == Type::Undefined) return v.t == Type::None;
        if (v.t == Type::Bool) return v.b == o->b;
        if (v.t == Type::List) return v.l == o->l;
        if (v.t == Type::Dict || v.t == Type::Namespace) return v.d == o->d;
        return equal(v, *o);
    }
    static const std::pair<const char*, const char*> cmp[] = {
        {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
        {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="},
        {">=", ">="}, {"in", "in"}};
    for (auto& [n, op] : cmp)
        if (name == n) {
            const Value* o = arg0();
            if (!o) return err(std::string("the test '") + name + "' needs an argument");
            return compare(op, v, *o);
        }
    if (name == "filter" || name == "test") return false;
    return err("no test named '" + name + "'");
}

// ---- filters

static std::string html_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        switch (c) {
        case '&': o += "&amp;"; break;
        case '<': o += "&lt;"; break;
        case '>': o += "&gt;"; break;
        case '"': o += "&#34;"; break;
        case '\'': o += "&#39;"; break;
        default: o += c;
        }
    }
    return o;
}

Expected<Value> Renderer::apply_filter(const std::string& name, const Value& v, CallArgs& a) {
    if (auto c = charge(v); !c) return c.error();
    if (name == "sort" || name == "unique" || name == "dictsort") {
        // n log n (sort), up to n^2 / 64 (unique, charged as it goes)
        uint64_t n = size_of(v) / 16;
        if (auto c = step(cur_pos_, n * (uint64_t)std::log2((double)n + 2) / 8); !c) return c.error();
    }
    auto arg = [&](size_t k, const char* kw) -> const Value* {
        if (k < a.pos.size()) return &a.pos[k];
        return a.kwarg(kw);
    };
    auto need_defined = [&]() -> Expected<bool> {
        if (v.t == Type::Undefined) return err("'" + v.sv() + "' is undefined (filtered with '" + name + "')");
        return true;
    };
    // Looks up `attribute` ("a.b", "0") on x as jinja2's make_attrgetter.
    auto attr_of = [&](const Value& x, const Value& attribute) -> Expected<Value> {
        if (attribute.is_int()) return get_item(x, attribute, cur_pos_);
        std::string path = to_str(attribute);
        Value cur = x;
        size_t start = 0;
        while (true) {
            size_t dot = path.find('.', start);
            std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
            Value key = Value::str(part);
            if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit((unsigned char)c); }))
                key = Value::integer(std::strtoll(part.c_str(), nullptr, 10));
            auto r = get_item(cur, key, cur_pos_);
            if (!r) return r;
            cur = std::move(*r);
            if (dot == std::string::npos) return cur;
            start = dot + 1;
        }
    };
    auto case_key = [&](const Value& x, bool case_sensitive) {
        if (!case_sensitive && x.is_str()) return Value::str(ascii_lower(x.sv()));
        return x;
    };

    if (name == "safe" || (name == "list" && v.t == Type::List && !v.tuple)) return v;
    if (name == "string") return v.is_str() ? v : make_string(to_str(v));
    if (name == "trim") {
        const Value* c = arg(0, "chars");
        return make_string(py_strip(to_str(v), c, 3));
    }
    if (name == "lower") return make_string(ascii_lower(to_str(v)));
    if (name == "upper") return make_string(ascii_upper(to_str(v)));
    if (name == "capitalize") return make_string(py_capitalize(to_str(v)));
    if (name == "title") {
        // jinja2's do_title: words start after whitespace or one of -({[<
        std::string s = to_str(v), out;
        bool start = true;
        size_t i = 0;
        while (i < s.size()) {
            size_t at = i;
            uint32_t c = utf8::decode_loose(s, i);
            bool sep = c < 0x80 && (is_ws((char)c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
            if (c >= 0x80 && i - at == 1) out += s[at];
            else if (sep) utf8::encode(c, out);
            else if (start) put_upper(out, c);
            else utf8::encode(cp_lower(c), out);
            start = sep;
        }
        return make_string(std::move(out));
    }
    if (name == "escape" || name == "e" || name == "forceescape") return make_string(html_escape(to_str(v)));
    if (name == "replace") {
        const Value* o = arg(0, "old");
        const Value* n = arg(1, "new");
        if (!o || !n) return err("replace needs two arguments: old and new");
        std::string s = to_str(v), os = to_str(*o), ns = to_str(*n);
        int64_t count = -1;
        if (const Value* c = arg(2, "count"); c && c->is_int()) count = c->as_int();
        auto c = check_size(replace_size(s, os, ns, count));
        if (!c) return c.error();
        return make_string(py_replace(s, os, ns, count));
    }
    if (name == "length" || name == "count") {
        switch (v.t) {
        case Type::Undefined: return Value::integer(0);
        case Type::String: return Value::integer((int64_t)cp_length(v.sv()));
        case Type::List: return Value::integer((int64_t)v.l->items.size());
        case Type::Dict: return Value::integer((int64_t)v.d->items.size());
        default: return err(std::string("object of type '") + type_name(v) + "' has no len()");
        }
    }
    if (name == "default" || name == "d") {
        const Value* dflt = arg(0, "default_value");
        const Value* boolean = arg(1, "boolean");
        bool use = v.t == Type::Undefined || (boolean && truthy(*boolean) && !truthy(v));
        if (use) return dflt ? *dflt : Value::str("");
        return v;
    }
    if (name == "tojson") {
        JsonStyle st;
        const Value* ind = arg(0, "indent");
        if (ind && ind->t != Type::None) {
            st.has_indent = true;
            st.item_sep = ",";
            if (ind->is_int()) st.indent = std::string((size_t)std::clamp<int64_t>(ind->as_int(), 0, 64), ' ');
            else if (ind->is_str()) st.indent = ind->sv().substr(0, 64);
            else return err("tojson: indent must be an integer or a string");
        }
        if (const Value* sep = a.kwarg("separators"); sep && sep->t == Type::List && sep->l->items.size() == 2 &&
                                                      sep->l->items[0].is_str() && sep->l->items[1].is_str()) {
            st.item_sep = sep->l->items[0].sv();
            st.key_sep = sep->l->items[1].sv();
        }
        if (const Value* sk = a.kwarg("sort_keys")) st.sort_keys = truthy(*sk);
        if (const Value* ea = a.kwarg("ensure_ascii")) st.ensure_ascii = truthy(*ea);
        std::string out;
        auto r = to_json(out, v, st, 0, lim_.max_output_bytes);
        if (!r) return err(r.error().message);
        return make_string(std::move(out));
    }
    if (name == "items") {
        if (v.t == Type::Undefined) return make_list({});
        if (v.t != Type::Dict) return err(std::string("items: can only get the items of a mapping, not ") + type_name(v));
        return dict_method(v, "items", a);
    }
    if (name == "first" || name == "last") {
        if (v.t == Type::Undefined && name == "last") return err("'" + v.sv() + "' is undefined (filtered with 'last')");
        auto items = iterate(v, cur_pos_);
        if (!items) return items.error();
        if (items->empty()) return Value::undefined("the " + name + " item of an empty sequence");
        return name == "first" ? items->front() : items->back();
    }
    if (name == "list") {
        auto items = iterate(v, cur_pos_);
        if (!items) return items.error();
        return make_list(std::move(*items));
    }
    if (name == "reverse") {
        if (v.is_str()) {
            auto offs = cp_offsets(v.sv());
            std::string out;
            for (size_t k = offs.size() - 1; k-- > 0;) out.append(v.sv(), offs[k], offs[k + 1] - offs[k]);
            return make_string(std::move(out));
        }
        auto items = iterate(v, cur_pos_);
        if (!items) return items.error();
        std::reverse(items->begin(), items->end());
        return make_list(std::move(*items));
    }
    if (name == "join") {
        const Value* d = arg(0, "d");
        const Value* attribute = arg(1, "attribute");
        std::string sep = d ? to_str(*d) : "";
        auto items = iterate(v, cur_pos_);
        if (!items) return items.error();
        std::string out;
        for (size_t k = 0; k < items->size(); k++) {
            if (k) out += sep;
            if (attribute) {
                auto x = attr_of((*items)[k], *attribute);
                if (!x) return x;
                append_str(out, *x);
            } else append_str(out, (*items)[k]);
            auto c = check_size(out.size());
            if (!c) return c.error();
        }
        return make_string(std::move(out));
    }
    if (name == "int") {
        const Value* dflt = arg(0, "default");
        Value fallback = dflt ? *dflt : Value::integer(0);
        if (v.is_int()) return Value::integer(v.as_int());
        if (v.t == Type::Float) {
            if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
            return Value::integer((int64_t)v.f);
        }
        if (v.is_str()) {
            std::string s = py_strip(v.sv(), nullptr, 3);
            std::string digits;
            for (char c : s)
                if (c != '_') digits += c;
            int64_t x = 0;
            auto r = std::from_chars(digits.data() + (digits.size() && digits[0] == '+'), digits.data() + digits.size(), x);
            if (!digits.empty() && r.ec == std::errc() && r.ptr == digits.data() + digits.size()) return Value::integer(x);
            char* end = nullptr;
            double f = std::strtod(s.c_str(), &end);
            if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(f) && std::fabs(f) < 9.2e18)
                return Value::integer((int64_t)f);
        }
        return fallback;
    }
    if (name == "float") {
        const Value* dflt = arg(0, "default");
        Value fallback = dflt ? *dflt : Value::number(0.0);
        if (v.is_num()) return Value::number(v.as_float());
        if (v.is_str()) {
            std::string s = py_strip(v.sv(), nullptr, 3);
            char* end = nullptr;
            double f = std::strtod(s.c_str(), &end);
            if (!s.empty() && end == s.c_str() + s.size()) return Value::number(f);
        }
        return fallback;
    }
    if (name == "abs") {
        auto c = need_defined();
        if (!c) return c.error();
        if (v.t == Type::Float) return Value::number(std::fabs(v.f));
        if (v.is_int()) {
            if (v.as_int() == INT64_MIN) return err("integer overflow in abs");
            return Value::integer(std::llabs(v.as_int()));
        }
        return err(std::string("bad operand type for abs(): '") + type_name(v) + "'");
    }
    if (name == "round") {
        auto c = need_defined();
        if (!c) return c.error();
        if (!v.is_num()) return err(std::string("round: needs a number, not ") + type_name(v));
        int64_t prec = 0;
        if (const Value* p = arg(0, "precision"); p && p->is_int()) prec = std::clamp<int64_t>(p->as_int(), -20, 20);
        std::string method = "common";
        if (const Value* m = arg(1, "method"); m && m->is_str()) method = m->sv();
        double x = v.as_float(), scale = std::pow(10.0, (double)prec);
        double y = x * scale;
        if (method == "common") y = std::nearbyint(y);  // Python's round(): half to even
        else if (method == "floor") y = std::floor(y);
        else if (method == "ceil") y = std::ceil(y);
        else return err("round: method must be 'common', 'ceil' or 'floor'");
        return Value::number(y / scale);
    }
    if (name == "unique" || name == "sort" || name == "min" || name == "max" || name == "dictsort") {
        bool case_sensitive = false;
        const Value* attribute = a.kwarg("attribute");
        bool reverse = false;
        if (name == "sort") {
            if (const Value* r = arg(0, "reverse")) reverse = truthy(*r);
            if (const Value* c = arg(1, "case_sensitive")) case_sensitive = truthy(*c);
            if (!attribute) attribute = arg(2, "attribute");
        } else if (name == "dictsort") {
            if (const Value* c = arg(0, "case_sensitive")) case_sensitive = truthy(*c);
            if (const Value* r = arg(2, "reverse")) reverse = truthy(*r);
        } else {
            if (const Value* c = arg(0, "case_sensitive")) case_sensitive = truthy(*c);
            if (!attribute) attribute = arg(1, "attribute");
        }
        std::vector<Value> items;
        std::vector<Value> keys;
        if (name == "dictsort") {
            if (v.t != Type::Dict) return err("dictsort needs a mapping");
            bool by_value = false;
            if (const Value* b = arg(1, "by"); b && b->is_str()) by_value = b->sv() == "value";
            for (auto& [k, x] : v.d->items) {
                auto pair = make_list({k, x}, true);
                if (!pair) return pair;
                items.push_back(*pair);
                keys.push_back(case_key(by_value ? x : k, case_sensitive));
            }
        } else {
            auto it = iterate(v, cur_pos_);
            if (!it) return it.error();
            items = std::move(*it);
            for (auto& x : items) {
                Value k = x;
                if (attribute) {
                    auto r = attr_of(x, *attribute);
                    if (!r) return r;
                    k = std::move(*r);
                }
                keys.push_back(case_key(k, case_sensitive));
            }
        }
        if (name == "unique") {
            std::vector<Value> out, seen;
            for (size_t k = 0; k < items.size(); k++) {
                bool dup = false;
                for (auto& s : seen)
                    if (equal(s, keys[k])) {
                        dup = true;
                        break;
                    }
                if (dup) continue;
                seen.push_back(keys[k]);
                out.push_back(items[k]);
                auto st = step(cur_pos_, seen.size() / 64);
                if (!st) return st.error();
            }
            return make_list(std::move(out));
        }
        // A strict weak order over what Python can order (NaN sorts last), an Error otherwise.
        bool all_num = true, all_str = true;
        for (auto& k : keys) {
            all_num = all_num && k.is_num();
            all_str = all_str && k.is_str();
        }
        if (!keys.empty() && !all_num && !all_str)
            return err(name + ": can only order numbers or strings, not a mix (or other types)");
        std::vector<size_t> idx(items.size());
        for (size_t k = 0; k < idx.size(); k++) idx[k] = k;
        auto less = [&](size_t x, size_t y) {
            const Value &p = keys[x], &q = keys[y];
            if (all_str) return p.sv() < q.sv();
            if (p.is_int() && q.is_int()) return p.as_int() < q.as_int();
            double a1 = p.as_float(), b1 = q.as_float();
            bool na = std::isnan(a1), nb = std::isnan(b1);
            if (na || nb) return !na && nb;
            return a1 < b1;
        };
        if (name == "min" || name == "max") {
            if (items.empty()) return Value::undefined("the " + name + " of an empty sequence");
            size_t best = 0;
            for (size_t k = 1; k < items.size(); k++)
                if (name == "min" ? less(k, best) : less(best, k)) best = k;
            return items[best];
        }
        std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return reverse ? less(y, x) : less(x, y); });
        std::vector<Value> out;
        for (size_t k : idx) out.push_back(items[k]);
        return make_list(std::move(out));
    }
    if (name == "sum") {
        const Value* attribute = arg(0, "attribute");
        Value total = Value::integer(0);
        if (const Value* s = arg(1, "start")) total = *s;
        auto items = iterate(v, cur_pos_);
        if (!items) return items.error();
        for (auto& x : *items) {
            Value y = x;
            if (attribute) {
                auto r = attr_of(x, *attribute);
                if (!r) return r;
                y = *r;
            }
            auto r = binary_op("+", total, y);
            if (!r) return r;
            total = *r;
        }
        return total;
    }
    if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
        // jinja2 yields nothing for a false value (`if seq:` / `if value:`): none, undefined, 0, ''
        // (functionary's template filters `tools` that may be none).
        if (!truthy(v)) return make_list({});
        auto items = iterate(v, cur_pos_);
        if (!items) return items.error();
        std::vector<Value> out;
        if (name == "map") {
            const Value* attribute = a.kwarg("attribute");
            if (attribute) {
                const Value* dflt = a.kwarg("default");
                for (auto& x : *items) {
                    auto r = attr_of(x, *attribute);
                    if (!r) return r;
                    if (r->t == Type::Undefined && dflt) out.push_back(*dflt);
                    else out.push_back(std::move(*r));
                }
                return make_list(std::move(out));
            }
            if (a.pos.empty() || !a.pos[0].is_str()) return err("map needs a filter name or attribute=...");
            std::string fname = a.pos[0].sv();
            if (fname == "map") return err("map('map') is not supported");
            CallArgs rest;
            rest.pos.assign(a.pos.begin() + 1, a.pos.end());
            rest.kw = a.kw;
            for (auto& x : *items) {
                auto r = apply_filter(fname, x, rest);
                if (!r) return r;
                out.push_back(std::move(*r));
            }
            return make_list(std::move(out));
        }
        bool by_attr = name == "selectattr" || name == "rejectattr";
        bool want = name == "select" || name == "selectattr";
        size_t first_test = by_attr ? 1 : 0;
        if (by_attr && a.pos.empty()) return err(name + " needs an attribute name");
        std::string test = a.pos.size() > first_test ? to_str(a.pos[first_test]) : "";
        if (test == "select" || test == "map") return err(name + ": no test named '" + test + "'");
        CallArgs targs;
        if (a.pos.size() > first_test + 1) targs.pos.assign(a.pos.begin() + first_test + 1, a.pos.end());
        for (auto& x : *items) {
            Value subject = x;
            if (by_attr) {
                auto r = attr_of(x, a.pos[0]);
                if (!r) return r;
                subject = std::move(*r);
            }
            bool ok;
            if (test.empty()) ok = truthy(subject);
            else {
                auto r = apply_test(test, subject, targs);
                if (!r) return r.error();
                ok = *r;
            }
            if (ok == want) out.push_back(x);
        }
        return make_list(std::move(out));
    }
    if (name == "attr") {
        const Value* n = arg(0, "name");
        if (!n || !n->is_str()) return err("attr needs an attribute name");
        return get_attr(v, n->sv(), cur_pos_);
    }
    if (name == "indent") {
        std::string s = to_str(v);
        std::string pad = "    ";
        if (const Value* w = arg(0, "width")) {
            if (w->is_int()) pad = std::string((size_t)std::clamp<int64_t>(w->as_int(), 0, 256), ' ');
            else pad = to_str(*w);
        }
        bool first = false, blank = false;
        if (const Value* f = arg(1, "first")) first = truthy(*f);
        if (const Value* b = arg(2, "blank")) blank = truthy(*b);
        std::string out;
        size_t start = 0;
        bool is_first = true;
        while (true) {
            size_t nl = s.find('\n', start);
            std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
            bool add = is_first ? first : (blank || !py_strip(line, nullptr, 3).empty());
            if (add && !(is_first && line.empty() && nl == std::string::npos && !first)) out += pad;
            out += line;
            auto c = check_size(out.size());
            if (!c) return c.error();
            if (nl == std::string::npos) break;
            out += '\n';
            start = nl + 1;
            is_first = false;
        }
        return make_string(std::move(out));
    }
    if (name == "wordcount") {
        auto parts = py_split(to_str(v), nullptr, -1, false);
        return Value::integer((int64_t)parts.size());
    }
    if (name == "format") {
        if (!a.kw.empty()) {
            std::vector<std::pair<Value, Value>> items;
            for (auto& [k, x] : a.kw) items.emplace_back(Value::str(k), x);
            auto d = make_dict(std::move(items));
            if (!d) return d;
            return percent_format(to_str(v), {}, &*d);
        }
        return percent_format(to_str(v), a.pos, nullptr);
    }
    if (name == "batch" || name == "slice" || name == "groupby" || name == "truncate" ||
        name == "wordwrap" || name == "center" || name == "urlencode" || name == "xmlattr" || name == "striptags" ||
        name == "pprint" || name == "filesizeformat" || name == "urlize")
        return err("the filter '" + name + "' is not supported by this interpreter");
    return err("no filter named '" + name + "'");
}

// ============================================================================ Template

Template::~Template() = default;

Expected<std::shared_ptr<const Template>> Template::compile(const std::string& source) {
    auto prog = std::make_unique<Program>();
    // As jinja2's lexer: every \r\n, \r and \n becomes \n, and one trailing newline is dropped
    // (keep_trailing_newline is off in transformers' environment).
    prog->source.reserve(source.size());
    for (size_t k = 0; k < source.size(); k++) {
        if (source[k] == '\r') {
            prog->source += '\n';
            if (k + 1 < source.size() && source[k + 1] == '\n') k++;
        } else {
            prog->source += source[k];
        }
    }
    if (!prog->source.empty() && prog->source.back() == '\n') prog->source.pop_back();
    prog->map = SourceMap(prog->source);
    Lexer lexer(prog->source, prog->map);
    auto toks = lexer.run();
    if (!toks) return toks.error();
    Parser parser(std::move(*toks), prog->map);
    auto body = parser.parse_template();
    if (!body) return body.error();
    prog->body = std::move(*body);
    std::shared_ptr<Template> t(new Template());
    t->program_ = std::move(prog);
    return std::shared_ptr<const Template>(std::move(t));
}

Expected<std::string> Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
    Renderer r(*program_, options);
    return r.run(context);
}

}  // namespace steward::jinja
