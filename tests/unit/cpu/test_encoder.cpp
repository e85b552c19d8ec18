// Encoder models (bert, nomic-bert): Steward's tokens and embeddings against llama.cpp's
// llama-embedding on the same synthetic files (tests/data/encoders), the forward against the naive
// reference at every position, and each feature of the block shown to matter (leaving it out moves
// the vector away from llama.cpp's by far more than the tolerance).
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/embed.h"
#include "cpu/encoder.h"
#include "llama_embeddings.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "encoder_reference.h"
#include "naive_encoder.h"
#include "synth_forward.h"
#include "test_paths.h"

using namespace steward;
using steward::test::naive_encode;
using steward::test::naive_pool;
using steward::test::NaiveEncoderOptions;
using steward_test::cosine;
using steward_test::make_model;
using steward_test::parse_gguf;

namespace {

// The texts of tests/data/encoders/make_llama_reference.py, in its order.
std::vector<std::string> reference_texts() {
    std::string long_text;
    for (int i = 0; i < 6; i++)
        long_text += std::string(i ? " " : "") + "once upon a day the happy friend said the answer to the question of the story";
    return {"H\xc3\xa9llo, WORLD! the unknownish cats.", "the little story of a cat", "query: what does the model cache?",
            long_text};
}

}  // namespace

TEST_CASE("bert and nomic-bert tokens and embeddings equal llama-embedding's on the same files",
          "[encoder][embed]") {
    const auto texts = reference_texts();
    double worst = 0.0;
    std::string worst_at;
    for (const steward_test::EncoderRow& r : steward_test::encoder_reference_rows()) {
        INFO(r.arch << " " << r.dtype << " text " << r.text);
        auto type = parse_ggml_type(r.dtype);
        REQUIRE(type.ok());
        auto m = make_model(steward_test::encoder_spec(r.arch, *type));
        CHECK(m->params().is_encoder());
        CHECK_FALSE(m->params().causal);
        const Tokenizer& tok = m->tokenizer();
        const std::vector<int32_t> ids = tok.encode(texts[(size_t)r.text], tok.add_bos_default(), true);
        CHECK(ids == r.ids);  // [CLS] ... [SEP], as llama.cpp's add_special
        auto pooling = embedding_pooling(m->params(), "");
        REQUIRE(pooling.ok());
        CHECK(*pooling == (r.arch == "bert" ? Pooling::CLS : Pooling::MEAN));  // the files' pooling_type
        CpuEmbedder e(*m, 2, 512);
        auto v = e.embed(std::vector<std::vector<int32_t>>{r.ids}, *pooling);
        REQUIRE(v.ok());
        const double dist = 1.0 - cosine((*v)[0], r.vec);
        INFO("cosine distance " << dist);
        CHECK(dist < 1e-4);
        if (dist > worst) worst = dist, worst_at = r.arch + " " + r.dtype + " text " + std::to_string(r.text);
    }
    WARN("largest cosine distance to llama-embedding over 24 vectors: " << worst << " (" << worst_at << ")");
}

TEST_CASE("The encoder forward equals the naive reference at every position", "[encoder][forward]") {
    const std::vector<int32_t> ids = {101, 240, 266, 263, 241, 180, 471, 274, 154, 224, 195, 102};
    for (const char* arch : {"bert", "nomic-bert"})
        for (const GgmlType t : {GgmlType::F32, GgmlType::Q8_0}) {
            INFO(arch << " " << ggml_type_name((uint32_t)t));
            auto m = make_model(steward_test::encoder_spec(arch, t));
            CpuEncoder enc(*m, 2);
            std::vector<float> h;
            REQUIRE(enc.encode(ids, h).ok());
            const std::vector<double> ref = naive_encode(*m, ids);
            const int E = m->params().n_embd;
            REQUIRE(h.size() == ref.size());
            // Outputs of a LayerNorm with gains ~1: O(1) values. Q8_0 activations are quantized to 8
            // bits in the matmuls (cpu/quant_dot.h), F32 only reordered.
            const double tol = t == GgmlType::F32 ? 2e-3 : 5e-2;
            for (size_t pos = 0; pos < ids.size(); pos++) {
                double worst = 0.0;
                for (int e = 0; e < E; e++)
                    worst = std::max(worst, std::abs((double)h[pos * E + (size_t)e] - ref[pos * E + (size_t)e]));
                INFO("position " << pos << ": largest difference " << worst);
                CHECK(worst < tol);
            }
        }
}

TEST_CASE("Each feature of the encoder block is needed to match llama.cpp", "[encoder]") {
    // The naive reference with every feature agrees with llama-embedding; each one left out (the
    // mistake an implementation could make) lands far outside the tolerance.
    for (const steward_test::EncoderRow& r : steward_test::encoder_reference_rows()) {
        if (r.dtype != "f32" || r.text != 2) continue;
        INFO(r.arch);
        auto m = make_model(steward_test::encoder_spec(r.arch, GgmlType::F32));
        const int E = m->params().n_embd, n = (int)r.ids.size();
        const bool mean = r.arch == "nomic-bert";
        auto dist = [&](NaiveEncoderOptions o, bool pool_mean) {
            return 1.0 - cosine(naive_pool(naive_encode(*m, r.ids, o), n, E, pool_mean), r.vec);
        };
        CHECK(dist({}, mean) < 1e-4);
        CHECK(dist({.bidirectional = false}, mean) > 1e-3);
        CHECK(dist({.token_types = false}, mean) > 1e-3);
        CHECK(dist({.positions = false}, mean) > 1e-3);
        CHECK(dist({.attn_out_norm = false}, mean) > 1e-3);
        CHECK(dist({}, !mean) > 1e-3);  // the other pooling
        if (!mean) CHECK(dist({.tanh_gelu = false}, mean) < 1e-4);  // tanh vs erf GELU: too close to tell here
    }
}

TEST_CASE("An encoder file missing what llama.cpp requires is refused by name", "[encoder]") {
    SynthSpec s;
    s.arch = "bert";
    s.n_embd = 64;
    s.n_layer = 1;
    s.n_head = 2;
    s.n_head_kv = 2;
    s.n_ff = 128;
    s.n_vocab = 512;
    s.n_ctx = 64;
    auto w = synth_model(s);
    REQUIRE(w.ok());
    // token_type_count 0: llama.cpp refuses ("model needs to define token type count").
    w->set_u32("tokenizer.ggml.token_type_count", 0);
    auto m = Model::from_gguf(parse_gguf(*w));
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("token_type_count"));
    // An input past the position table.
    s.n_ctx = 16;
    auto w2 = synth_model(s);
    REQUIRE(w2.ok());
    auto m2 = Model::from_gguf(parse_gguf(*w2));
    REQUIRE(m2.ok());
    CpuEncoder enc(**m2, 1);
    std::vector<float> h;
    const std::vector<int32_t> ids(17, 200);
    auto r = enc.encode(ids, h);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("17 tokens") && Catch::Contains("context of 16"));
}
