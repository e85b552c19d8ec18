// A model's GGUF header alone (what a worker sends a front): the same params, tokenizer and weight
// figures as the whole file, no weight data; a cut inside the header is a clear error.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "pool/pool.h"

using namespace steward;

TEST_CASE("a model from its GGUF header alone matches the whole file's shape and vocabulary", "[gguf_header]") {
    SynthSpec spec;
    spec.n_embd = 64, spec.n_layer = 2, spec.n_head = 4, spec.n_head_kv = 2, spec.n_ff = 128, spec.n_vocab = 400;
    auto writer = synth_model(spec);
    REQUIRE(writer.ok());
    std::vector<uint8_t> bytes = writer->to_bytes(32);
    auto whole = Model::from_gguf(std::move(*GgufFile::from_bytes(bytes, "whole.gguf")));
    REQUIRE(whole.ok());
    const size_t n_head = (*whole)->file().header_size();
    CHECK(n_head > 0);
    CHECK(n_head < bytes.size() / 4);  // the weights are most of the file
    auto head = GgufFile::header_from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + (long)n_head));
    REQUIRE(head.ok());
    auto hm = Model::from_gguf(std::move(*head));
    REQUIRE(hm.ok());
    CHECK_FALSE((*hm)->has_weights());
    CHECK((*whole)->has_weights());
    const ModelParams& a = (*whole)->params();
    const ModelParams& b = (*hm)->params();
    CHECK(a.n_layer == b.n_layer);
    CHECK(a.n_vocab == b.n_vocab);
    CHECK(a.n_head_kv == b.n_head_kv);
    CHECK(a.head_dim == b.head_dim);
    CHECK((*hm)->n_params() == (*whole)->n_params());
    CHECK((*hm)->weight_bytes_per_token() == (*whole)->weight_bytes_per_token());
    CHECK(vocabulary_fingerprint((*hm)->tokenizer()) == vocabulary_fingerprint((*whole)->tokenizer()));
    CHECK((*hm)->tokenizer().encode("hello world", true) == (*whole)->tokenizer().encode("hello world", true));
    for (const GgufTensorInfo& t : (*hm)->file().tensors()) CHECK(t.data == nullptr);

    // Cut inside the metadata: an error naming the file, not a crash.
    auto cut = GgufFile::header_from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + (long)n_head / 2), "cut.gguf");
    REQUIRE_FALSE(cut.ok());
    CHECK_THAT(cut.error().message, Catch::Contains("cut.gguf"));

    // Another vocabulary has another fingerprint.
    spec.seed = 99;
    auto other = Model::from_gguf(std::move(*GgufFile::from_bytes(synth_model(spec)->to_bytes(32), "other.gguf")));
    REQUIRE(other.ok());
    SynthSpec spec2 = spec;
    spec2.n_vocab = 401;
    auto other2 = Model::from_gguf(std::move(*GgufFile::from_bytes(synth_model(spec2)->to_bytes(32), "other2.gguf")));
    REQUIRE(other2.ok());
    CHECK(vocabulary_fingerprint((*other2)->tokenizer()) != vocabulary_fingerprint((*whole)->tokenizer()));
}

TEST_CASE("a model whose norm holds NaN or whose embedding holds inf is refused at load, naming the tensor", "[gguf_header]") {
    SynthSpec spec;
    spec.n_embd = 64, spec.n_layer = 2, spec.n_head = 4, spec.n_head_kv = 2, spec.n_ff = 128, spec.n_vocab = 400;
    auto writer = synth_model(spec);
    REQUIRE(writer.ok());
    const std::vector<uint8_t> bytes = writer->to_bytes(32);
    REQUIRE(Model::from_gguf(std::move(*GgufFile::from_bytes(bytes, "ok.gguf"))).ok());
    // Where a tensor's first value lies in the file, and its type.
    auto locate = [&](const std::string& name) {
        auto f = GgufFile::from_bytes(bytes, "x.gguf");
        REQUIRE(f.ok());
        const GgufTensorInfo* t = (*f)->find_tensor(name);
        REQUIRE(t != nullptr);
        return std::pair{(size_t)((const uint8_t*)t->data - (*f)->bytes()), t->type};
    };
    struct Case {
        std::string tensor;
        float value;
        const char* says;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (const Case& c : {Case{"output_norm.weight", nan, "NaN"}, Case{"blk.1.ffn_norm.weight", inf, "inf"},
                          Case{"token_embd.weight", inf, "inf"}, Case{"token_embd.weight", nan, "NaN"}}) {
        INFO(c.tensor << " " << c.says);
        auto [at, type] = locate(c.tensor);
        std::vector<uint8_t> bad = bytes;
        at += 4 * sizeof(uint16_t);  // a value inside the tensor, not its first
        if (type == GgmlType::F32) {
            std::memcpy(&bad[at + 4 * sizeof(float)], &c.value, sizeof(float));
        } else if (type == GgmlType::F16) {
            const uint16_t h = std::isnan(c.value) ? 0x7E00 : 0x7C00;
            std::memcpy(&bad[at], &h, sizeof h);
        } else {
            FAIL("the synthetic embedding is " << ggml_type_name((uint32_t)type) << ": extend this test for it");
        }
        auto m = Model::from_gguf(std::move(*GgufFile::from_bytes(bad, "bad.gguf")));
        REQUIRE_FALSE(m.ok());
        CHECK_THAT(m.error().message, Catch::Contains(c.tensor) && Catch::Contains(c.says) && Catch::Contains("corrupt"));
    }
}

TEST_CASE("matrix_types lists the types of the matrices a forward multiplies by, the embedding table only when tied",
          "[gguf]") {
    for (bool with_output : {true, false}) {
        INFO((with_output ? "separate output matrix" : "output tied to the embedding table"));
        GgufWriter w;
        w.add_tensor_shape("token_embd.weight", GgmlType::Q8_0, {64, 100});
        if (with_output) w.add_tensor_shape("output.weight", GgmlType::F16, {64, 100});
        w.add_tensor_shape("blk.0.attn_q.weight", GgmlType::Q4_0, {64, 64});
        w.add_tensor_shape("blk.0.ffn_down.weight", GgmlType::Q4_0, {64, 64});
        w.add_tensor_shape("blk.0.attn_norm.weight", GgmlType::F32, {64});  // a vector: not a matmul
        auto g = GgufFile::header_from_bytes(w.header_bytes());
        REQUIRE(g);
        const std::vector<GgmlType> got = (*g)->matrix_types();
        const std::vector<GgmlType> want = with_output ? std::vector<GgmlType>{GgmlType::F16, GgmlType::Q4_0}
                                                       : std::vector<GgmlType>{GgmlType::Q4_0, GgmlType::Q8_0};
        CHECK(got == want);
    }
}
