// The forward pass's CUDA kernels (gpu/kernels.h says what each computes and names its CPU twin).
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <type_traits>

#include "gpu/cuda_check.h"
#include "gpu/kernels.h"
#include "kv/fp8_e4m3.h"

namespace steward::gpu {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int threads = kThreads) { return (int)((n + threads - 1) / threads); }

__device__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ uint16_t float_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum / max over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <typename T>
__device__ T block_sum(T v) {
    __shared__ T part[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // part[] may still be read by a previous call
    if (lane == 0) part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : T(0);
    return warp_sum(v);
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max(v);
}

// ---- embedding

__global__ void embed_kernel(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens, int n_embd,
                             float* out) {
    const int t = blockIdx.x;
    const uint8_t* row = table + (int64_t)tokens[t] * row_bytes;
    float* y = out + (int64_t)t * n_embd;
    for (int e = threadIdx.x; e < n_embd; e += blockDim.x) {
        float v;
        switch (type) {
            case (int)GgmlType::F32: v = reinterpret_cast<const float*>(row)[e]; break;
            case (int)GgmlType::F16: v = half_bits_to_float(reinterpret_cast<const uint16_t*>(row)[e]); break;
            case (int)GgmlType::BF16: v = __uint_as_float((uint32_t)reinterpret_cast<const uint16_t*>(row)[e] << 16); break;
            default: {  // Q8_0: 34-byte blocks, an F16 scale then 32 int8
                const uint8_t* b = row + (int64_t)(e / kQ8BlockSize) * sizeof(BlockQ8_0);
                const float d = half_bits_to_float(*reinterpret_cast<const uint16_t*>(b));
                v = d * (float)reinterpret_cast<const int8_t*>(b + 2)[e % kQ8BlockSize];
            }
        }
        y[e] = v;
    }
}

// ---- norms, RoPE, elementwise

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int n, float* y) {
    const float* xr = x + (int64_t)blockIdx.x * n;
    float* yr = y + (int64_t)blockIdx.x * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

__global__ void rope_kernel(float* x, const int32_t* pos, int n_heads, int head_dim, int n_rot, float freq_base,
                            float freq_scale, const float* freq_factors, int neox) {
    const int t = blockIdx.x, half = n_rot / 2;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        double theta = pos[t] * pow((double)freq_base, -2.0 * i / n_rot) * (double)freq_scale;
        if (freq_factors) theta /= (double)freq_factors[i];
        const float cs = (float)cos(theta), sn = (float)sin(theta);
        float* xh = x + ((int64_t)t * n_heads + h) * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = xh[a], x1 = xh[b];
        xh[a] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        xh[b] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
    }
}

__global__ void swiglu_kernel(float* g, const float* u, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void add_bias_kernel(float* y, const float* b, int n, int64_t total) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % n];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void gather_rows_kernel(const float* src, const int32_t* rows, int n, float* dst) {
    const float* s = src + (int64_t)rows[blockIdx.x] * n;
    float* d = dst + (int64_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

__global__ void to_f16_kernel(const float* x, uint16_t* y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = float_to_half_bits(x[i]);
}

// ---- dequantization to F16 (products and differences rounded as the CPU's, never fused)

__global__ void dequant_q8_0_kernel(const uint8_t* blocks, int64_t n, uint16_t* out) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const uint8_t* b = blocks + (e / kQ8BlockSize) * (int64_t)sizeof(BlockQ8_0);
    const float d = half_bits_to_float(*reinterpret_cast<const uint16_t*>(b));
    out[e] = float_to_half_bits(__fmul_rn(d, (float)reinterpret_cast<const int8_t*>(b + 2)[e % kQ8BlockSize]));
}

// One block of 256 threads per Q4_K super-block (144 bytes: d, dmin, 12 bytes of packed 6-bit scales
// and mins, 128 bytes of nibbles); thread e makes element e. Layout as quants.cpp's dequantize_q4_k.
__global__ void dequant_q4_k_kernel(const uint8_t* blocks, uint16_t* out) {
    const uint8_t* b = blocks + (int64_t)blockIdx.x * 144;
    const int e = threadIdx.x, pair = e / 64, nib = (e % 64) / 32, l = e % 32, j = 2 * pair + nib;
    const float d = half_bits_to_float(*reinterpret_cast<const uint16_t*>(b));
    const float dmin = half_bits_to_float(*reinterpret_cast<const uint16_t*>(b + 2));
    const uint8_t* sc = b + 4;
    int scale, min;
    if (j < 4) {
        scale = sc[j] & 63;
        min = sc[j + 4] & 63;
    } else {
        scale = (sc[j + 4] & 0x0f) | (sc[j - 4] >> 6) << 4;
        min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
    const int q = (b[16 + 32 * pair + l] >> (4 * nib)) & 0x0f;
    const float dl = __fmul_rn(d, (float)scale), ml = __fmul_rn(dmin, (float)min);
    out[(int64_t)blockIdx.x * 256 + e] = float_to_half_bits(__fsub_rn(__fmul_rn(dl, (float)q), ml));
}

// ---- KV

// The KV element types on the device, one C++ type each: F32 float, F16 uint16_t (bits), BF16 and
// FP8 E4M3 as tagged bits (kv/fp8_e4m3.h's conversion, the CPU twin, compiled here as is).
struct Bf16 {
    uint16_t bits;
};
struct Fp8 {
    uint8_t bits;
};

template <typename T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) { return v; }
template <>
__device__ uint16_t from_float<uint16_t>(float v) { return float_to_half_bits(v); }
template <>
__device__ Bf16 from_float<Bf16>(float v) {  // round to nearest even, as f32_to_bf16
    const uint32_t x = __float_as_uint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return Bf16{(uint16_t)((x >> 16) | 0x40)};
    return Bf16{(uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}
template <>
__device__ Fp8 from_float<Fp8>(float v) { return Fp8{fp8_e4m3_from_f32(v)}; }

// Calls f with a null pointer of the device type of t (F32, F16, BF16, FP8); false for the others.
template <typename F>
bool with_kv_type(KvDtype t, F&& f) {
    switch (t) {
        case KvDtype::F32: f((float*)nullptr); return true;
        case KvDtype::F16: f((uint16_t*)nullptr); return true;
        case KvDtype::BF16: f((Bf16*)nullptr); return true;
        case KvDtype::FP8_E4M3: f((Fp8*)nullptr); return true;
        default: return false;
    }
}

template <typename TK, typename TV>
__global__ void kv_write_kernel(const float* k, const float* v, const int32_t* slots, int kvd, TK* kl, TV* vl) {
    const int t = blockIdx.x;
    const int64_t dst = (int64_t)slots[t] * kvd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kl[dst + i] = from_float<TK>(k[(int64_t)t * kvd + i]);
        vl[dst + i] = from_float<TV>(v[(int64_t)t * kvd + i]);
    }
}

// Moves slot rows (kb bytes of K, vb of V) between the pool and tmp ([n][kb] K rows, then [n][vb]).
__global__ void kv_slots_to_tmp(const int32_t* slots, int n, int kb, int vb, const uint8_t* kl, const uint8_t* vl,
                                uint8_t* tmp) {
    const int i = blockIdx.x;
    for (int c = threadIdx.x; c < kb; c += blockDim.x) tmp[(int64_t)i * kb + c] = kl[(int64_t)slots[i] * kb + c];
    for (int c = threadIdx.x; c < vb; c += blockDim.x)
        tmp[(int64_t)n * kb + (int64_t)i * vb + c] = vl[(int64_t)slots[i] * vb + c];
}
__global__ void kv_tmp_to_slots(const int32_t* slots, int n, int kb, int vb, uint8_t* kl, uint8_t* vl, const uint8_t* tmp) {
    const int i = blockIdx.x;
    for (int c = threadIdx.x; c < kb; c += blockDim.x) kl[(int64_t)slots[i] * kb + c] = tmp[(int64_t)i * kb + c];
    for (int c = threadIdx.x; c < vb; c += blockDim.x)
        vl[(int64_t)slots[i] * vb + c] = tmp[(int64_t)n * kb + (int64_t)i * vb + c];
}

// ---- attention: one block per (token, query head). Scores for every slot of the sequence go to
// shared memory ([max_slots], -inf where the slot is not visible), one warp per slot; then the
// block's max and sum; then each thread accumulates output dims over the visible slots.

template <typename T>
__device__ float kv_elem(const T* p, int i);
template <>
__device__ float kv_elem<float>(const float* p, int i) { return p[i]; }
template <>
__device__ float kv_elem<uint16_t>(const uint16_t* p, int i) { return half_bits_to_float(p[i]); }
template <>
__device__ float kv_elem<Bf16>(const Bf16* p, int i) { return __uint_as_float((uint32_t)p[i].bits << 16); }
template <>
__device__ float kv_elem<Fp8>(const Fp8* p, int i) { return fp8_e4m3_to_f32(p[i].bits); }

template <typename TK, typename TV>
__global__ void attention_kernel(const float* q, const TK* kl, const TV* vl, int block_size, int n_head, int n_head_kv,
                                 int head_dim, float scale, AttnBatch b, float* out) {
    extern __shared__ float sm[];
    float* qs = sm;             // [head_dim]
    float* sc = sm + head_dim;  // [max_slots]
    const int t = blockIdx.x, h = blockIdx.y, g = h / (n_head / n_head_kv);
    const int s = b.tok_seq[t], i = b.tok_i[t];
    const int n_past = b.seq_n_past[s], n_new = b.seq_n_new[s], n_slots = n_past + n_new;
    const int32_t* bt = b.bt + b.seq_bt_off[s];
    const uint8_t* mrow = b.seq_mask_off[s] < 0 ? nullptr : b.mask + b.seq_mask_off[s] + (int64_t)i * n_new;
    const int kvd = n_head_kv * head_dim;
    const float* qh = q + ((int64_t)t * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();

    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int slot = w; slot < n_slots; slot += nw) {
        const bool vis = slot < n_past || (mrow ? mrow[slot - n_past] != 0 : slot - n_past <= i);
        if (!vis) {
            if (lane == 0) sc[slot] = -INFINITY;
            continue;
        }
        const TK* kp = kl + ((int64_t)bt[slot / block_size] * block_size + slot % block_size) * kvd + (int64_t)g * head_dim;
        float dot = 0;
        for (int d = lane; d < head_dim; d += 32) dot += qs[d] * kv_elem(kp, d);
        dot = warp_sum(dot);
        if (lane == 0) sc[slot] = dot * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int k = threadIdx.x; k < n_slots; k += blockDim.x) mx = fmaxf(mx, sc[k]);
    mx = block_max(mx);
    float sum = 0;
    for (int k = threadIdx.x; k < n_slots; k += blockDim.x) {
        const float e = sc[k] == -INFINITY ? 0.0f : expf(sc[k] - mx);
        sc[k] = e;
        sum += e;
    }
    sum = block_sum(sum);  // its barriers also publish sc[]
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;  // nothing visible: zeros, as the CPU's
    float* oh = out + ((int64_t)t * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0;
        for (int k = 0; k < n_slots; k++) {
            const float p = sc[k];
            if (p == 0.0f) continue;
            const TV* vp = vl + ((int64_t)bt[k / block_size] * block_size + k % block_size) * kvd + (int64_t)g * head_dim;
            acc += p * kv_elem(vp, d);
        }
        oh[d] = acc * inv;
    }
}

// ---- sampling: one block of 1024 threads per row

constexpr int kRowThreads = 1024;

__device__ float clean_logit(float v) { return isnan(v) ? -INFINITY : v; }

__global__ void argmax_kernel(const float* logits, int n_vocab, int32_t* out) {
    const float* l = logits + (int64_t)blockIdx.x * n_vocab;
    float best = -INFINITY;
    int arg = 0;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        const float v = clean_logit(l[i]);
        if (v > best) best = v, arg = i;  // ascending i per thread: the first maximum kept
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
        if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
    }
    __shared__ float pb[32];
    __shared__ int pa[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) pb[w] = best, pa[w] = arg;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); k++)
            if (pb[k] > best || (pb[k] == best && pa[k] < arg)) best = pb[k], arg = pa[k];
        out[blockIdx.x] = arg;
    }
}

// Nucleus by bisection on the weight threshold: weights w_i = exp((l_i - max) / T) lie in [0, 1],
// whose float bit patterns are ordered as integers, so the largest threshold whose kept mass
// (sum of w_i >= threshold) reaches top_p of the total is found exactly in 31 steps; that
// threshold is the weight of the last token the CPU's descending scan keeps.
__global__ void top_p_kernel(const float* logits, int n_vocab, float temperature, float top_p, const float* u,
                             int32_t* out) {
    const float* l = logits + (int64_t)blockIdx.x * n_vocab;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) mx = fmaxf(mx, clean_logit(l[i]));
    mx = block_max(mx);
    if (mx == -INFINITY) {  // nothing above -inf: token 0, as the CPU's
        if (threadIdx.x == 0) out[blockIdx.x] = 0;
        return;
    }
    // Weights as the CPU sampler makes them: float exp of the shifted, scaled logit; sums in double.
    const double inv_temp = 1.0 / (double)temperature;
    auto weight = [&](int i) -> double {
        const float v = clean_logit(l[i]);
        if (v == -INFINITY) return 0.0;
        return temperature == 1.0f ? expf(v - mx) : expf((float)(((double)v - mx) * inv_temp));
    };
    auto mass_at = [&](double thr) {
        double m = 0;
        for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
            const double wi = weight(i);
            if (wi > 0 && wi >= thr) m += wi;
        }
        return block_sum(m);
    };
    const double target = top_p * mass_at(0.0);
    uint32_t lo = 0, hi = __float_as_uint(1.0f) + 1;  // mass(lo) >= target > mass(hi)
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (mass_at(__uint_as_float(mid)) >= target) lo = mid; else hi = mid;
    }
    const double thr = __uint_as_float(lo);
    const double kept = mass_at(thr);
    // The draw: the first kept id whose running mass (ascending ids) passes u * kept. Chunk sums
    // per thread, then thread 0 walks the chunks and the chunk that crosses.
    __shared__ double chunk[kRowThreads];
    const int per = (n_vocab + blockDim.x - 1) / blockDim.x;
    const int b0 = threadIdx.x * per, b1 = min(n_vocab, b0 + per);
    double cs = 0;
    for (int i = b0; i < b1; i++) {
        const double wi = weight(i);
        if (wi > 0 && wi >= thr) cs += wi;
    }
    chunk[threadIdx.x] = cs;
    __syncthreads();
    if (threadIdx.x != 0) return;
    const double goal = (double)u[blockIdx.x] * kept;
    double run = 0;
    int last = -1;
    for (int c = 0; c < (int)blockDim.x; c++) {
        if (run + chunk[c] <= goal) {
            run += chunk[c];
            continue;
        }
        for (int i = c * per; i < min(n_vocab, (c + 1) * per); i++) {
            const double wi = weight(i);
            if (!(wi > 0 && wi >= thr)) continue;
            last = i;
            run += wi;
            if (run > goal) {
                out[blockIdx.x] = i;
                return;
            }
        }
    }
    // Rounding left the goal just past the total: the last kept token.
    if (last < 0)
        for (int i = n_vocab - 1; i >= 0 && last < 0; i--)
            if (weight(i) > 0 && weight(i) >= thr) last = i;
    out[blockIdx.x] = last;
}

__global__ void fill_random_f16_kernel(uint16_t* y, int64_t n, float scale, uint64_t seed) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float r = (float)(z >> 40) / (float)(1ull << 24);  // [0, 1)
    y[i] = float_to_half_bits((2.0f * r - 1.0f) * scale);
}

__global__ void fill_f32_kernel(float* y, int64_t n, float v) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}

}  // namespace

Expected<bool> embed_rows(GgmlType type, const void* table, int64_t row_bytes, const int32_t* tokens, int n_tok,
                          int n_embd, float* out, cudaStream_t s) {
    if (type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16 && type != GgmlType::Q8_0)
        return make_error("gpu embed_rows: type ", ggml_type_name((uint32_t)type),
                          " is not F32, F16, BF16 or Q8_0; dequantize the table to F16 first");
    if (n_tok == 0) return true;
    embed_kernel<<<n_tok, kThreads, 0, s>>>((int)type, static_cast<const uint8_t*>(table), row_bytes, tokens, n_embd, out);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> rmsnorm(const float* x, const float* w, float eps, int n, int n_rows, float* y, cudaStream_t s) {
    if (n_rows == 0) return true;
    rmsnorm_kernel<<<n_rows, n <= 128 ? 128 : kThreads, 0, s>>>(x, w, eps, n, y);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> rope(float* x, const int32_t* pos, int n_tok, int n_heads, int head_dim, int n_rot, float freq_base,
                    float freq_scale, const float* freq_factors, RopeType type, cudaStream_t s) {
    if (n_tok == 0) return true;
    rope_kernel<<<n_tok, kThreads, 0, s>>>(x, pos, n_heads, head_dim, n_rot, freq_base, freq_scale, freq_factors,
                                           type == RopeType::NEOX);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> swiglu(float* g, const float* u, int64_t n, cudaStream_t s) {
    if (n == 0) return true;
    swiglu_kernel<<<blocks_for(n), kThreads, 0, s>>>(g, u, n);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> add_bias(float* y, const float* b, int n, int n_rows, cudaStream_t s) {
    const int64_t total = (int64_t)n * n_rows;
    if (total == 0) return true;
    add_bias_kernel<<<blocks_for(total), kThreads, 0, s>>>(y, b, n, total);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> add(float* x, const float* y, int64_t n, cudaStream_t s) {
    if (n == 0) return true;
    add_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> gather_rows(const float* src, const int32_t* rows, int n_rows, int n, float* dst, cudaStream_t s) {
    if (n_rows == 0) return true;
    gather_rows_kernel<<<n_rows, kThreads, 0, s>>>(src, rows, n, dst);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
    if (n == 0) return true;
    to_f16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> dequantize_to_f16(GgmlType type, const void* blocks, int64_t n_elems, uint16_t* out, cudaStream_t s) {
    const auto* b = static_cast<const uint8_t*>(blocks);
    if (type == GgmlType::Q8_0) {
        if (n_elems % kQ8BlockSize != 0) return make_error("gpu dequantize Q8_0: ", n_elems, " elements, not a multiple of 32");
        if (n_elems) dequant_q8_0_kernel<<<blocks_for(n_elems), kThreads, 0, s>>>(b, n_elems, out);
    } else if (type == GgmlType::Q4_K) {
        if (n_elems % 256 != 0) return make_error("gpu dequantize Q4_K: ", n_elems, " elements, not a multiple of 256");
        if (n_elems) dequant_q4_k_kernel<<<(unsigned)(n_elems / 256), 256, 0, s>>>(b, out);
    } else {
        return make_error("gpu dequantize: type ", ggml_type_name((uint32_t)type),
                          " has no device dequantizer (Q8_0, Q4_K); dequantize it on the host");
    }
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> gemm(cublasHandle_t h, GgmlType wtype, const void* W, int64_t n_rows, int64_t n_cols, const float* X,
                    int n_tok, uint16_t* x16, float* Y) {
    if (n_tok == 0) return true;
    // Row-major Y[T][R] = X[T][C] W[R][C]^T is, column-major, Y (R x T) = W^T (op T of the C x R
    // buffer) * X (C x T).
    const float one = 1.0f, zero = 0.0f;
    const int m = (int)n_rows, n = n_tok, k = (int)n_cols;
    auto api = cublas();
    if (!api) return api.error();
    const CublasApi* blas = *api;
    if (wtype == GgmlType::F32) {
        CUBLAS_TRY(blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_32F, k, X, CUDA_R_32F, k, &zero, Y,
                                 CUDA_R_32F, m, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
        return true;
    }
    if (wtype != GgmlType::F16)
        return make_error("gpu gemm: weight type ", ggml_type_name((uint32_t)wtype), " is not F32 or F16");
    cudaStream_t s = nullptr;
    CUBLAS_TRY(blas->get_stream(h, &s));
    STEWARD_TRY(to_f16(X, x16, (int64_t)n_tok * n_cols, s));
    CUBLAS_TRY(blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_16F, k, x16, CUDA_R_16F, k, &zero, Y,
                             CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return true;
}

Expected<bool> kv_write(const float* k, const float* v, const int32_t* slots, int n_tok, int kvd, KvDtype dtype_k,
                        KvDtype dtype_v, void* k_layer, void* v_layer, cudaStream_t s) {
    if (n_tok == 0) return true;
    const bool known = with_kv_type(dtype_k, [&](auto* tk) {
        using TK = std::remove_pointer_t<decltype(tk)>;
        with_kv_type(dtype_v, [&](auto* tv) {
            using TV = std::remove_pointer_t<decltype(tv)>;
            kv_write_kernel<<<n_tok, kThreads, 0, s>>>(k, v, slots, kvd, static_cast<TK*>(k_layer), static_cast<TV*>(v_layer));
        });
    });
    if (!known || !with_kv_type(dtype_v, [](auto*) {}))
        return make_error("gpu kv_write: KV types ", kv_dtype_name(dtype_k), " / ", kv_dtype_name(dtype_v),
                          " have no CUDA kernels (f32, f16, bf16, fp8)");
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> kv_copy_slots(const int32_t* src, const int32_t* dst, int n, int64_t k_slot_bytes, int64_t v_slot_bytes,
                             void* k_layer, void* v_layer, void* tmp, cudaStream_t s) {
    if (n == 0) return true;
    auto *kl = static_cast<uint8_t*>(k_layer), *vl = static_cast<uint8_t*>(v_layer), *t = static_cast<uint8_t*>(tmp);
    const int kb = (int)k_slot_bytes, vb = (int)v_slot_bytes;
    kv_slots_to_tmp<<<n, kThreads, 0, s>>>(src, n, kb, vb, kl, vl, t);
    CUDA_TRY_LAUNCH();
    kv_tmp_to_slots<<<n, kThreads, 0, s>>>(dst, n, kb, vb, kl, vl, t);
    CUDA_TRY_LAUNCH();
    return true;
}

namespace {

// The device's opt-in shared memory per block, asked once, and the attention kernels allowed to
// use it (less 1 KiB for their static shared memory) once: no attribute call is left for a launch,
// which a decode graph's capture may be recording.
struct AttnSmem {
    int max_bytes = 0;
    std::string error;
};
const AttnSmem& attn_smem() {
    static const AttnSmem a = [] {
        AttnSmem r;
        auto probe = []() -> Expected<int> {
            int dev = 0, smem_max = 0;
            CUDA_TRY(cudaGetDevice(&dev));
            CUDA_TRY(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
            const int usable = std::max(0, smem_max - 1024);
            cudaError_t err = cudaSuccess;
            for (KvDtype k : {KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::FP8_E4M3})
                for (KvDtype v : {KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::FP8_E4M3})
                    with_kv_type(k, [&](auto* tk) {
                        with_kv_type(v, [&](auto* tv) {
                            using TK = std::remove_pointer_t<decltype(tk)>;
                            using TV = std::remove_pointer_t<decltype(tv)>;
                            const cudaError_t e = cudaFuncSetAttribute(attention_kernel<TK, TV>,
                                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, usable);
                            if (err == cudaSuccess) err = e;
                        });
                    });
            CUDA_TRY(err);
            return usable;
        };
        auto got = probe();
        if (got) r.max_bytes = *got;
        else r.error = got.error().message;
        return r;
    }();
    return a;
}

}  // namespace

Expected<int> attention_max_slots(int head_dim) {
    const AttnSmem& a = attn_smem();
    if (!a.error.empty()) return make_error(a.error);
    return std::max(0, a.max_bytes / (int)sizeof(float) - head_dim);
}

Expected<bool> attention(const float* q, const void* k_layer, const void* v_layer, KvDtype dtype_k, KvDtype dtype_v, int block_size,
                         int n_head, int n_head_kv, int head_dim, float scale, const AttnBatch& b, int n_tok,
                         float* out, cudaStream_t s) {
    if (n_tok == 0) return true;
    const size_t smem = ((size_t)head_dim + b.max_slots) * sizeof(float);
    const AttnSmem& a = attn_smem();
    if (!a.error.empty()) return make_error(a.error);
    if (smem > (size_t)a.max_bytes)
        return make_error("gpu attention: ", b.max_slots, " slots need ", (int64_t)smem, " bytes of shared memory, over the device's ",
                          a.max_bytes + 1024, "; shorten the context (max about ", a.max_bytes / 4 - head_dim, " slots)");
    const dim3 grid((unsigned)n_tok, (unsigned)n_head);
    bool known_v = false;
    const bool known_k = with_kv_type(dtype_k, [&](auto* tk) {
        known_v = with_kv_type(dtype_v, [&](auto* tv) {
            using TK = std::remove_pointer_t<decltype(tk)>;
            using TV = std::remove_pointer_t<decltype(tv)>;
            attention_kernel<TK, TV><<<grid, 128, smem, s>>>(q, static_cast<const TK*>(k_layer), static_cast<const TV*>(v_layer),
                                                             block_size, n_head, n_head_kv, head_dim, scale, b, out);
        });
    });
    if (!known_k || !known_v)
        return make_error("gpu attention: KV types ", kv_dtype_name(dtype_k), " / ", kv_dtype_name(dtype_v),
                          " have no CUDA kernels (f32, f16, bf16, fp8)");
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> argmax_rows(const float* logits, int n_rows, int n_vocab, int32_t* out, cudaStream_t s) {
    if (n_rows == 0) return true;
    argmax_kernel<<<n_rows, kRowThreads, 0, s>>>(logits, n_vocab, out);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> sample_top_p(const float* logits, int n_rows, int n_vocab, float temperature, float top_p,
                            const float* u, int32_t* out, cudaStream_t s) {
    if (!(temperature > 0) || !(top_p > 0 && top_p <= 1))
        return make_error("gpu sample_top_p: temperature ", temperature, " / top_p ", top_p,
                          " out of range (temperature > 0, top_p in (0, 1]); use argmax_rows for greedy");
    if (n_rows == 0) return true;
    top_p_kernel<<<n_rows, kRowThreads, 0, s>>>(logits, n_vocab, temperature, top_p, u, out);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> fill_random_f16(uint16_t* y, int64_t n, float scale, uint64_t seed, cudaStream_t s) {
    if (n == 0) return true;
    fill_random_f16_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, n, scale, seed);
    CUDA_TRY_LAUNCH();
    return true;
}

Expected<bool> fill_f32(float* y, int64_t n, float value, cudaStream_t s) {
    if (n == 0) return true;
    fill_f32_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, n, value);
    CUDA_TRY_LAUNCH();
    return true;
}

}  // namespace steward::gpu
