// Reference dequantizers for ggml's block types (model/quants.h): one plain loop per layout, with
// the float operations in ggml's order so the values come out bit-identical to ggml's to_float.
#include "model/quants.h"

#include <cstring>
#include <string>

namespace steward {

const int8_t kValuesIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};
const int8_t kValuesMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

namespace {

// Legacy 32-wide blocks: element j (< 16) sits in the low nibble of qs[j], element j + 16 in the
// high nibble of the same byte.
void dequantize_q4_0(const BlockQ4_0* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++, y += kQK) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQK / 2; j++) {
            y[j] = ((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + kQK / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void dequantize_q4_1(const BlockQ4_1* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++, y += kQK) {
        const float d = f16_to_f32(b[i].d);
        const float m = f16_to_f32(b[i].m);
        for (int j = 0; j < kQK / 2; j++) {
            y[j] = (b[i].qs[j] & 0x0f) * d + m;
            y[j + kQK / 2] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

// The 5th bit of element j is bit j of qh read as a little-endian uint32.
uint32_t read_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

void dequantize_q5_0(const BlockQ5_0* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++, y += kQK) {
        const float d = f16_to_f32(b[i].d);
        const uint32_t qh = read_qh(b[i].qh);
        for (int j = 0; j < kQK / 2; j++) {
            const int hi0 = (qh >> j) & 1;
            const int hi1 = (qh >> (j + kQK / 2)) & 1;
            y[j] = (((b[i].qs[j] & 0x0f) | hi0 << 4) - 16) * d;
            y[j + kQK / 2] = (((b[i].qs[j] >> 4) | hi1 << 4) - 16) * d;
        }
    }
}

void dequantize_q5_1(const BlockQ5_1* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++, y += kQK) {
        const float d = f16_to_f32(b[i].d);
        const float m = f16_to_f32(b[i].m);
        const uint32_t qh = read_qh(b[i].qh);
        for (int j = 0; j < kQK / 2; j++) {
            const int hi0 = (qh >> j) & 1;
            const int hi1 = (qh >> (j + kQK / 2)) & 1;
            y[j] = ((b[i].qs[j] & 0x0f) | hi0 << 4) * d + m;
            y[j + kQK / 2] = ((b[i].qs[j] >> 4) | hi1 << 4) * d + m;
        }
    }
}

void dequantize_q8_0(const BlockQ8_0* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++, y += kQK) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQK; j++) y[j] = b[i].qs[j] * d;
    }
}

// IQ4_NL and MXFP4: a 4-bit index into a table of 16 levels, times the block's scale (F16 for
// IQ4_NL, an E8M0 exponent halved for MXFP4); nibbles as in Q4_0.
inline float table4_scale(const BlockIq4Nl& b) { return f16_to_f32(b.d); }
inline float table4_scale(const BlockMxfp4& b) { return e8m0_half(b.e); }
template <class Block>
void dequantize_table4(const Block* b, int64_t n_blocks, const int8_t* levels, float* y) {
    for (int64_t i = 0; i < n_blocks; i++, y += kQK) {
        const float d = table4_scale(b[i]);
        for (int j = 0; j < kQK / 2; j++) {
            y[j] = d * levels[b[i].qs[j] & 0x0f];
            y[j + kQK / 2] = d * levels[b[i].qs[j] >> 4];
        }
    }
}

// Q2_K / Q3_K code order: each half of 128 elements uses 32 bytes of qs; the 2-bit field at shift
// 2s (s = 0..3) of bytes 0-15 holds sub-block 2s of that half, of bytes 16-31 sub-block 2s + 1.
// So element e of a half (e = 32 s + 16 t + l) is bits 2s of byte 16 t + l.
void dequantize_q2_k(const BlockQ2_K* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        const float dmin = f16_to_f32(b[i].dmin);
        for (int half = 0; half < 2; half++) {
            const uint8_t* q = b[i].qs + 32 * half;
            for (int s = 0; s < 4; s++) {
                for (int t = 0; t < 2; t++) {
                    const int sub = 8 * half + 2 * s + t;  // sub-block of 16 elements, 0..15
                    const float dl = d * (b[i].scales[sub] & 0x0f);
                    const float ml = dmin * (b[i].scales[sub] >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * ((q[16 * t + l] >> (2 * s)) & 3) - ml;
                }
            }
        }
    }
}

// Q3_K's 16 6-bit scales: the low 4 bits of scale k are the low nibble of scales[k] (k < 8) or
// the high nibble of scales[k - 8]; the high 2 bits are bits 2 (k / 4) of scales[8 + k % 4].
int q3k_scale(const uint8_t scales[12], int k) {
    const int lo = k < 8 ? scales[k] & 0x0f : scales[k - 8] >> 4;
    const int hi = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | hi << 4) - 32;
}

void dequantize_q3_k(const BlockQ3_K* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int half = 0; half < 2; half++) {
            const uint8_t* q = b[i].qs + 32 * half;
            for (int s = 0; s < 4; s++) {
                // hmask bit (4 half + s) of byte 16 t + l is the high bit of the same element.
                const int hbit = 1 << (4 * half + s);
                for (int t = 0; t < 2; t++) {
                    const int sub = 8 * half + 2 * s + t;
                    const float dl = d * q3k_scale(b[i].scales, sub);
                    for (int l = 0; l < 16; l++) {
                        const int lo = (q[16 * t + l] >> (2 * s)) & 3;
                        const int minus = (b[i].hmask[16 * t + l] & hbit) ? 0 : 4;
                        *y++ = dl * (lo - minus);
                    }
                }
            }
        }
    }
}

// Q4_K / Q5_K: 8 6-bit scales and 8 6-bit mins in 12 bytes. Sub-blocks 0-3 keep theirs in the low
// 6 bits of bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7 take their low 4 bits from the
// nibbles of bytes 8-11 (scale low, min high) and their high 2 bits from the top 2 bits of
// bytes 0-3 (scale) and 4-7 (min).
void q4k_scale_min(const uint8_t s[12], int j, int& scale, int& min) {
    if (j < 4) {
        scale = s[j] & 63;
        min = s[j + 4] & 63;
    } else {
        scale = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

// Each 64 elements (two sub-blocks) read 32 bytes of qs: low nibbles are the first sub-block,
// high nibbles the second.
void dequantize_q4_k(const BlockQ4_K* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        const float dmin = f16_to_f32(b[i].dmin);
        for (int pair = 0; pair < 4; pair++) {
            const uint8_t* q = b[i].qs + 32 * pair;
            for (int nib = 0; nib < 2; nib++) {
                int sc, m;
                q4k_scale_min(b[i].scales, 2 * pair + nib, sc, m);
                const float dl = d * sc;
                const float ml = dmin * m;
                for (int l = 0; l < 32; l++) *y++ = dl * ((q[l] >> (4 * nib)) & 0x0f) - ml;
            }
        }
    }
}

void dequantize_q5_k(const BlockQ5_K* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        const float dmin = f16_to_f32(b[i].dmin);
        for (int pair = 0; pair < 4; pair++) {
            const uint8_t* q = b[i].qs + 32 * pair;
            for (int nib = 0; nib < 2; nib++) {
                const int sub = 2 * pair + nib;
                int sc, m;
                q4k_scale_min(b[i].scales, sub, sc, m);
                const float dl = d * sc;
                const float ml = dmin * m;
                for (int l = 0; l < 32; l++) {
                    const int hi = (b[i].qh[l] >> sub) & 1;
                    *y++ = dl * (((q[l] >> (4 * nib)) & 0x0f) + 16 * hi) - ml;
                }
            }
        }
    }
}

// Q6_K: each half of 128 elements uses 64 bytes of ql, 32 of qh and 8 scales. Element
// 32 r + l (r = 0..3, l = 0..31) of a half: low 4 bits are the low (r = 0, 1) or high (r = 2, 3)
// nibble of ql[l + 32 (r % 2)], high 2 bits are bits 2r of qh[l]; its scale is 2r + l / 16.
void dequantize_q6_k(const BlockQ6_K* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int half = 0; half < 2; half++) {
            const uint8_t* ql = b[i].ql + 64 * half;
            const uint8_t* qh = b[i].qh + 32 * half;
            const int8_t* sc = b[i].scales + 8 * half;
            for (int r = 0; r < 4; r++) {
                for (int l = 0; l < 32; l++) {
                    const int lo = (ql[l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0f;
                    const int hi = (qh[l] >> (2 * r)) & 3;
                    y[32 * r + l] = d * sc[2 * r + l / 16] * ((lo | hi << 4) - 32);
                }
            }
            y += 128;
        }
    }
}

void dequantize_iq4_xs(const BlockIq4Xs* b, int64_t n_blocks, float* y) {
    for (int64_t i = 0; i < n_blocks; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int sub = 0; sub < 8; sub++, y += 32) {
            const int lo = (b[i].scales_l[sub / 2] >> (4 * (sub % 2))) & 0x0f;
            const int hi = (b[i].scales_h >> (2 * sub)) & 3;
            const float dl = d * ((lo | hi << 4) - 32);
            const uint8_t* qs = b[i].qs + 16 * sub;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * kValuesIq4nl[qs[j] & 0x0f];
                y[j + 16] = dl * kValuesIq4nl[qs[j] >> 4];
            }
        }
    }
}

}  // namespace

int quant_block_elems(GgmlType type) {
    switch ((uint32_t)type) {
        case 0: case 1: case 30: return 1;              // F32, F16, BF16
        case 2: case 3: case 6: case 7: case 8: case 20: case 39: return kQK;
        case 10: case 11: case 12: case 13: case 14: case 23: return kQKK;
        default: return 0;
    }
}

size_t quant_block_bytes(GgmlType type) {
    switch ((uint32_t)type) {
        case 0: return 4;
        case 1: case 30: return 2;
        case 2: return sizeof(BlockQ4_0);
        case 3: return sizeof(BlockQ4_1);
        case 6: return sizeof(BlockQ5_0);
        case 7: return sizeof(BlockQ5_1);
        case 8: return sizeof(BlockQ8_0);
        case 10: return sizeof(BlockQ2_K);
        case 11: return sizeof(BlockQ3_K);
        case 12: return sizeof(BlockQ4_K);
        case 13: return sizeof(BlockQ5_K);
        case 14: return sizeof(BlockQ6_K);
        case 20: return sizeof(BlockIq4Nl);
        case 23: return sizeof(BlockIq4Xs);
        case 39: return sizeof(BlockMxfp4);
        default: return 0;
    }
}

bool dequant_supported(GgmlType type) { return quant_block_elems(type) != 0; }

Expected<bool> dequantize_row(GgmlType type, const void* blocks, int64_t n_elems, float* out) {
    const int be = quant_block_elems(type);
    if (be == 0)
        return make_error("cannot dequantize type ", ggml_type_name((uint32_t)type), " (id ",
                          std::to_string((uint32_t)type),
                          "): supported are F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                          "Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4");
    if (n_elems < 0 || n_elems % be != 0)
        return make_error("cannot dequantize ", std::to_string(n_elems), " elements of type ",
                          ggml_type_name((uint32_t)type), ": not a multiple of its block width ",
                          std::to_string(be));
    const int64_t nb = n_elems / be;
    switch ((uint32_t)type) {
        case 0: std::memcpy(out, blocks, (size_t)n_elems * 4); break;
        case 1: {
            const uint16_t* s = static_cast<const uint16_t*>(blocks);
            for (int64_t i = 0; i < n_elems; i++) out[i] = f16_to_f32(s[i]);
            break;
        }
        case 30: {
            const uint16_t* s = static_cast<const uint16_t*>(blocks);
            for (int64_t i = 0; i < n_elems; i++) out[i] = bf16_to_f32(s[i]);
            break;
        }
        case 2: dequantize_q4_0(static_cast<const BlockQ4_0*>(blocks), nb, out); break;
        case 3: dequantize_q4_1(static_cast<const BlockQ4_1*>(blocks), nb, out); break;
        case 6: dequantize_q5_0(static_cast<const BlockQ5_0*>(blocks), nb, out); break;
        case 7: dequantize_q5_1(static_cast<const BlockQ5_1*>(blocks), nb, out); break;
        case 8: dequantize_q8_0(static_cast<const BlockQ8_0*>(blocks), nb, out); break;
        case 10: dequantize_q2_k(static_cast<const BlockQ2_K*>(blocks), nb, out); break;
        case 11: dequantize_q3_k(static_cast<const BlockQ3_K*>(blocks), nb, out); break;
        case 12: dequantize_q4_k(static_cast<const BlockQ4_K*>(blocks), nb, out); break;
        case 13: dequantize_q5_k(static_cast<const BlockQ5_K*>(blocks), nb, out); break;
        case 14: dequantize_q6_k(static_cast<const BlockQ6_K*>(blocks), nb, out); break;
        case 20: dequantize_table4(static_cast<const BlockIq4Nl*>(blocks), nb, kValuesIq4nl, out); break;
        case 23: dequantize_iq4_xs(static_cast<const BlockIq4Xs*>(blocks), nb, out); break;
        case 39: dequantize_table4(static_cast<const BlockMxfp4*>(blocks), nb, kValuesMxfp4, out); break;
    }
    return true;
}

}  // namespace steward
