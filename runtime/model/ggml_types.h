// Tensor element types as GGUF stores them (ggml type ids), and scalar conversions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <steward/expected.h>

namespace steward {

// Values are ggml's type ids, as written in GGUF tensor infos.
enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    IQ4_NL = 20,
    IQ4_XS = 23,
    BF16 = 30,
    MXFP4 = 39,  // OCP microscaling FP4 (gpt-oss's experts)
};

constexpr int kQ8BlockSize = 32;
// Q8_0 block: one F16 scale then 32 signed bytes; value = d * q.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQ8BlockSize];
};
static_assert(sizeof(BlockQ8_0) == 34);

// True for the types Steward can load.
bool ggml_type_supported(uint32_t type);
const char* ggml_type_name(uint32_t type);
// Elements per block and bytes per block (1 and sizeof(T) for plain types); quants.h's tables.
int64_t ggml_type_block_elems(GgmlType t);
int64_t ggml_type_block_bytes(GgmlType t);
// Bytes for a row of n elements; n must be a multiple of the block size.
inline int64_t ggml_row_bytes(GgmlType t, int64_t n) {
    return n / ggml_type_block_elems(t) * ggml_type_block_bytes(t);
}

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while ((mant & 0x400) == 0) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even, with overflow to inf and subnormals handled.
inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
    if (absx >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // rounds past 65504
    if (absx < 0x38800000) {                                     // subnormal or zero in f16
        if (absx < 0x33000000) return (uint16_t)sign;
        const uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... bring to 10-bit mantissa
        const uint32_t half = 1u << (shift - 1);
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = absx + 0xc8000000u;  // rebias exponent: -112 << 23
    r += 0xfff + ((r >> 13) & 1);     // round to nearest even
    return (uint16_t)(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);  // keep NaN a NaN
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

// Parses a weight type name as the CLI and configs spell it: f32, f16, bf16, q8_0 (any case).
Expected<GgmlType> parse_ggml_type(const std::string& name);

// Quantise n floats (multiple of 32) into Q8_0 blocks, as ggml does: d = max|x| / 127.
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
// Convert one row of n elements of type t to F32 (any supported type; the block types through
// quants.h's reference dequantizers).
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

}  // namespace steward
