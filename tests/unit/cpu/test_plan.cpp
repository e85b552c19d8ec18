// The CPU plan (cpu/plan.h): measured once, cached per CPU model and kernel level, overridden by the
// config; the prefetch distance it sets never changes a result.
#include <catch2/catch.hpp>
#include <steward/config.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/plan.h"
#include "cpu/quant_dot.h"
#include "cpu/thread_pool.h"
#include "model/quantize.h"
#include "model/quants.h"

using namespace steward;

TEST_CASE("the prefetch distance changes no decode result, bit for bit", "[plan]") {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    const int64_t K = 512, N = 96;
    std::vector<float> w((size_t)(K * N)), x((size_t)K);
    for (float& v : w) v = nd(rng);
    for (float& v : x) v = nd(rng);
    ThreadPool pool(2);
    for (const GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::MXFP4}) {
        INFO(ggml_type_name((uint32_t)t));
        std::vector<uint8_t> q((size_t)(ggml_row_bytes(t, K) * N));
        for (int64_t r = 0; r < N; r++) REQUIRE(quantize_row(t, w.data() + r * K, K, q.data() + r * ggml_row_bytes(t, K)).ok());
        const WeightView W{t, q.data(), K, N};
        std::vector<float> near((size_t)N), far((size_t)N);
        g_quant_prefetch_bytes = 64;
        matmul(W, x.data(), 1, near.data(), pool);
        g_quant_prefetch_bytes = 65536;
        matmul(W, x.data(), 1, far.data(), pool);
        CHECK(std::memcmp(near.data(), far.data(), near.size() * 4) == 0);
    }
    forget_cpu_plan();
    CHECK(g_quant_prefetch_bytes.load() == 4096);
}

TEST_CASE("the CPU plan is measured once, cached per CPU model and level, and the config overrides it", "[plan]") {
    const std::string dir = (std::filesystem::temp_directory_path() / ("steward-plan-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    ::setenv("STEWARD_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("STEWARD_PREFETCH_BYTES");
    CHECK(cpu_plan_cache_path() == dir + "/cpu-plan.tsv");
    forget_cpu_plan();
    const CpuPlan m = start_cpu_plan();
    CHECK(m.source == "measured");
    REQUIRE(m.trials.size() == 5);
    double best = 0;
    for (const auto& [bytes, gbs] : m.trials) {
        CHECK(gbs > 0);
        best = std::max(best, gbs);
    }
    for (const auto& [bytes, gbs] : m.trials)
        if (gbs == best) CHECK(m.prefetch_bytes == bytes);  // the fastest trial
    CHECK(m.measure_ms > 0);  // how long it took is bench_model --plan's figure, not a test's
    CHECK(g_quant_prefetch_bytes.load() == m.prefetch_bytes);
    // Cached: one line of this level and CPU model, read back by the next process (here: a forget).
    std::ifstream in(dir + "/cpu-plan.tsv");
    std::string line, all;
    int n_lines = 0;
    while (std::getline(in, line)) n_lines++, all += line;
    CHECK(n_lines == 1);
    CHECK(all.rfind(std::string(cpu_level_name(cpu_level())) + "\t", 0) == 0);
    forget_cpu_plan();
    const CpuPlan c = start_cpu_plan();
    CHECK(c.source == "cached");
    CHECK(c.prefetch_bytes == m.prefetch_bytes);
    CHECK(c.trials.empty());
    // The config's value wins, and a plan already taken stays unless an override differs.
    const CpuPlan o = start_cpu_plan(512);
    CHECK(o.source == "config");
    CHECK(g_quant_prefetch_bytes.load() == 512);
    CHECK(start_cpu_plan().prefetch_bytes == 512);
    forget_cpu_plan();
    ::unsetenv("STEWARD_CACHE_DIR");
    std::filesystem::remove_all(dir);
}

TEST_CASE("[cpu] prefetch_bytes is read from the config and a distance under a cache line is refused", "[plan]") {
    const std::string pool = "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\n";
    auto ok = parse_config(pool + "[cpu]\nprefetch_bytes = 8192\n");
    INFO((ok.ok() ? std::string() : ok.error().message));
    REQUIRE(ok.ok());
    CHECK(ok->cpu.prefetch_bytes == 8192);
    auto none = parse_config(pool);
    REQUIRE(none.ok());
    CHECK(none->cpu.prefetch_bytes == 0);
    auto small = parse_config(pool + "[cpu]\nprefetch_bytes = 10\n");
    REQUIRE_FALSE(small.ok());
    CHECK_THAT(small.error().message, Catch::Contains("prefetch_bytes") && Catch::Contains("64 to 65536"));
    auto big = parse_config(pool + "[cpu]\nprefetch_bytes = 100000\n");
    REQUIRE_FALSE(big.ok());
    CHECK_THAT(big.error().message, Catch::Contains("prefetch_bytes"));
    auto typo = parse_config(pool + "[cpu]\nprefetch = 10\n");
    REQUIRE_FALSE(typo.ok());
}
