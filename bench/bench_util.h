// What the speculation benches share: the CPU's name as lscpu prints it, a few statistics over
// per-request figures, and the loop that runs requests one at a time through an engine and times
// every token (bench_suffix, bench_adaptive).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "sched/engine.h"

namespace steward::bench {

// The CPU's model name, as lscpu prints it (from /proc/cpuinfo).
inline std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

inline double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? NAN : s / (double)v.size();
}
inline double p99(std::vector<double> v) {
    if (v.empty()) return NAN;
    std::sort(v.begin(), v.end());
    return v[(size_t)std::min<double>((double)v.size() - 1, std::ceil(0.99 * (double)v.size()) - 1)];
}
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Requests run one at a time: their outputs, TPOT (decode time / (tokens - 1), ms) and the
// speculation figures of their finish events.
struct SequentialRun {
    std::vector<std::vector<int32_t>> outputs;
    std::vector<double> tpot_ms;
    int64_t n_drafts = 0, n_draft_tokens = 0, n_accepted = 0, n_steps = 0, n_gaps = 0;
    double draft_s = 0, verify_s = 0;
};

// The engine the speculation benches time requests on, one at a time: batches of 4 and 512 tokens,
// 1024 blocks of 16, with `draft` as its draft model (nullptr: none).
inline EngineOptions sequential_options(int n_threads, const Model* draft) {
    EngineOptions eo;
    eo.n_blocks = 1024;
    eo.block_size = 16;
    eo.max_batch = 4;
    eo.max_batch_tokens = 512;
    eo.n_threads = n_threads;
    eo.draft_model = draft;
    return eo;
}

// A greedy request for run_sequential: id i + 1, max_tokens with no EOS stop, in `bucket`; no
// speculation (the caller sets it).
inline EngineRequest plain_request(size_t i, const std::vector<int32_t>& prompt, int max_tokens, const char* bucket) {
    EngineRequest q;
    q.id = i + 1;
    q.prompt = prompt;
    q.max_tokens = max_tokens;
    q.stop_at_eos = false;
    q.bucket = bucket;
    return q;
}

// Submits make(i) for i in [0, n), each after the previous one finished, stepping `eng` on the wall
// clock. A refused submit calls fail with its message (which must not return).
inline SequentialRun run_sequential(Engine& eng, size_t n, const std::function<EngineRequest(size_t)>& make,
                                    const std::function<void(const std::string&)>& fail) {
    using clk = std::chrono::steady_clock;
    SequentialRun r;
    for (size_t i = 0; i < n; i++) {
        if (auto ok = eng.submit(make(i)); !ok) fail("submit: " + ok.error().message);
        std::vector<int32_t> out;
        std::vector<double> times;
        const auto t0 = clk::now();
        while (eng.has_work()) {
            for (EngineEvent& ev : eng.step(std::chrono::duration<double>(clk::now() - t0).count())) {
                const double t = std::chrono::duration<double>(clk::now() - t0).count();
                for (int32_t tok : ev.tokens) out.push_back(tok), times.push_back(t);
                if (ev.finished) {
                    r.n_drafts += ev.n_drafts;
                    r.n_draft_tokens += ev.n_draft_tokens;
                    r.n_accepted += ev.n_accepted_tokens;
                    r.draft_s += ev.draft_s;
                    r.verify_s += ev.verify_s;
                }
            }
            r.n_steps++;
        }
        if (times.size() >= 2) {
            r.tpot_ms.push_back((times.back() - times.front()) * 1e3 / (double)(times.size() - 1));
            r.n_gaps += (int64_t)times.size() - 1;
        }
        r.outputs.push_back(std::move(out));
    }
    return r;
}

}  // namespace steward::bench
