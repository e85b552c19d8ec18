// CPU feature detection (runtime/cpu/cpu_features.h) against the kernel's own view of the CPU
// (/proc/cpuinfo's flags), and the level names the STEWARD_CPU_LEVEL variable takes.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "cpu/cpu_features.h"

using namespace steward;

namespace {

// The flags of the first processor in /proc/cpuinfo; empty where it cannot be read.
std::set<std::string> proc_cpuinfo_flags() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0) {
            std::istringstream words(line.substr(line.find(':') + 1));
            std::set<std::string> flags;
            for (std::string w; words >> w;) flags.insert(w);
            return flags;
        }
    return {};
}

}  // namespace

TEST_CASE("cpuid's features agree with the kernel's /proc/cpuinfo flags", "[dispatch]") {
    const auto flags = proc_cpuinfo_flags();
    if (flags.empty()) {
        WARN("/proc/cpuinfo has no flags line here: nothing to compare");
        return;
    }
    const CpuFeatures& f = cpu_features();
    // The kernel hides a feature whose register state the OS does not save, as cpu_level does.
    CHECK((f.avx2 && f.os_ymm) == (flags.count("avx2") == 1));
    CHECK(f.fma == (flags.count("fma") == 1));
    CHECK(f.f16c == (flags.count("f16c") == 1));
    CHECK((f.avx512f && f.os_zmm) == (flags.count("avx512f") == 1));
    CHECK((f.avx512bw && f.os_zmm) == (flags.count("avx512bw") == 1));
    CHECK((f.avx512vl && f.os_zmm) == (flags.count("avx512vl") == 1));
    CHECK((f.avx512vnni && f.os_zmm) == (flags.count("avx512_vnni") == 1));
    const bool avx2_level = flags.count("avx2") && flags.count("fma") && flags.count("f16c");
    const bool avx512_level = avx2_level && flags.count("avx512f") && flags.count("avx512bw") &&
                              flags.count("avx512dq") && flags.count("avx512vl") && flags.count("avx512cd");
    const CpuLevel want = !avx2_level        ? CpuLevel::SCALAR
                          : !avx512_level    ? CpuLevel::AVX2
                          : flags.count("avx512_vnni") ? CpuLevel::AVX512_VNNI
                                                       : CpuLevel::AVX512;
    CHECK(cpu_level_supported() == want);
    CHECK_FALSE(f.model_name.empty());
}

TEST_CASE("kernel level names round-trip and unknown names are refused", "[dispatch]") {
    for (int i = 0; i < kCpuLevelCount; i++) CHECK(parse_cpu_level(cpu_level_name((CpuLevel)i)) == (CpuLevel)i);
    CHECK(parse_cpu_level("AVX2") == CpuLevel::AVX2);
    CHECK(parse_cpu_level("avx512_vnni") == CpuLevel::AVX512_VNNI);
    CHECK_FALSE(parse_cpu_level("sse4"));
    CHECK_FALSE(parse_cpu_level(""));
    CHECK(cpu_level() <= cpu_level_supported());
}
