// The CPU kernels' level-independent part: OpenBLAS's set-up and the plain sgemm. The kernels
// that differ per level are kernels_body.inc (compiled per level, dispatched by cpu/dispatch.cpp).
#include "cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_features.h"
#include "model/ggml_types.h"

extern "C" void openblas_set_num_threads(int);
// OpenBLAS's DYNAMIC_ARCH entry points (weak: absent from a single-target build, then unused).
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace steward {

float gelu_ggml(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float xh = f16_to_f32(f32_to_f16(x));
    constexpr float kA = 0.044715f, kSqrt2OverPi = 0.79788456080286535587989211986876f;
    const float y = 0.5f * xh * (1.0f + std::tanh(kSqrt2OverPi * xh * (1.0f + kA * xh * xh)));
    return f16_to_f32(f32_to_f16(y));
}

namespace {

// ggml's GELU table: the value at every F16 input, rounded to F16 (ggml_table_gelu_f16), as floats.
const float* gelu_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; h++) {
            const float x = f16_to_f32((uint16_t)h);
            constexpr float kA = 0.044715f, kSqrt2OverPi = 0.79788456080286535587989211986876f;
            t[h] = f16_to_f32(f32_to_f16(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kA * x * x)))));
        }
        return t;
    }();
    return table.data();
}

}  // namespace

void geglu_ggml(float* g, const float* u, int64_t n) {
    const float* tab = gelu_table();
    uint16_t h[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int m = (int)std::min<int64_t>(256, n - i);
        to_f16(g + i, h, m);  // F16C where the CPU has it
        for (int j = 0; j < m; j++) {
            const float x = g[i + j];
            const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : tab[h[j]];
            g[i + j] = u ? y * u[i + j] : y;
        }
    }
}

int cpu_count() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : (int)n;
}

namespace {

// OpenBLAS 0.3.21 (Debian 12) does not recognise CPUs newer than its tables (this VM's Sapphire
// Rapids reports a generic "Intel Xeon Processor") and falls back to its Prescott (SSE3)
// kernels: sgemm measured ~22 GFLOP/s a core here against ~90 with its SkylakeX kernels
// (bench_model's kernel table). Where our kernel level has AVX-512 (or AVX2) and OpenBLAS chose a
// core without it, and the user set no OPENBLAS_CORETYPE, re-select through OpenBLAS's own
// override: set the variable and re-run its dynamic init. Runs once, before our first sgemm.
void select_blas_core() {
    if (!openblas_get_corename || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice stands
    const std::string core = openblas_get_corename();
    const CpuLevel level = cpu_level();
    if (level == CpuLevel::SCALAR) return;  // OpenBLAS's own choice stands
    const bool avx512 = level >= CpuLevel::AVX512;
    for (const char* g : {"SkylakeX", "Cooperlake", "SapphireRapids"})  // AVX-512 cores: good for any level
        if (core == g) return;
    for (const char* g : {"Haswell", "Zen"})  // AVX2 cores
        if (core == g && !avx512) return;
    const char* want = avx512 ? "SkylakeX" : "Haswell";
    setenv("OPENBLAS_CORETYPE", want, 0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");  // not inherited by child processes
}

}  // namespace

void blas_ensure_core() {
    static const bool once = (select_blas_core(), true);
    (void)once;
}

void blas_set_threads(int n) {
    blas_ensure_core();
    openblas_set_num_threads(n);
}

const char* blas_core_name() {
    blas_ensure_core();
    return openblas_get_corename ? openblas_get_corename() : "unknown";
}

void gemm_f32(bool trans_b, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
              float* C, int ldc) {
    if (gemm_f32_tiled(trans_b, m, n, k, alpha, A, lda, B, ldb, C, ldc)) return;
    blas_ensure_core();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B, ldb, 0.0f,
                C, ldc);
}

}  // namespace steward
