#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace steward {

double sim_dtype_bytes(const std::string& d) {
    if (d == "f32") return 4;
    if (d == "bf16" || d == "f16") return 2;
    if (d == "fp8") return 1;
    return 0;
}

double sim_peak_flops(const SimDeviceConfig& d, const std::string& dtype) {
    double tf = d.tflops_16;
    if (dtype == "fp8" && d.tflops_8 > 0) tf = d.tflops_8;
    if (dtype == "f32") tf = d.tflops_32 > 0 ? d.tflops_32 : d.tflops_16 / 2;
    return tf * 1e12;
}

double sim_layer_params(const SimModelConfig& m) {
    const double E = m.dim, Q = (double)m.heads * m.head_dim, KV = (double)m.kv_heads * m.head_dim, F = m.ffn;
    return E * Q + 2 * E * KV + Q * E + 3 * E * F;
}

double sim_n_params(const SimModelConfig& m) { return m.layers * sim_layer_params(m) + 2.0 * m.vocab * m.dim; }

double sim_weight_bytes(const SimModelConfig& m) { return sim_n_params(m) * sim_dtype_bytes(m.weight_dtype); }

double sim_kv_bytes_per_token(const SimModelConfig& m) {
    return 2.0 * m.layers * m.kv_heads * m.head_dim * sim_dtype_bytes(m.kv_dtype);
}

SimStepCost sim_step_cost(const SimDeviceConfig& d, const SimModelConfig& m, int tp, std::span<const SimSeqWork> seqs) {
    SimStepCost c;
    tp = std::max(1, tp);
    double n_tok = 0, n_out = 0, keys = 0, keys_decode = 0, kv_tokens = 0;
    for (const SimSeqWork& s : seqs) {
        if (s.n_tokens <= 0) continue;
        n_tok += s.n_tokens;
        n_out += s.n_logits;
        // New token i (0-based) attends the n_past earlier ones and itself and the new ones before it.
        const double k = (double)s.n_tokens * s.n_past + (double)s.n_tokens * (s.n_tokens + 1) / 2.0;
        (s.n_tokens == 1 ? keys_decode : keys) += k;
        kv_tokens += (double)s.n_past + s.n_tokens;  // read once (the new ones are written, then read)
    }
    if (n_tok == 0) return c;
    const double wb = sim_dtype_bytes(m.weight_dtype);
    const double head = (double)m.vocab * m.dim;
    c.gemm_flops = (2.0 * n_tok * m.layers * sim_layer_params(m) + 2.0 * n_out * head) / tp;
    c.gemm_bytes = (m.layers * sim_layer_params(m) + (n_out > 0 ? head : 0.0)) * wb / tp;
    const double bw = d.hbm_gbps * 1e9 * d.eff_mem;
    const double ramp = d.gemm_ramp_tokens > 0 ? n_tok / (n_tok + d.gemm_ramp_tokens) : 1.0;
    const double t_gemm_c = c.gemm_flops / (sim_peak_flops(d, m.weight_dtype) * d.eff_gemm * ramp);
    const double t_gemm_m = c.gemm_bytes / bw;
    c.gemm_compute_bound = t_gemm_c > t_gemm_m;
    c.gemm_s = std::max(t_gemm_c, t_gemm_m);
    const double q_dim = (double)m.heads * m.head_dim;
    const double per_key = 4.0 * m.layers * q_dim / tp;
    c.attn_flops = per_key * (keys + keys_decode);
    c.attn_bytes = kv_tokens * sim_kv_bytes_per_token(m) / tp;
    const double eff_decode = d.eff_attn_decode > 0 ? d.eff_attn_decode : d.eff_attn;
    const double t_attn_c = per_key * (keys / d.eff_attn + keys_decode / eff_decode) / sim_peak_flops(d, m.kv_dtype);
    const double t_attn_m = c.attn_bytes / bw;
    c.attn_compute_bound = t_attn_c > t_attn_m;
    c.attn_s = std::max(t_attn_c, t_attn_m);
    if (tp > 1 && d.link_gbps > 0) {
        const double act = n_tok * m.dim * 2.0;  // bf16 activations
        c.comm_s = 2.0 * m.layers * (d.link_latency_us * 1e-6 + act * 2.0 * (tp - 1) / tp / (d.link_gbps * 1e9));
    }
    c.overhead_s = (d.step_overhead_us + m.layers * d.layer_overhead_us) * 1e-6;
    c.total_s = c.gemm_s + c.attn_s + c.comm_s + c.overhead_s;
    return c;
}

int64_t sim_kv_blocks(const SimPoolConfig& p, int block_size) {
    const double mem = p.tp * p.device.hbm_gib * (double)(1ull << 30) * p.memory_fraction;
    const double left = mem - sim_weight_bytes(p.model) - (p.draft ? sim_weight_bytes(*p.draft) : 0.0);
    // A draft's KV grows with the target's: each target block comes with a draft block.
    const double per_block = (sim_kv_bytes_per_token(p.model) + (p.draft ? sim_kv_bytes_per_token(*p.draft) : 0.0)) * block_size;
    if (left <= 0 || per_block <= 0) return 0;
    return (int64_t)std::floor(left / per_block);
}

std::string sim_fit_error(const SimPoolConfig& p, int block_size) {
    if (sim_kv_blocks(p, block_size) >= 1) return "";
    std::ostringstream o;
    const double gib = (double)(1ull << 30);
    o.precision(3);
    o << "model '" << p.model.name << "' (" << sim_weight_bytes(p.model) / gib << " GiB of " << p.model.weight_dtype
      << " weights" << (p.draft ? " plus its draft" : "") << ") leaves no room for KV on " << p.tp << " x " << p.device.name
      << " (" << p.device.hbm_gib << " GiB each, memory_fraction " << p.memory_fraction
      << "); raise tp, use fp8 weights or a larger device";
    return o.str();
}

}  // namespace steward
