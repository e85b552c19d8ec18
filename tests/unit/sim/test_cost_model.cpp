// The sim's cost model against independent references: the parameter count of the GGUF header it
// builds (the tensor infos, summed tensor by tensor by the loader), attention's key count by a naive
// loop, and the roofline's defining properties (which bound binds, how each term scales).
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <cmath>
#include <random>
#include <vector>

#include "config/config.h"
#include "model/model.h"
#include "sim/cost_model.h"
#include "sim/sim_clock.h"
#include "sim/sim_model.h"

using namespace steward;

namespace {

std::string src(const std::string& rel) { return std::string(STEWARD_SOURCE_DIR) + "/" + rel; }

// Reads a shipped device profile / model shape through the config parser (the way a pool gets them).
SimPoolConfig shipped(const std::string& device, const std::string& model, int tp = 1) {
    const std::string text = "[[pool]]\nname = \"p\"\nbackend = \"sim\"\n[pool.sim]\ndevice = \"" + src("configs/sim/" + device) +
                             "\"\nmodel = \"" + src("configs/sim/" + model) + "\"\ntp = " + std::to_string(tp) +
                             "\n[[bucket]]\nname = \"b\"\npool = \"p\"\n";
    auto c = parse_config(text, "x.toml");
    if (!c) FAIL(c.error().message);
    return *c->pools[0].sim;
}

SimModelConfig toy() {
    SimModelConfig m;
    m.name = "toy";
    m.layers = 4, m.dim = 256, m.heads = 8, m.kv_heads = 2, m.head_dim = 32, m.ffn = 512, m.vocab = 1000;
    m.weight_dtype = "bf16", m.kv_dtype = "bf16";
    return m;
}

SimDeviceConfig dev() {
    SimDeviceConfig d;
    d.name = "dev";
    d.tflops_16 = 100, d.hbm_gbps = 1000, d.hbm_gib = 16, d.link_gbps = 100, d.link_latency_us = 5;
    d.eff_gemm = 0.5, d.eff_attn = 0.5, d.eff_mem = 0.5;
    return d;
}

}  // namespace

TEST_CASE("the sim's parameter count equals the loader's sum over the tensor infos of the header it builds", "[sim]") {
    for (const char* shape : {"llama-8b.toml", "llama-70b.toml", "llama-1b.toml"}) {
        const SimModelConfig m = shipped("h100.toml", shape, shape == std::string("llama-70b.toml") ? 2 : 1).model;
        auto model = sim_model(m);  // the header a simulated pool loads
        REQUIRE(model);
        CHECK_FALSE((*model)->has_weights());
        // The loader counts norms too (a few hundred thousand of billions).
        const double loader = (double)(*model)->n_params();
        INFO(shape << ": sim " << sim_n_params(m) << " loader " << loader);
        CHECK(std::abs(sim_n_params(m) - loader) / loader < 1e-4);
    }
    // Published sizes: Llama 3.1 8B has 8.03B parameters, 70B 70.6B.
    CHECK(sim_n_params(shipped("h200.toml", "llama-8b.toml").model) == Approx(8.03e9).epsilon(0.01));
    CHECK(sim_n_params(shipped("h200.toml", "llama-70b-fp8.toml").model) == Approx(70.6e9).epsilon(0.01));
}

TEST_CASE("attention's FLOPs follow the keys each new token attends, counted by a naive loop", "[sim]") {
    const SimModelConfig m = toy();
    SimDeviceConfig d = dev();
    std::mt19937 rng(5);
    for (int trial = 0; trial < 200; trial++) {
        std::vector<SimSeqWork> seqs;
        double keys = 0, kv_read = 0;
        const int n = 1 + (int)(rng() % 6);
        for (int i = 0; i < n; i++) {
            SimSeqWork w{1 + (int)(rng() % 40), (int)(rng() % 300), 1};
            seqs.push_back(w);
            for (int t = 0; t < w.n_tokens; t++)
                for (int j = 0; j < w.n_past + w.n_tokens; j++)
                    if (j <= w.n_past + t) keys += 1;  // causal: the earlier tokens and itself
            kv_read += w.n_past + w.n_tokens;
        }
        const SimStepCost c = sim_step_cost(d, m, 1, seqs);
        CHECK(c.attn_flops == Approx(4.0 * m.layers * m.heads * m.head_dim * keys));
        CHECK(c.attn_bytes == Approx(kv_read * 2 * m.layers * m.kv_heads * m.head_dim * 2));
    }
}

TEST_CASE("the roofline: decode at batch 1 is bound by weight bytes, a long prefill by FLOPs, each bound scales with its peak", "[sim]") {
    const SimPoolConfig p = shipped("h100.toml", "llama-8b.toml");
    const std::vector<SimSeqWork> decode{{1, 100, 1}};
    const std::vector<SimSeqWork> prefill{{4096, 0, 1}};
    const SimStepCost dc = sim_step_cost(p.device, p.model, 1, decode);
    const SimStepCost pc = sim_step_cost(p.device, p.model, 1, prefill);
    CHECK_FALSE(dc.gemm_compute_bound);
    CHECK(pc.gemm_compute_bound);
    // Batch-1 decode of 8B BF16 on an H100 reads its layers and output head (7.50B parameters,
    // 15.0 GB; not the embedding table, of which it reads one row): 5.6 ms at 80% of 3.35 TB/s.
    CHECK(dc.gemm_s == Approx(15.01e9 / (3350e9 * 0.8)).epsilon(0.002));
    SimDeviceConfig fast_mem = p.device, fast_math = p.device;
    fast_mem.hbm_gbps *= 2;
    fast_math.tflops_16 *= 2;
    CHECK(sim_step_cost(fast_mem, p.model, 1, decode).gemm_s == Approx(dc.gemm_s / 2));
    CHECK(sim_step_cost(fast_math, p.model, 1, decode).gemm_s == Approx(dc.gemm_s));
    CHECK(sim_step_cost(fast_math, p.model, 1, prefill).gemm_s == Approx(pc.gemm_s / 2));
    CHECK(sim_step_cost(fast_mem, p.model, 1, prefill).gemm_s == Approx(pc.gemm_s));
    // FP8 weights: half the bytes, twice the FLOP rate.
    SimModelConfig fp8 = p.model;
    fp8.weight_dtype = "fp8";
    CHECK(sim_step_cost(p.device, fp8, 1, decode).gemm_s == Approx(dc.gemm_s / 2).epsilon(0.01));
    CHECK(sim_step_cost(p.device, fp8, 1, prefill).gemm_s == Approx(pc.gemm_s / 2).epsilon(0.001));  // 1978.9 vs 2 x 989.4
    // A verification of k + 1 tokens costs a decode's weight reads until the batch turns compute-bound.
    const std::vector<SimSeqWork> verify{{5, 100, 5}};
    CHECK(sim_step_cost(p.device, p.model, 1, verify).gemm_s == Approx(dc.gemm_s).epsilon(0.01));
}

TEST_CASE("tensor parallelism splits the work between devices and adds the all-reduces", "[sim]") {
    const SimModelConfig m = toy();
    const SimDeviceConfig d = dev();
    const std::vector<SimSeqWork> w{{64, 500, 1}, {1, 2000, 1}};
    const SimStepCost one = sim_step_cost(d, m, 1, w), two = sim_step_cost(d, m, 2, w);
    CHECK(one.comm_s == 0);
    CHECK(two.gemm_flops == Approx(one.gemm_flops / 2));
    CHECK(two.attn_bytes == Approx(one.attn_bytes / 2));
    CHECK(two.gemm_s == Approx(one.gemm_s / 2));
    // 2 all-reduces per layer of 65 tokens x dim bf16, half of it over each link, plus the latency.
    CHECK(two.comm_s == Approx(2 * m.layers * (5e-6 + 65.0 * 256 * 2 / (100e9))));
}

TEST_CASE("a pool's KV blocks are what the devices' memory holds after the weights", "[sim]") {
    SimPoolConfig p = shipped("h200.toml", "llama-70b-fp8.toml");
    const double mem = 140.0 * (1ull << 30) * 0.9;
    const double block = 2.0 * 80 * 8 * 128 * 2 * 16;  // K and V, layers, kv heads, head size, bf16, 16 tokens
    const int64_t n = sim_kv_blocks(p, 16);
    CHECK(n * block + sim_weight_bytes(p.model) <= mem);
    CHECK((n + 1) * block + sim_weight_bytes(p.model) > mem);
    CHECK(sim_fit_error(p, 16).empty());
    p.draft = shipped("h200.toml", "llama-1b.toml").model;  // its weights and a block of its KV per target block
    CHECK(sim_kv_blocks(p, 16) < n);
    SimPoolConfig big = shipped("h100.toml", "llama-70b.toml");  // 141 GB of BF16 on one 80 GB device
    CHECK(sim_kv_blocks(big, 16) == 0);
    CHECK_THAT(sim_fit_error(big, 16), Catch::Contains("raise tp"));
    big.tp = 4;
    CHECK(sim_kv_blocks(big, 16) > 0);
}

TEST_CASE("the dilated clock stays monotonic when its dilation changes", "[sim]") {
    const double before = time_dilation();
    const double t0 = sim_now_s();
    set_time_dilation(1000);
    const double t1 = sim_now_s();
    set_time_dilation(0.5);
    const double t2 = sim_now_s();
    set_time_dilation(before);
    const double t3 = sim_now_s();
    CHECK(t0 <= t1);
    CHECK(t1 <= t2);
    CHECK(t2 <= t3);
    CHECK(time_dilation() == before);
}

TEST_CASE("the GEMM ramp slows small compute-bound steps by (N + h) / N, decode rows take their own attention efficiency",
          "[sim]") {
    const SimModelConfig m = toy();
    SimDeviceConfig d = dev();
    d.hbm_gbps = 1e9;  // memory is never the bound here: the compute terms show
    const std::vector<SimSeqWork> w{{32, 64, 1}};
    const SimStepCost flat = sim_step_cost(d, m, 1, w);
    d.gemm_ramp_tokens = 32;
    const SimStepCost ramped = sim_step_cost(d, m, 1, w);
    CHECK(ramped.gemm_s == Approx(2 * flat.gemm_s));
    CHECK(ramped.attn_s == Approx(flat.attn_s));
    // One-token rows use eff_attn_decode; a multi-token row is unaffected by it.
    d.gemm_ramp_tokens = 0;
    d.eff_attn_decode = d.eff_attn / 4;
    CHECK(sim_step_cost(d, m, 1, w).attn_s == Approx(flat.attn_s));
    const std::vector<SimSeqWork> one{{1, 500, 1}};
    SimDeviceConfig plain = dev();
    plain.hbm_gbps = 1e9;
    CHECK(sim_step_cost(d, m, 1, one).attn_s == Approx(4 * sim_step_cost(plain, m, 1, one).attn_s));
    // Mixed: each row at its own rate, summed.
    const std::vector<SimSeqWork> both{{32, 64, 1}, {1, 500, 1}};
    CHECK(sim_step_cost(d, m, 1, both).attn_s == Approx(flat.attn_s + 4 * sim_step_cost(plain, m, 1, one).attn_s));
}
