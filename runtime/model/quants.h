// Reference dequantizers for ggml's block-quantized weight types: plain loops that read each block
// as ggml lays it out (the readable twin of the fast kernels, kept for tests and fallbacks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <steward/expected.h>

#include "model/ggml_types.h"

namespace steward {

// Aliases of GgmlType's block types (the same ggml ids), kept for the code written against them.
namespace ggml_id {
constexpr GgmlType Q4_0 = GgmlType(2);
constexpr GgmlType Q4_1 = GgmlType(3);
constexpr GgmlType Q5_0 = GgmlType(6);
constexpr GgmlType Q5_1 = GgmlType(7);
constexpr GgmlType Q8_0 = GgmlType(8);
constexpr GgmlType Q2_K = GgmlType(10);
constexpr GgmlType Q3_K = GgmlType(11);
constexpr GgmlType Q4_K = GgmlType(12);
constexpr GgmlType Q5_K = GgmlType(13);
constexpr GgmlType Q6_K = GgmlType(14);
constexpr GgmlType IQ4_NL = GgmlType(20);
constexpr GgmlType IQ4_XS = GgmlType(23);
constexpr GgmlType MXFP4 = GgmlType(39);
}  // namespace ggml_id

constexpr int kQK = 32;    // elements in a legacy block (Q4_0 ... Q8_0, IQ4_NL)
constexpr int kQKK = 256;  // elements in a k-quant super-block (Q2_K ... Q6_K, IQ4_XS)

// The 16 non-linear levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl), indexed by a 4-bit code.
extern const int8_t kValuesIq4nl[16];
// MXFP4's 16 levels, twice the E2M1 values (ggml's kvalues_mxfp4): codes 0-7 are +0, 0.5, 1, 1.5,
// 2, 3, 4, 6 doubled, codes 8-15 the same negated.
extern const int8_t kValuesMxfp4[16];
// An E8M0 scale (2^(e - 127)) halved, as ggml's ggml_e8m0_to_fp32_half: the factor of a doubled
// MXFP4 level. e 0 and 1 are the subnormals 2^-128 and 2^-127.
inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Block layouts, field for field as ggml's ggml-common.h defines them. Scales `d` / `dmin` are
// IEEE fp16 bit patterns (f16_to_f32). All structs are byte-packed by construction (uint8/uint16).
struct BlockQ4_0 {  // value = d * (q - 8), q a 4-bit code
    uint16_t d;
    uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {  // value = d * q + m
    uint16_t d;
    uint16_t m;
    uint8_t qs[kQK / 2];  // nibbles as in Q4_0
};
struct BlockQ5_0 {  // value = d * (q - 16), q a 5-bit code
    uint16_t d;
    uint8_t qh[4];        // bit j of this little-endian uint32 is the 5th bit of element j
    uint8_t qs[kQK / 2];  // the low 4 bits, nibbles as in Q4_0
};
struct BlockQ5_1 {  // value = d * q + m
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
struct BlockIq4Nl {  // value = d * kValuesIq4nl[q]
    uint16_t d;
    uint8_t qs[kQK / 2];  // nibbles as in Q4_0
};
// Q2_K: 16 sub-blocks of 16; value = d * scale * q - dmin * min, q a 2-bit code.
struct BlockQ2_K {
    uint8_t scales[kQKK / 16];  // per sub-block: low nibble the scale, high nibble the min
    uint8_t qs[kQKK / 4];       // 2-bit codes, see dequantize_q2_k for the order
    uint16_t d;                 // super-block scale for the scales
    uint16_t dmin;              // super-block scale for the mins
};
// Q3_K: 16 sub-blocks of 16; value = d * (scale - 32) * (q - 4 * !hbit), q a 2-bit code.
struct BlockQ3_K {
    uint8_t hmask[kQKK / 8];  // the high bit of each code; set means "no -4"
    uint8_t qs[kQKK / 4];     // the low 2 bits, ordered as in Q2_K
    uint8_t scales[12];       // 16 6-bit scales: low nibbles in bytes 0-7, high 2 bits in 8-11
    uint16_t d;
};
// Q4_K: 8 sub-blocks of 32; value = d * scale * q - dmin * min, q a 4-bit code.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];     // 8 6-bit scales and 8 6-bit mins, packed (q4k_scale_min)
    uint8_t qs[kQKK / 2];   // each 64 elements: 32 bytes, low nibbles first, then high nibbles
};
// Q5_K: as Q4_K with a 5th bit per element from qh.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQKK / 8];  // bit 2i of qh[l]: 5th bit of sub-block 2i's element l; bit 2i+1 of 2i+1
    uint8_t qs[kQKK / 2];
};
// Q6_K: 16 sub-blocks of 16; value = d * scale * (q - 32), q a 6-bit code.
struct BlockQ6_K {
    uint8_t ql[kQKK / 2];      // the low 4 bits
    uint8_t qh[kQKK / 4];      // the high 2 bits
    int8_t scales[kQKK / 16];  // signed 8-bit sub-block scales
    uint16_t d;
};
// IQ4_XS: 8 sub-blocks of 32; value = d * (scale - 32) * kValuesIq4nl[q].
struct BlockIq4Xs {
    uint16_t d;
    uint16_t scales_h;     // bits 2i, 2i+1: the high 2 bits of sub-block i's 6-bit scale
    uint8_t scales_l[4];   // nibble i (low nibble of byte i/2 first): the low 4 bits
    uint8_t qs[kQKK / 2];  // per sub-block 16 bytes, nibbles as in Q4_0
};
// MXFP4 (OCP microscaling, gpt-oss's expert weights): value = e8m0_half(e) * kValuesMxfp4[q].
struct BlockMxfp4 {
    uint8_t e;            // the block's E8M0 exponent
    uint8_t qs[kQK / 2];  // nibbles as in Q4_0
};
static_assert(sizeof(BlockMxfp4) == 17);
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockIq4Nl) == 18);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockIq4Xs) == 136);

// True for the block types dequantize_row below handles (plus F32, F16, BF16).
bool dequant_supported(GgmlType type);
// Elements and bytes per block of a type dequant_supported knows (1 and the element size for
// F32 / F16 / BF16); 0 for any other type. ggml_types.h's ggml_type_block_* read these tables.
int quant_block_elems(GgmlType type);
size_t quant_block_bytes(GgmlType type);

// Dequantizes n_elems values (a multiple of the type's block width) from blocks into out, exactly
// as ggml's to_float does. Errors name an unsupported type or a bad n_elems.
Expected<bool> dequantize_row(GgmlType type, const void* blocks, int64_t n_elems, float* out);

}  // namespace steward
