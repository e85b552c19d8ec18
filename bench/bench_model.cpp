// Model-core bench: prefill (128-token prompt) and decode (128 tokens) throughput of the CPU backend
// on a synthetic ~110M llama (dim 768, 12 layers, 12/12 heads, ffn 2048, vocab 32000) at 1 and 2
// threads, against the batch-1 roofline (weight bytes per token / read bandwidth measured here);
// with --peer, llama.cpp's llama-bench on the same GGUF files, side by side.
// Run: ./build/bench_model [--dtypes f32,f16,q8_0,q4_k_m,q6_k] [--threads 1,2] [--reps 3] [--q4km PATH]
//                          [--peer] [--peer-script ../shared/peers/llama-bench.sh] [--model-dir DIR]
//                          [--rounds N] (Steward and llama.cpp alternate N times per file; the ratio is the
//                          median of the N same-round ratios, each side's figure its best)
//                          [--no-kernels] (skips the per-type kernel table) [--arch llama|qwen3moe|gpt-oss|gemma3]
//                          [--kernels-only Q8_0,IQ4_XS] (only those rows of the kernel table, then stops)
//                          [--plan] (measures the CPU plan, cpu/plan.h, instead of reading the cached one)
//                          [--chunks] (then forwards of 8-48 tokens, the plan's stream/GEMM crossover
//                          against the unplanned default, alternating in the same run)
//   --arch qwen3moe: a ~0.9B mixture of experts (8 experts, 2 per token); gpt-oss: a ~0.7B gpt-oss
//   (16 experts, 4 per token; its dtype mxfp4_moe); gemma3: Gemma 3 1B's shape.
//   KV cache types side by side on one file: ./build/bench_model --model FILE.gguf --kv-types f16,q8_0,q4_0
//                          [--kv-ctx 384] [--threads 1,2] (decode tokens/s after a kv-ctx-token prefill)
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include <immintrin.h>

#include "cpu/cpu_features.h"
#include "cpu/forward.h"
#include "cpu/kernels.h"
#include "cpu/plan.h"
#include "cpu/sampling.h"
#include "cpu/thread_pool.h"
#include "model/quantize.h"
#include "model/quants.h"
#include "model/synth.h"
#include "util/strings.h"

using namespace steward;
using clk = std::chrono::steady_clock;

namespace {

constexpr int kPromptTokens = 128;  // llama-bench -p 128
constexpr int kDecodeTokens = 128;  // llama-bench -n 128: from an empty context, one token a step

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The sum of buf[b, e) (e - b a multiple of 32), as fast as this CPU reads: AVX2 where it has it.
__attribute__((target("avx2"))) float sum_avx2(const float* buf, size_t b, size_t e) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = b; i < e; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(&buf[i]));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(&buf[i + 8]));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(&buf[i + 16]));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(&buf[i + 24]));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float total = 0.0f;
    for (float v : t) total += v;
    return total;
}
float sum_sse(const float* buf, size_t b, size_t e) {
    __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = b; i < e; i += 16) {
        a0 = _mm_add_ps(a0, _mm_loadu_ps(&buf[i]));
        a1 = _mm_add_ps(a1, _mm_loadu_ps(&buf[i + 4]));
        a2 = _mm_add_ps(a2, _mm_loadu_ps(&buf[i + 8]));
        a3 = _mm_add_ps(a3, _mm_loadu_ps(&buf[i + 12]));
    }
    float t[4];
    _mm_storeu_ps(t, _mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)));
    return t[0] + t[1] + t[2] + t[3];
}

// Read bandwidth (GB/s): n_threads sum disjoint parts of a 512 MiB buffer; best of 5 passes.
double measure_bandwidth(int n_threads) {
    const size_t n = (size_t)1 << 27;  // floats
    const int64_t n_parts = (int64_t)n_threads * 16;
    std::vector<float> buf(n);
    ThreadPool pool(n_threads);
    pool.parallel_for(n_parts, [&](int64_t part) {  // first touch by the threads that read it
        for (size_t i = n / n_parts * part, e = i + n / n_parts; i < e; i++) buf[i] = (float)(i & 7);
    });
    double best = 0.0;
    volatile float sink = 0.0f;
    std::vector<float> part_sums(n_parts);
    const bool avx2 = cpu_features().avx2 && cpu_features().os_ymm;
    for (int rep = 0; rep < 5; rep++) {
        auto t0 = clk::now();
        pool.parallel_for(n_parts, [&](int64_t part) {
            const size_t b = n / n_parts * part, e = b + n / n_parts;
            part_sums[part] = avx2 ? sum_avx2(buf.data(), b, e) : sum_sse(buf.data(), b, e);
        });
        float total = 0.0f;
        for (float v : part_sums) total += v;
        sink = total;
        best = std::max(best, (double)n * 4 / secs(t0, clk::now()) / 1e9);
    }
    (void)sink;
    return best;
}

// What one parallel_for costs beyond its work (decode issues ~100 per token): 2 chunks per
// participant of ~2 us busy work each, against the ideal of that work split evenly; best of 5
// rounds of 2000 calls, in microseconds.
double measure_pool_overhead_us(int n_threads) {
    ThreadPool pool(n_threads);
    const auto work = std::chrono::microseconds(2);
    const std::function<void(int64_t)> fn = [&](int64_t) {
        const auto until = clk::now() + work;
        while (clk::now() < until) {
        }
    };
    const int n_chunks = 2 * n_threads;
    const double ideal = (double)n_chunks / n_threads * 2.0;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        const int n = 2000;
        auto t0 = clk::now();
        for (int i = 0; i < n; i++) pool.parallel_for(n_chunks, fn);
        best = std::min(best, secs(t0, clk::now()) / n * 1e6 - ideal);
    }
    return best;
}

// A [n_rows][n_cols] matrix of random weights in `type` (F32, F16, BF16, the quantizer's block types, or
// IQ4_XS as random codes), bytes owned.
struct BenchMatrix {
    std::vector<uint8_t> bytes;
    WeightView view;
    BenchMatrix(GgmlType type, int64_t n_cols, int64_t n_rows) {
        view.type = type;
        view.n_cols = n_cols;
        view.n_rows = n_rows;
        bytes.resize((size_t)(view.row_bytes() * n_rows));
        std::vector<float> row((size_t)n_cols);
        uint32_t x = 12345;
        for (int64_t r = 0; r < n_rows; r++) {
            for (auto& v : row) v = (float)((x = x * 1664525u + 1013904223u) >> 8) / (1 << 24) - 0.5f;
            uint8_t* dst = bytes.data() + r * view.row_bytes();
            for (int64_t c = 0; c < n_cols; c++) {
                if (type == GgmlType::F32) std::memcpy(dst + 4 * c, &row[c], 4);
                const uint16_t h = type == GgmlType::F16 ? f32_to_f16(row[c]) : f32_to_bf16(row[c]);
                if (type == GgmlType::F16 || type == GgmlType::BF16) std::memcpy(dst + 2 * c, &h, 2);
            }
            if (type == GgmlType::IQ4_XS) {  // no quantizer of ours: random codes and scales, a sane d
                auto* b = reinterpret_cast<BlockIq4Xs*>(dst);
                for (int64_t i = 0; i < n_cols / kQKK; i++) {
                    uint8_t* raw = reinterpret_cast<uint8_t*>(&b[i]);
                    for (size_t j = 0; j < sizeof(BlockIq4Xs); j++) raw[j] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
                    b[i].d = f32_to_f16(0.002f);
                }
            } else if (quant_block_elems(type) > 1 && !quantize_row(type, row.data(), n_cols, dst).ok()) {
                std::fprintf(stderr, "bench_model: no quantizer for %s\n", ggml_type_name((uint32_t)type));
            }
        }
        view.data = bytes.data();
    }
};

// Kernel figures per weight type: the decode matvec (1 token) streaming a 32768 x 768 matrix in
// GB/s (25-100 MB: past L2, though a large L3 may hold it), and on 2048 x 768 the streaming kernel
// against the sgemm path in GFLOP/s at a few token counts (how gemm_min_tokens is chosen); best of reps.
constexpr GgmlType kKernelTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,  GgmlType::Q8_0,
                                     GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS};

void bench_kernels(const std::vector<int>& threads, int reps, const std::vector<std::string>& only) {
    blas_set_threads(1);  // as CpuForward: our pool splits the rows, OpenBLAS runs one thread per slice
    std::printf("\nkernels: matvec = 1 token over 32768 x 768; then stream/gemm GFLOP/s on 2048 x 768 at n_tok 4, 16, "
                "32, 48, 128 (AUTO: gemm from the 'from' column; gemm is our tiled kernel on AVX-512 builds, the int8 panel GEMM "
                "for the block types and 4x3 register tiles for F16 on AVX2), and "
                "OpenBLAS sgemm (core %s) at 128\n%-5s %3s %4s %12s  %-11s  %-11s  %-11s  %-11s  %-11s  %6s\n",
                blas_core_name(), "type", "thr", "from", "matvec GB/s", "4", "16", "32", "48", "128", "blas");
    for (GgmlType type : kKernelTypes) {
        if (!only.empty() && std::find(only.begin(), only.end(), ggml_type_name((uint32_t)type)) == only.end()) continue;
        const BenchMatrix big(type, 768, 32768), ffn(type, 768, 2048);
        std::vector<float> X(128 * 768, 0.5f), Y(128 * 32768);
        for (int nt : threads) {
            ThreadPool pool(nt);
            auto best = [&](const WeightView& W, int n_tok, MatmulPath path) {
                double b = 1e9;
                for (int r = 0; r <= reps * 3; r++) {  // short calls: more reps, the first warms up
                    auto t0 = clk::now();
                    matmul(W, X.data(), n_tok, Y.data(), pool, path);
                    if (r > 0) b = std::min(b, secs(t0, clk::now()));
                }
                return b;
            };
            const double mv = (double)p_bytes(big.view) / best(big.view, 1, MatmulPath::STREAM) / 1e9;
            std::printf("%-5s %3d %4d %12.1f", ggml_type_name((uint32_t)type), nt, gemm_min_tokens(ffn.view), mv);
            for (int n_tok : {4, 16, 32, 48, 128}) {
                const double flop = 2.0 * n_tok * 768 * 2048;
                std::printf("  %5.0f/%-5.0f", flop / best(ffn.view, n_tok, MatmulPath::STREAM) / 1e9,
                            flop / best(ffn.view, n_tok, MatmulPath::GEMM) / 1e9);
            }
            std::printf("  %6.0f\n", 2.0 * 128 * 768 * 2048 / best(ffn.view, 128, MatmulPath::BLAS) / 1e9);
            std::fflush(stdout);
        }
    }
}

std::vector<int32_t> prompt_tokens(const ModelParams& p, int n) {
    std::vector<int32_t> toks;
    for (int i = 0; i < n; i++) toks.push_back(300 + (i * 7919) % (p.n_vocab - 300));
    return toks;
}

// Best of reps: one kPromptTokens-token prefill from an empty context.
double bench_prefill(CpuForward& fwd, KvStorage& kv, const std::vector<int32_t>& table, int reps) {
    const std::vector<int32_t> toks = prompt_tokens(fwd.model().params(), kPromptTokens);
    SeqInput in;
    in.tokens = toks;
    in.block_table = table;
    std::vector<float> logits;
    fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();  // warm-up
    double best = 0;
    for (int r = 0; r < reps; r++) {
        auto t0 = clk::now();
        fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();
        best = std::max(best, kPromptTokens / secs(t0, clk::now()));
    }
    return best;
}

// Best of reps: kDecodeTokens greedy steps of one token from an empty context (as llama-bench's tg).
// With the best rep's share of its time spent outside matmul (norms, RoPE, attention, the argmax,
// the pool's barriers: what a faster matmul does not buy back).
struct DecodeFigures {
    double tok_s = 0;
    double non_matmul = 0;  // share of the time, 0..1
};
DecodeFigures bench_decode(CpuForward& fwd, KvStorage& kv, const std::vector<int32_t>& table, int reps) {
    const ModelParams& p = fwd.model().params();
    std::vector<float> logits;
    DecodeFigures best;
    set_matmul_timing(true);
    for (int r = 0; r <= reps; r++) {  // rep 0 warms up
        int32_t next = 300;
        SeqInput in;
        in.block_table = table;
        take_matmul_seconds();
        auto t0 = clk::now();
        for (int i = 0; i < kDecodeTokens; i++) {
            in.n_past = i;
            in.tokens = std::span<const int32_t>(&next, 1);
            fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();
            next = argmax(std::span<const float>(logits.data(), p.n_vocab));
        }
        const double s = secs(t0, clk::now()), mm = take_matmul_seconds();
        if (r > 0 && kDecodeTokens / s > best.tok_s) best = {kDecodeTokens / s, std::clamp(1.0 - mm / s, 0.0, 1.0)};
    }
    set_matmul_timing(false);
    return best;
}

// llama.cpp's figures for one file: (n_threads, is_prompt) -> tokens/s, the best of its reps (after
// its own warm-up run). Empty if the peer failed.
// Its stderr (build progress, errors) goes to `log`.
std::map<std::pair<int, bool>, double> run_peer(const std::string& script, const std::string& model,
                                                const std::string& threads, int reps, const std::string& log) {
    std::map<std::pair<int, bool>, double> out;
    const std::string cmd = script + " -m '" + model + "' -p " + std::to_string(kPromptTokens) + " -n " +
                            std::to_string(kDecodeTokens) + " -t " + threads + " -r " + std::to_string(reps) +
                            " -o json 2>>'" + log + "'";
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) return out;
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    if (pclose(f) != 0) {
        std::fprintf(stderr, "bench_model: peer failed on %s (see %s)\n", model.c_str(), log.c_str());
        return out;
    }
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_array()) {
        std::fprintf(stderr, "bench_model: peer output on %s is not a JSON array\n", model.c_str());
        return out;
    }
    for (const auto& row : j) {
        const int nt = row.value("n_threads", 0), np = row.value("n_prompt", 0), ng = row.value("n_gen", 0);
        if (nt <= 0 || (np > 0) == (ng > 0)) continue;
        // Its best rep, as Steward's figure is its best rep (llama-bench's avg_ts is the mean).
        double best = 0;
        if (row.contains("samples_ts") && row["samples_ts"].is_array())
            for (const auto& v : row["samples_ts"])
                if (v.is_number()) best = std::max(best, v.get<double>());
        out[{nt, np > 0}] = best > 0 ? best : row.value("avg_ts", 0.0);
    }
    return out;
}

SynthSpec spec_110m(GgmlType dtype) {
    SynthSpec s;
    s.n_embd = 768; s.n_layer = 12; s.n_head = 12; s.n_head_kv = 12; s.n_ff = 2048; s.n_vocab = 32000; s.n_ctx = 2048;
    s.dtype = dtype;
    return s;
}

// --arch: the bench's model. llama: the 110M above. qwen3moe: a ~0.9B-total mixture of experts
// (dim 1024, 16 layers, 16/4 heads, 8 experts of width 2048, 2 per token: ~0.2B read per token).
// gemma3: Gemma 3 1B's shape (dim 1152, 26 layers, 4/1 heads of 256, ffn 6912, window 512 on 5 of
// every 6 layers, tied head) with a 32000-token vocabulary (~0.74B).
SynthSpec spec_for_arch(const std::string& arch, GgmlType dtype) {
    SynthSpec s = spec_110m(dtype);
    if (arch == "qwen3moe") {
        s.arch = arch;
        s.n_embd = 1024; s.n_layer = 16; s.n_head = 16; s.n_head_kv = 4; s.n_ff = 4096;
        s.n_expert = 8; s.n_expert_used = 2; s.n_ff_exp = 2048;
    } else if (arch == "gpt-oss") {
        s.arch = arch;
        s.n_embd = 1024; s.n_layer = 12; s.n_head = 16; s.n_head_kv = 4; s.head_dim = 64; s.n_ff = 1024;
        s.n_expert = 16; s.n_expert_used = 4; s.n_ff_exp = 1024; s.sliding_window = 128;
    } else if (arch == "gemma3") {
        s.arch = arch;
        s.n_embd = 1152; s.n_layer = 26; s.n_head = 4; s.n_head_kv = 1; s.head_dim = 256; s.n_ff = 6912;
        s.sliding_window = 512; s.tied_output = true;
    }
    return s;
}

std::string arch_description(const std::string& arch) {
    if (arch == "qwen3moe")
        return "synthetic ~0.9B qwen3moe (dim 1024, 16 layers, 16/4 heads, 8 experts of ffn 2048, 2 per token, vocab 32000)";
    if (arch == "gpt-oss")
        return "synthetic ~0.7B gpt-oss (dim 1024, 12 layers, 16/4 heads of 64, 16 experts of ffn 1024, 4 per token, "
               "window 128 on every other layer, YaRN 32, vocab 32000)";
    if (arch == "gemma3")
        return "synthetic Gemma-3-1B-shaped gemma3 (dim 1152, 26 layers, 4/1 heads of 256, ffn 6912, window 512, vocab "
               "32000, tied)";
    return "synthetic 110M llama (dim 768, 12 layers, 12/12 heads, ffn 2048, vocab 32000)";
}

std::string g_arch = "llama";  // --arch

// The --arch spec for a weight type name (parse_weight_format: a type or llama-quantize's mix, e.g.
// q4_k_m), or nullopt where our synth does not write it.
std::optional<SynthSpec> synth_spec_for(const std::string& d) {
    auto f = parse_weight_format(d);
    if (!f) return std::nullopt;
    SynthSpec s = spec_for_arch(g_arch, f->type);
    s.mix = f->mix;
    if (!synth_validate(s)) return std::nullopt;
    return s;
}

// Decode tokens/s (best of reps) of kDecodeTokens greedy steps after a ctx-token prefill: the KV
// type shows in the attention reads, which grow with the context.
double bench_decode_at(CpuForward& fwd, KvStorage& kv, const std::vector<int32_t>& table, int ctx, int reps) {
    const ModelParams& p = fwd.model().params();
    const std::vector<int32_t> toks = prompt_tokens(p, ctx);
    std::vector<float> logits;
    for (int b = 0; b < ctx; b += kPromptTokens) {
        SeqInput in;
        in.n_past = b;
        in.tokens = std::span<const int32_t>(toks.data() + b, std::min(kPromptTokens, ctx - b));
        in.block_table = table;
        fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();
    }
    double best = 0;
    for (int r = 0; r <= reps; r++) {  // rep 0 warms up
        int32_t next = 300;
        SeqInput in;
        in.block_table = table;
        auto t0 = clk::now();
        for (int i = 0; i < kDecodeTokens; i++) {
            in.n_past = ctx + i;
            in.tokens = std::span<const int32_t>(&next, 1);
            fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();
            next = argmax(std::span<const float>(logits.data(), p.n_vocab));
        }
        if (r > 0) best = std::max(best, kDecodeTokens / secs(t0, clk::now()));
    }
    return best;
}

// Chunk forwards: n tokens of one sequence after kPromptTokens of context (a speculative step's
// verification, a chunked prefill's piece, a batch of n decoding sequences' matmuls), tokens/s with
// the CPU plan's stream/GEMM crossover (first) and without it (the kernel level's default: cpu/
// kernels.h), alternating per rep so that a drift of the machine reaches both; best of reps each.
std::pair<double, double> bench_chunk(CpuForward& fwd, KvStorage& kv, const std::vector<int32_t>& table, int n, int reps) {
    const std::vector<int32_t> toks = prompt_tokens(fwd.model().params(), kPromptTokens + n);
    std::vector<float> logits;
    SeqInput ctx;
    ctx.tokens = std::span<const int32_t>(toks.data(), kPromptTokens);
    ctx.block_table = table;
    fwd.forward(kv, std::span<const SeqInput>(&ctx, 1), logits).value();
    int planned[kGemmClasses];
    for (int c = 0; c < kGemmClasses; c++) planned[c] = g_gemm_from[c].load();
    double best[2] = {0, 0};
    for (int r = 0; r <= 2 * reps; r++)  // rep 0 warms up; short calls: twice the reps
        for (int v = 0; v < 2; v++) {
            for (int c = 0; c < kGemmClasses; c++) g_gemm_from[c].store(v == 0 ? planned[c] : 0);
            SeqInput in;
            in.n_past = kPromptTokens;
            in.tokens = std::span<const int32_t>(toks.data() + kPromptTokens, (size_t)n);
            in.block_table = table;
            auto t0 = clk::now();
            fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();
            if (r > 0) best[v] = std::max(best[v], n / secs(t0, clk::now()));
        }
    for (int c = 0; c < kGemmClasses; c++) g_gemm_from[c].store(planned[c]);
    return {best[0], best[1]};
}

struct Options {
    std::vector<std::string> dtypes{"f32", "f16", "q8_0", "q4_k_m", "q6_k"};
    std::vector<std::string> kv_types;  // --kv-types: the KV cache comparison instead of the weight-type table
    std::string model;                  // --model: the file of the KV comparison
    int kv_ctx = 384;
    std::vector<int> threads{1, 2};
    std::string threads_s = "1,2";
    std::string model_dir = "models", q4km, peer_script = "../shared/peers/llama-bench.sh";
    bool peer = false, kernels = true, plan = false, chunks = false;
    std::vector<std::string> kernels_only;  // --kernels-only Q8_0,IQ4_XS: that part of the kernel table, then stop
    int reps = 3;
    int rounds = 1;  // --rounds: Steward and the peer alternate this many times per file
};

// The GGUF for a weight type name: the file --q4km names for q4_k_m, else synthesised when our
// synth writes that type (synth_spec_for), else llama-quantize's output from the F32 file when the
// peer is on. Empty: none.
std::string model_file(const Options& o, const std::string& d) {
    const std::string path = o.model_dir + (g_arch == "llama" ? "/synth-110m-" : "/synth-" + g_arch + "-") + d + ".gguf";
    if (d == "q4_k_m" && !o.q4km.empty()) return o.q4km;
    if (std::filesystem::exists(path)) return path;
    if (auto spec = synth_spec_for(d)) {
        std::fprintf(stderr, "writing %s ...\n", path.c_str());
        if (auto ok = synth_write(*spec, path); ok) return path;
    }
    if (!o.peer) return "";
    const std::string f32 = model_file(o, "f32");
    if (f32.empty()) return "";
    std::string type = d;
    std::transform(type.begin(), type.end(), type.begin(), ::toupper);
    std::fprintf(stderr, "quantizing %s with llama-quantize (%s) ...\n", path.c_str(), type.c_str());
    const std::string cmd = "PEER_TOOL=llama-quantize " + o.peer_script + " '" + f32 + "' '" + path + "' " + type +
                            " >>'" + o.model_dir + "/bench_model_peer.log' 2>&1";
    return std::system(cmd.c_str()) == 0 && std::filesystem::exists(path) ? path : "";
}

// A count on the command line: a whole number in [lo, 100000], else a message naming the flag.
std::optional<int> parse_count(const char* flag, const char* text, int lo) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > 100000) {
        std::fprintf(stderr, "bench_model: %s takes a whole number from %d to 100000 (got '%s')\n", flag, lo, text);
        return std::nullopt;
    }
    return (int)v;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--dtypes" && i + 1 < argc) o.dtypes = split_list(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) {
            o.threads_s = argv[++i];
            o.threads.clear();
            for (const auto& t : split_list(o.threads_s)) {
                const auto n = parse_count("--threads", t.c_str(), 1);
                if (!n) return 2;
                o.threads.push_back(*n);
            }
            if (o.threads.empty()) {
                std::fprintf(stderr, "bench_model: --threads names no thread count (e.g. --threads 1,2)\n");
                return 2;
            }
        } else if (a == "--reps" || a == "--rounds" || a == "--kv-ctx") {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_model: %s needs a number\n", a.c_str());
                return 2;
            }
            const auto n = parse_count(a.c_str(), argv[++i], a == "--kv-ctx" ? 0 : 1);
            if (!n) return 2;
            (a == "--reps" ? o.reps : a == "--rounds" ? o.rounds : o.kv_ctx) = *n;
        }
        else if (a == "--model-dir" && i + 1 < argc) o.model_dir = argv[++i];
        else if (a == "--q4km" && i + 1 < argc) o.q4km = argv[++i];
        else if (a == "--peer") o.peer = true;
        else if (a == "--arch" && i + 1 < argc) {
            g_arch = argv[++i];
            if (g_arch != "llama" && g_arch != "qwen3moe" && g_arch != "gpt-oss" && g_arch != "gemma3") {
                std::fprintf(stderr, "bench_model: --arch is llama, qwen3moe, gpt-oss or gemma3\n");
                return 2;
            }
        }
        else if (a == "--no-kernels") o.kernels = false;
        else if (a == "--kernels-only" && i + 1 < argc) {
            o.kernels_only = split_list(argv[++i]);
            if (o.kernels_only.empty()) {
                std::fprintf(stderr, "bench_model: --kernels-only names no type (e.g. --kernels-only Q8_0,IQ4_XS)\n");
                return 2;
            }
            for (const std::string& name : o.kernels_only)
                if (std::none_of(std::begin(kKernelTypes), std::end(kKernelTypes),
                                 [&](GgmlType t) { return name == ggml_type_name((uint32_t)t); })) {
                    std::fprintf(stderr, "bench_model: --kernels-only: '%s' is not a type of the kernel table (F32, F16, "
                                         "BF16, Q8_0, Q4_K, Q6_K, IQ4_XS)\n", name.c_str());
                    return 2;
                }
        }
        else if (a == "--plan") o.plan = true;
        else if (a == "--chunks") o.chunks = true;
        else if (a == "--kv-types" && i + 1 < argc) o.kv_types = split_list(argv[++i]);
        else if (a == "--model" && i + 1 < argc) o.model = argv[++i];
        else if (a == "--peer-script" && i + 1 < argc) o.peer_script = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: bench_model [--dtypes f32,f16,bf16,q8_0,q4_k_m,q6_k,...] [--threads 1,2] [--reps N] [--q4km PATH]\n"
                         "                   [--peer] [--rounds N] [--peer-script PATH] [--model-dir DIR] [--no-kernels] [--plan] [--chunks] [--arch llama|qwen3moe|gpt-oss|gemma3]\n"
                         "       bench_model --kernels-only Q8_0,IQ4_XS,... [--threads 1,2] [--reps N]\n"
                         "       bench_model --model FILE --kv-types f32,f16,bf16,q8_0,q4_0 [--kv-ctx N] [--threads 1,2] [--reps N]\n");
            return 2;
        }
    }
    if (!o.kv_types.empty()) {  // the KV cache types side by side, one file
        const std::string path = o.model.empty() ? model_file(o, "f32") : o.model;
        auto model = Model::load(path);
        if (!model) {
            std::fprintf(stderr, "bench_model: %s\n", model.error().message.c_str());
            return 1;
        }
        const ModelParams& p = (*model)->params();
        const int ctx = std::min(o.kv_ctx, p.n_ctx_train - kDecodeTokens);
        std::printf("bench_model --kv-types: %s (dim %d, %d layers, %d/%d heads, head dim %d); decode %d tokens after a %d-token "
                    "prefill, best of %d\n", path.c_str(), p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.head_dim, kDecodeTokens,
                    ctx, o.reps);
        std::printf("cpu: %s; kernel level %s\n", cpu_features().model_name.c_str(), cpu_level_name(cpu_level()));
        std::printf("%-6s %10s", "kv", "bytes/tok");
        for (int nt : o.threads) std::printf(" %7s%-2d", "decode t", nt);
        std::printf("\n");
        const int bs = 16, n_blocks = (ctx + kDecodeTokens + bs - 1) / bs;
        std::vector<int32_t> table(n_blocks);
        for (int b = 0; b < n_blocks; b++) table[b] = b;
        for (const std::string& name : o.kv_types) {
            const auto t = parse_kv_dtype(name);
            if (!t) {
                std::printf("%-6s (not a KV type: %s)\n", name.c_str(), kKvDtypeNames);
                continue;
            }
            const KvConfig kc = KvStorage::config_for(p, n_blocks, bs, *t);
            if (auto ok = check_kv_types(kc, false); !ok) {
                std::printf("%-6s n/a: %s\n", name.c_str(), ok.error().message.c_str());
                continue;
            }
            KvStorage kv(kc);
            std::printf("%-6s %10lld", name.c_str(), (long long)kv_bytes_per_token(kc));
            for (int nt : o.threads) {
                CpuForward fwd(**model, nt, kPromptTokens);
                std::printf(" %9.1f", bench_decode_at(fwd, kv, table, ctx, o.reps));
                std::fflush(stdout);
            }
            std::printf("\n");
        }
        std::printf("units: decode tokens/s; bytes/tok: K and V of one token over every layer\n");
        return 0;
    }
    std::filesystem::create_directories(o.model_dir);
    std::printf("bench_model: %s, prefill %d tokens, decode %d tokens, best of %d\n", arch_description(g_arch).c_str(),
                kPromptTokens, kDecodeTokens, o.reps);
    if (g_arch == "qwen3moe" || g_arch == "gpt-oss")
        std::printf("MB/tok and roof%%: the weights a token reads, the router and %s experts (steward model info's "
                    "\"decode reads\")\n", g_arch == "qwen3moe" ? "2 of 8" : "4 of 16");
    std::printf("cpu: %s; kernel level %s (supported %s; STEWARD_CPU_LEVEL lowers it); OpenBLAS core %s\n",
                cpu_features().model_name.c_str(), cpu_level_name(cpu_level()), cpu_level_name(cpu_level_supported()),
                blas_core_name());
    // The CPU plan as a server takes it at start (cached per CPU model), or measured now (--plan).
    std::printf("cpu plan: %s\n", describe_cpu_plan(o.plan ? measure_cpu_plan() : start_cpu_plan()).c_str());
    std::map<int, double> bw;
    for (int nt : o.threads) {
        bw[nt] = measure_bandwidth(nt);
        std::printf("read bandwidth, %d thread%s: %.1f GB/s (512 MiB buffer, best of 5); parallel_for overhead: %.2f us\n",
                    nt, nt == 1 ? "" : "s", bw[nt], measure_pool_overhead_us(nt));
    }
    if (!o.kernels_only.empty()) {
        bench_kernels(o.threads, o.reps, o.kernels_only);
        return 0;
    }
    if (o.kernels) bench_kernels(o.threads, o.reps, {});
    std::printf("\n%-7s %3s %8s | %9s %9s %6s | %9s %9s %6s | %6s %6s %7s\n", "dtype", "thr", "MB/tok", "prefill", "llama.cpp",
                "ratio", "decode", "llama.cpp", "ratio", "roof%", "peer%", "other%");
    std::vector<std::string> variants;  // per dtype run: the kernels each of its matrix types runs
    for (const std::string& d : o.dtypes) {
        const std::string path = model_file(o, d);
        if (path.empty()) {
            std::printf("%-7s (no file: steward model synth does not write %s; pass --q4km PATH, or --peer to quantize with llama-quantize)\n", d.c_str(), d.c_str());
            continue;
        }
        auto model = Model::load(path);
        if (!model) {
            std::fprintf(stderr, "bench_model: %s\n", model.error().message.c_str());
            return 1;
        }
        for (GgmlType t : (*model)->file().matrix_types())
            variants.push_back(d + " " + ggml_type_name((uint32_t)t) + ": " + matmul_variant(t));
        const ModelParams& p = (*model)->params();
        // F16 KV, as llama-bench's default cache type.
        const int bs = 16, n_blocks = (kPromptTokens + kDecodeTokens) / bs;
        KvStorage kv(KvStorage::config_for(p, n_blocks, bs, KvDtype::F16));
        std::vector<int32_t> table(n_blocks);
        for (int b = 0; b < n_blocks; b++) table[b] = b;
        const double mb = (*model)->weight_bytes_per_token() / 1e6;
        // Rounds: Steward at every thread count, then llama.cpp at every thread count (the order flips
        // each round), so that the VM's drift (the same binary moves 10-30% over minutes here) falls on
        // both sides of a round alike. Each side's figure is its best over the rounds; the ratio is the
        // median over rounds of the two sides' figures in the same round.
        struct Round { double pf = 0, dc = 0, other = 0, ppf = 0, pdc = 0; };
        std::map<int, std::vector<Round>> by_nt;
        auto run_ours = [&](int round) {
            for (int nt : o.threads) {
                CpuForward fwd(**model, nt, kPromptTokens);
                Round& r = by_nt[nt][round];
                r.pf = bench_prefill(fwd, kv, table, o.reps);
                const DecodeFigures dfig = bench_decode(fwd, kv, table, o.reps);
                r.dc = dfig.tok_s, r.other = dfig.non_matmul;
            }
        };
        auto run_theirs = [&](int round) {
            if (!o.peer) return;
            const auto peer = run_peer(o.peer_script, path, o.threads_s, o.reps, o.model_dir + "/bench_model_peer.log");
            for (int nt : o.threads) {
                auto fig = [&](bool prompt) { auto it = peer.find({nt, prompt}); return it == peer.end() ? 0.0 : it->second; };
                by_nt[nt][round].ppf = fig(true), by_nt[nt][round].pdc = fig(false);
            }
        };
        for (int nt : o.threads) by_nt[nt].resize((size_t)o.rounds);
        for (int round = 0; round < o.rounds; round++) {
            if (round % 2 == 0) run_ours(round), run_theirs(round);
            else run_theirs(round), run_ours(round);
        }
        auto median = [](std::vector<double> v) {
            if (v.empty()) return 0.0;
            std::sort(v.begin(), v.end());
            const size_t n = v.size();
            return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        };
        for (int nt : o.threads) {
            const std::vector<Round>& rs = by_nt[nt];
            double pf = 0, dc = 0, other = 0, ppf = 0, pdc = 0;
            std::vector<double> pf_ratio, dc_ratio;
            for (const Round& r : rs) {
                pf = std::max(pf, r.pf), ppf = std::max(ppf, r.ppf), pdc = std::max(pdc, r.pdc);
                if (r.dc > dc) dc = r.dc, other = r.other;
                if (r.ppf > 0) pf_ratio.push_back(r.pf / r.ppf);
                if (r.pdc > 0) dc_ratio.push_back(r.dc / r.pdc);
            }
            const double roof = bw[nt] * 1e3 / mb;  // tokens/s if decode streamed weights at bandwidth
            char r1[16] = "-", r2[16] = "-", pr[16] = "-", v1[16] = "-", v2[16] = "-";
            if (!pf_ratio.empty()) std::snprintf(v1, sizeof v1, "%.1f", ppf), std::snprintf(r1, sizeof r1, "%.2fx", median(pf_ratio));
            if (!dc_ratio.empty())
                std::snprintf(v2, sizeof v2, "%.1f", pdc), std::snprintf(r2, sizeof r2, "%.2fx", median(dc_ratio)),
                    std::snprintf(pr, sizeof pr, "%.0f%%", 100.0 * pdc / roof);
            std::printf("%-7s %3d %8.1f | %9.1f %9s %6s | %9.1f %9s %6s | %5.0f%% %6s %6.1f%%", d.c_str(), nt, mb, pf, v1, r1,
                        dc, v2, r2, 100.0 * dc / roof, pr, 100.0 * other);
            if (o.rounds > 1 && !pf_ratio.empty()) {  // every round's pair: how far the median can be trusted
                std::printf("   rounds:");
                for (size_t i = 0; i < pf_ratio.size(); i++)
                    std::printf(" %.2f/%.2f", pf_ratio[i], i < dc_ratio.size() ? dc_ratio[i] : 0.0);
            }
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    std::printf("\nunits: tokens/s, each side's best rep (over %d round%s); ratio = Steward / llama.cpp, %s; roof%% = decode tokens/s x weight bytes per token / "
                "read bandwidth at that thread count (peer%%: the same for llama.cpp); other%% = Steward's decode time outside "
                "matmul (norms, RoPE, attention, argmax, barriers). KV cache F16 on both.%s\n",
                o.rounds, o.rounds == 1 ? "" : "s",
                o.rounds == 1 ? "the two figures beside it" : "the median over the rounds of the two sides' figures in the same round (they alternate)",
                o.rounds > 1 && o.peer ? " rounds: each round's prefill/decode ratio." : "");
    if (o.chunks) {
        constexpr int kChunks[] = {8, 16, 24, 32, 48};
        std::printf("\nchunk forwards: n tokens of one sequence after %d in context, tokens/s with the CPU plan's "
                    "stream/GEMM crossover (plan) and with the level's default (gemm from %d; k-quants %d on AVX-512), "
                    "alternating, best of %d each\n%-7s %3s", kPromptTokens, kGemmMinTokens, kWideQuantGemmMinTokens, 2 * o.reps, "dtype", "thr");
        for (int n : kChunks) std::printf("  %-18s", ("n=" + std::to_string(n) + " plan/default").c_str());
        std::printf("\n");
        for (const std::string& d : o.dtypes) {
            const std::string path = model_file(o, d);
            if (path.empty()) continue;
            auto model = Model::load(path);
            if (!model) continue;
            const ModelParams& p = (*model)->params();
            const int bs = 16, n_blocks = (kPromptTokens + kDecodeTokens) / bs;
            KvStorage kv(KvStorage::config_for(p, n_blocks, bs, KvDtype::F16));
            std::vector<int32_t> table(n_blocks);
            for (int b = 0; b < n_blocks; b++) table[b] = b;
            for (int nt : o.threads) {
                CpuForward fwd(**model, nt, kPromptTokens);
                std::printf("%-7s %3d", d.c_str(), nt);
                for (int n : kChunks) {
                    const auto [plan, dflt] = bench_chunk(fwd, kv, table, n, o.reps);
                    char cell[64];
                    std::snprintf(cell, sizeof cell, "%.0f/%.0f %.2fx", plan, dflt, plan / dflt);
                    std::printf("  %-18s", cell);
                    std::fflush(stdout);
                }
                std::printf("\n");
            }
        }
    }
    std::printf("kernels (%s, level %s):\n", cpu_features().model_name.c_str(), cpu_level_name(cpu_level()));
    for (const std::string& v : variants) std::printf("  %s\n", v.c_str());
    if (!o.peer) std::printf("llama.cpp columns: run with --peer (builds it natively via %s).\n", o.peer_script.c_str());
    return 0;
}
