// adjust_logits and top_logprobs against naive computations (a per-id loop over the output, a full
// sort of a double-precision log-softmax).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "cpu/sampling.h"

using namespace steward;

TEST_CASE("adjust_logits adds the bias and subtracts count x frequency + presence for every output id", "[sampling]") {
    std::mt19937 rng(3);
    for (int round = 0; round < 200; round++) {
        const int V = 1 + (int)(rng() % 40);
        std::vector<float> logits(V);
        for (float& v : logits) v = (float)((int)(rng() % 200) - 100) / 10.0f;
        SamplingParams p;
        p.presence_penalty = (float)((int)(rng() % 41) - 20) / 10.0f;
        p.frequency_penalty = (float)((int)(rng() % 41) - 20) / 10.0f;
        for (int i = 0, n = (int)(rng() % 4); i < n; i++) p.logit_bias.push_back({(int32_t)(rng() % (V + 3)), (float)(rng() % 7)});
        std::vector<int32_t> output;
        for (int i = 0, n = (int)(rng() % 12); i < n; i++) output.push_back((int32_t)(rng() % V));
        std::vector<float> want = logits;
        for (int id = 0; id < V; id++) {
            for (auto [b_id, b] : p.logit_bias)
                if (b_id == id) want[id] += b;
            const int c = (int)std::count(output.begin(), output.end(), id);
            if (c > 0) want[id] -= (float)c * p.frequency_penalty + p.presence_penalty;
        }
        adjust_logits(logits, p, output);
        for (int id = 0; id < V; id++) CHECK(logits[id] == Approx(want[id]).margin(1e-5));
    }
}

TEST_CASE("top_logprobs equals a full sort of the log-softmax, ties to the lower id", "[sampling]") {
    std::mt19937 rng(5);
    for (int round = 0; round < 200; round++) {
        const int V = 1 + (int)(rng() % 60);
        std::vector<float> logits(V);
        for (float& v : logits) v = (float)((int)(rng() % 20) - 10) / 2.0f;  // many ties
        if (rng() % 5 == 0) logits[rng() % V] = std::nanf("");
        const int k = (int)(rng() % 25);
        double mx = -INFINITY;
        for (float v : logits)
            if (!std::isnan(v)) mx = std::max(mx, (double)v);
        double sum = 0;
        for (float v : logits)
            if (!std::isnan(v)) sum += std::exp((double)v - mx);
        std::vector<std::pair<double, int>> ref;
        for (int i = 0; i < V; i++) ref.push_back({std::isnan(logits[i]) ? -INFINITY : (double)logits[i] - mx - std::log(sum), i});
        std::stable_sort(ref.begin(), ref.end(), [](auto& a, auto& b) { return a.first > b.first; });
        const auto got = top_logprobs(logits, k);
        REQUIRE(got.size() == (size_t)std::min(k, V));
        for (size_t i = 0; i < got.size(); i++) {
            CHECK(got[i].id == ref[i].second);
            if (std::isinf(ref[i].first)) CHECK(std::isinf(got[i].logprob));
            else CHECK(got[i].logprob == Approx(ref[i].first).margin(1e-5));
        }
    }
}

// The OpenAI contract a client checks (tests/clients/openai.test.mjs): under greedy decoding the
// chosen token's logprob and the first top_logprobs entry are the same number. The logprob of the
// sampled token and the top list come from two functions, so they must round alike to the bit, at
// every kernel level (the vectorised exp sum differs per ISA from a double loop by an ulp or so).
TEST_CASE("top_logprobs gives the sampled token's logprob to the bit, and token_logprob's for every entry", "[sampling]") {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 4.0f);
    for (int round = 0; round < 300; round++) {
        const int V = 2 + (int)(rng() % 5000);
        std::vector<float> logits(V);
        for (float& v : logits) v = nd(rng);
        if (round % 7 == 0) logits[rng() % V] = -INFINITY;
        if (round % 11 == 0) logits[rng() % V] = std::nanf("");
        SamplingParams p;
        p.temperature = 0.0f;
        Sampler greedy(p);
        const Sampled s = greedy.sample(logits);
        const auto top = top_logprobs(logits, 5);
        REQUIRE(top.size() == (size_t)std::min(5, V));
        CHECK(top[0].id == s.token);
        CHECK(top[0].logprob == s.logprob);
        for (const TokenLogprob& t : top) CHECK(t.logprob == token_logprob(logits, t.id));
    }
}
