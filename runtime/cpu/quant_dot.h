// Integer dot products of block-quantized weight rows with 8-bit quantized activations, the decode
// kernels for Q4_0 ... Q8_0, the k-quants and IQ4_*: as ggml does, each activation row is quantized
// once per matmul (blocks of 32 or 256), then every weight row is dotted with it in integers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/model.h"
#include "model/quants.h"

namespace steward {

// One activation block for the 32-wide weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL):
// x[j] ~= d * qs[j], |qs[j]| <= 127, sum = sum of qs (the min term of Q4_1 / Q5_1, the offset of
// Q4_0 / Q5_0).
struct ActBlock32 {
    float d;
    int32_t sum;
    int8_t qs[kQK];
};
// One activation block for the 256-wide types (Q2_K ... Q6_K, IQ4_XS), as ggml's Q8_K: bsums[i]
// is the sum of qs[16 i .. 16 i + 15] (the min and offset terms per sub-block of 16).
struct ActBlock256 {
    float d;
    int16_t bsums[kQKK / 16];
    int8_t qs[kQKK];
};
static_assert(sizeof(ActBlock32) == 40 && sizeof(ActBlock256) == 292);

// True for the weight types vec_dot handles: the 12 block types of quants.h.
bool quant_dot_supported(GgmlType type);

// True for the types with 64-byte (AVX-512) kernels in this build: Q4_K, Q5_K, Q6_K.
bool quant_dot_wide(GgmlType type);

// Bytes of one quantized activation row of n_cols elements for weights of this type (n_cols a
// multiple of the type's block width). 0 for a type quant_dot_supported refuses.
size_t quant_act_row_bytes(GgmlType type, int64_t n_cols);

// Quantizes n_cols floats into the activation blocks the type's dot product reads (out holds
// quant_act_row_bytes bytes; no allocation). Each block's scale is max|x| / 127, codes rounded to
// nearest, so |x - d q| <= d / 2 per element.
void quantize_activation(GgmlType type, const float* x, int64_t n_cols, void* out);

// sum_c dequant(w_row)[c] * dequant(act)[c] over n_cols elements, with the fastest path compiled
// in (AVX-VNNI or AVX512-VNNI, else AVX2, else scalar). Thread-safe, allocates nothing.
float vec_dot(GgmlType type, const void* w_row, const void* act, int64_t n_cols);

// The paths one by one, so that tests can hold each against the scalar twin on any machine.
// SCALAR is always available; AVX2 (maddubs / madd), VNNI (dpbusd) and AVX512 (64-byte k-quant
// kernels, the best 256-bit ones for the other types) where compiled in.
enum class QuantDotPath { SCALAR, AVX2, VNNI, AVX512 };
bool quant_dot_path_available(QuantDotPath path);
float vec_dot_on(QuantDotPath path, GgmlType type, const void* w_row, const void* act, int64_t n_cols);
inline float vec_dot_scalar(GgmlType type, const void* w_row, const void* act, int64_t n_cols) {
    return vec_dot_on(QuantDotPath::SCALAR, type, w_row, act, n_cols);
}

// Y[t * W.n_rows + r] for rows [r_begin, r_end) and t < n_tok, from n_tok activation rows already
// quantized for W.type (acts: [n_tok][quant_act_row_bytes(W.type, W.n_cols)]). Each weight row is
// read once and dotted with every token while it sits in L1. Thread-safe over disjoint rows.
void quant_matmul_rows(const WeightView& W, const uint8_t* acts, int n_tok, float* Y, int64_t r_begin,
                       int64_t r_end);

// For matmul's streaming path: when W's type has a vec_dot and the exact path is off, quantizes
// the n_tok rows of X ([n_tok][W.n_cols]) into the calling thread's scratch (grown to the largest
// call, never shrunk) and returns it, for quant_matmul_rows; otherwise returns nullptr. Valid until
// the calling thread's next call.
const uint8_t* quantize_activations_for(const WeightView& W, const float* X, int n_tok);

// The sgemm path's tile conversion for the k-quants of the llama-quantize mixes (Q4_K, Q5_K, Q6_K):
// the reference dequantizer's values (the same multiplies and subtracts per element, so equal up to
// the reference's own float contraction), eight at a time with AVX2. False (out untouched) for any
// other type, an n_elems not a multiple of 256, or a build without AVX2: use dequantize_row then.
bool dequantize_row_fast(GgmlType type, const void* blocks, int64_t n_elems, float* out);

// The exact path: when on, matmul dequantizes each weight row with the reference dequantizer and
// multiplies it in F32 with unquantized activations (as the F32 sgemm path does), instead of
// quantizing the activations. Off by default; STEWARD_EXACT_QUANT=1 in the environment turns it
// on at start-up; tests that compare against an F32 reference turn it on with set_exact_quant.
// Not synchronised with running matmuls: set it between forward passes.
bool exact_quant();
void set_exact_quant(bool on);
// Turns the exact path on for a scope (tests comparing against an F32 reference), then restores.
struct ExactQuantScope {
    bool was = exact_quant();
    ExactQuantScope() { set_exact_quant(true); }
    ~ExactQuantScope() { set_exact_quant(was); }
    ExactQuantScope(const ExactQuantScope&) = delete;
    ExactQuantScope& operator=(const ExactQuantScope&) = delete;
};

}  // namespace steward
