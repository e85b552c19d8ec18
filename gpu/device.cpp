// gpu_probe: cudaGetDeviceCount's answer sorted into no driver / no device / a device, and the
// device's name, memory and peak bandwidth.
#include "gpu/device.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace steward {

GpuInfo gpu_probe() {
    GpuInfo g;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        g.status = e == cudaErrorNoDevice             ? GpuProbeStatus::GPU_PROBE_NO_DEVICE
                   : e == cudaErrorInsufficientDriver ? GpuProbeStatus::GPU_PROBE_NO_DRIVER
                                                      : GpuProbeStatus::GPU_PROBE_ERROR;
        g.message = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
        cudaGetLastError();  // the runtime keeps the failure sticky for the next caller otherwise
        return g;
    }
    if (n == 0) {
        g.message = "cudaGetDeviceCount found 0 devices";
        return g;
    }
    g.n_devices = n;
    cudaDeviceProp prop{};
    if (const cudaError_t pe = cudaGetDeviceProperties(&prop, 0); pe != cudaSuccess) {
        g.status = GpuProbeStatus::GPU_PROBE_ERROR;
        g.message = std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(pe);
        return g;
    }
    g.name = prop.name;
    g.cc_major = prop.major;
    g.cc_minor = prop.minor;
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    g.peak_bandwidth_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    size_t free_b = 0, total_b = 0;
    if (const cudaError_t me = cudaMemGetInfo(&free_b, &total_b); me != cudaSuccess) {
        g.status = GpuProbeStatus::GPU_PROBE_ERROR;
        g.message = std::string("cudaMemGetInfo: ") + cudaGetErrorString(me);
        return g;
    }
    g.free_bytes = (int64_t)free_b;
    g.total_bytes = (int64_t)total_b;
    g.status = GpuProbeStatus::GPU_PROBE_OK;
    return g;
}

std::string gpu_describe(const GpuInfo& g) {
    if (g.status != GpuProbeStatus::GPU_PROBE_OK) return "no usable CUDA device (" + g.message + ")";
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB, %.0f GB/s peak)", g.name.c_str(), g.cc_major, g.cc_minor,
                  g.total_bytes / 1073741824.0, g.peak_bandwidth_gbs);
    return buf;
}

}  // namespace steward
