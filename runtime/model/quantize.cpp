// F32 -> ggml block types (model/quantize.h). Each writer fills the fields exactly as quants.cpp's
// reference dequantizer reads them back; the k-quant scale choice is a covering rule, explained
// at k_quant_scales.
#include "model/quantize.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "model/quants.h"

namespace steward {

namespace {

// The smallest F16 whose value is >= v (v >= 0 and finite): a scale rounded up, so a grid built on
// it still reaches v. Returns 0x7c00 (infinity) when v is beyond F16's range.
uint16_t f16_at_least(float v) {
    uint16_t h = f32_to_f16(v);
    if (f16_to_f32(h) < v) h++;  // positive F16 bit patterns grow with their value
    return h;
}

// The smallest k in [0, k_max] with covers(k), or k_max: covers is monotone in k.
template <class F>
int smallest_covering(int k_max, F covers) {
    int lo = 0, hi = k_max;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (covers(mid)) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

int nearest(float v, int lo, int hi) { return std::clamp((int)std::lround(v), lo, hi); }

// ggml's Q4_0: d = (the value of largest magnitude) / -8, q = x / d + 8 truncated, at most 15.
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += kQK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < kQK; j++)
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        auto code = [&](float v) { return std::min(15, std::max(0, (int)(v * id + 8.5f))); };
        for (int j = 0; j < kQK / 2; j++) y[b].qs[j] = (uint8_t)(code(x[j]) | code(x[j + kQK / 2]) << 4);
    }
}

// ggml's MXFP4 (quantize_row_mxfp4_ref): the block's exponent e = floor(log2 max|x|) - 2 + 127, so
// the largest level (12, doubled 6) times e8m0_half(e) covers max|x|; each value takes the level
// nearest x / e8m0_half(e), the first of equals on a tie.
void quantize_mxfp4(const float* x, BlockMxfp4* y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += kQK) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; j++) amax = std::max(amax, std::fabs(x[j]));
        const uint8_t e = amax > 0.0f ? (uint8_t)(std::floor(std::log2(amax)) - 2 + 127) : 0;
        const float d = e8m0_half(e);
        auto code = [&](float v) {
            int best = 0;
            float err = std::fabs((float)kValuesMxfp4[0] * d - v);
            for (int i = 1; i < 16; i++) {
                const float ei = std::fabs((float)kValuesMxfp4[i] * d - v);
                if (ei < err) best = i, err = ei;
            }
            return best;
        };
        y[b].e = e;
        for (int j = 0; j < kQK / 2; j++) y[b].qs[j] = (uint8_t)(code(x[j]) | code(x[j + kQK / 2]) << 4);
    }
}

// Q4_K and Q5_K: 8 sub-blocks of 32, value = (d * sc) * q - dmin * m with q in [0, n_max]. The
// covering rule, per super-block:
//   1. each sub-block needs an offset lo_j = max(0, -min x) (ggml's offsets only go down);
//      dmin = max lo_j / 63 rounded UP to F16, m_j the smallest 6-bit value with dmin * m_j >= lo_j;
//   2. each sub-block needs a step r_j with r_j * n_max - dmin * m_j >= max x;
//      d = max r_j / 63 rounded UP to F16, sc_j the smallest 6-bit value whose step d * sc_j reaches it.
// So the grid of every sub-block spans its values after the scales are rounded to their stored
// widths, and rounding to the nearest code errs by at most half the sub-block's step d * sc_j
// (plus float rounding). The step exceeds the ideal r_j by less than one d.
struct KScales {
    uint16_t d = 0, dmin = 0;
    int sc[8] = {}, m[8] = {};
};

KScales k_quant_scales(const float* x, int n_max) {
    KScales k;
    float lo[8], hi[8];
    float lo_max = 0.0f;
    for (int j = 0; j < 8; j++) {
        lo[j] = 0.0f;
        hi[j] = -INFINITY;
        for (int l = 0; l < 32; l++) {
            lo[j] = std::max(lo[j], -x[32 * j + l]);
            hi[j] = std::max(hi[j], x[32 * j + l]);
        }
        lo_max = std::max(lo_max, lo[j]);
    }
    k.dmin = f16_at_least(lo_max / 63.0f);
    const float dmin = f16_to_f32(k.dmin);
    float ml[8], r_max = 0.0f;
    for (int j = 0; j < 8; j++) {
        k.m[j] = dmin > 0.0f ? smallest_covering(63, [&](int m) { return dmin * (float)m >= lo[j]; }) : 0;
        ml[j] = dmin * (float)k.m[j];
        r_max = std::max(r_max, (hi[j] + ml[j]) / (float)n_max);
    }
    k.d = f16_at_least(r_max / 63.0f);
    const float d = f16_to_f32(k.d);
    for (int j = 0; j < 8; j++)
        k.sc[j] = d > 0.0f ? smallest_covering(63, [&](int s) { return (d * (float)s) * (float)n_max - ml[j] >= hi[j]; })
                           : 0;
    return k;
}

// The 12 bytes of 6-bit scales and mins, as quants.cpp's q4k_scale_min reads them.
void pack_k_scales(const KScales& k, uint8_t s[12]) {
    std::memset(s, 0, 12);
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)k.sc[j];
        s[j + 4] = (uint8_t)k.m[j];
    }
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (uint8_t)((k.sc[j] & 0x0f) | (k.m[j] & 0x0f) << 4);
        s[j - 4] |= (uint8_t)((k.sc[j] >> 4) << 6);
        s[j] |= (uint8_t)((k.m[j] >> 4) << 6);
    }
}

// Codes of one super-block in [0, n_max], nearest to x on each sub-block's grid.
void k_quant_codes(const float* x, const KScales& k, int n_max, int q[256]) {
    const float d = f16_to_f32(k.d), dmin = f16_to_f32(k.dmin);
    for (int j = 0; j < 8; j++) {
        const float dl = d * (float)k.sc[j], ml = dmin * (float)k.m[j];
        for (int l = 0; l < 32; l++) q[32 * j + l] = dl > 0.0f ? nearest((x[32 * j + l] + ml) / dl, 0, n_max) : 0;
    }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += kQKK) {
        const KScales k = k_quant_scales(x, 15);
        int q[256];
        k_quant_codes(x, k, 15, q);
        y[b].d = k.d;
        y[b].dmin = k.dmin;
        pack_k_scales(k, y[b].scales);
        // Each 64 elements: the first sub-block in the low nibbles of 32 bytes, the second in the high.
        for (int pair = 0; pair < 4; pair++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * pair + l] = (uint8_t)(q[64 * pair + l] | q[64 * pair + 32 + l] << 4);
    }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += kQKK) {
        const KScales k = k_quant_scales(x, 31);
        int q[256];
        k_quant_codes(x, k, 31, q);
        y[b].d = k.d;
        y[b].dmin = k.dmin;
        pack_k_scales(k, y[b].scales);
        std::memset(y[b].qh, 0, sizeof y[b].qh);
        for (int pair = 0; pair < 4; pair++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * pair + l] = (uint8_t)((q[64 * pair + l] & 0x0f) | (q[64 * pair + 32 + l] & 0x0f) << 4);
        // Bit `sub` of qh[l]: the 5th bit of element l of sub-block `sub`.
        for (int sub = 0; sub < 8; sub++)
            for (int l = 0; l < 32; l++) y[b].qh[l] |= (uint8_t)(((q[32 * sub + l] >> 4) & 1) << sub);
    }
}

// Q6_K: 16 sub-blocks of 16, value = (d * sc) * (q - 32), q in [0, 63], sc a signed byte (we use
// 0..127). The same covering rule without a min: sub-block j needs a step r_j with 31 r_j >= max x
// and -32 r_j <= min x; d = max r_j / 127 rounded up to F16, sc_j the smallest step reaching r_j.
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += kQKK) {
        float hi[16], lo[16], r_max = 0.0f;
        for (int j = 0; j < 16; j++) {
            hi[j] = 0.0f;
            lo[j] = 0.0f;
            for (int l = 0; l < 16; l++) {
                hi[j] = std::max(hi[j], x[16 * j + l]);
                lo[j] = std::min(lo[j], x[16 * j + l]);
            }
            r_max = std::max({r_max, hi[j] / 31.0f, -lo[j] / 32.0f});
        }
        const uint16_t d16 = f16_at_least(r_max / 127.0f);
        const float d = f16_to_f32(d16);
        int q[256];
        for (int j = 0; j < 16; j++) {
            const int sc = d > 0.0f ? smallest_covering(127, [&](int s) {
                const float dl = d * (float)s;
                return dl * 31.0f >= hi[j] && dl * -32.0f <= lo[j];
            })
                                    : 0;
            y[b].scales[j] = (int8_t)sc;
            const float dl = d * (float)sc;
            for (int l = 0; l < 16; l++) q[16 * j + l] = dl > 0.0f ? nearest(x[16 * j + l] / dl + 32.0f, 0, 63) : 32;
        }
        y[b].d = d16;
        // Each half of 128: element 32 r + l keeps its low 4 bits in the low (r < 2) or high nibble
        // of ql[l + 32 (r % 2)], its high 2 bits at bits 2r of qh[l].
        for (int half = 0; half < 2; half++) {
            uint8_t* ql = y[b].ql + 64 * half;
            uint8_t* qh = y[b].qh + 32 * half;
            std::memset(ql, 0, 64);
            std::memset(qh, 0, 32);
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) {
                    const int v = q[128 * half + 32 * r + l];
                    ql[l + 32 * (r % 2)] |= (uint8_t)((v & 0x0f) << (4 * (r / 2)));
                    qh[l] |= (uint8_t)((v >> 4) << (2 * r));
                }
        }
    }
}

}  // namespace

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) { quantize_q4_0(x, y, n / kQK); }

bool quantize_supported(GgmlType type) {
    switch (type) {
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0: case GgmlType::Q8_0:
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::MXFP4: return true;
        default: return false;
    }
}

Expected<bool> quantize_row(GgmlType type, const float* x, int64_t n, void* out) {
    const char* name = ggml_type_name((uint32_t)type);
    if (!quantize_supported(type))
        return make_error("cannot quantize to ", name, ": the writers are F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4");
    const int64_t be = ggml_type_block_elems(type);
    if (n < 0 || n % be != 0)
        return make_error("cannot quantize a row of ", std::to_string(n), " values to ", name,
                          ": not a multiple of its block width ", std::to_string(be));
    // The largest magnitude whose k-quant scale (|x| / 31 / 63 for Q5_K) still fits an F16.
    constexpr float kMaxAbs = 1e5f;
    for (int64_t i = 0; i < n; i++)
        if (!std::isfinite(x[i]) || (be > 1 && std::fabs(x[i]) > kMaxAbs))
            return make_error("cannot quantize value ", std::to_string(x[i]), " (element ", std::to_string(i), ") to ",
                              name, ": block types need finite values of magnitude at most 1e5");
    const int64_t nb = n / be;
    switch (type) {
        case GgmlType::F32: std::memcpy(out, x, (size_t)n * 4); break;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; i++) static_cast<uint16_t*>(out)[i] = f32_to_f16(x[i]);
            break;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; i++) static_cast<uint16_t*>(out)[i] = f32_to_bf16(x[i]);
            break;
        case GgmlType::Q4_0: quantize_q4_0(x, static_cast<BlockQ4_0*>(out), nb); break;
        case GgmlType::Q8_0: quantize_row_q8_0(x, static_cast<BlockQ8_0*>(out), n); break;
        case GgmlType::Q4_K: quantize_q4_k(x, static_cast<BlockQ4_K*>(out), nb); break;
        case GgmlType::Q5_K: quantize_q5_k(x, static_cast<BlockQ5_K*>(out), nb); break;
        case GgmlType::Q6_K: quantize_q6_k(x, static_cast<BlockQ6_K*>(out), nb); break;
        case GgmlType::MXFP4: quantize_mxfp4(x, static_cast<BlockMxfp4*>(out), nb); break;
        default: break;
    }
    return true;
}

Expected<WeightFormat> parse_weight_format(const std::string& name) {
    std::string s = name;
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    if (s == "q4_k_m") return WeightFormat{GgmlType::Q4_K, QuantMix::Q4_K_M};
    if (s == "q5_k_m") return WeightFormat{GgmlType::Q5_K, QuantMix::Q5_K_M};
    if (s == "q4_0") return WeightFormat{GgmlType::Q4_0, QuantMix::NONE};
    if (s == "q4_k") return WeightFormat{GgmlType::Q4_K, QuantMix::NONE};
    if (s == "q5_k") return WeightFormat{GgmlType::Q5_K, QuantMix::NONE};
    if (s == "q6_k") return WeightFormat{GgmlType::Q6_K, QuantMix::NONE};
    if (s == "mxfp4" || s == "mxfp4_moe") return WeightFormat{GgmlType::MXFP4, QuantMix::MXFP4_MOE};
    if (auto t = parse_ggml_type(s)) return WeightFormat{*t, QuantMix::NONE};
    return make_error("unknown weight type '", name,
                      "'; use f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, or the mixes q4_k_m, q5_k_m, mxfp4_moe");
}

bool use_more_bits(int i_layer, int n_layer) {
    return i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2;
}

GgmlType format_tensor_type(const WeightFormat& f, const std::string& name, int n_layer, bool tied_output) {
    if (f.mix == QuantMix::NONE) return f.type;
    // llama-quantize's MXFP4_MOE: the experts' 3-D tensors MXFP4, every other matrix Q8_0.
    if (f.mix == QuantMix::MXFP4_MOE) return name.find("_exps.weight") != std::string::npos ? GgmlType::MXFP4 : GgmlType::Q8_0;
    if (name == "output.weight" || (tied_output && name == "token_embd.weight")) return GgmlType::Q6_K;
    int layer = -1;
    if (name.rfind("blk.", 0) == 0) layer = std::atoi(name.c_str() + 4);
    const bool more = layer >= 0 && use_more_bits(layer, n_layer);
    if (more && (name.find(".attn_v.weight") != std::string::npos || name.find(".ffn_down.weight") != std::string::npos))
        return GgmlType::Q6_K;
    return f.type;
}

uint32_t format_file_type(const WeightFormat& f) {
    if (f.mix == QuantMix::Q4_K_M) return 15;
    if (f.mix == QuantMix::Q5_K_M) return 17;
    if (f.mix == QuantMix::MXFP4_MOE) return 38;
    switch (f.type) {
        case GgmlType::F32: return 0;
        case GgmlType::F16: return 1;
        case GgmlType::Q4_0: return 2;
        case GgmlType::Q8_0: return 7;
        case GgmlType::Q4_K: return 14;
        case GgmlType::Q5_K: return 16;
        case GgmlType::Q6_K: return 18;
        default: return 32;  // BF16
    }
}

}  // namespace steward
