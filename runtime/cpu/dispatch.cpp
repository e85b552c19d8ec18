// The CPU kernels' entry points (kernels.h, quant_dot.h): each forwards to the kernel level chosen
// at the first call (cpu/cpu_features.h), through one table of function pointers per level. The
// levels' own code is kernels_<level>.cpp and quant_dot_<level>.cpp.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/quant_dot.h"

// Each level's namespace holds the same declarations as steward's own.
namespace steward::scalar {
#include "cpu/kernels_api.inc"
#include "cpu/quant_dot_api.inc"
}  // namespace steward::scalar
namespace steward::avx2 {
#include "cpu/kernels_api.inc"
#include "cpu/quant_dot_api.inc"
}  // namespace steward::avx2
namespace steward::avx512 {
#include "cpu/kernels_api.inc"
#include "cpu/quant_dot_api.inc"
}  // namespace steward::avx512
namespace steward::avx512vnni {
#include "cpu/kernels_api.inc"
#include "cpu/quant_dot_api.inc"
}  // namespace steward::avx512vnni

namespace steward {

namespace {

// Every function of kernels_api.inc and quant_dot_api.inc.
#define STEWARD_CPU_KERNELS(X)                                                                          \
    X(gemm_min_tokens) X(matmul) X(matmul_many) X(gemm_f32_tiled) X(rmsnorm) X(swiglu) X(exp_sub_sum) X(sum_exp_shifted) \
    X(dot_f32) X(dot_f16) X(axpy_f32) X(axpy_f16) X(dot_f16_rows) X(axpy_f16_rows) X(dot_f32_rows)        \
    X(axpy_f32_rows) X(dot_bf16) X(dot_q8_0) X(dot_q4_0) X(axpy_bf16) X(axpy_q8_0) X(axpy_q4_0) X(to_f16) \
    X(from_f16) X(quant_dot_supported) X(quant_dot_wide)                                                  \
    X(quant_act_row_bytes) X(quantize_activation) X(vec_dot) X(quant_dot_path_available) X(vec_dot_on)   \
    X(quant_matmul_rows) X(quantize_activations_for) X(dequantize_row_fast) X(quant_gemm_supported)        \
    X(quant_gemm_acts) X(quant_gemm_rows)

struct Kernels {
#define STEWARD_FIELD(f) decltype(&scalar::f) f;
    STEWARD_CPU_KERNELS(STEWARD_FIELD)
#undef STEWARD_FIELD
};

#define STEWARD_ENTRY(f) &STEWARD_LEVEL::f,
#define STEWARD_LEVEL scalar
constexpr Kernels kScalar{STEWARD_CPU_KERNELS(STEWARD_ENTRY)};
#undef STEWARD_LEVEL
#define STEWARD_LEVEL avx2
constexpr Kernels kAvx2{STEWARD_CPU_KERNELS(STEWARD_ENTRY)};
#undef STEWARD_LEVEL
#define STEWARD_LEVEL avx512
constexpr Kernels kAvx512{STEWARD_CPU_KERNELS(STEWARD_ENTRY)};
#undef STEWARD_LEVEL
#define STEWARD_LEVEL avx512vnni
constexpr Kernels kAvx512Vnni{STEWARD_CPU_KERNELS(STEWARD_ENTRY)};
#undef STEWARD_LEVEL
#undef STEWARD_ENTRY

constexpr const Kernels* kLevels[kCpuLevelCount] = {&kScalar, &kAvx2, &kAvx512, &kAvx512Vnni};

// The level in use; -1 until the first kernel call or set_cpu_level.
std::atomic<int> g_level{-1};

// The supported level, lowered by STEWARD_CPU_LEVEL where it names a level the CPU has.
CpuLevel initial_level() {
    const CpuLevel supported = cpu_level_supported();
    const char* env = std::getenv("STEWARD_CPU_LEVEL");
    if (env == nullptr || *env == '\0') return supported;
    const auto asked = parse_cpu_level(env);
    if (!asked) {
        spdlog::warn("STEWARD_CPU_LEVEL='{}' names no kernel level (scalar, avx2, avx512, avx512vnni); running at {}",
                     env, cpu_level_name(supported));
        return supported;
    }
    if (*asked > supported) {
        spdlog::warn("STEWARD_CPU_LEVEL={}: this CPU ({}) supports up to {}; running at {}", env,
                     cpu_features().model_name, cpu_level_name(supported), cpu_level_name(supported));
        return supported;
    }
    return *asked;
}

// The streaming tile's rows (kernels.h g_stream_rows): STEWARD_STREAM_ROWS where it says 1 or 4,
// else 1 on AMD's CPUs and 4 elsewhere.
int initial_stream_rows() {
    if (const char* e = std::getenv("STEWARD_STREAM_ROWS"); e != nullptr && *e != '\0') {
        if (std::strcmp(e, "1") == 0 || std::strcmp(e, "4") == 0) return std::atoi(e);
        spdlog::warn("STEWARD_STREAM_ROWS='{}': the streaming tile takes 1 or 4 rows; choosing from the CPU's vendor", e);
    }
    return cpu_features().vendor == "AuthenticAMD" ? 1 : 4;
}

// The BF16 GEMM's pairs (kernels.h g_gemm_bf16): where the CPU and OS have AVX512_BF16 and 512-bit
// state, unless STEWARD_BF16_GEMM=f32.
bool initial_gemm_bf16() {
    const CpuFeatures& f = cpu_features();
    const bool can = f.avx512bf16 && f.os_zmm && f.avx512f && f.avx512bw;
    const char* e = std::getenv("STEWARD_BF16_GEMM");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "pairs") == 0) return can;
    if (std::strcmp(e, "f32") == 0) return false;
    spdlog::warn("STEWARD_BF16_GEMM='{}': the BF16 GEMM takes 'pairs' (vdpbf16ps where the CPU has AVX512_BF16) or 'f32'; using {}",
                 e, can ? "pairs" : "f32");
    return can;
}

// The choices by vendor and feature above, once per process: from the first kernel call or the
// first set_cpu_level, whichever comes first (not on every kernel call).
void choose_shapes_once() {
    [[maybe_unused]] static const bool chosen = (g_stream_rows.store(initial_stream_rows(), std::memory_order_relaxed),
                                                 g_f32_row_bytes.store(vendor_f32_row_bytes(), std::memory_order_relaxed),
                                                 g_half_row_bytes.store(vendor_half_row_bytes(), std::memory_order_relaxed),
                                                 g_gemm_bf16.store(initial_gemm_bf16(), std::memory_order_relaxed), true);
}

const Kernels& kernels() {
    int level = g_level.load(std::memory_order_relaxed);
    if (level < 0) {
        choose_shapes_once();
        int expected = -1;
        g_level.compare_exchange_strong(expected, (int)initial_level(), std::memory_order_relaxed);
        level = g_level.load(std::memory_order_relaxed);
    }
    return *kLevels[level];
}

}  // namespace

CpuLevel cpu_level() {
    kernels();
    return (CpuLevel)g_level.load(std::memory_order_relaxed);
}

bool set_cpu_level(CpuLevel level) {
    if (level > cpu_level_supported()) return false;
    choose_shapes_once();
    g_level.store((int)level, std::memory_order_relaxed);
    return true;
}

// --- kernels.h ---------------------------------------------------------------------------------

bool gemm_bf16_pairs() {
    kernels();
    return g_gemm_bf16.load(std::memory_order_relaxed);
}
int stream_tile_rows() {
    kernels();
    return g_stream_rows.load(std::memory_order_relaxed);
}
int64_t env_row_bytes() {
    const char* e = std::getenv("STEWARD_STREAM_ROWS");
    return e == nullptr ? -1 : std::strcmp(e, "1") == 0 ? kEveryRowLength : std::strcmp(e, "4") == 0 ? 0 : -1;
}
int64_t vendor_f32_row_bytes() {
    if (const int64_t e = env_row_bytes(); e >= 0) return e;
    return cpu_features().vendor == "AuthenticAMD" ? 8192 : 0;
}
int64_t vendor_half_row_bytes() { return vendor_f32_row_bytes(); }  // Zen 4's crossover is F32's (kernels.h)
bool half_row_limit_used() { return cpu_level() >= CpuLevel::AVX512 && stream_tile_rows() == 1; }
std::string describe_row_bytes(int64_t row_bytes, int tile_rows) {
    const std::string tiles = std::to_string(tile_rows) + "-row tiles";
    if (row_bytes >= kEveryRowLength) return "a row at a time";
    if (row_bytes <= 0) return "in " + tiles;
    return "a row at a time up to " + std::to_string(row_bytes) + "-byte rows, longer in " + tiles;
}

int gemm_min_tokens(const WeightView& W) { return kernels().gemm_min_tokens(W); }

int gemm_class(GgmlType t) {
    if (t == GgmlType::F32) return (int)GemmClass::F32;
    if (t == GgmlType::F16) return (int)GemmClass::HALF;
    if (t == GgmlType::BF16) return (int)GemmClass::BF16;
    if (!quant_dot_supported(t)) return -1;
    if (t == GgmlType::IQ4_XS || t == GgmlType::IQ4_NL || t == GgmlType::MXFP4) return (int)GemmClass::TABLE;
    return quant_block_elems(t) == kQKK ? (int)GemmClass::Q256 : (int)GemmClass::Q32;
}
namespace {
// F32's streaming rows in matmul_variant: ", 1-2 tokens a row at a time up to 8192-byte rows, longer
// in 4-row tiles".
std::string f32_rows_text(CpuLevel l) {
    kernels();
    return (l >= CpuLevel::AVX512 ? ", 1-2 tokens " : ", 1 token ") + describe_row_bytes(g_f32_row_bytes.load(std::memory_order_relaxed));
}
// The half types' at one token: "a row at a time up to 8192-byte rows, longer in 6-row tiles".
std::string half_rows_text() {
    kernels();
    return describe_row_bytes(g_half_row_bytes.load(std::memory_order_relaxed), 6);
}
}  // namespace

std::string matmul_variant(GgmlType t) {
    WeightView w;
    w.type = t;
    const CpuLevel l = cpu_level();
    const int from = gemm_min_tokens(w);
    const char* isa = cpu_level_name(l);
    std::string dec;
    if (!exact_quant() && quant_dot_supported(t))
        dec = std::string("int8 dot products, ") + isa + (quant_dot_wide(t) && l >= CpuLevel::AVX512 ? " 64-byte" : "") +
              " (activations to 8 bits)";
    else if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q8_0)
        dec = std::string("streaming dot products, ") + isa + (t == GgmlType::F32 ? "" : " (weights converted in registers)") +
              (t == GgmlType::F32 && l >= CpuLevel::AVX2 ? f32_rows_text(l)
               : l >= CpuLevel::AVX512 && t != GgmlType::Q8_0
                   ? (half_row_limit_used() ? ", 1 token 256-bit, " + half_rows_text() + ", 2 in 4-row 256-bit tiles" : ", 1-2 tokens in 4-row tiles")
                   : "");
    else
        dec = std::string("dequantized rows, ") + isa + " (exact path)";
    const bool half = t == GgmlType::F16;
    const std::string gemm = !exact_quant() && quant_gemm_supported(t) ? std::string("int8 panel GEMM, ") + isa
                             : l >= CpuLevel::AVX512 ? std::string("tiled AVX-512 GEMM") +
                                                           (t == GgmlType::BF16 && gemm_bf16_pairs() ? " (BF16 pairs, vdpbf16ps; tokens rounded to BF16)" : "")
                             : half && l >= CpuLevel::AVX2               ? std::string("4x3 register tiles, ") + isa + " (weights converted in registers); " +
                                                                             std::to_string(kAvx2TiledHalfFrom) + "+: tiled GEMM, " + isa + " (4 rows x 24 tokens)"
                             : (t == GgmlType::F32 || t == GgmlType::BF16) && l >= CpuLevel::AVX2 ? std::string("tiled GEMM, ") + isa + " (4 rows x 24 tokens)"
                                                                         : std::string("OpenBLAS sgemm (") + blas_core_name() + ")";
    return "1-" + std::to_string(from - 1) + " tokens: " + dec + "; " + std::to_string(from) + "+: " + gemm;
}

namespace {
std::atomic<bool> g_matmul_timing{false};
std::atomic<int64_t> g_matmul_ns{0};
}  // namespace

void set_matmul_timing(bool on) {
    g_matmul_ns.store(0, std::memory_order_relaxed);
    g_matmul_timing.store(on, std::memory_order_relaxed);
}

double take_matmul_seconds() { return (double)g_matmul_ns.exchange(0, std::memory_order_relaxed) * 1e-9; }

void matmul(const WeightView& W, const float* X, int n_tok, float* Y, ThreadPool& pool, MatmulPath path) {
    if (!g_matmul_timing.load(std::memory_order_relaxed)) return kernels().matmul(W, X, n_tok, Y, pool, path);
    const auto t0 = std::chrono::steady_clock::now();
    kernels().matmul(W, X, n_tok, Y, pool, path);
    g_matmul_ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
        std::memory_order_relaxed);
}
void matmul_many(const MatmulOut* outs, int n_outs, const float* X, int n_tok, ThreadPool& pool) {
    if (!g_matmul_timing.load(std::memory_order_relaxed)) return kernels().matmul_many(outs, n_outs, X, n_tok, pool);
    const auto t0 = std::chrono::steady_clock::now();
    kernels().matmul_many(outs, n_outs, X, n_tok, pool);
    g_matmul_ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
        std::memory_order_relaxed);
}
bool gemm_f32_tiled(bool trans_b, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                    float* C, int ldc) {
    return kernels().gemm_f32_tiled(trans_b, m, n, k, alpha, A, lda, B, ldb, C, ldc);
}
void rmsnorm(const float* x, const float* w, float eps, int n, int n_tok, float* y) {
    kernels().rmsnorm(x, w, eps, n, n_tok, y);
}
void swiglu(float* g, const float* u, int64_t n) { kernels().swiglu(g, u, n); }
float exp_sub_sum(float* x, int n, float mx) { return kernels().exp_sub_sum(x, n, mx); }
double sum_exp_shifted(const float* x, int64_t n, float m) { return kernels().sum_exp_shifted(x, n, m); }
float dot_f32(const float* a, const float* b, int n) { return kernels().dot_f32(a, b, n); }
float dot_f16(const float* a, const uint16_t* b, int n) { return kernels().dot_f16(a, b, n); }
void dot_f16_rows(const float* a, const uint16_t* const* rows, int n_rows, int n, float* out) {
    kernels().dot_f16_rows(a, rows, n_rows, n, out);
}
void axpy_f16_rows(const float* w, const uint16_t* const* rows, int n_rows, int n, float* y) {
    kernels().axpy_f16_rows(w, rows, n_rows, n, y);
}
void dot_f32_rows(const float* a, const float* const* rows, int n_rows, int n, float* out) {
    kernels().dot_f32_rows(a, rows, n_rows, n, out);
}
void axpy_f32_rows(const float* w, const float* const* rows, int n_rows, int n, float* y) {
    kernels().axpy_f32_rows(w, rows, n_rows, n, y);
}
void axpy_f32(float a, const float* x, float* y, int n) { kernels().axpy_f32(a, x, y, n); }
void axpy_f16(float a, const uint16_t* x, float* y, int n) { kernels().axpy_f16(a, x, y, n); }
float dot_bf16(const float* a, const uint16_t* b, int n) { return kernels().dot_bf16(a, b, n); }
float dot_q8_0(const float* a, const void* b, int n) { return kernels().dot_q8_0(a, b, n); }
float dot_q4_0(const float* a, const void* b, int n) { return kernels().dot_q4_0(a, b, n); }
void axpy_bf16(float a, const uint16_t* x, float* y, int n) { kernels().axpy_bf16(a, x, y, n); }
void axpy_q8_0(float a, const void* x, float* y, int n) { kernels().axpy_q8_0(a, x, y, n); }
void axpy_q4_0(float a, const void* x, float* y, int n) { kernels().axpy_q4_0(a, x, y, n); }
void to_f16(const float* x, uint16_t* y, int n) { kernels().to_f16(x, y, n); }
void from_f16(const uint16_t* x, float* y, int n) { kernels().from_f16(x, y, n); }

// --- quant_dot.h -------------------------------------------------------------------------------

bool quant_dot_supported(GgmlType type) { return kernels().quant_dot_supported(type); }
bool quant_dot_wide(GgmlType type) { return kernels().quant_dot_wide(type); }
size_t quant_act_row_bytes(GgmlType type, int64_t n_cols) { return kernels().quant_act_row_bytes(type, n_cols); }
void quantize_activation(GgmlType type, const float* x, int64_t n_cols, void* out) {
    kernels().quantize_activation(type, x, n_cols, out);
}
float vec_dot(GgmlType type, const void* w_row, const void* act, int64_t n_cols) {
    return kernels().vec_dot(type, w_row, act, n_cols);
}
bool quant_dot_path_available(QuantDotPath path) { return kernels().quant_dot_path_available(path); }
float vec_dot_on(QuantDotPath path, GgmlType type, const void* w_row, const void* act, int64_t n_cols) {
    return kernels().vec_dot_on(path, type, w_row, act, n_cols);
}
void quant_matmul_rows(const WeightView& W, const uint8_t* acts, int n_tok, float* Y, int64_t r_begin,
                       int64_t r_end) {
    kernels().quant_matmul_rows(W, acts, n_tok, Y, r_begin, r_end);
}
const uint8_t* quantize_activations_for(const WeightView& W, const float* X, int n_tok) {
    return kernels().quantize_activations_for(W, X, n_tok);
}
bool dequantize_row_fast(GgmlType type, const void* blocks, int64_t n_elems, float* out) {
    return kernels().dequantize_row_fast(type, blocks, n_elems, out);
}
bool quant_gemm_supported(GgmlType type) { return kernels().quant_gemm_supported(type); }
const void* quant_gemm_acts(const WeightView& W, const float* X, int n_tok, ThreadPool& pool, int slot) {
    return kernels().quant_gemm_acts(W, X, n_tok, pool, slot);
}
void quant_gemm_rows(const WeightView& W, const void* acts, int n_tok, float* Y, int64_t r_begin, int64_t r_end) {
    kernels().quant_gemm_rows(W, acts, n_tok, Y, r_begin, r_end);
}

}  // namespace steward
