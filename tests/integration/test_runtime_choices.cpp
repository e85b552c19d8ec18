// OpenAI's n in the runtime (Runtime::submit_choices): choice i samples as a lone request with seed
// + i would; the choices after the first start once its prompt is cached and reuse it; a choice is
// cancelled alone, also before it started; a choice 0 that fails first is every choice's answer.
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>

#include <steward/runtime.h>

#include "two_pool_runtime.h"

using namespace steward;
using namespace steward_test;

namespace {

// Waits for n choices' results, by choice index.
struct Choices {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<GenerationResult> results;
    std::vector<int> finishes;
    int n_done = 0;
    explicit Choices(int n) : results((size_t)n), finishes((size_t)n, 0) {}
    std::function<RequestCallbacks(int)> callbacks() {
        return [this](int i) {
            RequestCallbacks cb;
            cb.on_finish = [this, i](const GenerationResult& r) {
                std::lock_guard<std::mutex> lk(mu);
                results[(size_t)i] = r;
                finishes[(size_t)i]++;
                n_done++;
                cv.notify_all();
            };
            return cb;
        };
    }
    void wait() {
        std::unique_lock<std::mutex> lk(mu);
        REQUIRE(cv.wait_for(lk, std::chrono::seconds(120), [&] { return n_done == (int)results.size(); }));
    }
};

GenerationRequest sampled(int max_tokens) {
    GenerationRequest q;
    // About five blocks of 16 tokens: the choices after the first find its full blocks cached.
    q.prompt = "once upon a time there was a little robot who lived in a quiet town by the sea and every morning "
               "it walked to the harbour to count the boats that came in with the tide and the fish they carried";
    q.max_tokens = max_tokens;
    q.ignore_eos = true;
    q.temperature = 1.0f;
    q.seed = 41;
    return q;
}

}  // namespace

TEST_CASE("n choices: choice i is the lone request with seed + i, and the choices after the first reuse its cached prompt",
          "[runtime][choices]") {
    auto rt = start_two_pools_qa_small("choices_seed.toml");
    Choices c(3);
    const auto handles = rt->submit_choices(sampled(12), 3, c.callbacks());
    REQUIRE(handles.size() == 3);
    CHECK(handles[1] == handles[0] + 1);
    CHECK(handles[2] == handles[0] + 2);
    c.wait();
    for (int i = 0; i < 3; i++) {
        INFO("choice " << i);
        CHECK(c.finishes[(size_t)i] == 1);
        REQUIRE(c.results[(size_t)i].ok());
        CHECK(c.results[(size_t)i].id == handles[(size_t)i]);
        CHECK(c.results[(size_t)i].tokens.size() == 12);
    }
    // The first ran on a cold cache; the others started after its first token and hit its prompt.
    CHECK(c.results[0].metrics.cached_tokens == 0);
    CHECK(c.results[1].metrics.cached_tokens >= 16);
    CHECK(c.results[2].metrics.cached_tokens >= 16);
    // The reference: lone requests, one at a time, with seeds 41, 42, 43 (they hit the cached prompt
    // as choices 1 and 2 did; a prompt's logits do not depend on where its KV came from).
    for (int i = 0; i < 3; i++) {
        GenerationRequest q = sampled(12);
        q.seed = 41 + (uint64_t)i;
        const GenerationResult lone = rt->generate(q);
        REQUIRE(lone.ok());
        INFO("choice " << i);
        CHECK(lone.tokens == c.results[(size_t)i].tokens);
    }
    // Three seeds at temperature 1 over 12 tokens: the choices are not one output three times.
    CHECK((c.results[0].tokens != c.results[1].tokens || c.results[1].tokens != c.results[2].tokens));
}

TEST_CASE("n choices: one choice is cancelled alone, also before it started", "[runtime][choices]") {
    auto rt = start_two_pools_qa_small("choices_cancel.toml");
    Choices c(3);
    const auto handles = rt->submit_choices(sampled(400), 3, c.callbacks());
    CHECK(rt->cancel(handles[2]));  // most likely still waiting for choice 0's first token
    c.wait();
    CHECK(c.results[0].ok());
    CHECK(c.results[1].ok());
    CHECK(c.results[0].tokens.size() == 400);
    CHECK(c.results[2].finish == FinishReason::CANCELLED);
    CHECK(c.finishes == std::vector<int>{1, 1, 1});
    CHECK_FALSE(rt->cancel(handles[2]));  // finished: unknown now
}

TEST_CASE("n choices: a choice 0 that fails before its first token is every choice's answer", "[runtime][choices]") {
    auto rt = start_two_pools_qa_small("choices_fail.toml");
    Choices c(4);
    GenerationRequest q = sampled(8);
    q.prompt_ids.assign(100000, 5);  // far past the pool's context
    rt->submit_choices(q, 4, c.callbacks());
    c.wait();
    for (int i = 0; i < 4; i++) {
        INFO("choice " << i);
        CHECK(c.results[(size_t)i].finish == FinishReason::ERROR);
        CHECK(c.results[(size_t)i].error == c.results[0].error);
        CHECK(c.finishes[(size_t)i] == 1);
    }
    CHECK_THAT(c.results[0].error, Catch::Contains("context"));
}
