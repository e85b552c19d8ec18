// Small AVX2 helpers shared by the CPU kernels' bodies (kernels_body.inc, quant_dot_body.inc).
// Included by cpu/isa_variant.inc inside a level's namespace and target region, after
// <immintrin.h>; empty at levels without AVX2.
#pragma once
#ifdef STEWARD_ISA_AVX2

namespace simd {

// The sum of a vector's 8 lanes.
inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

// The 8 x 8 transpose of 32-bit lanes: r[i] lane g -> r[g] lane i.
inline void transpose8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {
            u[4 * i + h] = _mm256_unpacklo_epi64(t[4 * i + h], t[4 * i + 2 + h]);
            u[4 * i + 2 + h] = _mm256_unpackhi_epi64(t[4 * i + h], t[4 * i + 2 + h]);
        }
    // u[0] = rows 0-3 lanes (0,4), u[2] lanes (1,5), u[1] lanes (2,6), u[3] lanes (3,7); u[4..7] rows 4-7.
    const int order[4] = {0, 2, 1, 3};
    for (int g = 0; g < 4; g++) {
        r[g] = _mm256_permute2x128_si256(u[order[g]], u[4 + order[g]], 0x20);
        r[g + 4] = _mm256_permute2x128_si256(u[order[g]], u[4 + order[g]], 0x31);
    }
}

// The same transpose of 8 float vectors (the lanes moved as bits).
inline void transpose8(__m256 r[8]) {
    __m256i b[8];
    for (int i = 0; i < 8; i++) b[i] = _mm256_castps_si256(r[i]);
    transpose8_epi32(b);
    for (int i = 0; i < 8; i++) r[i] = _mm256_castsi256_ps(b[i]);
}

}  // namespace simd
#endif
