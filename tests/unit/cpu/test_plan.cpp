// The CPU plan (cpu/plan.h): measured once, cached per CPU model and kernel level, overridden by the
// config; the prefetch distance it sets never changes a result.
#include <catch2/catch.hpp>
#include <steward/config.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
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
    CHECK(all.rfind(cpu_plan_level_key() + "\t", 0) == 0);
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

TEST_CASE("the GEMM crossover is the threshold that costs the trials least (one noisy point aside)", "[plan]") {
    // Candidates 8, 16, 24, 32, 48, 64 (cpu/plan.h); seconds per trial of each path.
    using V = std::vector<double>;
    CHECK(gemm_from_trials(V{1, 1, 1, 1, 1, 1}, V{2, 2, 2, 2, 2, 2}) == kGemmFromPastCandidates);  // streaming wins throughout
    CHECK(gemm_from_trials(V{2, 2, 2, 2, 2, 2}, V{1, 1, 1, 1, 1, 1}) == 8);                         // the GEMM wins throughout
    CHECK(gemm_from_trials(V{1, 1, 1, 2, 2, 2}, V{2, 2, 2, 1, 1, 1}) == 32);                        // a clean crossover
    // The GEMM barely ahead at 16 (noise), clearly behind at 24, ahead from 32: the first candidate
    // where it wins would say 16 and cost 24's trial 50%; the least total says 32.
    CHECK(gemm_from_trials(V{1, 1.01, 1, 2, 2, 2}, V{2, 1, 1.5, 1, 1, 1}) == 32);
    // Equal paths, or the GEMM ahead by less than kGemmMargin: the streaming kernel throughout; ahead
    // by more from 24 on: 24.
    CHECK(gemm_from_trials(V{1, 1, 1, 1, 1, 1}, V{1, 1, 1, 1, 1, 1}) == kGemmFromPastCandidates);
    CHECK(gemm_from_trials(V{1, 1, 1, 1, 1, 1}, V{0.95, 0.95, 0.8, 0.8, 0.8, 0.8}) == 24);
    // Equal costs after the margin: the smaller threshold.
    CHECK(gemm_from_trials(V{1.1, 1.1, 1.1, 1.1, 1.1, 1.1}, V{1, 1, 1, 1, 1, 1}) == 8);
}

TEST_CASE("the planned crossover decides each weight class's path (the config and the exact path override it)", "[plan]") {
    const std::string dir = (std::filesystem::temp_directory_path() / ("steward-plan-gemm-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    ::setenv("STEWARD_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("STEWARD_PREFETCH_BYTES");
    ::unsetenv("STEWARD_GEMM_MIN_TOKENS");
    // A cache line of the older format (the distance only): the distance is read, the crossover
    // measured and the line rewritten with it.
    {
        std::ofstream f(dir + "/cpu-plan.tsv");
        f << cpu_plan_level_key() << "\t" << cpu_features().model_name << "\t2048\n";
    }
    forget_cpu_plan();
    const CpuPlan p = start_cpu_plan();
    CHECK(p.source == "cached");
    CHECK(p.prefetch_bytes == 2048);
    CHECK(p.gemm_source == "measured");
    REQUIRE(p.gemm_trials.size() == kGemmClasses * std::size(kGemmCandidates));
    for (const auto& t : p.gemm_trials) CHECK((t.stream_gflops > 0 && t.gemm_gflops > 0));
    // Each class's crossover is what its own trials give.
    for (int c = 0; c < kGemmClasses; c++) {
        std::vector<double> st, gt;
        for (const auto& t : p.gemm_trials)
            if (t.cls == c) st.push_back(1 / t.stream_gflops), gt.push_back(1 / t.gemm_gflops);
        CHECK(p.gemm_from[(size_t)c] == gemm_from_trials(st, gt));
    }
    std::ifstream in(dir + "/cpu-plan.tsv");
    std::string line;
    std::getline(in, line);
    std::string want = "\t2048\t";
    for (int k = 0; k < kGemmClasses; k++) {
        if (k > 0) want += ',';
        want += std::to_string(p.gemm_from[(size_t)k]);
    }
    want += '\t';
    want += std::to_string(p.f32_row_bytes) + '\t' + std::to_string(p.half_row_bytes);
    CHECK(line.size() > want.size());
    CHECK(line.substr(line.size() - want.size()) == want);
    // Read back whole by the next start.
    forget_cpu_plan();
    const CpuPlan c = start_cpu_plan();
    CHECK(c.gemm_source == "cached");
    CHECK(c.gemm_from == p.gemm_from);
    // gemm_min_tokens follows the plan per class.
    const std::vector<uint8_t> buf(1 << 20);
    const WeightView f32{GgmlType::F32, buf.data(), 256, 16}, f16{GgmlType::F16, buf.data(), 256, 16},
        bf16{GgmlType::BF16, buf.data(), 256, 16},
        q8{GgmlType::Q8_0, buf.data(), 256, 16}, q4k{GgmlType::Q4_K, buf.data(), 256, 16}, iq4{GgmlType::IQ4_XS, buf.data(), 256, 16};
    CHECK(gemm_min_tokens(f32) == c.gemm_from[0]);
    CHECK(gemm_min_tokens(f16) == c.gemm_from[1]);
    CHECK(gemm_min_tokens(bf16) == c.gemm_from[5]);
    CHECK(gemm_min_tokens(q8) == c.gemm_from[2]);
    CHECK(gemm_min_tokens(q4k) == c.gemm_from[3]);
    CHECK(gemm_min_tokens(iq4) == c.gemm_from[4]);
    {
        ExactQuantScope exact;  // dequantizing rows is not the streaming kernel measured
        CHECK(gemm_min_tokens(q4k) == kGemmMinTokens);
        CHECK(gemm_min_tokens(f32) == c.gemm_from[0]);
    }
    // [cpu] gemm_min_tokens: every class alike.
    const CpuPlan o = start_cpu_plan(0, 40);
    CHECK(o.gemm_source == "config");
    CHECK(o.source == "cached");
    for (const WeightView* w : {&f32, &f16, &bf16, &q8, &q4k, &iq4}) CHECK(gemm_min_tokens(*w) == 40);
    {
        ExactQuantScope exact;  // every block class, the table types too, keeps 16 on the exact path
        for (const WeightView* w : {&q8, &q4k, &iq4}) CHECK(gemm_min_tokens(*w) == kGemmMinTokens);
        CHECK(gemm_min_tokens(f32) == 40);
    }
    forget_cpu_plan();
    CHECK(gemm_min_tokens(q8) == kGemmMinTokens);  // no plan: the level's default
    // A whole line measured on older kernels (the level without this revision, as lines were
    // written before kCpuPlanRevision): not this machine's plan, so it is measured again.
    {
        std::ofstream f(dir + "/cpu-plan.tsv");
        f << cpu_level_name(cpu_level()) << "\t" << cpu_features().model_name << "\t2048\t77,77,77,77,77\n";
    }
    const CpuPlan old = start_cpu_plan();
    CHECK(old.source == "measured");
    CHECK(old.gemm_source == "measured");
    CHECK(old.gemm_from[0] != 77);  // 77 is no candidate
    forget_cpu_plan();
    ::unsetenv("STEWARD_CACHE_DIR");
    std::filesystem::remove_all(dir);
}

TEST_CASE("[cpu] gemm_min_tokens is read from the config and refused out of range", "[plan]") {
    const std::string pool = "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\n";
    auto ok = parse_config(pool + "[cpu]\ngemm_min_tokens = 32\n");
    REQUIRE(ok.ok());
    CHECK(ok->cpu.gemm_min_tokens == 32);
    auto big = parse_config(pool + "[cpu]\ngemm_min_tokens = 5000\n");
    REQUIRE_FALSE(big.ok());
    CHECK_THAT(big.error().message, Catch::Contains("gemm_min_tokens"));
}

TEST_CASE("processes that start together take one plan: the first measures under the lock and the others read it", "[plan]") {
    const std::string dir = (std::filesystem::temp_directory_path() / ("steward-plan-lock-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    ::setenv("STEWARD_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("STEWARD_PREFETCH_BYTES");
    ::unsetenv("STEWARD_GEMM_MIN_TOKENS");
    constexpr int kProcs = 3;
    int fds[kProcs][2];
    pid_t pids[kProcs];
    for (int i = 0; i < kProcs; i++) {
        REQUIRE(::pipe(fds[i]) == 0);
        pids[i] = ::fork();
        REQUIRE(pids[i] >= 0);
        if (pids[i] == 0) {
            forget_cpu_plan();
            const CpuPlan p = start_cpu_plan();
            char line[128];
            const int n = std::snprintf(line, sizeof line, "%d %d %d %d %d %d %s\n", p.prefetch_bytes, p.gemm_from[0], p.gemm_from[1],
                                        p.gemm_from[2], p.gemm_from[3], p.gemm_from[4], p.gemm_source.c_str());
            (void)!::write(fds[i][1], line, (size_t)n);
            ::_exit(0);
        }
        ::close(fds[i][1]);
    }
    std::vector<std::string> got;
    int n_measured = 0;
    for (int i = 0; i < kProcs; i++) {
        char buf[128] = {};
        const ssize_t n = ::read(fds[i][0], buf, sizeof buf - 1);
        ::close(fds[i][0]);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
        CHECK(WIFEXITED(status));
        REQUIRE(n > 0);
        std::string s(buf, (size_t)n);
        if (s.find("measured") != std::string::npos) n_measured++;
        got.push_back(s.substr(0, s.rfind(' ')));  // the values, without their source
    }
    CHECK(n_measured == 1);
    for (const std::string& g : got) CHECK(g == got[0]);
    std::ifstream in(dir + "/cpu-plan.tsv");
    std::string line;
    int n_lines = 0;
    while (std::getline(in, line)) n_lines++;
    CHECK(n_lines == 1);
    ::unsetenv("STEWARD_CACHE_DIR");
    std::filesystem::remove_all(dir);
}

// F32's row limit (kernels.h g_f32_row_bytes): the plan times the one-token F32 matvec a row at a
// time and in 4-row tiles at five row lengths and takes the limit that costs those trials least; the
// cache, STEWARD_STREAM_ROWS and [cpu] f32_stream_rows as for the other choices. Either way gives the
// same bits (the kernel test "the streaming kernel a row at a time and in 4-row tiles ...").
TEST_CASE("F32's row limit is the threshold that costs the trials least (one noisy length aside)", "[plan]") {
    auto trials = [](std::vector<std::pair<double, double>> gbs) {  // (a row at a time, tiles) per candidate
        std::vector<CpuPlan::RowsTrial> t;
        for (size_t i = 0; i < gbs.size(); i++) t.push_back({kRowsCandidates[i], gbs[i].first, gbs[i].second});
        return t;
    };
    CHECK(row_bytes_from_trials(trials({{2, 1}, {2, 1}, {2, 1}, {2, 1}, {2, 1}})) == kEveryRowLength);
    CHECK(row_bytes_from_trials(trials({{1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}})) == 0);
    // Zen 4's shape: a row at a time ahead to 8192 bytes, the tiles from 16384.
    CHECK(row_bytes_from_trials(trials({{29, 23}, {28, 21}, {28, 26}, {19, 26}, {16, 29}})) == 8192);
    // A near tie at 4096 that goes to the tiles by a hair does not cut the limit there.
    CHECK(row_bytes_from_trials(trials({{29, 23}, {26.9, 27.0}, {28, 24}, {19, 26}, {16, 29}})) == 8192);
    // Equal throughout: the smaller limit (tiles).
    CHECK(row_bytes_from_trials(trials({{1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}})) == 0);
}

// A measured row limit: one trial per candidate length, in order, both ways timed, and the limit
// the one its own trials give.
static void check_rows_trials(const std::vector<CpuPlan::RowsTrial>& trials, int64_t limit) {
    REQUIRE(trials.size() == std::size(kRowsCandidates));
    for (size_t i = 0; i < trials.size(); i++) {
        CHECK(trials[i].row_bytes == kRowsCandidates[i]);
        CHECK((trials[i].single_gbs > 0 && trials[i].tiles_gbs > 0));
    }
    CHECK(limit == row_bytes_from_trials(trials));
}

TEST_CASE("the plan takes F32's row limit from its trials, caches it, and the config and environment override it", "[plan]") {
    const std::string dir = (std::filesystem::temp_directory_path() / ("steward-plan-rows-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    ::setenv("STEWARD_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("STEWARD_PREFETCH_BYTES");
    ::unsetenv("STEWARD_GEMM_MIN_TOKENS");
    ::unsetenv("STEWARD_STREAM_ROWS");
    forget_cpu_plan();
    CHECK(g_f32_row_bytes.load() == vendor_f32_row_bytes());  // no plan: the vendor's
    const CpuPlan m = start_cpu_plan();
    CHECK(m.rows_source == "measured");
    check_rows_trials(m.rows_trials, m.f32_row_bytes);
    CHECK(g_f32_row_bytes.load() == m.f32_row_bytes);
    CHECK_THAT(describe_cpu_plan(m), Catch::Contains("F32 at one token ") && Catch::Contains("(measured: row bytes a-row/tiles GB/s at 2048 "));
    // Another limit in the cache is read back as it is.
    const int64_t other = m.f32_row_bytes == 4096 ? 16384 : 4096;
    auto rewrite_limit = [&](int64_t was, const std::string& limit) {  // F32's, the line's fifth field (the half types' follows)
        std::ifstream in(dir + "/cpu-plan.tsv");
        std::string line;
        std::getline(in, line);
        const size_t last = line.rfind('\t'), tab = line.rfind('\t', last - 1);
        REQUIRE((last != std::string::npos && tab != std::string::npos));
        CHECK(line.substr(tab + 1, last - tab - 1) == std::to_string(was));
        in.close();
        std::ofstream out(dir + "/cpu-plan.tsv");
        out << line.substr(0, tab + 1) << limit << line.substr(last) << "\n";
    };
    rewrite_limit(m.f32_row_bytes, std::to_string(other));
    forget_cpu_plan();
    const CpuPlan c = start_cpu_plan();
    CHECK(c.rows_source == "cached");
    CHECK(c.source == "cached");
    CHECK(c.f32_row_bytes == other);
    CHECK(g_f32_row_bytes.load() == other);
    if (cpu_level() >= CpuLevel::AVX2)  // the kernels line names the F32 tiles where the level has vectors
        CHECK_THAT(matmul_variant(GgmlType::F32), Catch::Contains("a row at a time up to " + std::to_string(other) + "-byte rows, longer in 4-row tiles"));
    // A limit that is no number is no plan: measured again (and the line rewritten with it).
    forget_cpu_plan();
    rewrite_limit(other, "lots");
    CHECK(start_cpu_plan().rows_source == "measured");
    // The environment over the cache, the config over both.
    forget_cpu_plan();
    ::setenv("STEWARD_STREAM_ROWS", "4", 1);
    const CpuPlan e = start_cpu_plan();
    CHECK(e.rows_source == "env");
    CHECK(g_f32_row_bytes.load() == 0);
    const CpuPlan o = start_cpu_plan(0, 0, 1);
    CHECK(o.rows_source == "config");
    CHECK(o.f32_row_bytes == kEveryRowLength);
    CHECK(g_f32_row_bytes.load() == kEveryRowLength);
    ::unsetenv("STEWARD_STREAM_ROWS");
    forget_cpu_plan();
    CHECK(g_f32_row_bytes.load() == vendor_f32_row_bytes());
    ::unsetenv("STEWARD_CACHE_DIR");
    std::filesystem::remove_all(dir);
}

TEST_CASE("[cpu] f32_stream_rows and half_stream_rows are read from the config and a tile the kernels lack is refused", "[plan]") {
    const std::string pool = "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\n";
    auto ok = parse_config(pool + "[cpu]\nf32_stream_rows = 4\nhalf_stream_rows = 1\n");
    REQUIRE(ok.ok());
    CHECK(ok->cpu.f32_stream_rows == 4);
    CHECK(ok->cpu.half_stream_rows == 1);
    auto none = parse_config(pool);
    REQUIRE(none.ok());
    CHECK(none->cpu.f32_stream_rows == 0);
    CHECK(none->cpu.half_stream_rows == 0);
    for (const std::string key : {"f32_stream_rows", "half_stream_rows"})
        for (const char* bad : {"2", "8", "-1", "\"one\""}) {
            INFO(key << " = " << bad);
            auto r = parse_config(pool + "[cpu]\n" + key + " = " + bad + "\n");
            REQUIRE_FALSE(r.ok());
            CHECK_THAT(r.error().message, Catch::Contains("[cpu]") && Catch::Contains(key));
        }
}

// The half types' row limit (kernels.h g_half_row_bytes): where the kernels stream F16 and BF16 a row
// at a time (the AVX-512 levels with stream_tile_rows() 1, AMD's), the plan times the one-token F16 matvec both ways at the
// same five lengths and takes the limit as F32's; where they stream in tiles (4) there is nothing to
// time. Cached as the line's sixth field; STEWARD_STREAM_ROWS and [cpu] half_stream_rows override it.
// Either way gives the same bits (the kernel test "F16 and BF16 at one token a row at a time ...").
TEST_CASE("the plan takes the half types' row limit from its trials, caches it, and the config and environment override it", "[plan]") {
    const std::string dir = (std::filesystem::temp_directory_path() / ("steward-plan-half-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    ::setenv("STEWARD_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("STEWARD_PREFETCH_BYTES");
    ::unsetenv("STEWARD_GEMM_MIN_TOKENS");
    ::unsetenv("STEWARD_STREAM_ROWS");
    const int rows_was = stream_tile_rows();
    auto fields = [&] {  // the cache line's tab-separated fields
        std::ifstream in(dir + "/cpu-plan.tsv");
        std::string line, f;
        std::getline(in, line);
        std::vector<std::string> out;
        std::istringstream split(line);
        while (std::getline(split, f, '\t')) out.push_back(f);
        return out;
    };
    g_stream_rows.store(1);
    forget_cpu_plan();
    CHECK(g_half_row_bytes.load() == vendor_half_row_bytes());  // no plan: the vendor's
    const CpuPlan m = start_cpu_plan();
    if (cpu_level() < CpuLevel::AVX512) {  // the AVX2 and scalar levels stream them in tiles: nothing timed
        CHECK(m.half_rows_source == "tiles");
        CHECK(m.half_rows_trials.empty());
    } else {
        CHECK(m.half_rows_source == "measured");
        check_rows_trials(m.half_rows_trials, m.half_row_bytes);
        CHECK(g_half_row_bytes.load() == m.half_row_bytes);
        CHECK_THAT(describe_cpu_plan(m), Catch::Contains("F16/BF16 at one token ") && Catch::Contains("(measured: row bytes a-row/tiles GB/s at 2048 "));
        std::vector<std::string> f = fields();
        REQUIRE(f.size() == 6);
        CHECK(f[5] == std::to_string(m.half_row_bytes));
        // Another limit in the cache is read back as it is, and the kernels line says it.
        const int64_t other = m.half_row_bytes == 4096 ? 16384 : 4096;
        f[5] = std::to_string(other);
        auto write = [&] {
            std::ofstream out(dir + "/cpu-plan.tsv");
            for (size_t i = 0; i < f.size(); i++) out << (i ? "\t" : "") << f[i];
            out << "\n";
        };
        write();
        forget_cpu_plan();
        const CpuPlan c = start_cpu_plan();
        CHECK(c.half_rows_source == "cached");
        CHECK(c.rows_source == "cached");
        CHECK(c.half_row_bytes == other);
        CHECK(g_half_row_bytes.load() == other);
        CHECK_THAT(matmul_variant(GgmlType::BF16), Catch::Contains("1 token ") && Catch::Contains("a row at a time up to " + std::to_string(other) + "-byte rows, longer in 6-row tiles"));
        // A line of the previous format (no sixth field) or one whose limit is no number: measured again.
        for (const std::string bad : {"", "-3", "8k"}) {
            INFO("the sixth field '" << bad << "'");
            f = fields();
            if (bad.empty()) f.resize(5);
            else f[5] = bad;
            write();
            forget_cpu_plan();
            const CpuPlan again = start_cpu_plan();
            CHECK(again.half_rows_source == "measured");
            CHECK(again.rows_source == "cached");
            CHECK(fields().size() == 6);
        }
    }
    // The environment over the cache, the config over both.
    forget_cpu_plan();
    ::setenv("STEWARD_STREAM_ROWS", "1", 1);
    const CpuPlan e = start_cpu_plan();
    CHECK(e.half_rows_source == "env");
    CHECK(g_half_row_bytes.load() == kEveryRowLength);
    const CpuPlan o = start_cpu_plan(0, 0, 0, 4);
    CHECK(o.half_rows_source == "config");
    CHECK(o.half_row_bytes == 0);
    CHECK(g_half_row_bytes.load() == 0);
    CHECK(o.rows_source == "env");
    ::unsetenv("STEWARD_STREAM_ROWS");
    // Where the half types stream in tiles there is nothing to time: "tiles", cached as 0.
    std::filesystem::remove_all(dir);
    g_stream_rows.store(4);
    forget_cpu_plan();
    const CpuPlan t = start_cpu_plan();
    CHECK(t.half_rows_source == "tiles");
    CHECK(t.half_rows_trials.empty());
    CHECK(t.half_row_bytes == 0);
    CHECK_THAT(describe_cpu_plan(t), Catch::Contains("F16/BF16 at one token in 4-row tiles, the stream ahead asked for (not timed at this level and vendor)"));
    CHECK(fields().at(5) == "0");
    // Read back from the cache (or set by the config), the unused limit still reads as those tiles.
    forget_cpu_plan();
    const CpuPlan back = start_cpu_plan();
    CHECK(back.half_rows_source == "cached");
    CHECK_THAT(describe_cpu_plan(back), Catch::Contains("F16/BF16 at one token in 4-row tiles, the stream ahead asked for (not timed"));
    CHECK_THAT(describe_cpu_plan(start_cpu_plan(0, 0, 0, 1)), Catch::Contains("F16/BF16 at one token in 4-row tiles, the stream ahead asked for (not timed"));
    if (cpu_level() >= CpuLevel::AVX512) CHECK_THAT(matmul_variant(GgmlType::F16), Catch::Contains("1-2 tokens in 4-row tiles"));
    g_stream_rows.store(rows_was);
    forget_cpu_plan();
    CHECK(g_half_row_bytes.load() == vendor_half_row_bytes());
    ::unsetenv("STEWARD_CACHE_DIR");
    std::filesystem::remove_all(dir);
}
