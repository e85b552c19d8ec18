// Speculation bench: two workload buckets in one run, each on its own pool (an Engine on its own
// thread, as the runtime's executors run them), requests arriving on the wall clock so that load
// matters. high_acc: greedy, long outputs, a draft agreeing often; low_acc: temperature 1, a draft
// agreeing rarely (synth.h's late_scale fixture, targets and 1-layer drafts written to --dir). Per
// bucket TPOT mean / P99, e2e P99 and throughput for speculation off, on globally (draft model,
// fixed k for every bucket) and per-bucket adaptive (the "adaptive" speculation plugin), then the
// measured speedup beside the estimate E[A]·C_target / (C_draft + C_verify + C_overhead) from the
// measured parts, and the runtime's own speculation table (runtime/metrics).
//   bench_spec [--quick] [--n 40] [--rate-hi 2 --rate-lo 4] [--out-hi 192 --out-lo 64] [--k 4 --k-max 8]
//              [--scale-hi 0.05 --scale-lo 1.0] [--layers 8 --dim 384 --vocab 2048] [--threads 1]
//              [--seed 1] [--dir /tmp/steward_bench_spec]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "metrics/bucket_metrics.h"
#include "model/model.h"
#include "model/synth.h"
#include "plugin/plugin_loader.h"
#include "plugin/policies.h"
#include "sched/engine.h"

using namespace steward;
using clk = std::chrono::steady_clock;

namespace {

struct Options {
    bool quick = false;
    int n = 40;                              // requests per bucket
    double rate_hi = 2.0, rate_lo = 4.0;     // arrivals per second per bucket (Poisson)
    int out_hi = 192, out_lo = 64;           // output tokens (ignore EOS)
    int k = 4;                               // the global mode's chain length
    int k_max = 8;                           // the adaptive mode's limit (the policy answers up to it)
    float scale_hi = 0.05f, scale_lo = 1.0f; // late_scale of each bucket's target
    int layers = 8, dim = 384, vocab = 2048;
    int threads = 1;                         // forward threads per pool
    uint64_t seed = 1;
    std::string dir = (std::filesystem::temp_directory_path() / "steward_bench_spec").string();
};

enum class Mode { OFF, GLOBAL, ADAPTIVE };
const char* mode_name(Mode m) {
    return m == Mode::OFF ? "off" : m == Mode::GLOBAL ? "global" : "adaptive";
}

struct Bucket {
    std::string name;
    float temperature = 0;
    int max_tokens = 0;
    double rate = 0;
    float late_scale = 1;
    std::unique_ptr<Model> target, draft;
};

// One finished request: its record (for runtime/metrics) and what the formula needs.
struct Done {
    RequestRecord rec;
    double decode_s = 0;  // first to last token
};

double pct(std::vector<double> v, double p) {
    if (v.empty()) return NAN;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (double)(v.size() - 1) + 0.5))];
}
double mean(const std::vector<double>& v) {
    if (v.empty()) return NAN;
    double s = 0;
    for (double x : v) s += x;
    return s / (double)v.size();
}

// The bucket's target (late layers scaled) and its 1-layer draft, written once per shape into dir.
void ensure_models(const Options& o, Bucket& b) {
    std::filesystem::create_directories(o.dir);
    char tag[160];
    std::snprintf(tag, sizeof tag, "d%d_l%d_v%d_s%.3f_seed%llu", o.dim, o.layers, o.vocab, b.late_scale,
                  (unsigned long long)o.seed);
    const std::string t = o.dir + "/target_" + tag + ".gguf", d = o.dir + "/draft_" + tag + ".gguf";
    if (!std::filesystem::exists(t) || !std::filesystem::exists(d)) {
        SynthSpec s;
        s.n_embd = o.dim;
        s.n_layer = o.layers;
        s.n_head = o.dim / 64;
        s.n_head_kv = s.n_head;
        s.n_ff = o.dim * 8 / 3 / 32 * 32;
        s.n_vocab = o.vocab;
        s.n_ctx = 1024;
        s.seed = o.seed;
        s.late_scale = b.late_scale;
        s.late_from = 1;  // the draft keeps layer 0
        if (auto r = synth_write(s, t); !r) {
            std::fprintf(stderr, "bench_spec: writing %s: %s\n", t.c_str(), r.error().message.c_str());
            std::exit(1);
        }
        if (auto r = synth_draft(t, 1, d); !r) {
            std::fprintf(stderr, "bench_spec: writing %s: %s\n", d.c_str(), r.error().message.c_str());
            std::exit(1);
        }
    }
    auto tm = Model::load(t);
    auto dm = Model::load(d);
    if (!tm || !dm) {
        std::fprintf(stderr, "bench_spec: loading the models in %s failed; delete them and rerun\n", o.dir.c_str());
        std::exit(1);
    }
    b.target = std::move(*tm);
    b.draft = std::move(*dm);
}

// The adaptive speculation plugin for a bucket, or null with *why set. The engine asks it per step
// for each sequence's k (EngineRequest::speculation), as a pool does with [bucket.speculation].
std::shared_ptr<SpeculationPolicy> adaptive_policy(PluginLoader& loader, const std::string& bucket, std::string* why) {
    auto lib = loader.load("adaptive", PolicyKind::SPECULATION, {});
    if (!lib) {
        *why = lib.error().message;
        return nullptr;
    }
    PolicySpec spec;
    spec.plugin = "adaptive";
    spec.where = "bench_spec";
    auto p = SpeculationPolicy::create(*lib, spec, bucket, std::make_shared<PolicyCounters>(), {bucket});
    if (!p) {
        *why = p.error().message;
        return nullptr;
    }
    return std::shared_ptr<SpeculationPolicy>(std::move(*p));
}


// One bucket's pool for one mode: requests arrive at their times from t0 on; the loop submits what
// has arrived and steps, as a pool's executor does.
std::vector<Done> run_pool(const Options& o, const Bucket& b, Mode mode, clk::time_point t0,
                           const std::shared_ptr<SpeculationPolicy>& policy) {
    EngineOptions eo;
    eo.n_blocks = 2048;
    eo.block_size = 16;
    eo.max_batch = 32;
    eo.max_batch_tokens = 512;
    eo.max_queue = 1024;
    eo.n_threads = o.threads;
    eo.draft_model = mode == Mode::OFF ? nullptr : b.draft.get();
    Engine eng(*b.target, eo);

    // Arrivals and prompts: deterministic in the seed and the bucket, the same in every mode.
    std::mt19937_64 rng(o.seed * 1000003 + std::hash<std::string>{}(b.name));
    std::exponential_distribution<double> gap(b.rate);
    std::vector<double> arrival(o.n);
    std::vector<std::vector<int32_t>> prompt(o.n);
    double t = 0;
    for (int i = 0; i < o.n; i++) {
        arrival[i] = (t += gap(rng));
        const int len = 24 + (int)(rng() % 41);
        for (int j = 0; j < len; j++) prompt[i].push_back(259 + (int32_t)(rng() % (uint64_t)(o.vocab - 259)));
    }
    auto now = [&] { return std::chrono::duration<double>(clk::now() - t0).count(); };
    std::vector<std::vector<double>> tok_times(o.n);
    std::vector<Done> done;
    int next = 0;
    while (next < o.n || eng.has_work()) {
        const double tn = now();
        for (; next < o.n && arrival[next] <= tn; next++) {
            EngineRequest r;
            r.id = (uint64_t)next + 1;
            r.prompt = prompt[next];
            r.max_tokens = b.max_tokens;
            r.stop_at_eos = false;
            r.sampling.temperature = b.temperature;
            r.sampling.seed = o.seed + (uint64_t)next;
            r.arrival_s = arrival[next];
            r.bucket = b.name;
            if (mode == Mode::GLOBAL) r.spec = SpecSettings{SpecSource::DRAFT, o.k};
            if (mode == Mode::ADAPTIVE) {
                r.spec = SpecSettings{SpecSource::DRAFT, o.k_max};  // the limit; the policy picks k per step
                r.speculation = policy;
            }
            if (auto ok = eng.submit(std::move(r)); !ok) {
                std::fprintf(stderr, "bench_spec: submit: %s\n", ok.error().message.c_str());
                std::exit(1);
            }
        }
        if (!eng.has_work()) {
            std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, arrival[next] - now())));
            continue;
        }
        std::vector<EngineEvent> evs = eng.step(now());
        const double te = now();
        for (EngineEvent& ev : evs) {
            const int i = (int)ev.id - 1;
            for (size_t j = 0; j < ev.tokens.size(); j++) tok_times[i].push_back(te);
            if (!ev.finished) continue;
            Done d;
            RequestRecord& r = d.rec;
            static_cast<RunFigures&>(r) = ev;  // the run's figures, as the engine counted them
            r.bucket = b.name;
            r.pool = b.name;
            r.t_arrival_s = arrival[i];
            if (ev.first_scheduled_s >= 0) r.t_scheduled_s = ev.first_scheduled_s;
            const std::vector<double>& tt = tok_times[i];
            if (!tt.empty()) r.t_first_token_s = tt.front();
            r.t_finish_s = te;
            for (size_t j = 1; j < tt.size(); j++) r.itl_s.push_back(tt[j] - tt[j - 1]);
            r.n_output_tokens = (int64_t)tt.size();
            r.finish = ev.finish;
            d.decode_s = tt.size() >= 2 ? tt.back() - tt.front() : 0;
            done.push_back(std::move(d));
        }
    }
    return done;
}

// Per bucket of one mode: the figures the aims are judged on.
struct Figures {
    double tpot_mean_ms = NAN, tpot_p99_ms = NAN, e2e_p99_ms = NAN, tok_s = NAN;
    double accept = NAN, mean_len = NAN;
    // Sums for the formula.
    int64_t n_drafts = 0, n_accepted = 0, n_gaps = 0;
    double draft_s = 0, verify_s = 0, decode_s = 0;
};

Figures figures_of(const std::vector<Done>& done, double window_s) {
    Figures f;
    std::vector<double> tpot, e2e;
    int64_t n_out = 0, n_draft_tokens = 0;
    for (const Done& d : done) {
        const RequestRecord& r = d.rec;
        if (r.itl_s.size() >= 1) tpot.push_back(mean(r.itl_s) * 1e3);
        e2e.push_back((r.t_finish_s - r.t_arrival_s) * 1e3);
        n_out += r.n_output_tokens;
        f.n_drafts += r.n_drafts;
        f.n_accepted += r.n_accepted_tokens;
        n_draft_tokens += r.n_draft_tokens;
        f.draft_s += r.draft_s;
        f.verify_s += r.verify_s;
        f.decode_s += d.decode_s;
        f.n_gaps += (int64_t)r.itl_s.size();
    }
    f.tpot_mean_ms = mean(tpot);
    f.tpot_p99_ms = pct(tpot, 0.99);
    f.e2e_p99_ms = pct(e2e, 0.99);
    f.tok_s = window_s > 0 ? (double)n_out / window_s : NAN;
    if (n_draft_tokens > 0) f.accept = (double)f.n_accepted / (double)n_draft_tokens;
    if (f.n_drafts > 0) f.mean_len = 1.0 + (double)f.n_accepted / (double)f.n_drafts;
    return f;
}

void usage() {
    std::fprintf(stderr,
                 "usage: bench_spec [--quick] [--n N] [--rate-hi R] [--rate-lo R] [--out-hi N] [--out-lo N] [--k K] [--k-max K]\n"
                 "                  [--scale-hi S] [--scale-lo S] [--layers N] [--dim N] [--vocab N] [--threads N]\n"
                 "                  [--seed N] [--dir D]\n");
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto val = [&]() -> const char* {
            if (i + 1 >= argc) usage();
            return argv[++i];
        };
        if (a == "--quick") o.quick = true;
        else if (a == "--n") o.n = std::atoi(val());
        else if (a == "--rate-hi") o.rate_hi = std::atof(val());
        else if (a == "--rate-lo") o.rate_lo = std::atof(val());
        else if (a == "--out-hi") o.out_hi = std::atoi(val());
        else if (a == "--out-lo") o.out_lo = std::atoi(val());
        else if (a == "--k") o.k = std::atoi(val());
        else if (a == "--k-max") o.k_max = std::atoi(val());
        else if (a == "--scale-hi") o.scale_hi = (float)std::atof(val());
        else if (a == "--scale-lo") o.scale_lo = (float)std::atof(val());
        else if (a == "--layers") o.layers = std::atoi(val());
        else if (a == "--dim") o.dim = std::atoi(val());
        else if (a == "--vocab") o.vocab = std::atoi(val());
        else if (a == "--threads") o.threads = std::atoi(val());
        else if (a == "--seed") o.seed = (uint64_t)std::atoll(val());
        else if (a == "--dir") o.dir = val();
        else usage();
    }
    if (o.quick) {
        o.n = std::min(o.n, 6);
        o.out_hi = std::min(o.out_hi, 48);
        o.out_lo = std::min(o.out_lo, 24);
    }
    if (o.n < 1 || o.k < 1 || o.k > k_max_spec_tokens || o.k_max < 1 || o.k_max > k_max_spec_tokens || o.rate_hi <= 0 || o.rate_lo <= 0 || o.layers < 2 ||
        o.dim % 64 != 0 || o.vocab < 354) {
        std::fprintf(stderr, "bench_spec: need --n >= 1, --k and --k-max in [1, %d], rates > 0, --layers >= 2, --dim a multiple of 64, --vocab >= 354\n",
                     k_max_spec_tokens);
        return 2;
    }

    std::vector<Bucket> buckets(2);
    buckets[0].name = "high_acc";
    buckets[0].temperature = 0.0f;
    buckets[0].max_tokens = o.out_hi;
    buckets[0].rate = o.rate_hi;
    buckets[0].late_scale = o.scale_hi;
    buckets[1].name = "low_acc";
    buckets[1].temperature = 1.0f;
    buckets[1].max_tokens = o.out_lo;
    buckets[1].rate = o.rate_lo;
    buckets[1].late_scale = o.scale_lo;
    for (Bucket& b : buckets) ensure_models(o, b);
    std::printf("bench_spec: %d requests per bucket; target dim %d, %d layers, vocab %d; drafts: its first layer; "
                "k = %d (global); %d forward thread(s) per pool\n",
                o.n, o.dim, o.layers, o.vocab, o.k, o.threads);
    std::printf("  high_acc: greedy, %d output tokens, %.2f req/s, late_scale %.3f\n", o.out_hi, o.rate_hi, o.scale_hi);
    std::printf("  low_acc:  temperature 1, %d output tokens, %.2f req/s, late_scale %.3f\n\n", o.out_lo, o.rate_lo,
                o.scale_lo);

    PluginLoader loader;
    std::map<std::string, std::shared_ptr<SpeculationPolicy>> policies;
    std::string why_not_adaptive;
    for (const Bucket& b : buckets) {
        policies[b.name] = adaptive_policy(loader, b.name, &why_not_adaptive);
        if (!policies[b.name]) break;
    }

    std::map<Mode, std::map<std::string, Figures>> figs;
    std::map<Mode, MetricsRegistry> regs;
    double off_all_tpot_s = NAN;
    for (Mode mode : {Mode::OFF, Mode::GLOBAL, Mode::ADAPTIVE}) {
        if (mode == Mode::ADAPTIVE && !why_not_adaptive.empty()) {
            std::printf("adaptive: skipped (%s)\n\n", why_not_adaptive.c_str());
            continue;
        }
        // Both pools at once from one start, each on its own thread (as the runtime's executors).
        const clk::time_point t0 = clk::now();
        std::vector<std::vector<Done>> done(buckets.size());
        std::vector<std::thread> th;
        for (size_t i = 0; i < buckets.size(); i++)
            th.emplace_back([&, i] { done[i] = run_pool(o, buckets[i], mode, t0, policies[buckets[i].name]); });
        for (std::thread& x : th) x.join();
        const double window = std::chrono::duration<double>(clk::now() - t0).count();
        MetricsRegistry& reg = regs[mode];
        reg.set_window(0, window);
        for (size_t i = 0; i < buckets.size(); i++) {
            figs[mode][buckets[i].name] = figures_of(done[i], window);
            for (const Done& d : done[i]) reg.record(d.rec);
            if (mode != Mode::OFF) reg.set_spec_baseline(buckets[i].name, figs[Mode::OFF][buckets[i].name].tpot_mean_ms / 1e3);
        }
        if (mode == Mode::OFF) off_all_tpot_s = reg.all().tpot_s.mean();
        else reg.set_spec_baseline("all", off_all_tpot_s);
    }

    std::printf("%-9s %-9s %10s %10s %10s %9s %8s %8s\n", "bucket", "mode", "tpot_ms", "tpot_p99", "e2e_p99_ms",
                "tok/s", "accept", "mean_A");
    for (const Bucket& b : buckets)
        for (auto& [mode, by] : figs) {
            const Figures& f = by[b.name];
            std::printf("%-9s %-9s %10.2f %10.2f %10.1f %9.1f %8.3f %8.2f\n", b.name.c_str(), mode_name(mode),
                        f.tpot_mean_ms, f.tpot_p99_ms, f.e2e_p99_ms, f.tok_s, f.accept, f.mean_len);
        }

    // The seed's estimate from the measured parts, per decode step: C_target the off mode's time per
    // decode step (its TPOT: one token a step), C_draft / C_verify this mode's draft and verification
    // forward time per decode step, C_overhead the rest of its decode time per step (sampling,
    // scheduling, other sequences' drafts, and the forwards of steps that did not draft). E[A] is
    // the mean accepted length (1 + accepted / drafts); the estimate uses the tokens per decode step
    // 1 + accepted / steps, which equals it when every step drafted and is lower where the policy
    // drafted on only some steps (steps = output gaps - accepted tokens: each produced one token
    // plus its accepted drafts).
    std::printf("\n%-9s %-9s %7s %7s %10s %9s %10s %10s %11s %9s %10s\n", "bucket", "mode", "E[A]", "tok/step",
                "C_target", "C_draft", "C_verify", "C_overhead", "estimate_x", "measured", "p99_vs_off");
    for (const Bucket& b : buckets)
        for (Mode mode : {Mode::GLOBAL, Mode::ADAPTIVE}) {
            if (!figs.count(mode)) continue;
            const Figures& f = figs[mode][b.name];
            const Figures& off = figs[Mode::OFF][b.name];
            const double n_steps = (double)std::max<int64_t>(1, f.n_gaps - f.n_accepted);
            const double per_step = 1.0 + (double)f.n_accepted / n_steps;
            const double c_target = off.tpot_mean_ms;
            const double c_draft = f.draft_s / n_steps * 1e3;
            const double c_verify = f.verify_s / n_steps * 1e3;
            const double c_overhead = std::max(0.0, f.decode_s / n_steps * 1e3 - c_draft - c_verify);
            const double estimate = per_step * c_target / (c_draft + c_verify + c_overhead);
            std::printf("%-9s %-9s %7.2f %7.2f %10.3f %9.3f %10.3f %10.3f %10.2fx %8.2fx %+9.1f%%\n", b.name.c_str(),
                        mode_name(mode), f.mean_len, per_step, c_target, c_draft, c_verify, c_overhead, estimate,
                        off.tpot_mean_ms / f.tpot_mean_ms, (f.tpot_p99_ms / off.tpot_p99_ms - 1) * 100);
        }
    std::printf("(ms per decode step; E[A] nan: no drafts; measured = TPOT off / TPOT with; p99_vs_off: P99 TPOT "
                "against off)\n");

    // The aims of the speculation issue, where the adaptive mode ran.
    if (figs.count(Mode::ADAPTIVE)) {
        const double off_hi = figs[Mode::OFF]["high_acc"].tpot_mean_ms;
        const double gain_global = off_hi / figs[Mode::GLOBAL]["high_acc"].tpot_mean_ms;
        const double gain_adaptive = off_hi / figs[Mode::ADAPTIVE]["high_acc"].tpot_mean_ms;
        const double p99_lo = figs[Mode::ADAPTIVE]["low_acc"].tpot_p99_ms / figs[Mode::OFF]["low_acc"].tpot_p99_ms;
        std::printf("\naims: high_acc TPOT gain adaptive %.2fx (global %.2fx; aim >= 1.8x); low_acc P99 TPOT "
                    "adaptive/off %.3f (aim <= 1.05)\n",
                    gain_adaptive, gain_global, p99_lo);
    }

    for (auto& [mode, reg] : regs) {
        if (mode == Mode::OFF) continue;
        std::printf("\n-- the runtime's report, %s (gain against the off run's TPOT) --\n%s", mode_name(mode),
                    reg.to_table().c_str());
    }
    return 0;
}
