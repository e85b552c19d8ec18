// Model-core bench: prefill and decode throughput of the CPU backend on a synthetic ~110M model
// (dim 768, 12 layers, 12/12 heads, ffn 2048, vocab 32000, ctx 2048) in F32 and F16, against the
// batch-1 roofline (weight bytes per token / memory bandwidth measured here).
// Run: ./build/bench_model [--threads N] [--dtypes f32,f16] [--model-dir models] [--quick]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu/forward.h"
#include "cpu/kernels.h"
#include "cpu/sampling.h"
#include "model/synth.h"

using namespace steward;
using clk = std::chrono::steady_clock;

namespace {

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Read bandwidth (GB/s): n_threads sum disjoint parts of a 1 GiB buffer; best of 5 passes.
double measure_bandwidth(int n_threads) {
    const size_t n = (size_t)1 << 28;  // floats: 1 GiB
    std::vector<float> buf(n);
#pragma omp parallel for num_threads(n_threads)
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int rep = 0; rep < 5; rep++) {
        auto t0 = clk::now();
        float total = 0.0f;
#pragma omp parallel for num_threads(n_threads) reduction(+ : total)
        for (int part = 0; part < n_threads * 16; part++) {
            const size_t b = n / (n_threads * 16) * part, e = b + n / (n_threads * 16);
#if defined(__AVX2__)
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t i = b; i < e; i += 32) {
                a0 = _mm256_add_ps(a0, _mm256_load_ps(&buf[i]));
                a1 = _mm256_add_ps(a1, _mm256_load_ps(&buf[i + 8]));
                a2 = _mm256_add_ps(a2, _mm256_load_ps(&buf[i + 16]));
                a3 = _mm256_add_ps(a3, _mm256_load_ps(&buf[i + 24]));
            }
            float t[8];
            _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for (float v : t) total += v;
#else
            for (size_t i = b; i < e; i++) total += buf[i];
#endif
        }
        sink = total;
        best = std::max(best, (double)n * 4 / secs(t0, clk::now()) / 1e9);
    }
    (void)sink;
    return best;
}

struct Figures {
    double prefill512 = 0, prefill128 = 0;
    double decode[3] = {0, 0, 0};
};

// Decode throughput at batch `b`: b sequences with 32-token prompts, then `steps` steps of b tokens.
double bench_decode(CpuForward& fwd, KvStorage& kv, int b, int steps, int blocks_per_seq) {
    const ModelParams& p = fwd.model().params();
    std::vector<std::vector<int32_t>> tables(b), toks(b);
    for (int s = 0; s < b; s++) {
        for (int k = 0; k < blocks_per_seq; k++) tables[s].push_back(s * blocks_per_seq + k);
        for (int i = 0; i < 32; i++) toks[s].push_back(300 + (s * 131 + i * 17) % (p.n_vocab - 300));
    }
    std::vector<SeqInput> batch(b);
    std::vector<float> logits;
    for (int s = 0; s < b; s++) {
        batch[s].n_past = 0;
        batch[s].tokens = toks[s];
        batch[s].block_table = tables[s];
        batch[s].logits = LogitsMode::LAST;
    }
    std::vector<float> all((size_t)b * p.n_vocab);
    for (int s = 0; s < b; s++) {  // prefill each prompt alone, keep its last logits
        fwd.forward(kv, std::span<const SeqInput>(&batch[s], 1), logits).value();
        std::copy(logits.begin(), logits.end(), all.begin() + (size_t)s * p.n_vocab);
    }
    logits.swap(all);
    std::vector<int32_t> next(b);
    int n_past = 32;
    auto step = [&] {
        for (int s = 0; s < b; s++) {
            next[s] = argmax(std::span<const float>(logits.data() + (size_t)s * p.n_vocab, p.n_vocab));
            batch[s].n_past = n_past;
            batch[s].tokens = std::span<const int32_t>(&next[s], 1);
        }
        fwd.forward(kv, batch, logits).value();
        n_past++;
    };
    step();  // warm-up
    auto t0 = clk::now();
    for (int i = 0; i < steps; i++) step();
    return (double)b * steps / secs(t0, clk::now());
}

double bench_prefill(CpuForward& fwd, KvStorage& kv, int n, int reps, int blocks_per_seq) {
    const ModelParams& p = fwd.model().params();
    std::vector<int32_t> table, toks;
    for (int k = 0; k < blocks_per_seq; k++) table.push_back(k);
    for (int i = 0; i < n; i++) toks.push_back(300 + (i * 7919) % (p.n_vocab - 300));
    SeqInput in;
    in.tokens = toks;
    in.block_table = table;
    std::vector<float> logits;
    fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();  // warm-up
    double best = 0;
    for (int r = 0; r < reps; r++) {
        auto t0 = clk::now();
        fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits).value();
        best = std::max(best, n / secs(t0, clk::now()));
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    int n_threads = cpu_count();
    std::string dtypes = "f32,f16", model_dir = "models";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--threads" && i + 1 < argc) n_threads = std::atoi(argv[++i]);
        else if (a == "--dtypes" && i + 1 < argc) dtypes = argv[++i];
        else if (a == "--model-dir" && i + 1 < argc) model_dir = argv[++i];
        else if (a == "--quick") quick = true;
        else {
            std::fprintf(stderr, "usage: bench_model [--threads N] [--dtypes f32,f16,bf16,q8_0] [--model-dir DIR] [--quick]\n");
            return 2;
        }
    }
    std::filesystem::create_directories(model_dir);
    std::printf("bench_model: synthetic 110M llama (dim 768, 12 layers, 12/12 heads, ffn 2048, vocab 32000, ctx 2048), %d threads\n",
                n_threads);
    const double bw = measure_bandwidth(n_threads);
    std::printf("measured read bandwidth: %.1f GB/s (%d threads, 1 GiB buffer, best of 5)\n\n", bw, n_threads);
    std::printf("%-5s %10s %10s %10s %10s %10s %10s %10s %9s %8s\n", "dtype", "MB/token", "roofline", "prefill128",
                "prefill512", "decode b1", "decode b8", "decode b32", "b1/roof", "b32/b1");

    size_t pos = 0;
    while (pos <= dtypes.size()) {
        size_t comma = dtypes.find(',', pos);
        if (comma == std::string::npos) comma = dtypes.size();
        const std::string d = dtypes.substr(pos, comma - pos);
        pos = comma + 1;
        if (d.empty()) continue;
        SynthSpec s;
        s.n_embd = 768; s.n_layer = 12; s.n_head = 12; s.n_head_kv = 12; s.n_ff = 2048; s.n_vocab = 32000; s.n_ctx = 2048;
        s.dtype = d == "f16" ? GgmlType::F16 : d == "bf16" ? GgmlType::BF16 : d == "q8_0" ? GgmlType::Q8_0 : GgmlType::F32;
        const std::string path = model_dir + "/synth-110m-" + d + ".gguf";
        if (!std::filesystem::exists(path)) {
            std::fprintf(stderr, "writing %s ...\n", path.c_str());
            synth_write(s, path).value();
        }
        auto model = Model::load(path);
        if (!model) {
            std::fprintf(stderr, "bench_model: %s\n", model.error().message.c_str());
            return 1;
        }
        const int bs = 16, blocks_per_seq = 2048 / bs;
        KvStorage kv(KvStorage::config_for((*model)->params(), 32 * blocks_per_seq / 4, bs, KvDtype::F32));
        CpuForward fwd(**model, n_threads, 512);
        const double mb = (*model)->weight_bytes_per_token() / 1e6;
        const double roof = bw * 1e3 / mb;
        Figures f;
        f.prefill128 = bench_prefill(fwd, kv, 128, quick ? 1 : 3, blocks_per_seq);
        f.prefill512 = bench_prefill(fwd, kv, 512, quick ? 1 : 3, blocks_per_seq);
        const int batches[3] = {1, 8, 32};
        for (int k = 0; k < 3; k++) f.decode[k] = bench_decode(fwd, kv, batches[k], quick ? 4 : 16, blocks_per_seq / 4);
        std::printf("%-5s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %8.0f%% %7.2fx\n", d.c_str(), mb, roof,
                    f.prefill128, f.prefill512, f.decode[0], f.decode[1], f.decode[2], 100.0 * f.decode[0] / roof,
                    f.decode[2] / f.decode[0]);
        std::fflush(stdout);
    }
    std::printf("\nunits: tokens/s (decode: aggregate over the batch); roofline = bandwidth / weight bytes per token.\n");
    std::printf("for scale (from the issue, llama.cpp CPU build on this machine kind, not measured here): decode b1 "
                "43 tok/s F32, 72 tok/s F16; prefill of 128 tokens ~400 tok/s.\n");
    return 0;
}
