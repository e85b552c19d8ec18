// The qwen3 architecture (per-head RMSNorm on q and k before RoPE, NeoX RoPE, no QKV biases, a
// head size apart from n_embd / n_head): the CPU forward pass against the naive reference, and the
// loader's checks on the norms.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "cpu/quant_dot.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "naive_reference.h"

using namespace steward;
using steward::test::NaiveReference;

namespace {

// As test_forward.cpp's F32 bound: float CPU pass against the double reference, 1e-4 absolute
// for logits of a few units (measured here: below 2e-5).
constexpr double kTolF32 = 1e-4;

// n_embd 64 with 4 heads of 32 (q is 128 wide, twice n_embd) and 2 KV heads: GQA and a head size
// that n_embd / n_head (16) would get wrong. All dims are multiples of 32 so Q8_0 fits.
SynthSpec qwen3_spec(GgmlType dtype, bool tied) {
    SynthSpec s;
    s.arch = "qwen3";
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 32;
    s.n_ff = 128;
    s.n_vocab = 400;
    s.n_ctx = 256;
    s.dtype = dtype;
    s.tied_output = tied;
    s.seed = 5;
    return s;
}

std::unique_ptr<GgufFile> parse(const GgufWriter& w) {
    auto file = GgufFile::from_bytes(w.to_bytes());
    INFO("GgufFile::from_bytes: " << (file.ok() ? std::string("ok") : file.error().message));
    REQUIRE(file.ok());
    return std::move(file.value());
}

std::unique_ptr<Model> make_model(const SynthSpec& spec) {
    auto writer = synth_model(spec);
    INFO("synth_model: " << (writer.ok() ? std::string("ok") : writer.error().message));
    REQUIRE(writer.ok());
    auto model = Model::from_gguf(parse(*writer));
    INFO("Model::from_gguf: " << (model.ok() ? std::string("ok") : model.error().message));
    REQUIRE(model.ok());
    return std::move(model.value());
}

// Logits at every position of a 20-token prompt through CpuForward: 15 as one prefill, then 4
// and 1, over a shuffled block table (block size 8).
std::vector<float> cpu_logits(const Model& model, const std::vector<int32_t>& tokens) {
    CpuForward fwd(model);
    KvStorage kv(KvStorage::config_for(model.params(), 4, 8, KvDtype::F32));
    const std::vector<int32_t> table = {3, 1, 0};
    std::vector<float> all;
    int n_past = 0;
    for (int n : {15, 4, 1}) {
        SeqInput in;
        in.n_past = n_past;
        in.tokens = std::span<const int32_t>(tokens).subspan((size_t)n_past, (size_t)n);
        in.block_table = std::span<const int32_t>(table).first((size_t)((n_past + n + 7) / 8));
        in.logits = LogitsMode::ALL;
        std::vector<float> logits;
        auto r = fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits);
        INFO("forward: " << (r.ok() ? std::string("ok") : r.error().message));
        REQUIRE(r.ok());
        all.insert(all.end(), logits.begin(), logits.end());
        n_past += n;
    }
    return all;
}

std::vector<int32_t> prompt(int n_vocab) {
    std::mt19937_64 rng(17);
    std::uniform_int_distribution<int32_t> dist(3, n_vocab - 1);
    std::vector<int32_t> t(20);
    for (auto& x : t) x = dist(rng);
    return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0.0;
    for (size_t i = 0; i < a.size(); i++) m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return std::isfinite(m) ? m : INFINITY;
}

// A copy of the file without one tensor.
std::unique_ptr<GgufFile> without_tensor(const GgufFile& f, const std::string& drop) {
    GgufWriter w;
    for (const auto& [key, v] : f.metadata()) {
        if (key == "general.alignment") continue;
        REQUIRE(w.set_value(key, v).ok());
    }
    for (const auto& t : f.tensors()) {
        if (t.name == drop) continue;
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                     std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
    return parse(w);
}

}  // namespace

TEST_CASE("qwen3 loads its head size, NeoX RoPE and q/k norms, and no biases", "[forward][qwen3]") {
    auto model = make_model(qwen3_spec(GgmlType::F32, false));
    const ModelParams& p = model->params();
    CHECK(p.arch == "qwen3");
    CHECK(p.head_dim == 32);
    CHECK(p.n_rot == 32);
    CHECK(p.rope_type == RopeType::NEOX);
    for (const LayerWeights& L : model->weights().layers) {
        CHECK(L.wq.n_rows == 4 * 32);
        CHECK(L.wk.n_rows == 2 * 32);
        CHECK(L.wo.n_cols == 4 * 32);
        REQUIRE(L.q_norm);
        REQUIRE(L.k_norm);
        CHECK(L.q_norm.n_cols == 32);
        CHECK(L.k_norm.n_cols == 32);
        CHECK(!L.bq);
        CHECK(!L.bk);
        CHECK(!L.bv);
    }
    // The gains are not all 1 (a pass that skipped the norm could not agree with the reference).
    const float* g = static_cast<const float*>(model->weights().layers[0].q_norm.data);
    int n_far = 0;
    for (int d = 0; d < 32; d++) n_far += std::fabs(g[d] - 1.0f) > 0.05f;
    CHECK(n_far > 16);
}

TEST_CASE("cpu forward matches the naive reference at every position for qwen3 in f32, f16 and q8_0",
          "[forward][qwen3]") {
    // The reference decodes the stored bytes itself, so the F32 bound holds for every type (see
    // test_forward.cpp); Q8_0 on the exact path, as there.
    const ExactQuantScope exact;
    for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {
        for (const bool tied : {false, true}) {
            auto model = make_model(qwen3_spec(type, tied));
            REQUIRE(model->weights().layers[0].wq.type == type);
            const std::vector<int32_t> tokens = prompt(model->params().n_vocab);
            NaiveReference ref(*model);
            const std::vector<float> want = ref.eval(tokens, 0);
            const std::vector<float> got = cpu_logits(*model, tokens);
            const double diff = max_abs_diff(got, want);
            INFO(ggml_type_name((uint32_t)type) << (tied ? " tied" : " untied") << ": max |cpu - reference| = " << diff);
            CHECK(diff < kTolF32);
        }
    }
}

TEST_CASE("the q/k norms change qwen3's logits, so the reference agreement tests them", "[forward][qwen3]") {
    // The same file with every q/k gain forced to 1 (the normalisation itself stays): if forward
    // ignored the gains, it could not match the reference on both files.
    auto writer = synth_model(qwen3_spec(GgmlType::F32, false));
    REQUIRE(writer.ok());
    auto file = parse(*writer);
    GgufWriter flat;
    for (const auto& [key, v] : file->metadata())
        if (key != "general.alignment") REQUIRE(flat.set_value(key, v).ok());
    for (const auto& t : file->tensors()) {
        std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
        if (t.name.find("_norm.weight") != std::string::npos && t.name.find("attn_") != std::string::npos &&
            t.name.find("attn_norm") == std::string::npos) {
            const float one = 1.0f;
            for (size_t i = 0; i < data.size(); i += 4) std::memcpy(data.data() + i, &one, 4);
        }
        flat.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::move(data));
    }
    auto a = Model::from_gguf(std::move(file));
    auto b = Model::from_gguf(parse(flat));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    const std::vector<int32_t> tokens = prompt(400);
    const std::vector<float> la = cpu_logits(**a, tokens), lb = cpu_logits(**b, tokens);
    CHECK(max_abs_diff(la, lb) > 100 * kTolF32);
    NaiveReference ref_b(**b);
    CHECK(max_abs_diff(lb, ref_b.eval(tokens, 0)) < kTolF32);
}

TEST_CASE("a qwen3 file without a q or k norm is refused naming the tensor", "[forward][qwen3]") {
    auto writer = synth_model(qwen3_spec(GgmlType::F32, false));
    REQUIRE(writer.ok());
    for (const std::string name : {"blk.1.attn_k_norm.weight", "blk.0.attn_q_norm.weight"}) {
        auto m = Model::from_gguf(without_tensor(*parse(*writer), name));
        REQUIRE(!m.ok());
        INFO(m.error().message);
        CHECK(m.error().message.find("'" + name + "' is missing") != std::string::npos);
    }
}

TEST_CASE("a q/k norm whose length is not the head size is refused naming the tensor", "[forward][qwen3]") {
    // head_dim comes from key_length (32); a norm written for n_embd / n_head (16) must not load.
    SynthSpec s = qwen3_spec(GgmlType::F32, false);
    auto writer = synth_model(s);
    REQUIRE(writer.ok());
    auto file = parse(*writer);
    GgufWriter w;
    for (const auto& [key, v] : file->metadata())
        if (key != "general.alignment") REQUIRE(w.set_value(key, v).ok());
    for (const auto& t : file->tensors()) {
        std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
        std::vector<int64_t> dims(t.ne, t.ne + t.n_dims);
        if (t.name == "blk.0.attn_q_norm.weight") {
            data.resize(16 * 4);
            dims = {16};
        }
        w.add_tensor(t.name, t.type, dims, std::move(data));
    }
    auto m = Model::from_gguf(parse(w));
    REQUIRE(!m.ok());
    INFO(m.error().message);
    CHECK(m.error().message.find("'blk.0.attn_q_norm.weight' has shape [16") != std::string::npos);
}
