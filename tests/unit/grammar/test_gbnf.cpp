// GBNF parsing and the matcher over bytes: what grammars accept (against hand-worked strings and
// std::regex as the reference for the regex front end), parse errors with line:column, partial
// UTF-8 across feeds, and rollback.
#include <catch2/catch.hpp>
#include <random>
#include <regex>
#include <string>

#include "grammar/grammar.h"

using namespace steward;

namespace {

std::shared_ptr<const CompiledGrammar> compile(const std::string& text) {
    auto g = CompiledGrammar::from_gbnf(text);
    INFO(text);
    if (!g) FAIL(g.error().message);
    return *g;
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
    GrammarMatcher m(g);
    return m.accept_bytes(s) && m.is_accepting();
}

std::string parse_error(const std::string& text) {
    auto g = CompiledGrammar::from_gbnf(text);
    REQUIRE_FALSE(g.ok());
    return g.error().message;
}

}  // namespace

TEST_CASE("a GBNF grammar accepts exactly the strings its rules describe") {
    auto g = compile(R"(# a comment line
root ::= "1. " move (" " move)* "\n"   # trailing comment
move ::= piece? [a-h] [1-8] check?
piece ::= [NBRQK]
check ::= "+" | "#"
)");
    CHECK(matches(g, "1. e4\n"));
    CHECK(matches(g, "1. Nf3 e5+ Qh5#\n"));
    CHECK_FALSE(matches(g, "1. e9\n"));
    CHECK_FALSE(matches(g, "1. e4"));
    CHECK_FALSE(matches(g, "1. Xe4\n"));
}

TEST_CASE("GBNF repetitions {m}, {m,}, {m,n} and ? bound the number of copies") {
    auto g = compile("root ::= \"a\"{2} \"b\"{1,3} \"c\"{2,} \"d\"?\n");
    CHECK(matches(g, "aabcc"));
    CHECK(matches(g, "aabbbccccd"));
    CHECK_FALSE(matches(g, "abcc"));
    CHECK_FALSE(matches(g, "aabbbbcc"));
    CHECK_FALSE(matches(g, "aabc"));
    CHECK_FALSE(matches(g, "aabccdd"));
    auto z = compile("root ::= \"x\" \"y\"{0,0} \"z\"\n");
    CHECK(matches(z, "xz"));
}

TEST_CASE("GBNF literal and class escapes decode to the code points they name") {
    auto g = compile(R"(root ::= "\x41\u00e9\U0001F600\t\n\"\\" [\[\]\-] [^\x00-\x7F] .)");
    CHECK(matches(g, "A\xC3\xA9\xF0\x9F\x98\x80\t\n\"\\]\xE6\x97\xA5z"));
    CHECK(matches(g, "A\xC3\xA9\xF0\x9F\x98\x80\t\n\"\\-\xC3\xA9\n"));
    CHECK_FALSE(matches(g, "A\xC3\xA9\xF0\x9F\x98\x80\t\n\"\\]az"));
}

TEST_CASE("newlines continue a rule inside parentheses and after |, and end it elsewhere") {
    auto g = compile("root ::= (\n  \"a\"\n  \"b\"\n) |\n  \"c\"\nother ::= \"d\"\n");
    CHECK(matches(g, "ab"));
    CHECK(matches(g, "c"));
    CHECK_FALSE(matches(g, "d"));
}

TEST_CASE("GBNF parse errors name the line and column, what was expected and the fix") {
    CHECK_THAT(parse_error("root ::= x\nx ::= (\"a\" \"b\"\n\n"),
               Catch::Contains("grammar:4:1") && Catch::Contains("expected ')' to close the group opened at 2:7"));
    CHECK_THAT(parse_error("root ::= \"ab\n"), Catch::Contains("grammar:1:10") && Catch::Contains("add '\"'"));
    CHECK_THAT(parse_error("root ::= [a-z\n"), Catch::Contains("grammar:1:10") && Catch::Contains("add ']'"));
    CHECK_THAT(parse_error("root ::= item\n"),
               Catch::Contains("grammar:1:10") && Catch::Contains("'item' is used but never defined"));
    CHECK_THAT(parse_error("root ::= \"a\"\n  x ::= \"b\" }\n"), Catch::Contains("grammar:2:13"));
    CHECK_THAT(parse_error("root ::= \"a\" {2,1}\n"), Catch::Contains("grammar:1:14") && Catch::Contains("smaller bound"));
    CHECK_THAT(parse_error("root ::= \"\\q\"\n"), Catch::Contains("grammar:1:11") && Catch::Contains("unknown escape"));
    CHECK_THAT(parse_error("root ::= \"a\"\nroot ::= \"b\"\n"),
               Catch::Contains("grammar:2:1") && Catch::Contains("defined twice (first at 1:1)"));
    CHECK_THAT(parse_error("root ::= \"a\"\n| \"b\"\n"), Catch::Contains("grammar:2:1") && Catch::Contains("'|'"));
    CHECK_THAT(parse_error("start ::= \"a\"\n"), Catch::Contains("no rule named 'root'"));
    CHECK_THAT(parse_error("root ::= * \"a\"\n"), Catch::Contains("grammar:1:10") && Catch::Contains("nothing to repeat"));
    // Hostile nesting is an error, not a stack overflow.
    CHECK_THAT(parse_error("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')') + "\n"),
               Catch::Contains("nest deeper than 256"));
}

TEST_CASE("left recursion, empty repetition and rules that can never finish are refused at compile time") {
    CHECK_THAT(parse_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n"),
               Catch::Contains("grammar:2:1") && Catch::Contains("'expr' is left-recursive"));
    CHECK_THAT(parse_error("root ::= (\"a\"?)*\n"), Catch::Contains("left-recursive or repeats something that can be empty"));
    CHECK_THAT(parse_error("root ::= \"a\" loop\nloop ::= \"b\" loop\n"),
               Catch::Contains("grammar:2:1") && Catch::Contains("'loop' can never finish"));
}

TEST_CASE("a token may span several grammar elements and end inside a UTF-8 character") {
    auto g = compile("root ::= \"ab\" [0-9]+ \"c\" [\xE6\x97\xA5-\xE6\x97\xA7] \"!\"\n");
    GrammarMatcher m(g);
    REQUIRE(m.accept_bytes("ab1"));
    REQUIRE(m.accept_bytes("2c\xE6"));
    CHECK(m.state().n_partial_left == 2);
    CHECK_FALSE(m.is_accepting());
    CHECK_FALSE(m.can_accept_bytes("\x97\xA8"));  // U+65E8 is outside the class
    CHECK_FALSE(m.can_accept_bytes("!"));         // not a continuation byte
    REQUIRE(m.accept_bytes("\x97"));
    REQUIRE(m.accept_bytes("\xA6!"));
    CHECK(m.is_accepting());
}

TEST_CASE("ill-formed UTF-8 is rejected: stray continuations, overlong forms, surrogates, lead bytes F5 and up") {
    auto g = compile("root ::= .*\n");
    GrammarMatcher m(g);
    CHECK(m.can_accept_bytes("\xC3\xA9\xF0\x9F\x98\x80"));
    CHECK_FALSE(m.can_accept_bytes("\x80"));
    CHECK_FALSE(m.can_accept_bytes("\xC0\x80"));
    CHECK_FALSE(m.can_accept_bytes("\xE0\x80"));      // overlong already at the second byte
    CHECK_FALSE(m.can_accept_bytes("\xED\xA0\x80"));  // U+D800
    CHECK_FALSE(m.can_accept_bytes("\xF5"));
    CHECK(m.can_accept_bytes("\xF4\x8F\xBF\xBF"));
    CHECK_FALSE(m.can_accept_bytes("\xF4\x90"));  // above U+10FFFF
}

TEST_CASE("a rejected feed leaves the state unchanged and rollback(n) restores the state before n feeds") {
    auto g = compile("root ::= \"[\" ([0-9]+ (\",\" [0-9]+)*)? \"]\"\n");
    GrammarMatcher m(g);
    std::vector<StackSet> seen{m.state()};
    for (const char* piece : {"[", "12", ",", "3"}) {
        REQUIRE(m.accept_bytes(piece));
        seen.push_back(m.state());
    }
    const StackSet before = m.state();
    CHECK_FALSE(m.accept_bytes(",]"));
    CHECK(m.state() == before);
    CHECK(m.n_history() == 4);
    m.rollback(3);
    CHECK(m.state() == seen[1]);
    CHECK(m.n_history() == 1);
    m.rollback(10);
    CHECK(m.state() == seen[0]);
    REQUIRE(m.accept_bytes("[7]"));
    CHECK(m.is_accepting());
}

TEST_CASE("the regex front end accepts the same strings as std::regex on random inputs") {
    const char* patterns[] = {"^[a-c]+(x|yz)?\\d{1,3}$", "(ab|a)*c", "[^a]b.", "a{2,}b?|c", "(?:\\w\\s){2}[.-]",
                              "x[a-c-]*\\.", "colou?r", "(a|b){0,2}c+"};
    std::mt19937 rng(7);
    const std::string alphabet = "abcxyz019 .-_\n";
    for (const char* p : patterns) {
        auto g = CompiledGrammar::from_regex(p);
        INFO(p);
        REQUIRE(g.ok());
        const std::regex ref(p, std::regex::ECMAScript);
        for (int i = 0; i < 400; ++i) {
            std::string s;
            const int len = (int)(rng() % 7);
            for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
            INFO("input: " << s);
            CHECK(matches(*g, s) == std::regex_match(s, ref));
        }
    }
}

TEST_CASE("regex errors name the column and the fix") {
    auto e = CompiledGrammar::from_regex("ab(c");
    REQUIRE_FALSE(e.ok());
    CHECK_THAT(e.error().message, Catch::Contains("regex:5") && Catch::Contains("close the group opened at column 3"));
    auto f = CompiledGrammar::from_regex("a\\q");
    REQUIRE_FALSE(f.ok());
    CHECK_THAT(f.error().message, Catch::Contains("regex:2") && Catch::Contains("unknown escape"));
    // A count over the limit is the regex's error, not one in the grammar it would generate.
    auto g = CompiledGrammar::from_regex("xa{1000000}");
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.error().message, Catch::Contains("regex:3") && Catch::Contains("repetition count above 100000"));
    auto h = CompiledGrammar::from_json_schema(std::string_view(R"({"type":"string","pattern":"^a{2,9999999}$"})"));
    REQUIRE_FALSE(h.ok());
    CHECK_THAT(h.error().message, Catch::Contains("repetition count above 100000") && !Catch::Contains("compiler bug"));
    CHECK(CompiledGrammar::from_regex("a{100000}").ok());
}

TEST_CASE("every code point fed one byte at a time is accepted exactly when the class holds it") {
    // Classes whose ranges start and end inside UTF-8 blocks, plus a negated one: pending
    // characters must be kept, narrowed or dropped at each byte exactly as the whole character.
    auto g = compile("root ::= [\\u00e0-\\u00ff\\u0800-\\u0FC1\\u4E00-\\u9FA5\\U0001F600-\\U0001F64F] \"|\" [^\\u4E10-\\u4E1F\\uD7FF] \"|\"\n");
    auto in_first = [](uint32_t cp) {
        return (cp >= 0xE0 && cp <= 0xFF) || (cp >= 0x800 && cp <= 0xFC1) || (cp >= 0x4E00 && cp <= 0x9FA5) ||
               (cp >= 0x1F600 && cp <= 0x1F64F);
    };
    auto in_second = [](uint32_t cp) { return !(cp >= 0x4E10 && cp <= 0x4E1F) && cp != 0xD7FF; };
    auto utf8 = [](uint32_t cp) {
        std::string s;
        if (cp < 0x80) {
            s += char(cp);
        } else if (cp < 0x800) {
            s += char(0xC0 | cp >> 6);
            s += char(0x80 | (cp & 63));
        } else if (cp < 0x10000) {
            s += char(0xE0 | cp >> 12);
            s += char(0x80 | (cp >> 6 & 63));
            s += char(0x80 | (cp & 63));
        } else {
            s += char(0xF0 | cp >> 18);
            s += char(0x80 | (cp >> 12 & 63));
            s += char(0x80 | (cp >> 6 & 63));
            s += char(0x80 | (cp & 63));
        }
        return s;
    };
    auto byte_by_byte = [&](GrammarMatcher& m, const std::string& s) {
        for (char c : s)
            if (!m.accept_bytes(std::string(1, c))) return false;
        return true;
    };
    for (uint32_t cp = 1; cp <= 0x10FFFF; cp += (cp < 0x11000 ? 1 : 61)) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        INFO("U+" << std::hex << cp);
        const std::string ch = utf8(cp);
        GrammarMatcher a(g);
        CHECK(byte_by_byte(a, ch) == in_first(cp));
        GrammarMatcher b(g);
        REQUIRE(b.accept_bytes("\xC3\xA0|"));
        CHECK((byte_by_byte(b, ch) && b.accept_bytes("|") && b.is_accepting()) == in_second(cp));
    }
}
