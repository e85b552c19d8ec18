// CPU kernels. The matmul has two paths: a streaming kernel for few tokens (each weight row is read
// once and dotted with every token while it sits in L1) and tiled sgemm for many tokens (weights
// not in F32 are converted a tile at a time, never the whole matrix).
#include "cpu/kernels.h"
#include "cpu/simd.h"

#include "cpu/quant_dot.h"
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define STEWARD_AVX2 1
#endif
// AVX-512 (F + BW, as on Skylake-X and later): 16 lanes per FMA, twice AVX2's, and a native
// exp-friendly scalef. Chosen at compile time like AVX2 (the build targets -march=native).
#if defined(STEWARD_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__)
#define STEWARD_AVX512 1
#endif
// GCC 12's AVX-512 headers build some results on _mm*_undefined_*() and then warn about them
// at every inlined use (GCC PR 105593, fixed in 13); the warning is about the header, not us.
#if defined(STEWARD_AVX512) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

extern "C" void openblas_set_num_threads(int);
// OpenBLAS's DYNAMIC_ARCH entry points (weak: absent from a single-target build, then unused).
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace steward {

int cpu_count() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : (int)n;
}

namespace {

// OpenBLAS 0.3.21 (Debian 12) does not recognise CPUs newer than its tables (this VM's Sapphire
// Rapids reports a generic "Intel Xeon Processor") and falls back to its Prescott (SSE3)
// kernels: sgemm measured ~22 GFLOP/s a core here against ~90 with its SkylakeX kernels
// (bench_model's kernel table). Where we were compiled for AVX-512 (or AVX2) and OpenBLAS chose a
// core without it, and the user set no OPENBLAS_CORETYPE, re-select through OpenBLAS's own
// override: set the variable and re-run its dynamic init. Runs once, before our first sgemm.
void select_blas_core() {
    if (!openblas_get_corename || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice stands
    const std::string core = openblas_get_corename();
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX512CD__)
    const char* want = "SkylakeX";
    const char* good[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
#elif defined(__AVX2__) && defined(__FMA__)
    const char* want = "Haswell";
    const char* good[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
#else
    const char* want = nullptr;  // a portable build: OpenBLAS's own choice stands
    const char* good[] = {""};
#endif
    if (!want) return;
    for (const char* g : good)
        if (core == g) return;
    setenv("OPENBLAS_CORETYPE", want, 0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");  // not inherited by child processes
}

void ensure_blas_core() {
    static const bool once = (select_blas_core(), true);
    (void)once;
}

}  // namespace

void blas_set_threads(int n) {
    ensure_blas_core();
    openblas_set_num_threads(n);
}

const char* blas_core_name() {
    ensure_blas_core();
    return openblas_get_corename ? openblas_get_corename() : "unknown";
}

namespace {

#ifndef STEWARD_PREFETCH
#define STEWARD_PREFETCH 1
#endif
constexpr bool kPrefetch = STEWARD_PREFETCH;

#ifdef STEWARD_AVX2
using simd::hsum;

// Loads 8 weights starting at column c (c a multiple of 8) as floats.
template <GgmlType T>
inline __m256 load8(const uint8_t* row, int64_t c);
template <>
inline __m256 load8<GgmlType::F32>(const uint8_t* row, int64_t c) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
}
template <>
inline __m256 load8<GgmlType::F16>(const uint8_t* row, int64_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + c)));
}
template <>
inline __m256 load8<GgmlType::BF16>(const uint8_t* row, int64_t c) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
template <>
inline __m256 load8<GgmlType::Q8_0>(const uint8_t* row, int64_t c) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + c / kQ8BlockSize;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + c % kQ8BlockSize));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
}
#endif

#ifdef STEWARD_AVX512
// Loads 16 weights starting at column c (c a multiple of 16) as floats. BF16 widens by a shift
// (exact); llama.cpp's _mm512_dpbf16_ps would round the activations to BF16 first, and decode
// is bound by the weight stream, not by these shifts.
template <GgmlType T>
inline __m512 load16(const uint8_t* row, int64_t c);
template <>
inline __m512 load16<GgmlType::F32>(const uint8_t* row, int64_t c) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
}
template <>
inline __m512 load16<GgmlType::F16>(const uint8_t* row, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + c)));
}
template <>
inline __m512 load16<GgmlType::BF16>(const uint8_t* row, int64_t c) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <>
inline __m512 load16<GgmlType::Q8_0>(const uint8_t* row, int64_t c) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + c / kQ8BlockSize;
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + c % kQ8BlockSize));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}
#endif

// Bytes of a row that hold 16 weights (Q8_0: 34 bytes per block of 32), for prefetch addresses.
template <GgmlType T>
constexpr int64_t bytes_per_16() {
    return T == GgmlType::F32 ? 64 : T == GgmlType::Q8_0 ? 17 : 32;
}

template <GgmlType T>
inline float load1(const uint8_t* row, int64_t c) {
    if constexpr (T == GgmlType::F32) return reinterpret_cast<const float*>(row)[c];
    if constexpr (T == GgmlType::F16) return f16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
    if constexpr (T == GgmlType::BF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
    if constexpr (T == GgmlType::Q8_0) {
        const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + c / kQ8BlockSize;
        return f16_to_f32(b->d) * b->qs[c % kQ8BlockSize];
    }
    return 0.0f;
}

// R rows x NT tokens of dot products; the R weight rows are streamed once for the NT tokens.
// out[t * ldy + r]
template <GgmlType T, int R, int NT>
inline void dot_tile(const WeightView& W, int64_t r0, const float* X, int64_t ldx, float* Y, int64_t ldy) {
    const int64_t K = W.n_cols;
    const uint8_t* rows[R];
    const int64_t row_bytes = W.row_bytes();  // one out-of-line block-size look-up, not one per row
    for (int r = 0; r < R; r++) rows[r] = static_cast<const uint8_t*>(W.data) + (r0 + r) * row_bytes;
    // The next tile's rows start R rows on: touch them while this tile streams, so the first lines
    // of each row (the hardware prefetcher needs a few misses per stream to start) arrive early.
    [[maybe_unused]] const int64_t next = R * row_bytes;
    int64_t c = 0;
    float acc_s[R][NT] = {};
#if defined(STEWARD_AVX512)
    // Two column steps of 16 per iteration, each into its own accumulators: 2 * R * NT
    // independent FMA chains (<= 16 registers), so the loop issues loads back to back.
    constexpr int U = R * NT <= 8 ? 2 : 1;
    __m512 acc[U][R][NT];
    for (int u = 0; u < U; u++)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < NT; t++) acc[u][r][t] = _mm512_setzero_ps();
    for (; c + 16 * U <= K; c += 16 * U)
        for (int u = 0; u < U; u++) {
            __m512 w[R];
            if (u == 0 && kPrefetch)
                for (int r = 0; r < R; r++) {
                    const char* pf = reinterpret_cast<const char*>(rows[r] + next + c / 16 * bytes_per_16<T>());
                    _mm_prefetch(pf, _MM_HINT_T0);
                    if constexpr (bytes_per_16<T>() * U > 64) _mm_prefetch(pf + 64, _MM_HINT_T0);
                }
            for (int r = 0; r < R; r++) w[r] = load16<T>(rows[r], c + 16 * u);
            for (int t = 0; t < NT; t++) {
                const __m512 x = _mm512_loadu_ps(X + t * ldx + c + 16 * u);
                for (int r = 0; r < R; r++) acc[u][r][t] = _mm512_fmadd_ps(w[r], x, acc[u][r][t]);
            }
        }
    for (; c + 16 <= K; c += 16) {
        __m512 w[R];
        for (int r = 0; r < R; r++) w[r] = load16<T>(rows[r], c);
        for (int t = 0; t < NT; t++) {
            const __m512 x = _mm512_loadu_ps(X + t * ldx + c);
            for (int r = 0; r < R; r++) acc[0][r][t] = _mm512_fmadd_ps(w[r], x, acc[0][r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) {
            __m512 a = acc[0][r][t];
            for (int u = 1; u < U; u++) a = _mm512_add_ps(a, acc[u][r][t]);
            acc_s[r][t] = _mm512_reduce_add_ps(a);
        }
#elif defined(STEWARD_AVX2)
    __m256 acc[R][NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (; c + 8 <= K; c += 8) {
        __m256 w[R];
        for (int r = 0; r < R; r++) w[r] = load8<T>(rows[r], c);
        for (int t = 0; t < NT; t++) {
            const __m256 x = _mm256_loadu_ps(X + t * ldx + c);
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(w[r], x, acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc_s[r][t] = hsum(acc[r][t]);
#endif
    for (; c < K; c++)
        for (int r = 0; r < R; r++) {
            const float w = load1<T>(rows[r], c);
            for (int t = 0; t < NT; t++) acc_s[r][t] += w * X[t * ldx + c];
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) Y[t * ldy + r0 + r] = acc_s[r][t];
}

template <GgmlType T, int NT>
void stream_rows(const WeightView& W, const float* X, int64_t ldx, float* Y, int64_t ldy, int64_t r_begin,
                 int64_t r_end) {
#if defined(STEWARD_AVX512)
    // 32 registers: up to 4 rows x 6 tokens of accumulators (24) plus the rows and one token.
    constexpr int R = NT <= 6 ? 4 : 2;
#else
    constexpr int R = NT <= 2 ? 4 : 2;  // 16 registers
#endif
    int64_t r = r_begin;
    for (; r + R <= r_end; r += R) dot_tile<T, R, NT>(W, r, X, ldx, Y, ldy);
    for (; r < r_end; r++) dot_tile<T, 1, NT>(W, r, X, ldx, Y, ldy);
}

// Rows [r_begin, r_end) for all n_tok tokens, in token tiles of 4 (then 2, 1; AVX-512 first takes
// tiles of 8 and 6) so that a tile of rows stays in L1 while every token tile passes over it. The
// wider tiles load fewer operands per FMA: a speculation step verifying 6-8 tokens went from 4x to
// ~3x the time of one token (1024 x 384 F32, one thread).
template <GgmlType T>
void stream_matmul(const WeightView& W, const float* X, int n_tok, float* Y, int64_t r_begin, int64_t r_end) {
    const int64_t K = W.n_cols, N = W.n_rows;
    constexpr int64_t kRowChunk = 16;
    for (int64_t rc = r_begin; rc < r_end; rc += kRowChunk) {
        const int64_t re = std::min(r_end, rc + kRowChunk);
        int t = 0;
#if defined(STEWARD_AVX512)
        for (; t + 8 <= n_tok; t += 8) stream_rows<T, 8>(W, X + t * K, K, Y + t * N, N, rc, re);
        for (; t + 6 <= n_tok; t += 6) stream_rows<T, 6>(W, X + t * K, K, Y + t * N, N, rc, re);
#endif
        for (; t + 4 <= n_tok; t += 4) stream_rows<T, 4>(W, X + t * K, K, Y + t * N, N, rc, re);
        for (; t + 2 <= n_tok; t += 2) stream_rows<T, 2>(W, X + t * K, K, Y + t * N, N, rc, re);
        for (; t < n_tok; t++) stream_rows<T, 1>(W, X + t * K, K, Y + t * N, N, rc, re);
    }
}

// The exact path for the block types (Q4_0 ... Q6_K, IQ4_*), taken when exact_quant() is on
// (STEWARD_EXACT_QUANT=1; otherwise quant_dot.h's integer kernels run): each row is dequantized
// once with the reference dequantizer into a thread-local scratch, then dotted in F32 with every
// token. Exact against dequantize-then-F32 (no activation quantization).
void stream_matmul_dequant(const WeightView& W, const float* X, int n_tok, float* Y, int64_t rb, int64_t re) {
    const int64_t K = W.n_cols, N = W.n_rows;
    thread_local std::vector<float> row;
    row.resize((size_t)K);
    for (int64_t r = rb; r < re; r++) {
        dequantize_row(W.type, W.row(r), row.data(), K);
        for (int t = 0; t < n_tok; t++) Y[(int64_t)t * N + r] = dot_f32(row.data(), X + (int64_t)t * K, (int)K);
    }
}

void stream_matmul_any(const WeightView& W, const float* X, int n_tok, float* Y, int64_t rb, int64_t re) {
    switch (W.type) {
        case GgmlType::F32: return stream_matmul<GgmlType::F32>(W, X, n_tok, Y, rb, re);
        case GgmlType::F16: return stream_matmul<GgmlType::F16>(W, X, n_tok, Y, rb, re);
        case GgmlType::BF16: return stream_matmul<GgmlType::BF16>(W, X, n_tok, Y, rb, re);
        case GgmlType::Q8_0: return stream_matmul<GgmlType::Q8_0>(W, X, n_tok, Y, rb, re);
        default: return stream_matmul_dequant(W, X, n_tok, Y, rb, re);
    }
}

// A weight row to F32, vectorised (the tile conversion of the sgemm path).
template <GgmlType T>
void convert_row(const uint8_t* row, float* dst, int64_t n) {
    int64_t c = 0;
#if defined(STEWARD_AVX512)
    for (; c + 16 <= n; c += 16) _mm512_storeu_ps(dst + c, load16<T>(row, c));
#elif defined(STEWARD_AVX2)
    for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, load8<T>(row, c));
#endif
    for (; c < n; c++) dst[c] = load1<T>(row, c);
}

void convert_row_any(GgmlType t, const uint8_t* row, float* dst, int64_t n) {
    switch (t) {
        case GgmlType::F32: return convert_row<GgmlType::F32>(row, dst, n);
        case GgmlType::F16: return convert_row<GgmlType::F16>(row, dst, n);
        case GgmlType::BF16: return convert_row<GgmlType::BF16>(row, dst, n);
        case GgmlType::Q8_0: return convert_row<GgmlType::Q8_0>(row, dst, n);
        default:  // the block types: the fast k-quant dequantizers, else the reference one
            if (!dequantize_row_fast(t, row, n, dst)) dequantize_row(t, row, dst, n);
            return;
    }
}

// Rows [rb, re) through sgemm; non-F32 weights are converted kTile rows at a time.
void gemm_rows(const WeightView& W, const float* X, int n_tok, float* Y, int64_t rb, int64_t re,
               std::vector<float>& tile) {
    ensure_blas_core();
    const int64_t K = W.n_cols, N = W.n_rows;
    if (W.type == GgmlType::F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tok, (int)(re - rb), (int)K, 1.0f, X, (int)K,
                    reinterpret_cast<const float*>(W.row(rb)), (int)K, 0.0f, Y + rb, (int)N);
        return;
    }
    constexpr int64_t kTile = 128;
    tile.resize((size_t)(kTile * K));
    for (int64_t r = rb; r < re; r += kTile) {
        const int64_t n = std::min(kTile, re - r);
        for (int64_t i = 0; i < n; i++) convert_row_any(W.type, W.row(r + i), tile.data() + i * K, K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tok, (int)n, (int)K, 1.0f, X, (int)K, tile.data(),
                    (int)K, 0.0f, Y + r, (int)N);
    }
}

#ifdef STEWARD_AVX512
// Our own tiled GEMM for prefill (many tokens), AVX-512 builds. OpenBLAS picks its kernel set at
// load time from the CPU tables it knows or from OPENBLAS_CORETYPE, which some hosts pin to an
// older core for other programs' sake (this VM sets Haswell: half-width kernels); this path does
// not depend on either. Y[t][r] = sum_k W[r][k] X[t][k] with the vector lanes along tokens:
//  - X is packed once per call into panels of kPanel tokens, [K][kPanel] each (tokens past n_tok
//    are zero), so one k step of a panel is 3 contiguous vectors;
//  - a group of kGroup weight rows is converted to F32 (any stored type, through convert_row_any)
//    in blocks of kKc columns laid [K / kKc][kMr][kKc], so the micro-kernel broadcasts W[i][k] at a
//    constant offset from one pointer; each weight is read and converted once per call;
//  - the micro-kernel keeps kMr rows x 48 tokens of accumulators (24 registers) over all of K and
//    writes them once; a group's kGroup rows then land in Y as one 64-byte line per token.
namespace tiled {

constexpr int64_t kKc = 256;  // a multiple of every block type's 32 or 256 elements
constexpr int kMr = 8;
constexpr int kPanel = 48;
constexpr int kGroup = 2 * kMr;

// out[i][t] (i < kMr, t < 16 NV) = sum over k < K of w[i][k] * xt[k][t].
template <int NV>
void micro(int64_t K, const float* w, const float* xt, float* out) {
    __m512 acc[kMr][NV];
    for (int i = 0; i < kMr; i++)
        for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
        const int64_t kc = std::min(kKc, K - k0);
        const float* wb = w + k0 / kKc * kMr * kKc;
        const float* x = xt + k0 * kPanel;
#pragma GCC unroll 2
        for (int64_t k = 0; k < kc; k++, x += kPanel) {
            __m512 xv[NV];
            for (int v = 0; v < NV; v++) xv[v] = _mm512_loadu_ps(x + 16 * v);
            for (int i = 0; i < kMr; i++) {
                const __m512 b = _mm512_set1_ps(wb[i * kKc + k]);
                for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(b, xv[v], acc[i][v]);
            }
        }
    }
    for (int i = 0; i < kMr; i++)
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + i * kPanel + 16 * v, acc[i][v]);
}

int n_panels(int n_tok) { return (n_tok + kPanel - 1) / kPanel; }

// Lane i holds i * stride: the element offsets of a gather down a column of rows stride apart.
__m512i lane_offsets(int stride) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32(stride));
}

// Vector v (16 tokens) of panel p of X [n_tok][K] into xt ([n_panels][K][kPanel]), by masked
// gathers down the columns: each line of the panel is written once.
void pack_tokens(const float* X, int n_tok, int64_t K, int p, int v, float* xt) {
    float* dst = xt + (int64_t)p * K * kPanel + 16 * v;
    const int t0 = p * kPanel + 16 * v, n = std::clamp(n_tok - t0, 0, 16);
    if (n == 0) {
        for (int64_t k = 0; k < K; k++) _mm512_storeu_ps(dst + k * kPanel, _mm512_setzero_ps());
        return;
    }
    const __mmask16 m = n == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    const __m512i idx = lane_offsets((int)K);
    const float* src = X + (int64_t)t0 * K;
    for (int64_t k = 0; k < K; k++)
        _mm512_storeu_ps(dst + k * kPanel, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, src + k, 4));
}

// Rows [rb, re) of Y for every token, from the packed panels.
void rows(const WeightView& W, const float* xt, int n_tok, float* Y, int64_t rb, int64_t re) {
    const int64_t K = W.n_cols, N = W.n_rows, nkb = (K + kKc - 1) / kKc, half = nkb * kMr * kKc;
    thread_local std::vector<float> wt, ot;
    wt.resize((size_t)(2 * half));
    ot.resize((size_t)kGroup * kPanel);
    const int np = n_panels(n_tok);
    const __m512i col = lane_offsets(kPanel);
    // Row and column-block offsets computed here: W.row() and ggml_row_bytes() look the type's
    // block size up out of line, and this loop runs per row and per block.
    const int64_t row_bytes = W.row_bytes(), block_bytes = ggml_row_bytes(W.type, kKc);
    const uint8_t* w_rows = static_cast<const uint8_t*>(W.data);
    for (int64_t r0 = rb; r0 < re; r0 += kGroup) {
        const int nr = (int)std::min<int64_t>(kGroup, re - r0);
        for (int i = 0; i < kGroup; i++) {
            float* base = wt.data() + (i / kMr) * half + (i % kMr) * kKc;
            for (int64_t b = 0; b < nkb; b++) {
                const int64_t k0 = b * kKc, kc = std::min(kKc, K - k0);
                float* dst = base + b * kMr * kKc;
                if (i < nr) convert_row_any(W.type, w_rows + (r0 + i) * row_bytes + b * block_bytes, dst, kc);
                else std::fill(dst, dst + kc, 0.0f);
            }
        }
        for (int p = 0; p < np; p++) {
            const int nt = std::min(kPanel, n_tok - p * kPanel), nv = (nt + 15) / 16;
            const float* xp = xt + (int64_t)p * K * kPanel;
            for (int h = 0; h * kMr < nr; h++) {
                const float* wh = wt.data() + h * half;
                float* oh = ot.data() + h * kMr * kPanel;
                if (nv == 3) micro<3>(K, wh, xp, oh);
                else if (nv == 2) micro<2>(K, wh, xp, oh);
                else micro<1>(K, wh, xp, oh);
            }
            // ot is [row][token]: a token's kGroup outputs are one column of it.
            const __mmask16 m = nr == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
            for (int t = 0; t < nt; t++)
                _mm512_mask_storeu_ps(Y + (int64_t)(p * kPanel + t) * N + r0, m,
                                      _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, col, ot.data() + t, 4));
        }
    }
}

}  // namespace tiled
#endif

#ifdef STEWARD_AVX512
// exp of 16 floats: x = n ln2 + r with |r| <= ln2/2, exp(r) by Cephes' expf polynomial, times 2^n
// by scalef. Within 2 ulp of std::exp on [-87, 88]; inputs are clamped there (exp(-87) is 1e-38,
// exp(88) is near FLT_MAX), which SwiGLU and a max-subtracted softmax never reach in a useful way.
inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}
#endif

}  // namespace

int gemm_min_tokens(const WeightView& W) {
    return quant_dot_wide(W.type) && !exact_quant() ? kWideQuantGemmMinTokens : kGemmMinTokens;
}

void matmul(const WeightView& W, const float* X, int n_tok, float* Y, ThreadPool& pool, MatmulPath path) {
    const int64_t N = W.n_rows;
    const bool gemm = path == MatmulPath::AUTO ? n_tok >= gemm_min_tokens(W)
                                               : path == MatmulPath::GEMM || path == MatmulPath::BLAS;
    const int nt = pool.n_threads();
#ifdef STEWARD_AVX512
    if (gemm && path != MatmulPath::BLAS && n_tok > 0) {
        // X packed into token panels once (in parallel), then row chunks of 16-row groups; chunk
        // sizes as for sgemm below, several per thread so a late thread costs little.
        const int64_t K = W.n_cols;
        const int np = tiled::n_panels(n_tok);
        thread_local std::vector<float> xt_buf;  // the caller's; the workers see it through xt
        xt_buf.resize((size_t)(np * K * tiled::kPanel));
        float* xt = xt_buf.data();
        pool.parallel_for(np * 3, [&](int64_t c) { tiled::pack_tokens(X, n_tok, K, (int)(c / 3), (int)(c % 3), xt); });
        const int64_t per = std::max<int64_t>(tiled::kGroup, N / (4 * nt));
        const int64_t chunk = (per + tiled::kGroup - 1) / tiled::kGroup * tiled::kGroup;
        pool.parallel_for((N + chunk - 1) / chunk, [&](int64_t c) {
            tiled::rows(W, xt, n_tok, Y, c * chunk, std::min(N, (c + 1) * chunk));
        });
        return;
    }
#endif
    // Chunks of rows, multiples of 16: several per thread for the streaming kernel (so a thread
    // that gets the core late costs little), fewer and larger for sgemm (efficiency per call).
    const int64_t per = gemm ? std::max<int64_t>(64, N / (2 * nt)) : std::max<int64_t>(16, N / (4 * nt));
    const int64_t chunk = (per + 15) / 16 * 16;
    const int64_t n_chunks = (N + chunk - 1) / chunk;
    // Block-quantized weights (and Q8_0), few tokens: each token's activations are quantized to
    // 8 bits once here, then every chunk runs integer dot products (quant_dot.h); nullptr when
    // the type has none or the exact path is on.
    const uint8_t* q_acts = gemm ? nullptr : quantize_activations_for(W, X, n_tok);
    pool.parallel_for(n_chunks, [&](int64_t c) {
        const int64_t rb = c * chunk, re = std::min(N, rb + chunk);
        if (gemm) {
            thread_local std::vector<float> tile;
            gemm_rows(W, X, n_tok, Y, rb, re, tile);
        } else if (q_acts != nullptr) {
            quant_matmul_rows(W, q_acts, n_tok, Y, rb, re);
        } else {
            stream_matmul_any(W, X, n_tok, Y, rb, re);
        }
    });
}

void rmsnorm(const float* x, const float* w, float eps, int n, int n_tok, float* y) {
    for (int t = 0; t < n_tok; t++) {
        const float* xt = x + (int64_t)t * n;
        float* yt = y + (int64_t)t * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xt[i] * xt[i];
        const float scale = (float)(1.0 / std::sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) yt[i] = xt[i] * scale * w[i];
    }
}

// Vectorised because it is not small: n_ff exps per token per layer (a 128-token prefill of the
// 110M model calls exp 3M times, ~10% of the pass with std::exp).
void swiglu(float* g, const float* u, int64_t n) {
    int64_t i = 0;
#ifdef STEWARD_AVX512
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

float exp_sub_sum(float* x, int n, float mx) {
    int i = 0;
    float sum = 0.0f;
#ifdef STEWARD_AVX512
    const __m512 m = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    return sum;
}

double sum_exp_shifted(const float* x, int64_t n, float m) {
    int64_t i = 0;
    double sum = 0.0;
#ifdef STEWARD_AVX512
    const __m512 vm = _mm512_set1_ps(m), neg_inf = _mm512_set1_ps(-INFINITY);
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 finite = _mm512_cmp_ps_mask(v, neg_inf, _CMP_GT_OQ);  // false for NaN and -inf
        const __m512 e = _mm512_maskz_mov_ps(finite, exp16(_mm512_sub_ps(v, vm)));
        acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc1 = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#endif
    for (; i < n; i++)
        if (x[i] > -INFINITY) sum += std::exp(x[i] - m);
    return sum;
}

float dot_f32(const float* a, const float* b, int n) {
    int i = 0;
    float s = 0.0f;
#if defined(STEWARD_AVX512)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(STEWARD_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

float dot_f16(const float* a, const uint16_t* b, int n) {
    int i = 0;
    float s = 0.0f;
#if defined(STEWARD_AVX512)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i),
                              _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i))), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(STEWARD_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i),
                              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i))), acc);
    s = hsum(acc);
#endif
    for (; i < n; i++) s += a[i] * f16_to_f32(b[i]);
    return s;
}

void axpy_f32(float a, const float* x, float* y, int n) {
    int i = 0;
#if defined(STEWARD_AVX512)
    const __m512 va = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#elif defined(STEWARD_AVX2)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

void axpy_f16(float a, const uint16_t* x, float* y, int n) {
    int i = 0;
#if defined(STEWARD_AVX512)
    const __m512 va = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))),
                                                _mm512_loadu_ps(y + i)));
#elif defined(STEWARD_AVX2)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))),
                                                _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

void to_f16(const float* x, uint16_t* y, int n) {
    int i = 0;
#ifdef STEWARD_AVX2
    // F16C rounds to nearest even as f32_to_f16 does (they differ only in NaN payloads).
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

void from_f16(const uint16_t* x, float* y, int n) {
    int i = 0;
#ifdef STEWARD_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
    for (; i < n; i++) y[i] = f16_to_f32(x[i]);
}

void gemm_f32(bool trans_b, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
              float* C, int ldc) {
    ensure_blas_core();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B, ldb, 0.0f,
                C, ldc);
}

}  // namespace steward
