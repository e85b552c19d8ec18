// Finding a CUDA device at run time: whether this process can use one, and what it is. Plain C++
// over the CUDA runtime (built only where nvcc was found; see gpu/CMakeLists.txt).
#pragma once
#include <cstdint>
#include <string>

#include <steward/expected.h>

namespace steward {

enum class GpuProbeStatus {
    GPU_PROBE_OK,
    GPU_PROBE_NO_DEVICE,  // cudaErrorNoDevice, or a count of 0
    GPU_PROBE_NO_DRIVER,  // cudaErrorInsufficientDriver (no driver, or one older than the runtime)
    GPU_PROBE_ERROR,      // anything else: message says what
};

struct GpuInfo {
    GpuProbeStatus status = GpuProbeStatus::GPU_PROBE_NO_DEVICE;
    std::string message;        // for a status other than OK: why, in the runtime's words
    int n_devices = 0;
    std::string name;           // device 0
    int cc_major = 0, cc_minor = 0;
    int64_t total_bytes = 0, free_bytes = 0;
    double peak_bandwidth_gbs = 0;  // 2 (DDR) * memory clock * bus width, from the device attributes
};

// Probes device 0 once per call (cheap after the first: the runtime caches its initialisation).
// Never fails: a missing driver or device is a status, not an error. Thread-safe.
GpuInfo gpu_probe();

// One line for a log: "NVIDIA H200 (sm_90, 139.8 GiB, 4800 GB/s peak)" or why there is none.
std::string gpu_describe(const GpuInfo& info);

}  // namespace steward
