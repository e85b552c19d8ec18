// Which vector instructions this CPU (and its OS) offers, and which kernel level runs: the CPU
// kernels (kernels.h, quant_dot.h) are compiled side by side for every level and one is chosen
// here at start, from cpuid, as ggml's CPU variants are. STEWARD_CPU_LEVEL lowers it (tests).
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace steward {

// Ordered: each level includes the ones below it.
//   SCALAR       plain loops (the build's baseline, x86-64-v2)
//   AVX2         AVX2 + FMA + F16C (Haswell, Zen 1 and later)
//   AVX512       + AVX-512 F/BW/DQ/VL/CD (Skylake-X and later, Zen 4)
//   AVX512_VNNI  + AVX-512 VNNI (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4)
enum class CpuLevel : int { SCALAR = 0, AVX2 = 1, AVX512 = 2, AVX512_VNNI = 3 };
constexpr int kCpuLevelCount = 4;

struct CpuFeatures {
    std::string model_name;  // cpuid's brand string, e.g. "AMD EPYC 9R14 96-Core Processor"
    std::string vendor;      // cpuid leaf 0: "AuthenticAMD", "GenuineIntel", ...
    bool avx2 = false, fma = false, f16c = false;
    bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512cd = false;
    bool avx512vnni = false, avx512bf16 = false, amx_tile = false;
    bool os_ymm = false, os_zmm = false;  // the OS saves the 256- / 512-bit registers (XCR0)
};

// Read once; thread-safe.
const CpuFeatures& cpu_features();
// The highest level this CPU and OS support.
CpuLevel cpu_level_supported();
// The level the kernels run at: the supported one, or lower where STEWARD_CPU_LEVEL asks (read at
// the first kernel call; a value that names no level, or one above the supported level, is
// refused with a line on stderr naming the value and the choices, and the supported level runs).
CpuLevel cpu_level();
// Switches the kernels to `level` (tests comparing the levels on one machine). False, and no
// change, where the CPU does not support it. Not synchronised with running kernels.
bool set_cpu_level(CpuLevel level);

// "scalar", "avx2", "avx512", "avx512vnni".
const char* cpu_level_name(CpuLevel level);
// The inverse of cpu_level_name (case-insensitive; "avx512_vnni" also accepted).
std::optional<CpuLevel> parse_cpu_level(std::string_view name);

}  // namespace steward
