// Mixtures of experts (qwen3moe; Mixtral, llama with experts): the CPU forward (tokens grouped by
// expert) against the naive reference at every position in F32, F16 and Q8_0; the gating's
// normalisation shown to matter; greedy decoding against llama.cpp's on the same files; the weight
// bytes a token reads (active experts only); what the loader refuses.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "cpu/quant_dot.h"
#include "greedy_margins.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "naive_reference.h"
#include "synth_forward.h"
#include "test_paths.h"

using namespace steward;
using steward::test::NaiveFeatures;
using steward::test::NaiveReference;
using steward_test::cpu_logits;
using steward_test::make_model;
using steward_test::max_diff;
using steward_test::random_tokens;

namespace {

// The shapes of tests/data/moe/llama_greedy.tsv (its script's `steward model synth` lines).
SynthSpec moe_spec(const std::string& arch, GgmlType dtype) {
    SynthSpec s;
    s.arch = arch;
    s.n_embd = 256;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_vocab = 1024;
    s.n_ctx = 512;
    s.seed = 11;
    s.dtype = dtype;
    s.n_expert_used = 2;
    if (arch == "qwen3moe") {
        s.n_ff = 512;
        s.n_ff_exp = 128;
        s.n_expert = 8;
    } else {
        s.n_ff = 256;
        s.n_expert = 4;
    }
    return s;
}

}  // namespace

TEST_CASE("qwen3moe and Mixtral files load as mixtures of experts, and a token reads only its experts' bytes",
          "[forward][moe]") {
    auto q = make_model(moe_spec("qwen3moe", GgmlType::Q8_0));
    const ModelParams& a = q->params();
    CHECK(a.n_expert == 8);
    CHECK(a.n_expert_used == 2);
    CHECK(a.n_ff_exp == 128);
    CHECK(a.rope_type == RopeType::NEOX);
    CHECK(q->weights().layers[0].q_norm);
    auto m = make_model(moe_spec("mixtral", GgmlType::F32));
    CHECK(m->params().arch == "llama");  // as llama.cpp's converter writes Mixtral
    CHECK(m->params().n_expert == 4);
    CHECK(m->params().n_ff_exp == 256);
    CHECK(m->params().rope_type == RopeType::NORM);
    // Counted here from the file's tensors: every tensor once, the embedding one row, and of the
    // experts' tensors 2 of 8 (or 4) experts.
    for (const Model* model : {q.get(), m.get()}) {
        int64_t want = 0;
        for (const auto& t : model->file().tensors()) {
            const bool exps = t.name.find("_exps.weight") != std::string::npos;
            if (t.name == "token_embd.weight")
                want += (int64_t)t.n_bytes / t.ne[1] + (model->weights().tied_output ? (int64_t)t.n_bytes : 0);
            else
                want += exps ? (int64_t)t.n_bytes / t.ne[2] * 2 : (int64_t)t.n_bytes;
        }
        CHECK(model->weight_bytes_per_token() == want);
    }
}

TEST_CASE("cpu forward matches the naive reference at every position for qwen3moe and Mixtral", "[forward][moe]") {
    const ExactQuantScope exact;
    const std::vector<int32_t> tokens = random_tokens(40, 31);  // 20 in one batch (experts grouped), then 20 one by one
    for (const char* arch : {"qwen3moe", "mixtral"})
        for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {
            INFO(arch << " " << ggml_type_name((uint32_t)type));
            auto model = make_model(moe_spec(arch, type));
            NaiveReference ref(*model);
            const std::vector<float> want = ref.eval(tokens, 0);
            const double d = max_diff(cpu_logits(*model, tokens, 20), want);
            INFO("max |cpu - reference| / max |reference| = " << d);
            CHECK(d < 1e-4);
        }
}

TEST_CASE("the experts' weighting left out or unnormalized moves the logits far from the forward's", "[forward][moe]") {
    const ExactQuantScope exact;
    const std::vector<int32_t> tokens = random_tokens(24, 37);
    for (const char* arch : {"qwen3moe", "mixtral"}) {
        INFO(arch);
        auto model = make_model(moe_spec(arch, GgmlType::F32));
        const std::vector<float> got = cpu_logits(*model, tokens, 12);
        auto off = [&](NaiveFeatures f) {
            NaiveReference ref(*model, false, f);
            return max_diff(got, ref.eval(tokens, 0));
        };
        CHECK(off({}) < 1e-4);
        CHECK(off({.moe_renorm = false}) > 1e-2);   // the top-2 probabilities as they are
        CHECK(off({.moe_softmax = false}) > 1e-2);  // raw router logits as weights
    }
}

TEST_CASE("qwen3moe and Mixtral files tokenize and decode greedily as llama.cpp does on the same files, up to the "
          "first near-tie",
          "[forward][moe]") {
    // tests/data/moe/llama_greedy.tsv: llama.cpp's prompt ids and 32 greedy ids (llama-server, F32 KV,
    // flash attention off) per architecture and dtype. A near-tie: llama.cpp's pick within 0.15
    // logits of our top-1. Q8_0's prompt activations differ (llama.cpp quantizes them to 8 bits in
    // prefill, Steward's GEMM keeps F32), and a near-tie may come early.
    steward_test::check_llama_greedy_rows(
        std::string(STEWARD_SOURCE_DIR) + "/tests/data/moe/llama_greedy.tsv",
        "the quick brown fox jumps over the lazy dog and the cat", 6,
        [](const std::string& name) {
            const auto [arch, type] = steward_test::arch_and_type(name);
            return make_model(moe_spec(arch, type));
        },
        0, 28);
}

TEST_CASE("a mixture of experts Steward does not read is refused by name", "[forward][moe]") {
    auto writer = synth_model(moe_spec("qwen3moe", GgmlType::F32));
    REQUIRE(writer.ok());
    {  // shared experts (qwen2moe's layout)
        GgufWriter w = *writer;
        w.add_tensor("blk.0.ffn_gate_shexp.weight", GgmlType::F32, {256, 64}, std::vector<uint8_t>(256 * 64 * 4, 0));
        auto f = GgufFile::from_bytes(w.to_bytes());
        REQUIRE(f.ok());
        auto m = Model::from_gguf(std::move(f.value()));
        REQUIRE_FALSE(m.ok());
        CHECK_THAT(m.error().message, Catch::Contains("ffn_gate_shexp"));
    }
    {  // more experts per token than experts
        GgufWriter w = *writer;
        w.set_u32("qwen3moe.expert_used_count", 9);
        auto f = GgufFile::from_bytes(w.to_bytes());
        REQUIRE(f.ok());
        auto m = Model::from_gguf(std::move(f.value()));
        REQUIRE_FALSE(m.ok());
        CHECK_THAT(m.error().message, Catch::Contains("expert_used_count"));
    }
}
