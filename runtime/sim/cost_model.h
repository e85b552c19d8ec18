// The simulated backend's cost model: how long one forward of a batch takes on a device, from a
// roofline per kernel class (weight GEMMs, attention, tensor-parallel all-reduces) over the model's
// shape. Pure functions over config values (steward/config.h's SimDeviceConfig, SimModelConfig);
// the engine's sim mode sleeps what step_cost says, in dilated time (sim/sim_clock.h).
//
// Per forward of N tokens (N_out of them need logits) over sequences with n_past computed tokens:
//   GEMM       flops 2 x N x P_layers + 2 x N_out x vocab x dim;  bytes: every layer weight once (+ the
//              output head when N_out > 0); time max(flops / (peak(weight dtype) x eff_gemm x
//              ramp), bytes / (bandwidth x eff_mem)), ramp = N / (N + gemm_ramp_tokens) (1 without)
//   attention  flops 4 x layers x heads x head_dim x (keys each new token attends); bytes: each
//              sequence's KV read once and its new KV written; time max(flops / (peak(kv dtype) x
//              eff_attn, or eff_attn_decode for one-token rows), bytes / (bandwidth x eff_mem))
//   all-reduce with tp > 1: 2 per layer of N x dim activations (ring: 2 (tp - 1) / tp of them cross
//              each link) plus the link latency each
//   overhead   step_overhead_us + layers x layer_overhead_us
// With tp devices the flops and weight / KV bytes split evenly between them (tensor parallelism).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include <steward/config.h>

namespace steward {

// One sequence's share of a forward: n_tokens new tokens after n_past computed ones, of which
// n_logits need the output head (0: a prefill chunk that is not the last, 1: decode, k + 1: verify).
struct SimSeqWork {
    int n_tokens = 0;
    int n_past = 0;
    int n_logits = 0;
};

// One forward's predicted time and what it is made of (per device of the tensor-parallel group).
struct SimStepCost {
    double total_s = 0;
    double gemm_s = 0, attn_s = 0, comm_s = 0, overhead_s = 0;
    double gemm_flops = 0, gemm_bytes = 0, attn_flops = 0, attn_bytes = 0;
    bool gemm_compute_bound = false, attn_compute_bound = false;
};

// Bytes per element: f32 4, bf16 / f16 2, fp8 1 (0 for an unknown name).
double sim_dtype_bytes(const std::string& dtype);
// The peak rate for operands of that dtype, FLOP/s (fp8: tflops_8 or else tflops_16; f32:
// tflops_32 or else tflops_16 / 2).
double sim_peak_flops(const SimDeviceConfig& d, const std::string& dtype);
// Parameters of the weight matrices per layer (q, k, v, o, gate, up, down) and in the whole model
// (layers, the output head and the embedding table).
double sim_layer_params(const SimModelConfig& m);
double sim_n_params(const SimModelConfig& m);
// Bytes of all weights (embedding table included), and of one token's KV (every layer, K and V).
double sim_weight_bytes(const SimModelConfig& m);
double sim_kv_bytes_per_token(const SimModelConfig& m);

// The predicted time of one forward over `seqs` on tp devices.
SimStepCost sim_step_cost(const SimDeviceConfig& d, const SimModelConfig& m, int tp, std::span<const SimSeqWork> seqs);

// KV blocks the devices hold: (tp x hbm_gib x memory_fraction - weights) / (block_size tokens of
// KV); 0 when the weights alone do not fit (sim_fit_error says so).
int64_t sim_kv_blocks(const SimPoolConfig& p, int block_size);
// "" when the model fits on tp devices, else what does not fit and the fix.
std::string sim_fit_error(const SimPoolConfig& p, int block_size);

}  // namespace steward
