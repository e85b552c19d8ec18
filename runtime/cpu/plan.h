// The CPU plan: the kernel choices that depend on the microarchitecture rather than the ISA, chosen
// by measuring them once per CPU model. Four choices: how far ahead the int8 decode kernels
// prefetch their weight rows (Zen 4 / 5 and Intel's cores prefetch differently; the best distance
// on one is not the best on the other); from how many tokens a matmul leaves the streaming
// kernel for the tiled GEMM, per class of weight type (cpu/kernels.h GemmClass: where the
// crossover lies depends on the core's FMA and integer throughput, its caches and OpenBLAS's
// kernels for it); and up to which row length F32, and F16 / BF16, weights at one token stream a
// row at a time rather than in row tiles (the core's prefetchers and the row's length decide).
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.h"

namespace steward {

struct CpuPlan {
    int prefetch_bytes = 4096;
    // "default" (no plan taken yet), "measured", "cached" (a measurement of this CPU model and kernel
    // level read back), "config" ([cpu] prefetch_bytes) or "env" (STEWARD_PREFETCH_BYTES).
    std::string source = "default";
    // A measurement's trials: (distance, GB/s of the decode matvec over 64 MiB of Q4_K and Q8_0 rows
    // together, one thread, best of 3).
    std::vector<std::pair<int, double>> trials;
    double measure_ms = 0;  // the measurement's wall time (both choices)
    // From how many tokens each GemmClass (F32, F16, 32-wide blocks, k-quants, table types, BF16) takes the
    // GEMM; 0: the kernel level's default (cpu/kernels.h). gemm_source as source ("default",
    // "measured", "cached", "config": [cpu] gemm_min_tokens, "env": STEWARD_GEMM_MIN_TOKENS).
    std::array<int, kGemmClasses> gemm_from{};
    std::string gemm_source = "default";
    // A measurement's trials: class, token count, streaming and GEMM GFLOP/s (one thread, best of 2).
    struct GemmTrial {
        int cls = 0, n_tok = 0;
        double stream_gflops = 0, gemm_gflops = 0;
    };
    std::vector<GemmTrial> gemm_trials;
    // F32's streaming kernel at one token (kernels.h g_f32_row_bytes): rows of at most f32_row_bytes
    // bytes a row at a time, longer ones in 4-row tiles (kEveryRowLength: every row a row at a time);
    // -1: none taken (the vendor's). rows_source as source ("config": [cpu] f32_stream_rows, "env":
    // STEWARD_STREAM_ROWS). A measurement's trials: per row length, GB/s of the F32 matvec over 32
    // MiB a row at a time and in tiles (one thread, best of 3).
    int64_t f32_row_bytes = -1;
    std::string rows_source = "default";
    struct RowsTrial {
        int64_t row_bytes = 0;
        double single_gbs = 0, tiles_gbs = 0;
    };
    std::vector<RowsTrial> rows_trials;
    // F16's and BF16's at one token where the kernels stream them a row at a time (kernels.h
    // g_half_row_bytes: the AVX-512 levels with stream_tile_rows() 1, AMD's), likewise, timed with
    // F16 over 32 MiB; -1: none taken. half_rows_source as rows_source ("config": [cpu]
    // half_stream_rows); "tiles" elsewhere (every row in tiles, nothing to time).
    int64_t half_row_bytes = -1;
    std::string half_rows_source = "default";
    std::vector<RowsTrial> half_rows_trials;
};

// The row lengths (bytes: 512 to 8192 F32 columns, 1024 to 16384 F16) the streaming rows are timed at.
inline constexpr int64_t kRowsCandidates[] = {2048, 4096, 8192, 16384, 32768};

// A row limit (F32's or the half types') from the trials (one per kRowsCandidates length, in order): the threshold that
// costs the trials least, each trial's time relative to its faster way (a row at a time below it,
// tiles from it on), so one noisy length does not move it far: 0 (tiles throughout), a candidate's
// length, or kEveryRowLength (a row at a time throughout); equal costs take the smaller limit.
int64_t row_bytes_from_trials(const std::vector<CpuPlan::RowsTrial>& trials);

// The token counts the crossover is measured at; a class whose streaming kernel wins at all of
// them takes the GEMM from kGemmFromPastCandidates on.
inline constexpr int kGemmCandidates[] = {8, 16, 24, 32, 48, 64};
inline constexpr int kGemmFromPastCandidates = 80;

// The GEMM's trial times count kGemmMargin times over: in a forward its per-call work (regrouping
// the tokens, one parallel_for more, smaller matrices than the trial's) weighs more than on the
// trial's matrix at one thread (Q8_0's int8 panel GEMM won its trial at 8 tokens by 15% and lost
// 8-token forwards by 8-16%).
inline constexpr double kGemmMargin = 1.1;

// The crossover from one class's trials (time per token count of either path): the threshold
// among the candidates (and kGemmFromPastCandidates) that minimises the summed time of the
// trials (the GEMM's times kGemmMargin), each relative to its faster path, so one noisy point does
// not move it far.
int gemm_from_trials(const std::vector<double>& stream_s, const std::vector<double>& gemm_s);

// The plan in use.
CpuPlan cpu_plan();

// Takes the plan once per process, before the first forward: prefetch_override > 0 ([cpu]
// prefetch_bytes) wins, then STEWARD_PREFETCH_BYTES, then the plan cached for this CPU model and
// kernel level (cpu_plan_cache_path), else a measurement (about 0.2 s; written to the cache, which a
// failure to write only logs). Later calls return the plan taken, unless an override differs.
// Distances outside [64, 65536] bytes are refused by the config reader; here they are clamped.
// The crossover likewise: gemm_override > 0 ([cpu] gemm_min_tokens) for every class, then
// STEWARD_GEMM_MIN_TOKENS, then the cache, else a measurement (about 0.3 s). F32's streaming rows
// likewise: rows_override 1 (every row a row at a time) or 4 (every row in tiles; [cpu]
// f32_stream_rows), then STEWARD_STREAM_ROWS, then the cache, else a measurement (about 0.1 s); the
// half types' with half_rows_override ([cpu] half_stream_rows) likewise. A measurement holds an
// exclusive lock (flock on the cache path + ".lock") and reads the cache again under it, so processes
// starting together on one machine take the first one's plan rather than measuring each its own.
CpuPlan start_cpu_plan(int prefetch_override = 0, int gemm_override = 0, int rows_override = 0, int half_rows_override = 0);

// Measures the candidates (1, 2, 4, 8 and 16 KiB; the crossover at kGemmCandidates) now, whatever
// is cached; sets and returns the best.
CpuPlan measure_cpu_plan();

// $STEWARD_CACHE_DIR, else $XDG_CACHE_HOME/steward, else $HOME/.cache/steward; plus "/cpu-plan.tsv"
// (one line per CPU model and kernel level: cpu_plan_level_key, model name, distance, the six
// classes' crossovers comma-separated, F32's row limit, the half types'; a line without them is
// measured again).
std::string cpu_plan_cache_path();

// The kernels a cached plan was measured on: raised when a kernel the plan times changes (2: the
// AVX2 level's int8 panel GEMM, 3 with the k-quants in it, 4 kGemmMargin, 5 its integer
// super-block sums, 6 the streaming kernels' prefetch of every line of a block, 7 the AVX2 level's
// F16 register tiles, 8 BF16 a class of its own, 9 the AVX2 level's tiled GEMM for F32, BF16 and
// F16 from 48 tokens, 10 its streaming kernels' 8-token tile, 11 the panel GEMM on the AVX-512
// levels, with dpbusd on avx512vnni, 12 BF16's pair GEMM with vdpbf16ps, 13 the panel GEMM's
// unsigned-weight dpbusd tiles and vector activation quantization, 14 F32's row limit, 15 the half
// types' row limit), so
// that a line of another revision is measured again rather than keeping a crossover timed against
// the old kernel.
inline constexpr int kCpuPlanRevision = 15;
// A cache line's first field: the kernel level and kCpuPlanRevision, "avx2/r10".
std::string cpu_plan_level_key();

// Tests: forgets the plan taken (the distance back to 4096), so the next start_cpu_plan takes it again.
void forget_cpu_plan();

// One line for reports: "prefetch 4096 bytes (measured: 1024 10.1, 2048 11.0, ... GB/s in 180 ms);
// gemm from 16 / 24 / 32 / 48 tokens (F32 / F16,BF16 / Q8_0.. / k-quants, measured)".
std::string describe_cpu_plan(const CpuPlan& p);

}  // namespace steward
