// The CPU plan (cpu/plan.h): measured once per CPU model and kernel level, cached on disk.
#include "cpu/plan.h"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
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

// F32's row limit (kernels.h g_f32_row_bytes); a negative one puts back the vendor's. The kernels'
// first call sets it from the vendor (dispatch.cpp), so that call is made first here.
void set_f32_rows(int64_t row_bytes) {
    (void)stream_tile_rows();
    g_f32_row_bytes.store(row_bytes >= 0 ? std::min(row_bytes, kEveryRowLength) : vendor_f32_row_bytes(), std::memory_order_relaxed);
}

// The half types' row limit (kernels.h g_half_row_bytes) likewise.
void set_half_rows(int64_t row_bytes) {
    (void)stream_tile_rows();
    g_half_row_bytes.store(row_bytes >= 0 ? std::min(row_bytes, kEveryRowLength) : vendor_half_row_bytes(), std::memory_order_relaxed);
}

// [cpu] f32_stream_rows and half_stream_rows: 1 every row a row at a time, 4 every row in tiles; -1 for anything else
// (no override).
int64_t rows_limit_of(int rows) { return rows == 1 ? kEveryRowLength : rows == 4 ? 0 : -1; }

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
    return cpu_plan_level_key() + "\t" + model + "\t";
}

// The cache is read only when it is a regular file (a FIFO there would block the start).
bool cache_readable(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(path, ec);
}

// An exclusive flock on `path` for the object's life (created with its folder); none where the file
// cannot be opened (a read-only home): the plan is then measured without it.
class CacheLock {
public:
    explicit CacheLock(const std::string& path) {
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) ::close(fd_), fd_ = -1;
    }
    ~CacheLock() {
        if (fd_ >= 0) ::flock(fd_, LOCK_UN), ::close(fd_);
    }
    CacheLock(const CacheLock&) = delete;
    CacheLock& operator=(const CacheLock&) = delete;

private:
    int fd_ = -1;
};

struct Cached {
    int prefetch = 0;                  // 0: none
    std::array<int, kGemmClasses> gemm{};  // all 0: none (a line of an older format)
    int64_t f32_row_bytes = -1;        // -1: none (a line of an older format)
    int64_t half_row_bytes = -1;       // likewise
};

Cached read_cached() {
    Cached c;
    if (!cache_readable(cpu_plan_cache_path())) return c;
    std::ifstream in(cpu_plan_cache_path());
    const std::string key = cache_key_prefix();
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) {
            std::istringstream fields(line.substr(key.size()));
            std::string distance, gemm, rows, half_rows;
            std::getline(fields, distance, '\t');
            std::getline(fields, gemm, '\t');
            std::getline(fields, rows, '\t');
            std::getline(fields, half_rows, '\t');
            if (const int v = std::atoi(distance.c_str()); v >= 64 && v <= 65536) c.prefetch = v;
            auto limit_of = [](const std::string& f) -> int64_t {  // -1 unless a whole number in [0, kEveryRowLength]
                char* end = nullptr;
                const long long limit = f.empty() ? -1 : std::strtoll(f.c_str(), &end, 10);
                return end != nullptr && *end == '\0' && limit >= 0 && limit <= kEveryRowLength ? limit : -1;
            };
            c.f32_row_bytes = limit_of(rows);
            c.half_row_bytes = limit_of(half_rows);
            std::array<int, kGemmClasses> g{};
            int n = 0;
            std::istringstream list(gemm);
            std::string item;
            while (n < kGemmClasses && std::getline(list, item, ',')) g[(size_t)n++] = std::atoi(item.c_str());
            bool ok = n == kGemmClasses;
            for (int v : g) ok = ok && v >= 1 && v <= 4096;
            if (ok) c.gemm = g;
        }
    return c;
}

void write_cached(int bytes, const std::array<int, kGemmClasses>& gemm, int64_t f32_row_bytes, int64_t half_row_bytes) {
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
    out << key << bytes << "\t";
    for (int c = 0; c < kGemmClasses; c++) out << (c ? "," : "") << gemm[(size_t)c];
    out << "\t" << f32_row_bytes << "\t" << half_row_bytes << "\n";
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    std::ofstream f(tmp, std::ios::trunc);
    f << out.str();
    f.close();
    if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        spdlog::warn("the CPU plan could not be cached at {} (it is measured again at the next start)", path);
    }
}

void set_gemm_from(const std::array<int, kGemmClasses>& g) {
    for (int c = 0; c < kGemmClasses; c++) g_gemm_from[c].store(g[(size_t)c], std::memory_order_relaxed);
}

// The crossover's measurement: per class, its representative type on a 1024 x 768 matrix (the
// shape of a small model's projections; 1.5-3 MiB, so the GEMM's compute, not the memory, decides),
// both paths at every candidate token count on one thread, in rounds (the first warms up), each
// trial's best of the rest.
std::vector<CpuPlan::GemmTrial> measure_gemm(std::array<int, kGemmClasses>& from) {
    constexpr int64_t K = 768, N = 1024;
    constexpr int kMaxTok = 64;
    const GgmlType reps[kGemmClasses] = {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::IQ4_XS, GgmlType::BF16};
    std::vector<float> x((size_t)(kMaxTok * K)), y((size_t)(kMaxTok * N));
    for (size_t i = 0; i < x.size(); i++) x[i] = (float)((int64_t)(i * 37) % 101 - 50) / 50.0f;
    ThreadPool pool(1);
    blas_set_threads(1);  // as CpuForward: its pool splits the rows, OpenBLAS runs one thread per slice
    std::vector<CpuPlan::GemmTrial> trials;
    constexpr int nc = (int)(sizeof kGemmCandidates / sizeof kGemmCandidates[0]);
    for (int cls = 0; cls < kGemmClasses; cls++) {
        const GgmlType t = reps[cls];
        std::vector<uint8_t> w;
        if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
            w.resize((size_t)(N * K * (t == GgmlType::F32 ? 4 : 2)));
            for (int64_t i = 0; i < N * K; i++) {
                const float v = (float)((i * 53) % 97 - 48) / 480.0f;
                if (t == GgmlType::F32) std::memcpy(w.data() + 4 * i, &v, 4);
                else {
                    const uint16_t h = t == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
                    std::memcpy(w.data() + 2 * i, &h, 2);
                }
            }
        } else {
            w = test_rows(t, N, K);
        }
        const WeightView W{t, w.data(), K, N};
        std::vector<double> st((size_t)nc, 1e30), gt((size_t)nc, 1e30);
        for (int round = 0; round < 3; round++)
            for (int i = 0; i < nc; i++)
                for (int g = 0; g < 2; g++) {
                    const auto a = std::chrono::steady_clock::now();
                    matmul(W, x.data(), kGemmCandidates[i], y.data(), pool, g ? MatmulPath::GEMM : MatmulPath::STREAM);
                    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
                    if (round > 0) (g ? gt : st)[(size_t)i] = std::min((g ? gt : st)[(size_t)i], sec);
                }
        for (int i = 0; i < nc; i++) {
            const double flop = 2.0 * (double)(N * K) * kGemmCandidates[i] / 1e9;
            trials.push_back({cls, kGemmCandidates[i], flop / st[(size_t)i], flop / gt[(size_t)i]});
        }
        from[(size_t)cls] = gemm_from_trials(st, gt);
    }
    return trials;
}

}  // namespace

std::string cpu_plan_level_key() { return std::string(cpu_level_name(cpu_level())) + "/r" + std::to_string(kCpuPlanRevision); }

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

int gemm_from_trials(const std::vector<double>& stream_s, const std::vector<double>& gemm_s) {
    constexpr int nc = (int)(sizeof kGemmCandidates / sizeof kGemmCandidates[0]);
    const int n = std::min({nc, (int)stream_s.size(), (int)gemm_s.size()});
    int best_from = kGemmFromPastCandidates;
    double best_cost = 1e300;
    // Threshold j: the GEMM from candidate j on (j == n: from kGemmFromPastCandidates); ties go to
    // the larger threshold only when strictly cheaper, so the smallest of equal costs wins.
    for (int j = 0; j <= n; j++) {
        double cost = 0;
        for (int i = 0; i < n; i++) {
            const double gemm = gemm_s[(size_t)i] * kGemmMargin, fastest = std::min(stream_s[(size_t)i], gemm);
            if (!(fastest > 0)) continue;
            cost += (i < j ? stream_s[(size_t)i] : gemm) / fastest;
        }
        if (cost < best_cost - 1e-9) best_cost = cost, best_from = j < n ? kGemmCandidates[j] : kGemmFromPastCandidates;
    }
    return best_from;
}

int64_t row_bytes_from_trials(const std::vector<CpuPlan::RowsTrial>& trials) {
    const int n = (int)trials.size();
    int64_t best_limit = 0;
    double best_cost = 1e300;
    // Threshold j: a row at a time for trials [0, j), tiles from j on.
    for (int j = 0; j <= n; j++) {
        double cost = 0;
        for (int i = 0; i < n; i++) {
            const double single = trials[(size_t)i].single_gbs, tiles = trials[(size_t)i].tiles_gbs, fastest = std::max(single, tiles);
            if (!(single > 0 && tiles > 0)) continue;
            cost += fastest / (i < j ? single : tiles);  // time relative to the faster way
        }
        if (cost < best_cost - 1e-9) best_cost = cost, best_limit = j == 0 ? 0 : j == n ? kEveryRowLength : trials[(size_t)j - 1].row_bytes;
    }
    return best_limit;
}

namespace {

// The prefetch distance's measurement (into plan.prefetch_bytes and plan.trials); it leaves the
// distance at the last candidate, and measure_cpu_plan (its caller) turns the exact path off around it.
void measure_prefetch(CpuPlan& plan) {
    // 64 MiB in all: past the L2 and most of the L3 of the machines this serves, as a model's matrices.
    constexpr int64_t K = 4096;
    const int64_t rows_q4 = (int64_t)(32 << 20) / ggml_row_bytes(GgmlType::Q4_K, K);
    const int64_t rows_q8 = (int64_t)(32 << 20) / ggml_row_bytes(GgmlType::Q8_0, K);
    const std::vector<uint8_t> q4 = test_rows(GgmlType::Q4_K, rows_q4, K), q8 = test_rows(GgmlType::Q8_0, rows_q8, K);
    const WeightView w4{GgmlType::Q4_K, q4.data(), K, rows_q4}, w8{GgmlType::Q8_0, q8.data(), K, rows_q8};
    std::vector<float> x((size_t)K), y((size_t)std::max(rows_q4, rows_q8));
    for (int64_t i = 0; i < K; i++) x[(size_t)i] = (float)((i * 37) % 101 - 50) / 50.0f;
    ThreadPool pool(1);
    plan.source = "measured";
    plan.trials.clear();
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
}

// A row limit's trials: at each kRowsCandidates length, the one-token matvec over 32 MiB of rows of
// type t (a model's matrices come from memory), one thread, a row at a time and in 4-row tiles
// (set_limit with kEveryRowLength or 0) in rounds (the first warms up), each's best of 3. It leaves
// the limit at the last trial's.
std::vector<CpuPlan::RowsTrial> time_rows(GgmlType t, void (*set_limit)(int64_t)) {
    const int64_t elem = t == GgmlType::F32 ? 4 : 2;
    constexpr int64_t kBytes = 32 << 20;
    std::vector<uint8_t> w((size_t)kBytes);
    for (int64_t i = 0; i < kBytes / elem; i++) {
        const float v = (float)((i * 53) % 97 - 48) / 480.0f;
        if (t == GgmlType::F32) std::memcpy(w.data() + 4 * i, &v, 4);
        else {
            const uint16_t h = t == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
            std::memcpy(w.data() + 2 * i, &h, 2);
        }
    }
    std::vector<float> x((size_t)(kRowsCandidates[std::size(kRowsCandidates) - 1] / elem));  // the longest row's columns
    std::vector<float> y((size_t)(kBytes / kRowsCandidates[0]));
    for (size_t i = 0; i < x.size(); i++) x[i] = (float)((int64_t)(i * 37) % 101 - 50) / 50.0f;
    ThreadPool pool(1);
    std::vector<CpuPlan::RowsTrial> trials;
    for (const int64_t row_bytes : kRowsCandidates) {
        const WeightView W{t, w.data(), row_bytes / elem, kBytes / row_bytes};
        double best_s[2] = {1e30, 1e30};  // a row at a time, tiles
        for (int round = 0; round < 4; round++)
            for (int i = 0; i < 2; i++) {
                set_limit(i == 0 ? kEveryRowLength : 0);
                const auto a = std::chrono::steady_clock::now();
                matmul(W, x.data(), 1, y.data(), pool, MatmulPath::STREAM);
                const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
                if (round > 0) best_s[i] = std::min(best_s[i], s);
            }
        trials.push_back({row_bytes, (double)kBytes / best_s[0] / 1e9, (double)kBytes / best_s[1] / 1e9});
    }
    return trials;
}

// Both row limits (into plan.f32_row_bytes, plan.half_row_bytes and their trials). The half types'
// is timed where the kernels read it (the AVX-512 levels with stream_tile_rows() 1); elsewhere
// every row is in tiles.
void measure_rows(CpuPlan& plan) {
    plan.rows_trials = time_rows(GgmlType::F32, set_f32_rows);
    plan.f32_row_bytes = row_bytes_from_trials(plan.rows_trials);
    plan.rows_source = "measured";
    if (half_row_limit_used()) {
        plan.half_rows_trials = time_rows(GgmlType::F16, set_half_rows);
        plan.half_row_bytes = row_bytes_from_trials(plan.half_rows_trials);
        plan.half_rows_source = "measured";
    } else {
        plan.half_rows_trials.clear();
        plan.half_row_bytes = 0;
        plan.half_rows_source = "tiles";
    }
}

}  // namespace

CpuPlan measure_cpu_plan() {
    const auto t0 = std::chrono::steady_clock::now();
    CpuPlan plan;
    const bool exact = exact_quant();
    set_exact_quant(false);
    measure_prefetch(plan);
    set_distance(plan.prefetch_bytes);  // the crossover's streaming kernels with the distance chosen
    plan.gemm_trials = measure_gemm(plan.gemm_from);  // both paths forced: the crossover in use does not matter
    plan.gemm_source = "measured";
    measure_rows(plan);
    set_exact_quant(exact);
    plan.measure_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(g_mu);
    g_plan = plan;
    g_taken = true;
    set_gemm_from(plan.gemm_from);
    set_f32_rows(plan.f32_row_bytes);
    set_half_rows(plan.half_row_bytes);
    return plan;
}

CpuPlan start_cpu_plan(int prefetch_override, int gemm_override, int rows_override, int half_rows_override) {
    CpuPlan p;
    bool measure_prefetch_now = false, measure_gemm_now = false, measure_rows_now = false, measure_half_now = false;
    const int64_t rows_config = rows_limit_of(rows_override), rows_env_limit = env_row_bytes();
    const int64_t half_config = rows_limit_of(half_rows_override);
    {
        std::lock_guard<std::mutex> lock(g_mu);
        const bool same_prefetch = prefetch_override <= 0 || (g_plan.source == "config" && g_plan.prefetch_bytes == prefetch_override);
        const bool same_gemm = gemm_override <= 0 || (g_plan.gemm_source == "config" && g_plan.gemm_from[0] == gemm_override);
        const bool same_rows = rows_config < 0 || (g_plan.rows_source == "config" && g_plan.f32_row_bytes == rows_config);
        const bool same_half = half_config < 0 || (g_plan.half_rows_source == "config" && g_plan.half_row_bytes == half_config);
        if (g_taken && same_prefetch && same_gemm && same_rows && same_half) return g_plan;
        p = g_taken ? g_plan : CpuPlan{};
        const Cached cached = g_taken ? Cached{} : read_cached();
        if (prefetch_override > 0) {
            p.prefetch_bytes = std::clamp(prefetch_override, 64, 65536), p.source = "config", p.trials.clear();
        } else if (const char* e = std::getenv("STEWARD_PREFETCH_BYTES"); e && std::atoi(e) > 0) {
            p.prefetch_bytes = std::clamp(std::atoi(e), 64, 65536), p.source = "env", p.trials.clear();
        } else if (g_taken) {
            // kept as taken
        } else if (cached.prefetch > 0) {
            p.prefetch_bytes = cached.prefetch, p.source = "cached";
        } else {
            measure_prefetch_now = true;
        }
        if (gemm_override > 0) {
            p.gemm_from.fill(std::clamp(gemm_override, 1, 4096)), p.gemm_source = "config", p.gemm_trials.clear();
        } else if (const char* e = std::getenv("STEWARD_GEMM_MIN_TOKENS"); e && std::atoi(e) > 0) {
            p.gemm_from.fill(std::clamp(std::atoi(e), 1, 4096)), p.gemm_source = "env", p.gemm_trials.clear();
        } else if (g_taken) {
            // kept as taken
        } else if (cached.gemm[0] > 0) {
            p.gemm_from = cached.gemm, p.gemm_source = "cached";
        } else {
            measure_gemm_now = true;
        }
        // A row limit (F32's or the half types'): the config, then STEWARD_STREAM_ROWS, then the plan
        // taken, then the cache; true when it is to be measured.
        auto take_rows = [&](int64_t config, int64_t cached_limit, int64_t& limit, std::string& source, std::vector<CpuPlan::RowsTrial>& trials) {
            if (config >= 0) limit = config, source = "config", trials.clear();
            else if (rows_env_limit >= 0) limit = rows_env_limit, source = "env", trials.clear();
            else if (g_taken) return false;  // kept as taken
            else if (cached_limit >= 0) limit = cached_limit, source = "cached";
            else return true;
            return false;
        };
        measure_rows_now = take_rows(rows_config, cached.f32_row_bytes, p.f32_row_bytes, p.rows_source, p.rows_trials);
        measure_half_now = take_rows(half_config, cached.half_row_bytes, p.half_row_bytes, p.half_rows_source, p.half_rows_trials);
        if (!measure_prefetch_now && !measure_gemm_now && !measure_rows_now && !measure_half_now) {
            g_plan = p;
            g_taken = true;
            set_distance(p.prefetch_bytes);
            set_gemm_from(p.gemm_from);
            set_f32_rows(p.f32_row_bytes);
            set_half_rows(p.half_row_bytes);
            return p;
        }
    }
    // Something to measure. Processes that start together on one machine (a test suite, a front and
    // its workers) take the same plan: the first measures while it holds an exclusive lock beside
    // the cache file and writes the cache; the others wait for the lock and read what it wrote.
    CacheLock held(cpu_plan_cache_path() + ".lock");
    const Cached again = read_cached();
    if (measure_prefetch_now && again.prefetch > 0) p.prefetch_bytes = again.prefetch, p.source = "cached", measure_prefetch_now = false;
    if (measure_gemm_now && again.gemm[0] > 0) p.gemm_from = again.gemm, p.gemm_source = "cached", measure_gemm_now = false;
    if (measure_rows_now && again.f32_row_bytes >= 0) p.f32_row_bytes = again.f32_row_bytes, p.rows_source = "cached", measure_rows_now = false;
    if (measure_half_now && again.half_row_bytes >= 0) p.half_row_bytes = again.half_row_bytes, p.half_rows_source = "cached", measure_half_now = false;
    if (measure_prefetch_now || measure_gemm_now || measure_rows_now || measure_half_now) {
        // The whole plan (about 0.5 s, once per CPU model); what an override or the cache gave is kept.
        const CpuPlan m = measure_cpu_plan();
        if (measure_prefetch_now) p.prefetch_bytes = m.prefetch_bytes, p.source = m.source, p.trials = m.trials;
        if (measure_gemm_now) p.gemm_from = m.gemm_from, p.gemm_source = m.gemm_source, p.gemm_trials = m.gemm_trials;
        if (measure_rows_now) p.f32_row_bytes = m.f32_row_bytes, p.rows_source = m.rows_source, p.rows_trials = m.rows_trials;
        if (measure_half_now)
            p.half_row_bytes = m.half_row_bytes, p.half_rows_source = m.half_rows_source, p.half_rows_trials = m.half_rows_trials;
        p.measure_ms = m.measure_ms;
        auto kept = [](const std::string& source) { return source == "cached" || source == "measured" || source == "tiles"; };
        write_cached(kept(p.source) ? p.prefetch_bytes : m.prefetch_bytes, kept(p.gemm_source) ? p.gemm_from : m.gemm_from,
                     kept(p.rows_source) ? p.f32_row_bytes : m.f32_row_bytes,
                     kept(p.half_rows_source) ? p.half_row_bytes : m.half_row_bytes);
    }
    {
        std::lock_guard<std::mutex> lock(g_mu);
        g_plan = p;
        g_taken = true;
        set_distance(p.prefetch_bytes);
        set_gemm_from(p.gemm_from);
        set_f32_rows(p.f32_row_bytes);
        set_half_rows(p.half_row_bytes);
    }
    spdlog::info("CPU plan for {} ({}): {}", cpu_features().model_name, cpu_level_name(cpu_level()), describe_cpu_plan(p));
    return p;
}

void forget_cpu_plan() {
    std::lock_guard<std::mutex> lock(g_mu);
    g_plan = CpuPlan{};
    g_taken = false;
    set_distance(g_plan.prefetch_bytes);
    set_gemm_from(g_plan.gemm_from);
    set_f32_rows(-1);
    set_half_rows(-1);
}

std::string describe_cpu_plan(const CpuPlan& p) {
    std::string s = "prefetch " + std::to_string(p.prefetch_bytes) + " bytes ahead (" + p.source;
    if (p.source == "cached") s += " in " + cpu_plan_cache_path();
    char buf[96];
    if (!p.trials.empty()) {
        s += ":";
        for (const auto& [c, g] : p.trials) {
            std::snprintf(buf, sizeof buf, " %d %.1f", c, g);
            s += buf;
        }
        s += " GB/s";
    }
    s += "); gemm from ";
    const char* names[kGemmClasses] = {"F32", "F16", "Q8_0 and 32-wide blocks", "k-quants", "IQ4_XS/IQ4_NL/MXFP4", "BF16"};
    for (int c = 0; c < kGemmClasses; c++) {
        s += (c ? ", " : "") + std::string(names[c]) + " " + (p.gemm_from[(size_t)c] > 0 ? std::to_string(p.gemm_from[(size_t)c]) : "default");
    }
    s += " tokens (" + p.gemm_source;
    if (!p.gemm_trials.empty()) {
        s += ": stream/gemm GFLOP/s at";
        int last = -1;
        for (const auto& t : p.gemm_trials) {
            if (t.cls != last) s += std::string(last >= 0 ? ";" : "") + " " + names[t.cls] + ":", last = t.cls;
            std::snprintf(buf, sizeof buf, " %d %.0f/%.0f", t.n_tok, t.stream_gflops, t.gemm_gflops);
            s += buf;
        }
    }
    // A row limit: "F32 at one token a row at a time up to 8192-byte rows, longer in 4-row tiles
    // (measured: row bytes a-row/tiles GB/s at 2048 26.3/17.0 ...)".
    // Where the kernels do not read the limit (the half types off AMD's AVX-512 path), whatever was
    // cached, configured or measured: the tiles they run.
    auto rows = [&](const char* what, int64_t limit, int tile_rows, bool used, const std::string& source, const std::vector<CpuPlan::RowsTrial>& trials) {
        if (!used) {
            s += std::string("; ") + what + " at one token in 4-row tiles, the stream ahead asked for (not timed at this level and vendor)";
            return;
        }
        s += std::string("; ") + what + " at one token " + (limit < 0 ? "by the vendor's default" : describe_row_bytes(limit, tile_rows)) + " (" + source;
        if (!trials.empty()) {
            s += ": row bytes a-row/tiles GB/s at";
            for (const auto& t : trials) {
                std::snprintf(buf, sizeof buf, " %lld %.1f/%.1f", (long long)t.row_bytes, t.single_gbs, t.tiles_gbs);
                s += buf;
            }
        }
        s += ")";
    };
    s += ")";
    rows("F32", p.f32_row_bytes, 4, true, p.rows_source, p.rows_trials);
    rows("F16/BF16", p.half_row_bytes, 6, half_row_limit_used(), p.half_rows_source, p.half_rows_trials);
    if (p.measure_ms > 0) {
        std::snprintf(buf, sizeof buf, "; measured in %.0f ms", p.measure_ms);
        s += buf;
    }
    return s;
}

}  // namespace steward
