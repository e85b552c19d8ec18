// The independent path engine outputs are checked against: the single-sequence Generator
// (contiguous KV, one sequence, no scheduler, no actors), greedy. One Generator per model, kept
// for the test binary's life (tests call it from one thread).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "cpu/generator.h"
#include "model/model.h"

namespace steward_test {

inline std::vector<int32_t> greedy_reference(const steward::Model& model, const std::vector<int32_t>& prompt, int n) {
    static std::map<const steward::Model*, std::unique_ptr<steward::Generator>> generators;
    auto& g = generators[&model];
    if (!g) g = std::make_unique<steward::Generator>(model, 1);
    std::vector<int32_t> out;
    g->generate(prompt, n, steward::SamplingParams{}, [&](int32_t id, float) {
         out.push_back(id);
         return true;
     }).value();
    return out;
}

}  // namespace steward_test
