// Runtime bench: what the actor path costs over the Engine and the bare CPU forward on the same
// greedy batch, aggregate throughput at 1/4/16/32 concurrent streams, and TTFT of a 2048-token
// prefix-cache hit vs miss. Synthetic llama (dim 256, 4 layers, 4/4 heads, ffn 688, vocab 4096, ctx 4096).
// Run: ./build/bench_runtime [--threads N] [--streams N] [--model PATH] [--reps N] [--quick] [--overhead-only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <steward/runtime.h>

#include "cpu/forward.h"
#include "cpu/sampling.h"
#include "model/synth.h"
#include "sched/engine.h"

using namespace steward;
using clk = std::chrono::steady_clock;

namespace {

double secs(clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}
double now_secs() {
    return std::chrono::duration<double>(clk::now().time_since_epoch()).count();
}

constexpr int kBlockSize = 16;
constexpr int kMaxBatchTokens = 2048;  // 32 streams x 64-token prompts prefill in one step
constexpr int kPrefixLen = 2048;       // the cached prefix of the TTFT test
constexpr int kSuffixLen = 8;          // new tokens after it in the hit request

// Distinct prompts of ids >= 259 (past the control and byte tokens), deterministic in `seed`.
std::vector<std::vector<int32_t>> make_prompts(int n, int len, uint64_t seed, int n_vocab) {
    std::vector<std::vector<int32_t>> out(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& p : out)
        for (int i = 0; i < len; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            p.push_back(259 + (int32_t)(x % (uint64_t)(n_vocab - 259)));
        }
    return out;
}

struct Run {
    int64_t n_out = 0;  // output tokens produced (a sequence may stop early at EOS)
    double wall_s = 0;
    double step_s = 0, forward_s = 0;  // the Engine path: time in step() and, of it, in the forward
    std::vector<std::vector<int32_t>> outputs;  // per prompt, in prompt order
    double tok_s() const { return wall_s > 0 ? n_out / wall_s : 0; }
};

// ---- the bare backend: one CpuForward, the whole batch prefilled in one call, then one decode
// step per call, argmax sampling; a sequence leaves the batch at EOS or max_tokens (as the Engine).
Run run_direct(const Model& m, const std::vector<std::vector<int32_t>>& prompts, int n_out, int n_threads) {
    const int N = (int)prompts.size(), P = (int)prompts[0].size(), V = m.params().n_vocab;
    const int bps = (P + n_out + kBlockSize - 1) / kBlockSize;
    KvStorage kv(KvStorage::config_for(m.params(), N * bps, kBlockSize, KvDtype::F32));
    CpuForward fwd(m, n_threads, std::max(kMaxBatchTokens, N));
    std::vector<std::vector<int32_t>> tables(N);  // [N][bps]
    for (int s = 0; s < N; s++)
        for (int k = 0; k < bps; k++) tables[s].push_back(s * bps + k);
    Run r;
    r.outputs.assign(N, {});
    std::vector<int> live(N), n_past(N, 0);
    for (int s = 0; s < N; s++) live[s] = s;
    std::vector<int32_t> next(N);
    std::vector<SeqInput> batch;
    std::vector<float> logits;  // [live][V]
    auto t0 = clk::now();
    bool prefill = true;
    while (!live.empty()) {
        batch.assign(live.size(), SeqInput{});
        for (size_t k = 0; k < live.size(); k++) {
            const int s = live[k];
            batch[k].n_past = n_past[s];
            batch[k].tokens = prefill ? std::span<const int32_t>(prompts[s]) : std::span<const int32_t>(&next[s], 1);
            batch[k].block_table = tables[s];
        }
        fwd.forward(kv, batch, logits).value();
        std::vector<int> still;
        for (size_t k = 0; k < live.size(); k++) {
            const int s = live[k];
            n_past[s] += (int)batch[k].tokens.size();
            next[s] = argmax(std::span<const float>(logits.data() + k * V, V));
            if (m.tokenizer().is_eog(next[s])) continue;
            r.outputs[s].push_back(next[s]);
            r.n_out++;
            if ((int)r.outputs[s].size() < n_out) still.push_back(s);
        }
        live.swap(still);
        prefill = false;
    }
    r.wall_s = secs(t0, clk::now());
    return r;
}

EngineOptions engine_options(int n_blocks, int max_batch, int n_threads, bool prefix_cache) {
    EngineOptions eo;
    eo.n_blocks = n_blocks;
    eo.block_size = kBlockSize;
    eo.max_batch = max_batch;
    eo.max_batch_tokens = kMaxBatchTokens;
    eo.n_threads = n_threads;
    eo.prefix_cache = prefix_cache;
    return eo;
}

// ---- the Engine stepped in a loop on this thread (no actors, no messages).
Run run_engine(const Model& m, const std::vector<std::vector<int32_t>>& prompts, int n_out, int n_threads,
               int n_blocks) {
    const int N = (int)prompts.size();
    Engine eng(m, engine_options(n_blocks, std::max(32, N), n_threads, false));
    Run r;
    r.outputs.assign(N, {});
    auto t0 = clk::now();
    for (int s = 0; s < N; s++) {
        EngineRequest q;
        q.id = (uint64_t)s + 1;
        q.prompt = prompts[s];
        q.max_tokens = n_out;
        q.arrival_s = now_secs();
        eng.submit(std::move(q)).value();
    }
    while (eng.has_work())
        for (const EngineEvent& e : eng.step(now_secs())) {
            auto& o = r.outputs[e.id - 1];
            o.insert(o.end(), e.tokens.begin(), e.tokens.end());
            r.n_out += (int64_t)e.tokens.size();
        }
    r.wall_s = secs(t0, clk::now());
    r.step_s = eng.stats().step_s;
    r.forward_s = eng.stats().forward_s;
    return r;
}

Config runtime_config(const std::string& model, int n_threads, int n_blocks, int max_batch, bool prefix_cache) {
    Config c;
    PoolConfig p;
    p.name = "bench";
    p.model = model;
    p.threads = n_threads;
    p.kv_blocks = n_blocks;
    p.block_size = kBlockSize;
    p.max_batch = max_batch;
    p.max_batch_tokens = kMaxBatchTokens;
    p.max_queue = 1024;
    p.prefix_cache = prefix_cache;
    c.pools.push_back(p);
    BucketConfig b;  // no rules: every request lands here
    b.name = "all";
    b.pool = "bench";
    c.buckets.push_back(b);
    c.limits.request_timeout_ms = 0;  // a loaded machine must not turn slow steps into timeouts
    return c;
}

struct RuntimeRun : Run {
    std::vector<RequestMetrics> metrics;
    int n_failed = 0;
    std::string first_error;
};

// ---- the whole actor path: N concurrent Runtime::submit, wall time from the first submit until
// the last on_finish (drain).
RuntimeRun run_runtime(Runtime& rt, const std::vector<std::vector<int32_t>>& prompts, int n_out) {
    const int N = (int)prompts.size();
    RuntimeRun r;
    r.outputs.assign(N, {});
    r.metrics.assign(N, {});
    std::mutex mu;
    auto t0 = clk::now();
    for (int s = 0; s < N; s++) {
        GenerationRequest q;
        q.prompt_ids = prompts[s];
        q.max_tokens = n_out;
        RequestCallbacks cb;
        cb.on_finish = [&, s](const GenerationResult& res) {
            std::lock_guard<std::mutex> lk(mu);
            r.outputs[s] = res.tokens;
            r.metrics[s] = res.metrics;
            r.n_out += (int64_t)res.tokens.size();
            if (!res.ok()) {
                if (r.n_failed++ == 0) r.first_error = std::string(finish_reason_name(res.finish)) + ": " + res.error;
            }
        };
        rt.submit(std::move(q), std::move(cb));
    }
    rt.drain();
    r.wall_s = secs(t0, clk::now());
    return r;
}

std::unique_ptr<Runtime> start_runtime(const Config& c) {
    auto rt = Runtime::start(c);
    if (!rt) {
        std::fprintf(stderr, "bench_runtime: %s\n", rt.error().message.c_str());
        std::exit(1);
    }
    return std::move(*rt);
}

// Runs f on a new thread, as the executor actor runs the Engine on its own detached thread, so that
// every path's forward starts from a thread of its own (with the forward's pool workers beside it).
template <class R>
R on_thread(const std::function<R()>& f) {
    R r;
    std::thread t([&] { r = f(); });
    t.join();
    return r;
}

// The actor system's own threads (CAF names them "caf.*"): their CPU time and how often they went
// to sleep, and how often the executor thread ("steward-exec") was switched out while runnable. Read
// from /proc around each actor-path run: what the messages cost the forward on a small machine.
struct ThreadUse {
    double caf_cpu_s = 0;
    int64_t caf_sleeps = 0, exec_preempted = 0;
};
ThreadUse thread_use() {
    ThreadUse u;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
        std::ifstream comm(e.path() / "comm"), sched(e.path() / "schedstat"), status(e.path() / "status");
        std::string name;
        std::getline(comm, name);
        const bool caf = name.rfind("caf.", 0) == 0, exec = name == "steward-exec";
        if (!caf && !exec) continue;
        double run_ns = 0;
        sched >> run_ns;
        int64_t vol = 0, nonvol = 0;
        for (std::string line; std::getline(status, line);) {
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0) vol = std::atoll(line.c_str() + 24);
            if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) nonvol = std::atoll(line.c_str() + 27);
        }
        if (caf) u.caf_cpu_s += run_ns / 1e9, u.caf_sleeps += vol;
        if (exec) u.exec_preempted += nonvol;
    }
    return u;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double mean_of(const std::vector<RequestMetrics>& ms, double RequestMetrics::*f) {
    double sum = 0;
    int n = 0;
    for (const RequestMetrics& m : ms)
        if (m.*f >= 0) sum += m.*f, n++;
    return n ? sum / n : -1;
}

}  // namespace

int main(int argc, char** argv) {
    int n_threads = 2, n_streams = 16;
    std::string model_path;
    bool quick = false, overhead_only = false;
    int reps_arg = -1;  // --reps: rounds of the actor-path comparison (default 9, --quick 2)
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--threads" && i + 1 < argc)
            n_threads = std::atoi(argv[++i]);
        else if (a == "--streams" && i + 1 < argc)
            n_streams = std::atoi(argv[++i]);
        else if (a == "--model" && i + 1 < argc)
            model_path = argv[++i];
        else if (a == "--reps" && i + 1 < argc)
            reps_arg = std::atoi(argv[++i]);
        else if (a == "--quick")
            quick = true;
        else if (a == "--overhead-only")
            overhead_only = true;
        else {
            std::fprintf(stderr,
                         "usage: bench_runtime [--threads N] [--streams N] [--model PATH] [--reps N] [--quick] [--overhead-only]\n");
            return 2;
        }
    }
    if (n_threads < 1 || n_streams < 1 || reps_arg == 0 || reps_arg < -1) {
        std::fprintf(stderr, "bench_runtime: --threads, --streams and --reps must be >= 1\n");
        return 2;
    }
    if (model_path.empty()) {
        model_path = "models/bench-runtime.gguf";
        if (!std::filesystem::exists(model_path)) {
            SynthSpec s;
            s.n_embd = 256;
            s.n_layer = 4;
            s.n_head = 4;
            s.n_head_kv = 4;
            s.n_ff = 688;
            s.n_vocab = 4096;
            s.n_ctx = 4096;
            std::filesystem::create_directories("models");
            std::fprintf(stderr, "writing %s ...\n", model_path.c_str());
            auto w = synth_write(s, model_path);
            if (!w) {
                std::fprintf(stderr, "bench_runtime: writing %s: %s\n", model_path.c_str(), w.error().message.c_str());
                return 1;
            }
        }
    }
    model_path = std::filesystem::absolute(model_path).string();
    auto loaded = Model::load(model_path);
    if (!loaded) {
        std::fprintf(stderr, "bench_runtime: %s\n", loaded.error().message.c_str());
        return 1;
    }
    const Model& model = **loaded;
    const ModelParams& mp = model.params();

    const int n_prompt = 64, n_out = quick ? 32 : 128, reps = reps_arg > 0 ? reps_arg : quick ? 2 : 9;
    const int bps = (n_prompt + n_out + kBlockSize - 1) / kBlockSize;
    const int stream_counts[4] = {1, 4, 16, 32};
    const int max_streams = std::max(32, n_streams);
    const int n_blocks = max_streams * bps + 64;
    if (n_prompt + n_out > mp.n_ctx_train) {
        std::fprintf(stderr, "bench_runtime: %s has a context of %d tokens; the bench needs %d\n", model_path.c_str(),
                     mp.n_ctx_train, n_prompt + n_out);
        return 1;
    }

    std::printf("bench_runtime: %s (%s, dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, ctx %d), %d threads%s\n",
                model_path.c_str(), mp.arch.c_str(), mp.n_embd, mp.n_layer, mp.n_head, mp.n_head_kv, mp.n_ff,
                mp.n_vocab, mp.n_ctx_train, n_threads, quick ? ", --quick" : "");
    std::printf(
        "greedy; block %d, max_batch_tokens %d; throughput = output tokens / wall time of the batch "
        "(prefill included)\n",
        kBlockSize, kMaxBatchTokens);
    std::printf("every path runs its forwards on a thread of its own (the executor's situation), not on main\n\n");

    // ---- 1. actor-path overhead
    const auto prompts = make_prompts(n_streams, n_prompt, 1, mp.n_vocab);
    // Warm-ups (page in the weights, start the runtime's threads) are not timed.
    run_direct(model, make_prompts(2, 16, 99, mp.n_vocab), 4, n_threads);
    {
        auto rt = start_runtime(runtime_config(model_path, n_threads, n_blocks, max_streams, false));
        run_runtime(*rt, make_prompts(2, 16, 98, mp.n_vocab), 4);
        // The three paths take turns, so a burst of load elsewhere lands on all of them alike, and
        // the order flips every round (direct, engine, actors; then actors, engine, direct), so
        // that neither neighbour of the engine's run is always the same path. One round's runs lie
        // within about two seconds of each other: the paired figure below compares them.
        Run direct, engine;
        RuntimeRun actor;
        std::vector<double> tps[3], paired;
        ThreadUse use;  // summed over the actor-path runs
        double actor_wall = 0;
        for (int r = 0; r < reps; r++) {
            Run d, e;
            RuntimeRun a;
            auto actor_run = [&] {
                const ThreadUse u0 = thread_use();
                a = run_runtime(*rt, prompts, n_out);
                const ThreadUse u1 = thread_use();
                use.caf_cpu_s += u1.caf_cpu_s - u0.caf_cpu_s;
                use.caf_sleeps += u1.caf_sleeps - u0.caf_sleeps;
                use.exec_preempted += u1.exec_preempted - u0.exec_preempted;
                actor_wall += a.wall_s;
            };
            if (r % 2) actor_run();
            else d = on_thread<Run>([&] { return run_direct(model, prompts, n_out, n_threads); });
            e = on_thread<Run>([&] { return run_engine(model, prompts, n_out, n_threads, n_blocks); });
            if (r % 2) d = on_thread<Run>([&] { return run_direct(model, prompts, n_out, n_threads); });
            else actor_run();
            if (a.n_failed) {
                std::fprintf(stderr, "bench_runtime: %d runtime requests failed (%s)\n", a.n_failed,
                             a.first_error.c_str());
                return 1;
            }
            tps[0].push_back(d.tok_s()), tps[1].push_back(e.tok_s()), tps[2].push_back(a.tok_s());
            paired.push_back(e.tok_s() / a.tok_s() - 1);
            if (r == 0 || d.tok_s() > direct.tok_s()) direct = std::move(d);
            if (r == 0 || e.tok_s() > engine.tok_s()) engine = std::move(e);
            if (r == 0 || a.tok_s() > actor.tok_s()) actor = std::move(a);
        }
        const double med[3] = {median(tps[0]), median(tps[1]), median(tps[2])};

        std::printf(
            "1. actor-path overhead: %d concurrent requests, %d-token prompts, %d output tokens each, "
            "prefix cache off, %d interleaved runs\n",
            n_streams, n_prompt, n_out, reps);
        std::printf("%-34s %10s %10s %10s %10s %16s\n", "path", "out tokens", "best s", "best tok/s", "med tok/s",
                    "greedy == direct");
        auto row = [&](const char* name, const Run& r, double m) {
            std::printf("%-34s %10lld %10.3f %10.1f %10.1f %16s\n", name, (long long)r.n_out, r.wall_s, r.tok_s(), m,
                        r.outputs == direct.outputs ? "yes" : "NO");
        };
        row("CpuForward::forward (direct)", direct, med[0]);
        row("Engine::step loop (own thread)", engine, med[1]);
        row("Runtime::submit (actors)", actor, med[2]);
        // Overhead = extra wall time per output token of the actor path.
        std::printf(
            "actor-path overhead (best): %+.1f%% vs direct backend, %+.1f%% vs engine; engine vs direct %+.1f%%\n",
            100.0 * (direct.tok_s() / actor.tok_s() - 1), 100.0 * (engine.tok_s() / actor.tok_s() - 1),
            100.0 * (direct.tok_s() / engine.tok_s() - 1));
        std::printf(
            "actor-path overhead (median): %+.1f%% vs direct backend, %+.1f%% vs engine; engine vs direct %+.1f%%\n",
            100.0 * (med[0] / med[2] - 1), 100.0 * (med[1] / med[2] - 1), 100.0 * (med[0] / med[1] - 1));
        // The figure the machine's swings disturb least: each round's actor run against the engine
        // run next to it, then the median over rounds (a slow minute lands on both of a pair).
        std::printf("actor-path overhead (paired, per round vs the engine's run beside it):");
        for (double p : paired) std::printf(" %+.1f%%", 100.0 * p);
        std::printf("; median %+.1f%%\n", 100.0 * median(paired));
        // What the actor path adds beside the forward, in counts a noisy machine barely moves.
        std::printf(
            "actor system threads per actor-path run: %.1f ms CPU (%.1f%% of its wall time), %.0f sleeps and wake-ups; "
            "the executor thread switched out %.0f times while runnable\n",
            1e3 * use.caf_cpu_s / reps, 100.0 * use.caf_cpu_s / actor_wall, (double)use.caf_sleeps / reps,
            (double)use.exec_preempted / reps);
        // A share of one path's own time, so it holds on a loaded machine where the wall-time
        // comparisons above swing by +-20% between runs.
        if (engine.step_s > 0)
            std::printf("engine bookkeeping (scheduling, KV calls, sampling, events): %.2f%% of its step time is outside the forward\n",
                        100.0 * (engine.step_s - engine.forward_s) / engine.step_s);
        std::printf("\n");
        std::fflush(stdout);

        if (overhead_only) return 0;  // section 1 alone (scripts/bench_runtime_pooled.sh runs it in several processes)

        // ---- 2. aggregate throughput vs concurrency
        std::printf("2. aggregate throughput through the Runtime: %d-token prompts, %d output tokens per stream\n",
                    n_prompt, n_out);
        std::printf("%8s %10s %10s %12s %12s %10s %12s %12s\n", "streams", "out tokens", "wall s", "agg tok/s",
                    "tok/s/strm", "vs 1", "mean TTFT ms", "mean TPOT ms");
        double base = 0;
        for (int k = 0; k < 4; k++) {
            const int S = stream_counts[k];
            const RuntimeRun r = run_runtime(*rt, make_prompts(S, n_prompt, 100 + S, mp.n_vocab), n_out);
            if (r.n_failed) {
                std::fprintf(stderr, "bench_runtime: %d runtime requests failed (%s)\n", r.n_failed,
                             r.first_error.c_str());
                return 1;
            }
            if (k == 0) base = r.tok_s();
            std::printf("%8d %10lld %10.3f %12.1f %12.1f %9.2fx %12.1f %12.2f\n", S, (long long)r.n_out, r.wall_s,
                        r.tok_s(), r.tok_s() / S, r.tok_s() / base, mean_of(r.metrics, &RequestMetrics::ttft_ms),
                        mean_of(r.metrics, &RequestMetrics::tpot_ms));
            std::fflush(stdout);
        }
        std::printf("\n");
    }

    // ---- 3. TTFT of a 2048-token prefix: miss vs hit
    if (mp.n_ctx_train < kPrefixLen + kSuffixLen + 1) {
        std::printf("3. skipped: the model's context (%d) is under %d tokens\n", mp.n_ctx_train,
                    kPrefixLen + kSuffixLen + 1);
        return 0;
    }
    {
        const int n_prefixes = 3;
        const int blocks = (n_prefixes + 1) * ((kPrefixLen + kSuffixLen + 1 + kBlockSize - 1) / kBlockSize) + 64;
        auto rt = start_runtime(runtime_config(model_path, n_threads, blocks, max_streams, true));
        std::vector<double> miss, hit;
        int hit_cached_min = kPrefixLen, miss_cached_max = 0;
        bool eos_first = false;
        auto ttft = [&](const GenerationResult& r) {
            if (!r.ok()) {
                std::fprintf(stderr, "bench_runtime: TTFT request failed (%s: %s)\n", finish_reason_name(r.finish),
                             r.error.c_str());
                std::exit(1);
            }
            if (r.metrics.ttft_ms < 0) eos_first = true;  // EOS came first: finish time is the first-token time
            return r.metrics.ttft_ms >= 0 ? r.metrics.ttft_ms : r.metrics.e2e_ms;
        };
        for (int i = 0; i <= n_prefixes; i++) {  // i == 0 warms up (first 2k prefill, scratch growth)
            const auto pre = make_prompts(1, kPrefixLen, 1000 + i, mp.n_vocab)[0];
            GenerationRequest a;
            a.prompt_ids = pre;
            a.max_tokens = 1;
            const GenerationResult ra = rt->generate(a);
            GenerationRequest b;
            b.prompt_ids = pre;
            const auto tail = make_prompts(1, kSuffixLen, 2000 + i, mp.n_vocab)[0];
            b.prompt_ids.insert(b.prompt_ids.end(), tail.begin(), tail.end());
            b.max_tokens = 1;
            const GenerationResult rb = rt->generate(b);
            const double tm = ttft(ra), th = ttft(rb);
            if (i == 0) continue;
            miss.push_back(tm);
            hit.push_back(th);
            miss_cached_max = std::max(miss_cached_max, ra.metrics.cached_tokens);
            hit_cached_min = std::min(hit_cached_min, rb.metrics.cached_tokens);
        }
        const double m = median(miss), h = median(hit);
        std::printf("3. TTFT, %d-token prefix, prefix cache on, sequential requests, median of %d prefixes\n",
                    kPrefixLen, n_prefixes);
        std::printf("%-44s %10s %14s\n", "request", "TTFT ms", "cached tokens");
        std::printf("%-44s %10.1f %14d\n", "miss: 2048-token prompt, max_tokens 1", m, miss_cached_max);
        std::printf("%-44s %10.1f %14d\n", "hit: same 2048 prefix + 8 new, max_tokens 1", h, hit_cached_min);
        std::printf("miss/hit: %.1fx; miss penalty %.1f ms (per prefix miss/hit ms:", m / h, m - h);
        for (size_t i = 0; i < miss.size(); i++) std::printf(" %.1f/%.1f", miss[i], hit[i]);
        std::printf(")\n");
        if (eos_first) std::printf("note: some request sampled EOS first; its TTFT is its finish time\n");
    }
    std::printf("\nnote: the numbers are only as steady as the machine; on a loaded one they are indicative.\n");
    return 0;
}
