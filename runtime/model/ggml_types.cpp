// Type tables and row conversions for the GGUF tensor types Steward loads.
#include "model/ggml_types.h"

#include "model/quants.h"

#include <cctype>
#include <cmath>

namespace steward {

bool ggml_type_supported(uint32_t type) {
    switch (type) {
        case 0: case 1: case 30: return true;
        default: return dequant_supported((GgmlType)type);
    }
}

const char* ggml_type_name(uint32_t type) {
    switch (type) {
        case 0: return "F32";
        case 1: return "F16";
        case 2: return "Q4_0";
        case 3: return "Q4_1";
        case 6: return "Q5_0";
        case 7: return "Q5_1";
        case 8: return "Q8_0";
        case 9: return "Q8_1";
        case 10: return "Q2_K";
        case 11: return "Q3_K";
        case 12: return "Q4_K";
        case 13: return "Q5_K";
        case 14: return "Q6_K";
        case 15: return "Q8_K";
        case 20: return "IQ4_NL";
        case 23: return "IQ4_XS";
        case 30: return "BF16";
        case 39: return "MXFP4";
        default: return "unknown";
    }
}

int64_t ggml_type_block_elems(GgmlType t) { return quant_block_elems(t); }

int64_t ggml_type_block_bytes(GgmlType t) { return (int64_t)quant_block_bytes(t); }

Expected<GgmlType> parse_ggml_type(const std::string& name) {
    std::string s = name;
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    if (s == "f32") return GgmlType::F32;
    if (s == "f16") return GgmlType::F16;
    if (s == "bf16") return GgmlType::BF16;
    if (s == "q8_0") return GgmlType::Q8_0;
    return make_error("unknown weight type '", name, "'; use f32, f16, bf16 or q8_0");
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
    for (int64_t b = 0; b < n / kQ8BlockSize; b++) {
        const float* xb = x + b * kQ8BlockSize;
        float amax = 0.0f;
        for (int i = 0; i < kQ8BlockSize; i++) amax = std::fmax(amax, std::fabs(xb[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int i = 0; i < kQ8BlockSize; i++) y[b].qs[i] = (int8_t)std::lround(xb[i] * id);
    }
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    switch (t) {
        case GgmlType::F32:
            std::memcpy(dst, src, (size_t)n * 4);
            return;
        case GgmlType::F16: {
            const uint16_t* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
            return;
        }
        case GgmlType::BF16: {
            const uint16_t* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
            return;
        }
        case GgmlType::Q8_0: {
            const BlockQ8_0* s = static_cast<const BlockQ8_0*>(src);
            for (int64_t b = 0; b < n / kQ8BlockSize; b++) {
                const float d = f16_to_f32(s[b].d);
                for (int i = 0; i < kQ8BlockSize; i++) dst[b * kQ8BlockSize + i] = d * s[b].qs[i];
            }
            return;
        }
        default:
            (void)steward::dequantize_row(t, src, n, dst);  // callers hold a type ggml_type_supported took
            return;
    }
}

}  // namespace steward
