// CPU kernels for the forward pass: matrix products over weights in their stored type,
// norms, RoPE, SwiGLU. Vectorised with AVX-512, else AVX2/FMA/F16C, else plain loops: every level is
// compiled in and the CPU's best is chosen at start (cpu/cpu_features.h, cpu/dispatch.cpp).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "cpu/thread_pool.h"
#include "model/model.h"

namespace steward {

// Below this many tokens a matmul streams the weights once through our own kernel (decode is
// memory-bound); at or above it, the tiled GEMM (prefill is compute-bound; see MatmulPath).
constexpr int kGemmMinTokens = 16;
// The k-quants with 64-byte integer kernels (quant_dot_wide) stay on them up to this many tokens:
// 85-90 GFLOP/s a core at 16-48 tokens against sgemm's 40-85 on the dequantized tile (Q4_K, Q6_K
// on 2048 x 768, measured); sgemm wins from about 64.
constexpr int kWideQuantGemmMinTokens = 48;
// On the AVX2 level F16 weights take the 4x3 register tiles (converted in registers) below this many
// tokens and the tiled GEMM (a block of rows converted to F32, then 4 rows x 24 tokens) from it:
// the tiles lead at 16-32 tokens, the GEMM from 48-64 (kernels_body.inc, measured).
constexpr int kAvx2TiledHalfFrom = 48;
// The CPU plan (cpu/plan.h) measures where the tiled GEMM overtakes the streaming kernel on this
// microarchitecture, per class of weight type (one representative each: F32; F16; Q8_0 for the
// 32-wide block types; Q4_K for the k-quants; IQ4_XS for the types whose codes index a table of
// levels, IQ4_XS, IQ4_NL and MXFP4, whose streaming kernels pay a lookup per code and cross over
// earlier; BF16, a class apart from F16 since the AVX2 level's F16 GEMM is its own register-tiled
// kernel and BF16's is sgemm). gemm_min_tokens reads it;
// 0 (no plan) leaves the level's default above. The exact quantized path (exact_quant) keeps
// kGemmMinTokens: its streaming kernel dequantizes rows and is not the one measured.
enum class GemmClass { F32, HALF, Q32, Q256, TABLE, BF16 };  // HALF: F16
inline constexpr int kGemmClasses = 6;
// The class of a weight type; -1 for a type outside them (its default applies).
int gemm_class(GgmlType t);
inline std::atomic<int> g_gemm_from[kGemmClasses] = {0, 0, 0, 0, 0, 0};

// The AVX-512 levels' streaming kernel for F16 and BF16 at one and two tokens (F32: g_f32_row_bytes
// below): 4 (Intel): 4-row tiles of 512-bit vectors, the stream ahead asked for; 1 (AMD): one
// 256-bit row at a time at one token and in the AVX2 level's
// 4-row tiles of 256-bit vectors at two (Zen 4 converts 16 halves at half the rate of 8; the
// 256-bit code ran 1.3-1.4x the 512-bit in decode there). Set at the first kernel call from the
// CPU's vendor; STEWARD_STREAM_ROWS=1 or 4 overrides it. F16's and BF16's sums are the AVX2
// level's on AMD.
inline std::atomic<int> g_stream_rows{4};
// F32 weights at one and two tokens (the AVX2 level: at one, where a row's sums keep their order
// either way): rows of at most g_f32_row_bytes bytes a row at a time, with prefetch_far's stream
// alone; longer rows in 4-row tiles, the stream ahead asked for. The same bits either way. Which is
// faster depends on the core's prefetchers and on the row's length: on Zen 4 (one thread, 32 MiB
// of rows) a row at a time read 27-29 GB/s against the tiles' 19-24 at 512-1376 columns, the same
// at 2048, and 17-21 against 26-29 at 4096-8192; the 110M model's F32 decode (768 columns) at the
// AVX2 level 42.7 tok/s in tiles, 75 a row at a time. Set at the first kernel call from the vendor
// (vendor_f32_row_bytes), then by the CPU plan (cpu/plan.h), which times both ways at five row
// lengths on this CPU model and level.
inline constexpr int64_t kEveryRowLength = int64_t(1) << 40;  // every row a row at a time
inline std::atomic<int64_t> g_f32_row_bytes{0};
// STEWARD_STREAM_ROWS=1: kEveryRowLength; =4: 0 (every row in tiles); else 8192 on AMD's CPUs (Zen
// 4's crossover above) and 0 elsewhere.
int64_t vendor_f32_row_bytes();
// F16 and BF16 weights at one token on the AVX-512 levels where g_stream_rows is 1 (AMD's): rows of
// at most g_half_row_bytes bytes a row at a time (256-bit, four chains), longer rows in 6-row tiles
// of the same chains, neither with prefetch instructions (the hardware's prefetchers follow several
// long rows at once; at short rows those tiles read half as fast). The same bits either way. Zen 4,
// one thread, 32-48 MiB of F16 rows: a row at a time 21-35 GB/s against the tiles' 10-23 up to 8
// KiB rows, 11-13 against 18-24 at 14-32 KiB. Set at the first kernel call from the vendor
// (vendor_half_row_bytes), then by the CPU plan, as F32's. Where g_stream_rows is 4, and at the
// AVX2 and scalar levels, the half types stream in 4-row tiles with the stream ahead asked for,
// whatever the limit (at the AVX2 level those tiles read as fast as single rows or faster up to
// 2304-byte rows, 1.1-1.3x at two threads).
inline std::atomic<int64_t> g_half_row_bytes{0};
// STEWARD_STREAM_ROWS=1: kEveryRowLength; =4: 0; else 8192 on AMD's CPUs and 0 elsewhere.
int64_t vendor_half_row_bytes();
// Whether the kernels read g_half_row_bytes at the level in use: an AVX-512 level with
// g_stream_rows 1 (elsewhere the half types stream in 4-row tiles whatever the limit).
bool half_row_limit_used();
// STEWARD_STREAM_ROWS's limit alone (F32's and the half types'): kEveryRowLength for 1, 0 for 4, -1
// when it is unset or other.
int64_t env_row_bytes();
// A row limit in words, for the plan's line and the kernels line: "a row at a time", "in 4-row
// tiles" or "a row at a time up to 8192-byte rows, longer in 4-row tiles" (tile_rows: the 4).
std::string describe_row_bytes(int64_t row_bytes, int tile_rows = 4);

// BF16 weights' tiled GEMM on the AVX-512 levels with vdpbf16ps, the tokens rounded to BF16 as
// llama.cpp rounds them (true), or the F32 tiles (false). Set at the first kernel call: true where
// the CPU has AVX512_BF16, unless STEWARD_BF16_GEMM=f32 asks for the F32 tiles (=pairs: the default).
inline std::atomic<bool> g_gemm_bf16{false};
bool gemm_bf16_pairs();  // g_gemm_bf16, after the first kernel call's choice
int stream_tile_rows();  // g_stream_rows, after the first kernel call's choice

// Which matmul path: AUTO picks by n_tok (gemm_min_tokens); the others force one, for the
// kernel tests (every path at every n_tok) and the bench (stream vs gemm vs OpenBLAS, measured).
// GEMM is our own tiled AVX-512 kernel where the kernel level has AVX-512 (kernels.cpp: OpenBLAS's
// kernel choice depends on its CPU tables and OPENBLAS_CORETYPE), OpenBLAS sgemm otherwise; BLAS
// is always OpenBLAS sgemm on tiles converted to F32.
enum class MatmulPath { AUTO, STREAM, GEMM, BLAS };

// One output of matmul_many: Y = W X, Y [n_tok][W->n_rows].
struct MatmulOut {
    const WeightView* W;
    float* Y;
};

#include "cpu/kernels_api.inc"

// Row-major C[m][n] = alpha * A[m][k] * op(B), op(B) = B^T ([n][k]) when trans_b, else B ([k][n]);
// single-threaded (callers split the work on their pool): the kernel level's own tiled kernel where
// it has one (gemm_f32_tiled: AVX2, B^T), OpenBLAS's sgemm otherwise.
void gemm_f32(bool trans_b, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
              float* C, int ldc);

// Sets the thread count OpenBLAS uses for its own calls (we call it from one thread per slice).
// Also, once, moves OpenBLAS off a core type older than the kernel level in use (see kernels.cpp:
// OpenBLAS 0.3.21 falls back to SSE3 kernels on CPUs it does not know).
void blas_set_threads(int n);
// That once-only selection alone (every sgemm caller runs it first).
void blas_ensure_core();
// The OpenBLAS kernel set in use (e.g. "SkylakeX"), for benches.
const char* blas_core_name();
// llama.cpp's GELU on the CPU (ggml_vec_gelu_f32, and the GELU of ggml_vec_geglu_f32): the tanh
// approximation, looked up at the input rounded to F16 and rounded to F16 itself; x at x >= 10, 0 at
// x <= -10. BERT's FFN and Gemma's GeGLU.
float gelu_ggml(float x);
// The same over n values through ggml's F16 table (what ggml_vec_geglu_f32 / ggml_vec_gelu_f32 do):
// g[i] = gelu(g[i]) * u[i] (GeGLU), or g[i] = gelu(g[i]) when u is null. Equal to gelu_ggml.
void geglu_ggml(float* g, const float* u, int64_t n);
int cpu_count();

// Which kernels a matmul over weights of type t runs at the current level, in words: the decode
// path (below gemm_min_tokens) and the prefill path, e.g. "1-47 tokens: int8 dot products, avx512vnni
// 64-byte (activations to 8 bits); 48+: tiled AVX-512 GEMM". For bench_model and `steward model info`.
std::string matmul_variant(GgmlType t);

// Opt-in accounting of the wall time the calling threads spend inside matmul() (bench_model's
// non-matmul share of decode: norms, RoPE, attention, sampling and barriers are the rest). Off by
// default: two clock reads per call when on.
void set_matmul_timing(bool on);
double take_matmul_seconds();  // the time accumulated since the last call (or since timing went on)

}  // namespace steward
