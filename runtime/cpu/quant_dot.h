// Integer dot products of block-quantized weight rows with 8-bit quantized activations, the decode
// kernels for Q4_0 ... Q8_0, the k-quants and IQ4_*: as ggml does, each activation row is quantized
// once per matmul (blocks of 32 or 256), then every weight row is dotted with it in integers.
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>

#include "model/model.h"
#include "model/quants.h"

namespace steward {

class ThreadPool;

// One activation block for the 32-wide weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), as
// ggml's Q8_0 / Q8_1: x[j] ~= d * qs[j], |qs[j]| <= 127, d an F16 value; sum = sum of qs (the
// offset of Q4_0 / Q5_0, in integers); s = the F32 scale times sum, rounded to F16 (Q8_1's s: the
// min term of Q4_1 / Q5_1).
struct ActBlock32 {
    float d;
    float s;
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
static_assert(sizeof(ActBlock32) == 44 && sizeof(ActBlock256) == 292);

// The paths one by one, so that tests can hold each against the scalar twin on any machine.
// SCALAR is always available; AVX2 (maddubs / madd), VNNI (dpbusd) and AVX512 (64-byte k-quant
// kernels, the best 256-bit ones for the other types) where the kernel level has them.
enum class QuantDotPath { SCALAR, AVX2, VNNI, AVX512 };

// Scratch slots of quant_gemm_acts: the most activation layouts one matmul_many call (kernels.h)
// keeps at once, its most outputs.
inline constexpr int kQuantGemmSlots = 4;

#include "cpu/quant_dot_api.inc"

inline float vec_dot_scalar(GgmlType type, const void* w_row, const void* act, int64_t n_cols) {
    return vec_dot_on(QuantDotPath::SCALAR, type, w_row, act, n_cols);
}

// The exact path: when on, matmul dequantizes each weight row with the reference dequantizer and
// multiplies it in F32 with unquantized activations (as the F32 sgemm path does), instead of
// quantizing the activations. Off by default; STEWARD_EXACT_QUANT=1 in the environment turns it
// on at start-up; tests that compare against an F32 reference turn it on with set_exact_quant.
// Not synchronised with running matmuls: set it between forward passes.
bool exact_quant();
void set_exact_quant(bool on);

// How far ahead (bytes) the int8 decode kernels prefetch their weight rows: set from the CPU plan
// (cpu/plan.h) at start, 4096 until then. Any value in [64, 65536]; it never changes results.
inline std::atomic<int> g_quant_prefetch_bytes{4096};
// Turns the exact path on for a scope (tests comparing against an F32 reference), then restores.
struct ExactQuantScope {
    bool was = exact_quant();
    ExactQuantScope() { set_exact_quant(true); }
    ~ExactQuantScope() { set_exact_quant(was); }
    ExactQuantScope(const ExactQuantScope&) = delete;
    ExactQuantScope& operator=(const ExactQuantScope&) = delete;
};

}  // namespace steward
