// Random templates (a fixed seed) mixing whitespace control, trim/lstrip, comments, if/elif/else,
// for with filters and loop variables, break/continue, set, block set, macros, call blocks and
// namespaces, rendered by the interpreter and by Python's jinja2: equal, or both fail.
#include <catch2/catch.hpp>

#include <random>

#include "reference.h"
#include "template/jinja.h"

using nlohmann::ordered_json;

namespace {

class Generator {
public:
    explicit Generator(uint32_t seed) : rng_(seed) {}

    std::string tmpl() {
        return "{% macro m2(q) %}[{{ caller() }}{{ q }}]{% endmacro %}{% set ns = namespace(v='') %}" + seq(0);
    }

private:
    std::mt19937 rng_;
    template <size_t N>
    const char* pick(const char* const (&xs)[N]) {
        return xs[std::uniform_int_distribution<size_t>(0, N - 1)(rng_)];
    }
    int roll(int n) { return std::uniform_int_distribution<int>(0, n)(rng_); }
    std::string o() { return pick({"{%", "{%-", "{%+"}); }
    std::string c() { return pick({"%}", "-%}", "+%}"}); }
    std::string vo() { return pick({"{{", "{{-"}); }
    std::string vc() { return pick({"}}", "-}}"}); }
    std::string expr() {
        return pick({"x", "n", "xs", "s", "d.a", "d['b']", "xs|length", "n + 1", "s ~ '!'", "s|upper", "xs|join(',')",
                     "xs[::-1]", "loop.index if loop is defined else 0", "'q\"uote'", "\"it's\"", "n is odd",
                     "s.split(' ')", "d|tojson", "d.items()|list", "xs|first", "none", "true", "1.5 * n", "n // 2",
                     "-n", "s[1:3]", "[n, s]", "{'k': n}", "xs|map('string')|join", "s.strip()", "s.title()",
                     "(n > 2) and s or 'no'", "i is defined and i", "d.b[1].c is none", "xs|select('number')|list"});
    }
    std::string cond() {
        return pick({"x", "n > 2", "not xs", "s.startswith('a')", "d.a is defined", "x is not defined", "'b' in s",
                     "n == 3", "xs|length > 1", "loop is defined and loop.first", "i is defined and i is number"});
    }
    std::string text() {
        static const char* const ws[] = {"", " ", "  ", "\n", " \n", "\n  ", "\t", "\n\n", "  \n  "};
        return std::string(pick(ws)) + pick({"a", "b c", "line", ""}) + pick(ws);
    }
    std::string seq(int depth) {
        std::string out;
        for (int k = 0, n = 1 + roll(3); k < n; k++) out += block(depth);
        return out;
    }
    std::string block(int depth) {
        int k = roll(depth < 3 ? 12 : 2);
        switch (k) {
        case 0:
        case 1: return text();
        case 2: return vo() + " " + expr() + " " + vc();
        case 3: return std::string("{#") + pick({"", "-"}) + " c " + pick({"", "-"}) + "#}";
        case 4: {
            std::string s = o() + " if " + cond() + " " + c() + seq(depth + 1);
            if (roll(1)) s += o() + " else " + c() + seq(depth + 1);
            return s + o() + " endif " + c();
        }
        case 5: return o() + " for i in xs " + c() + seq(depth + 1) + vo() + " loop.index ~ i " + vc() + o() + " endfor " + c();
        case 6: return o() + " set y = " + expr() + " " + c() + vo() + " y " + vc();
        case 7:
            return o() + " macro m(a, b=2) " + c() + seq(depth + 1) + vo() + " a ~ b " + vc() + o() + " endmacro " + c() +
                   vo() + " m(n) " + vc();
        case 8: return o() + " call m2(n) " + c() + seq(depth + 1) + o() + " endcall " + c();
        case 9: return o() + " set ns.v = ns.v ~ " + expr() + " " + c() + vo() + " ns.v " + vc();
        case 10: {
            std::string ctl = pick({"{% break %}", "{% continue %}", "{%- if loop.last %}{% break %}{% endif -%}"});
            return o() + " for i in xs if i is number " + c() + seq(depth + 1) + ctl + seq(depth + 1) + o() +
                   " else " + c() + "none" + o() + " endfor " + c();
        }
        case 11: return o() + " set z " + c() + seq(depth + 1) + o() + " endset " + c() + vo() + " z|trim " + vc();
        default:
            return o() + " if n > 5 " + c() + seq(depth + 1) + o() + " elif " + cond() + " " + c() + seq(depth + 1) + o() +
                   " endif " + c();
        }
    }
};

}  // namespace

TEST_CASE("random templates render as Python's jinja2 renders them", "[template][reference]") {
    const ordered_json ctx = ordered_json::parse(
        R"({"x": true, "n": 3, "xs": [1, "b", 2.5, 0], "s": "ab cé", "d": {"a": 1, "b": [1, {"c": null}]}})");
    Generator gen(20261201);
    std::vector<steward_test::ReferenceCase> cases;
    for (int k = 0; k < 250; k++) {
        std::string t = gen.tmpl();
        cases.push_back({t, t, ctx});
    }
    std::string error;
    auto ref = steward_test::run_reference(cases, error);
    if (!error.empty()) FAIL(error);
    REQUIRE(ref.size() == cases.size());
    size_t n_rendered = 0;
    for (size_t k = 0; k < cases.size(); k++) {
        auto t = steward::jinja::Template::compile(cases[k].source);
        steward::Expected<std::string> got = t ? (*t)->render(ctx) : steward::Expected<std::string>(t.error());
        INFO("template: " << cases[k].source);
        INFO("reference " << (ref[k].ok ? "rendered" : "failed") << ": " << ref[k].text);
        INFO("steward " << (got ? "rendered: " + *got : "failed: " + got.error().message));
        REQUIRE(got.ok() == ref[k].ok);
        if (got.ok()) {
            CHECK(*got == ref[k].text);
            n_rendered++;
        }
    }
    CHECK(n_rendered > cases.size() * 3 / 4);  // most are valid templates, not errors both ways
}
