// Integer dot products of block-quantized weights with 8-bit activations (cpu/quant_dot.h). Each
// type has a scalar twin (plain loops over the layouts of model/quants.h) and an AVX2 kernel
// templated on VNNI: the same integer sums per block, then one float multiply-add per block.
#include "cpu/quant_dot.h"
#include "cpu/simd.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define STEWARD_QD_AVX2 1
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define STEWARD_QD_VNNI 1
#endif
// 64-byte kernels for the k-quants of the llama-quantize mixes (Q4_K, Q5_K, Q6_K).
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define STEWARD_QD_AVX512 1
#endif
#endif
// GCC 12's AVX-512 headers warn about their own _mm*_undefined_*() (GCC PR 105593, fixed in 13).
#if defined(STEWARD_QD_AVX512) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace steward {

namespace {

using DotFn = float (*)(const void* w, const void* a, int64_t n);

bool is_k_type(GgmlType t) { return quant_block_elems(t) == kQKK; }

// --- activation quantization -----------------------------------------------------------------

// Scale max|x| / 127 and round to nearest: |x - d q| <= d / 2 and |q| <= 127, which keeps every
// maddubs pair sum below 2^15 (at most 2 * 128 * 127).
float quantize_block(const float* x, int n, int8_t* q) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++) {
        const float v = std::nearbyint(x[j] * id);
        q[j] = (int8_t)std::max(-127.0f, std::min(127.0f, v));
    }
    return d;
}

void quantize_act32(const float* x, int64_t n, ActBlock32* out) {
    for (int64_t b = 0; b < n / kQK; b++, x += kQK) {
        out[b].d = quantize_block(x, kQK, out[b].qs);
        int32_t s = 0;
        for (int j = 0; j < kQK; j++) s += out[b].qs[j];
        out[b].sum = s;
    }
}

void quantize_act256(const float* x, int64_t n, ActBlock256* out) {
    for (int64_t b = 0; b < n / kQKK; b++, x += kQKK) {
        out[b].d = quantize_block(x, kQKK, out[b].qs);
        for (int i = 0; i < kQKK / 16; i++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += out[b].qs[16 * i + j];
            out[b].bsums[i] = (int16_t)s;
        }
    }
}

// --- scale decoding shared by both paths -------------------------------------------------------

// Little-endian words (GGUF's byte order and x86's): memcpy compiles to one load or store, where
// GCC 12 leaves a byte-by-byte shift-and-or in the decode kernels' hot loop.
static_assert(std::endian::native == std::endian::little, "the block layouts are read as little-endian words");
[[gnu::always_inline]] inline uint32_t read_u32(const uint8_t p[4]) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
[[gnu::always_inline]] inline void write_u32(uint8_t p[4], uint32_t v) { std::memcpy(p, &v, 4); }

// Q4_K / Q5_K: 8 6-bit scales and mins packed in 12 bytes (layout in model/quants.h), unpacked
// four at a time in 32-bit words: scales and mins of sub-blocks 0-3 are the low 6 bits of bytes
// 0-3 and 4-7; those of 4-7 are the nibbles of bytes 8-11 with the top 2 bits of bytes 0-3 / 4-7.
[[gnu::always_inline]] inline void q4k_scales_mins(const uint8_t s[12], uint8_t sc[8], uint8_t m[8]) {
    const uint32_t u0 = read_u32(s), u1 = read_u32(s + 4), u2 = read_u32(s + 8);
    write_u32(sc, u0 & 0x3f3f3f3f);
    write_u32(m, u1 & 0x3f3f3f3f);
    write_u32(sc + 4, (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4);
    write_u32(m + 4, ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4);
}

// Q3_K: 16 6-bit scales, 32 above their value (layout in model/quants.h): scale k's low 4 bits
// are the low nibbles of bytes 0-7 (k < 8) or their high nibbles (k >= 8), its high 2 bits are
// bits 2 (k / 4) of byte 8 + k % 4; so word j takes its high bits from bytes 8-11 shifted by 2 j.
void q3k_scales_biased(const uint8_t s[12], uint8_t sc[16]) {
    const uint32_t a0 = read_u32(s), a1 = read_u32(s + 4), hb = read_u32(s + 8);
    const uint32_t lo[4] = {a0 & 0x0f0f0f0f, a1 & 0x0f0f0f0f, (a0 >> 4) & 0x0f0f0f0f, (a1 >> 4) & 0x0f0f0f0f};
    for (int j = 0; j < 4; j++) write_u32(sc + 4 * j, lo[j] | ((hb >> (2 * j)) & 0x03030303) << 4);
}

int iq4xs_scale(const BlockIq4Xs& b, int sub) {
    const int lo = (b.scales_l[sub / 2] >> (4 * (sub % 2))) & 0x0f;
    const int hi = (b.scales_h >> (2 * sub)) & 3;
    return (lo | hi << 4) - 32;
}


// --- scalar twins ----------------------------------------------------------------------------

// Legacy types: the integer sum of code * activation code per block, with the offset (-8, -16)
// or the min (m * sum of activations) applied through the block's activation sum.
template <typename Block, int kOffset, bool kMin, int kHighBit>
float dot_legacy_scalar(const void* wv, const void* av, int64_t n) {
    const Block* w = static_cast<const Block*>(wv);
    const ActBlock32* a = static_cast<const ActBlock32*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQK; b++) {
        uint32_t qh = 0;
        if constexpr (kHighBit) qh = read_u32(w[b].qh);
        int32_t isum = 0;
        for (int j = 0; j < kQK / 2; j++) {
            const int q0 = (w[b].qs[j] & 0x0f) | (kHighBit ? ((qh >> j) & 1) << 4 : 0);
            const int q1 = (w[b].qs[j] >> 4) | (kHighBit ? ((qh >> (j + 16)) & 1) << 4 : 0);
            isum += q0 * a[b].qs[j] + q1 * a[b].qs[j + 16];
        }
        const float dx = a[b].d;
        if constexpr (kMin) {
            s += f16_to_f32(w[b].d) * dx * (float)isum + f16_to_f32(w[b].m) * dx * (float)a[b].sum;
        } else {
            s += f16_to_f32(w[b].d) * dx * (float)(isum - kOffset * a[b].sum);
        }
    }
    return s;
}

float dot_q8_0_scalar(const void* wv, const void* av, int64_t n) {
    const BlockQ8_0* w = static_cast<const BlockQ8_0*>(wv);
    const ActBlock32* a = static_cast<const ActBlock32*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < kQK; j++) isum += w[b].qs[j] * a[b].qs[j];
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return s;
}

float dot_iq4_nl_scalar(const void* wv, const void* av, int64_t n) {
    const BlockIq4Nl* w = static_cast<const BlockIq4Nl*>(wv);
    const ActBlock32* a = static_cast<const ActBlock32*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQK; b++) {
        int32_t isum = 0;
        for (int j = 0; j < kQK / 2; j++)
            isum += kValuesIq4nl[w[b].qs[j] & 0x0f] * a[b].qs[j] + kValuesIq4nl[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return s;
}

// Q2_K and Q3_K share the code order: element 32 s + 16 t + l of half h is the 2-bit field at
// shift 2 s of qs[32 h + 16 t + l]; its sub-block of 16 is 8 h + 2 s + t.
float dot_q2_k_scalar(const void* wv, const void* av, int64_t n) {
    const BlockQ2_K* w = static_cast<const BlockQ2_K*>(wv);
    const ActBlock256* a = static_cast<const ActBlock256*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQKK; b++) {
        int32_t isum = 0, msum = 0;
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int t = 0; t < 2; t++) {
                    const int sub = 8 * h + 2 * sh + t;
                    int32_t p = 0;
                    for (int l = 0; l < 16; l++)
                        p += ((w[b].qs[32 * h + 16 * t + l] >> (2 * sh)) & 3) * a[b].qs[16 * sub + l];
                    isum += (w[b].scales[sub] & 0x0f) * p;
                    msum += (w[b].scales[sub] >> 4) * a[b].bsums[sub];
                }
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum - f16_to_f32(w[b].dmin) * a[b].d * (float)msum;
    }
    return s;
}

float dot_q3_k_scalar(const void* wv, const void* av, int64_t n) {
    const BlockQ3_K* w = static_cast<const BlockQ3_K*>(wv);
    const ActBlock256* a = static_cast<const ActBlock256*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQKK; b++) {
        uint8_t sc[16];
        q3k_scales_biased(w[b].scales, sc);
        int32_t isum = 0;
        for (int h = 0; h < 2; h++)
            for (int sh = 0; sh < 4; sh++)
                for (int t = 0; t < 2; t++) {
                    const int sub = 8 * h + 2 * sh + t;
                    int32_t p = 0;
                    for (int l = 0; l < 16; l++) {
                        const int lo = (w[b].qs[32 * h + 16 * t + l] >> (2 * sh)) & 3;
                        const int hi = (w[b].hmask[16 * t + l] >> (4 * h + sh)) & 1;
                        p += (lo | hi << 2) * a[b].qs[16 * sub + l];
                    }
                    isum += (sc[sub] - 32) * (p - 4 * a[b].bsums[sub]);  // q3 - 4: "no -4" where hbit set
                }
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return s;
}

template <bool kFifthBit>
float dot_q45_k_scalar(const void* wv, const void* av, int64_t n) {
    using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
    const Block* w = static_cast<const Block*>(wv);
    const ActBlock256* a = static_cast<const ActBlock256*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQKK; b++) {
        uint8_t sc[8], m[8];
        q4k_scales_mins(w[b].scales, sc, m);
        int32_t isum = 0, msum = 0;
        for (int sub = 0; sub < 8; sub++) {
            const uint8_t* q = w[b].qs + 32 * (sub / 2);
            int32_t p = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> (4 * (sub % 2))) & 0x0f;
                if constexpr (kFifthBit) v |= ((w[b].qh[l] >> sub) & 1) << 4;
                p += v * a[b].qs[32 * sub + l];
            }
            isum += sc[sub] * p;
            msum += m[sub] * (a[b].bsums[2 * sub] + a[b].bsums[2 * sub + 1]);
        }
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum - f16_to_f32(w[b].dmin) * a[b].d * (float)msum;
    }
    return s;
}

// Q6_K: element 32 r + l of half h: low 4 bits from ql[64 h + l + 32 (r % 2)] (nibble r / 2),
// high 2 bits from qh[32 h + l] (shift 2 r); sub-block 8 h + 2 r + l / 16.
float dot_q6_k_scalar(const void* wv, const void* av, int64_t n) {
    const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
    const ActBlock256* a = static_cast<const ActBlock256*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQKK; b++) {
        int32_t isum = 0;
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < 2; t++) {
                    const int sub = 8 * h + 2 * r + t;
                    int32_t p = 0;
                    for (int l = 16 * t; l < 16 * t + 16; l++) {
                        const int lo = (w[b].ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0f;
                        const int hi = (w[b].qh[32 * h + l] >> (2 * r)) & 3;
                        p += (lo | hi << 4) * a[b].qs[128 * h + 32 * r + l];
                    }
                    isum += w[b].scales[sub] * (p - 32 * a[b].bsums[sub]);
                }
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return s;
}

float dot_iq4_xs_scalar(const void* wv, const void* av, int64_t n) {
    const BlockIq4Xs* w = static_cast<const BlockIq4Xs*>(wv);
    const ActBlock256* a = static_cast<const ActBlock256*>(av);
    float s = 0.0f;
    for (int64_t b = 0; b < n / kQKK; b++) {
        int32_t isum = 0;
        for (int sub = 0; sub < 8; sub++) {
            const uint8_t* q = w[b].qs + 16 * sub;
            const int8_t* x = a[b].qs + 32 * sub;
            int32_t p = 0;
            for (int j = 0; j < 16; j++) p += kValuesIq4nl[q[j] & 0x0f] * x[j] + kValuesIq4nl[q[j] >> 4] * x[j + 16];
            isum += iq4xs_scale(w[b], sub) * p;
        }
        s += f16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return s;
}

DotFn scalar_fn(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0: return dot_legacy_scalar<BlockQ4_0, 8, false, 0>;
        case GgmlType::Q4_1: return dot_legacy_scalar<BlockQ4_1, 0, true, 0>;
        case GgmlType::Q5_0: return dot_legacy_scalar<BlockQ5_0, 16, false, 1>;
        case GgmlType::Q5_1: return dot_legacy_scalar<BlockQ5_1, 0, true, 1>;
        case GgmlType::Q8_0: return dot_q8_0_scalar;
        case GgmlType::IQ4_NL: return dot_iq4_nl_scalar;
        case GgmlType::Q2_K: return dot_q2_k_scalar;
        case GgmlType::Q3_K: return dot_q3_k_scalar;
        case GgmlType::Q4_K: return dot_q45_k_scalar<false>;
        case GgmlType::Q5_K: return dot_q45_k_scalar<true>;
        case GgmlType::Q6_K: return dot_q6_k_scalar;
        case GgmlType::IQ4_XS: return dot_iq4_xs_scalar;
        default: return nullptr;
    }
}

// --- AVX2 / VNNI ------------------------------------------------------------------------------

#ifdef STEWARD_QD_AVX2
#ifdef STEWARD_QD_VNNI
constexpr bool kHaveVnni = true;
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_dpbusd_epi32(acc, u, s);
#endif
}
#else
constexpr bool kHaveVnni = false;
inline __m256i dpbusd(__m256i acc, __m256i, __m256i) { return acc; }  // never called
#endif

using simd::hsum;

// The NT activation rows of a multi-token kernel (acts + t * act_bytes), as blocks of Act.
template <typename Act, int NT>
struct ActRows {
    const Act* row[NT];
    ActRows(const uint8_t* acts, size_t act_bytes) {
        for (int t = 0; t < NT; t++) row[t] = reinterpret_cast<const Act*>(acts + t * act_bytes);
    }
    const Act* operator[](int t) const { return row[t]; }
};

// Weight rows stream from memory once per matmul: asking for the bytes kPrefetchBytes ahead of the
// block being read hides part of the latency the hardware prefetcher leaves (rows are contiguous,
// so this runs on into the next row).
constexpr int kPrefetchBytes = 4096;  // measured best of 0.25-8 KiB on 128 MB matvecs: about 2x at 1 thread
template <typename Block>
[[gnu::always_inline]] inline void prefetch_ahead(const Block* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// A 16-bit logical right shift by a count known only at run time (unrolled loops make it constant).
inline __m256i srl16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// bsums[k] * sc[k] for the 16 sub-blocks of a super-block, as 8 i32 partial sums (sc: 16 signed
// bytes). The offset and min terms of the k-quants, without a scalar loop.
inline __m256i bsums_times(const int16_t* bsums, __m128i sc) {
    return _mm256_madd_epi16(load32(bsums), _mm256_cvtepi8_epi16(sc));
}

// u (unsigned bytes) times s (signed bytes), each i32 lane the sum of 4 neighbouring products.
// Without VNNI, maddubs's i16 pair sums stay below 2^15 because |s| <= 127 and u <= 128 here.
template <bool V>
inline __m256i dot_us(__m256i u, __m256i s) {
    if constexpr (V && kHaveVnni) return dpbusd(_mm256_setzero_si256(), u, s);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// A per-lane integer scale for dot_us_scaled: lo for bytes 0-15, hi for bytes 16-31.
inline __m256i scales_of(int lo, int hi) {
    return _mm256_setr_m128i(_mm_set1_epi16((short)lo), _mm_set1_epi16((short)hi));
}
// With a scale, maddubs then madd by the scale (3 uops) on every path: VNNI's dpbusd would need a
// mullo_epi32 after it (2 more uops, 10 cycles' latency), measured slower on the k-quants. So the
// scaled kernels (the k-quants, IQ4_XS) are the same code on the AVX2 and VNNI paths.
inline __m256i dot_us_scaled(__m256i u, __m256i s, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc);
}

// 16 bytes of legacy nibbles to 32 codes in element order (low nibbles, then high nibbles).
inline __m256i nibbles32(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_setr_m128i(q, _mm_srli_epi16(q, 4)), _mm256_set1_epi8(0x0f));
}
// Bit j of x to byte j: 0x10 where set (the 5th bit of Q5_0 / Q5_1 codes).
inline __m256i fifth_bits(uint32_t x) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)x),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}
inline __m256i iq4_table() {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesIq4nl)));
}


// The 2-bit field at shift 2 s of each byte (Q2_K / Q3_K order, see the scalar twin). The 16-bit
// shift moves the neighbour byte's bits in from above only, and the mask drops them.
inline __m256i two_bits(__m256i q, int s) { return _mm256_and_si256(srl16(q, 2 * s), _mm256_set1_epi8(3)); }

// The kernels read a weight row once for NT tokens (the few-token case of speculation's verify
// and batched decode): codes are unpacked once, then dotted with every token's activations
// (acts + t * act_bytes); signed codes (Q8_0, IQ4_*) as |w| times x with w's sign. NT = 1 is the single-token dot, with the same float
// operations in the same order per token, so every NT gives each token the same result.
template <typename Block, int kOffset, bool kMin, int kHighBit, bool V, int NT>
void legacy_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const Block* w = static_cast<const Block*>(wv);
    const ActBlock32* a[NT];
    __m256 acc[NT];
    float side[NT];  // the offset or min term, summed over blocks
    for (int t = 0; t < NT; t++) {
        a[t] = reinterpret_cast<const ActBlock32*>(acts + t * act_bytes);
        acc[t] = _mm256_setzero_ps();
        side[t] = 0.0f;
    }
    for (int64_t b = 0; b < n / kQK; b++) {
        prefetch_ahead(w + b);
        __m256i q = nibbles32(w[b].qs);
        if constexpr (kHighBit) q = _mm256_or_si256(q, fifth_bits(read_u32(w[b].qh)));
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++) {
            const float dd = dw * a[t][b].d;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(dot_us<V>(q, load32(a[t][b].qs))), acc[t]);
            if constexpr (kMin)
                side[t] += _cvtsh_ss(w[b].m) * a[t][b].d * (float)a[t][b].sum;
            else
                side[t] -= dd * (float)(kOffset * a[t][b].sum);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]) + side[t];
}

template <bool V, int NT>
void iq4_nl_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockIq4Nl* w = static_cast<const BlockIq4Nl*>(wv);
    const ActRows<ActBlock32, NT> a(acts, act_bytes);
    __m256 acc[NT] = {};
    const __m256i table = iq4_table();
    for (int64_t b = 0; b < n / kQK; b++) {
        prefetch_ahead(w + b);
        const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[b].qs));
        const __m256i av = _mm256_abs_epi8(v);
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++) {
            const __m256i p = dot_us<V>(av, _mm256_sign_epi8(load32(a[t][b].qs), v));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

template <bool V, int NT>
void q2_k_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockQ2_K* w = static_cast<const BlockQ2_K*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {}, mins[NT] = {};
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        const uint8_t* sc = w[b].scales;
        const __m128i m = _mm_and_si128(_mm_srli_epi16(load16(sc), 4), _mm_set1_epi8(0x0f));
        const float dw = _cvtsh_ss(w[b].d), dmw = _cvtsh_ss(w[b].dmin);
        __m256i isum[NT];
        for (int t = 0; t < NT; t++) {
            mins[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmw * a[t][b].d),
                                      _mm256_cvtepi32_ps(bsums_times(a[t][b].bsums, m)), mins[t]);
            isum[t] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
            const __m256i q = load32(w[b].qs + 32 * h);
            for (int s = 0; s < 4; s++) {
                const int sub = 8 * h + 2 * s;
                const __m256i q2 = two_bits(q, s);
                const __m256i scale = scales_of(sc[sub] & 0x0f, sc[sub + 1] & 0x0f);
                for (int t = 0; t < NT; t++)
                    isum[t] = _mm256_add_epi32(isum[t], dot_us_scaled(q2, load32(a[t][b].qs + 16 * sub), scale));
            }
        }
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(_mm256_sub_ps(acc[t], mins[t]));
}

template <bool V, int NT>
void q3_k_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockQ3_K* w = static_cast<const BlockQ3_K*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {};
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        alignas(16) uint8_t biased[16];
        alignas(16) int8_t sc[16];
        q3k_scales_biased(w[b].scales, biased);
        const __m128i scv = _mm_sub_epi8(load16(biased), _mm_set1_epi8(32));
        _mm_store_si128(reinterpret_cast<__m128i*>(sc), scv);
        const __m256i hm = load32(w[b].hmask);
        // The "- 4" of every code: 4 * sum of scale * activation sums.
        __m256i isum[NT];
        for (int t = 0; t < NT; t++)
            isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bsums_times(a[t][b].bsums, scv), 2));
        for (int h = 0; h < 2; h++) {
            const __m256i q = load32(w[b].qs + 32 * h);
            for (int s = 0; s < 4; s++) {
                const int sub = 8 * h + 2 * s;
                const __m256i hb = _mm256_and_si256(srl16(hm, 4 * h + s), _mm256_set1_epi8(1));
                const __m256i q3 = _mm256_or_si256(two_bits(q, s), _mm256_slli_epi16(hb, 2));
                const __m256i scale = scales_of(sc[sub], sc[sub + 1]);
                for (int t = 0; t < NT; t++)
                    isum[t] = _mm256_add_epi32(isum[t], dot_us_scaled(q3, load32(a[t][b].qs + 16 * sub), scale));
            }
        }
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

template <bool V, int NT>
void q8_0_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockQ8_0* w = static_cast<const BlockQ8_0*>(wv);
    const ActRows<ActBlock32, NT> a(acts, act_bytes);
    __m256 acc[NT] = {};
    for (int64_t b = 0; b < n / kQK; b++) {
        prefetch_ahead(w + b);
        const __m256i q = load32(w[b].qs);
        const __m256i aq = _mm256_abs_epi8(q);
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++) {
            const __m256i p = dot_us<V>(aq, _mm256_sign_epi8(load32(a[t][b].qs), q));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

// A Q4_K / Q5_K block's 8 sub-block scales into sc, and its 8 mins spread over the 16 activation
// sums they cover (each min two sums of 16: m0 m0 m1 m1 ...).
template <typename Block>
[[gnu::always_inline]] inline __m128i q45_k_scales(const Block& w, uint8_t sc[8]) {
    alignas(16) uint8_t m[16];
    q4k_scales_mins(w.scales, sc, m);
    const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(m));
    return _mm_unpacklo_epi8(m8, m8);
}
// The min term of one block and token: dmin * d_act * sum of min * activation sums, added to acc.
[[gnu::always_inline]] inline __m256 add_min_term(__m256 acc, float dmin, const ActBlock256& a, __m128i m_pairs) {
    return _mm256_fmadd_ps(_mm256_set1_ps(dmin * a.d), _mm256_cvtepi32_ps(bsums_times(a.bsums, m_pairs)), acc);
}

template <bool kFifthBit, bool V, int NT>
void q45_k_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
    const Block* w = static_cast<const Block*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {}, mins[NT] = {};
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        alignas(16) uint8_t sc[8];
        const __m128i m_pairs = q45_k_scales(w[b], sc);
        const float dw = _cvtsh_ss(w[b].d), dmw = _cvtsh_ss(w[b].dmin);
        __m256i isum[NT];
        for (int t = 0; t < NT; t++) {
            mins[t] = add_min_term(mins[t], dmw, a[t][b], m_pairs);
            isum[t] = _mm256_setzero_si256();
        }
        __m256i qh;
        if constexpr (kFifthBit) qh = load32(w[b].qh);
        for (int p = 0; p < 4; p++) {
            const __m256i q = load32(w[b].qs + 32 * p);
            __m256i lo = _mm256_and_si256(q, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if constexpr (kFifthBit) {
                const __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(srl16(qh, 2 * p), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(srl16(qh, 2 * p + 1), one), 4));
            }
            const __m256i s0 = scales_of(sc[2 * p], sc[2 * p]), s1 = scales_of(sc[2 * p + 1], sc[2 * p + 1]);
            for (int t = 0; t < NT; t++) {
                isum[t] = _mm256_add_epi32(isum[t], dot_us_scaled(lo, load32(a[t][b].qs + 64 * p), s0));
                isum[t] = _mm256_add_epi32(isum[t], dot_us_scaled(hi, load32(a[t][b].qs + 64 * p + 32), s1));
            }
        }
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(_mm256_sub_ps(acc[t], mins[t]));
}
template <bool V, int NT>
void q6_k_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {};
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        const int8_t* sc = w[b].scales;
        const __m128i scv = load16(sc);
        // The "- 32" of every code: 32 * sum of scale * activation sums.
        __m256i isum[NT];
        for (int t = 0; t < NT; t++)
            isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(bsums_times(a[t][b].bsums, scv), 5));
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = load32(w[b].ql + 64 * h), ql1 = load32(w[b].ql + 64 * h + 32);
            const __m256i qh = load32(w[b].qh + 32 * h);
            for (int r = 0; r < 4; r++) {
                const __m256i lo = _mm256_and_si256(srl16(r % 2 ? ql1 : ql0, 4 * (r / 2)), low4);
                const __m256i hi = _mm256_and_si256(srl16(qh, 2 * r), low2);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                const int sub = 8 * h + 2 * r;
                const __m256i scale = scales_of(sc[sub], sc[sub + 1]);
                for (int t = 0; t < NT; t++)
                    isum[t] = _mm256_add_epi32(isum[t],
                                               dot_us_scaled(q, load32(a[t][b].qs + 128 * h + 32 * r), scale));
            }
        }
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

// The single-token DotFn of a multi-token kernel.
template <auto kKernel>
float one_token(const void* w, const void* a, int64_t n) {
    float out;
    kKernel(w, static_cast<const uint8_t*>(a), 0, n, &out);
    return out;
}
template <bool V, int NT>
void iq4_xs_avx(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockIq4Xs* w = static_cast<const BlockIq4Xs*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {};
    const __m256i table = iq4_table();
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        __m256i isum[NT];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        for (int sub = 0; sub < 8; sub++) {
            const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[b].qs + 16 * sub));
            const __m256i av = _mm256_abs_epi8(v);
            const int ls = iq4xs_scale(w[b], sub);
            const __m256i scale = scales_of(ls, ls);
            for (int t = 0; t < NT; t++)
                isum[t] = _mm256_add_epi32(
                    isum[t], dot_us_scaled(av, _mm256_sign_epi8(load32(a[t][b].qs + 32 * sub), v), scale));
        }
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

#ifdef STEWARD_QD_AVX512
// The k-quant kernels 64 bytes at a time: each step is one maddubs and one madd by the sub-block
// scales over 64 codes (the AVX2 kernels take two of each), and a weight row's codes are unpacked
// once for all NT tokens. The min / offset terms and the final float sums stay 256-bit. Integer sums
// are exact, so these give the AVX2 kernels' results up to the float reassociation of the last step.
inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
// The 512-bit lanes' i32 sums folded to 256 bits.
inline __m256i fold256(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
// Permutations spreading a block's i16 scales over the 32 i16 lanes of one madd step: step p of
// Q4_K / Q5_K covers sub-blocks 2p, 2p + 1 of 32 (16 lanes each), step k of Q6_K sub-blocks
// 4k .. 4k + 3 of 16 (8 lanes each).
struct SpreadTable {
    alignas(64) int16_t idx[4][32];
    constexpr explicit SpreadTable(int lanes_per_scale) : idx{} {
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 32; j++) idx[p][j] = (int16_t)((32 / lanes_per_scale) * p + j / lanes_per_scale);
    }
};
alignas(64) constexpr SpreadTable kSpread16Table(16), kSpread8Table(8);
constexpr const int16_t (&kSpread16)[4][32] = kSpread16Table.idx;
constexpr const int16_t (&kSpread8)[4][32] = kSpread8Table.idx;

template <bool kFifthBit, int NT>
void q45_k_avx512(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
    const Block* w = static_cast<const Block*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {}, mins[NT] = {};
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    // Codes [low nibbles | high nibbles] of 32 bytes: the element order of two sub-blocks.
    const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        alignas(16) uint8_t sc[8];
        const __m128i m_pairs = q45_k_scales(w[b], sc);
        const __m512i s16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
        const float dw = _cvtsh_ss(w[b].d), dmw = _cvtsh_ss(w[b].dmin);
        __m512i q[4], scale[4];
        for (int p = 0; p < 4; p++) {
            const __m512i both = _mm512_broadcast_i64x4(load32(w[b].qs + 32 * p));
            q[p] = _mm512_and_si512(_mm512_srlv_epi16(both, nib_shift), low4);
            if constexpr (kFifthBit) {
                // Bit 2p (first sub-block) or 2p + 1 (second) of each qh byte, to bit 4.
                const __m512i qh = _mm512_broadcast_i64x4(load32(w[b].qh));
                const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1);
                const __m512i bit = _mm512_and_si512(_mm512_srlv_epi16(qh, sh), _mm512_set1_epi8(1));
                q[p] = _mm512_or_si512(q[p], _mm512_slli_epi16(bit, 4));
            }
            scale[p] = _mm512_permutexvar_epi16(_mm512_load_si512(kSpread16[p]), s16);
        }
        for (int t = 0; t < NT; t++) {
            mins[t] = add_min_term(mins[t], dmw, a[t][b], m_pairs);
            __m512i isum = _mm512_setzero_si512();
            for (int p = 0; p < 4; p++)
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(q[p], load64(a[t][b].qs + 64 * p)), scale[p]));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d), _mm256_cvtepi32_ps(fold256(isum)), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(_mm256_sub_ps(acc[t], mins[t]));
}

template <int NT>
void q6_k_avx512(const void* wv, const uint8_t* acts, size_t act_bytes, int64_t n, float* out) {
    const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
    const ActRows<ActBlock256, NT> a(acts, act_bytes);
    __m256 acc[NT] = {};
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(3);
    // Elements 32 r + l of a half, two r at a time: r = 0, 1 are the low nibbles of ql[0..63] with
    // qh bits 0-1 / 2-3, r = 2, 3 the high nibbles with qh bits 4-5 / 6-7.
    const __m512i hshift[2] = {_mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1),
                               _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1)};
    for (int64_t b = 0; b < n / kQKK; b++) {
        prefetch_ahead(w + b);
        const __m128i scv = load16(w[b].scales);
        const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scv));
        __m512i q[4], scale[4];
        for (int h = 0; h < 2; h++) {
            const __m512i ql = load64(w[b].ql + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(load32(w[b].qh + 32 * h));
            for (int k = 0; k < 2; k++) {
                const __m512i lo = _mm512_and_si512(k ? _mm512_srli_epi16(ql, 4) : ql, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qh, hshift[k]), low2);
                q[2 * h + k] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
                scale[2 * h + k] = _mm512_permutexvar_epi16(_mm512_load_si512(kSpread8[2 * h + k]), s16);
            }
        }
        const float dw = _cvtsh_ss(w[b].d);
        for (int t = 0; t < NT; t++) {
            // The "- 32" of every code: 32 * sum of scale * activation sums.
            __m256i off = _mm256_slli_epi32(bsums_times(a[t][b].bsums, scv), 5);
            __m512i isum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++)
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(q[k], load64(a[t][b].qs + 64 * k)), scale[k]));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][b].d),
                                     _mm256_cvtepi32_ps(_mm256_sub_epi32(fold256(isum), off)), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

// The 512-bit kernel of a type, or nullptr where the 256-bit ones are all there is.
template <int NT>
auto avx512_kernel(GgmlType t) -> void (*)(const void*, const uint8_t*, size_t, int64_t, float*) {
    switch (t) {
        case GgmlType::Q4_K: return q45_k_avx512<false, NT>;
        case GgmlType::Q5_K: return q45_k_avx512<true, NT>;
        case GgmlType::Q6_K: return q6_k_avx512<NT>;
        default: return nullptr;
    }
}
DotFn avx512_fn(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_K: return one_token<q45_k_avx512<false, 1>>;
        case GgmlType::Q5_K: return one_token<q45_k_avx512<true, 1>>;
        case GgmlType::Q6_K: return one_token<q6_k_avx512<1>>;
        default: return nullptr;
    }
}
#endif  // STEWARD_QD_AVX512

template <bool V>
DotFn avx_fn(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0: return one_token<legacy_avx<BlockQ4_0, 8, false, 0, V, 1>>;
        case GgmlType::Q4_1: return one_token<legacy_avx<BlockQ4_1, 0, true, 0, V, 1>>;
        case GgmlType::Q5_0: return one_token<legacy_avx<BlockQ5_0, 16, false, 1, V, 1>>;
        case GgmlType::Q5_1: return one_token<legacy_avx<BlockQ5_1, 0, true, 1, V, 1>>;
        case GgmlType::Q8_0: return one_token<q8_0_avx<V, 1>>;
        case GgmlType::IQ4_NL: return one_token<iq4_nl_avx<V, 1>>;
        case GgmlType::Q2_K: return one_token<q2_k_avx<V, 1>>;
        case GgmlType::Q3_K: return one_token<q3_k_avx<V, 1>>;
        case GgmlType::Q4_K: return one_token<q45_k_avx<false, V, 1>>;
        case GgmlType::Q5_K: return one_token<q45_k_avx<true, V, 1>>;
        case GgmlType::Q6_K: return one_token<q6_k_avx<V, 1>>;
        case GgmlType::IQ4_XS: return one_token<iq4_xs_avx<V, 1>>;
        default: return nullptr;
    }
}
#endif  // STEWARD_QD_AVX2

QuantDotPath best_path() {
#if defined(STEWARD_QD_AVX512)
    return QuantDotPath::AVX512;
#elif defined(STEWARD_QD_VNNI)
    return QuantDotPath::VNNI;
#elif defined(STEWARD_QD_AVX2)
    return QuantDotPath::AVX2;
#else
    return QuantDotPath::SCALAR;
#endif
}

DotFn dot_fn(QuantDotPath path, GgmlType t) {
#ifdef STEWARD_QD_AVX2
#ifdef STEWARD_QD_AVX512
    // The 512-bit path: its own k-quant kernels, the best 256-bit ones for the other types.
    if (path == QuantDotPath::AVX512) {
        if (DotFn f = avx512_fn(t)) return f;
        return avx_fn<kHaveVnni>(t);
    }
#endif
    if (path == QuantDotPath::VNNI && kHaveVnni) return avx_fn<true>(t);
    if (path == QuantDotPath::AVX2) return avx_fn<false>(t);
#endif
    return path == QuantDotPath::SCALAR ? scalar_fn(t) : nullptr;
}

// The multi-token kernels on the best compiled path; nullptr without AVX2 (the scalar twin then
// takes one token at a time).
using MultiFn = void (*)(const void* w, const uint8_t* acts, size_t act_bytes, int64_t n, float* out);
template <int NT>
MultiFn multi_fn(GgmlType t) {
#ifdef STEWARD_QD_AVX2
    constexpr bool V = kHaveVnni;  // what best_path() picks
#ifdef STEWARD_QD_AVX512
    if (auto k = avx512_kernel<NT>(t)) return k;
#endif
    switch (t) {
        case GgmlType::Q4_0: return legacy_avx<BlockQ4_0, 8, false, 0, V, NT>;
        case GgmlType::Q4_1: return legacy_avx<BlockQ4_1, 0, true, 0, V, NT>;
        case GgmlType::Q5_0: return legacy_avx<BlockQ5_0, 16, false, 1, V, NT>;
        case GgmlType::Q5_1: return legacy_avx<BlockQ5_1, 0, true, 1, V, NT>;
        case GgmlType::Q8_0: return q8_0_avx<V, NT>;
        case GgmlType::IQ4_NL: return iq4_nl_avx<V, NT>;
        case GgmlType::Q2_K: return q2_k_avx<V, NT>;
        case GgmlType::Q3_K: return q3_k_avx<V, NT>;
        case GgmlType::Q4_K: return q45_k_avx<false, V, NT>;
        case GgmlType::Q5_K: return q45_k_avx<true, V, NT>;
        case GgmlType::Q6_K: return q6_k_avx<V, NT>;
        case GgmlType::IQ4_XS: return iq4_xs_avx<V, NT>;
        default: break;
    }
#else
    (void)t;
#endif
    return nullptr;
}

std::atomic<bool>& exact_flag() {
    static std::atomic<bool> flag{[] {
        const char* v = std::getenv("STEWARD_EXACT_QUANT");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }()};
    return flag;
}

}  // namespace

bool quant_dot_supported(GgmlType type) { return scalar_fn(type) != nullptr; }

size_t quant_act_row_bytes(GgmlType type, int64_t n_cols) {
    if (!quant_dot_supported(type)) return 0;
    return is_k_type(type) ? (size_t)(n_cols / kQKK) * sizeof(ActBlock256) : (size_t)(n_cols / kQK) * sizeof(ActBlock32);
}

void quantize_activation(GgmlType type, const float* x, int64_t n_cols, void* out) {
    if (is_k_type(type))
        quantize_act256(x, n_cols, static_cast<ActBlock256*>(out));
    else
        quantize_act32(x, n_cols, static_cast<ActBlock32*>(out));
}

bool quant_dot_path_available(QuantDotPath path) {
    return dot_fn(path, GgmlType::Q8_0) != nullptr;
}

float vec_dot_on(QuantDotPath path, GgmlType type, const void* w_row, const void* act, int64_t n_cols) {
    const DotFn f = dot_fn(path, type);
    return f != nullptr ? f(w_row, act, n_cols) : 0.0f;
}

bool quant_dot_wide(GgmlType type) {
#ifdef STEWARD_QD_AVX512
    return avx512_fn(type) != nullptr;
#else
    (void)type;
    return false;
#endif
}

float vec_dot(GgmlType type, const void* w_row, const void* act, int64_t n_cols) {
    return vec_dot_on(best_path(), type, w_row, act, n_cols);
}

// --- fast dequantization (the sgemm path's tile conversion) -------------------------------------

namespace {

#if defined(STEWARD_QD_AVX2)
// Eight codes (bytes) to floats.
inline __m256 codes_to_ps(__m128i v8) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v8)); }

// Q4_K / Q5_K: per sub-block of 32, y = d sc q - dmin m, the reference's two roundings (a multiply,
// then a subtract; no fused multiply-add).
template <bool kFifthBit>
void dequant_q45_k_avx(const void* blocks, int64_t n_blocks, float* y) {
    using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
    const Block* b = static_cast<const Block*>(blocks);
    const __m128i low4 = _mm_set1_epi8(0x0f), one = _mm_set1_epi8(1);
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        uint8_t sc[8], m[8];
        q4k_scales_mins(b[i].scales, sc, m);
        for (int sub = 0; sub < 8; sub++, y += 32) {
            const __m256 dl = _mm256_set1_ps(d * sc[sub]), ml = _mm256_set1_ps(dmin * m[sub]);
            const uint8_t* q = b[i].qs + 32 * (sub / 2);
            for (int l = 0; l < 32; l += 8) {
                __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + l));
                if (sub % 2) v = _mm_srli_epi16(v, 4);
                v = _mm_and_si128(v, low4);
                if constexpr (kFifthBit) {
                    // Bit sub of each qh byte; a 16-bit shift keeps each byte's own bit at bit 0.
                    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qh + l));
                    v = _mm_or_si128(v, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, sub), one), 4));
                }
                _mm256_storeu_ps(y + l, _mm256_sub_ps(_mm256_mul_ps(dl, codes_to_ps(v)), ml));
            }
        }
    }
}

// Q6_K: y = (d sc) (q - 32), q the low nibble from ql and 2 high bits from qh (model/quants.h).
void dequant_q6_k_avx(const void* blocks, int64_t n_blocks, float* y) {
    const BlockQ6_K* b = static_cast<const BlockQ6_K*>(blocks);
    const __m128i low4 = _mm_set1_epi8(0x0f), low2 = _mm_set1_epi8(3);
    const __m256i bias = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int half = 0; half < 2; half++, y += 128) {
            const uint8_t* ql = b[i].ql + 64 * half;
            const uint8_t* qh = b[i].qh + 32 * half;
            const int8_t* sc = b[i].scales + 8 * half;
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l += 8) {
                    __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l + 32 * (r % 2)));
                    if (r / 2) lo = _mm_srli_epi16(lo, 4);
                    lo = _mm_and_si128(lo, low4);
                    __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + l));
                    hi = _mm_and_si128(_mm_srli_epi16(hi, 2 * r), low2);
                    const __m128i q = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
                    const __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(q), bias));
                    const __m256 dl = _mm256_set1_ps(d * sc[2 * r + l / 16]);
                    _mm256_storeu_ps(y + 32 * r + l, _mm256_mul_ps(dl, f));
                }
        }
    }
}
#endif

}  // namespace

bool dequantize_row_fast(GgmlType type, const void* blocks, int64_t n_elems, float* out) {
#if defined(STEWARD_QD_AVX2)
    if (n_elems % kQKK != 0) return false;
    switch (type) {
        case GgmlType::Q4_K: dequant_q45_k_avx<false>(blocks, n_elems / kQKK, out); return true;
        case GgmlType::Q5_K: dequant_q45_k_avx<true>(blocks, n_elems / kQKK, out); return true;
        case GgmlType::Q6_K: dequant_q6_k_avx(blocks, n_elems / kQKK, out); return true;
        default: return false;
    }
#else
    (void)type, (void)blocks, (void)n_elems, (void)out;
    return false;
#endif
}

void quant_matmul_rows(const WeightView& W, const uint8_t* acts, int n_tok, float* Y, int64_t r_begin,
                       int64_t r_end) {
    const DotFn f = dot_fn(best_path(), W.type);
    const MultiFn f4 = multi_fn<4>(W.type), f2 = multi_fn<2>(W.type);
    const int64_t K = W.n_cols, N = W.n_rows;
    const size_t act_bytes = quant_act_row_bytes(W.type, K);
    // W.row(r) looks the type's block size up out of line: once here, not per row (~1% of decode).
    const int64_t row_bytes = W.row_bytes();
    const uint8_t* rows = W.row(0);
    for (int64_t r = r_begin; r < r_end; r++) {
        const uint8_t* row = rows + r * row_bytes;
        int t = 0;
        float out[4];
        if (f4 != nullptr)
            for (; t + 4 <= n_tok; t += 4) {
                f4(row, acts + (size_t)t * act_bytes, act_bytes, K, out);
                for (int i = 0; i < 4; i++) Y[(int64_t)(t + i) * N + r] = out[i];
            }
        if (f2 != nullptr)
            for (; t + 2 <= n_tok; t += 2) {
                f2(row, acts + (size_t)t * act_bytes, act_bytes, K, out);
                for (int i = 0; i < 2; i++) Y[(int64_t)(t + i) * N + r] = out[i];
            }
        for (; t < n_tok; t++) Y[(int64_t)t * N + r] = f(row, acts + (size_t)t * act_bytes, K);
    }
}

const uint8_t* quantize_activations_for(const WeightView& W, const float* X, int n_tok) {
    if (!quant_dot_supported(W.type) || exact_quant()) return nullptr;
    const size_t act_bytes = quant_act_row_bytes(W.type, W.n_cols);
    thread_local std::vector<uint8_t> scratch;  // grows to the largest matmul, then stays
    if (scratch.size() < act_bytes * (size_t)n_tok) scratch.resize(act_bytes * (size_t)n_tok);
    for (int t = 0; t < n_tok; t++)
        quantize_activation(W.type, X + (int64_t)t * W.n_cols, W.n_cols, scratch.data() + (size_t)t * act_bytes);
    return scratch.data();
}

bool exact_quant() { return exact_flag().load(std::memory_order_relaxed); }
void set_exact_quant(bool on) { exact_flag().store(on, std::memory_order_relaxed); }

}  // namespace steward
