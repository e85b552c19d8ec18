// Structured output through the Engine: on a random-weight synthetic model (whose unconstrained
// output is noise), seeded generations across JSON schemas all parse (nlohmann's parser) and
// validate against their schema with a small validator written here (an independent reading of
// JSON Schema, not the grammar compiler's); greedy output with speculation on equals it off.
// STEWARD_GRAMMAR_GENERATIONS sets the number of generations (default 1000; fewer under a slow
// sanitizer build if needed).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory_model.h"
#include "sched/engine.h"

using namespace steward;
using json = nlohmann::json;

namespace {

const Model& model() {
    static std::unique_ptr<Model> m = [] {
        SynthSpec s;
        s.n_embd = 64; s.n_layer = 2; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 1024;
        s.seed = 5;
        return steward_test::memory_model(s);
    }();
    return *m;
}

size_t utf8_length(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

bool has_type(const json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == (double)(int64_t)v.get<double>());
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    return false;
}

// "" when v is valid against schema s, else why not (with the JSON pointer).
std::string validate(const json& v, const json& s, const std::string& at = "") {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("type")) {
        bool ok = false;
        if (s["type"].is_array()) {
            for (const auto& t : s["type"]) ok = ok || has_type(v, t.get<std::string>());
        } else {
            ok = has_type(v, s["type"].get<std::string>());
        }
        if (!ok) return at + ": " + v.dump() + " is not of type " + s["type"].dump();
    }
    if (s.contains("const") && v != s["const"]) return at + ": " + v.dump() + " is not the const " + s["const"].dump();
    if (s.contains("enum")) {
        bool found = false;
        for (const auto& e : s["enum"]) found = found || e == v;
        if (!found) return at + ": " + v.dump() + " is not in the enum";
    }
    if (s.contains("anyOf")) {
        bool any = false;
        for (const auto& b : s["anyOf"]) any = any || validate(v, b, at).empty();
        if (!any) return at + ": " + v.dump() + " matches no anyOf branch";
    }
    if (s.contains("oneOf")) {
        int n = 0;
        for (const auto& b : s["oneOf"]) n += validate(v, b, at).empty();
        if (n != 1) return at + ": " + v.dump() + " matches " + std::to_string(n) + " oneOf branches";
    }
    if (v.is_string()) {
        const size_t n = utf8_length(v.get<std::string>());
        if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": string shorter than minLength";
        if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": string longer than maxLength";
    }
    if (v.is_array()) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": fewer than minItems";
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": more than maxItems";
        if (s.contains("items"))
            for (size_t i = 0; i < v.size(); i++)
                if (auto e = validate(v[i], s["items"], at + "/" + std::to_string(i)); !e.empty()) return e;
    }
    if (v.is_object()) {
        if (s.contains("required"))
            for (const auto& r : s["required"])
                if (!v.contains(r.get<std::string>())) return at + ": required property " + r.dump() + " missing";
        const json props = s.value("properties", json::object());
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (props.contains(it.key())) {
                if (auto e = validate(it.value(), props[it.key()], at + "/" + it.key()); !e.empty()) return e;
            } else if (s.contains("additionalProperties")) {
                const json& ap = s["additionalProperties"];
                if (ap.is_boolean() && !ap.get<bool>()) return at + ": additional property '" + it.key() + "'";
                if (ap.is_object())
                    if (auto e = validate(it.value(), ap, at + "/" + it.key()); !e.empty()) return e;
            }
        }
    }
    return "";
}

const std::vector<std::string>& schemas() {
    static const std::vector<std::string> s = {
        // nested objects
        R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"},
            "address":{"type":"object","properties":{"city":{"type":"string","maxLength":6},"zip":{"type":"string","minLength":2,"maxLength":5}},
            "required":["city","zip"],"additionalProperties":false}},"required":["name","age","address"],"additionalProperties":false})",
        // arrays with minItems / maxItems
        R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","maxLength":4},"minItems":1,"maxItems":3},
            "scores":{"type":"array","items":{"type":"number"},"minItems":2,"maxItems":4}},"required":["tags","scores"]})",
        // enums
        R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]},"size":{"enum":["S","M","L",1,null]},
            "ok":{"type":"boolean"}},"required":["color","size","ok"],"additionalProperties":false})",
        // anyOf
        R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":5},{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}]})",
        // numbers
        R"({"type":"array","items":{"type":"number"},"minItems":3,"maxItems":3})",
        // strings (escapes come when a backslash is drawn)
        R"({"type":"object","properties":{"q":{"type":"string","minLength":1,"maxLength":6},"path":{"type":"string","maxLength":6}},
            "required":["q","path"]})",
        // unicode names and values
        R"({"type":"object","properties":{"ä":{"type":"string","maxLength":4},"名前":{"const":"é🙂"}},"required":["ä","名前"]})",
        // optional properties
        R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":3},"c":{"type":"boolean"}},
            "required":["a"],"additionalProperties":false})",
        // an array of objects with oneOf
        R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"kind":{"oneOf":[{"const":"a"},{"const":"b"}]}},
            "required":["id","kind"],"additionalProperties":false},"maxItems":2})",
        // a type list, null
        R"({"type":"object","properties":{"v":{"type":["string","null"],"maxLength":3},"n":{"type":"null"}},"required":["v","n"]})",
    };
    return s;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng) {
    std::vector<int32_t> p;
    for (int i = 0; i < 8; i++) p.push_back(3 + (int32_t)(rng() % 509));
    return p;
}

struct Outcome {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::STOP;
    std::string error;
};

std::map<uint64_t, Outcome> run_all(std::vector<EngineRequest> reqs, const EngineOptions& opt) {
    Engine e(model(), opt);
    std::map<uint64_t, Outcome> out;
    size_t next = 0;
    double t = 0;
    while (next < reqs.size() || e.has_work()) {
        while (next < reqs.size() && e.stats().n_waiting + e.stats().n_running < 32) REQUIRE(e.submit(reqs[next++]).ok());
        for (auto& ev : e.step(t += 0.001)) {
            for (int32_t tok : ev.tokens) out[ev.id].tokens.push_back(tok);
            if (ev.finished) {
                out[ev.id].finish = ev.finish;
                out[ev.id].error = ev.error;
            }
        }
    }
    return out;
}

EngineOptions options() {
    EngineOptions o;
    o.n_blocks = 2048;
    o.block_size = 16;
    o.max_batch = 32;
    o.max_batch_tokens = 512;
    o.n_threads = 2;
    return o;
}

constexpr int k_max_tokens = 400;

}  // namespace

TEST_CASE("seeded generations on a random-weight model all parse and validate against their JSON schema", "[grammar][engine]") {
    int n_total = 1000;
    if (const char* env = std::getenv("STEWARD_GRAMMAR_GENERATIONS")) n_total = std::max(10, std::atoi(env));
    std::mt19937_64 rng(42);
    std::vector<EngineRequest> reqs;
    std::vector<size_t> schema_of;
    for (int i = 0; i < n_total; i++) {
        const size_t si = (size_t)i % schemas().size();
        auto g = CompiledGrammar::from_json_schema(std::string_view(schemas()[si]));
        REQUIRE(g.ok());
        EngineRequest r;
        r.id = (uint64_t)i + 1;
        r.prompt = random_prompt(rng);
        r.max_tokens = k_max_tokens;
        r.grammar = *g;
        if (i % 3 != 0) {  // two thirds sampled (a third of those with top-k / top-p), a third greedy
            r.sampling.temperature = i % 2 ? 1.0f : 0.7f;
            r.sampling.seed = (uint64_t)i;
            if (i % 5 == 0) r.sampling.top_k = 20;
            if (i % 7 == 0) r.sampling.top_p = 0.9f;
        }
        reqs.push_back(std::move(r));
        schema_of.push_back(si);
    }
    const auto out = run_all(reqs, options());
    REQUIRE(out.size() == reqs.size());
    int n_bad = 0;
    for (size_t i = 0; i < reqs.size(); i++) {
        const Outcome& o = out.at(reqs[i].id);
        const std::string text = model().tokenizer().decode(o.tokens);
        const json schema = json::parse(schemas()[schema_of[i]]);
        std::string why;
        if (o.finish != FinishReason::STOP) why = "finished " + std::string(finish_reason_name(o.finish)) + " " + o.error;
        json doc = json::parse(text, nullptr, false);
        if (why.empty() && doc.is_discarded()) why = "does not parse";
        if (why.empty()) why = validate(doc, schema);
        if (!why.empty() && n_bad++ < 5) UNSCOPED_INFO("generation " << i << " (schema " << schema_of[i] << "): " << why << ": " << text);
    }
    CHECK(n_bad == 0);
}

TEST_CASE("constrained greedy output with speculation (n-gram chain, self-draft chain and tree) equals it without", "[grammar][engine][spec]") {
    std::mt19937_64 rng(7);
    std::vector<EngineRequest> plain;
    for (int i = 0; i < 40; i++) {
        EngineRequest r;
        r.id = (uint64_t)i + 1;
        r.prompt = random_prompt(rng);
        r.max_tokens = k_max_tokens;
        r.grammar = CompiledGrammar::from_json_schema(std::string_view(schemas()[(size_t)i % schemas().size()])).value();
        plain.push_back(std::move(r));
    }
    const auto base = run_all(plain, options());
    // The n-gram chain is cut at the grammar's first rejection, the self-draft chain drawn from
    // masked logits, the tree unfiltered.
    for (SpecTree shape : {SpecTree::CHAIN, SpecTree::FIXED})
    for (SpecSource src : {SpecSource::NGRAM, SpecSource::SELF}) {
        if (src == SpecSource::NGRAM && shape != SpecTree::CHAIN) continue;
        std::vector<EngineRequest> spec = plain;
        for (auto& r : spec) {
            r.spec.source = src;
            r.spec.k = 4;
            if (src == SpecSource::SELF) {
                r.spec.self_layers = 1;
                r.spec.tree = shape;
                r.spec.tree_branch = 2;
                r.spec.tree_depth = 3;
            }
        }
        EngineStats st;
        std::map<uint64_t, Outcome> got;
        {
            Engine e(model(), options());
            for (auto& r : spec) REQUIRE(e.submit(r).ok());
            double t = 0;
            while (e.has_work())
                for (auto& ev : e.step(t += 0.001)) {
                    for (int32_t tok : ev.tokens) got[ev.id].tokens.push_back(tok);
                    if (ev.finished) got[ev.id].finish = ev.finish;
                }
            st = e.stats();
        }
        CHECK(st.n_draft_tokens > 0);
        for (const auto& r : plain) {
            INFO("source " << (int)src << " tree " << (int)shape << " request " << r.id);
            CHECK(got.at(r.id).tokens == base.at(r.id).tokens);
            CHECK(got.at(r.id).finish == base.at(r.id).finish);
        }
    }
}

TEST_CASE("a constrained request stops where its grammar ends, also with ignore_eos", "[grammar][engine]") {
    auto g = CompiledGrammar::from_gbnf(R"(root ::= "yes" | "no")").value();
    std::mt19937_64 rng(3);
    std::vector<EngineRequest> reqs;
    for (int i = 0; i < 8; i++) {
        EngineRequest r;
        r.id = (uint64_t)i + 1;
        r.prompt = random_prompt(rng);
        r.max_tokens = 50;
        r.grammar = g;
        r.stop_at_eos = i % 2 == 0;
        r.sampling.temperature = i < 4 ? 0.0f : 1.0f;
        r.sampling.seed = (uint64_t)i;
        reqs.push_back(r);
    }
    for (const auto& [id, o] : run_all(reqs, options())) {
        const std::string text = model().tokenizer().decode(o.tokens);
        INFO("request " << id << ": " << text);
        CHECK(o.finish == FinishReason::STOP);
        CHECK((text == "yes" || text == "no"));
    }
}

TEST_CASE("an engine's masks are counted, and an unconstrained request in the same batch is untouched", "[grammar][engine]") {
    std::mt19937_64 rng(9);
    EngineRequest free_req;
    free_req.id = 1;
    free_req.prompt = random_prompt(rng);
    free_req.max_tokens = 20;
    free_req.stop_at_eos = false;
    const auto alone = run_all({free_req}, options());
    EngineRequest constrained = free_req;
    constrained.id = 2;
    constrained.grammar = CompiledGrammar::json_object();
    Engine e(model(), options());
    REQUIRE(e.submit(free_req).ok());
    REQUIRE(e.submit(constrained).ok());
    std::map<uint64_t, std::vector<int32_t>> got;
    double t = 0;
    while (e.has_work())
        for (auto& ev : e.step(t += 0.001))
            for (int32_t tok : ev.tokens) got[ev.id].push_back(tok);
    CHECK(got[1] == alone.at(1).tokens);
    CHECK(e.stats().n_masked >= 1);
    CHECK(e.stats().mask_s > 0);
}
