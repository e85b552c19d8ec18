// The GPU tests' main: without a usable CUDA device the binary runs nothing and exits 77, which
// ctest (SKIP_RETURN_CODE 77) reports as Skipped, never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "gpu/device.h"

int main(int argc, char** argv) {
    const steward::GpuInfo g = steward::gpu_probe();
    if (g.status != steward::GpuProbeStatus::GPU_PROBE_OK) {
        std::printf("SKIPPED: %s\n", steward::gpu_describe(g).c_str());
        return 77;
    }
    std::printf("device: %s\n", steward::gpu_describe(g).c_str());
    return Catch::Session().run(argc, argv);
}
