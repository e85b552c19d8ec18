// GBNF text -> CompiledGrammar: a recursive-descent parser that rewrites repetitions into helper
// rules, then checks that every rule is defined, can finish, and is not left-recursive.
#include <algorithm>
#include <functional>
#include <map>

#include "grammar/grammar.h"
#include "util/utf8.h"

namespace steward {

bool CharClass::contains(uint32_t cp) const {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(cp, UINT32_MAX));
    const bool in = it != ranges.begin() && std::prev(it)->second >= cp;
    return in != negated;
}

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
    if (!negated) {
        for (const auto& [a, b] : ranges)
            if (a <= hi && b >= lo) return true;
        return false;
    }
    // The complement meets [lo, hi] unless the ranges cover all of it.
    uint32_t next = lo;
    for (const auto& [a, b] : ranges) {
        if (b < next) continue;
        if (a > next) return true;
        if (b >= hi) return false;
        next = b + 1;
    }
    return next <= hi;
}

bool CharClass::contains_all(uint32_t lo, uint32_t hi) const {
    for (const auto& [a, b] : ranges) {
        if (!negated && a <= lo && b >= hi) return true;  // ranges are merged: one must cover it all
        if (negated && a <= hi && b >= lo) return false;
    }
    return negated;
}

namespace {

void normalize(CharClass& c) {
    std::sort(c.ranges.begin(), c.ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (const auto& r : c.ranges) {
        if (!out.empty() && r.first <= out.back().second + 1)
            out.back().second = std::max(out.back().second, r.second);
        else
            out.push_back(r);
    }
    c.ranges = std::move(out);
}

}  // namespace

// Collects rules as element lists, then flattens them into a CompiledGrammar.
struct GrammarBuilder {
    static constexpr int k_max_depth = 256;
    std::string_view src;
    size_t pos = 0;
    int depth = 0;  // open groups: bounded so that hostile input cannot exhaust the stack
    std::map<std::string, uint32_t> ids;
    std::vector<std::string> names;
    std::vector<std::vector<GrammarElement>> bodies;  // alternatives, each closed by ALT_END
    std::vector<size_t> defined_at;                   // SIZE_MAX: not defined (yet)
    std::vector<size_t> first_use;
    std::vector<uint32_t> origin;  // helper rule -> the user rule it was made for
    std::vector<CharClass> classes;
    std::map<std::pair<std::vector<std::pair<uint32_t, uint32_t>>, bool>, uint32_t> class_ids;

    std::string where(size_t at) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < src.size(); ++i) {
            if (src[i] == '\n') {
                ++line;
                col = 1;
            } else if (!utf8::is_continuation(src[i])) {
                ++col;
            }
        }
        return std::to_string(line) + ":" + std::to_string(col);
    }
    Error fail(size_t at, const std::string& what) const { return make_error("grammar:", where(at), ": ", what); }

    uint32_t rule_id(const std::string& name, size_t used_at) {
        auto [it, fresh] = ids.emplace(name, (uint32_t)names.size());
        if (fresh) {
            names.push_back(name);
            bodies.emplace_back();
            defined_at.push_back(SIZE_MAX);
            first_use.push_back(used_at);
            origin.push_back(it->second);
        }
        return it->second;
    }
    uint32_t helper_rule(uint32_t parent) {
        const std::string name = names[parent] + "-" + std::to_string(names.size());
        const uint32_t id = rule_id(name, pos);
        defined_at[id] = pos;
        origin[id] = origin[parent];
        return id;
    }
    uint32_t class_id(CharClass c) {
        normalize(c);
        auto key = std::make_pair(c.ranges, c.negated);
        auto [it, fresh] = class_ids.emplace(key, (uint32_t)classes.size());
        if (fresh) classes.push_back(std::move(c));
        return it->second;
    }

    bool at_end() const { return pos >= src.size(); }
    char peek(size_t k = 0) const { return pos + k < src.size() ? src[pos + k] : '\0'; }
    void skip_space(bool newline_ok) {
        while (!at_end()) {
            const char c = peek();
            if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
                ++pos;
            } else if (c == '#') {
                while (!at_end() && peek() != '\n') ++pos;
            } else {
                break;
            }
        }
    }
    static bool is_name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    }
    std::string parse_name() {
        const size_t start = pos;
        while (!at_end() && is_name_char(peek())) ++pos;
        return std::string(src.substr(start, pos - start));
    }

    // One character of a literal or class: an escape or a UTF-8 character.
    Expected<uint32_t> parse_char() {
        if (at_end()) return fail(pos, "unexpected end of grammar inside a literal or class; close it");
        if (peek() != '\\') return utf8::decode_loose(src, pos);  // an ill-formed byte is its own value
        const size_t at = pos;
        ++pos;
        const char e = peek();
        ++pos;
        auto hex = [&](int n) -> Expected<uint32_t> {
            uint32_t v = 0;
            for (int k = 0; k < n; ++k) {
                const char h = peek();
                int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (d < 0)
                    return fail(pos, std::string("expected ") + std::to_string(n) + " hex digits after \\" + e +
                                         "; write e.g. \\" + e + std::string(n, '0'));
                v = v * 16 + (uint32_t)d;
                ++pos;
            }
            return v;
        };
        switch (e) {
            case 'n': return uint32_t('\n');
            case 'r': return uint32_t('\r');
            case 't': return uint32_t('\t');
            case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return uint32_t(e);
            case 'x': return hex(2);
            case 'u': return hex(4);
            case 'U': return hex(8);
            default:
                return fail(at, std::string("unknown escape \\") + e +
                                    "; use \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH or \\UHHHHHHHH");
        }
    }

    Expected<bool> parse_alternates(uint32_t rule, bool nested, std::vector<GrammarElement>& out) {
        auto seq = parse_sequence(rule, nested, out);
        if (!seq) return seq;
        out.push_back({GrammarOp::ALT_END, 0});
        while (peek() == '|') {
            ++pos;
            skip_space(true);
            seq = parse_sequence(rule, nested, out);
            if (!seq) return seq;
            out.push_back({GrammarOp::ALT_END, 0});
        }
        return true;
    }

    // Appends `atom` repeated min..max times (max UINT32_MAX: unbounded) using helper rules.
    void append_repeat(uint32_t rule, const std::vector<GrammarElement>& atom, uint32_t min, uint32_t max,
                       std::vector<GrammarElement>& out) {
        for (uint32_t k = 0; k < min; ++k) out.insert(out.end(), atom.begin(), atom.end());
        if (max == UINT32_MAX) {
            // star ::= atom star | (empty)
            const uint32_t star = helper_rule(rule);
            auto& b = bodies[star];
            b = atom;
            b.push_back({GrammarOp::RULE, star});
            b.push_back({GrammarOp::ALT_END, 0});
            b.push_back({GrammarOp::ALT_END, 0});
            out.push_back({GrammarOp::RULE, star});
        } else if (max > min) {
            // opt_k ::= atom opt_{k-1} | (empty): 0..k more copies, right-nested.
            uint32_t prev = UINT32_MAX;
            for (uint32_t k = 0; k < max - min; ++k) {
                const uint32_t opt = helper_rule(rule);
                std::vector<GrammarElement> b = atom;
                if (prev != UINT32_MAX) b.push_back({GrammarOp::RULE, prev});
                b.push_back({GrammarOp::ALT_END, 0});
                b.push_back({GrammarOp::ALT_END, 0});
                bodies[opt] = std::move(b);
                prev = opt;
            }
            out.push_back({GrammarOp::RULE, prev});
        }
    }

    Expected<uint32_t> parse_count() {
        const size_t start = pos;
        uint64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + uint64_t(peek() - '0');
            if (v > k_max_repetition)
                return fail(start, "repetition count above " + std::to_string(k_max_repetition) + "; use * or + instead");
            ++pos;
        }
        if (pos == start) return fail(pos, "expected a number in the repetition {m,n}");
        return (uint32_t)v;
    }

    Expected<bool> parse_sequence(uint32_t rule, bool nested, std::vector<GrammarElement>& out) {
        std::vector<GrammarElement> atom;
        bool have_atom = false;
        auto flush = [&] {
            out.insert(out.end(), atom.begin(), atom.end());
            atom.clear();
        };
        while (!at_end()) {
            const char c = peek();
            const size_t at = pos;
            if (c == '"') {
                flush();
                ++pos;
                while (peek() != '"') {
                    if (at_end() || peek() == '\n')
                        return fail(at, "literal is not closed; add '\"' at the end of it (write \\\" for a quote inside)");
                    auto cp = parse_char();
                    if (!cp) return cp.error();
                    atom.push_back({GrammarOp::CHARS, class_id(CharClass{{{*cp, *cp}}, false})});
                }
                ++pos;
                have_atom = true;
            } else if (c == '[') {
                flush();
                ++pos;
                CharClass cc;
                if (peek() == '^') {
                    cc.negated = true;
                    ++pos;
                }
                while (peek() != ']') {
                    if (at_end())
                        return fail(at, "character class is not closed; add ']' (write \\] for a bracket inside)");
                    auto lo = parse_char();
                    if (!lo) return lo.error();
                    uint32_t hi = *lo;
                    if (peek() == '-' && peek(1) != ']' && pos + 1 < src.size()) {
                        ++pos;
                        auto h = parse_char();
                        if (!h) return h.error();
                        hi = *h;
                        if (hi < *lo) return fail(at, "character range is reversed; write the lower end first, e.g. [a-z]");
                    }
                    cc.ranges.push_back({*lo, hi});
                }
                ++pos;
                atom.push_back({GrammarOp::CHARS, class_id(std::move(cc))});
                have_atom = true;
            } else if (c == '.') {
                flush();
                ++pos;
                atom.push_back({GrammarOp::CHARS, class_id(CharClass{{}, true})});
                have_atom = true;
            } else if (c == '(') {
                flush();
                ++pos;
                if (++depth > k_max_depth)
                    return fail(at, "groups nest deeper than " + std::to_string(k_max_depth) + "; use helper rules");
                skip_space(true);
                const uint32_t group = helper_rule(rule);
                std::vector<GrammarElement> body;
                auto r = parse_alternates(group, true, body);
                --depth;
                if (!r) return r;
                bodies[group] = std::move(body);
                if (peek() != ')') return fail(pos, "expected ')' to close the group opened at " + where(at));
                ++pos;
                atom.push_back({GrammarOp::RULE, group});
                have_atom = true;
            } else if (is_name_char(c)) {
                // A rule name, unless it starts the next rule's definition (`name ::=`).
                const size_t save = pos;
                const std::string name = parse_name();
                size_t look = pos;
                while (look < src.size() && (src[look] == ' ' || src[look] == '\t')) ++look;
                if (src.substr(look, 3) == "::=") {
                    pos = save;
                    break;
                }
                flush();
                atom.push_back({GrammarOp::RULE, rule_id(name, at)});
                have_atom = true;
            } else if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (!have_atom)
                    return fail(at, std::string("'") + c + "' has nothing to repeat; put it after a symbol, literal or group");
                ++pos;
                uint32_t min = 0, max = UINT32_MAX;
                if (c == '+') min = 1;
                if (c == '?') max = 1;
                if (c == '{') {
                    skip_space(false);
                    auto m = parse_count();
                    if (!m) return m.error();
                    min = max = *m;
                    skip_space(false);
                    if (peek() == ',') {
                        ++pos;
                        skip_space(false);
                        max = UINT32_MAX;
                        if (peek() != '}') {
                            auto n = parse_count();
                            if (!n) return n.error();
                            max = *n;
                            skip_space(false);
                        }
                    }
                    if (peek() != '}') return fail(pos, "expected '}' to close the repetition opened at " + where(at));
                    ++pos;
                    if (max < min) return fail(at, "repetition {m,n} has n below m; write the smaller bound first");
                }
                append_repeat(rule, atom, min, max, out);
                atom.clear();
                have_atom = false;
            } else if (c == '|' || c == ')' || c == '\n' || c == '\r') {
                break;
            } else {
                return fail(at, std::string("unexpected '") + c +
                                    "'; expected a literal \"...\", a class [...], a rule name, '(' or '|'");
            }
            skip_space(nested);
        }
        flush();
        return true;
    }

    Expected<bool> parse_all() {
        skip_space(true);
        while (!at_end()) {
            const size_t at = pos;
            const std::string name = parse_name();
            if (name.empty() && peek() == '|')
                return fail(at, "a line cannot start with '|' outside parentheses; end the previous line with '|' "
                                "or wrap the alternatives in ( )");
            if (name.empty()) return fail(at, "expected a rule name at the start of a rule, e.g. `root ::= ...`");
            skip_space(false);
            if (src.substr(pos, 3) != "::=") return fail(pos, "expected '::=' after the rule name '" + name + "'");
            pos += 3;
            const uint32_t id = rule_id(name, at);
            if (defined_at[id] != SIZE_MAX)
                return fail(at, "rule '" + name + "' is defined twice (first at " + where(defined_at[id]) +
                                    "); merge the definitions with |");
            defined_at[id] = at;
            skip_space(true);
            std::vector<GrammarElement> body;
            auto r = parse_alternates(id, false, body);
            if (!r) return r;
            bodies[id] = std::move(body);
            if (!at_end() && peek() != '\n' && peek() != '\r') {
                if (peek() == ')') return fail(pos, "unexpected ')' with no group open; remove it or add the '('");
                return fail(pos, "expected the end of the line after the rule '" + name + "'");
            }
            skip_space(true);
        }
        return true;
    }

    // Names a rule for messages: helper rules by the user rule they were made for.
    const std::string& user_name(uint32_t r) const { return names[origin[r]]; }

    Expected<std::shared_ptr<const CompiledGrammar>> finish(std::string_view root_name) {
        for (size_t r = 0; r < names.size(); ++r)
            if (defined_at[r] == SIZE_MAX)
                return fail(first_use[r], "rule '" + names[r] + "' is used but never defined; add `" + names[r] +
                                              " ::= ...`");
        auto root_it = ids.find(std::string(root_name));
        if (root_it == ids.end())
            return make_error("grammar: no rule named '", std::string(root_name),
                              "'; the start rule must be defined, e.g. `", std::string(root_name), " ::= ...`");
        const size_t n = names.size();
        // Alternatives per rule.
        std::vector<std::vector<std::pair<size_t, size_t>>> alts(n);
        for (size_t r = 0; r < n; ++r) {
            size_t s = 0;
            for (size_t i = 0; i < bodies[r].size(); ++i)
                if (bodies[r][i].op == GrammarOp::ALT_END) {
                    alts[r].push_back({s, i});
                    s = i + 1;
                }
        }
        // Nullable and productive rules (least fixpoints, by a worklist: each alternative counts the
        // rule references not yet known good, so the work is linear in the grammar's size even for
        // a long chain of rules, e.g. a schema's run of optional properties).
        auto fixpoint = [&](bool chars_ok) {
            std::vector<char> ok(n, 0);
            std::vector<uint32_t> alt_rule, remaining;
            std::vector<std::vector<uint32_t>> uses(n);  // rule -> its occurrences' alternatives
            std::vector<uint32_t> todo;
            constexpr uint32_t k_dead = UINT32_MAX;
            for (size_t r = 0; r < n; ++r)
                for (auto [s, e] : alts[r]) {
                    const uint32_t id = (uint32_t)alt_rule.size();
                    alt_rule.push_back((uint32_t)r);
                    uint32_t count = 0;
                    bool dead = false;
                    for (size_t i = s; i < e; ++i) {
                        const GrammarElement& g = bodies[r][i];
                        if (g.op == GrammarOp::CHARS) dead |= !chars_ok;
                        else if (g.op == GrammarOp::RULE) count++, uses[g.value].push_back(id);
                    }
                    remaining.push_back(dead ? k_dead : count);
                    if (!dead && count == 0 && !ok[r]) ok[r] = 1, todo.push_back((uint32_t)r);
                }
            while (!todo.empty()) {
                const uint32_t r = todo.back();
                todo.pop_back();
                for (uint32_t id : uses[r])
                    if (remaining[id] != k_dead && --remaining[id] == 0 && !ok[alt_rule[id]]) {
                        ok[alt_rule[id]] = 1;
                        todo.push_back(alt_rule[id]);
                    }
            }
            return ok;
        };
        const auto nullable = fixpoint(false);
        const auto productive = fixpoint(true);
        // Reachable from root.
        std::vector<char> reach(n, 0);
        std::vector<uint32_t> todo{root_it->second};
        reach[root_it->second] = 1;
        while (!todo.empty()) {
            const uint32_t r = todo.back();
            todo.pop_back();
            for (const auto& g : bodies[r])
                if (g.op == GrammarOp::RULE && !reach[g.value]) {
                    reach[g.value] = 1;
                    todo.push_back(g.value);
                }
        }
        // Name the rule at the heart of it: one whose unfinishable references are only to itself.
        size_t stuck = n;
        for (size_t r = 0; r < n; ++r) {
            if (!reach[r] || productive[r]) continue;
            bool self_only = true;
            for (const auto& g : bodies[r])
                if (g.op == GrammarOp::RULE && !productive[g.value] && origin[g.value] != origin[r]) self_only = false;
            if (stuck == n || self_only) stuck = r;
            if (self_only) break;
        }
        for (size_t r = stuck; r < n; r = n)
            if (reach[r] && !productive[r])
                return fail(defined_at[origin[r]], "rule '" + user_name((uint32_t)r) +
                                                       "' can never finish (every alternative needs itself again); "
                                                       "give it an alternative without the recursion");
        // Left recursion: rules reachable at the left edge without consuming input.
        std::vector<std::vector<uint32_t>> left(n);
        for (size_t r = 0; r < n; ++r)
            for (auto [s, e] : alts[r])
                for (size_t i = s; i < e; ++i) {
                    const auto& g = bodies[r][i];
                    if (g.op != GrammarOp::RULE) break;
                    left[r].push_back(g.value);
                    if (!nullable[g.value]) break;
                }
        std::vector<int> color(n, 0);
        std::vector<uint32_t> path;
        std::function<int(uint32_t)> dfs = [&](uint32_t r) -> int {
            color[r] = 1;
            path.push_back(r);
            for (uint32_t t : left[r]) {
                if (color[t] == 1) {
                    path.push_back(t);
                    return (int)t;
                }
                if (color[t] == 0) {
                    int c = dfs(t);
                    if (c >= 0) return c;
                }
            }
            color[r] = 2;
            path.pop_back();
            return -1;
        };
        for (size_t r = 0; r < n; ++r) {
            if (!reach[r] || color[r]) continue;
            path.clear();
            const int c = dfs((uint32_t)r);
            if (c >= 0) {
                std::string chain;
                for (uint32_t p : path) {
                    const std::string& u = user_name(p);
                    if (chain.empty() || !std::string_view(chain).ends_with(u)) chain += (chain.empty() ? "" : " -> ") + u;
                }
                return fail(defined_at[origin[(uint32_t)c]],
                            "rule '" + user_name((uint32_t)c) + "' is left-recursive or repeats something that can be "
                            "empty (" + chain + " without consuming input); rewrite it right-recursively, e.g. "
                            "`list ::= item (\",\" item)*`, and make repeated parts non-empty");
            }
        }
        // Flatten.
        auto g = std::make_shared<CompiledGrammar>();
        g->rule_names_ = names;
        g->char_classes_ = classes;
        g->root_ = root_it->second;
        g->rule_starts_.resize(n);
        g->rule_alts_.resize(n);
        for (size_t r = 0; r < n; ++r) {
            g->rule_starts_[r] = (uint32_t)g->elements_.size();
            for (auto [s, e] : alts[r]) {
                g->rule_alts_[r].push_back((uint32_t)g->elements_.size());
                for (size_t i = s; i <= e; ++i) g->elements_.push_back(bodies[r][i]);
            }
            g->elements_.push_back({GrammarOp::RULE_END, 0});
        }
        return std::shared_ptr<const CompiledGrammar>(std::move(g));
    }
};

Expected<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::from_gbnf(std::string_view text,
                                                                           std::string_view root) {
    GrammarBuilder b;
    b.src = text;
    auto r = b.parse_all();
    if (!r) return r.error();
    return b.finish(root);
}

}  // namespace steward
