// The CUDA kernels of the GPU forward pass, each a launcher over device pointers on a stream, each
// with the CPU twin it is tested against (tests/gpu/test_kernels.cpp) named above it. Buffers are
// row-major with the shapes in the comments; "f16" buffers hold IEEE half bits as uint16_t.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kv/kv_storage.h"
#include "model/ggml_types.h"
#include "model/model.h"

namespace steward::gpu {

// Twin: dequantize_row (model/ggml_types.h) of each token's row. table: [n_vocab] rows of
// row_bytes in type F32, F16, BF16 or Q8_0; out: [n_tok][n_embd].
Expected<bool> embed_rows(GgmlType type, const void* table, int64_t row_bytes, const int32_t* tokens, int n_tok,
                          int n_embd, float* out, cudaStream_t s);

// Twin: rmsnorm (cpu/kernels.h). x, y: [n_rows][n]; w: [n]. In place (x == y) is allowed.
Expected<bool> rmsnorm(const float* x, const float* w, float eps, int n, int n_rows, float* y, cudaStream_t s);

// Twin: rope_head in cpu/forward.cpp, with its tables (angles pos * base^(-2i / n_rot) * freq_scale
// / freq_factors[i] in double, ModelParams::rope_inv_freq). x: [n_tok][n_heads][head_dim], the first
// n_rot dims of each head rotated; pos: [n_tok]; freq_factors: device [n_rot / 2], or null for none.
Expected<bool> rope(float* x, const int32_t* pos, int n_tok, int n_heads, int head_dim, int n_rot, float freq_base,
                    float freq_scale, const float* freq_factors, RopeType type, cudaStream_t s);

// Twin: swiglu (cpu/kernels.h): g[i] = silu(g[i]) * u[i].
Expected<bool> swiglu(float* g, const float* u, int64_t n, cudaStream_t s);
// y[r][i] += b[i]: add_bias in cpu/forward.cpp. y: [n_rows][n].
Expected<bool> add_bias(float* y, const float* b, int n, int n_rows, cudaStream_t s);
// x[i] += y[i]: the residual adds of cpu/forward.cpp.
Expected<bool> add(float* x, const float* y, int64_t n, cudaStream_t s);
// dst[r] = src[rows[r]]: the logits rows' gather. src: [*][n], dst: [n_rows][n].
Expected<bool> gather_rows(const float* src, const int32_t* rows, int n_rows, int n, float* dst, cudaStream_t s);
// Twin: to_f16 (cpu/kernels.h), round to nearest even.
Expected<bool> to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);

// Twin: dequantize_row (model/ggml_types.h) then f32_to_f16. type: Q8_0 or Q4_K; n_elems a
// multiple of the block width (32, 256); blocks and out on the device.
Expected<bool> dequantize_to_f16(GgmlType type, const void* blocks, int64_t n_elems, uint16_t* out, cudaStream_t s);

// Y[t][r] = sum_c W[r][c] X[t][c] (cpu/kernels.h matmul), with cuBLAS: W F32 (SGEMM, F32 compute)
// or F16 (X rounded to F16 into x16, cublasGemmEx with F32 accumulation). W: [n_rows][n_cols],
// X: [n_tok][n_cols], x16: [n_tok][n_cols] scratch (F16 only), Y: [n_tok][n_rows].
Expected<bool> gemm(cublasHandle_t h, GgmlType wtype, const void* W, int64_t n_rows, int64_t n_cols, const float* X,
                    int n_tok, uint16_t* x16, float* Y);

// Twin: the KV write of cpu/forward.cpp. k, v: [n_tok][kvd] F32; slots: [n_tok] physical slot
// indices (block * block_size + slot in block); k_layer, v_layer: one layer of the pool,
// [n_blocks * block_size][kvd] in dtype.
// dtype_k, dtype_v: F32, F16, BF16 or FP8_E4M3 (kv/fp8_e4m3.h's rounding, saturating at +-448);
// the block types are refused (an error).
Expected<bool> kv_write(const float* k, const float* v, const int32_t* slots, int n_tok, int kvd, KvDtype dtype_k,
                        KvDtype dtype_v, void* k_layer, void* v_layer, cudaStream_t s);
// Twin: KvStorage::copy_slots for one layer: dst slot i <- src slot i as if all sources were read
// first (physical slot indices; a slot is k_slot_bytes of K and v_slot_bytes of V; tmp holds
// n * (k_slot_bytes + v_slot_bytes) bytes).
Expected<bool> kv_copy_slots(const int32_t* src, const int32_t* dst, int n, int64_t k_slot_bytes, int64_t v_slot_bytes,
                             void* k_layer, void* v_layer, void* tmp, cudaStream_t s);

// What the attention kernel reads about a batch (device arrays, built by the forward).
struct AttnBatch {
    const int32_t* tok_seq = nullptr;       // [n_tok] the token's sequence in the batch
    const int32_t* tok_i = nullptr;         // [n_tok] its index among that sequence's new tokens
    const int32_t* seq_n_past = nullptr;    // [n_seq]
    const int32_t* seq_n_new = nullptr;     // [n_seq]
    const int32_t* seq_bt_off = nullptr;    // [n_seq] start of its block table in bt
    const int32_t* seq_mask_off = nullptr;  // [n_seq] start of its [n_new][n_new] mask in mask; -1: causal
    const int32_t* bt = nullptr;            // the block tables, concatenated
    const uint8_t* mask = nullptr;          // the masks, concatenated
    int max_slots = 0;                      // max over sequences of n_past + n_new
};

// Twin: the attention of cpu/forward.cpp (attend_block and the token-by-token path, which compute
// the same thing). Token t (sequence s, new index i) attends its sequence's slots [0, n_past) and
// the new slots n_past + j its mask row allows (causal: j <= i) over the paged K/V (logical slot
// -> (bt[slot / block_size], slot % block_size)); query head h reads KV head h / (n_head / n_head_kv).
// Decode (one new token), prefill chunks and tree verification are all this one kernel.
// q, out: [n_tok][n_head][head_dim]; k_layer, v_layer as kv_write.
// The most slots (n_past + n_new) one sequence may span in `attention` on the current device: its
// scores live in shared memory.
Expected<int> attention_max_slots(int head_dim);
Expected<bool> attention(const float* q, const void* k_layer, const void* v_layer, KvDtype dtype_k, KvDtype dtype_v, int block_size,
                         int n_head, int n_head_kv, int head_dim, float scale, const AttnBatch& b, int n_tok,
                         float* out, cudaStream_t s);

// Twin: greedy sampling (Sampler with temperature 0): per row the largest logit, ties to the lower
// id, NaN as -inf. logits: [n_rows][n_vocab]; out: [n_rows].
Expected<bool> argmax_rows(const float* logits, int n_rows, int n_vocab, int32_t* out, cudaStream_t s);
// Twin: sampling_distribution (cpu/sampling.h) with temperature and top_p (no top_k): the nucleus
// of mass top_p of softmax(logits / temperature), drawn by inverse CDF in ascending id order at
// u[r] in [0, 1). temperature > 0. logits: [n_rows][n_vocab]; u, out: [n_rows].
Expected<bool> sample_top_p(const float* logits, int n_rows, int n_vocab, float temperature, float top_p,
                            const float* u, int32_t* out, cudaStream_t s);

// Fills n F16 values with deterministic pseudo-random values uniform in [-scale, scale] (the bench's
// synthetic weights, made on the device).
Expected<bool> fill_random_f16(uint16_t* y, int64_t n, float scale, uint64_t seed, cudaStream_t s);
Expected<bool> fill_f32(float* y, int64_t n, float value, cudaStream_t s);

}  // namespace steward::gpu
