// JSON Schema -> GBNF (one rule per schema node, named after its JSON pointer), the generic JSON
// grammar of response_format json_object, and the compile helpers of CompiledGrammar.
// Whitespace between tokens is bounded (`space`), so a document always ends.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "util/utf8.h"

namespace steward {

namespace {

// Ordered: properties are generated in the order the schema declares them (models expect it).
using json = nlohmann::ordered_json;

constexpr size_t k_max_properties = 1024;  // per object

// The shared primitives. A string's \u escapes exclude surrogates: a lone surrogate is not a
// character and JSON parsers (nlohmann among them) reject it.
constexpr const char* k_primitives = R"(space ::= | " " | "\n" [ \t]{0,20}
json-hex ::= [0-9a-fA-F]
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] json-hex{3} | [dD] [0-7] json-hex{2}))
json-string ::= "\"" json-char* "\"" space
json-int ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-integer ::= json-int space
json-number ::= json-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? space
json-boolean ::= ("true" | "false") space
json-null ::= "null" space
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" space (json-string ":" space json-value ("," space json-string ":" space json-value)*)? "}" space
json-array ::= "[" space (json-value ("," space json-value)*)? "]" space
json-date ::= [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])
json-time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
json-uuid ::= json-hex{8} "-" json-hex{4} "-" json-hex{4} "-" json-hex{4} "-" json-hex{12}
)";

// A GBNF literal for bytes (UTF-8 kept as is; quotes, backslashes and controls escaped).
std::string gbnf_literal(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"') out += "\\\"";
        else if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else {
            out += (char)c;
        }
    }
    return out + "\"";
}

// The bytes of the character at s[i], as the GBNF parser reads the literal back (decode_loose: an
// ill-formed byte is a character of its own), so that no piece of the trie splits a character.
size_t char_len(std::string_view s, size_t i) {
    const size_t start = i;
    utf8::decode_loose(s, i);
    return i - start;
}

// An alternation of literals as GBNF with their common prefixes factored out, as a trie of UTF-8
// characters: "value_12" | "value_13" becomes ("value_1" ("2" | "3")). The matcher then keeps one
// parse stack per branch of the current trie node instead of one per literal: a 100,000-value
// enum as a flat alternation held 100,000 stacks at its first byte, and every token mask walked
// them all (seconds per step, on the pool's step path).
std::string factored_alternation(std::vector<std::string> lits) {
    std::sort(lits.begin(), lits.end());
    lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
    // lits[b, e) share their first `depth` bytes; emits the alternation of their remainders.
    std::function<std::string(size_t, size_t, size_t)> node = [&](size_t b, size_t e, size_t depth) -> std::string {
        std::string alts;
        bool terminal = false;
        size_t i = b;
        while (i < e) {
            if (lits[i].size() == depth) {  // sorted: the empty remainder comes first
                terminal = true;
                i++;
                continue;
            }
            const size_t n = char_len(lits[i], depth);
            const std::string ch = lits[i].substr(depth, n);
            size_t j = i;
            while (j < e && lits[j].compare(depth, n, ch) == 0 && lits[j].size() >= depth + n) j++;
            // Extend the edge while every literal of the group continues with the same character.
            size_t d = depth + n;
            for (;;) {
                if (lits[i].size() == d) break;
                const size_t m = char_len(lits[i], d);
                bool same = true;
                for (size_t k = i; k < j && same; k++)
                    same = lits[k].size() >= d + m && lits[k].compare(d, m, lits[i], d, m) == 0;
                if (!same) break;
                d += m;
            }
            if (!alts.empty()) alts += " | ";
            alts += gbnf_literal(lits[i].substr(depth, d - depth));
            if (!(j == i + 1 && lits[i].size() == d)) alts += " " + node(i, j, d);
            i = j;
        }
        if (alts.empty()) return "";
        return terminal ? "(" + alts + ")?" : "(" + alts + ")";
    };
    return node(0, lits.size(), 0);
}

std::string escape_pointer_token(const std::string& t) {
    std::string out;
    for (char c : t) {
        if (c == '~') out += "~0";
        else if (c == '/') out += "~1";
        else out += c;
    }
    return out;
}

struct SchemaCompiler {
    const json& root;
    std::map<std::string, std::string> rules;   // name -> body
    std::map<std::string, std::string> by_ref;  // $ref -> rule name
    std::set<std::string> used_names;

    // Rule names from the pointer: [a-zA-Z0-9-] only, made unique.
    std::string name_for(const std::string& ptr) {
        std::string n = prefix;
        for (char c : ptr) n += (std::isalnum((unsigned char)c) ? c : '-');
        std::string u = n;
        for (int k = 2; used_names.count(u); ++k) u = n + "-" + std::to_string(k);
        used_names.insert(u);
        return u;
    }

    Error bad(const std::string& ptr, const std::string& what) const {
        return make_error("schema ", ptr.empty() ? "(root)" : ptr, ": ", what);
    }

    // Keywords whose constraint the grammar would silently drop: refused, so that what is generated
    // always validates.
    Expected<bool> check_supported(const json& s, const std::string& ptr) const {
        for (const char* k : {"multipleOf",
                              "uniqueItems", "patternProperties", "not", "if", "then", "else", "prefixItems",
                              "contains", "minProperties", "maxProperties", "dependentSchemas", "propertyNames"})
            if (s.contains(k))
                return bad(ptr + "/" + k, std::string("'") + k + "' is not supported by the grammar compiler; "
                                          "remove it (and check the value after generation)");
        return true;
    }

    int depth = 0;  // nested schemas being compiled: bounded so that hostile input cannot exhaust the stack
    std::string prefix = "s";  // of every rule name ([a-zA-Z0-9-])
    struct DepthGuard {
        int& d;
        ~DepthGuard() { --d; }
    };

    // Compiles `s` (at pointer `ptr`) into a rule; returns its name.
    Expected<std::string> compile(const json& s, const std::string& ptr) {
        DepthGuard guard{++depth};
        if (depth > 64) return bad(ptr, "schemas nest deeper than 64; flatten it or use $defs");
        if (s.is_boolean()) {
            if (s.get<bool>()) return std::string("json-value");
            return bad(ptr, "is false, which no value satisfies; remove it or use true");
        }
        if (!s.is_object()) return bad(ptr, "a schema must be an object or a boolean, got " + std::string(s.type_name()));
        auto u = check_supported(s, ptr);
        if (!u) return u.error();
        if (s.contains("$ref")) {
            const json& r = s["$ref"];
            if (!r.is_string()) return bad(ptr + "/$ref", "must be a string such as \"#/$defs/Name\"");
            return compile_ref(r.get<std::string>(), ptr + "/$ref");
        }
        const std::string name = name_for(ptr);
        auto body = compile_body(s, ptr);
        if (!body) return body.error();
        rules[name] = *body;
        return name;
    }

    Expected<std::string> compile_ref(const std::string& ref, const std::string& ptr) {
        auto it = by_ref.find(ref);
        if (it != by_ref.end()) return it->second;
        if (ref.rfind("#", 0) != 0)
            return bad(ptr, "only local references (\"#/$defs/Name\") are supported, got \"" + ref + "\"");
        json::json_pointer jp;
        try {
            jp = json::json_pointer(ref.substr(1));
        } catch (const std::exception&) {
            return bad(ptr, "\"" + ref + "\" is not a valid JSON pointer; write e.g. \"#/$defs/Name\"");
        }
        if (!root.contains(jp)) return bad(ptr, "\"" + ref + "\" points at nothing; define it under $defs");
        // Named before compiling so that recursive schemas refer to the rule being built.
        const std::string name = name_for(ref.substr(1));
        by_ref[ref] = name;
        rules[name] = "";  // placeholder
        auto body = compile_body_or_bool(root.at(jp), ref.substr(1));
        if (!body) return body.error();
        rules[name] = *body;
        return name;
    }

    // A $ref target: its body goes into the rule named for the reference.
    Expected<std::string> compile_body_or_bool(const json& s, const std::string& ptr) {
        if (s.is_object() && !s.contains("$ref")) {
            auto u = check_supported(s, ptr);
            if (!u) return u.error();
            return compile_body(s, ptr);
        }
        return compile(s, ptr);
    }

    Expected<std::string> compile_body(const json& s, const std::string& ptr) {
        if (s.contains("const")) return gbnf_literal(s["const"].dump(-1, ' ', false)) + " space";
        if (s.contains("enum")) {
            const json& e = s["enum"];
            if (!e.is_array() || e.empty())
                return bad(ptr + "/enum", "must be a non-empty array of the allowed values");
            std::vector<std::string> values;
            values.reserve(e.size());
            for (const json& v : e) values.push_back(v.dump(-1, ' ', false));
            return factored_alternation(std::move(values)) + " space";
        }
        for (const char* k : {"anyOf", "oneOf"}) {
            if (!s.contains(k)) continue;
            const json& a = s[k];
            if (!a.is_array() || a.empty()) return bad(ptr + "/" + k, "must be a non-empty array of schemas");
            std::string out;
            for (size_t i = 0; i < a.size(); ++i) {
                // Keywords beside anyOf (e.g. a shared "type") apply to each branch.
                json branch = a[i];
                if (branch.is_object())
                    for (auto it = s.begin(); it != s.end(); ++it)
                        if (it.key() != k && it.key() != "$defs" && it.key() != "definitions" && !branch.contains(it.key()))
                            branch[it.key()] = it.value();
                auto r = compile(branch, ptr + "/" + k + "/" + std::to_string(i));
                if (!r) return r.error();
                out += (i ? " | " : "") + *r;
            }
            return out;
        }
        if (s.contains("allOf")) {
            const json& a = s["allOf"];
            if (!a.is_array() || a.size() != 1)
                return bad(ptr + "/allOf", "only an allOf of exactly one schema is supported; merge the schemas into one");
            auto r = compile(a[0], ptr + "/allOf/0");
            if (!r) return r.error();
            return *r;
        }
        if (!s.contains("type")) {
            // A keyword of one type alone (no "type"): generated as that type, a subset of what validates.
            if (s.contains("pattern")) return compile_string(s, ptr);
            for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
                if (s.contains(k)) return compile_number(s, ptr);
            if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
                return compile_object(s, ptr);
            if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return compile_array(s, ptr);
            return std::string("json-value");
        }
        const json& t = s["type"];
        if (t.is_array()) {
            if (t.empty()) return bad(ptr + "/type", "is an empty list; name at least one type");
            std::string out;
            for (size_t i = 0; i < t.size(); ++i) {
                auto r = compile_type(t[i], s, ptr, ptr + "/type/" + std::to_string(i));
                if (!r) return r.error();
                out += (i ? " | (" : "(") + *r + ")";
            }
            return out;
        }
        return compile_type(t, s, ptr, ptr + "/type");
    }

    Expected<std::string> compile_type(const json& t, const json& s, const std::string& ptr, const std::string& tptr) {
        if (!t.is_string())
            return bad(tptr, "must be a type name (object, array, string, number, integer, boolean, null)");
        const std::string ty = t.get<std::string>();
        if (ty == "object") return compile_object(s, ptr);
        if (ty == "array") return compile_array(s, ptr);
        if (ty == "string") return compile_string(s, ptr);
        if (ty == "number") return compile_number(s, ptr);
        if (ty == "integer") return compile_integer(s, ptr);
        if (ty == "boolean") return std::string("json-boolean");
        if (ty == "null") return std::string("json-null");
        return bad(tptr, "unknown type \"" + ty + "\"; use object, array, string, number, integer, boolean or null");
    }

    Expected<uint64_t> count(const json& s, const char* key, const std::string& ptr, uint64_t dflt) {
        if (!s.contains(key)) return dflt;
        const json& v = s[key];
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
            return bad(ptr + "/" + key, "must be a non-negative integer");
        const uint64_t n = v.get<uint64_t>();
        if (n > 10000) return bad(ptr + "/" + key, "is above 10000, more than the grammar compiler expands; lower it");
        return n;
    }

    Expected<std::string> compile_string(const json& s, const std::string& ptr) {
        if (s.contains("pattern")) return compile_pattern(s, ptr);
        if (s.contains("format")) {
            if (!s["format"].is_string()) return bad(ptr + "/format", "must be a string (date, time, date-time or uuid)");
            const std::string f = s["format"].get<std::string>();
            if (f == "date") return std::string("\"\\\"\" json-date \"\\\"\" space");
            if (f == "time") return std::string("\"\\\"\" json-time \"\\\"\" space");
            if (f == "date-time") return std::string("\"\\\"\" json-date \"T\" json-time \"\\\"\" space");
            if (f == "uuid") return std::string("\"\\\"\" json-uuid \"\\\"\" space");
            // Ignoring it would let the model write any string where the schema promises one form.
            return bad(ptr + "/format", "'" + f + "' is not a format Steward enforces (date, time, date-time, uuid); "
                                        "remove it, or describe the form with a 'pattern'");
        }
        auto lo = count(s, "minLength", ptr, 0);
        if (!lo) return lo.error();
        auto hi = count(s, "maxLength", ptr, UINT64_MAX);
        if (!hi) return hi.error();
        if (*lo == 0 && *hi == UINT64_MAX) return std::string("json-string");
        if (*hi < *lo) return bad(ptr + "/maxLength", "is below minLength; no string satisfies both");
        std::string rep = "{" + std::to_string(*lo) + "," + (*hi == UINT64_MAX ? "" : std::to_string(*hi)) + "}";
        return "\"\\\"\" json-char" + rep + " \"\\\"\" space";
    }

    // `pattern`: the regex over the string's characters, all written unescaped, with ECMA-262
    // search semantics (an unanchored side may hold any characters, escaped ones included).
    Expected<std::string> compile_pattern(const json& s, const std::string& ptr) {
        const json& p = s["pattern"];
        if (!p.is_string()) return bad(ptr + "/pattern", "must be a regular expression (a string)");
        for (const char* k : {"minLength", "maxLength", "format"})
            if (s.contains(k))
                return bad(ptr + "/" + k, std::string("'") + k + "' beside 'pattern' is not supported; put the "
                                          "constraint in the pattern instead (e.g. ^[a-z]{1,8}$) and remove it");
        auto r = regex_to_json_string_gbnf(p.get<std::string>());
        if (!r) return bad(ptr + "/pattern", r.error().message);
        return std::string("\"\\\"\" ") + (r->anchored_start ? "" : "json-char* ") + r->gbnf +
               (r->anchored_end ? "" : " json-char*") + " \"\\\"\" space";
    }

    // A numeric bound, as a long double (exact for every int64 and double); nullopt when absent.
    Expected<std::optional<long double>> bound(const json& s, const char* key, const std::string& ptr) {
        if (!s.contains(key)) return std::optional<long double>();
        const json& v = s[key];
        if (v.is_boolean())
            return bad(ptr + "/" + key, std::string("is a boolean (draft 4); write the bound itself, e.g. \"") + key +
                                            "\": 0 instead of \"minimum\": 0 with \"" + key + "\": true");
        if (!v.is_number()) return bad(ptr + "/" + key, "must be a number");
        if (v.is_number_unsigned()) return std::optional<long double>((long double)v.get<uint64_t>());
        if (v.is_number_integer()) return std::optional<long double>((long double)v.get<int64_t>());
        return std::optional<long double>((long double)v.get<double>());
    }

    // Integers with minimum / maximum / exclusiveMinimum / exclusiveMaximum: digit-count-aware
    // alternatives over [lo, hi], within the 16 digits json-int writes.
    Expected<std::string> compile_integer(const json& s, const std::string& ptr) {
        constexpr int64_t k_max = 9999999999999999;  // 16 digits
        int64_t lo = -k_max, hi = k_max;
        bool any = false;
        for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
            auto b = bound(s, k, ptr);
            if (!b) return b.error();
            if (!*b) continue;
            any = true;
            const std::string key = k;
            const bool is_min = key == "minimum" || key == "exclusiveMinimum";
            long double x = **b;
            // The nearest integer inside the bound.
            if (key == "minimum") x = std::ceil(x);
            else if (key == "exclusiveMinimum") x = std::floor(x) + 1;
            else if (key == "maximum") x = std::floor(x);
            else x = std::ceil(x) - 1;
            if (x > (long double)k_max) x = (long double)k_max + 1;  // beyond what is written
            if (x < -(long double)k_max) x = -(long double)k_max - 1;
            const int64_t xi = (int64_t)x;
            if (is_min) lo = std::max(lo, xi);
            else hi = std::min(hi, xi);
        }
        if (!any) return std::string("json-integer");
        if (lo > hi)
            return bad(ptr, "no integer of at most 16 digits satisfies its minimum/maximum bounds; fix the bounds");
        std::string alts;
        auto add = [&](const std::string& a) { alts += (alts.empty() ? "" : " | ") + a; };
        if (hi >= 0) add(nonneg_range(std::max<int64_t>(lo, 0), hi));
        if (lo < 0) add("\"-\" " + nonneg_range(std::max<int64_t>(-hi, 1), -lo));
        return "(" + alts + ") space";
    }

    // Decimal strings (no leading zeros) of the integers in [a, b], 0 <= a <= b.
    static std::string nonneg_range(int64_t a, int64_t b) {
        std::string alts;
        int64_t p = 1;  // 10^(len-1)
        for (int len = 1; len <= 16; ++len, p *= 10) {
            const int64_t lo = std::max(a, len == 1 ? (int64_t)0 : p), hi = std::min(b, p * 10 - 1);
            if (lo > hi) continue;
            alts += (alts.empty() ? "" : " | ") + same_length(std::to_string(lo), std::to_string(hi));
            if (p * 10 > b) break;
        }
        return "(" + alts + ")";
    }

    // Digit strings x..y of one length, x <= y.
    static std::string same_length(const std::string& x, const std::string& y) {
        if (x.empty()) return "\"\"";
        if (x == y) return "\"" + x + "\"";
        const size_t n = x.size() - 1;
        auto digits = [](char a, char b) {
            return a == b ? "\"" + std::string(1, a) + "\"" : "[" + std::string(1, a) + "-" + std::string(1, b) + "]";
        };
        auto any = [&](size_t k) { return k == 0 ? std::string() : " [0-9]{" + std::to_string(k) + "}"; };
        if (x[0] == y[0]) return "\"" + std::string(1, x[0]) + "\" " + same_length(x.substr(1), y.substr(1));
        const std::string xr = x.substr(1), yr = y.substr(1);
        const bool x_low = xr.find_first_not_of('0') == std::string::npos;
        const bool y_high = yr.find_first_not_of('9') == std::string::npos;
        std::string alts;
        auto add = [&](const std::string& a) { alts += (alts.empty() ? "" : " | ") + a; };
        char first = x[0], last = y[0];
        if (!x_low) {
            add("\"" + std::string(1, x[0]) + "\" (" + same_length(xr, std::string(n, '9')) + ")");
            ++first;
        }
        if (!y_high) --last;
        if (first <= last) add(digits(first, last) + any(n));
        if (!y_high) add("\"" + std::string(1, y[0]) + "\" (" + same_length(std::string(n, '0'), yr) + ")");
        return "(" + alts + ")";
    }

    // Numbers: unbounded, or minimum 0 (non-negative) / exclusiveMinimum 0 (positive).
    Expected<std::string> compile_number(const json& s, const std::string& ptr) {
        std::optional<long double> mn, xmn;
        for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
            auto b = bound(s, k, ptr);
            if (!b) return b.error();
            if (!*b) continue;
            const std::string key = k;
            if ((key == "minimum" || key == "exclusiveMinimum") && **b == 0 && !(mn || xmn)) {
                (key == "minimum" ? mn : xmn) = **b;
                continue;
            }
            return bad(ptr + "/" + k, "on a number only \"minimum\": 0 or \"exclusiveMinimum\": 0 is supported; "
                                      "use \"type\": \"integer\" for integer ranges, or remove it (and check the value after generation)");
        }
        const std::string frac = "(\".\" [0-9]{1,16})?", expo = "([eE] [-+]? [0-9]{1,2})?";
        if (mn) return "(\"0\" | [1-9] [0-9]{0,15}) " + frac + " " + expo + " space";
        if (xmn)  // a non-zero digit somewhere: before the point, or after leading zeros of the fraction
            return "([1-9] [0-9]{0,15} " + frac + " | \"0.\" \"0\"{0,15} [1-9] [0-9]{0,15}) " + expo + " space";
        return std::string("json-number");
    }

    Expected<std::string> compile_array(const json& s, const std::string& ptr) {
        std::string item = "json-value";
        if (s.contains("items")) {
            auto r = compile(s["items"], ptr + "/items");
            if (!r) return r.error();
            item = *r;
        }
        auto lo = count(s, "minItems", ptr, 0);
        if (!lo) return lo.error();
        auto hi = count(s, "maxItems", ptr, UINT64_MAX);
        if (!hi) return hi.error();
        if (*hi < *lo) return bad(ptr + "/maxItems", "is below minItems; no array satisfies both");
        if (*hi == 0) return std::string("\"[\" space \"]\" space");
        const std::string rest = "(\",\" space " + item + "){" + std::to_string(*lo ? *lo - 1 : 0) + "," +
                                 (*hi == UINT64_MAX ? "" : std::to_string(*hi - 1)) + "}";
        const std::string items = item + " " + rest;
        return "\"[\" space " + (*lo ? items : "(" + items + ")?") + " \"]\" space";
    }

    // A key that is none of `names` (finite set): a trie of the names, leaving it at any point.
    // Extra keys are written without escapes so that no escape can spell a declared name.
    std::string other_key_rule(const std::vector<std::string>& names, const std::string& base) {
        const std::string plain = base + "-plain";
        rules[plain] = "[^\"\\\\\\x7F\\x00-\\x1F]";
        std::function<std::string(const std::string&)> node = [&](const std::string& prefix) -> std::string {
            std::set<unsigned char> next;
            bool terminal = false;
            for (const auto& n : names)
                if (n.size() >= prefix.size() && n.compare(0, prefix.size(), prefix) == 0) {
                    if (n.size() == prefix.size()) terminal = true;
                    else next.insert((unsigned char)n[prefix.size()]);
                }
            const std::string rn = base + "-k" + std::to_string(rules.size());
            rules[rn] = "";
            std::string alts;
            if (!terminal) alts += "\"\\\"\"";  // the key may end here
            // Any byte that leaves the trie, then anything.
            std::string cls = "[^\"\\\\\\x7F\\x00-\\x1F";
            for (unsigned char c : next) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x%02X", c);
                cls += c < 0x80 ? std::string(buf) : std::string();
            }
            cls += "]";
            // A leading byte >= 0x80 of a name is a UTF-8 character: excluded by whole characters is
            // more than this compiler does, so such names only exclude their ASCII prefix.
            alts += std::string(alts.empty() ? "" : " | ") + cls + " " + plain + "* \"\\\"\"";
            for (unsigned char c : next) {
                if (c >= 0x80) continue;
                alts += " | " + gbnf_literal(std::string(1, (char)c)) + " " + node(prefix + (char)c);
            }
            rules[rn] = alts;
            return rn;
        };
        const std::string first = node("");
        const std::string key = base + "-key";
        rules[key] = "\"\\\"\" " + first + " space";
        return key;
    }

    Expected<std::string> compile_object(const json& s, const std::string& ptr) {
        std::vector<std::pair<std::string, std::string>> kvs;  // (key, kv rule)
        std::vector<bool> req;
        std::set<std::string> required;
        if (s.contains("required")) {
            const json& r = s["required"];
            if (!r.is_array()) return bad(ptr + "/required", "must be an array of property names");
            for (size_t i = 0; i < r.size(); ++i) {
                if (!r[i].is_string()) return bad(ptr + "/required/" + std::to_string(i), "must be a property name (a string)");
                required.insert(r[i].get<std::string>());
            }
        }
        std::vector<std::string> names;
        if (s.contains("properties")) {
            const json& p = s["properties"];
            if (!p.is_object()) return bad(ptr + "/properties", "must be an object mapping names to schemas");
            if (p.size() > k_max_properties)
                return bad(ptr + "/properties", "has " + std::to_string(p.size()) + " properties; at most " + std::to_string(k_max_properties) +
                                                    " are accepted per object (each optional one is a choice at every step); split "
                                                    "the object or nest related properties");
            for (auto it = p.begin(); it != p.end(); ++it) {
                const std::string pp = ptr + "/properties/" + escape_pointer_token(it.key());
                auto v = compile(it.value(), pp);
                if (!v) return v.error();
                const std::string kv = name_for(pp + "-kv");
                rules[kv] = gbnf_literal(json(it.key()).dump(-1, ' ', false)) + " space \":\" space " + *v;
                kvs.push_back({it.key(), kv});
                req.push_back(required.count(it.key()) > 0);
                names.push_back(it.key());
            }
        }
        for (const auto& r : required)
            if (std::find(names.begin(), names.end(), r) == names.end())
                return bad(ptr + "/required", "names \"" + r + "\", which is not in properties; add it to properties");
        // Extra properties: only when asked for (true or a schema). Leaving them out when the keyword
        // is absent still yields documents that validate, and keeps generation on the declared keys.
        std::string extra;
        if (s.contains("additionalProperties")) {
            const json& a = s["additionalProperties"];
            if (!(a.is_boolean() && !a.get<bool>())) {
                std::string val = "json-value";
                if (!a.is_boolean()) {
                    auto v = compile(a, ptr + "/additionalProperties");
                    if (!v) return v.error();
                    val = *v;
                }
                const std::string base = name_for(ptr + "-extra");
                const std::string key = names.empty() ? std::string("json-string") : other_key_rule(names, base);
                extra = base + "-kv";
                rules[extra] = key + " \":\" space " + val;
            }
        }
        // first_i: properties i.. with nothing written yet; next_i: the same after something.
        const std::string base = name_for(ptr + "-obj");
        const size_t n = kvs.size();
        std::vector<std::string> first(n + 1), next(n + 1);
        for (size_t i = 0; i <= n; ++i) {
            first[i] = base + "-f" + std::to_string(i);
            next[i] = base + "-n" + std::to_string(i);
        }
        rules[first[n]] = extra.empty() ? "\"\"" : "(" + extra + " (\",\" space " + extra + ")*)?";
        rules[next[n]] = extra.empty() ? "\"\"" : "(\",\" space " + extra + ")*";
        for (size_t i = n; i-- > 0;) {
            rules[first[i]] = kvs[i].second + " " + next[i + 1] + (req[i] ? "" : " | " + first[i + 1]);
            rules[next[i]] = "\",\" space " + kvs[i].second + " " + next[i + 1] + (req[i] ? "" : " | " + next[i + 1]);
        }
        return "\"{\" space " + first[0] + " \"}\" space";
    }
};

}  // namespace

namespace {
Expected<std::string> compile_schema(const json& schema) {
    SchemaCompiler c{schema, {}, {}, {}, 0};
    auto root = c.compile(schema, "");
    if (!root) return root.error();
    std::string out = "root ::= " + *root + "\n" + k_primitives;
    // An empty body is written "" (a rule's body may continue on the next line).
    for (const auto& [name, body] : c.rules) out += name + " ::= " + (body.empty() ? "\"\"" : body) + "\n";
    return out;
}
}  // namespace

std::string json_schema_primitives_gbnf() { return k_primitives; }

std::string gbnf_string_literal(std::string_view bytes) { return gbnf_literal(std::string(bytes)); }

Expected<SchemaRules> json_schema_to_gbnf_rules(std::string_view schema_text, const std::string& prefix) {
    json schema;
    try {
        schema = json::parse(schema_text);
    } catch (const std::exception& e) {
        return make_error("schema: not valid JSON (", e.what(), "); fix the JSON text");
    }
    SchemaCompiler c{schema, {}, {}, {}, 0};
    c.prefix = prefix;
    auto root = c.compile(schema, "");
    if (!root) return root.error();
    SchemaRules out;
    out.root = *root;
    for (const auto& [name, body] : c.rules) out.rules += name + " ::= " + (body.empty() ? "\"\"" : body) + "\n";
    return out;
}

Expected<std::string> json_schema_to_gbnf(const nlohmann::json& schema) {
    // nlohmann::json keeps object keys sorted: properties come out in name order.
    return compile_schema(json::parse(schema.dump()));
}

Expected<std::string> json_schema_to_gbnf(std::string_view schema_text) {
    json schema;
    try {
        schema = json::parse(schema_text);
    } catch (const std::exception& e) {
        return make_error("schema: not valid JSON (", e.what(), "); fix the JSON text");
    }
    return compile_schema(schema);
}

std::string json_object_gbnf() { return std::string("root ::= json-object\n") + k_primitives; }

namespace {
Expected<std::shared_ptr<const CompiledGrammar>> compile_gbnf_of_schema(const Expected<std::string>& text) {
    if (!text) return text.error();
    auto g = CompiledGrammar::from_gbnf(text.value());
    if (!g) {
        // A $ref that reaches itself before any JSON value ({"$ref": "#"}, a <-> b, anyOf/allOf of
        // itself) compiles to a rule without a way out: the schema's fault, named as such.
        const std::string& m = g.error().message;
        if (m.find("can never finish") != std::string::npos || m.find("left-recursive") != std::string::npos)
            return make_error("schema: a $ref recursion reaches itself before any JSON value, so no document can finish (",
                              m.find("rule ") == std::string::npos ? m : m.substr(m.find("rule ")), "; rule 's--defs-x' is #/$defs/x, 's' the root); refer to a schema "
                              "recursively only inside properties or items, with a way out (an optional property, an "
                              "array that may be empty)");
        return make_error("JSON schema compiled to an invalid grammar (a compiler bug, please report it): ", m);
    }
    return g;
}
}  // namespace

Expected<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::from_json_schema(const nlohmann::json& schema) {
    return compile_gbnf_of_schema(json_schema_to_gbnf(schema));
}

Expected<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::from_json_schema(std::string_view schema_text) {
    return compile_gbnf_of_schema(json_schema_to_gbnf(schema_text));
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::json_object() {
    static const std::shared_ptr<const CompiledGrammar> g = from_gbnf(json_object_gbnf()).value();
    return g;
}

Expected<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::from_regex(std::string_view pattern) {
    auto text = regex_to_gbnf(pattern);
    if (!text) return text.error();
    return from_gbnf(*text);
}

}  // namespace steward
