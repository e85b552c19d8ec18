// The JSON Schema and json_object front ends: seeded random walks over real vocabularies (random
// allowed tokens until the grammar accepts) must give documents that nlohmann parses and that an
// independent validator written here accepts; invalid schemas name their JSON pointer.
#include <catch2/catch.hpp>
#include <climits>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <string>
#include "test_paths.h"

#include "grammar/constraint.h"
#include "grammar/grammar.h"
#include "model/tokenizer.h"

using namespace steward;
using nlohmann::json;

namespace {

const std::string k_tok_dir = std::string(STEWARD_TESTDATA_DIR) + "/tokenizers/ggml-vocab-";

size_t n_code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// A small validator for the keywords the schemas below use; it knows nothing of the grammar.
bool valid(const json& v, const json& s, const json& root) {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) {
        const std::string ref = s["$ref"].get<std::string>();
        return valid(v, root.at(json::json_pointer(ref.substr(1))), root);
    }
    if (s.contains("const") && v != s["const"]) return false;
    if (s.contains("enum")) {
        bool any = false;
        for (const auto& e : s["enum"]) any = any || e == v;
        if (!any) return false;
    }
    if (s.contains("anyOf")) {
        bool any = false;
        for (const auto& b : s["anyOf"]) any = any || valid(v, b, root);
        if (!any) return false;
    }
    if (s.contains("oneOf")) {
        int n = 0;
        for (const auto& b : s["oneOf"]) n += valid(v, b, root);
        if (n != 1) return false;
    }
    if (s.contains("type")) {
        const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
        bool ok = false;
        for (const auto& tj : types) {
            const std::string t = tj.get<std::string>();
            ok = ok || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
                        (t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
                        (t == "integer" && v.is_number_integer()) || (t == "boolean" && v.is_boolean()) ||
                        (t == "null" && v.is_null());
        }
        if (!ok) return false;
    }
    if (v.is_object()) {
        for (const auto& r : s.value("required", json::array()))
            if (!v.contains(r.get<std::string>())) return false;
        const json props = s.value("properties", json::object());
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (props.contains(it.key())) {
                if (!valid(it.value(), props[it.key()], root)) return false;
            } else if (s.contains("additionalProperties") && !valid(it.value(), s["additionalProperties"], root)) {
                return false;
            }
        }
    }
    if (v.is_array()) {
        if (v.size() < s.value("minItems", 0u) || v.size() > s.value("maxItems", UINT32_MAX)) return false;
        if (s.contains("items"))
            for (const auto& e : v)
                if (!valid(e, s["items"], root)) return false;
    }
    if (v.is_number()) {
        const double x = v.get<double>();
        if (s.contains("minimum") && !(x >= s["minimum"].get<double>())) return false;
        if (s.contains("maximum") && !(x <= s["maximum"].get<double>())) return false;
        if (s.contains("exclusiveMinimum") && !(x > s["exclusiveMinimum"].get<double>())) return false;
        if (s.contains("exclusiveMaximum") && !(x < s["exclusiveMaximum"].get<double>())) return false;
    }
    if (v.is_string()) {
        const std::string str = v.get<std::string>();
        // ECMA-262 search semantics, as JSON Schema specifies (std::regex's default grammar).
        if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) return false;
        const size_t n = n_code_points(str);
        if (n < s.value("minLength", 0u) || n > s.value("maxLength", UINT32_MAX)) return false;
        const std::string f = s.value("format", "");
        if (f == "date" && !std::regex_match(str, std::regex(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))")))
            return false;
        if (f == "uuid" &&
            !std::regex_match(str, std::regex("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")))
            return false;
    }
    return true;
}

const char* const k_schemas[] = {
    // nested objects, optional properties, string lengths
    R"({"type":"object","properties":{"id":{"type":"integer"},"user":{"type":"object","properties":{
        "name":{"type":"string","minLength":1,"maxLength":12},"email":{"type":"string"}},
        "required":["name"],"additionalProperties":false}},"required":["id","user"],"additionalProperties":false})",
    // arrays with bounds, arrays of arrays, numbers
    R"({"type":"object","properties":{"scores":{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":4},
        "matrix":{"type":"array","items":{"type":"array","items":{"type":"integer"},"maxItems":3},"maxItems":3}},
        "required":["scores","matrix"],"additionalProperties":false})",
    // enums and const of every kind, escaped and non-ASCII literals
    R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]},"version":{"const":2},
        "mode":{"enum":["a",1,null,true,{"k":[1]}]},"sym":{"enum":["\u2603","\u65e5\u672c\u8a9e","a\"b\\c\n"]}},
        "required":["color","version","mode","sym"],"additionalProperties":false})",
    // anyOf and disjoint oneOf branches
    R"({"type":"object","properties":{"value":{"anyOf":[{"type":"string","maxLength":5},{"type":"integer"},{"type":"null"}]},
        "shape":{"oneOf":[
          {"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"],"additionalProperties":false},
          {"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"number"}},"required":["kind","side"],"additionalProperties":false}]}},
        "required":["value","shape"],"additionalProperties":false})",
    // free strings (escapes, unicode), formats, additionalProperties with a schema
    R"({"type":"object","properties":{"text":{"type":"string"},"day":{"type":"string","format":"date"},
        "id":{"type":"string","format":"uuid"}},"required":["text","day"],"additionalProperties":{"type":"boolean"}})",
    // recursion through $defs
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"],"additionalProperties":false}},
        "$ref":"#/$defs/node"})",
    // extra keys allowed next to declared ones: an extra key must never repeat a declared name
    R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"string","maxLength":2}},"additionalProperties":true})",
    // integer ranges, non-negative and positive numbers, string patterns (anchored and not)
    R"({"type":"object","properties":{"pct":{"type":"integer","minimum":0,"maximum":100},
        "month":{"type":"integer","minimum":1,"maximum":12},"neg":{"type":"integer","maximum":-1},
        "count":{"type":"integer","minimum":0},"t":{"type":"integer","exclusiveMinimum":-50,"exclusiveMaximum":7},
        "w":{"type":"number","minimum":0},"p":{"type":"number","exclusiveMinimum":0},
        "code":{"type":"string","pattern":"^[A-Z]{3}-\\d{2,4}$"},"has":{"type":"string","pattern":"[0-9]"},
        "tail":{"type":"string","pattern":"x[a-m]?$"},"dot":{"type":"string","pattern":"^q.*z$"}},
        "required":["pct","month","neg","count","t","w","p","code","has","tail","dot"],"additionalProperties":false})",
    // a top-level array of a type list
    R"({"type":"array","items":{"type":["string","boolean","null"],"maxLength":3},"minItems":2,"maxItems":5})",
};

// Among the allowed one-byte tokens (and EOG), one that leaves the shortest stack: it closes a
// string, an array or an object rather than opening something. Ties are broken at random.
int32_t closing_token(const GrammarMatcher& m, const TokenVocabulary& v, const std::vector<int32_t>& ids,
                      std::mt19937& rng) {
    int32_t best = ids[rng() % ids.size()];
    long best_score = LONG_MAX;
    for (int32_t id : ids) {
        long score;
        if (v.is_eog(id)) {
            score = -1;
        } else if (v.bytes(id).size() == 1) {
            GrammarMatcher copy = m;
            if (!copy.accept_bytes(v.bytes(id))) continue;
            const StackSet& st = copy.state();
            score = LONG_MAX - 1;
            for (size_t i = 0; i < st.size(); ++i) score = std::min(score, (long)(st.offs[i + 1] - st.offs[i]));
        } else {
            continue;
        }
        if (score < best_score || (score == best_score && rng() % 2)) {
            best = id;
            best_score = score;
        }
    }
    return best;
}

// Random allowed tokens; after `wander` steps, prefer tokens that close things (EOG, } ] ").
std::string random_walk(const TokenMasker& masker, std::shared_ptr<const CompiledGrammar> g, std::mt19937& rng,
                        int wander) {
    const TokenVocabulary& v = masker.vocab();
    GrammarMatcher m(std::move(g));
    std::string out;
    std::vector<uint64_t> mask(masker.n_words());
    for (int step = 0; step < 4000; ++step) {
        const MaskResult r = masker.fill_mask(m, mask);
        REQUIRE_FALSE(r.dead());
        std::vector<int32_t> ids;
        for (int32_t id = 0; id < v.n_vocab(); ++id)
            if (mask[(size_t)id / 64] >> (id % 64) & 1) ids.push_back(id);
        REQUIRE((int32_t)ids.size() == r.n_allowed);
        int32_t pick = ids[rng() % ids.size()];
        if (step >= wander) pick = closing_token(m, v, ids, rng);
        if (v.is_eog(pick)) {
            REQUIRE(m.is_accepting());
            return out;
        }
        REQUIRE(masker.accept_token(m, pick));
        out += v.bytes(pick);
    }
    FAIL("the random walk did not finish in 4000 tokens: " << out.substr(0, 400));
    return out;
}

}  // namespace

TEST_CASE("random walks over schema grammars give documents that parse and validate against the schema") {
    for (const char* vocab_name : {"llama-spm", "gpt-2"}) {
        auto tok = Tokenizer::load(k_tok_dir + vocab_name + ".gguf");
        REQUIRE(tok.ok());
        const auto vocab = TokenVocabulary::from_tokenizer(**tok);
        REQUIRE_FALSE(vocab->eog_ids().empty());
        for (size_t si = 0; si < std::size(k_schemas); ++si) {
            const json schema = json::parse(k_schemas[si]);
            auto g = CompiledGrammar::from_json_schema(std::string_view(k_schemas[si]));
            INFO(vocab_name << " schema " << si);
            if (!g) FAIL(g.error().message);
            TokenMasker masker(*g, vocab);
            std::mt19937 rng(1000 + (unsigned)si);
            for (int walk = 0; walk < 6; ++walk) {
                const std::string doc = random_walk(masker, *g, rng, 8 + walk * 6);
                INFO(doc);
                json parsed;
                REQUIRE_NOTHROW(parsed = json::parse(doc));
                CHECK(valid(parsed, schema, schema));
            }
        }
    }
}

TEST_CASE("random walks over the json_object grammar give JSON objects") {
    auto tok = Tokenizer::load(k_tok_dir + std::string("llama-spm.gguf"));
    REQUIRE(tok.ok());
    const auto vocab = TokenVocabulary::from_tokenizer(**tok);
    TokenMasker masker(CompiledGrammar::json_object(), vocab);
    std::mt19937 rng(3);
    for (int walk = 0; walk < 8; ++walk) {
        const std::string doc = random_walk(masker, CompiledGrammar::json_object(), rng, 10 + walk * 4);
        INFO(doc);
        json parsed;
        REQUIRE_NOTHROW(parsed = json::parse(doc));
        CHECK(parsed.is_object());
    }
}

TEST_CASE("properties come out in the order the schema text declares them") {
    auto g = CompiledGrammar::from_json_schema(std::string_view(
        R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}},"required":["zeta","alpha"],"additionalProperties":false})"));
    REQUIRE(g.ok());
    GrammarMatcher ok(*g), swapped(*g);
    CHECK(ok.accept_bytes(R"({"zeta": 1, "alpha": 2})"));
    CHECK(ok.is_accepting());
    CHECK_FALSE(swapped.accept_bytes(R"({"alpha": 2)"));
}

TEST_CASE("extra keys never repeat a declared property name") {
    auto g = CompiledGrammar::from_json_schema(
        std::string_view(R"({"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":true})"));
    REQUIRE(g.ok());
    for (const char* doc : {R"({"ab": 1, "a": 2})", R"({"abc": "x"})", R"({"ab": 3, "b": []})", R"({"": null})"}) {
        GrammarMatcher m(*g);
        INFO(doc);
        CHECK((m.accept_bytes(doc) && m.is_accepting()));
    }
    for (const char* doc : {R"({"ab": 1, "ab")", R"({"a": 1, "ab": 2, "ab")", R"({"a\u0062")"}) {
        GrammarMatcher m(*g);
        INFO(doc);
        CHECK_FALSE(m.accept_bytes(doc));
    }
}

TEST_CASE("an invalid schema is an error naming the JSON pointer of the offending part and the fix") {
    auto err = [](const char* text) {
        auto g = CompiledGrammar::from_json_schema(std::string_view(text));
        REQUIRE_FALSE(g.ok());
        return g.error().message;
    };
    CHECK_THAT(err(R"({"type":"object","properties":{"age":{"type":"integr"}}})"),
               Catch::Contains("/properties/age/type") && Catch::Contains("unknown type \"integr\""));
    CHECK_THAT(err(R"({"properties":{"x":{"type":"integer","multipleOf":3}}})"),
               Catch::Contains("/properties/x/multipleOf") && Catch::Contains("remove it"));
    CHECK_THAT(err(R"({"properties":{"x":{}},"required":["y"]})"),
               Catch::Contains("schema /required") && Catch::Contains("\"y\", which is not in properties"));
    CHECK_THAT(err(R"({"type":"array","items":{"enum":[]}})"), Catch::Contains("/items/enum"));
    CHECK_THAT(err(R"({"type":"array","minItems":3,"maxItems":1})"), Catch::Contains("/maxItems"));
    CHECK_THAT(err(R"({"anyOf":[{"type":"string"},{"$ref":"#/$defs/missing"}]})"),
               Catch::Contains("/anyOf/1/$ref") && Catch::Contains("points at nothing"));
    CHECK_THAT(err(R"({"type":"object","properties":{"a/b":false}})"), Catch::Contains("/properties/a~1b"));
    CHECK_THAT(err(R"({"type": )"), Catch::Contains("not valid JSON"));
    // A format it cannot enforce is refused, not ignored (the model could write any string there).
    for (const char* f : {"email", "uri", "hostname", "ipv4"})
        CHECK_THAT(err((std::string(R"({"type":"object","properties":{"e":{"type":"string","format":")") + f + "\"}}}").c_str()),
                   Catch::Contains("/properties/e/format") && Catch::Contains(std::string("'") + f + "' is not a format"));
    CHECK_THAT(err(R"({"type":"string","format":7})"), Catch::Contains("/format") && Catch::Contains("must be a string"));
    std::string deep;
    for (int i = 0; i < 5000; ++i) deep += R"({"type":"array","items":)";
    deep += "{}" + std::string(5000, '}');
    CHECK_THAT(err(deep.c_str()), Catch::Contains("nest deeper than 64"));
}

namespace {
bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
    GrammarMatcher m(g);
    return m.accept_bytes(text) && m.is_accepting();
}
}  // namespace

TEST_CASE("integer bounds: every integer in a window is accepted exactly when it satisfies the bounds") {
    struct Case {
        const char* schema;
        std::function<bool(int64_t)> ok;
    };
    const std::vector<Case> cases = {
        {R"({"type":"integer","minimum":0,"maximum":100})", [](int64_t x) { return x >= 0 && x <= 100; }},
        {R"({"type":"integer","minimum":1,"maximum":12})", [](int64_t x) { return x >= 1 && x <= 12; }},
        {R"({"type":"integer","minimum":0})", [](int64_t x) { return x >= 0; }},
        {R"({"type":"integer","maximum":-1})", [](int64_t x) { return x <= -1; }},
        {R"({"type":"integer","exclusiveMinimum":-37,"exclusiveMaximum":412})", [](int64_t x) { return x > -37 && x < 412; }},
        {R"({"type":"integer","minimum":-999,"maximum":-10})", [](int64_t x) { return x >= -999 && x <= -10; }},
        {R"({"type":"integer","minimum":-5,"maximum":5})", [](int64_t x) { return x >= -5 && x <= 5; }},
        {R"({"type":"integer","minimum":7,"maximum":7})", [](int64_t x) { return x == 7; }},
        {R"({"type":"integer","minimum":99,"maximum":1001})", [](int64_t x) { return x >= 99 && x <= 1001; }},
        {R"({"type":"integer","minimum":1.5,"maximum":250.5})", [](int64_t x) { return x >= 2 && x <= 250; }},
        {R"({"type":"integer","exclusiveMinimum":0.5,"exclusiveMaximum":10})", [](int64_t x) { return x >= 1 && x <= 9; }},
        {R"({"type":"integer","minimum":-1000000})", [](int64_t x) { return x >= -1000000; }},
        {R"({"type":"integer","minimum":123456789,"maximum":987654321012})", [](int64_t x) { return x >= 123456789 && x <= 987654321012; }},
        {R"({"type":"integer","minimum":-98765432101,"maximum":-1234567})", [](int64_t x) { return x >= -98765432101 && x <= -1234567; }},
    };
    std::mt19937_64 rng(7);
    for (const auto& c : cases) {
        INFO(c.schema);
        auto g = CompiledGrammar::from_json_schema(std::string_view(c.schema));
        if (!g) FAIL(g.error().message);
        for (int64_t x = -1000; x <= 1000; ++x) {
            INFO(x);
            REQUIRE(accepts(*g, std::to_string(x)) == c.ok(x));
        }
        // Far from zero: random integers of every digit count, and the neighbours of the bounds.
        const json sj = json::parse(c.schema);
        std::vector<int64_t> xs;
        for (int k = 0; k < 400; ++k) {
            const int digits = 1 + (int)(rng() % 15);
            int64_t p = 1;
            for (int d = 0; d < digits; ++d) p *= 10;
            const int64_t x = (int64_t)(rng() % (uint64_t)p);
            xs.push_back(rng() % 2 ? x : -x);
        }
        for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
            if (sj.contains(k))
                for (int64_t d = -3; d <= 3; ++d) xs.push_back((int64_t)sj[k].get<double>() + d);
        for (int64_t x : xs) {
            INFO(x);
            REQUIRE(accepts(*g, std::to_string(x)) == c.ok(x));
        }
        CHECK_FALSE(accepts(*g, "-0"));
        CHECK_FALSE(accepts(*g, "007"));
        CHECK_FALSE(accepts(*g, "1.0"));
    }
}

TEST_CASE("number bounds: minimum 0 gives non-negative numbers, exclusiveMinimum 0 positive ones") {
    auto nonneg = CompiledGrammar::from_json_schema(std::string_view(R"({"type":"number","minimum":0})"));
    auto pos = CompiledGrammar::from_json_schema(std::string_view(R"({"type":"number","exclusiveMinimum":0})"));
    REQUIRE(nonneg.ok());
    REQUIRE(pos.ok());
    // Against nlohmann's value of each string the grammar of json-number accepts.
    auto plain = CompiledGrammar::from_json_schema(std::string_view(R"({"type":"number"})"));
    REQUIRE(plain.ok());
    std::mt19937 rng(11);
    const char alphabet[] = "0123456789.-eE+";
    int n_checked = 0;
    for (int k = 0; k < 200000 && n_checked < 3000; ++k) {
        std::string t;
        const int len = 1 + (int)(rng() % 7);
        for (int i = 0; i < len; ++i) t += alphabet[rng() % (sizeof alphabet - 1)];
        if (!accepts(*plain, t)) continue;
        ++n_checked;
        const double x = json::parse(t).get<double>();
        INFO(t);
        CHECK(accepts(*nonneg, t) == (x >= 0 && t[0] != '-'));
        CHECK(accepts(*pos, t) == (x > 0));
    }
    CHECK(n_checked >= 1000);
    for (const char* t : {"0", "0.0", "0e5", "12.5", "0.25e-3"}) CHECK(accepts(*nonneg, t));
    for (const char* t : {"-1", "-0", "-0.5"}) CHECK_FALSE(accepts(*nonneg, t));
    for (const char* t : {"1", "0.001", "3e2", "0.0000100"}) CHECK(accepts(*pos, t));
    for (const char* t : {"0", "0.000", "0e9", "-2", "-0.1"}) CHECK_FALSE(accepts(*pos, t));
}

TEST_CASE("string patterns: matched with search semantics, inside the quotes, escapes refused") {
    auto g = [](const char* pattern) {
        json s = {{"type", "string"}, {"pattern", pattern}};
        auto r = CompiledGrammar::from_json_schema(std::string_view(s.dump()));
        if (!r) FAIL(r.error().message);
        return *r;
    };
    const auto code = g("^[A-Z]{2}\\d+$");
    CHECK(accepts(code, "\"AB12\""));
    CHECK_FALSE(accepts(code, "\"xAB12\""));
    CHECK_FALSE(accepts(code, "\"AB\""));
    const auto inner = g("b\\.c");
    CHECK(accepts(inner, "\"b.c\""));
    CHECK(accepts(inner, "\"a\\\"b.c\\n\""));  // escapes outside the match are free
    CHECK_FALSE(accepts(inner, "\"bxc\""));
    const auto neg = g("^[^a]*$");
    CHECK(accepts(neg, "\"xyz\""));
    CHECK_FALSE(accepts(neg, "\"x\\\"\""));  // a negated class never matches an escaped character
    auto err = [](const char* pattern, const char* extra = "") {
        std::string s = std::string(R"({"properties":{"p":{"type":"string","pattern":)") + json(pattern).dump() + extra + "}}}";
        auto r = CompiledGrammar::from_json_schema(std::string_view(s));
        REQUIRE_FALSE(r.ok());
        return r.error().message;
    };
    CHECK_THAT(err("^a\"b$"), Catch::Contains("/properties/p/pattern") && Catch::Contains("must escape"));
    CHECK_THAT(err("a\\nb"), Catch::Contains("/properties/p/pattern") && Catch::Contains("must escape"));
    CHECK_THAT(err("\\\\"), Catch::Contains("must escape"));
    CHECK_THAT(err("[\\n\\t]"), Catch::Contains("character class holds only"));
    CHECK_THAT(err("^a|b$"), Catch::Contains("^(?:a|b)$"));
    CHECK_THAT(err("(?=x)"), Catch::Contains("/properties/p/pattern"));
    CHECK_THAT(err("^a$", R"(,"maxLength":3)"), Catch::Contains("/properties/p/maxLength") && Catch::Contains("in the pattern"));
}

TEST_CASE("unsupported numeric bounds are errors naming the pointer and the fix") {
    auto err = [](const char* text) {
        auto g = CompiledGrammar::from_json_schema(std::string_view(text));
        REQUIRE_FALSE(g.ok());
        return g.error().message;
    };
    CHECK_THAT(err(R"({"properties":{"x":{"type":"number","minimum":3}}})"),
               Catch::Contains("/properties/x/minimum") && Catch::Contains("\"type\": \"integer\""));
    CHECK_THAT(err(R"({"type":"number","maximum":1})"), Catch::Contains("/maximum"));
    CHECK_THAT(err(R"({"type":"integer","minimum":5,"maximum":4})"), Catch::Contains("fix the bounds"));
    CHECK_THAT(err(R"({"type":"integer","minimum":0,"exclusiveMinimum":true})"),
               Catch::Contains("/exclusiveMinimum") && Catch::Contains("draft 4"));
    CHECK_THAT(err(R"({"type":"integer","minimum":1e30})"), Catch::Contains("16 digits"));
}

// A JSON Schema enum is generated as a trie of its values' common prefixes: the language must stay
// exactly the set of values (checked by membership in a std::set, the independent reference), and
// a 100,000-value enum must keep the matcher to a few parse stacks instead of one per value.
TEST_CASE("enum values factored into a prefix trie accept exactly the values", "[json_schema]") {
    std::mt19937 rng(5);
    const std::vector<std::string> alphabet = {"a", "b", "ab", "\xC3\xA9", "\xE2\x82\xAC", "1", "_"};
    for (int round = 0; round < 40; round++) {
        std::set<std::string> values;
        const int n = 1 + (int)(rng() % 30);
        while ((int)values.size() < n) {
            std::string v;
            for (int k = (int)(rng() % 5); k > 0; k--) v += alphabet[rng() % alphabet.size()];
            values.insert(v);
        }
        nlohmann::json schema = {{"enum", nlohmann::json::array()}};
        for (const auto& v : values) schema["enum"].push_back(v);
        if (round % 4 == 0) schema["enum"].push_back(42);  // a non-string value among them
        auto g = CompiledGrammar::from_json_schema(schema);
        REQUIRE(g);
        std::set<std::string> dumped;
        for (const auto& v : schema["enum"]) dumped.insert(v.dump(-1, ' ', false));
        // Every value is accepted whole; every other short string over the same pieces is not.
        for (int probe = 0; probe < 300; probe++) {
            std::string s;
            if (probe < (int)dumped.size()) {
                s = *std::next(dumped.begin(), probe);
            } else {
                s = "\"";
                for (int k = (int)(rng() % 5); k > 0; k--) s += alphabet[rng() % alphabet.size()];
                s += "\"";
            }
            GrammarMatcher m(*g);
            const bool accepted = m.accept_bytes(s) && m.is_accepting();
            INFO("round " << round << " probe '" << s << "' in " << schema["enum"].dump());
            CHECK(accepted == (dumped.count(s) == 1));
        }
    }
}

TEST_CASE("a 100000-value enum compiles to a few parse stacks per byte", "[json_schema]") {
    nlohmann::json schema = {{"enum", nlohmann::json::array()}};
    for (int i = 0; i < 100000; i++) schema["enum"].push_back("value_" + std::to_string((int64_t)i * 7919 % 1000003));
    auto g = CompiledGrammar::from_json_schema(schema);
    REQUIRE(g);
    GrammarMatcher m(*g);
    size_t most = m.state().size();
    for (char c : std::string("\"value_")) {
        REQUIRE(m.accept_bytes(std::string(1, c)));
        most = std::max(most, m.state().size());
    }
    CHECK(most <= 16);
    const std::string v = schema["enum"][12345].dump();
    GrammarMatcher whole(*g);
    CHECK((whole.accept_bytes(v) && whole.is_accepting()));
    GrammarMatcher other(*g);
    CHECK_FALSE((other.accept_bytes("\"value_1000004\"") && other.is_accepting()));
}

TEST_CASE("recursive $ref: inside properties or items it works, reaching itself before any value is refused naming the recursion", "[json_schema]") {
    auto ok = [](const char* text) {
        auto g = CompiledGrammar::from_json_schema(std::string_view(text));
        INFO(text << " -> " << (g.ok() ? "" : g.error().message));
        REQUIRE(g.ok());
        return *g;
    };
    CHECK(accepts(ok(R"({"type":"object","properties":{"child":{"$ref":"#"}}})"), R"({"child":{"child":{}}})"));
    CHECK(accepts(ok(R"({"$defs":{"n":{"type":"array","items":{"$ref":"#/$defs/n"}}},"$ref":"#/$defs/n"})"), "[[],[[]]]"));
    for (const char* bad : {R"({"$ref":"#"})", R"({"anyOf":[{"$ref":"#"},{"type":"string"}]})",
                            R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
                            R"({"$defs":{"a":{"allOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})",
                            R"({"$defs":{"a":{"oneOf":[{"$ref":"#/$defs/a"},{"type":"integer"}]}},"$ref":"#/$defs/a"})"}) {
        INFO(bad);
        auto g = CompiledGrammar::from_json_schema(std::string_view(bad));
        REQUIRE_FALSE(g.ok());
        CHECK_THAT(g.error().message, Catch::Contains("a $ref recursion reaches itself before any JSON value"));
        CHECK_THAT(g.error().message, !Catch::Contains("compiler bug"));
    }
}

TEST_CASE("budgets: over-wide objects and multiplying repetitions are refused naming the limit", "[json_schema]") {
    std::string p = R"({"type":"object","properties":{)";
    for (int i = 0; i < 30000; i++) p += (i ? "," : "") + std::string("\"p") + std::to_string(i) + "\":{\"type\":\"integer\"}";
    auto wide = compile_constraint(ConstraintKind::JSON_SCHEMA, p + "}}");
    REQUIRE_FALSE(wide.ok());
    CHECK_THAT(wide.error().message, Catch::Contains("/properties") && Catch::Contains("has 30000 properties; at most 1024"));
    auto nested = compile_constraint(ConstraintKind::GBNF, "root ::= ((([a-z]{0,100}){0,100}){0,100}){0,100}\n");
    REQUIRE_FALSE(nested.ok());
    CHECK_THAT(nested.error().message, Catch::Contains("grammar:") && Catch::Contains("262144 parse paths"));
    // Within the bounds: 1024 optional properties compile, and the object's first step holds them all.
    std::string fits = R"({"type":"object","properties":{)";
    for (int i = 0; i < 1024; i++) fits += (i ? "," : "") + std::string("\"p") + std::to_string(i) + "\":{\"type\":\"integer\"}";
    auto g = compile_constraint(ConstraintKind::JSON_SCHEMA, fits + "}}");
    REQUIRE(g.ok());
    CHECK(accepts(*g, R"({"p7": 1, "p1000": 2})"));
    CHECK_FALSE(accepts(*g, R"({"p1000": 2, "p7": 1})"));  // declared order
}
