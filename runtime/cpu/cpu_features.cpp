// CPU feature detection (cpuid + xgetbv) for the kernel dispatch (cpu/dispatch.cpp).
#include "cpu/cpu_features.h"

#include <cpuid.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>

namespace steward {

namespace {

bool bit(uint32_t v, int b) { return (v >> b) & 1u; }

uint64_t xcr0() {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

std::string brand_string() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0x80000000u, &a, &b, &c, &d) == 0 || a < 0x80000004u) return "unknown x86-64";
    char s[49] = {};
    for (unsigned leaf = 0; leaf < 3; leaf++) {
        __get_cpuid(0x80000002u + leaf, &a, &b, &c, &d);
        const unsigned regs[4] = {a, b, c, d};
        std::memcpy(s + 16 * leaf, regs, 16);
    }
    std::string out(s);
    const auto first = out.find_first_not_of(' ');
    out = first == std::string::npos ? std::string() : out.substr(first);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out.empty() ? "unknown x86-64" : out;
}

CpuFeatures detect() {
    CpuFeatures f;
    f.model_name = brand_string();
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) != 0) {
        const unsigned regs[3] = {b, d, c};
        char v[13] = {};
        std::memcpy(v, regs, 12);
        f.vendor = v;
    }
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
    const bool osxsave = bit(c, 27), avx = bit(c, 28);
    f.fma = bit(c, 12);
    f.f16c = bit(c, 29);
    if (osxsave && avx) {
        const uint64_t x = xcr0();
        f.os_ymm = (x & 0x6) == 0x6;     // SSE + AVX state
        f.os_zmm = (x & 0xe6) == 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) {
        f.avx2 = bit(b, 5);
        f.avx512f = bit(b, 16);
        f.avx512dq = bit(b, 17);
        f.avx512cd = bit(b, 28);
        f.avx512bw = bit(b, 30);
        f.avx512vl = bit(b, 31);
        f.avx512vnni = bit(c, 11);
        f.amx_tile = bit(d, 24);
        unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0) f.avx512bf16 = bit(a1, 5);
    }
    return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

CpuLevel cpu_level_supported() {
    const CpuFeatures& f = cpu_features();
    if (!(f.os_ymm && f.avx2 && f.fma && f.f16c)) return CpuLevel::SCALAR;
    if (!(f.os_zmm && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512cd)) return CpuLevel::AVX2;
    return f.avx512vnni ? CpuLevel::AVX512_VNNI : CpuLevel::AVX512;
}

const char* cpu_level_name(CpuLevel level) {
    switch (level) {
        case CpuLevel::SCALAR: return "scalar";
        case CpuLevel::AVX2: return "avx2";
        case CpuLevel::AVX512: return "avx512";
        case CpuLevel::AVX512_VNNI: return "avx512vnni";
    }
    return "?";
}

std::optional<CpuLevel> parse_cpu_level(std::string_view name) {
    std::string s(name);
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return (char)std::tolower(ch); });
    if (s == "avx512_vnni") s = "avx512vnni";
    for (int i = 0; i < kCpuLevelCount; i++)
        if (s == cpu_level_name((CpuLevel)i)) return (CpuLevel)i;
    return std::nullopt;
}

}  // namespace steward
