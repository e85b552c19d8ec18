// The request fields an OpenAI server passes through, end to end on the runtime: stop strings
// (also across token boundaries), top_logprobs, logit_bias and penalties, a pinned pool, and each
// request's decision trace (its tenant only).
#include <catch2/catch.hpp>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include <steward/runtime.h>

#include "two_pool_runtime.h"

using namespace steward;
using namespace steward_test;

namespace {

GenerationRequest greedy(int n) {
    GenerationRequest q;
    q.prompt = "the quick brown fox jumps over";
    q.max_tokens = n;
    q.ignore_eos = true;
    return q;
}

}  // namespace

TEST_CASE("a stop string spanning tokens ends the output before it, in the text and in the stream", "[request_fields][stop]") {
    auto rt = start_two_pools_qa_small("fields_stop.toml");
    const GenerationResult full = rt->generate(greedy(24));
    REQUIRE(full.ok());
    REQUIRE(full.tokens.size() == 24);
    // Token boundaries of the full text: pick a stop that starts inside one token and ends in a later one.
    std::vector<size_t> ends;
    {
        size_t at = 0;
        for (size_t i = 0; i < full.tokens.size(); i++) {
            auto piece = rt->detokenize("small", {full.tokens.begin(), full.tokens.begin() + (long)i + 1});
            REQUIRE(piece);
            at = piece->size();
            ends.push_back(at);
        }
    }
    size_t start = 0, stop_len = 0;
    for (size_t i = 3; i + 2 < ends.size(); i++)
        if (ends[i + 1] - ends[i] >= 2 && ends[i + 2] > ends[i + 1]) {
            start = ends[i] + 1;  // inside token i + 1
            stop_len = ends[i + 2] - start;  // through token i + 2
            break;
        }
    REQUIRE(stop_len > 0);
    const std::string stop = full.text.substr(start, stop_len);
    const std::string want = full.text.substr(0, full.text.find(stop));
    GenerationRequest q = greedy(24);
    q.stop = {"this string never appears \x01", stop};
    std::string streamed;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    GenerationResult res;
    RequestCallbacks cb;
    cb.on_token = [&](const std::string& piece, const std::vector<int32_t>&) { streamed += piece; };
    cb.on_finish = [&](const GenerationResult& r) {
        std::lock_guard<std::mutex> lk(mu);
        res = r;
        done = true;
        cv.notify_all();
    };
    rt->submit(q, cb);
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
    INFO("full '" << full.text << "' stop '" << stop << "'");
    CHECK(res.finish == FinishReason::STOP);
    CHECK(res.text == want);
    CHECK(streamed == want);
    CHECK(res.tokens.size() < full.tokens.size());
    CHECK(res.metrics.prompt_tokens > 0);  // usage survives the cancel that ends the run
}

TEST_CASE("top_logprobs lists the greedy token first with its logprob, most likely first", "[request_fields]") {
    auto rt = start_two_pools_qa_small("fields_top.toml");
    GenerationRequest q = greedy(6);
    q.top_logprobs = 5;
    const GenerationResult r = rt->generate(q);
    REQUIRE(r.ok());
    REQUIRE(r.top_logprobs.size() == r.tokens.size());
    for (size_t i = 0; i < r.tokens.size(); i++) {
        const auto& alts = r.top_logprobs[i];
        REQUIRE(alts.size() == 5);
        CHECK(alts[0].id == r.tokens[i]);
        CHECK(alts[0].logprob == Approx(r.logprobs[i]).margin(1e-5));
        double mass = 0;
        for (size_t j = 0; j < alts.size(); j++) {
            CHECK(alts[j].logprob <= 0.0f);
            if (j) CHECK(alts[j].logprob <= alts[j - 1].logprob);
            mass += std::exp(alts[j].logprob);
        }
        CHECK(mass <= 1.0 + 1e-4);
    }
    GenerationRequest bad = greedy(2);
    bad.top_logprobs = 21;
    const GenerationResult b = rt->generate(bad);
    CHECK(b.finish == FinishReason::ERROR);
    CHECK_THAT(b.error, Catch::Contains("top_logprobs is 21"));
}

TEST_CASE("logit_bias forces a token, and a frequency penalty then moves greedy decoding off it", "[request_fields]") {
    auto rt = start_two_pools_qa_small("fields_bias.toml");
    GenerationRequest q = greedy(6);
    q.logit_bias = {{77, 100.0f}};
    const GenerationResult r = rt->generate(q);
    REQUIRE(r.ok());
    for (int32_t t : r.tokens) CHECK(t == 77);
    // Bias 3 on top of the greedy choice would repeat 77 when no penalty applies; a frequency
    // penalty of 2 per occurrence takes it back below the others after a couple of repeats.
    q.logit_bias = {{77, 100.0f}};
    q.frequency_penalty = 2.0f;
    q.presence_penalty = 2.0f;
    const GenerationResult p = rt->generate(q);
    REQUIRE(p.ok());
    CHECK(p.tokens.front() == 77);  // +100 wins the first step whatever the penalty
    GenerationRequest bad = greedy(2);
    bad.presence_penalty = 3.0f;
    CHECK_THAT(rt->generate(bad).error, Catch::Contains("presence_penalty is 3"));
    bad.presence_penalty = 0;
    bad.logit_bias = {{5, std::nanf("")}};
    CHECK_THAT(rt->generate(bad).error, Catch::Contains("logit_bias of token 5"));
}

TEST_CASE("a request naming a pool is served there without routing, and its trace says why", "[request_fields][trace]") {
    auto rt = start_two_pools_qa_small("fields_pool.toml");
    GenerationRequest q = greedy(4);
    q.pool = "large";
    q.tenant = "acme";
    const GenerationResult r = rt->generate(q);
    REQUIRE(r.ok());
    CHECK(r.pool == "large");
    CHECK(r.bucket == "qa");
    const std::string tj = rt->request_trace_json(r.id, "acme");
    REQUIRE(!tj.empty());
    const auto t = nlohmann::json::parse(tj);
    CHECK(t["state"] == "finished");
    CHECK(t["bucket"]["name"] == "qa");
    CHECK_THAT(t["bucket"]["why"].get<std::string>(), Catch::Contains("bucket 'qa'"));
    CHECK(t["route"]["pool"] == "large");
    CHECK_THAT(t["route"]["why"].get<std::string>(), Catch::Contains("named by the request"));
    REQUIRE(t["route"]["pools"].size() == 2);
    CHECK(t["route"]["pools"][0].contains("est_ttft_ms"));
    CHECK(t["admission"][0]["verdict"] == "admitted");
    CHECK(t["admission"][0]["blocks"].get<int>() >= 1);
    CHECK(t["runs"][0]["pool"] == "large");
    CHECK(t["runs"][0]["finish"] == "length");
    CHECK(t["finish"]["completion_tokens"] == 4);
    CHECK(rt->request_trace_json(r.id, "default").empty());  // another tenant sees nothing
    CHECK(rt->request_trace_json(999999, "acme").empty());
    GenerationRequest unknown = greedy(2);
    unknown.pool = "medium";
    const GenerationResult u = rt->generate(unknown);
    CHECK(u.finish == FinishReason::ERROR);
    CHECK_THAT(u.error, Catch::Contains("no pool named 'medium' (pools: large, small)"));
}

TEST_CASE("pools(), tokenize and detokenize answer with each pool's tokenizer and name bad input", "[request_fields]") {
    auto rt = start_two_pools_qa_small("fields_tok.toml");
    const auto pools = rt->pools();
    REQUIRE(pools.size() == 2);
    CHECK(pools[0].name == "large");
    CHECK(pools[0].n_ctx == 1024);
    CHECK(pools[0].n_vocab == 512);
    auto ids = rt->tokenize("small", "the quick brown fox", false);
    REQUIRE(ids);
    CHECK(!ids->empty());
    auto text = rt->detokenize("small", *ids);
    REQUIRE(text);
    CHECK(*text == "the quick brown fox");
    CHECK_THAT(rt->tokenize("nope", "x", false).error().message, Catch::Contains("no pool named 'nope'"));
    CHECK_THAT(rt->detokenize("small", {512}).error().message, Catch::Contains("token id 512 is outside"));
}
