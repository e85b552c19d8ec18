// The CPU plan: the kernel choices that depend on the microarchitecture rather than the ISA, chosen
// by measuring them once per CPU model. Today one choice: how far ahead the int8 decode kernels
// prefetch their weight rows (Zen 4 / 5 and Intel's cores prefetch differently; the best distance
// on one is not the best on the other).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace steward {

struct CpuPlan {
    int prefetch_bytes = 4096;
    // "default" (no plan taken yet), "measured", "cached" (a measurement of this CPU model and kernel
    // level read back), "config" ([cpu] prefetch_bytes) or "env" (STEWARD_PREFETCH_BYTES).
    std::string source = "default";
    // A measurement's trials: (distance, GB/s of the decode matvec over 64 MiB of Q4_K and Q8_0 rows
    // together, one thread, best of 3).
    std::vector<std::pair<int, double>> trials;
    double measure_ms = 0;  // the measurement's wall time
};

// The plan in use.
CpuPlan cpu_plan();

// Takes the plan once per process, before the first forward: prefetch_override > 0 ([cpu]
// prefetch_bytes) wins, then STEWARD_PREFETCH_BYTES, then the plan cached for this CPU model and
// kernel level (cpu_plan_cache_path), else a measurement (about 0.2 s; written to the cache, which a
// failure to write only logs). Later calls return the plan taken, unless an override differs.
// Distances outside [64, 65536] bytes are refused by the config reader; here they are clamped.
CpuPlan start_cpu_plan(int prefetch_override = 0);

// Measures the candidates (1, 2, 4, 8 and 16 KiB) now, whatever is cached; sets and returns the best.
CpuPlan measure_cpu_plan();

// $STEWARD_CACHE_DIR, else $XDG_CACHE_HOME/steward, else $HOME/.cache/steward; plus "/cpu-plan.tsv"
// (one line per CPU model and kernel level: level, model name, distance).
std::string cpu_plan_cache_path();

// Tests: forgets the plan taken (the distance back to 4096), so the next start_cpu_plan takes it again.
void forget_cpu_plan();

// One line for reports: "prefetch 4096 bytes (measured: 1024 10.1, 2048 11.0, ... GB/s in 180 ms)".
std::string describe_cpu_plan(const CpuPlan& p);

}  // namespace steward
