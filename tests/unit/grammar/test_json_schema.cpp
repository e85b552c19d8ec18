// The JSON Schema and json_object front ends: seeded random walks over real vocabularies (random
// allowed tokens until the grammar accepts) must give documents that nlohmann parses and that an
// independent validator written here accepts; invalid schemas name their JSON pointer.
#include <catch2/catch.hpp>
#include <climits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>

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
    if (v.is_string()) {
        const std::string str = v.get<std::string>();
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
    CHECK_THAT(err(R"({"properties":{"x":{"type":"integer","minimum":3}}})"),
               Catch::Contains("/properties/x/minimum") && Catch::Contains("remove it"));
    CHECK_THAT(err(R"({"properties":{"x":{}},"required":["y"]})"),
               Catch::Contains("schema /required") && Catch::Contains("\"y\", which is not in properties"));
    CHECK_THAT(err(R"({"type":"array","items":{"enum":[]}})"), Catch::Contains("/items/enum"));
    CHECK_THAT(err(R"({"type":"array","minItems":3,"maxItems":1})"), Catch::Contains("/maxItems"));
    CHECK_THAT(err(R"({"anyOf":[{"type":"string"},{"$ref":"#/$defs/missing"}]})"),
               Catch::Contains("/anyOf/1/$ref") && Catch::Contains("points at nothing"));
    CHECK_THAT(err(R"({"type":"object","properties":{"a/b":false}})"), Catch::Contains("/properties/a~1b"));
    CHECK_THAT(err(R"({"type": )"), Catch::Contains("not valid JSON"));
    std::string deep;
    for (int i = 0; i < 5000; ++i) deep += R"({"type":"array","items":)";
    deep += "{}" + std::string(5000, '}');
    CHECK_THAT(err(deep.c_str()), Catch::Contains("nest deeper than 64"));
}
