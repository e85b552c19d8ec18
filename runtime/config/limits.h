// Limits on what input may make Steward allocate or start (threads, batch sizes, KV bytes, file
// sizes), shared by the config, `generate` and the workload loader, and the one way to read a file
// given by a user: regular files only, opened without blocking, with a size cap.
#pragma once
#include <cstdint>
#include <string>

#include <steward/expected.h>

namespace steward {

// Caps that hold whatever the machine: a value past them is a typo, never a plan.
inline constexpr int64_t k_max_kv_blocks = int64_t(1) << 24;       // per pool
inline constexpr int64_t k_max_batch = 4096;                       // sequences per step
inline constexpr int64_t k_max_batch_tokens = int64_t(1) << 16;    // tokens per step
inline constexpr int64_t k_max_queue = int64_t(1) << 20;           // waiting requests per pool
inline constexpr double k_max_ms = 1e9;                            // timeouts, TTLs, arrivals (~11.6 days)
inline constexpr int64_t k_max_config_bytes = int64_t(16) << 20;   // a TOML config
inline constexpr int64_t k_max_workload_bytes = int64_t(1) << 30;  // a JSONL workload

// The machine's logical cores (at least 1).
int n_cores();
// Threads a pool or `generate` may ask for: 4 x the cores. More only oversubscribes the machine and,
// past a few thousand, fails to start with std::system_error; so more is refused, not clamped (a
// config that names 64 threads on a 2-core machine is a config for another machine).
int max_threads();
// Threads n, 0 meaning all cores: an error naming `what`, n and the cap when n < 0 or n > max_threads().
Expected<bool> check_threads(int64_t n, const std::string& what);

// Physical memory of the machine in bytes (sysconf); 0 when unknown (then nothing is refused).
int64_t physical_memory_bytes();
// An error when `bytes` (what `what` would allocate) exceed the physical memory; `fix` says what
// to lower.
Expected<bool> check_memory(double bytes, const std::string& what, const std::string& fix);

// Reads a whole file that must be a regular file of at most max_bytes. Opened with O_NONBLOCK so a
// FIFO or a device never blocks; /dev/zero (even through a symlink) is refused as not regular
// before a byte is read. `what` names the kind of file in the error ("config", "workload file").
Expected<std::string> read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what);

}  // namespace steward
