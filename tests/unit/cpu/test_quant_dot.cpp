// The integer dot-product kernels (cpu/quant_dot.h) against the reference dequantizer and a
// double-precision dot with the unquantized activations, every path against the scalar twin, and
// matmul's quantized streaming path against its exact path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/quant_dot.h"
#include "cpu/thread_pool.h"
#include "model/quants.h"

using namespace steward;

namespace {

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,
                           GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,
                           GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                           GgmlType::MXFP4};

// Bytes of the fp16 scale fields in each block (d, and the min scale m / dmin where the type has one).
std::vector<size_t> scale_offsets(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0: return {offsetof(BlockQ4_0, d)};
        case GgmlType::Q4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
        case GgmlType::Q5_0: return {offsetof(BlockQ5_0, d)};
        case GgmlType::Q5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
        case GgmlType::Q8_0: return {offsetof(BlockQ8_0, d)};
        case GgmlType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
        case GgmlType::Q3_K: return {offsetof(BlockQ3_K, d)};
        case GgmlType::Q4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
        case GgmlType::Q5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
        case GgmlType::Q6_K: return {offsetof(BlockQ6_K, d)};
        case GgmlType::IQ4_NL: return {offsetof(BlockIq4Nl, d)};
        case GgmlType::IQ4_XS: return {offsetof(BlockIq4Xs, d)};
        default: return {};
    }
}

// n_rows rows of n_cols weights: random bytes in every code, scale and mask field, then each fp16
// scale overwritten with a finite value of either sign, 1e-3 .. 2e-2 in magnitude.
std::vector<uint8_t> random_weights(GgmlType t, int64_t n_rows, int64_t n_cols, std::mt19937& rng) {
    const int64_t n_blocks = n_rows * n_cols / quant_block_elems(t);
    const size_t bb = quant_block_bytes(t);
    std::vector<uint8_t> w((size_t)n_blocks * bb);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : w) b = (uint8_t)byte(rng);
    std::uniform_real_distribution<float> mag(1e-3f, 2e-2f);
    std::bernoulli_distribution neg(0.5);
    for (int64_t i = 0; i < n_blocks; i++)
        for (const size_t off : scale_offsets(t)) {
            const uint16_t h = f32_to_f16(neg(rng) ? -mag(rng) : mag(rng));
            std::memcpy(w.data() + (size_t)i * bb + off, &h, 2);
        }
    // MXFP4's scale is one E8M0 byte: 2^-13 .. 2^-4 halved, the dot's magnitude of the others.
    if (t == GgmlType::MXFP4) {
        std::uniform_int_distribution<int> e(114, 123);
        for (int64_t i = 0; i < n_blocks; i++) w[(size_t)i * bb + offsetof(BlockMxfp4, e)] = (uint8_t)e(rng);
    }
    return w;
}

std::vector<float> random_acts(int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x((size_t)n);
    for (float& v : x) v = g(rng);
    return x;
}

struct Reference {
    double dot = 0.0;        // dequantized weights . unquantized activations, in double
    double magnitude = 0.0;  // sum |w_i x_i|
    double act_bound = 0.0;  // the most the 8-bit activation rounding can move the dot product
};

// Activation block b has scale d = max|x| / 127 and rounds each element by at most half of it; the
// scale multiplied back is d rounded to F16 (ggml's Q8_0), off by at most 2^-11 d for each of up
// to 127 steps. So it moves the dot product by at most (max_b |x| / 127) (1/2 + 127 / 2048)
// sum_{i in b} |w_i|.
Reference reference_dot(GgmlType t, const uint8_t* w_row, const float* x, int64_t n_cols) {
    std::vector<float> w((size_t)n_cols);
    REQUIRE(dequantize_row(t, w_row, n_cols, w.data()).ok());
    const int act_block = quant_block_elems(t) == kQKK ? kQKK : kQK;
    Reference r;
    for (int64_t b = 0; b < n_cols; b += act_block) {
        double amax = 0.0, wsum = 0.0;
        for (int64_t i = b; i < b + act_block; i++) {
            r.dot += (double)w[i] * x[i];
            r.magnitude += std::fabs((double)w[i] * x[i]);
            amax = std::max(amax, (double)std::fabs(x[i]));
            wsum += std::fabs((double)w[i]);
        }
        r.act_bound += amax / 127.0 * (0.5 + 127.0 / 2048.0) * wsum;
    }
    return r;
}

// Float rounding on top of the integer sums: one multiply-add per block of 32 or 256 in float
// (n_blocks * 2^-24 relative, under 1e-5 for K <= 2304) in the kernel, and the reference's own float
// dequantization (d * q - m rounds once or twice per element). 1e-4 of sum |w_i x_i| covers both
// with a factor of ten, for the types with a min whose two terms partly cancel.
constexpr double kFloatSlack = 1e-4;

std::vector<uint8_t> quantized(GgmlType t, const float* x, int64_t n_cols) {
    std::vector<uint8_t> a(quant_act_row_bytes(t, n_cols));
    quantize_activation(t, x, n_cols, a.data());
    return a;
}

std::vector<QuantDotPath> fast_paths() {
    std::vector<QuantDotPath> p;
    for (const QuantDotPath q : {QuantDotPath::AVX2, QuantDotPath::VNNI, QuantDotPath::AVX512})
        if (quant_dot_path_available(q)) p.push_back(q);
    return p;
}

// Turns the exact path on for a scope.
struct ExactQuant {
    bool was = exact_quant();
    explicit ExactQuant(bool on) { set_exact_quant(on); }
    ~ExactQuant() { set_exact_quant(was); }
};

}  // namespace

namespace {
// llama.cpp's activations, written out from ggml's definitions: quantize_row_q8_0 / q8_1 as the x86
// build runs them (scale max|x| / 127 stored as F16, multiplier 127 / max|x|, round half to even,
// q8_1's s = F16(scale * sum of q)) and quantize_row_q8_K_ref (the signed value m of the first
// largest |x|, iscale = -127 / m, round half to even capped at 127, d = 1 / iscale in F32).
struct Q8Block {
    float d = 0, s = 0;
    std::vector<int> q;
};
float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }
Q8Block ggml_q8_0(const float* x) {
    Q8Block b;
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        b.q.push_back((int)std::nearbyint(x[j] * id));
        sum += b.q.back();
    }
    b.d = f16_round(d);
    b.s = f16_round(d * (float)sum);
    return b;
}
Q8Block ggml_q8_K(const float* x) {
    Q8Block b;
    float amax = 0, m = 0;
    for (int j = 0; j < 256; j++)
        if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            m = x[j];
        }
    b.q.assign(256, 0);
    if (amax == 0) return b;
    const float iscale = -127.f / m;
    for (int j = 0; j < 256; j++) b.q[j] = std::min(127, (int)std::nearbyint(iscale * x[j]));
    b.d = 1 / iscale;
    return b;
}
}  // namespace

TEST_CASE("activation blocks are ggml's Q8_0 / Q8_1 and Q8_K, bit for bit, ties and zero blocks included",
          "[quant_dot]") {
    std::mt19937 rng(3);
    const int64_t n = 768;
    std::vector<float> x = random_acts(n, rng);
    x[5] = 0.0f;
    // Exact halves: a block whose max is 127 has multiplier 1, so 2.5 and -3.5 round to even
    // (2, -4) where round-half-away would give 3 and -4; a block of zeros; a negative maximum.
    for (int j = 0; j < 32; j++) x[64 + j] = 0.5f * (float)(j % 7) - 1.0f;
    x[64] = 127.0f;
    x[65] = 2.5f;
    x[66] = -3.5f;
    for (int j = 0; j < 32; j++) x[96 + j] = 0.0f;
    x[300] = -1000.0f;  // the Q8_K block 1's largest |x| is negative: d > 0 there
    // At every kernel level this CPU supports (the AVX2 and AVX-512 levels quantize in vectors).
    const CpuLevel was = cpu_level();
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
    REQUIRE(set_cpu_level((CpuLevel)l));
    INFO("kernel level " << cpu_level_name((CpuLevel)l));
    for (const GgmlType t : {GgmlType::Q4_1, GgmlType::Q4_K}) {
        const std::vector<uint8_t> a = quantized(t, x.data(), n);
        if (t == GgmlType::Q4_K) {
            const ActBlock256* b = reinterpret_cast<const ActBlock256*>(a.data());
            for (int64_t k = 0; k < n / kQKK; k++) {
                INFO("block " << k);
                const Q8Block want = ggml_q8_K(x.data() + k * kQKK);
                CHECK(b[k].d == want.d);
                for (int j = 0; j < kQKK; j++) CHECK((int)b[k].qs[j] == want.q[j]);
                for (int s = 0; s < kQKK / 16; s++) {
                    int sum = 0;
                    for (int j = 0; j < 16; j++) sum += want.q[16 * s + j];
                    CHECK(b[k].bsums[s] == sum);
                }
            }
            CHECK(b[0].d < 0.0f);  // a positive maximum: ggml's d is negative, and so are the codes
            CHECK(b[1].d > 0.0f);
        } else {
            const ActBlock32* b = reinterpret_cast<const ActBlock32*>(a.data());
            for (int64_t k = 0; k < n / kQK; k++) {
                INFO("block " << k);
                const Q8Block want = ggml_q8_0(x.data() + k * kQK);
                CHECK(b[k].d == want.d);
                CHECK(b[k].s == want.s);
                int sum = 0;
                for (int j = 0; j < kQK; j++) {
                    CHECK((int)b[k].qs[j] == want.q[j]);
                    sum += want.q[j];
                }
                CHECK(b[k].sum == sum);
            }
            CHECK((int)b[2].qs[1] == 2);
            CHECK((int)b[2].qs[2] == -4);
            CHECK(b[3].d == 0.0f);
        }
    }
    }
    REQUIRE(set_cpu_level(was));
}

TEST_CASE("vec_dot matches the reference dequantizer's dot product within the activation rounding bound",
          "[quant_dot]") {
    std::mt19937 rng(11);
    for (const GgmlType t : kTypes) {
        const bool k_type = quant_block_elems(t) == kQKK;
        std::vector<int64_t> widths = {256, 768, 2048 + 256};
        if (!k_type) widths.insert(widths.end(), {32, 96, 37 * 32});
        for (const int64_t K : widths) {
            const int64_t n_rows = 7;
            const std::vector<uint8_t> w = random_weights(t, n_rows, K, rng);
            const std::vector<float> x = random_acts(K, rng);
            const std::vector<uint8_t> a = quantized(t, x.data(), K);
            const size_t row_bytes = (size_t)ggml_row_bytes(t, K);
            for (int64_t r = 0; r < n_rows; r++) {
                const uint8_t* row = w.data() + r * row_bytes;
                const Reference ref = reference_dot(t, row, x.data(), K);
                const double got = vec_dot(t, row, a.data(), K);
                INFO(ggml_type_name((uint32_t)t) << " K " << K << " row " << r << ": got " << got << ", reference "
                                                 << ref.dot << ", bound " << ref.act_bound);
                CHECK(std::fabs(got - ref.dot) <= ref.act_bound + kFloatSlack * ref.magnitude);
                // The bound means something: well under the size of the dot product's terms.
                CHECK(ref.act_bound < 0.025 * ref.magnitude);
                CHECK(vec_dot_scalar(t, row, a.data(), K) ==
                      Approx(got).margin(1e-5 * ref.magnitude).epsilon(0));
            }
        }
    }
}

TEST_CASE("vec_dot is exact up to float rounding when the activations need no rounding", "[quant_dot]") {
    // Integer activations with 127 in every block quantize with scale 1 and no error, so any
    // difference from the reference is a kernel bug (an element, a scale or a sign misplaced).
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> code(-127, 127);
    for (const GgmlType t : kTypes) {
        const int64_t K = 768, n_rows = 5;
        const std::vector<uint8_t> w = random_weights(t, n_rows, K, rng);
        std::vector<float> x((size_t)K);
        for (float& v : x) v = (float)code(rng);
        for (int64_t b = 0; b < K; b += kQK) x[b] = 127.0f;
        const std::vector<uint8_t> a = quantized(t, x.data(), K);
        const size_t row_bytes = (size_t)ggml_row_bytes(t, K);
        for (int64_t r = 0; r < n_rows; r++) {
            const uint8_t* row = w.data() + r * row_bytes;
            const Reference ref = reference_dot(t, row, x.data(), K);
            for (const QuantDotPath p : {QuantDotPath::SCALAR, QuantDotPath::AVX2, QuantDotPath::VNNI}) {
                if (!quant_dot_path_available(p)) continue;
                const double got = vec_dot_on(p, t, row, a.data(), K);
                INFO(ggml_type_name((uint32_t)t) << " path " << (int)p << " row " << r << ": got " << got
                                                 << ", reference " << ref.dot);
                CHECK(std::fabs(got - ref.dot) <= kFloatSlack * ref.magnitude);
            }
        }
    }
}

TEST_CASE("every compiled vec_dot path agrees with the scalar twin up to float reassociation", "[quant_dot]") {
    // The integer sums per block are the same on every path; only the float combination of the
    // blocks' terms is ordered differently: a few 2^-24 of sum |w_i x_i|.
    std::mt19937 rng(17);
    const std::vector<QuantDotPath> paths = fast_paths();
    for (const GgmlType t : kTypes) {
        for (const int64_t K : {256, 768, 2048 + 256}) {
            const int64_t n_rows = 9;
            const std::vector<uint8_t> w = random_weights(t, n_rows, K, rng);
            const std::vector<float> x = random_acts(K, rng);
            const std::vector<uint8_t> a = quantized(t, x.data(), K);
            const size_t row_bytes = (size_t)ggml_row_bytes(t, K);
            for (int64_t r = 0; r < n_rows; r++) {
                const uint8_t* row = w.data() + r * row_bytes;
                const Reference ref = reference_dot(t, row, x.data(), K);
                const double want = vec_dot_scalar(t, row, a.data(), K);
                for (const QuantDotPath p : paths) {
                    const double got = vec_dot_on(p, t, row, a.data(), K);
                    INFO(ggml_type_name((uint32_t)t) << " K " << K << " path " << (int)p << ": " << got << " vs scalar "
                                                     << want);
                    CHECK(std::fabs(got - want) <= 1e-5 * ref.magnitude);
                }
            }
        }
    }
}

TEST_CASE("matmul on quantized weights for 1 to 4 tokens matches the exact path within the rounding bound",
          "[quant_dot][kernels]") {
    // At every kernel level this CPU supports: one token takes the decode kernels (four rows a call
    // where a type has such a kernel), each row exactly what vec_dot gives it alone.
    const CpuLevel was = cpu_level();
    std::mt19937 rng(23);
    ThreadPool pool(2);
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
    REQUIRE(set_cpu_level((CpuLevel)l));
    INFO("kernel level " << cpu_level_name((CpuLevel)l));
    for (const GgmlType t : kTypes) {
        const int64_t K = 768, N = 37;  // 37 rows: three chunks of 16, the last short
        const std::vector<uint8_t> w = random_weights(t, N, K, rng);
        const WeightView W{t, w.data(), K, N};
        for (int n_tok = 1; n_tok <= 4; n_tok++) {
            const std::vector<float> X = random_acts(n_tok * K, rng);
            std::vector<float> fast((size_t)(n_tok * N)), exact((size_t)(n_tok * N));
            {
                ExactQuant off(false);
                matmul(W, X.data(), n_tok, fast.data(), pool);
            }
            {
                ExactQuant on(true);
                matmul(W, X.data(), n_tok, exact.data(), pool);
            }
            for (int tk = 0; tk < n_tok; tk++)
                for (int64_t r = 0; r < N; r++) {
                    const Reference ref = reference_dot(t, w.data() + r * W.row_bytes(), X.data() + tk * K, K);
                    INFO(ggml_type_name((uint32_t)t) << " n_tok " << n_tok << " token " << tk << " row " << r);
                    // The exact path is the reference up to float rounding; the fast one also
                    // carries the activation rounding, and is exactly vec_dot on that token alone.
                    CHECK(std::fabs(exact[tk * N + r] - ref.dot) <= kFloatSlack * ref.magnitude);
                    CHECK(std::fabs(fast[tk * N + r] - exact[tk * N + r]) <=
                          ref.act_bound + 2 * kFloatSlack * ref.magnitude);
                    const std::vector<uint8_t> a = quantized(t, X.data() + tk * K, K);
                    CHECK(fast[tk * N + r] == vec_dot(t, w.data() + r * W.row_bytes(), a.data(), K));
                }
        }
    }
    }
    REQUIRE(set_cpu_level(was));
}

TEST_CASE("the fast k-quant and IQ4 dequantizers give the reference dequantizer's values", "[quant_dot]") {
    std::mt19937 rng(77);
    for (const GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::IQ4_NL}) {
        for (const int64_t n : {256, 768, 2304}) {
            const std::vector<uint8_t> w = random_weights(t, 1, n, rng);
            std::vector<float> ref((size_t)n), fast((size_t)n, -1e30f);
            REQUIRE(dequantize_row(t, w.data(), n, ref.data()).ok());
            if (!dequantize_row_fast(t, w.data(), n, fast.data())) {
                WARN("no fast dequantizer compiled in for " << ggml_type_name((uint32_t)t));
                continue;
            }
            // Equal up to a rounding of each term (the reference may fuse its multiply-subtract):
            // |d sc q| <= 0.02 * 63 * 31 and |dmin m| <= 0.02 * 63, so under 3e-6 absolute. A wrong
            // nibble or bit lane moves an element by at least d sc >= 1e-3 (for sc > 0).
            for (int64_t i = 0; i < n; i++) {
                INFO(ggml_type_name((uint32_t)t) << " n " << n << " element " << i);
                REQUIRE(std::fabs(fast[i] - ref[i]) <= 5e-6 + 3e-7 * std::fabs(ref[i]));
            }
            // The IQ4 ones are the reference's float operations in its order: the same bits.
            if (t == GgmlType::IQ4_XS || t == GgmlType::IQ4_NL) CHECK(std::memcmp(ref.data(), fast.data(), ref.size() * 4) == 0);
        }
    }
    std::vector<float> out(256);
    CHECK_FALSE(dequantize_row_fast(GgmlType::Q4_0, nullptr, 256, out.data()));
    CHECK_FALSE(dequantize_row_fast(GgmlType::Q4_K, nullptr, 100, out.data()));
}

namespace {
// The dot product of a dequantized weight row with the activations as quantized (each code times
// its block's scale), in double: what an int8 kernel computes before its own float rounding. For
// Q4_1 / Q5_1 (value d q + m) the min's part is m times the block's s, as ggml's Q8_1 keeps it
// (the scale times the codes' sum, rounded to F16).
double quantized_act_dot(GgmlType t, const uint8_t* w_row, const uint8_t* act, int64_t n_cols) {
    std::vector<float> w((size_t)n_cols);
    REQUIRE(dequantize_row(t, w_row, n_cols, w.data()).ok());
    double dot = 0.0;
    if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) {
        const size_t bb = quant_block_bytes(t);
        for (int64_t b = 0; b < n_cols / kQK; b++) {
            uint16_t mh;
            std::memcpy(&mh, w_row + (size_t)b * bb + 2, 2);  // d, then m
            const double m = f16_to_f32(mh);
            const ActBlock32& a = reinterpret_cast<const ActBlock32*>(act)[b];
            for (int i = 0; i < kQK; i++) dot += ((double)w[b * kQK + i] - m) * ((double)a.d * a.qs[i]);
            dot += m * a.s;
        }
        return dot;
    }
    for (int64_t i = 0; i < n_cols; i++) {
        double x;
        if (quant_block_elems(t) == kQKK) {
            const ActBlock256& b = reinterpret_cast<const ActBlock256*>(act)[i / kQKK];
            x = (double)b.d * b.qs[i % kQKK];
        } else {
            const ActBlock32& b = reinterpret_cast<const ActBlock32*>(act)[i / kQK];
            x = (double)b.d * b.qs[i % kQK];
        }
        dot += (double)w[i] * x;
    }
    return dot;
}
}  // namespace

TEST_CASE("the int8 panel GEMM gives each row and token the dot product of its quantized activations",
          "[quant_dot][kernels]") {
    // At every kernel level this CPU supports, where the level has the panel GEMM (AVX2 and above;
    // avx512vnni sums with dpbusd, the others with maddubs), quant_gemm_rows against the reference
    // dequantizer's rows times the quantized activations, for a row range that starts and ends
    // inside a panel of 8 rows and token counts that leave a short tile of 4; outside the range Y
    // keeps its sentinel. On every level, matmul's GEMM path stays within the activation rounding
    // bound of the unquantized dot product.
    const CpuLevel was = cpu_level();
    std::mt19937 rng(31);
    ThreadPool pool(2);
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
    REQUIRE(set_cpu_level((CpuLevel)l));
    INFO("kernel level " << cpu_level_name((CpuLevel)l));
    for (const GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                             GgmlType::IQ4_NL, GgmlType::MXFP4, GgmlType::IQ4_XS, GgmlType::Q4_K, GgmlType::Q5_K,
                             GgmlType::Q6_K, GgmlType::Q2_K}) {
        for (const int64_t K : {256, 768}) {
            const int64_t N = 37;
            const std::vector<uint8_t> w = random_weights(t, N, K, rng);
            const WeightView W{t, w.data(), K, N};
            for (const int n_tok : {1, 3, 4, 5, 9, 33}) {
                const std::vector<float> X = random_acts(n_tok * K, rng);
                const size_t ab = quant_act_row_bytes(t, K);
                std::vector<uint8_t> acts(ab * (size_t)n_tok);
                for (int tk = 0; tk < n_tok; tk++) quantize_activation(t, X.data() + tk * K, K, acts.data() + tk * ab);
                if (quant_gemm_supported(t)) {
                    const int64_t rb = 5, re = 30;
                    std::vector<float> Y((size_t)(n_tok * N), -12345.0f);
                    quant_gemm_rows(W, quant_gemm_acts(W, X.data(), n_tok, pool), n_tok, Y.data(), rb, re);
                    for (int tk = 0; tk < n_tok; tk++)
                        for (int64_t r = 0; r < N; r++) {
                            INFO(ggml_type_name((uint32_t)t) << " K " << K << " n_tok " << n_tok << " token " << tk
                                                             << " row " << r);
                            if (r < rb || r >= re) {
                                CHECK(Y[tk * N + r] == -12345.0f);
                                continue;
                            }
                            const uint8_t* row = w.data() + r * W.row_bytes();
                            const double want = quantized_act_dot(t, row, acts.data() + tk * ab, K);
                            const Reference ref = reference_dot(t, row, X.data() + tk * K, K);
                            CHECK(std::fabs(Y[tk * N + r] - want) <= 1e-5 * ref.magnitude);
                        }
                }
                std::vector<float> G((size_t)(n_tok * N));
                {
                    ExactQuant off(false);
                    matmul(W, X.data(), n_tok, G.data(), pool, MatmulPath::GEMM);
                }
                for (int tk = 0; tk < n_tok; tk++)
                    for (int64_t r = 0; r < N; r++) {
                        const Reference ref = reference_dot(t, w.data() + r * W.row_bytes(), X.data() + tk * K, K);
                        INFO(ggml_type_name((uint32_t)t) << " matmul GEMM K " << K << " n_tok " << n_tok << " row " << r);
                        CHECK(std::fabs(G[tk * N + r] - ref.dot) <= ref.act_bound + 2 * kFloatSlack * ref.magnitude);
                    }
            }
        }
    }
    }
    REQUIRE(set_cpu_level(was));
}
