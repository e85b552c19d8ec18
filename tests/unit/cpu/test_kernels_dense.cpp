// The CPU kernels (matmul in every dense weight type and Q8_0, on both the streaming and the sgemm
// path; SwiGLU, the softmax body, the KV dot/axpy) against plain reference loops on random shapes.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/quant_dot.h"
#include "model/ggml_types.h"
#include "cpu/thread_pool.h"
#include "model/quantize.h"
#include "model/quants.h"

using namespace steward;

namespace {

// A random weight matrix [n_rows][n_cols] in `type`, its bytes owned here.
struct RandomWeights {
    std::vector<uint8_t> bytes;
    WeightView view;

    RandomWeights(GgmlType type, int64_t n_cols, int64_t n_rows, std::mt19937& rng) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        view.type = type;
        view.n_cols = n_cols;
        view.n_rows = n_rows;
        bytes.resize((size_t)(view.row_bytes() * n_rows));
        for (int64_t r = 0; r < n_rows; r++) {
            uint8_t* row = bytes.data() + r * view.row_bytes();
            for (int64_t c = 0; c < n_cols; c++) {
                const float v = u(rng);
                if (type == GgmlType::F32) std::memcpy(row + 4 * c, &v, 4);
                if (type == GgmlType::F16 || type == GgmlType::BF16) {
                    const uint16_t h = type == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
                    std::memcpy(row + 2 * c, &h, 2);
                }
            }
            if (quant_block_elems(type) > 1 && type != GgmlType::Q8_0) {  // the other block types: quantized
                std::vector<float> vals((size_t)n_cols);
                for (auto& v : vals) v = u(rng);
                REQUIRE(quantize_row(type, vals.data(), n_cols, row).ok());
            }
            if (type == GgmlType::Q8_0) {
                auto* blocks = reinterpret_cast<BlockQ8_0*>(row);
                std::uniform_int_distribution<int> q(-127, 127);
                for (int64_t b = 0; b < n_cols / kQ8BlockSize; b++) {
                    blocks[b].d = f32_to_f16(0.001f + 0.01f * std::abs(u(rng)));
                    for (auto& x : blocks[b].qs) x = (int8_t)q(rng);
                }
            }
        }
        view.data = bytes.data();
    }
};

// Y[t][r] in double over rows dequantized by the reference dequantizer; also sum |w x| per
// output, the scale of the rounding error a float kernel may make. round_bf16: the activations
// rounded to BF16 first (to nearest even, f32_to_bf16), as the BF16 pair GEMM and llama.cpp round them.
void reference_matmul(const WeightView& W, const std::vector<float>& X_in, int n_tok, std::vector<double>& Y,
                      std::vector<double>& mag, bool round_bf16 = false) {
    std::vector<float> X = X_in;
    if (round_bf16)
        for (auto& x : X) x = bf16_to_f32(f32_to_bf16(x));
    const int64_t K = W.n_cols, N = W.n_rows;
    Y.assign((size_t)(n_tok * N), 0.0);
    mag.assign((size_t)(n_tok * N), 0.0);
    std::vector<float> row((size_t)K);
    for (int64_t r = 0; r < N; r++) {
        REQUIRE(dequantize_row(W.type, W.row(r), K, row.data()));
        for (int t = 0; t < n_tok; t++)
            for (int64_t c = 0; c < K; c++) {
                const double p = (double)row[c] * X[(size_t)(t * K + c)];
                Y[(size_t)(t * N + r)] += p;
                mag[(size_t)(t * N + r)] += std::abs(p);
            }
    }
}

// Whether matmul(W, n_tok tokens, path) takes the BF16 pair GEMM (kernels.h g_gemm_bf16): BF16
// weights, many tokens, an AVX-512 level on a CPU with AVX512_BF16, outside the exact path.
bool bf16_pairs(const WeightView& W, int n_tok, MatmulPath path) {
    return W.type == GgmlType::BF16 && cpu_level() >= CpuLevel::AVX512 && gemm_bf16_pairs() && !exact_quant() &&
           (path == MatmulPath::GEMM || (path == MatmulPath::AUTO && n_tok >= gemm_min_tokens(W)));
}

void check_matmul(GgmlType type, int64_t K, int64_t N, int n_tok, ThreadPool& pool, std::mt19937& rng,
                  MatmulPath path = MatmulPath::AUTO) {
    const RandomWeights w(type, K, N, rng);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> X((size_t)(n_tok * K));
    for (auto& v : X) v = u(rng);
    std::vector<float> Y((size_t)(n_tok * N), NAN);
    matmul(w.view, X.data(), n_tok, Y.data(), pool, path);
    std::vector<double> ref, mag;
    reference_matmul(w.view, X, n_tok, ref, mag, bf16_pairs(w.view, n_tok, path));
    for (size_t i = 0; i < Y.size(); i++) {
        INFO(ggml_type_name((uint32_t)type) << " K=" << K << " N=" << N << " n_tok=" << n_tok << " threads=" << pool.n_threads() << " path=" << (int)path
                                  << " output " << i);
        REQUIRE(std::abs(Y[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
    }
}

}  // namespace

TEST_CASE("matmul matches the reference loop for every dense type on odd shapes and 1 to 20 tokens", "[kernels]") {
    std::mt19937 rng(12);
    for (int n_threads : {1, 2}) {
        ThreadPool pool(n_threads);
        for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
            for (int64_t K : {1, 15, 17, 47, 96, 161})
                for (int64_t N : {1, 7, 37, 133})
                    for (int n_tok = 1; n_tok <= 20; n_tok += (K > 40 ? 1 : 3)) check_matmul(type, K, N, n_tok, pool, rng);
    }
}

// Q8_0's float streaming kernel is the exact path (ExactQuantScope); its default integer path, which
// quantizes the activations, is held to its own rounding bound in test_quant_dot.cpp.
TEST_CASE("matmul matches the reference loop for q8_0 on both sides of the gemm threshold", "[kernels]") {
    const ExactQuantScope exact;
    std::mt19937 rng(13);
    ThreadPool pool(2);
    for (int64_t K : {32, 96, 800})
        for (int64_t N : {3, 37, 130})
            for (int n_tok : {1, 2, 3, 5, kGemmMinTokens - 1, kGemmMinTokens, 20}) check_matmul(GgmlType::Q8_0, K, N, n_tok, pool, rng);
}

TEST_CASE("both matmul paths, forced, match the reference for every type away from their usual token counts",
          "[kernels]") {
    const ExactQuantScope exact;  // Q8_0's float kernel, as above
    std::mt19937 rng(17);
    ThreadPool pool(2);
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
        for (int n_tok : {1, 3, 24}) {
            check_matmul(type, 96, 41, n_tok, pool, rng, MatmulPath::STREAM);
            check_matmul(type, 96, 41, n_tok, pool, rng, MatmulPath::GEMM);
        }
}

// The tiled GEMM packs tokens in panels of 48 (AVX-512; up to 24 on AVX2, where F16 takes it from
// kAvx2TiledHalfFrom tokens), converts rows in groups of 16 (groups of 8 in blocks of rows on AVX2)
// and columns in blocks of 256: shapes on and around each edge, for every weight type it converts
// (the block types through their dequantizers, a block of 256 columns at a time), against the
// reference loop; and OpenBLAS's path (BLAS) on the same shapes.
TEST_CASE("the tiled gemm and the OpenBLAS path match the reference on panel, row-group and column-block edges",
          "[kernels]") {
    const ExactQuantScope exact;
    std::mt19937 rng(18);
    for (int n_threads : {1, 2}) {
        ThreadPool pool(n_threads);
        for (int n_tok : {7, 16, 17, 23, 24, 25, 47, 48, 49, 96, 130})
            for (int64_t N : {1, 4, 9, 15, 16, 33, 70}) {
                check_matmul(GgmlType::F32, 257, N, n_tok, pool, rng, MatmulPath::GEMM);
                check_matmul(GgmlType::F16, 31, N, n_tok, pool, rng, MatmulPath::GEMM);
                check_matmul(GgmlType::BF16, 33, N, n_tok, pool, rng, MatmulPath::GEMM);
            }
        for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
            check_matmul(type, 600, 50, 61, pool, rng, MatmulPath::BLAS);
        // Rows past one block (AVX2: 128 KiB of F32 rows, 32 rows at 1024 columns), the last partial.
        for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
            check_matmul(type, 1024, 300, 49, pool, rng, MatmulPath::GEMM);
    }
    ThreadPool pool(2);
    for (GgmlType type : {GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
        for (int64_t K : {256, 768})
            for (int n_tok : {16, 50}) {
                check_matmul(type, K, 37, n_tok, pool, rng, MatmulPath::GEMM);
                check_matmul(type, K, 37, n_tok, pool, rng, MatmulPath::BLAS);
            }
}

TEST_CASE("matmul of a wide f16 matrix streams many row chunks to the same result as the reference", "[kernels]") {
    std::mt19937 rng(14);
    ThreadPool pool(2);
    for (int n_tok : {1, 4, 17}) check_matmul(GgmlType::F16, 768, 1000, n_tok, pool, rng);
}

TEST_CASE("swiglu and the softmax body match std::exp on odd lengths", "[kernels]") {
    std::mt19937 rng(15);
    std::uniform_real_distribution<float> u(-30.0f, 30.0f);
    for (int n : {1, 15, 16, 37, 1001}) {
        std::vector<float> g(n), up(n), want(n);
        for (int i = 0; i < n; i++) {
            g[i] = u(rng);
            up[i] = u(rng) / 30.0f;
            want[i] = (float)((double)g[i] / (1.0 + std::exp(-(double)g[i])) * up[i]);
        }
        swiglu(g.data(), up.data(), n);
        for (int i = 0; i < n; i++) REQUIRE(std::abs(g[i] - want[i]) <= 2e-6f * std::abs(want[i]) + 1e-30f);

        std::vector<float> s(n);
        for (auto& v : s) v = u(rng);
        const float mx = *std::max_element(s.begin(), s.end());
        std::vector<double> e(n);
        double sum = 0.0;
        for (int i = 0; i < n; i++) sum += e[i] = std::exp((double)s[i] - mx);
        const float got = exp_sub_sum(s.data(), n, mx);
        REQUIRE(std::abs(got - sum) <= 1e-5 * sum);
        for (int i = 0; i < n; i++) REQUIRE(std::abs(s[i] - e[i]) <= 2e-6 * e[i] + 1e-38);
    }
}

TEST_CASE("rmsnorm matches a double loop at every kernel level, tokens and odd lengths included", "[kernels][dispatch]") {
    // The scale 1 / sqrt(mean(x^2) + eps) from a double sum, rounded to float, then x * scale * w in
    // float, as ggml's rms_norm and mul: within an ulp of the float products.
    const CpuLevel was = cpu_level();
    std::mt19937 rng(41);
    std::normal_distribution<float> g(0.0f, 3.0f);
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
        REQUIRE(set_cpu_level((CpuLevel)l));
        INFO("kernel level " << cpu_level_name((CpuLevel)l));
        for (const int n : {1, 7, 16, 23, 768, 1001}) {
            const int n_tok = 3;
            std::vector<float> x((size_t)(n * n_tok)), w((size_t)n), y((size_t)(n * n_tok), -1.0f);
            for (float& v : x) v = g(rng);
            for (float& v : w) v = 1.0f + 0.1f * g(rng);
            x[(size_t)n * 2] = 1e4f;  // one token dominated by one value
            rmsnorm(x.data(), w.data(), 1e-5f, n, n_tok, y.data());
            for (int t = 0; t < n_tok; t++) {
                double ss = 0.0;
                for (int i = 0; i < n; i++) ss += (double)x[t * n + i] * x[t * n + i];
                const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
                for (int i = 0; i < n; i++) {
                    INFO("n " << n << " token " << t << " i " << i);
                    const double want = x[t * n + i] * scale * w[i];
                    CHECK(std::fabs(y[t * n + i] - want) <= 3e-7 * std::fabs(want) + 1e-30);
                }
            }
        }
    }
    REQUIRE(set_cpu_level(was));
}

TEST_CASE("the kv dot, axpy and f16 conversion kernels match plain loops on odd lengths in f32 and f16", "[kernels]") {
    std::mt19937 rng(16);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int n : {1, 7, 16, 33, 64, 100}) {
        std::vector<float> a(n), b(n), y(n), y16(n);
        std::vector<uint16_t> b16(n);
        for (int i = 0; i < n; i++) a[i] = u(rng), b[i] = u(rng), b16[i] = f32_to_f16(b[i]), y[i] = y16[i] = u(rng);
        double d = 0, d16 = 0;
        for (int i = 0; i < n; i++) d += (double)a[i] * b[i], d16 += (double)a[i] * f16_to_f32(b16[i]);
        REQUIRE(std::abs(dot_f32(a.data(), b.data(), n) - d) <= 1e-5 * n);
        REQUIRE(std::abs(dot_f16(a.data(), b16.data(), n) - d16) <= 1e-5 * n);
        std::vector<float> want = y, want16 = y16;
        for (int i = 0; i < n; i++) want[i] += 0.5f * b[i], want16[i] += 0.5f * f16_to_f32(b16[i]);
        axpy_f32(0.5f, b.data(), y.data(), n);
        axpy_f16(0.5f, b16.data(), y16.data(), n);
        for (int i = 0; i < n; i++) {
            REQUIRE(std::abs(y[i] - want[i]) <= 1e-6f);
            REQUIRE(std::abs(y16[i] - want16[i]) <= 1e-6f);
        }
        std::vector<float> wide(n);  // to_f16 rounds as the scalar f32_to_f16, across the f16 range
        for (int i = 0; i < n; i++) wide[i] = a[i] * std::pow(2.0f, (float)(i % 40 - 26));
        std::vector<uint16_t> h(n);
        to_f16(wide.data(), h.data(), n);
        for (int i = 0; i < n; i++) REQUIRE(h[i] == f32_to_f16(wide[i]));
    }
}

// Every kernel level this CPU runs (cpu/cpu_features.h), switched in one process: the dense paths
// against the reference loop at each level, and the integer paths of the block types against the
// scalar level's plain loops (the same integer sums per block; only the float accumulation order
// may differ). A level that is not this machine's best is exercised here too.
TEST_CASE("the many-row f16 and f32 dot and axpy kernels match plain double loops at every kernel level", "[kernels][dispatch]") {
    // Rows scattered in one buffer (as a KV cache's slot rows are, block by block), row counts
    // around the 16-row group and lengths with and without a whole number of 16- and 64-wide steps.
    const CpuLevel was = cpu_level();
    std::mt19937 rng(41);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
        REQUIRE(set_cpu_level((CpuLevel)l));
        INFO("kernel level " << cpu_level_name((CpuLevel)l));
        for (int n : {8, 12, 16, 24, 64, 80, 128})
            for (int n_rows : {1, 7, 8, 15, 16, 17, 40}) {
                INFO("n " << n << ", rows " << n_rows);
                std::vector<uint16_t> buf((size_t)(n_rows * 3 + 2) * n);
                for (auto& v : buf) v = f32_to_f16(u(rng));
                std::vector<const uint16_t*> rows((size_t)n_rows);
                for (int r = 0; r < n_rows; r++) rows[(size_t)r] = buf.data() + (size_t)((r * 7) % (3 * n_rows + 2)) * n;
                std::vector<float> a((size_t)n), w((size_t)n_rows), y((size_t)n), out((size_t)n_rows, NAN);
                for (auto& v : a) v = u(rng);
                for (auto& v : w) v = u(rng);
                for (auto& v : y) v = u(rng);
                dot_f16_rows(a.data(), rows.data(), n_rows, n, out.data());
                for (int r = 0; r < n_rows; r++) {
                    double d = 0;
                    for (int i = 0; i < n; i++) d += (double)a[(size_t)i] * f16_to_f32(rows[(size_t)r][i]);
                    REQUIRE(std::abs(out[(size_t)r] - d) <= 1e-5 * n);
                }
                std::vector<double> want(y.begin(), y.end());
                for (int r = 0; r < n_rows; r++)
                    for (int i = 0; i < n; i++) want[(size_t)i] += (double)w[(size_t)r] * f16_to_f32(rows[(size_t)r][i]);
                axpy_f16_rows(w.data(), rows.data(), n_rows, n, y.data());
                for (int i = 0; i < n; i++) REQUIRE(std::abs(y[(size_t)i] - want[(size_t)i]) <= 1e-5 * n_rows);
                // The F32 twins on the same values widened (exactly) to F32.
                std::vector<float> fbuf(buf.size());
                for (size_t i = 0; i < buf.size(); i++) fbuf[i] = f16_to_f32(buf[i]);
                std::vector<const float*> frows((size_t)n_rows);
                for (int r = 0; r < n_rows; r++) frows[(size_t)r] = fbuf.data() + (rows[(size_t)r] - buf.data());
                std::fill(out.begin(), out.end(), NAN);
                dot_f32_rows(a.data(), frows.data(), n_rows, n, out.data());
                for (int r = 0; r < n_rows; r++) {
                    double d = 0;
                    for (int i = 0; i < n; i++) d += (double)a[(size_t)i] * frows[(size_t)r][i];
                    REQUIRE(std::abs(out[(size_t)r] - d) <= 1e-5 * n);
                }
                for (int r = 0; r < n_rows; r++)
                    for (int i = 0; i < n; i++) want[(size_t)i] += (double)w[(size_t)r] * frows[(size_t)r][i];
                axpy_f32_rows(w.data(), frows.data(), n_rows, n, y.data());
                for (int i = 0; i < n; i++) REQUIRE(std::abs(y[(size_t)i] - want[(size_t)i]) <= 2e-5 * n_rows);
            }
    }
    REQUIRE(set_cpu_level(was));
}

// gemm_f32 (the attention's matrix products in prefill) at every kernel level: AVX2's own tiled
// kernel, OpenBLAS's sgemm elsewhere. Both layouts of B, alpha, row strides wider than the rows,
// shapes around the tile edges (4 / 8 rows, 8 / 24 tokens), against a double loop; the elements
// between the rows of C (ldc > n) are left as they were.
TEST_CASE("gemm_f32 matches a double loop for both layouts of B at every kernel level", "[kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    std::mt19937 rng(33);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
        REQUIRE(set_cpu_level((CpuLevel)l));
        for (bool trans_b : {true, false})
            for (int m : {1, 7, 8, 9, 23, 25, 48, 130})
                for (int n : {1, 4, 9, 64, 70})
                    for (int k : {1, 9, 64, 300, 1024}) {
                        if (k == 1024 && m > 25) continue;  // rows past one block (32 at 1024), once
                        const int lda = k + 3, ldb = (trans_b ? k : n) + 5, ldc = n + 2;
                        const float alpha = 0.37f;
                        std::vector<float> A((size_t)m * lda), B((size_t)(trans_b ? n : k) * ldb), C((size_t)m * ldc, 7.0f);
                        for (auto& v : A) v = u(rng);
                        for (auto& v : B) v = u(rng);
                        gemm_f32(trans_b, m, n, k, alpha, A.data(), lda, B.data(), ldb, C.data(), ldc);
                        INFO("level " << cpu_level_name((CpuLevel)l) << " trans_b " << trans_b << " m " << m << " n " << n << " k " << k);
                        for (int i = 0; i < m; i++) {
                            for (int j = 0; j < n; j++) {
                                double want = 0, mag = 0;
                                for (int c = 0; c < k; c++) {
                                    const double b = trans_b ? B[(size_t)j * ldb + c] : B[(size_t)c * ldb + j];
                                    want += (double)A[(size_t)i * lda + c] * b;
                                    mag += std::abs((double)A[(size_t)i * lda + c] * b);
                                }
                                REQUIRE(std::abs(C[(size_t)i * ldc + j] - alpha * want) <= 1e-5 * alpha * mag + 1e-6);
                            }
                            for (int j = n; j < ldc; j++) REQUIRE(C[(size_t)i * ldc + j] == 7.0f);
                        }
                    }
    }
    REQUIRE(set_cpu_level(was));
}

TEST_CASE("every kernel level this CPU supports matches the reference loops", "[kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    std::mt19937 rng(31);
    ThreadPool pool(2);
    const int64_t K = 512, N = 37;
    std::vector<RandomWeights> quantized;
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
        quantized.emplace_back(type, K, N, rng);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> X((size_t)(5 * K));
    for (auto& v : X) v = u(rng);
    std::vector<std::vector<float>> scalar_out;
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
        REQUIRE(set_cpu_level((CpuLevel)l));
        REQUIRE(cpu_level() == (CpuLevel)l);
        INFO("kernel level " << cpu_level_name((CpuLevel)l));
        for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
            for (int n_tok : {1, 5, 8, 13, 20, 49}) check_matmul(type, 161, 37, n_tok, pool, rng);
        for (size_t i = 0; i < quantized.size(); i++) {
            const WeightView& W = quantized[i].view;
            INFO(ggml_type_name((uint32_t)W.type));
            std::vector<float> Y((size_t)(5 * N), NAN);
            matmul(W, X.data(), 5, Y.data(), pool, MatmulPath::STREAM);
            if (l == 0) {
                scalar_out.push_back(Y);
                continue;
            }
            for (size_t j = 0; j < Y.size(); j++)
                REQUIRE(std::abs(Y[j] - scalar_out[i][j]) <= 1e-4f * (1.0f + std::abs(scalar_out[i][j])));
        }
        std::vector<float> s(100);
        for (int i = 0; i < 100; i++) s[(size_t)i] = -0.1f * (float)i;
        double want = 0.0;
        for (float v : s) want += std::exp((double)v - 1.0);
        CHECK(std::abs(sum_exp_shifted(s.data(), 100, 1.0f) - want) <= 1e-5 * want);
    }
    if (cpu_level_supported() != CpuLevel::AVX512_VNNI) CHECK_FALSE(set_cpu_level(CpuLevel::AVX512_VNNI));
    REQUIRE(set_cpu_level(was));
}

// The AVX-512 levels stream one and two tokens of the dense types in 4-row 512-bit tiles (Intel) or
// AMD's way (kernels.h g_stream_rows): F16 and BF16 a 256-bit row at a time (one token) or in the
// AVX2 level's 256-bit tiles (two); F32 a row at a time or in 4-row tiles as g_f32_row_bytes says
// (the CPU plan's choice), on the AVX2 level too at one token. Both must give the reference loop's sums at every level, on row counts that leave a
// partial tile and across the two-token boundary; F32 the same bits either way (each row's products
// in the same order), F16 and BF16 on AMD's setting at two tokens the AVX2 level's bits (its 256-bit
// tiles; at one token the AVX-512 levels' single rows sum in four chains where the AVX2 level's sum
// in two, so only the reference bound holds there).
TEST_CASE("the streaming kernel a row at a time and in 4-row tiles matches the reference and itself", "[kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    const int rows_was = stream_tile_rows();
    const int64_t f32_rows_was = g_f32_row_bytes.load();
    std::mt19937 rng(47);
    ThreadPool pool(2);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
        for (int n_tok : {1, 2, 3}) {
            const RandomWeights w(type, 200, 39, rng);
            std::vector<float> X((size_t)(n_tok * 200));
            for (auto& v : X) v = u(rng);
            std::vector<double> ref, mag;
            reference_matmul(w.view, X, n_tok, ref, mag);
            std::vector<float> at_avx2;
            for (int l = 0; l <= (int)cpu_level_supported(); l++) {
                REQUIRE(set_cpu_level((CpuLevel)l));
                INFO("kernel level " << cpu_level_name((CpuLevel)l) << " " << ggml_type_name((uint32_t)type) << " n_tok " << n_tok);
                std::vector<float> y1((size_t)(n_tok * 39), NAN), y4((size_t)(n_tok * 39), NAN);
                g_stream_rows.store(1), g_f32_row_bytes.store(kEveryRowLength);
                matmul(w.view, X.data(), n_tok, y1.data(), pool, MatmulPath::STREAM);
                g_stream_rows.store(4), g_f32_row_bytes.store(0);
                matmul(w.view, X.data(), n_tok, y4.data(), pool, MatmulPath::STREAM);
                if (l == (int)CpuLevel::AVX2) at_avx2 = y4;
                const bool amd_half = l >= (int)CpuLevel::AVX512 && type != GgmlType::F32 && n_tok == 2;
                for (size_t i = 0; i < y1.size(); i++) {
                    INFO("output " << i);
                    REQUIRE(std::abs(y1[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
                    REQUIRE(std::abs(y4[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
                    if (type == GgmlType::F32 || l < (int)CpuLevel::AVX512) REQUIRE(std::memcmp(&y1[i], &y4[i], sizeof(float)) == 0);
                    if (amd_half) REQUIRE(std::memcmp(&y1[i], &at_avx2[i], sizeof(float)) == 0);
                }
            }
        }
    g_stream_rows.store(rows_was), g_f32_row_bytes.store(f32_rows_was);
    REQUIRE(set_cpu_level(was));
}

// F16 and BF16 at one token where the kernels stream them a row at a time (the AVX-512 levels with
// g_stream_rows 1, AMD's): rows up to g_half_row_bytes a row at a time, longer ones in 6-row tiles,
// neither with prefetch instructions. Both ways must give the reference loop's sums and the same bits
// (a tile sums each row in the chains a single row has), at every level (AVX2 and scalar stream in
// tiles either way), on 39 rows (per chunk of 16 rows 6 + 6 + 4, the last chunk's 7 rows 6 + 1) and
// a column count with and without a scalar tail. Mutation: the 6-row tile's one-token chains back at
// one (the U of R * NT <= 4) fails the bit check.
TEST_CASE("F16 and BF16 at one token a row at a time and in 4-row tiles give the reference's and the same sums", "[kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    const int rows_was = stream_tile_rows();
    const int64_t half_was = g_half_row_bytes.load();
    std::mt19937 rng(61);
    ThreadPool pool(2);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (GgmlType type : {GgmlType::F16, GgmlType::BF16})
        for (int64_t K : {200, 203}) {
            const RandomWeights w(type, K, 39, rng);
            std::vector<float> X((size_t)K);
            for (auto& v : X) v = u(rng);
            std::vector<double> ref, mag;
            reference_matmul(w.view, X, 1, ref, mag);
            for (int l = 0; l <= (int)cpu_level_supported(); l++) {
                REQUIRE(set_cpu_level((CpuLevel)l));
                INFO("kernel level " << cpu_level_name((CpuLevel)l) << " " << ggml_type_name((uint32_t)type) << " K " << K);
                std::vector<float> rows((size_t)39, NAN), tiles((size_t)39, NAN), at_limit((size_t)39, NAN);
                g_stream_rows.store(1);
                g_half_row_bytes.store(kEveryRowLength);
                matmul(w.view, X.data(), 1, rows.data(), pool, MatmulPath::STREAM);
                g_half_row_bytes.store(0);
                matmul(w.view, X.data(), 1, tiles.data(), pool, MatmulPath::STREAM);
                g_half_row_bytes.store(w.view.row_bytes());  // the limit is inclusive: a row at a time
                matmul(w.view, X.data(), 1, at_limit.data(), pool, MatmulPath::STREAM);
                for (size_t i = 0; i < rows.size(); i++) {
                    INFO("row " << i);
                    REQUIRE(std::abs(rows[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
                    REQUIRE(std::abs(tiles[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
                    REQUIRE(std::memcmp(&rows[i], &tiles[i], sizeof(float)) == 0);
                    REQUIRE(std::memcmp(&rows[i], &at_limit[i], sizeof(float)) == 0);
                }
            }
        }
    g_stream_rows.store(rows_was), g_half_row_bytes.store(half_was);
    REQUIRE(set_cpu_level(was));
}

// Eight tokens stream in 3-row tiles on the AVX-512 levels (a row at a time on AVX2 and scalar),
// the rows past the last whole tile one at a time. Every row must give the reference loop's sums, and a row the same
// bits whether a tile or a one-row tail computes it: a matrix of that row alone goes through the
// tail. F32, F16 and BF16, at every kernel level, on 37 rows (12 tiles of 3 and a tail of 1).
TEST_CASE("eight tokens give a row the same sums in a row tile and as a tail row", "[kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    std::mt19937 rng(59);
    ThreadPool pool(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int n_tok = 8;
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
        const RandomWeights w(type, 200, 37, rng);
        std::vector<float> X((size_t)(n_tok * 200));
        for (auto& v : X) v = u(rng);
        std::vector<double> ref, mag;
        reference_matmul(w.view, X, n_tok, ref, mag);
        for (int l = 0; l <= (int)cpu_level_supported(); l++) {
            REQUIRE(set_cpu_level((CpuLevel)l));
            INFO("kernel level " << cpu_level_name((CpuLevel)l) << " " << ggml_type_name((uint32_t)type));
            std::vector<float> y((size_t)(n_tok * 37), NAN);
            matmul(w.view, X.data(), n_tok, y.data(), pool, MatmulPath::STREAM);
            for (size_t i = 0; i < y.size(); i++) REQUIRE(std::abs(y[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
            for (int r : {0, 1, 2, 17, 36}) {  // in tiles (0-35) and the tail (36)
                WeightView one = w.view;
                one.data = w.bytes.data() + (size_t)r * w.view.row_bytes();
                one.n_rows = 1;
                std::vector<float> y1((size_t)n_tok, NAN);
                matmul(one, X.data(), n_tok, y1.data(), pool, MatmulPath::STREAM);
                INFO("row " << r);
                for (int t = 0; t < n_tok; t++) REQUIRE(std::memcmp(&y1[t], &y[(size_t)t * 37 + r], sizeof(float)) == 0);
            }
        }
    }
    REQUIRE(set_cpu_level(was));
}

// BF16 weights' GEMM on the AVX-512 levels of a CPU with AVX512_BF16 (g_gemm_bf16): the tokens
// rounded to BF16 and multiplied in pairs must give the double-loop sums of the rounded tokens, on
// odd and even K (the last pair half empty), panel and row-group edges; with the pairs off, and on
// the exact path, the F32 tiles give the sums of the unrounded tokens. Where the CPU lacks
// AVX512_BF16 only the F32 half runs.
TEST_CASE("the bf16 pair gemm matches a reference over bf16-rounded tokens, the f32 tiles one over exact ones", "[kernels][dispatch]") {
    const bool pairs_was = gemm_bf16_pairs();
    std::mt19937 rng(53);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    ThreadPool pool(2);
    for (const int64_t K : {255, 256, 513})
        for (const int64_t N : {16, 37})
            for (const int n_tok : {16, 47, 49, 130}) {
                const RandomWeights w(GgmlType::BF16, K, N, rng);
                std::vector<float> X((size_t)(n_tok * K));
                for (auto& v : X) v = u(rng);
                for (const bool pairs : {false, true}) {
                    if (pairs && !pairs_was) continue;
                    g_gemm_bf16.store(pairs);
                    std::vector<float> Y((size_t)(n_tok * N), NAN);
                    matmul(w.view, X.data(), n_tok, Y.data(), pool, MatmulPath::GEMM);
                    const bool rounded = pairs && cpu_level() >= CpuLevel::AVX512;
                    std::vector<double> ref, mag;
                    reference_matmul(w.view, X, n_tok, ref, mag, rounded);
                    for (size_t i = 0; i < Y.size(); i++) {
                        INFO("K " << K << " N " << N << " n_tok " << n_tok << " pairs " << pairs << " output " << i);
                        REQUIRE(std::abs(Y[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6);
                    }
                    if (rounded) {  // the rounding is real: the unrounded sums differ somewhere
                        std::vector<double> exact, emag;
                        reference_matmul(w.view, X, n_tok, exact, emag, false);
                        double worst = 0;
                        for (size_t i = 0; i < Y.size(); i++) worst = std::max(worst, std::abs(Y[i] - exact[i]) / (emag[i] + 1e-6));
                        CHECK(worst > 1e-4);
                    }
                }
            }
    g_gemm_bf16.store(pairs_was);
}

// matmul_many runs several products of one X in one parallel_for where they all stream their weights:
// each output must hold what matmul gives it alone (bit for bit: the same row kernels on the same
// quantized activations), and the dense ones the reference loop's sums, at every level, across the
// token counts where some or all of them take a GEMM instead.
TEST_CASE("matmul_many gives each output what matmul gives it alone at every kernel level", "[kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    std::mt19937 rng(41);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t K = 512;
    const std::vector<std::vector<GgmlType>> groups = {
        {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K},  // a Q4_K_M layer's Q, K, V
        {GgmlType::F32, GgmlType::F16, GgmlType::BF16},
        {GgmlType::F32, GgmlType::F32, GgmlType::F32},
        {GgmlType::Q8_0, GgmlType::F32},
        {GgmlType::MXFP4, GgmlType::Q4_0, GgmlType::Q5_K, GgmlType::Q8_0}};
    const int64_t rows[] = {37, 200, 16, 133};  // the outputs' rows: output i has rows[i]
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
        REQUIRE(set_cpu_level((CpuLevel)l));
        for (int n_threads : {1, 2}) {
            ThreadPool pool(n_threads);
            for (const auto& types : groups) {
                std::vector<RandomWeights> ws;
                for (size_t i = 0; i < types.size(); i++) ws.emplace_back(types[i], K, rows[i], rng);
                for (int n_tok : {1, 3, 8, 15, 16, 30, 49, 64, 130}) {
                    std::vector<float> X((size_t)n_tok * K);
                    for (auto& v : X) v = u(rng);
                    std::vector<std::vector<float>> alone(ws.size()), many(ws.size());
                    std::vector<MatmulOut> outs;
                    for (size_t i = 0; i < ws.size(); i++) {
                        alone[i].assign((size_t)n_tok * rows[i], NAN);
                        many[i].assign((size_t)n_tok * rows[i], NAN);
                        matmul(ws[i].view, X.data(), n_tok, alone[i].data(), pool);
                        outs.push_back({&ws[i].view, many[i].data()});
                    }
                    matmul_many(outs.data(), (int)outs.size(), X.data(), n_tok, pool);
                    for (size_t i = 0; i < ws.size(); i++) {
                        INFO("level " << cpu_level_name((CpuLevel)l) << " threads " << n_threads << " n_tok " << n_tok << " "
                                      << ggml_type_name((uint32_t)types[i]) << " output " << i);
                        REQUIRE(std::memcmp(alone[i].data(), many[i].data(), alone[i].size() * sizeof(float)) == 0);
                        if (quant_block_elems(types[i]) > 1) continue;
                        std::vector<double> ref, mag;
                        reference_matmul(ws[i].view, X, n_tok, ref, mag, bf16_pairs(ws[i].view, n_tok, MatmulPath::AUTO));
                        for (size_t j = 0; j < ref.size(); j++) REQUIRE(std::abs(many[i][j] - ref[j]) <= 1e-5 * mag[j] + 1e-6);
                    }
                }
            }
        }
    }
    REQUIRE(set_cpu_level(was));
}

TEST_CASE("GELU as ggml's CPU computes it: the tanh form at F16, and the table path equal to it", "[kernels][gelu]") {
    // ggml_vec_gelu_f32: 0 at x <= -10, x at x >= 10, else the tanh approximation at the input rounded
    // to F16, rounded to F16 (its table). Checked against that formula in double here: within F16's
    // rounding of the output (2^-11 relative) plus the input's effect, and exact at the cut-offs.
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> d(-12.0f, 12.0f);
    std::vector<float> g(4099), u(4099), g2;
    for (size_t i = 0; i < g.size(); i++) g[i] = d(rng), u[i] = d(rng);
    g[0] = -10.0f, g[1] = 10.0f, g[2] = 0.0f, g[3] = -1e-8f;
    for (float x : g) {
        const double xh = f16_to_f32(f32_to_f16(x));
        const double want = x <= -10 ? 0.0 : x >= 10 ? x : 0.5 * xh * (1 + std::tanh(0.7978845608028654 * xh * (1 + 0.044715 * xh * xh)));
        INFO("x = " << x);
        // (1 + tanh) cancels in float near x = -5: an absolute 1e-6 allows for it.
        CHECK(std::abs(gelu_ggml(x) - want) <= 1e-3 * std::abs(want) + 1e-6);
    }
    g2 = g;
    geglu_ggml(g2.data(), u.data(), (int64_t)g2.size());  // GeGLU over a length that is no multiple of 256
    for (size_t i = 0; i < g.size(); i++) CHECK(g2[i] == gelu_ggml(g[i]) * u[i]);
    g2 = g;
    geglu_ggml(g2.data(), nullptr, (int64_t)g2.size());
    for (size_t i = 0; i < g.size(); i++) CHECK(g2[i] == gelu_ggml(g[i]));
}
