// The engine's simulated backend: the real scheduler and KV bookkeeping over a model shape with
// no weights. Its tokens are a generator's, so they must not depend on batching or speculation
// (speculation is lossless); a draft's acceptance must follow the configured rate (a binomial
// test per position); and the KV must drain.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>
#include <vector>

#include "model/model.h"
#include "sched/engine.h"
#include "sim/cost_model.h"
#include "sim/sim_model.h"
#include "util/thread_cpu.h"

using namespace steward;

namespace {

SimPoolConfig sim_config(double acceptance, double concentration) {
    SimPoolConfig p;
    p.device.name = "dev";
    p.device.tflops_16 = 1e6, p.device.hbm_gbps = 1e7, p.device.hbm_gib = 16;  // fast: the steps' sleeps are microseconds
    p.model.name = "toy";
    p.model.layers = 4, p.model.dim = 256, p.model.heads = 8, p.model.kv_heads = 2, p.model.head_dim = 32;
    p.model.ffn = 512, p.model.vocab = 1000, p.model.ctx = 4096;
    p.draft = p.model;
    p.draft->layers = 1;
    p.acceptance = acceptance;
    p.concentration = concentration;
    return p;
}

std::shared_ptr<Model> load(const SimModelConfig& m) {
    auto model = sim_model(m);
    REQUIRE(model);
    return std::shared_ptr<Model>(std::move(*model));
}

struct Run {
    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, EngineEvent> finished;
};

// Submits requests ids first..first+n-1 (prompts of 20-60 tokens, max_tokens 40-120) and steps to the end.
Run run(Engine& e, uint64_t first, int n, bool speculate) {
    Run r;
    for (int i = 0; i < n; i++) {
        EngineRequest q;
        q.id = first + (uint64_t)i;
        for (int t = 0; t < 20 + (int)(q.id * 7 % 41); t++) q.prompt.push_back(300 + (int32_t)((q.id * 31 + (uint64_t)t * 17) % 600));
        q.max_tokens = 40 + (int)(q.id * 13 % 81);
        q.bucket = "b";
        if (speculate) {
            q.spec.source = SpecSource::DRAFT;
            q.spec.k = 4;
        }
        auto ok = e.submit(std::move(q));
        REQUIRE(ok);
    }
    for (int guard = 0; e.has_work() && guard < 100000; guard++)
        for (EngineEvent& ev : e.step(0.0)) {
            auto& t = r.tokens[ev.id];
            t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
            if (ev.finished) r.finished[ev.id] = ev;
        }
    return r;
}

// A request of n_prompt copies of one token.
EngineRequest request(uint64_t id, int n_prompt, int max_tokens) {
    EngineRequest q;
    q.id = id;
    q.prompt.assign((size_t)n_prompt, 400);
    q.max_tokens = max_tokens;
    return q;
}

EngineOptions options(const SimPoolConfig& p, int n_blocks, int max_batch) {
    EngineOptions o;
    o.n_blocks = n_blocks;
    o.block_size = 16;
    o.max_batch = max_batch;
    o.max_batch_tokens = 256;
    o.sim = std::make_shared<const SimPoolConfig>(p);
    return o;
}

}  // namespace

TEST_CASE("a simulated engine's tokens are the generator's: the same alone, batched, preempted and speculated", "[sim][engine]") {
    const SimPoolConfig p = sim_config(0.7, 8);
    auto model = load(p.model);
    Engine batched(*model, options(p, 512, 32));
    const Run all = run(batched, 1, 24, false);
    Engine tight(*model, options(p, 24, 32));  // 384 slots for ~24 x 150 tokens: preemption and recompute
    const Run squeezed = run(tight, 1, 24, false);
    Engine spec(*model, options(p, 512, 32));
    const Run speculated = run(spec, 1, 24, true);
    REQUIRE(all.finished.size() == 24);
    CHECK(tight.stats().n_preemptions > 0);
    CHECK(spec.stats().n_drafts > 0);
    for (uint64_t id = 1; id <= 24; id++) {
        Engine alone(*model, options(p, 512, 32));
        const Run one = run(alone, id, 1, false);
        const std::vector<int32_t>& t = all.tokens.at(id);
        CHECK(t == one.tokens.at(id));
        CHECK(t == squeezed.tokens.at(id));
        CHECK(t == speculated.tokens.at(id));
        // max_tokens of text tokens (never a control or byte token, never the end).
        CHECK((int)t.size() == 40 + (int)(id * 13 % 81));
        CHECK(all.finished.at(id).finish == FinishReason::LENGTH);
        for (int32_t tok : t) CHECK((tok >= 259 && tok < 1000));
    }
    // Everything finished: no block is held (cached blocks stay findable, unreferenced).
    CHECK(batched.kv_manager().stats().n_blocks_in_use == 0);
    CHECK(tight.kv_manager().stats().n_blocks_in_use == 0);
    CHECK(spec.kv_manager().stats().n_blocks_in_use == 0);
}

TEST_CASE("a simulated draft is accepted per position at the configured rate (binomial test)", "[sim][engine]") {
    for (double alpha : {0.2, 0.6, 0.9}) {
        const SimPoolConfig p = sim_config(alpha, 1e6);  // every request's rate is alpha
        auto model = load(p.model);
        Engine e(*model, options(p, 2048, 64));
        const Run r = run(e, 1, 64, true);
        std::array<int64_t, k_max_spec_tokens> proposed{}, accepted{};
        int64_t n_verifications = 0, n_rollbacks = 0;
        for (const auto& [id, ev] : r.finished) {
            for (int i = 0; i < 4; i++) proposed[i] += ev.n_draft_tokens_at[i], accepted[i] += ev.n_accepted_at[i];
            n_verifications += ev.n_drafts;
            n_rollbacks += ev.n_rollbacks;
        }
        // Position 0: accepted / proposed; later positions: accepted there / accepted at the one before
        // (reached only through it). Each is a binomial proportion with p = alpha.
        for (int i = 0; i < 3; i++) {
            const double n = (double)(i == 0 ? proposed[0] : accepted[i - 1]);
            if (n < 50) continue;
            const double est = accepted[i] / n, sd = std::sqrt(alpha * (1 - alpha) / n);
            INFO("alpha " << alpha << " position " << i << ": " << accepted[i] << " of " << n);
            CHECK(std::abs(est - alpha) < 4.5 * sd);
        }
        CHECK(n_verifications > 0);
        CHECK(n_rollbacks > 0);  // some verification rejected a token (at 0.9 too: 4 in a row is 0.66)
    }
}

TEST_CASE("per-request acceptance is drawn from the bucket's Beta: the spread between requests grows as concentration falls",
          "[sim][engine]") {
    auto spread = [](double concentration) {
        const SimPoolConfig p = sim_config(0.5, concentration);
        auto model = load(p.model);
        Engine e(*model, options(p, 4096, 128));
        const Run r = run(e, 1, 128, true);
        std::vector<double> rates;
        for (const auto& [id, ev] : r.finished)
            // Every request (one with a high rate verifies fewer times: a floor on the count would bias the mean).
            if (ev.n_draft_tokens_at[0] >= 4) rates.push_back((double)ev.n_accepted_at[0] / ev.n_draft_tokens_at[0]);
        double mean = 0, var = 0;
        for (double x : rates) mean += x / (double)rates.size();
        for (double x : rates) var += (x - mean) * (x - mean) / (double)(rates.size() - 1);
        return std::make_pair(mean, var);
    };
    const auto [m_tight, v_tight] = spread(1e6);
    const auto [m_wide, v_wide] = spread(2);
    CHECK(m_tight == Approx(0.5).margin(0.05));
    CHECK(m_wide == Approx(0.5).margin(0.1));
    // Beta(1, 1) (concentration 2) has variance 1/12; the tight one only the binomial noise.
    CHECK(v_wide > 3 * v_tight);
    CHECK(v_wide > 0.04);
}

TEST_CASE("a simulated step's device time is the cost model's for its batch", "[sim][engine]") {
    SimPoolConfig p = sim_config(0.7, 8);
    p.draft.reset();
    auto model = load(p.model);
    Engine e(*model, options(p, 512, 32));
    REQUIRE(e.submit(request(1, 100, 3)));
    e.step(0.0);  // the prompt: 100 tokens, logits for the last
    const double prefill = sim_step_cost(p.device, p.model, 1, std::vector<SimSeqWork>{{100, 0, 1}}).total_s;
    CHECK(e.stats().sim_device_s == Approx(prefill));
    e.step(0.0);  // one decode after 100 computed tokens
    const double decode = sim_step_cost(p.device, p.model, 1, std::vector<SimSeqWork>{{1, 100, 1}}).total_s;
    CHECK(e.stats().sim_device_s == Approx(prefill + decode));
    // The forward time the speculation policies' figures come from is the simulated one.
    CHECK(e.stats().forward_s == Approx(prefill + decode));
}

TEST_CASE("a stream's mean step weighs each step's device time by the sequences that got a token in it", "[sim][engine]") {
    SimPoolConfig p = sim_config(0.7, 8);
    p.draft.reset();
    auto model = load(p.model);
    EngineOptions o = options(p, 512, 32);
    o.max_batch_tokens = 120;  // request 2's 200-token prompt goes in two chunks
    Engine e(*model, o);
    for (uint64_t id : {1, 2}) REQUIRE(e.submit(request(id, id == 1 ? 20 : 200, 4)));
    e.step(0.0);  // request 1's prompt (a token for it) and 100 of request 2's (none)
    e.step(0.0);  // request 1 decodes, request 2's last 100 prompt tokens (a token for each)
    const EngineStats s = e.stats();
    REQUIRE(s.n_steps == 2);
    const double t1 = sim_step_cost(p.device, p.model, 1, std::vector<SimSeqWork>{{20, 0, 1}, {100, 0, 0}}).total_s;
    const double t2 = sim_step_cost(p.device, p.model, 1, std::vector<SimSeqWork>{{1, 20, 1}, {100, 100, 1}}).total_s;
    REQUIRE(s.sim_device_s == Approx(t1 + t2));
    // Step 1 counts once (one sequence got a token), step 2 twice; not (t1 + t2) / 2.
    CHECK(s.sim_stream_step_s == Approx((t1 + 2 * t2) / 3));
    CHECK(std::abs(s.sim_stream_step_s - (t1 + t2) / 2) > 1e-3 * s.sim_stream_step_s);
    // Per stream, the steps after its first token: request 1 has step 2 only, request 2 none yet.
    CHECK(e.sim_stream_step_p50_s() == Approx(t2));
    e.step(0.0);  // both decode
    const double t3 = sim_step_cost(p.device, p.model, 1, std::vector<SimSeqWork>{{1, 21, 1}, {1, 200, 1}}).total_s;
    REQUIRE(e.stats().sim_device_s == Approx(t1 + t2 + t3));
    // Request 1: (t2 + t3) / 2; request 2: t3; the median of two is the upper one.
    CHECK(e.sim_stream_step_p50_s() == Approx(std::max((t2 + t3) / 2, t3)));
}

namespace {
struct FaultHookReset {
    ~FaultHookReset() { set_forward_fault_hook(nullptr); }
};
}  // namespace

TEST_CASE("an overrun step is told apart by whether the host thread worked or waited past the device time", "[sim][engine]") {
    SimPoolConfig p = sim_config(0.7, 8);
    p.draft.reset();
    p.device.tflops_16 = 1, p.device.hbm_gbps = 2;  // slow: a decode step takes milliseconds
    auto model = load(p.model);
    Engine e(*model, options(p, 512, 32));
    REQUIRE(e.submit(request(1, 20, 10)));
    e.step(0.0);  // the prompt
    const double step_s = sim_step_cost(p.device, p.model, 1, std::vector<SimSeqWork>{{1, 20, 1}}).total_s;
    REQUIRE(step_s > 1e-3);
    REQUIRE(step_s < 0.05);
    FaultHookReset reset;
    const double late_s = 2 * step_s + 0.01;  // the host part of the step, past its device time
    // Host work before the forward that sleeps: the step overruns, and its thread waited.
    const EngineStats s0 = e.stats();
    set_forward_fault_hook([&](std::span<const uint64_t>) { std::this_thread::sleep_for(std::chrono::duration<double>(late_s)); });
    e.step(0.0);
    const EngineStats s1 = e.stats();
    CHECK(s1.sim_overruns == s0.sim_overruns + 1);
    CHECK(s1.sim_overruns_waiting == s0.sim_overruns_waiting + 1);
    // Host work that spends its own CPU time past it: an overrun, not a wait.
    set_forward_fault_hook([&](std::span<const uint64_t>) {
        const double until = thread_cpu_seconds() + late_s;
        while (thread_cpu_seconds() < until) {
        }
    });
    e.step(0.0);
    const EngineStats s2 = e.stats();
    CHECK(s2.sim_overruns == s1.sim_overruns + 1);
    CHECK(s2.sim_overruns_waiting == s1.sim_overruns_waiting);
}
