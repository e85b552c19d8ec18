// Scheduler bench on a virtual clock: the standard workload (or a workload file) through the real
// Engine (runtime/sched) with a forward whose cost is a model, not a measurement: each step takes
// --step-ms + --token-ms x its tokens of virtual time. The model is a 1-layer synthetic llama with
// the large model's vocabulary, so the forward itself is cheap and the figures do not depend on
// the machine's load: what differs between policies and budgets is the scheduling alone. Prints
// per bucket TTFT p50/p99, its breakdown (queue before the first chunk, then first chunk to first
// token), TPOT mean, for FCFS and SRPT prefill order at several token budgets.
//   bench_sched [--requests 40 --seed 1 --rate 2 | --workload F] [--step-ms 10 --token-ms 1.0] [--budgets 128,256,512]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/synth.h"
#include "sched/engine.h"
#include "workload/workload.h"

using namespace steward;

namespace {

struct Fig {
    std::string bucket;
    double arrival = 0, first_sched = -1, first_tok = -1, last_tok = -1;
    int n_out = 0;
};

double pct(std::vector<double> v, double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (double)(v.size() - 1) + 0.5))];
}
double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? -1 : s / (double)v.size();
}

// One replay: arrivals in virtual time, agent turns after their previous turn + pause (the prompt:
// the conversation's ids so far + the new content's), every request ignore_eos, greedy.
std::vector<Fig> replay(const Model& m, const Workload& wl, int budget, bool srpt, double step_ms, double token_ms) {
    EngineOptions eo;
    eo.n_blocks = 1024;
    eo.block_size = 16;
    eo.max_batch = 32;
    eo.max_batch_tokens = budget;
    eo.max_queue = 512;
    eo.n_threads = 1;
    eo.prefill_srpt = srpt;
    Engine eng(m, eo);
    const size_t n = wl.requests.size();
    std::vector<Fig> figs(n);
    std::vector<std::vector<int32_t>> prompt(n);
    std::map<std::pair<std::string, std::string>, std::vector<int32_t>> conv;  // session -> ids so far
    std::map<std::pair<std::string, std::string>, double> ready;                // session -> next turn's earliest time
    std::map<std::pair<std::string, std::string>, bool> busy;
    std::vector<bool> sent(n, false), done(n, false);
    std::vector<std::vector<int32_t>> out(n);
    double t = 0;
    size_t n_done = 0;
    while (n_done < n) {
        // Submit what is due (agent turns in file order within their session).
        double next_arrival = 1e300;
        for (size_t i = 0; i < n; i++) {
            if (sent[i]) continue;
            const WorkloadRequest& w = wl.requests[i];
            const auto key = std::make_pair(w.tenant, w.session);
            double at = w.arrival_ms / 1e3;
            if (!w.session.empty()) {
                if (busy[key]) continue;
                bool earlier_pending = false;
                for (size_t j = 0; j < i; j++)
                    if (!sent[j] && wl.requests[j].session == w.session && wl.requests[j].tenant == w.tenant) earlier_pending = true;
                if (earlier_pending) continue;
                at = std::max(at, ready[key]);
            }
            if (at > t) {
                next_arrival = std::min(next_arrival, at);
                continue;
            }
            std::vector<int32_t> ids = m.tokenizer().encode(wl.prompt_text(w), !w.session.empty() && conv.count(key) ? false : true);
            if (!w.session.empty()) {
                auto& c = conv[key];
                c.insert(c.end(), ids.begin(), ids.end());
                ids = c;
                busy[key] = true;
            }
            EngineRequest q;
            q.id = i + 1;
            q.prompt = ids;
            q.max_tokens = w.max_tokens;
            q.arrival_s = t;
            q.stop_at_eos = false;
            q.session = w.session.empty() ? "" : w.tenant + "/" + w.session;
            eng.submit(std::move(q)).value();
            sent[i] = true;
            figs[i].bucket = w.bucket;
            figs[i].arrival = t;
        }
        if (!eng.has_work()) {
            t = next_arrival;
            continue;
        }
        const EngineStats before = eng.stats();
        std::vector<EngineEvent> evs = eng.step(t);
        const EngineStats after = eng.stats();
        const int64_t n_tok = (after.n_prompt_tokens_computed - before.n_prompt_tokens_computed) +
                              (after.n_decode_tokens - before.n_decode_tokens);
        if (after.n_steps > before.n_steps) t += (step_ms + token_ms * (double)n_tok) / 1e3;
        for (const EngineEvent& e : evs) {
            const size_t i = e.id - 1;
            Fig& f = figs[i];
            if (f.first_sched < 0 && e.first_scheduled_s >= 0) f.first_sched = e.first_scheduled_s;
            if (!e.tokens.empty()) {
                if (f.first_tok < 0) f.first_tok = t;
                f.last_tok = t;
                f.n_out += (int)e.tokens.size();
                out[i].insert(out[i].end(), e.tokens.begin(), e.tokens.end());
            }
            if (e.finished) {
                done[i] = true;
                n_done++;
                const WorkloadRequest& w = wl.requests[i];
                if (!w.session.empty()) {
                    const auto key = std::make_pair(w.tenant, w.session);
                    auto& c = conv[key];
                    c.insert(c.end(), out[i].begin(), out[i].end());
                    busy[key] = false;
                    ready[key] = t + w.tool_pause_ms / 1e3;
                }
            }
        }
    }
    return figs;
}

void print(const char* policy, int budget, const std::vector<Fig>& figs) {
    std::vector<std::string> order;
    for (const Fig& f : figs)
        if (std::find(order.begin(), order.end(), f.bucket) == order.end()) order.push_back(f.bucket);
    order.push_back("all");
    for (const std::string& b : order) {
        std::vector<double> ttft, queue, prefill, tpot;
        for (const Fig& f : figs) {
            if (b != "all" && f.bucket != b) continue;
            ttft.push_back((f.first_tok - f.arrival) * 1e3);
            queue.push_back((f.first_sched - f.arrival) * 1e3);
            prefill.push_back((f.first_tok - f.first_sched) * 1e3);
            if (f.n_out > 1) tpot.push_back((f.last_tok - f.first_tok) * 1e3 / (f.n_out - 1));
        }
        std::printf("%-5s %6d %-12s %4zu %9.0f %9.0f %9.0f %11.0f %11.0f %9.1f\n", policy, budget, b.c_str(), ttft.size(),
                    pct(ttft, 0.5), pct(ttft, 0.99), mean(ttft), mean(queue), mean(prefill), mean(tpot));
    }
}

}  // namespace

int main(int argc, char** argv) {
    WorkloadGenParams gen;
    gen.n_requests = 40;
    gen.seed = 1;
    std::string workload;
    double step_ms = 10, token_ms = 1.0;
    std::vector<int> budgets = {128, 256, 512};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--requests") gen.n_requests = std::stoi(v);
        else if (k == "--seed") gen.seed = std::stoull(v);
        else if (k == "--rate") gen.rate = std::stod(v);
        else if (k == "--workload") workload = v;
        else if (k == "--step-ms") step_ms = std::stod(v);
        else if (k == "--token-ms") token_ms = std::stod(v);
        else if (k == "--budgets") {
            budgets.clear();
            std::stringstream ss(v);
            for (std::string b; std::getline(ss, b, ',');) budgets.push_back(std::stoi(b));
        } else {
            std::fprintf(stderr, "bench_sched: unknown option %s (see the file's header)\n", k.c_str());
            return 1;
        }
    }
    Workload wl;
    if (!workload.empty()) {
        auto w = read_workload_file(workload);
        if (!w) return std::fprintf(stderr, "bench_sched: %s\n", w.error().message.c_str()), 1;
        wl = std::move(*w);
    } else {
        wl = generate_workload(gen);
    }
    const std::string path = "models/bench-sched.gguf";
    if (!std::filesystem::exists(path)) {
        SynthSpec s;  // the large model's vocabulary and context, a cheap body
        s.n_embd = 32;
        s.n_layer = 1;
        s.n_head = 1;
        s.n_head_kv = 1;
        s.n_ff = 32;
        s.n_vocab = 8192;
        s.n_ctx = 4096;
        std::filesystem::create_directories("models");
        if (auto w = synth_write(s, path); !w) return std::fprintf(stderr, "bench_sched: %s\n", w.error().message.c_str()), 1;
    }
    auto m = Model::load(path);
    if (!m) return std::fprintf(stderr, "bench_sched: %s\n", m.error().message.c_str()), 1;
    std::printf("bench_sched: %zu requests, virtual step cost %.1f ms + %.2f ms/token\n", wl.requests.size(), step_ms, token_ms);
    std::printf("%-5s %6s %-12s %4s %9s %9s %9s %11s %11s %9s\n", "order", "budget", "bucket", "n", "ttft_p50", "ttft_p99",
                "ttft_avg", "queue_avg", "prefill_avg", "tpot_avg");
    for (int b : budgets)
        for (bool srpt : {false, true}) print(srpt ? "srpt" : "fcfs", b, replay(**m, wl, b, srpt, step_ms, token_ms));
    return 0;
}
