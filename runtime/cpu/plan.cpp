// The CPU plan (cpu/plan.h): measured once per CPU model and kernel level, cached on disk.
#include "cpu/plan.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/quant_dot.h"
#include "cpu/thread_pool.h"
#include "model/quants.h"

namespace steward {

namespace {

std::mutex g_mu;
CpuPlan g_plan;
bool g_taken = false;

constexpr int kCandidates[] = {1024, 2048, 4096, 8192, 16384};
constexpr int kNc = (int)(sizeof kCandidates / sizeof kCandidates[0]);

void set_distance(int bytes) { g_quant_prefetch_bytes.store(std::clamp(bytes, 64, 65536), std::memory_order_relaxed); }

// n_rows rows of K weights of type t: pseudo-random codes, every block's F16 scale(s) small, so the
// kernels see the bytes a real matrix has.
std::vector<uint8_t> test_rows(GgmlType t, int64_t n_rows, int64_t K) {
    const int64_t be = quant_block_elems(t), bb = (int64_t)quant_block_bytes(t), n_blocks = n_rows * K / be;
    std::vector<uint8_t> w((size_t)(n_blocks * bb));
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= w.size(); i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(w.data() + i, &x, 8);
    }
    const uint16_t small = f32_to_f16(1e-3f);
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t* blk = w.data() + b * bb;
        if (t == GgmlType::Q4_K) {
            std::memcpy(blk + offsetof(BlockQ4_K, d), &small, 2);
            std::memcpy(blk + offsetof(BlockQ4_K, dmin), &small, 2);
        } else {
            std::memcpy(blk, &small, 2);  // Q8_0's d
        }
    }
    return w;
}

std::string cache_key_prefix() {
    std::string model = cpu_features().model_name;
    for (char& c : model)
        if (c == '\t' || c == '\n') c = ' ';
    return std::string(cpu_level_name(cpu_level())) + "\t" + model + "\t";
}

// The cache is read only when it is a regular file (a FIFO there would block the start).
bool cache_readable(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(path, ec);
}

int read_cached() {
    if (!cache_readable(cpu_plan_cache_path())) return 0;
    std::ifstream in(cpu_plan_cache_path());
    const std::string key = cache_key_prefix();
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) {
            const int v = std::atoi(line.c_str() + key.size());
            if (v >= 64 && v <= 65536) return v;
        }
    return 0;
}

void write_cached(int bytes) {
    const std::string path = cpu_plan_cache_path(), key = cache_key_prefix();
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    std::ostringstream out;
    if (cache_readable(path)) {
        std::ifstream in(path);
        std::string line;
        while (std::getline(in, line))
            if (line.rfind(key, 0) != 0 && !line.empty()) out << line << "\n";
    }
    out << key << bytes << "\n";
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    std::ofstream f(tmp, std::ios::trunc);
    f << out.str();
    f.close();
    if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        spdlog::warn("the CPU plan could not be cached at {} (it is measured again at the next start)", path);
    }
}

}  // namespace

std::string cpu_plan_cache_path() {
    if (const char* d = std::getenv("STEWARD_CACHE_DIR"); d && *d) return std::string(d) + "/cpu-plan.tsv";
    if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/steward/cpu-plan.tsv";
    if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/steward/cpu-plan.tsv";
    return "/tmp/steward-cpu-plan.tsv";
}

CpuPlan cpu_plan() {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_plan;
}

CpuPlan measure_cpu_plan() {
    const auto t0 = std::chrono::steady_clock::now();
    // 64 MiB in all: past the L2 and most of the L3 of the machines this serves, as a model's matrices.
    constexpr int64_t K = 4096;
    const int64_t rows_q4 = (int64_t)(32 << 20) / ggml_row_bytes(GgmlType::Q4_K, K);
    const int64_t rows_q8 = (int64_t)(32 << 20) / ggml_row_bytes(GgmlType::Q8_0, K);
    const std::vector<uint8_t> q4 = test_rows(GgmlType::Q4_K, rows_q4, K), q8 = test_rows(GgmlType::Q8_0, rows_q8, K);
    const WeightView w4{GgmlType::Q4_K, q4.data(), K, rows_q4}, w8{GgmlType::Q8_0, q8.data(), K, rows_q8};
    std::vector<float> x((size_t)K), y((size_t)std::max(rows_q4, rows_q8));
    for (int64_t i = 0; i < K; i++) x[(size_t)i] = (float)((i * 37) % 101 - 50) / 50.0f;
    ThreadPool pool(1);
    const int was = g_quant_prefetch_bytes.load(std::memory_order_relaxed);
    CpuPlan plan;
    plan.source = "measured";
    const bool exact = exact_quant();
    set_exact_quant(false);
    // Rounds over every candidate (so a drift in the machine's speed reaches them all alike); the
    // first round warms up, then each candidate's best of 3.
    double best_s[kNc];
    std::fill(best_s, best_s + kNc, 1e30);
    for (int round = 0; round < 4; round++)
        for (int i = 0; i < kNc; i++) {
            set_distance(kCandidates[i]);
            const auto a = std::chrono::steady_clock::now();
            matmul(w4, x.data(), 1, y.data(), pool, MatmulPath::AUTO);
            matmul(w8, x.data(), 1, y.data(), pool, MatmulPath::AUTO);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
            if (round > 0) best_s[i] = std::min(best_s[i], s);
        }
    double best = 0;
    for (int i = 0; i < kNc; i++) {
        const double gbs = (double)(q4.size() + q8.size()) / best_s[i] / 1e9;
        plan.trials.push_back({kCandidates[i], gbs});
        if (gbs > best) best = gbs, plan.prefetch_bytes = kCandidates[i];
    }
    set_exact_quant(exact);
    set_distance(was);
    plan.measure_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(g_mu);
    g_plan = plan;
    g_taken = true;
    set_distance(plan.prefetch_bytes);
    return plan;
}

CpuPlan start_cpu_plan(int prefetch_override) {
    {
        std::lock_guard<std::mutex> lock(g_mu);
        const bool same_override = prefetch_override <= 0 || (g_plan.source == "config" && g_plan.prefetch_bytes == prefetch_override);
        if (g_taken && same_override) return g_plan;
        if (prefetch_override > 0) {
            g_plan = CpuPlan{std::clamp(prefetch_override, 64, 65536), "config", {}, 0};
            g_taken = true;
            set_distance(g_plan.prefetch_bytes);
            return g_plan;
        }
        if (const char* e = std::getenv("STEWARD_PREFETCH_BYTES"); e && std::atoi(e) > 0) {
            g_plan = CpuPlan{std::clamp(std::atoi(e), 64, 65536), "env", {}, 0};
            g_taken = true;
            set_distance(g_plan.prefetch_bytes);
            return g_plan;
        }
        if (const int cached = read_cached()) {
            g_plan = CpuPlan{cached, "cached", {}, 0};
            g_taken = true;
            set_distance(cached);
            return g_plan;
        }
    }
    CpuPlan p = measure_cpu_plan();
    write_cached(p.prefetch_bytes);
    spdlog::info("CPU plan for {} ({}): {}", cpu_features().model_name, cpu_level_name(cpu_level()), describe_cpu_plan(p));
    return p;
}

void forget_cpu_plan() {
    std::lock_guard<std::mutex> lock(g_mu);
    g_plan = CpuPlan{};
    g_taken = false;
    set_distance(g_plan.prefetch_bytes);
}

std::string describe_cpu_plan(const CpuPlan& p) {
    std::string s = "prefetch " + std::to_string(p.prefetch_bytes) + " bytes ahead (" + p.source;
    if (p.source == "cached") s += " in " + cpu_plan_cache_path();
    if (!p.trials.empty()) {
        s += ":";
        char buf[64];
        for (const auto& [c, g] : p.trials) {
            std::snprintf(buf, sizeof buf, " %d %.1f", c, g);
            s += buf;
        }
        std::snprintf(buf, sizeof buf, " GB/s, %.0f ms", p.measure_ms);
        s += buf;
    }
    return s + ")";
}

}  // namespace steward
