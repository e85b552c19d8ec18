// Helpers of the per-architecture forward tests (test_gemma, test_moe): a synthetic model built in
// memory, every position's logits through CpuForward (a prompt batch, then token by token over a
// scattered block table), the largest difference relative to the reference's largest logit, and
// random tokens.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cpu/forward.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"

namespace steward_test {

using namespace steward;

// A written GGUF parsed back from memory.
inline std::unique_ptr<GgufFile> parse_gguf(const GgufWriter& w) {
    auto file = GgufFile::from_bytes(w.to_bytes());
    REQUIRE(file.ok());
    return std::move(file.value());
}

// The synthetic model of spec, written and loaded in memory.
inline std::unique_ptr<Model> make_model(const SynthSpec& spec) {
    auto writer = synth_model(spec);
    INFO("synth_model: " << (writer.ok() ? std::string("ok") : writer.error().message));
    REQUIRE(writer.ok());
    auto model = Model::from_gguf(parse_gguf(*writer));
    INFO("Model::from_gguf: " << (model.ok() ? std::string("ok") : model.error().message));
    REQUIRE(model.ok());
    return std::move(model.value());
}

// Every position's logits through CpuForward: a prompt in one batch (the matrix-product attention),
// then tokens one at a time (the per-token path), over a scattered block table.
inline std::vector<float> cpu_logits(const Model& m, const std::vector<int32_t>& tokens, int n_prompt) {
    CpuForward fwd(m, 2, 64);
    KvStorage kv(KvStorage::config_for(m.params(), 8, 8, KvDtype::F32));
    const std::vector<int32_t> table = {5, 1, 7, 0, 3, 2, 6, 4};
    std::vector<float> all, got;
    SeqInput in;
    in.tokens = std::span<const int32_t>(tokens.data(), (size_t)n_prompt);
    in.block_table = table;
    in.logits = LogitsMode::ALL;
    REQUIRE(fwd.forward(kv, std::span<const SeqInput>(&in, 1), got).ok());
    all = got;
    for (int t = n_prompt; t < (int)tokens.size(); t++) {
        in.n_past = t;
        in.tokens = std::span<const int32_t>(tokens.data() + t, 1);
        REQUIRE(fwd.forward(kv, std::span<const SeqInput>(&in, 1), got).ok());
        all.insert(all.end(), got.begin(), got.end());
    }
    return all;
}

// The largest difference relative to the largest logit of b (the reference).
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0, m = 0;
    for (size_t i = 0; i < a.size(); i++) {
        d = std::max(d, (double)std::fabs(a[i] - b[i]));
        m = std::max(m, (double)std::fabs(b[i]));
    }
    return d / m;
}

inline std::vector<int32_t> random_tokens(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> dist(3, 1023);
    std::vector<int32_t> t((size_t)n);
    for (auto& x : t) x = dist(rng);
    return t;
}

// A reference row's name "arch/dtype" (tests/data/{gemma,moe}/llama_greedy.tsv) split.
inline std::pair<std::string, GgmlType> arch_and_type(const std::string& name) {
    const size_t slash = name.find('/');
    REQUIRE(slash != std::string::npos);
    auto type = parse_ggml_type(name.substr(slash + 1));
    REQUIRE(type.ok());
    return {name.substr(0, slash), *type};
}

}  // namespace steward_test
