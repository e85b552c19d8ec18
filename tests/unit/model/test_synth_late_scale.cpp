// Tests of the synth fixture for speculative decoding (SynthSpec::late_scale): a draft cut from a
// target's first layers agrees with it more the smaller the target's late residual branches are.
// The measured table (docs/models.md, synthetic models) comes from the hidden "[.measure]" case:
//   ./build/steward_unit_tests "[.measure]"
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "cpu/sampling.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "process_temp_dir.h"

using namespace steward;

namespace {

constexpr int kContextLen = 8;

// The argmax after each context (every context its own sequence, in batches of 64).
std::vector<int32_t> next_argmax(const Model& m, const std::vector<std::vector<int32_t>>& contexts) {
    CpuForward fwd(m, 1, 64 * kContextLen);
    const int block_size = 16, n_batch = 64;
    KvStorage kv(KvStorage::config_for(m.params(), n_batch, block_size, KvDtype::F32));
    std::vector<int32_t> out;
    std::vector<int32_t> tables((size_t)n_batch);
    for (int b = 0; b < n_batch; ++b) tables[(size_t)b] = b;
    for (size_t start = 0; start < contexts.size(); start += n_batch) {
        std::vector<SeqInput> batch;
        for (size_t i = start; i < std::min(contexts.size(), start + n_batch); ++i) {
            SeqInput s;
            s.tokens = contexts[i];
            s.block_table = std::span<const int32_t>(&tables[i - start], 1);
            s.logits = LogitsMode::LAST;
            batch.push_back(s);
        }
        std::vector<float> logits;
        auto r = fwd.forward(kv, batch, logits);
        REQUIRE(r.ok());
        const size_t V = (size_t)m.params().n_vocab;
        for (size_t i = 0; i < batch.size(); ++i) out.push_back(argmax(std::span<const float>(logits).subspan(i * V, V)));
    }
    return out;
}

std::vector<std::vector<int32_t>> random_contexts(int n, int n_vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int32_t>> out((size_t)n);
    for (auto& c : out)
        for (int i = 0; i < kContextLen; ++i) c.push_back(3 + (int32_t)(rng() % (uint64_t)(n_vocab - 3)));
    return out;
}

// Greedy first-token agreement of a keep_layers draft with the default-shape target whose layers
// >= keep_layers are scaled by `scale`.
double agreement(float scale, int keep_layers, const std::vector<std::vector<int32_t>>& contexts) {
    static steward_test::ProcessTempDir dir("steward_synth_late_");
    SynthSpec spec;  // the default shape: llama, dim 256, 4 layers, vocab 4096, untied
    spec.late_scale = scale;
    spec.late_from = keep_layers;
    const std::string target = (dir.path() / "target.gguf").string(), draft = (dir.path() / "draft.gguf").string();
    REQUIRE(synth_write(spec, target).ok());
    REQUIRE(synth_draft(target, keep_layers, draft).ok());
    auto t = Model::load(target);
    auto d = Model::load(draft);
    REQUIRE(t.ok());
    REQUIRE(d.ok());
    const auto a = next_argmax(**t, contexts), b = next_argmax(**d, contexts);
    size_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
    return (double)same / (double)a.size();
}

}  // namespace

TEST_CASE("a late-scaled synthetic target agrees with its first-layers draft more as the scale falls",
          "[model][synth]") {
    const auto contexts = random_contexts(192, 4096, 5);
    // The same contexts for every scale (common random numbers), so noise cannot invert the order
    // of scales this far apart.
    const double a0 = agreement(0.0f, 2, contexts), a_low = agreement(0.3f, 2, contexts),
                 a_mid = agreement(0.8f, 2, contexts), a1 = agreement(1.0f, 2, contexts);
    INFO("agreement at 0: " << a0 << ", 0.3: " << a_low << ", 0.8: " << a_mid << ", 1: " << a1);
    CHECK(a0 == 1.0);  // the late layers add nothing: the draft is the target
    CHECK(a_low >= a_mid);
    CHECK(a_mid >= a1);
    CHECK(a_low > a1 + 0.2);
}

TEST_CASE("late_scale is validated and leaves the early layers untouched", "[model][synth]") {
    SynthSpec bad;
    bad.late_from = 9;
    CHECK_FALSE(synth_validate(bad).ok());
    bad.late_from = 2;
    bad.late_scale = -1.0f;
    CHECK_FALSE(synth_validate(bad).ok());

    SynthSpec small;  // a small shape: only the tensors matter here
    small.n_embd = 64;
    small.n_ff = 128;
    small.n_head = 2;
    small.n_head_kv = 2;
    small.n_vocab = 512;
    SynthSpec late = small;
    late.late_scale = 0.25f;
    late.late_from = 2;
    auto a = GgufFile::from_bytes(synth_model(small)->to_bytes());
    auto b = GgufFile::from_bytes(synth_model(late)->to_bytes());
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    auto floats = [](const GgufFile& f, const std::string& name) {
        const GgufTensorInfo* t = f.find_tensor(name);
        REQUIRE(t);
        const auto* p = reinterpret_cast<const float*>(t->data);
        return std::vector<float>(p, p + t->n_elements());
    };
    for (const auto& t : (*a)->tensors()) {
        const bool scaled = t.name.rfind("blk.2.", 0) == 0 || t.name.rfind("blk.3.", 0) == 0;
        const bool branch_out = t.name.find("attn_output") != std::string::npos || t.name.find("ffn_down") != std::string::npos;
        const auto x = floats(**a, t.name), y = floats(**b, t.name);
        INFO(t.name);
        if (scaled && branch_out) {
            for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == Approx(0.25f * x[i]).margin(1e-7));
        } else {
            CHECK(x == y);
        }
    }
    CHECK((*b)->get_float("steward.synth.late_scale").value_or(0.0) == Approx(0.25));
}

TEST_CASE("measure: greedy agreement of a late-scaled target with its draft", "[.measure]") {
    const auto contexts = random_contexts(1024, 4096, 9);
    for (int keep : {1, 2})
        for (float s : {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 1.0f})
            std::printf("keep %d late_scale %.2f agreement %.3f\n", keep, s, agreement(s, keep, contexts));
}
