// GPU bench: decode tokens/s at batch 1, 8, 32 and 64 and prefill tokens/s through GpuForward, on
// a 1B-shaped and an 8B-shaped synthetic model (F16 weights made on the device, F16 KV), and the
// memory bandwidth achieved at batch 1 against the device's peak; decode with CUDA graphs and with
// plain launches side by side. Built only with CUDA.
//   (from the repository root) build/bench_gpu [--shapes 1b,8b] [--prompt 128] [--steps 32] [--prefill 512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "gpu/forward.h"

using namespace steward;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <typename T>
T must(Expected<T> r, const char* what) {
    if (!r) {
        std::fprintf(stderr, "bench_gpu: %s: %s\n", what, r.error().message.c_str());
        std::exit(1);
    }
    return std::move(r.value());
}

ModelParams shape(const std::string& name) {
    ModelParams p;
    p.arch = "llama";
    p.n_vocab = 128256;
    p.n_ctx_train = 8192;
    p.rope_freq_base = 500000.0f;
    p.rope_type = RopeType::NORM;
    if (name == "8b") {
        p.n_embd = 4096, p.n_layer = 32, p.n_head = 32, p.n_head_kv = 8, p.n_ff = 14336;
    } else {  // 1b: Llama 3.2 1B's shape
        p.n_embd = 2048, p.n_layer = 16, p.n_head = 32, p.n_head_kv = 8, p.n_ff = 8192;
    }
    p.head_dim = p.n_embd / p.n_head;
    p.n_rot = p.head_dim;
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    std::string shapes = "1b,8b";
    int prompt = 128, steps = 32, prefill = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--shapes") shapes = argv[i + 1];
        else if (a == "--prompt") prompt = std::atoi(argv[i + 1]);
        else if (a == "--steps") steps = std::atoi(argv[i + 1]);
        else if (a == "--prefill") prefill = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "bench_gpu: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    const GpuInfo g = gpu_probe();
    if (g.status != GpuProbeStatus::GPU_PROBE_OK) {
        std::fprintf(stderr, "bench_gpu: %s\n", gpu_describe(g).c_str());
        return 77;
    }
    std::printf("device: %s\n", gpu_describe(g).c_str());
    const int batches[] = {1, 8, 32, 64};
    const int bs = 16, max_batch = 64;
    for (size_t at = 0; at < shapes.size();) {
        const size_t comma = std::min(shapes.find(',', at), shapes.size());
        const std::string name = shapes.substr(at, comma - at);
        at = comma + 1;
        const ModelParams p = shape(name);
        const int max_tokens = std::max(prefill, 512);
        const double t0 = now_s();
        auto fwd = must(GpuForward::create_synthetic(p, max_tokens, 1), "create_synthetic");
        const int per_seq_blocks = (std::max(prompt, prefill) + steps + bs) / bs + 1;
        const KvConfig kc = KvStorage::config_for(p, per_seq_blocks * max_batch, bs, KvDtype::F16);
        auto kv = must(GpuKv::create(kc), "GpuKv::create");
        std::printf("\n== %s: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, F16: %.2f GB of weights (made in %.1f s), KV %.2f GB\n",
                    name.c_str(), p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.n_vocab, fwd->weight_bytes() / 1e9,
                    now_s() - t0, kv_bytes(kc) / 1e9);
        std::vector<std::vector<int32_t>> tables(max_batch);
        for (int s = 0; s < max_batch; s++) {
            tables[s].resize(per_seq_blocks);
            std::iota(tables[s].begin(), tables[s].end(), s * per_seq_blocks);
        }
        // Prefill: one sequence of `prefill` tokens, best of 3.
        {
            std::vector<int32_t> toks(prefill);
            for (int i = 0; i < prefill; i++) toks[i] = (i * 7919) % p.n_vocab;
            std::vector<SeqInput> b(1);
            b[0].tokens = toks, b[0].block_table = tables[0];
            std::vector<int32_t> out;
            must(fwd->forward_greedy(*kv, b, out), "prefill warm-up");
            double best = 1e30;
            for (int r = 0; r < 3; r++) {
                const double s0 = now_s();
                must(fwd->forward_greedy(*kv, b, out), "prefill");
                best = std::min(best, now_s() - s0);
            }
            std::printf("%s prefill %d tokens: %.1f ms, %.0f tokens/s\n", name.c_str(), prefill, best * 1e3, prefill / best);
        }
        for (int B : batches) {
            // Prompts of `prompt` tokens for B sequences, in chunks that fit max_tokens.
            std::vector<int32_t> ptoks(prompt);
            for (int i = 0; i < prompt; i++) ptoks[i] = (i * 31 + 5) % p.n_vocab;
            const int per_chunk = std::max(1, max_tokens / prompt);
            for (int s0 = 0; s0 < B; s0 += per_chunk) {
                std::vector<SeqInput> b;
                for (int s = s0; s < std::min(B, s0 + per_chunk); s++) {
                    SeqInput in;
                    in.tokens = ptoks, in.block_table = tables[s];
                    b.push_back(in);
                }
                std::vector<int32_t> out;
                must(fwd->forward_greedy(*kv, b, out), "decode prompt");
            }
            // The same decode steps with CUDA graphs (the default) and with plain launches: ms/step
            // of each, their ratio, and whether both chose the same tokens.
            double per_step[2] = {0, 0};
            std::vector<int32_t> chosen[2];
            for (int mode = 0; mode < 2; mode++) {
                fwd->set_max_graphs(mode == 0 ? GpuForward::kDefaultMaxGraphs : 0);
                std::vector<int32_t> next(B, 1), out;
                std::vector<SeqInput> b(B);
                double t_total = 0;
                for (int step = 0; step < steps + 2; step++) {
                    for (int s = 0; s < B; s++) {
                        b[s].n_past = prompt + step;
                        b[s].tokens = std::span<const int32_t>(&next[s], 1);
                        b[s].block_table = tables[s];
                    }
                    const double s0 = now_s();
                    must(fwd->forward_greedy(*kv, b, out), "decode");
                    if (step > 1) t_total += now_s() - s0;  // step 0 warms up, step 1 captures
                    for (int s = 0; s < B; s++) next[s] = out[s];
                    chosen[mode].insert(chosen[mode].end(), out.begin(), out.end());
                }
                per_step[mode] = t_total / steps;
            }
            std::printf("%s decode batch %2d: %.2f ms/step, %.0f tokens/s with CUDA graphs; %.2f ms/step without (graphs %.2fx)",
                        name.c_str(), B, per_step[0] * 1e3, B / per_step[0], per_step[1] * 1e3, per_step[1] / per_step[0]);
            if (B == 1) {
                const double kv_read = (double)(prompt + steps / 2) * p.n_layer * p.n_head_kv * p.head_dim * 2 * 2;
                const double gbs = (fwd->weight_bytes() + kv_read) / per_step[0] / 1e9;
                std::printf(", %.0f GB/s of %.0f GB/s peak (%.0f%%)", gbs, g.peak_bandwidth_gbs, 100.0 * gbs / g.peak_bandwidth_gbs);
            }
            std::printf("%s\n", chosen[0] == chosen[1] ? "" : "; TOKENS DIFFER between graphs and plain launches");
        }
        const GpuForward::GraphStats& gs = fwd->graph_stats();
        std::printf("%s decode graphs: %lld captured, %lld replays, %lld plain decode steps%s%s\n", name.c_str(),
                    (long long)gs.captured, (long long)gs.replays, (long long)gs.eager_decodes,
                    gs.disabled.empty() ? "" : "; turned off: ", gs.disabled.c_str());
    }
    return 0;
}
