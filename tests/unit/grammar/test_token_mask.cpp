// Token masks over real vocabularies against a brute-force reference (every token's bytes tried
// on a fresh copy of the matcher), the mask cache, rollback of masks, EOG handling and the
// "no token allowed" report.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include "test_paths.h"

#include "grammar/grammar.h"
#include "model/tokenizer.h"

using namespace steward;

namespace {

const std::string k_tok_dir = std::string(STEWARD_TESTDATA_DIR) + "/tokenizers/ggml-vocab-";

std::string vocab_path(const std::string& name) {
    std::string path = k_tok_dir;  // appended, not added: GCC 12 warns falsely (-Wrestrict) on a + b + c
    path += name;
    path += ".gguf";
    return path;
}

std::shared_ptr<const TokenVocabulary> load_vocab(const std::string& name) {
    auto tok = Tokenizer::load(vocab_path(name));
    if (!tok) FAIL(tok.error().message);
    return TokenVocabulary::from_tokenizer(**tok);
}

// The reference: a token is allowed iff its bytes are accepted by a copy of the matcher; an
// end-of-generation token iff the matcher is accepting.
std::vector<uint64_t> brute_force_mask(const GrammarMatcher& m, const TokenVocabulary& v) {
    std::vector<uint64_t> mask(((size_t)v.n_vocab() + 63) / 64, 0);
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
        bool ok;
        if (v.is_eog(id)) {
            ok = m.is_accepting();
        } else {
            GrammarMatcher copy = m.fork();
            ok = !v.bytes(id).empty() && copy.accept_bytes(v.bytes(id));
        }
        if (ok) mask[(size_t)id / 64] |= uint64_t(1) << (id % 64);
    }
    return mask;
}

std::vector<int32_t> allowed_ids(const std::vector<uint64_t>& mask, int32_t n_vocab) {
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < n_vocab; ++id)
        if (mask[(size_t)id / 64] >> (id % 64) & 1) ids.push_back(id);
    return ids;
}

std::shared_ptr<const CompiledGrammar> schema_grammar() {
    auto g = CompiledGrammar::from_json_schema(std::string_view(R"({
      "type": "object",
      "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["x", "y\u00e9", "\u65e5\u672c"]}, "maxItems": 3},
        "n": {"type": "number"},
        "ok": {"type": "boolean"}
      },
      "required": ["name", "n"],
      "additionalProperties": false
    })"));
    if (!g) FAIL(g.error().message);
    return *g;
}

}  // namespace

TEST_CASE("the vocabulary's bytes undo byte fallback and GPT-2's byte-level alphabet") {
    auto spm = load_vocab("llama-spm");
    auto tok = Tokenizer::load(vocab_path("llama-spm"));
    REQUIRE(tok.ok());
    const int32_t byte_e6 = (*tok)->encode("\xE6", false).back();  // an ill-formed byte: a byte token
    CHECK(spm->bytes(byte_e6) == "\xE6");
    auto gpt2 = load_vocab("gpt-2");
    auto t2 = Tokenizer::load(vocab_path("gpt-2"));
    REQUIRE(t2.ok());
    const auto ids = (*t2)->encode(" hello\n", false);
    std::string joined;
    for (int32_t id : ids) joined += gpt2->bytes(id);
    CHECK(joined == " hello\n");
}

TEST_CASE("token masks equal the brute-force reference on random reachable states of real vocabularies") {
    const auto g = schema_grammar();
    for (const char* name : {"llama-spm", "gpt-2", "qwen2"}) {
        INFO(name);
        const auto vocab = load_vocab(name);
        TokenMasker masker(g, vocab);
        std::mt19937 rng(11);
        int n_checked = 0;
        for (int walk = 0; walk < 2; ++walk) {
            GrammarMatcher m(g);
            for (int step = 0; step < 14; ++step) {
                std::vector<uint64_t> mask(masker.n_words());
                const MaskResult r = masker.fill_mask(m, mask);
                const auto ref = brute_force_mask(m, *vocab);
                REQUIRE(mask == ref);
                ++n_checked;
                const auto ids = allowed_ids(mask, vocab->n_vocab());
                CHECK(r.n_allowed == (int32_t)ids.size());
                REQUIRE_FALSE(ids.empty());
                const int32_t pick = ids[rng() % ids.size()];
                if (vocab->is_eog(pick)) break;
                REQUIRE(masker.accept_token(m, pick));
            }
        }
        CHECK(n_checked >= 20);
    }
}

TEST_CASE("tokens that end inside a UTF-8 character get masks equal to the reference") {
    // llama-spm's byte tokens <0xE6> <0x97> ... let a character arrive one byte per token.
    const auto vocab = load_vocab("llama-spm");
    auto g = CompiledGrammar::from_gbnf("root ::= \"\\\"\" [\xE6\x97\xA5-\xE6\x9C\xAC]{1,3} \"\\\"\"\n");
    REQUIRE(g.ok());
    TokenMasker masker(*g, vocab);
    GrammarMatcher m(*g);
    REQUIRE(m.accept_bytes("\""));
    REQUIRE(m.accept_bytes("\xE6"));
    std::vector<uint64_t> mask(masker.n_words());
    masker.fill_mask(m, mask);
    CHECK(mask == brute_force_mask(m, *vocab));
    CHECK_FALSE(allowed_ids(mask, vocab->n_vocab()).empty());
}

TEST_CASE("a cached mask for a state seen again equals the freshly computed one") {
    const auto g = schema_grammar();
    const auto vocab = load_vocab("gpt-2");
    TokenMasker masker(g, vocab);
    GrammarMatcher m(g);
    REQUIRE(m.accept_bytes("{\"name\": \"ab"));
    std::vector<uint64_t> first(masker.n_words()), second(masker.n_words());
    CHECK_FALSE(masker.fill_mask(m, first).cache_hit);
    REQUIRE(m.accept_bytes("c"));  // inside the string again: a different position (maxLength)
    masker.fill_mask(m, second);
    m.rollback(1);
    const MaskResult again = masker.fill_mask(m, second);
    CHECK(again.cache_hit);
    CHECK(first == second);
    CHECK(masker.n_cached() >= 2);
}

TEST_CASE("rollback(n) restores the exact mask of n tokens earlier") {
    const auto g = schema_grammar();
    const auto vocab = load_vocab("llama-spm");
    TokenMasker masker(g, vocab, 1);  // a one-entry cache: every mask is walked again
    std::mt19937 rng(5);
    GrammarMatcher m(g);
    std::vector<std::vector<uint64_t>> masks;
    for (int step = 0; step < 12; ++step) {
        std::vector<uint64_t> mask(masker.n_words());
        masker.fill_mask(m, mask);
        masks.push_back(mask);
        auto ids = allowed_ids(mask, vocab->n_vocab());
        ids.erase(std::remove_if(ids.begin(), ids.end(), [&](int32_t id) { return vocab->is_eog(id); }), ids.end());
        REQUIRE_FALSE(ids.empty());
        REQUIRE(masker.accept_token(m, ids[rng() % ids.size()]));
    }
    for (size_t n : {1u, 4u, 7u}) {
        m.rollback(n);
        std::vector<uint64_t> mask(masker.n_words());
        masker.fill_mask(m, mask);
        CHECK(mask == masks[masks.size() - n]);
        masks.resize(masks.size() - n);
    }
}

TEST_CASE("end-of-generation tokens are allowed exactly when the grammar is accepting") {
    const std::vector<std::string> bytes = {"a", "b", "", "ab"};
    auto vocab = std::make_shared<const TokenVocabulary>(bytes, std::vector<int32_t>{2});
    auto g = CompiledGrammar::from_gbnf("root ::= \"a\" \"b\"?\n");
    REQUIRE(g.ok());
    TokenMasker masker(*g, vocab);
    GrammarMatcher m(*g);
    std::vector<uint64_t> mask(1);
    MaskResult r = masker.fill_mask(m, mask);
    CHECK(mask[0] == 0b1001);  // "a", "ab"
    CHECK_FALSE(r.eog_allowed);
    CHECK_FALSE(masker.accept_token(m, 2));
    REQUIRE(masker.accept_token(m, 0));
    r = masker.fill_mask(m, mask);
    CHECK(mask[0] == 0b0110);  // "b", EOG
    CHECK(r.eog_allowed);
    CHECK(masker.accept_token(m, 2));
    CHECK(m.n_history() == 2);  // EOG is a step too: rollback(n) undoes n tokens
    m.rollback(1);
    CHECK(m.is_accepting());
    m.rollback(1);
    CHECK(masker.fill_mask(m, mask).n_allowed == 2);
}

TEST_CASE("a fork has the same state and masks but no history, and leaves the original alone") {
    const auto g = schema_grammar();
    const auto vocab = load_vocab("gpt-2");
    TokenMasker masker(g, vocab);
    GrammarMatcher m(g);
    REQUIRE(m.accept_bytes("{\"name\": \"x"));
    GrammarMatcher f = m.fork();
    CHECK(f.state() == m.state());
    CHECK(f.n_history() == 0);
    std::vector<uint64_t> a(masker.n_words()), b(masker.n_words());
    masker.fill_mask(m, a);
    masker.fill_mask(f, b);
    CHECK(a == b);
    REQUIRE(f.accept_bytes("\""));
    CHECK_FALSE(f.state() == m.state());
    CHECK(m.n_history() == 1);
}

TEST_CASE("a state that no token of the vocabulary can continue is reported as dead") {
    // The grammar needs a snowman; this vocabulary has no token (and no byte) that starts one.
    const std::vector<std::string> bytes = {"a", "b", "\xE2\x98", ""};
    auto vocab = std::make_shared<const TokenVocabulary>(bytes, std::vector<int32_t>{3});
    auto g = CompiledGrammar::from_gbnf("root ::= \"a\" \"\xE2\x98\x83\"\n");
    REQUIRE(g.ok());
    TokenMasker masker(*g, vocab);
    GrammarMatcher m(*g);
    REQUIRE(masker.accept_token(m, 0));
    std::vector<uint64_t> mask(1);
    MaskResult r = masker.fill_mask(m, mask);
    CHECK(mask[0] == 0b100);  // the first two bytes of the snowman
    CHECK_FALSE(r.dead());
    REQUIRE(masker.accept_token(m, 2));
    r = masker.fill_mask(m, mask);
    CHECK(r.dead());
    CHECK(r.n_allowed == 0);
    CHECK(mask[0] == 0);
}
