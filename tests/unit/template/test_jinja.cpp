// The Jinja interpreter on its own: hand-computed expectations (whitespace control, loop
// variables, namespace, macros, filters, errors naming the line), a corpus of feature snippets
// compared with Python's jinja2, and hostile templates that must give errors, never crashes.
#include <catch2/catch.hpp>

#include "reference.h"
#include "template/jinja.h"

using nlohmann::ordered_json;
using steward::jinja::RenderOptions;
using steward::jinja::Template;

namespace {

// The rendering, or "ERROR: message".
std::string render(const std::string& src, const ordered_json& ctx = ordered_json::object(), RenderOptions opt = {}) {
    auto t = Template::compile(src);
    if (!t) return "ERROR: " + t.error().message;
    auto r = (*t)->render(ctx, opt);
    if (!r) return "ERROR: " + r.error().message;
    return *r;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

TEST_CASE("whitespace control: '-' strips, trim_blocks drops one newline, lstrip_blocks drops indentation", "[template]") {
    CHECK(render("a  {{- 'b' -}}  c") == "abc");
    CHECK(render("a\n  {%- if true %}b{% endif -%}\n  c") == "abc");
    CHECK(render("{% if true %}\nx\n{% endif %}\ny") == "x\ny");      // trim_blocks
    CHECK(render("  {% if true %}x{% endif %}") == "x");               // lstrip_blocks
    CHECK(render("  {{ 'x' }}") == "  x");                             // not for {{ }}
    CHECK(render("a\n  {# note #}\nb") == "a\nb");                     // comments too
    CHECK(render("  {%+ if true %}x{% endif %}") == "  x");            // '+' keeps the indentation
    CHECK(render("{% if true +%}\nx{% endif %}") == "\nx");            // '+' keeps the newline
    CHECK(render("{% raw %}{{ not }}{% endraw %}") == "{{ not }}");
}

TEST_CASE("for loops give loop.index, index0, first, last, length, revindex and the else branch", "[template]") {
    CHECK(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
                 "{{ loop.revindex }};{% endfor %}",
                 {{"xs", {"a", "b"}}}) == "10TrueFalse22;21FalseTrue21;");
    CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
    CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}) == "b=1,a=2,");
    CHECK(render("{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}", {{"xs", {1, 2, 3}}}) == "2132");
    CHECK(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
                 "{{ x }}{% endfor %}") == "02");
    CHECK(render("{% for x in xs|reverse %}{{ x }}{% endfor %}", {{"xs", {1, 2, 3}}}) == "321");
}

TEST_CASE("namespace attributes survive the loop while a plain set inside it does not", "[template]") {
    CHECK(render("{% set ns = namespace(n=0) %}{% set m = 0 %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}"
                 "{% set m = m + x %}{% endfor %}{{ ns.n }} {{ m }}") == "6 0");
}

TEST_CASE("macros take defaults and keywords, recurse, and receive a caller", "[template]") {
    CHECK(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} "
                 "{{ greet('B', punct='?') }}") == "Hi A! Hi B?");
    CHECK(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}") == "321");
    CHECK(render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}in{% endcall %}") == "[in]");
}

TEST_CASE("filters and string methods compute what Python computes", "[template]") {
    CHECK(render("{{ '  x  '|trim }}|{{ 'a,b'.split(',')|join('+') }}|{{ 'Hello'.lower() }}|{{ 'ab'|upper }}") ==
          "x|a+b|hello|AB");
    CHECK(render("{{ {'b': 1, 'a': [1, 2.5, none, true, 'é\"']}|tojson }}") == "{\"b\": 1, \"a\": [1, 2.5, null, true, \"é\\\"\"]}");
    CHECK(render("{{ [1, {'a': 2}]|tojson(indent=2) }}") == "[\n  1,\n  {\n    \"a\": 2\n  }\n]");
    CHECK(render("{{ 'abc'[::-1] }}{{ 'abcdef'[1:3] }}{{ [1,2,3][-1] }}") == "cbabc3");
    CHECK(render("{{ xs|selectattr('r', 'equalto', 'u')|map(attribute='c')|join }}",
                 {{"xs", {{{"r", "u"}, {"c", "1"}}, {{"r", "a"}, {"c", "2"}}, {{"r", "u"}, {"c", "3"}}}}}) == "13");
    CHECK(render("{{ x|default('d') }}{{ none|string }}{{ 3.0|int }}{{ '7'|int + 1 }}{{ -2|abs }}{{ (-2)|abs }}{{ 2.567|round(1) }}") ==
          "dNone38222.6");
    CHECK(render("{{ 'héllo'|length }}{{ [3,1,2]|sort|list }}{{ ['a','A','b']|unique|list }}") == "5[1, 2, 3]['a', 'b']");
}

TEST_CASE("undefined values are falsy and render empty, using one as an object is an error", "[template]") {
    CHECK(render("[{{ missing }}]{% if not missing %}f{% endif %}{{ missing is defined }}{{ d.nokey is defined }}",
                 {{"d", ordered_json::object()}}) == "[]fFalseFalse");
    CHECK(starts_with(render("{{ missing.attr }}"), "ERROR: line 1, column 11: 'missing' is undefined"));
}

TEST_CASE("errors name the template line and column of the problem", "[template]") {
    CHECK(render("a\nb\n{% for x in xs %}\n{{ x + 1 }}\n{% endfor %}", {{"xs", {"s"}}}) ==
          "ERROR: line 4, column 6: can only concatenate str (not \"int\") to str");
    CHECK(render("x\n{% if %}") == "ERROR: line 2, column 7: unexpected '%}' in an expression");
    CHECK(render("{% for x in y %}") == "ERROR: line 1, column 17: unexpected end of template: expected 'endfor' or 'else'");
    CHECK(render("\n  {{ raise_exception('roles must alternate') }}") == "ERROR: line 2, column 6: raise_exception: roles must alternate");
    CHECK(render("{% frobnicate %}").find("unknown statement 'frobnicate'") != std::string::npos);
    CHECK(render("{{ x|nosuchfilter }}").find("no filter named 'nosuchfilter'") != std::string::npos);
}

TEST_CASE("strftime_now formats the fixed instant it is given", "[template]") {
    RenderOptions opt;
    opt.now_unix = 1735732800;  // 2025-01-01 12:00:00 UTC
    CHECK(render("{{ strftime_now('%d %b %Y %H') }}", ordered_json::object(), opt) == "01 Jan 2025 12");
}

TEST_CASE("hostile templates stop with an error naming the bound, never a crash", "[template][hostile]") {
    // Deep nesting: parser and evaluator are bounded.
    std::string deep_paren(5000, '(');
    CHECK(starts_with(render("{{ " + deep_paren + "1" + std::string(5000, ')') + " }}"), "ERROR:"));
    std::string deep_if;
    for (int k = 0; k < 500; k++) deep_if += "{% if true %}";
    CHECK(starts_with(render(deep_if), "ERROR:"));
    std::string deep_list(3000, '[');
    CHECK(starts_with(render("{{ " + deep_list + std::string(3000, ']') + " }}"), "ERROR:"));
    // Endless recursion.
    CHECK(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("called more than 64 deep") != std::string::npos);
    // Loops that would run for hours.
    CHECK(render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}").find("the limit is") !=
          std::string::npos);
    CHECK(render("{% for a in range(100000) %}{% for b in range(100) %}{% endfor %}{% endfor %}").find("the limit is") !=
          std::string::npos);
    CHECK(render("{{ range(1000000000)|length }}").find("MAX_RANGE") != std::string::npos);
    // Output and values that would exhaust memory.
    CHECK(render("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").find("max_output_bytes") != std::string::npos);
    CHECK(render("{{ 'x' * 100000000000 }}").find("over the limit") != std::string::npos);
    CHECK(starts_with(render("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
                      "ERROR:"));
    CHECK(starts_with(render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                             "{{ ns.x|length }}"),
                      "ERROR:"));
    // One huge string held many times: printing, joining or serializing it stops at the limit.
    const std::string many = "{% set xs = ['x' * 1000000] * 100000 %}";
    CHECK(render(many + "{{ xs }}").find("max_output_bytes") != std::string::npos);
    CHECK(render(many + "{{ xs|join }}").find("over the limit") != std::string::npos);
    CHECK(starts_with(render(many + "{{ xs|tojson }}"), "ERROR:"));
    CHECK(starts_with(render(many + "{{ xs|string|length }}"), "ERROR:"));
    // Scanning a huge string in a loop is charged by its size, so it stops early.
    CHECK(render("{% set s = 'é' * 4000000 %}{% for i in range(100000) %}{{ s[i] }}{% endfor %}").find("steps") !=
          std::string::npos);
    // A namespace that would hold itself (a cycle) is refused.
    CHECK(starts_with(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), "ERROR:"));
    CHECK(starts_with(render("{{ 9223372036854775807 + 1 }}"), "ERROR:"));
    CHECK(render("{{ '%99999999s' % 'x' }}").find("too large") != std::string::npos);
    CHECK(starts_with(render("{{ ('%s' * 10000000) % 'x' }}"), "ERROR:"));
    CHECK(starts_with(render("{{ 1 // 0 }}"), "ERROR:"));
    CHECK(starts_with(render("{{ 'abc"), "ERROR:"));
    CHECK(starts_with(render("{{ x "), "ERROR:"));
    CHECK(starts_with(render("{# never closed"), "ERROR:"));
}

// Feature snippets: the same source and context through jinja2 and the interpreter.
TEST_CASE("a corpus of feature snippets renders as Python's jinja2 renders it", "[template][reference]") {
    const ordered_json ctx = ordered_json::parse(R"({
        "s": "  Hello, World  ", "n": 7, "f": 2.5, "neg": -3, "t": true, "nul": null, "u": "ünï 😀",
        "xs": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"z": 1, "a": [1, 2], "m": {"k": "v"}},
        "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                 {"role": "user", "content": "bye", "extra": 1}],
        "big": 12345678901234, "tiny": 0.0001, "huge": 1e20, "q": "it's \"quoted\"\n\ttab\\"
    })");
    const char* snippets[] = {
        "{{ s }}|{{ s|trim }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' Hd') }}",
        "{{ s.split() }}|{{ s.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}",
        "{{ s.startswith('  He') }}{{ s.endswith('d  ') }}{{ s.find('o') }}{{ s.find('zz') }}{{ s.replace('l', 'L') }}",
        "{{ s|upper }}{{ s|lower }}{{ 'hello world-foo'|title }}{{ 'hELLO'|capitalize }}{{ 'hello world'.title() }}",
        "{{ n + f }} {{ n - 10 }} {{ n * 3 }} {{ n / 2 }} {{ n // 2 }} {{ n % 3 }} {{ neg % 5 }} {{ neg // 2 }} {{ 2 ** 10 }} {{ f * 2 }}",
        "{{ 'a' ~ n ~ f ~ t ~ nul }}|{{ 'ab' * 3 }}|{{ xs + [4] }}|{{ [1] * 3 }}",
        "{{ n > 5 }}{{ n >= 7 }}{{ n < 7 }}{{ n != 7 }}{{ 'a' < 'b' }}{{ 1 < n < 10 }}{{ 3 in xs }}{{ 9 not in xs }}{{ 'ell' in s }}{{ 'z' in d }}",
        "{{ t and n }}|{{ nul or 'dflt' }}|{{ not t }}|{{ 'y' if t else 'n' }}|{{ 'y' if nul }}|{{ (1, 2) }}|{{ (1,) }}",
        "{{ xs }}{{ d }}{{ msgs[0] }}{{ q }}{{ [q] }}{{ t }}{{ nul }}{{ big }}{{ tiny }}{{ huge }}{{ 1.0 }}{{ 1e-7 }}{{ 123456789.123 }}",
        "{{ xs|tojson }}{{ d|tojson }}{{ msgs|tojson(indent=4) }}{{ q|tojson }}{{ u|tojson }}{{ f|tojson }}{{ huge|tojson }}",
        "{{ d|tojson(indent=2, sort_keys=true) }}{{ d|tojson(separators=(',', ':')) }}",
        "{{ xs|length }}{{ d|length }}{{ u|length }}{{ xs|count }}{{ xs|first }}{{ xs|last }}{{ xs|sort }}{{ xs|sort(reverse=true) }}",
        "{{ words|sort }}{{ words|sort(case_sensitive=true) }}{{ words|unique|list }}{{ words|min }}{{ words|max }}{{ xs|sum }}",
        "{{ d|items|list }}{{ d.items()|list }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('z') }}{{ d.get('no', 5) }}{{ d.get('no') }}",
        "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}",
        "{{ msgs|selectattr('extra')|list }}{{ msgs|selectattr('extra', 'defined')|map(attribute='role')|join(',') }}{{ xs|select('odd')|list }}{{ xs|reject('even')|list }}",
        "{{ words|map('upper')|join('-') }}{{ msgs|map(attribute='content')|join(', ') }}{{ msgs|join(',', attribute='role') }}",
        "{{ x|default('d') }}{{ nul|default('d') }}{{ nul|default('d', true) }}{{ ''|d('e', true) }}{{ n|string ~ 'x' }}",
        "{{ '12'|int }}{{ '1.9'|int }}{{ 'x'|int }}{{ 'x'|int(5) }}{{ 3|float }}{{ '2.5'|float }}{{ f|int }}{{ neg|abs }}{{ f|round }}{{ 3.14159|round(2) }}{{ 2.5|round(0, 'floor') }}",
        "{{ s[2:7] }}{{ s[::-1] }}{{ s[-3:] }}{{ xs[1:] }}{{ xs[::-1] }}{{ xs[::2] }}{{ u[1:3] }}{{ u[-1] }}{{ xs[5] is defined }}{{ s[0] }}",
        "{% for m in msgs %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if loop.previtem %}<{{ loop.previtem.role }}{% endif %}{% if loop.nextitem is defined %}>{{ loop.nextitem.role }}{% endif %}{{ loop.cycle('a', 'b') }}{{ loop.revindex0 }} {% endfor %}",
        "{% for k in d %}{{ k }}{% endfor %}{% for c in 'abc' %}{{ c }}{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
        "{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
        "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = [1, 2] %}{{ c }}{% set x %}block {{ n }}{% endset %}[{{ x }}]",
        "{% set x | upper %}shout {{ s|trim }}{% endset %}{{ x }}{% filter lower %}QUIET {{ 'X' }}{% endfilter %}",
        "{% set ns = namespace(a=1, b=[]) %}{% set ns.a = ns.a + 1 %}{% set ns.c = 'new' %}{{ ns.a }}{{ ns.b }}{{ ns.c }}{{ ns.zz is defined }}",
        "{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='y') }}{{ m(a=9) }}",
        "{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}inside {{ n }}{% endcall %}",
        "{{ n is number }}{{ n is integer }}{{ f is float }}{{ s is string }}{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ nul is none }}{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ x is undefined }}{{ n is eq 7 }}{{ n is gt 3 }}{{ xs is mapping }}{{ s is number }}{{ nul is not none }}",
        "{{ 'a' if n is divisibleby(2) else 'b' }}{{ n is defined and n > 3 }}{{ x is not defined or x }}{{ 'in' is in 'string' }}",
        "{{ '{} and {}'.format(1, 'b') }}{{ '{0}{0}{name}'.format('x', name='y') }}{{ 'abc'.upper() }}{{ 'a-b'.replace('-', '+', 1) }}{{ 'aXbXc'.split('X')[-1] }}",
        "{{ 'x'.join(['a', 'b']) }}{{ 'ab'.count('a') }}{{ 'a\nb\r\nc'.splitlines() }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'Ab'.swapcase() }}",
        "{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b=2) }}{{ {'k': 'v'}['k'] }}{{ {'k': 'v'}.k }}",
        "{{ 'line1\nline2\n\nline4'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'one two  three'|wordcount }}|{{ 'a<b>&\"'|e }}",
        "{{ msgs[0].content }}{{ msgs[0]['role'] }}{{ msgs[-1].extra }}{{ d.m.k }}{{ d['m']['k'] }}{{ d.a.0 }}{{ d.a[1] }}",
        "  {% if t %}\n    yes\n  {% else %}\n    no\n  {% endif %}\n  {%- for x in xs %}\n  {{ x }}\n  {%- endfor %}\n",
        "{{- 'a' }}\n   {{ 'b' -}}   \n {#- c -#}  \n{% if true -%}\n  d\n{%- endif %}\n\ne",
        "{% for x in xs %}{{ x }}{% if not loop.last %}, {% endif %}{% endfor %}\n{% for x in [] %}{% else %}none{% endfor %}",
        "{{ messages }}{{ \"double 'q'\" }}{{ 'single \"q\"' }}{{ 'esc\\'d' }}{{ \"\\u00e9\\x41\\n\" }}",
        "{{ 0.1 + 0.2 }}{{ 1/3 }}{{ 2.0 * 3 }}{{ 10 / 5 }}{{ -0.0 }}{{ 1e16 }}{{ 1.5e-5 }}{{ 100000000000000000000.0 }}",
        "{{ t + 1 }}{{ true == 1 }}{{ [1, 2] == [1, 2] }}{{ {'a': 1} == {'a': 1} }}{{ msgs[0] == msgs[0] }}{{ none == none }}{{ 1 == 1.0 }}",
        "{% set xs2 = xs|list %}{{ xs2 }}{{ 'abc'|list }}{{ d|list }}{{ (d|dictsort) }}{{ xs|reverse|list }}{{ 'abc'|reverse }}",
        "{{ msgs|selectattr('role', 'in', ['user'])|list|length }}{{ [none, 0, 1, '', 'a']|select|list }}{{ msgs|map(attribute='missing', default='-')|list }}",
        "{{ nul|selectattr('type', 'equalto', 'function')|list }}{{ nul|select|list }}{{ nul|reject|list }}{{ nul|rejectattr('x')|list }}{{ nul|map(attribute='x')|list }}{{ 0|select|list }}{{ ''|map('upper')|list }}{{ x|selectattr('a')|list }}",
        "{% for t in nul|selectattr('type', 'equalto', 'function') %}{{ t }}{% else %}no tools{% endfor %}{{ (nul|selectattr('type')|list|length) }}",
        "{% for m in msgs if m.role == 'user' %}{{ loop.index }}{{ m.content }}{% endfor %}{% for i in range(5) if i is odd %}{{ i }}{% endfor %}",
        "{{ 'ünïcödé'|upper }}{{ 'ÀB'|lower }}{{ u[0] }}{{ u|reverse }}{{ '  x\u00a0'|trim }}|",
        "{{ x.y }}",
        "{{ nul.y }}|{{ n.y }}|{{ xs.y }}|{{ s.y }}",
        "{{ undefined_var + 1 }}",
        "{{ nul + 'x' }}",
        "{{ 'x' + 1 }}",
        "{{ xs < 'a' }}",
        "{% for x in nul %}{% endfor %}",
        "{% for x in 5 %}{% endfor %}",
        "{{ raise_exception('boom ' ~ n) }}",
        "{{ x|tojson }}",
        "{{ [1, 2].append(3) }}",
        "{% set d2 = {} %}{{ d2.update({'a': 1}) }}",
        "{{ s.nomethod() }}",
        "{{ 1 / 0 }}",
        "{{ msgs|first|tojson }}{{ msgs|last }}{{ []|first }}{{ x|list }}{{ x|length }}{{ x|items|list }}",
        "{{ '%s-%d-%5.2f-%r-%x-%%-%-4s|' % (s, n, f, 'q', 255, 'ab') }}{{ '%(a)s=%(b)03d' % {'a': 'k', 'b': 7} }}{{ '%s!'|format(n) }}{{ '%(x)s'|format(x=1) }}{{ '%s' % [1, 'a'] }}{{ '%c%c' % ('a', 98) }}",
        "{{ '%s %s' % (1,) }}",
        "{{ '%d' % 'x' }}",
        "{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ 'abc'[5] }}{{ xs['a'] }}{{ d[0] }}{{ d.items is defined }}",
        "{{ 'straße'|upper }}{{ 'ΑΒΓ Ωμέγα'|lower }}{{ 'ПРИВЕТ мир'|title }}{{ 'élan vital'|capitalize }}{{ 'ŁÓDŹ'|lower }}",
    };
    std::vector<steward_test::ReferenceCase> cases;
    ordered_json full = ctx;
    full["messages"] = ordered_json::array({{{"role", "user"}, {"content", "x"}}});
    for (const char* s : snippets) cases.push_back({s, s, full});
    std::string error;
    auto ref = steward_test::run_reference(cases, error);
    if (!error.empty()) FAIL(error);
    REQUIRE(ref.size() == cases.size());
    for (size_t k = 0; k < cases.size(); k++) {
        std::string got = render(cases[k].source, full);
        INFO("snippet: " << cases[k].source);
        INFO("reference " << (ref[k].ok ? "rendered" : "failed") << ": " << ref[k].text);
        INFO("steward: " << got);
        if (!ref[k].ok) CHECK(starts_with(got, "ERROR:"));
        else CHECK(got == ref[k].text);
    }
}
