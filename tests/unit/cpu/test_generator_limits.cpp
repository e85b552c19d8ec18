// `generate`'s limits (issue 9): the KV is sized for the request, not the model's whole context; a
// sampling value the C API refuses is refused here by the same rule (check_sampling).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "cpu/generator.h"
#include "model/model.h"
#include "model/synth.h"
#include "process_temp_dir.h"

using namespace steward;

namespace {

// A tiny model claiming a context of 2^24 tokens: a whole-context KV would be 2*1*2^24*64*4 = 8 GiB.
const Model& huge_ctx_model() {
    static steward_test::ProcessTempDir d("steward-generator-limits-");
    static std::unique_ptr<Model> m = [] {
        SynthSpec s;
        s.n_embd = 64, s.n_layer = 1, s.n_head = 2, s.n_head_kv = 2, s.n_ff = 128, s.n_vocab = 512;
        s.n_ctx = 1 << 24;
        const std::string path = (d.path() / "ctx.gguf").string();
        REQUIRE(synth_write(s, path).ok());
        auto r = Model::load(path);
        REQUIRE(r.ok());
        return std::move(r.value());
    }();
    return *m;
}

}  // namespace

TEST_CASE("generate on a model with a 2^24-token context sizes the KV for the prompt and output only",
          "[generator][hostile]") {
    const Model& m = huge_ctx_model();
    REQUIRE(m.params().n_ctx_train == (1 << 24));
    Generator g(m, 1);
    SamplingParams sp;  // greedy
    int n = 0;
    auto st = g.generate({1, 5, 6}, 4, sp, [&](int32_t, float) { return ++n, true; });
    INFO((st ? "" : st.error().message));
    REQUIRE(st.ok());
    CHECK(st->n_prompt == 3);
    CHECK(st->n_generated == n);
    // A longer second request grows the KV.
    auto st2 = g.generate(std::vector<int32_t>(40, 7), 30, sp, [](int32_t, float) { return true; });
    CHECK(st2.ok());
}

TEST_CASE("negative or NaN sampling values are refused by one rule, the C API's", "[generator][sampling][hostile]") {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    struct Case {
        SamplingParams sp;
        const char* want;
    };
    auto mk = [](float t, float p, int k) {
        SamplingParams s;
        s.temperature = t, s.top_p = p, s.top_k = k;
        return s;
    };
    const std::vector<Case> bad = {
        {mk(nan, 1, 0), "temperature is nan"}, {mk(-0.5f, 1, 0), "temperature is -0.5"}, {mk(inf, 1, 0), "temperature is inf"},
        {mk(1, nan, 0), "top_p is nan"},       {mk(1, 0, 0), "top_p is 0"},              {mk(1, 1.5f, 0), "top_p is 1.5"},
        {mk(1, 1, -1), "top_k is -1"},
    };
    for (const auto& c : bad) {
        auto r = check_sampling(c.sp);
        REQUIRE_FALSE(r.ok());
        CHECK_THAT(r.error().message, Catch::Contains(c.want));
    }
    CHECK(check_sampling(mk(0, 1, 0)).ok());
    CHECK(check_sampling(mk(1.3f, 0.01f, 40)).ok());

    Generator g(huge_ctx_model(), 1);
    auto r = g.generate({1, 5}, 2, mk(nan, 1, 0), [](int32_t, float) { return true; });
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("temperature is nan"));
}
