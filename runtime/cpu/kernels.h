// CPU kernels for the forward pass: matrix products over weights in their stored type,
// norms, RoPE, SwiGLU. Vectorised with AVX-512, else AVX2/FMA/F16C, where the compiler targets them;
// a portable scalar path otherwise.
#pragma once
#include <cstdint>

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
// The token count from which W's matmul takes sgemm (AUTO).
int gemm_min_tokens(const WeightView& W);

// Which matmul path: AUTO picks by n_tok (gemm_min_tokens); the others force one, for the
// kernel tests (every path at every n_tok) and the bench (stream vs gemm vs OpenBLAS, measured).
// GEMM is our own tiled AVX-512 kernel where the build targets AVX-512 (kernels.cpp: OpenBLAS's
// kernel choice depends on its CPU tables and OPENBLAS_CORETYPE), OpenBLAS sgemm otherwise; BLAS
// is always OpenBLAS sgemm on tiles converted to F32.
enum class MatmulPath { AUTO, STREAM, GEMM, BLAS };

// Y[t][r] = sum_c W[r][c] * X[t][c]  for t < n_tok, r < W.n_rows.
// X: [n_tok][W.n_cols], Y: [n_tok][W.n_rows]. Parallel over chunks of rows on the pool. Q8_0 and
// the block types on the streaming path quantize X to 8 bits and take integer dot products
// (cpu/quant_dot.h, within max|x| / 254 per block of exact) unless exact_quant() is on.
void matmul(const WeightView& W, const float* X, int n_tok, float* Y, ThreadPool& pool,
            MatmulPath path = MatmulPath::AUTO);

// y = x / sqrt(mean(x^2) + eps) * w, for n_tok rows of n. w is F32.
void rmsnorm(const float* x, const float* w, float eps, int n, int n_tok, float* y);
// g[i] = silu(g[i]) * u[i]
void swiglu(float* g, const float* u, int64_t n);
// x[i] = exp(x[i] - mx) for i < n; returns the sum (the body of a softmax).
float exp_sub_sum(float* x, int n, float mx);
// Sum over i < n of exp(x[i] - m), in double; NaN and -inf entries add nothing (m finite). The
// softmax denominator of a logits row (the sampler's logprob): vectorised, since the scalar loop
// cost ~1 ms a token at a 152k vocabulary. Terms below exp(-87) count as exp(-87) (~1.6e-38).
double sum_exp_shifted(const float* x, int64_t n, float m);
// Dot product of n floats with a row stored as F32 or F16 (KV cache types).
float dot_f32(const float* a, const float* b, int n);
float dot_f16(const float* a, const uint16_t* b, int n);
// y += a * x, x as F32 or F16.
void axpy_f32(float a, const float* x, float* y, int n);
void axpy_f16(float a, const uint16_t* x, float* y, int n);
// Converts n floats to F16 / back.
void to_f16(const float* x, uint16_t* y, int n);
void from_f16(const uint16_t* x, float* y, int n);
// Row-major C[m][n] = alpha * A[m][k] * op(B), op(B) = B^T ([n][k]) when trans_b, else B ([k][n]);
// single-threaded sgemm (callers split the work on their pool).
void gemm_f32(bool trans_b, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
              float* C, int ldc);

// Sets the thread count OpenBLAS uses for its own calls (we call it from one thread per slice).
// Also, once, moves OpenBLAS off a core type older than the CPU we were compiled for (see
// kernels.cpp: OpenBLAS 0.3.21 falls back to SSE3 kernels on CPUs it does not know).
void blas_set_threads(int n);
// The OpenBLAS kernel set in use (e.g. "SkylakeX"), for benches.
const char* blas_core_name();
int cpu_count();

}  // namespace steward
