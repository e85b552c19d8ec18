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

}  // namespace simd
#endif
