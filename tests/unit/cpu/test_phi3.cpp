// The phi3 architecture (the llama block with NeoX RoPE and fused attn_qkv / gate+up tensors): the
// fused tensors bound as the separate matrices a llama file of the same weights holds, the CPU
// forward against the naive reference, greedy decoding against llama.cpp's on the same files (with
// LongRoPE's long and short factors too), and malformed files refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
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
using steward::test::NaiveReference;
using steward_test::make_model;
using steward_test::parse_gguf;

namespace {

// The shape of tests/data/phi3/llama_greedy.tsv (its script writes these files with `steward model
// synth --arch phi3 ... --seed 31`).
SynthSpec phi3_spec(const std::string& arch, GgmlType dtype) {
    SynthSpec s;
    s.arch = arch;
    s.n_embd = 256;
    s.n_layer = 2;
    s.n_head = 8;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_vocab = 1024;
    s.n_ctx = 512;
    s.dtype = dtype;
    s.seed = 31;
    return s;
}


bool same_bytes(const WeightView& a, const WeightView& b) {
    return a.type == b.type && a.n_cols == b.n_cols && a.n_rows == b.n_rows &&
           std::memcmp(a.data, b.data, (size_t)(a.row_bytes() * a.n_rows)) == 0;
}

}  // namespace

TEST_CASE("phi3's fused attn_qkv and ffn_up are bound as the q, k, v, gate and up matrices of a llama file of the "
          "same weights",
          "[forward][phi3]") {
    for (const GgmlType type : {GgmlType::F32, GgmlType::Q8_0}) {
        INFO(ggml_type_name((uint32_t)type));
        auto phi = make_model(phi3_spec("phi3", type));
        auto llama = make_model(phi3_spec("llama", type));
        CHECK(phi->params().rope_type == RopeType::NEOX);
        CHECK(llama->params().rope_type == RopeType::NORM);
        for (size_t l = 0; l < 2; l++) {
            const LayerWeights& a = phi->weights().layers[l];
            const LayerWeights& b = llama->weights().layers[l];
            CHECK(same_bytes(a.wq, b.wq));
            CHECK(same_bytes(a.wk, b.wk));
            CHECK(same_bytes(a.wv, b.wv));
            CHECK(same_bytes(a.w_gate, b.w_gate));
            CHECK(same_bytes(a.w_up, b.w_up));
            CHECK(same_bytes(a.w_down, b.w_down));
            CHECK(!same_bytes(a.wq, b.wk));
        }
        CHECK(phi->weight_bytes_per_token() == llama->weight_bytes_per_token());
    }
}

TEST_CASE("cpu forward matches the naive reference at every position for phi3 in f32, f16 and q8_0", "[forward][phi3]") {
    const ExactQuantScope exact;
    std::mt19937_64 rng(17);
    std::uniform_int_distribution<int32_t> dist(3, 1023);
    std::vector<int32_t> tokens(20);
    for (auto& t : tokens) t = dist(rng);
    for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {
        auto model = make_model(phi3_spec("phi3", type));
        NaiveReference ref(*model);
        const std::vector<float> want = ref.eval(tokens, 0);
        CpuForward fwd(*model);
        KvStorage kv(KvStorage::config_for(model->params(), 4, 8, KvDtype::F32));
        const std::vector<int32_t> table = {3, 1, 0};
        SeqInput in;
        in.tokens = tokens;
        in.block_table = table;
        in.logits = LogitsMode::ALL;
        std::vector<float> got;
        REQUIRE(fwd.forward(kv, std::span<const SeqInput>(&in, 1), got).ok());
        REQUIRE(got.size() == want.size());
        double diff = 0;
        for (size_t i = 0; i < got.size(); i++) diff = std::max(diff, (double)std::fabs(got[i] - want[i]));
        INFO(ggml_type_name((uint32_t)type) << ": max |cpu - reference| = " << diff);
        CHECK(diff < 1e-4);
    }
}

TEST_CASE("phi3 files tokenize and decode greedily as llama.cpp does on the same files, up to the first near-tie",
          "[forward][phi3]") {
    // tests/data/phi3/llama_greedy.tsv: llama.cpp's prompt ids and 32 greedy ids (llama-server, F32
    // KV, flash attention off) per dtype. A near-tie: llama.cpp's pick within 0.15 logits of our
    // top-1 (as for llama-quantize's files, test_quant_models.cpp); measured: all 32 equal for each.
    const auto rows = steward_test::read_llama_greedy_tsv(std::string(STEWARD_SOURCE_DIR) + "/tests/data/phi3/llama_greedy.tsv");
    for (const steward_test::LlamaGreedyRow& row : rows) {
        REQUIRE(row.ids.size() == 32);
        INFO("file " << row.name);
        const GgmlType type = row.name == "f16" ? GgmlType::F16 : row.name == "q8_0" ? GgmlType::Q8_0 : GgmlType::F32;
        SynthSpec spec = phi3_spec("phi3", type);
        if (row.name.rfind("longrope", 0) == 0) {  // LongRoPE over a 2048 context, served at 512 as llama-server -c 512
            spec.n_ctx = 2048;
            spec.longrope_orig_ctx = std::stoi(row.name.substr(8));
        }
        auto model = make_model(spec);
        model->limit_context(512);
        if (spec.longrope_orig_ctx > 0)  // 512 > 256: the long factors (rising to 8); 512 <= 1024: the short ones
            CHECK(model->params().rope_freq_factors.back() == (spec.longrope_orig_ctx < 512 ? 8.0f : 1.5f));
        CHECK(model->tokenizer().encode("the quick brown fox jumps over the lazy dog", true) == row.prompt);
        steward_test::check_greedy_up_to_near_tie(*model, row, 0.15f, 8);
    }
    CHECK(rows.size() == 5);
}

TEST_CASE("a phi3 file with half of LongRoPE's factors or bad ones, or without its fused attn_qkv, is refused naming "
          "the tensor",
          "[forward][phi3]") {
    auto writer = synth_model(phi3_spec("phi3", GgmlType::F32));
    REQUIRE(writer.ok());
    GgufWriter longrope = *writer;
    std::vector<float> ones(16, 1.0f);
    std::vector<uint8_t> bytes(16 * 4);
    std::memcpy(bytes.data(), ones.data(), bytes.size());
    longrope.add_tensor("rope_factors_long.weight", GgmlType::F32, {16}, bytes);
    auto m = Model::from_gguf(parse_gguf(longrope));
    REQUIRE(!m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("rope_factors_short.weight") && Catch::Contains("LongRoPE"));
    longrope.add_tensor("rope_factors_short.weight", GgmlType::F32, {16}, std::vector<uint8_t>(16 * 4, 0));
    m = Model::from_gguf(parse_gguf(longrope));
    REQUIRE(!m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("rope_factors_short.weight") && Catch::Contains("positive"));
    auto file = parse_gguf(*writer);
    GgufWriter no_qkv;
    for (const auto& [key, v] : file->metadata())
        if (key != "general.alignment") REQUIRE(no_qkv.set_value(key, v).ok());
    for (const auto& t : file->tensors())
        if (t.name != "blk.1.attn_qkv.weight")
            no_qkv.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                              std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    auto n = Model::from_gguf(parse_gguf(no_qkv));
    REQUIRE(!n.ok());
    CHECK_THAT(n.error().message, Catch::Contains("blk.1.attn_qkv.weight"));
}
