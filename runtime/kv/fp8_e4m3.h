// FP8 E4M3 (the OCP "fn" variant, CUDA's __nv_fp8_e4m3): the KV cache's fp8 element type. One
// conversion for both sides: the CUDA kernels (gpu/kernels.cu) compile these same functions, so the
// plain C++ build is their twin bit for bit. Sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities; S.1111.111 is NaN; the largest finite value is 448, the smallest subnormal 2^-9.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define STEWARD_HOST_DEVICE __host__ __device__
#else
#define STEWARD_HOST_DEVICE
#endif

namespace steward {

constexpr float kFp8E4m3Max = 448.0f;

// Round to nearest even; magnitudes past 448 (infinities too) saturate to +-448 (CUDA's
// __NV_SATFINITE), NaN stays NaN (0x7f with the sign).
STEWARD_HOST_DEVICE inline uint8_t fp8_e4m3_from_f32(float x) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return (uint8_t)(sign | 0x7f);
    const float a = std::fabs(x);
    if (a >= kFp8E4m3Max) return (uint8_t)(sign | 0x7e);
    if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (a code of 8 is 2^-6, the first normal)
        return (uint8_t)(sign | (uint8_t)std::rint(a * 512.0f));
    }
    int e2 = 0;
    const float f = std::frexp(a, &e2);       // a = f * 2^e2, f in [0.5, 1)
    int e = e2 - 1;                           // a = (1 + m / 8) * 2^e, e in [-6, 8]
    int m = (int)std::rint((f * 2.0f - 1.0f) * 8.0f);  // exact scaling, then the one rounding
    if (m == 8) m = 0, e++;
    return (uint8_t)(sign | (uint8_t)((e + 7) << 3) | (uint8_t)m);
}

STEWARD_HOST_DEVICE inline float fp8_e4m3_to_f32(uint8_t c) {
    const int e = (c >> 3) & 0x0f, m = c & 0x07;
    float v;
    if (e == 0x0f && m == 0x07) v = NAN;
    else if (e == 0) v = std::ldexp((float)m, -9);
    else v = std::ldexp(1.0f + (float)m / 8.0f, e - 7);
    return (c & 0x80) ? -v : v;
}

}  // namespace steward
