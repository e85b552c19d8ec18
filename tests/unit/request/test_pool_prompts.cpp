// A request's prompt per pool (request/pool_prompts.h) over two real vocabularies (GPT-2's and
// Llama's SentencePiece): a render hook is asked once per pool and its text tokenized with that
// pool's tokenizer; a pool's refusal, bad grammar or throw fails that pool only; the routing
// estimate is the first usable pool's count; a prompt given as text is what it always was. The
// expected ids are each vocabulary's own encoding of texts written out here.
#include <catch2/catch.hpp>
#include <map>
#include <stdexcept>
#include "test_paths.h"

#include "request/pool_prompts.h"

using namespace steward;

namespace {

const std::string k_tok_dir = std::string(STEWARD_TESTDATA_DIR) + "/tokenizers/";

std::unique_ptr<Tokenizer> load_vocab(const std::string& name) {
    auto tok = Tokenizer::load(k_tok_dir + "ggml-vocab-" + name + ".gguf");
    INFO((tok ? std::string() : tok.error().message));
    REQUIRE(tok.ok());
    return std::move(*tok);
}

PromptTarget target(const std::string& name, const std::string& source, const Tokenizer& tok) {
    PromptTarget t;
    t.pool.name = name;
    t.pool.chat_template = "T(" + name + ")";
    t.pool.template_source = source;
    t.tokenizer = &tok;
    return t;
}

std::vector<int32_t> encode(const Tokenizer& tok, const std::string& text) {
    return tok.encode(text, tok.add_bos_default(), true);
}

}  // namespace

TEST_CASE("a render hook is asked once per pool and each pool's run reads its own rendering in its own ids", "[pool_prompts]") {
    const auto gpt2 = load_vocab("gpt-2");
    const auto spm = load_vocab("llama-spm");
    std::map<std::string, int> calls;
    GenerationRequest req;
    req.parse_special = true;
    req.render = [&](const PromptPool& p) {
        calls[p.name]++;
        PoolPrompt out;
        if (p.name == "a") out.text = "<a> hello from a template";
        if (p.name == "b") out.text = "[b] a longer rendering for the second pool, with its own words";
        if (p.name == "c") out.text = "<a> hello from a template";  // a's text, a's tokenizer: a's ids
        return out;
    };
    PoolPrompts pp(req, {target("a", "none", *gpt2), target("b", "chat_template_file b.jinja", *spm), target("c", "none", *gpt2)});
    CHECK(pp.per_pool());
    CHECK(pp.prompt_ids(1) == encode(*spm, "[b] a longer rendering for the second pool, with its own words"));
    CHECK(pp.prompt_ids(0) == encode(*gpt2, "<a> hello from a template"));
    CHECK(pp.prompt_ids(2) == pp.prompt_ids(0));
    CHECK(pp.prompt_ids(1) == encode(*spm, "[b] a longer rendering for the second pool, with its own words"));
    // Routing's estimate: the first pool's rendering.
    CHECK(pp.estimate_pool() == 0);
    CHECK(pp.n_prompt_estimate() == (int32_t)encode(*gpt2, "<a> hello from a template").size());
    CHECK(pp.template_used(1) == "pool 'b' chat_template_file b.jinja");
    CHECK(calls == std::map<std::string, int>{{"a", 1}, {"b", 1}, {"c", 1}});
    // The decoder is the pool's own vocabulary.
    auto d = pp.text_decoder(1);
    std::string text;
    for (int32_t id : encode(*spm, "its own words")) text += d->push(id);
    text += d->flush();
    CHECK(text.find("its own words") != std::string::npos);
}

TEST_CASE("a pool that refuses, whose grammar does not compile or whose hook throws fails alone", "[pool_prompts]") {
    const auto gpt2 = load_vocab("gpt-2");
    GenerationRequest req;
    req.json_object = true;  // the request's own constraint, where a rendering brings none
    req.render = [](const PromptPool& p) -> PoolPrompt {
        if (p.name == "refuses") return {"", "", "pool 'refuses' has no tool-call format"};
        if (p.name == "bad_grammar") return {"text", "root ::= (", ""};
        if (p.name == "throws") throw std::runtime_error("boom");
        if (p.name == "grammar") return {"with a grammar", "root ::= \"x\"", ""};
        return {"plain text", "", ""};
    };
    PoolPrompts pp(req, {target("refuses", "none", *gpt2), target("bad_grammar", "none", *gpt2), target("throws", "none", *gpt2),
                         target("grammar", "none", *gpt2), target("plain", "none", *gpt2)});
    CHECK(pp.prompt_ids(0).empty());
    CHECK(pp.prompt_error(0) == "pool 'refuses' has no tool-call format");
    CHECK(pp.prompt_ids(1).empty());
    CHECK_THAT(pp.prompt_error(1), Catch::StartsWith("the output grammar rendered for pool 'bad_grammar' does not compile"));
    CHECK(pp.prompt_ids(2).empty());
    CHECK(pp.prompt_error(2) == "rendering the prompt for pool 'throws' threw: boom");
    // The estimate skips the pools that cannot take the prompt.
    CHECK(pp.estimate_pool() == 3);
    CHECK(pp.n_prompt_estimate() == (int32_t)encode(*gpt2, "with a grammar").size());
    auto c = pp.constraint(3);
    REQUIRE(c);
    CHECK(c->kind == ConstraintKind::GBNF);
    CHECK(c->text == "root ::= \"x\"");
    auto own = pp.constraint(4);
    REQUIRE(own);
    CHECK(own->kind == ConstraintKind::JSON_OBJECT);
}

TEST_CASE("a prompt given as text or ids is every pool's prompt, counted in the first pool's vocabulary", "[pool_prompts]") {
    const auto gpt2 = load_vocab("gpt-2");
    const auto spm = load_vocab("llama-spm");
    GenerationRequest req;
    req.prompt = "the same text everywhere";
    PoolPrompts pp(req, {target("a", "none", *gpt2), target("b", "none", *spm)});
    CHECK_FALSE(pp.per_pool());
    CHECK(pp.template_used(0).empty());
    const auto want_a = gpt2->encode(req.prompt, gpt2->add_bos_default(), false);
    CHECK(pp.prompt_ids(0) == want_a);
    CHECK(pp.prompt_ids(1) == spm->encode(req.prompt, spm->add_bos_default(), false));
    CHECK(pp.n_prompt_estimate() == (int32_t)want_a.size());
    GenerationRequest ids;
    ids.prompt_ids = {5, 6, 7};
    PoolPrompts pi(ids, {target("a", "none", *gpt2), target("b", "none", *spm)});
    CHECK(pi.prompt_ids(1) == std::vector<int32_t>{5, 6, 7});
    CHECK(pi.n_prompt_estimate() == 3);
}
