// F32 -> ggml's block types, for the synthetic models (the bench's and tests' Q4_0 / Q8_0 / k-quant
// files), and the per-tensor type choice of llama-quantize's Q4_K_M and Q5_K_M mixes.
#pragma once
#include <cstdint>
#include <string>

#include <steward/expected.h>

#include "model/ggml_types.h"

namespace steward {

// True for the types quantize_row writes: F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4.
bool quantize_supported(GgmlType type);

// Encodes n floats into ggml_row_bytes(type, n) bytes at out. Q4_0 and Q8_0 use ggml's own rule
// (the scale is a function of the block's largest magnitude, so re-quantizing a dequantized block
// gives the same bytes back). The k-quants pick each sub-block's scale (and min) so that its grid
// covers the sub-block's values after the scales are rounded to their stored widths, then round
// every value to the nearest grid point: the error per element is at most half that sub-block's
// step. They do not reproduce llama-quantize's least-squares choices byte for byte.
// Errors: a type quantize_supported refuses, n not a multiple of the block width, a value that is
// not finite or too large for an F16 scale.
Expected<bool> quantize_row(GgmlType type, const float* x, int64_t n, void* out);

// ggml's Q4_0 quantizer (quantize_row_q4_0_ref) over n floats, n a multiple of 32: per block
// d = (the value of largest magnitude) / -8, q = x / d + 8 rounded, at most 15. No checks (the KV
// cache's writer; quantize_row is the checked entry).
struct BlockQ4_0;
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);

// How llama-quantize assigns types per tensor. NONE: every matrix the one type.
// MXFP4_MOE: the experts' matrices MXFP4, every other matrix Q8_0 (llama-quantize's MXFP4_MOE).
enum class QuantMix { NONE, Q4_K_M, Q5_K_M, MXFP4_MOE };

struct WeightFormat {
    GgmlType type = GgmlType::F32;  // the matrices' type; for a mix its base (Q4_K, Q5_K)
    QuantMix mix = QuantMix::NONE;
};

// The CLI's --dtype names (any case): f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m,
// mxfp4_moe (or mxfp4).
Expected<WeightFormat> parse_weight_format(const std::string& name);

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between.
bool use_more_bits(int i_layer, int n_layer);

// The type of matrix `name` (a GGUF tensor name) in format f, as llama-quantize chooses it for a
// dense model of n_layer layers: in a mix, output.weight (or token_embd.weight when the output is
// tied to it) is Q6_K, and blk.N.attn_v / blk.N.ffn_down are Q6_K in the layers use_more_bits picks;
// every other matrix has the base type. Norms and biases are not matrices (always F32).
GgmlType format_tensor_type(const WeightFormat& f, const std::string& name, int n_layer, bool tied_output);

// llama.h's llama_ftype for general.file_type (a plain k-quant writes its _S variant's id).
uint32_t format_file_type(const WeightFormat& f);

}  // namespace steward
