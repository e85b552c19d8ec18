// A naive llama-family forward pass for the tests only: one sequence, contiguous KV, scalar loops
// in double, weights decoded row by row by its own small decoders. It shares no code with
// runtime/cpu on purpose, so CpuForward can be checked against it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "model/ggml_types.h"
#include "model/model.h"

namespace steward::test {

// Element e of a stored weight as a double. f16_to_f32 is the only conversion borrowed from the
// runtime; BF16 and Q8_0 are decoded here.
inline double ref_decode_elem(GgmlType type, const uint8_t* row, int64_t e) {
    switch (type) {
        case GgmlType::F32: {
            float f;
            std::memcpy(&f, row + e * 4, 4);
            return f;
        }
        case GgmlType::F16: {
            uint16_t h;
            std::memcpy(&h, row + e * 2, 2);
            return f16_to_f32(h);
        }
        case GgmlType::BF16: {
            uint16_t h;
            std::memcpy(&h, row + e * 2, 2);
            const uint32_t bits = (uint32_t)h << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            return f;
        }
        case GgmlType::Q8_0: {
            // A block is 2 bytes of F16 scale then 32 int8 quants: value = d * q.
            const uint8_t* block = row + (e / 32) * 34;
            uint16_t d;
            std::memcpy(&d, block, 2);
            const int8_t q = (int8_t)block[2 + e % 32];
            return (double)f16_to_f32(d) * q;
        }
        case GgmlType::MXFP4: {
            // OCP MX: a block is one E8M0 exponent byte (2^(e - 127)) then 16 bytes of E2M1 codes,
            // element j < 16 in the low nibble of byte j, j + 16 in the high one. E2M1: sign bit 3,
            // exponent bits 1-2 (bias 1), mantissa bit 0; exponent 0 is subnormal (0 or 0.5).
            const uint8_t* block = row + (e / 32) * 17;
            const int j = (int)(e % 32);
            const int code = j < 16 ? block[1 + j] & 0x0f : block[1 + j - 16] >> 4;
            const int ex = (code >> 1) & 3, man = code & 1;
            const double mag = ex == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, ex - 1);
            return (code & 8 ? -mag : mag) * std::ldexp(1.0, (int)block[0] - 127);
        }
        default: break;
    }
    throw std::runtime_error("naive reference: unknown weight type");
}

// The whole stored tensor as doubles: [n_rows][n_cols] (a 1-D tensor is one row).
inline std::vector<double> ref_decode(const WeightView& w) {
    if (!w) return {};
    const int64_t n_rows = w.n_rows > 0 ? w.n_rows : 1;
    std::vector<double> out((size_t)(n_rows * w.n_cols));
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t* row = w.row(r);
        for (int64_t c = 0; c < w.n_cols; c++) out[(size_t)(r * w.n_cols + c)] = ref_decode_elem(w.type, row, c);
    }
    return out;
}

// Gemma 2 / 3's features, each of which a test can turn off to show that leaving it out changes the
// logits (ModelParams says which a model has; off means computed as a llama block would).
struct NaiveFeatures {
    bool embd_scale = true;      // the embedding times sqrt(n_embd)
    bool sliding_window = true;  // the window of the sliding layers (off: they see everything)
    bool swa_rope = true;        // the sliding layers' own RoPE base (off: the full layers')
    bool attn_softcap = true;    // cap * tanh(score / cap)
    bool final_softcap = true;
    bool post_norms = true;      // the RMSNorms after the attention and FFN branches
    bool geglu = true;           // GELU of the gate (off: SiLU)
    bool moe_renorm = true;      // the chosen experts' probabilities renormalized to sum to 1 (off: as they are)
    bool moe_softmax = true;     // experts weighted by softmax probabilities (off: by raw router logits)
    // gpt-oss's: the sinks in the attention's softmax, the clamped SwiGLU (off: plain SwiGLU), and
    // the softmax over the top-k logits (off: the top-k probabilities of a softmax over all experts, as
    // they are; the softmax over the top k equals that softmax renormalized over them).
    bool sinks = true;
    bool swiglu_oai = true;
    bool softmax_after_topk = true;
};

class NaiveReference {
public:
    // kv_f16: round each stored K and V element to F16, as an F16 KV cache does.
    explicit NaiveReference(const Model& model, bool kv_f16 = false, NaiveFeatures f = {})
        : p_(model.params()), kv_f16_(kv_f16), f_(f) {
        const ModelWeights& w = model.weights();
        tok_embd_ = ref_decode(w.tok_embd);
        output_norm_ = ref_decode(w.output_norm);
        output_ = ref_decode(w.output);
        for (const LayerWeights& lw : w.layers) {
            Layer l;
            l.attn_norm = ref_decode(lw.attn_norm);
            l.wq = ref_decode(lw.wq);
            l.wk = ref_decode(lw.wk);
            l.wv = ref_decode(lw.wv);
            l.wo = ref_decode(lw.wo);
            l.bq = ref_decode(lw.bq);
            l.bk = ref_decode(lw.bk);
            l.bv = ref_decode(lw.bv);
            l.q_norm = ref_decode(lw.q_norm);
            l.k_norm = ref_decode(lw.k_norm);
            l.ffn_norm = ref_decode(lw.ffn_norm);
            l.w_gate = ref_decode(lw.w_gate);
            l.w_up = ref_decode(lw.w_up);
            l.w_down = ref_decode(lw.w_down);
            l.attn_post_norm = ref_decode(lw.attn_post_norm);
            l.ffn_gate_inp = ref_decode(lw.ffn_gate_inp);
            l.gate_exps = ref_decode(lw.gate_exps);
            l.up_exps = ref_decode(lw.up_exps);
            l.down_exps = ref_decode(lw.down_exps);
            l.ffn_post_norm = ref_decode(lw.ffn_post_norm);
            l.bo = ref_decode(lw.bo);
            l.sinks = ref_decode(lw.attn_sinks);
            l.gate_inp_b = ref_decode(lw.ffn_gate_inp_b);
            l.gate_exps_b = ref_decode(lw.gate_exps_b);
            l.up_exps_b = ref_decode(lw.up_exps_b);
            l.down_exps_b = ref_decode(lw.down_exps_b);
            layers_.push_back(std::move(l));
        }
        k_.resize(layers_.size());
        v_.resize(layers_.size());
    }

    int n_past() const { return n_past_; }

    // Forgets positions >= n_past, then runs tokens at positions n_past, n_past + 1, ...
    // Returns logits [n_tokens][n_vocab].
    std::vector<float> eval(std::span<const int32_t> tokens, int n_past) {
        if (n_past > n_past_) throw std::runtime_error("naive reference: n_past beyond what it has seen");
        const size_t kv_dim = (size_t)p_.n_head_kv * p_.head_dim;
        for (size_t l = 0; l < layers_.size(); l++) {
            k_[l].resize((size_t)n_past * kv_dim);
            v_[l].resize((size_t)n_past * kv_dim);
        }
        n_past_ = n_past;
        std::vector<float> logits;
        logits.reserve(tokens.size() * (size_t)p_.n_vocab);
        for (int32_t t : tokens) {
            std::vector<double> out = step(t, n_past_);
            n_past_++;
            for (double d : out) logits.push_back((float)d);
        }
        return logits;
    }

    // As eval, but returns each token's final-norm hidden state (the output norm applied, not the
    // output head: llama.cpp's result_norm, what an embedding pools): [n_tokens][n_embd].
    std::vector<double> eval_hidden(std::span<const int32_t> tokens, int n_past) {
        std::vector<double> hidden;
        for (size_t i = 0; i < tokens.size(); i++) {
            eval(tokens.subspan(i, 1), n_past + (int)i);
            hidden.insert(hidden.end(), hidden_.begin(), hidden_.end());
        }
        return hidden;
    }

private:
    struct Layer {
        std::vector<double> attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, ffn_norm, w_gate, w_up, w_down;
        std::vector<double> attn_post_norm, ffn_post_norm;
        std::vector<double> ffn_gate_inp, gate_exps, up_exps, down_exps;  // experts stacked [n_expert][rows][cols]
        std::vector<double> bo, sinks, gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;  // gpt-oss
    };

    // y[r] = sum_c W[r][c] x[c] (+ b[r]); W is [n_rows][x.size()].
    static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x,
                                      const std::vector<double>& bias = {}) {
        const size_t n_cols = x.size();
        const size_t n_rows = w.size() / n_cols;
        std::vector<double> y(n_rows);
        for (size_t r = 0; r < n_rows; r++) {
            double s = 0.0;
            for (size_t c = 0; c < n_cols; c++) s += w[r * n_cols + c] * x[c];
            y[r] = s + (bias.empty() ? 0.0 : bias[r]);
        }
        return y;
    }

    std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& g) const {
        double ss = 0.0;
        for (double v : x) ss += v * v;
        const double scale = 1.0 / std::sqrt(ss / (double)x.size() + (double)p_.rms_eps);
        std::vector<double> y(x.size());
        for (size_t i = 0; i < x.size(); i++) y[i] = x[i] * scale * g[i];
        return y;
    }

    // RoPE over the first n_rot dims of each head: theta_i = pos * base^(-2i / n_rot), times the
    // linear scale, divided by pair i's factor where the file has them (llama.cpp's ggml_rope_ext).
    // A sliding-window layer of a model with its own window RoPE (Gemma 3) uses base_swa / scale_swa.
    // YaRN (the paper's "NTK-by-parts" with its temperature): pair i below the correction range keeps
    // the unscaled angle, above it the scaled one, linearly between; cos and sin times
    // attn_factor * (1 + 0.1 ln(1 / scale)).
    void rope(std::vector<double>& x, int n_heads, int pos, bool swa = false) const {
        const int hd = p_.head_dim;
        const int n_rot = p_.n_rot;
        const double base = swa ? p_.rope_freq_base_swa : p_.rope_freq_base;
        const double fscale = swa ? p_.rope_freq_scale_swa : p_.rope_freq_scale;
        for (int h = 0; h < n_heads; h++) {
            double* v = x.data() + (size_t)h * hd;
            for (int i = 0; i < n_rot / 2; i++) {
                double theta = pos * std::pow(base, -2.0 * i / n_rot) * fscale;
                if (!p_.rope_freq_factors.empty()) theta /= (double)p_.rope_freq_factors[(size_t)i];
                double m = p_.rope_attn_factor;
                if (p_.yarn_ext_factor != 0.0f) {
                    const double lo = p_.yarn_corr[0], hi = p_.yarn_corr[1];
                    const double ramp = 1.0 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
                    const double mix = ramp * p_.yarn_ext_factor;
                    theta = theta * (1.0 - mix) + theta / fscale * mix;
                    m *= 1.0 + 0.1 * std::log(1.0 / fscale);
                }
                const double c = std::cos(theta) * m, s = std::sin(theta) * m;
                const int a = p_.rope_type == RopeType::NORM ? 2 * i : i;
                const int b = p_.rope_type == RopeType::NORM ? 2 * i + 1 : i + n_rot / 2;
                const double x0 = v[a], x1 = v[b];
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }

    // qwen3's q / k norm: each head's head_dim values divided by their root mean square (plus the
    // model's eps), times the gain g[d]. No gain (other architectures): unchanged.
    void norm_each_head(std::vector<double>& x, int n_heads, const std::vector<double>& g) const {
        if (g.empty()) return;
        const int hd = p_.head_dim;
        for (int h = 0; h < n_heads; h++) {
            double sum_sq = 0.0;
            for (int d = 0; d < hd; d++) sum_sq += x[(size_t)h * hd + d] * x[(size_t)h * hd + d];
            const double inv_rms = 1.0 / std::sqrt(sum_sq / hd + (double)p_.rms_eps);
            for (int d = 0; d < hd; d++) x[(size_t)h * hd + d] = x[(size_t)h * hd + d] * inv_rms * g[d];
        }
    }

    static double round_f16(double x) { return f16_to_f32(f32_to_f16((float)x)); }

    std::vector<double> step(int32_t token, int pos) {
        const int n_embd = p_.n_embd, hd = p_.head_dim;
        const int n_head = p_.n_head, n_kv = p_.n_head_kv;
        const size_t kv_dim = (size_t)n_kv * hd;
        std::vector<double> x(tok_embd_.begin() + (size_t)token * n_embd,
                              tok_embd_.begin() + (size_t)(token + 1) * n_embd);
        const bool gemma = p_.arch == "gemma2" || p_.arch == "gemma3";
        if (gemma && f_.embd_scale)  // Gemma: the embedding times sqrt(n_embd)
            for (double& e : x) e *= std::sqrt((double)n_embd);
        for (size_t l = 0; l < layers_.size(); l++) {
            const Layer& L = layers_[l];
            const bool swa = p_.is_swa((int)l);
            std::vector<double> h = rmsnorm(x, L.attn_norm);
            std::vector<double> q = matvec(L.wq, h, L.bq);
            std::vector<double> k = matvec(L.wk, h, L.bk);
            std::vector<double> v = matvec(L.wv, h, L.bv);
            norm_each_head(q, n_head, L.q_norm);
            norm_each_head(k, n_kv, L.k_norm);
            rope(q, n_head, pos, swa && f_.swa_rope);
            rope(k, n_kv, pos, swa && f_.swa_rope);
            if (kv_f16_) {
                for (double& e : k) e = round_f16(e);
                for (double& e : v) e = round_f16(e);
            }
            k_[l].insert(k_[l].end(), k.begin(), k.end());
            v_[l].insert(v_[l].end(), v.begin(), v.end());
            const size_t n_seen = k_[l].size() / kv_dim;  // this token included: causal

            std::vector<double> att((size_t)n_head * hd, 0.0);
            // Gemma's query scale (1 / sqrt(head size), or 1 / sqrt(dim / heads) for the 27B models).
            const double scale = p_.attn_scale > 0 ? (double)p_.attn_scale : 1.0 / std::sqrt((double)hd);
            // Keys at positions <= pos - n_swa are outside a sliding layer's window.
            const size_t first = swa && f_.sliding_window && pos >= p_.n_swa ? (size_t)(pos - p_.n_swa + 1) : 0;
            const double cap = f_.attn_softcap ? (double)p_.attn_softcap : 0.0;
            for (int hq = 0; hq < n_head; hq++) {
                const int hk = hq / (n_head / n_kv);
                std::vector<double> score(n_seen, 0.0);
                double mx = -1e300;
                for (size_t j = first; j < n_seen; j++) {
                    const double* kj = k_[l].data() + j * kv_dim + (size_t)hk * hd;
                    double s = 0.0;
                    for (int d = 0; d < hd; d++) s += q[(size_t)hq * hd + d] * kj[d];
                    score[j] = s * scale;
                    if (cap > 0) score[j] = cap * std::tanh(score[j] / cap);
                    mx = std::max(mx, score[j]);
                }
                // gpt-oss: the head's sink logit joins the normaliser and weighs no value.
                const bool sink = !L.sinks.empty() && f_.sinks;
                if (sink) mx = std::max(mx, L.sinks[(size_t)hq]);
                double sum = sink ? std::exp(L.sinks[(size_t)hq] - mx) : 0.0;
                for (size_t j = 0; j < n_seen; j++) {
                    score[j] = j < first ? 0.0 : std::exp(score[j] - mx);
                    sum += score[j];
                }
                for (size_t j = 0; j < n_seen; j++) {
                    const double* vj = v_[l].data() + j * kv_dim + (size_t)hk * hd;
                    for (int d = 0; d < hd; d++) att[(size_t)hq * hd + d] += score[j] / sum * vj[d];
                }
            }
            std::vector<double> o = matvec(L.wo, att, L.bo);
            if (!L.attn_post_norm.empty() && f_.post_norms) o = rmsnorm(o, L.attn_post_norm);
            for (int i = 0; i < n_embd; i++) x[i] += o[i];

            h = rmsnorm(x, L.ffn_norm);
            if (p_.n_expert > 0) {  // mixture of experts: softmax over the router, top-k, renormalized
                const int X = p_.n_expert, K = p_.n_expert_used, F = p_.n_ff_exp;
                const std::vector<double> logit = matvec(L.ffn_gate_inp, h, L.gate_inp_b);
                std::vector<double> prob(logit);
                const bool after_topk = p_.moe_softmax_after_topk && f_.softmax_after_topk;
                if (f_.moe_softmax && !after_topk) {
                    const double mx = *std::max_element(logit.begin(), logit.end());
                    double sum = 0;
                    for (double& z : prob) sum += (z = std::exp(z - mx));
                    for (double& z : prob) z /= sum;
                }
                std::vector<int> chosen;
                std::vector<bool> taken((size_t)X, false);
                for (int k = 0; k < K; k++) {  // the K largest, the lower index first on a tie
                    int best = -1;
                    for (int e = 0; e < X; e++)
                        if (!taken[(size_t)e] && (best < 0 || prob[(size_t)e] > prob[(size_t)best])) best = e;
                    taken[(size_t)best] = true;
                    chosen.push_back(best);
                }
                double wsum = 0;
                if (after_topk) {  // a softmax over the chosen logits
                    const double top = prob[(size_t)chosen[0]];
                    for (int e : chosen) wsum += (prob[(size_t)e] = std::exp(prob[(size_t)e] - top));
                }
                for (int e : chosen) wsum += after_topk ? 0.0 : prob[(size_t)e];
                std::vector<double> out((size_t)n_embd, 0.0);
                for (int e : chosen) {
                    auto slice = [&](const std::vector<double>& w, size_t rows, size_t cols) {
                        return std::vector<double>(w.begin() + (size_t)e * rows * cols, w.begin() + (size_t)(e + 1) * rows * cols);
                    };
                    auto brow = [&](const std::vector<double>& b, size_t n) {
                        return b.empty() ? b : std::vector<double>(b.begin() + (size_t)e * n, b.begin() + (size_t)(e + 1) * n);
                    };
                    std::vector<double> g = matvec(slice(L.gate_exps, F, n_embd), h, brow(L.gate_exps_b, F));
                    const std::vector<double> u = matvec(slice(L.up_exps, F, n_embd), h, brow(L.up_exps_b, F));
                    for (size_t i = 0; i < g.size(); i++) {
                        if (p_.swiglu_oai && f_.swiglu_oai) {  // gpt-oss: gate capped at 7, up clamped to [-7, 7]
                            const double xg = std::min(g[i], 7.0), yu = std::clamp(u[i], -7.0, 7.0);
                            g[i] = xg / (1.0 + std::exp(-1.702 * xg)) * (yu + 1.0);
                        } else {
                            g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
                        }
                    }
                    const std::vector<double> d = matvec(slice(L.down_exps, n_embd, F), g, brow(L.down_exps_b, n_embd));
                    const double w = after_topk || (f_.moe_renorm && !p_.moe_softmax_after_topk) ? prob[(size_t)e] / wsum : prob[(size_t)e];
                    for (int i = 0; i < n_embd; i++) out[(size_t)i] += w * d[(size_t)i];
                }
                for (int i = 0; i < n_embd; i++) x[i] += out[(size_t)i];
                continue;
            }
            std::vector<double> g = matvec(L.w_gate, h);
            std::vector<double> u = matvec(L.w_up, h);
            for (size_t i = 0; i < g.size(); i++)
                g[i] = (p_.ffn_gelu && f_.geglu
                            ? 0.5 * g[i] * (1.0 + std::tanh(0.7978845608028654 * g[i] * (1.0 + 0.044715 * g[i] * g[i])))
                            : g[i] / (1.0 + std::exp(-g[i]))) *
                       u[i];
            std::vector<double> d = matvec(L.w_down, g);
            if (!L.ffn_post_norm.empty() && f_.post_norms) d = rmsnorm(d, L.ffn_post_norm);
            for (int i = 0; i < n_embd; i++) x[i] += d[i];
        }
        hidden_ = rmsnorm(x, output_norm_);
        std::vector<double> logits = matvec(output_, hidden_);
        if (p_.final_softcap > 0 && f_.final_softcap)
            for (double& z : logits) z = p_.final_softcap * std::tanh(z / p_.final_softcap);
        return logits;
    }

    ModelParams p_;
    bool kv_f16_;
    NaiveFeatures f_;
    std::vector<double> tok_embd_;     // [n_vocab][n_embd]
    std::vector<double> output_norm_;  // [n_embd]
    std::vector<double> output_;       // [n_vocab][n_embd]
    std::vector<Layer> layers_;
    std::vector<std::vector<double>> k_, v_;  // [n_layer][n_past][n_head_kv * head_dim]
    std::vector<double> hidden_;              // [n_embd] the last step's final-norm state
    int n_past_ = 0;
};

}  // namespace steward::test
