// An encoder's forward, as llama.cpp's bert graph (src/models/bert.cpp) computes it:
//   x = tok_embd[id] + token_types[0] + position_embd[pos]     (nomic-bert: no positions; RoPE)
//   x = LayerNorm(x)
//   per layer:  a = LayerNorm(x + Wo·attn(Wq x + bq, Wk x + bk, Wv x + bv) + bo)     (attn_output_norm)
//               x = LayerNorm(a + Wdown·act(Wup a + bup) + bdown)                   (layer_output_norm)
// with act = GELU (bert) or SiLU(Wgate a) * (Wup a) (nomic-bert), attention over every token.
#include "cpu/encoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/kernels.h"
#include "model/ggml_types.h"

namespace steward {

namespace {

// ggml_norm then gain and bias: (x - mean) / sqrt(var + eps) * w + b over rows of n, sums in double.
void layer_norm(float* x, const WeightView& w, const WeightView& b, float eps, int n, int n_tok) {
    const float* g = static_cast<const float*>(w.data);
    const float* bb = static_cast<const float*>(b.data);
    for (int t = 0; t < n_tok; t++) {
        float* r = x + (int64_t)t * n;
        double sum = 0.0;
        for (int i = 0; i < n; i++) sum += r[i];
        const float mean = (float)(sum / n);
        double sum2 = 0.0;
        for (int i = 0; i < n; i++) {
            r[i] -= mean;
            sum2 += (double)r[i] * r[i];
        }
        const float scale = 1.0f / std::sqrt((float)(sum2 / n) + eps);
        for (int i = 0; i < n; i++) r[i] = r[i] * scale * g[i] + (bb ? bb[i] : 0.0f);
    }
}

void add_bias(float* y, const WeightView& b, int n, int n_tok) {
    if (!b) return;
    const float* bv = static_cast<const float*>(b.data);
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < n; i++) y[(int64_t)t * n + i] += bv[i];
}

}  // namespace

CpuEncoder::CpuEncoder(const Model& model, int n_threads)
    : model_(model), pool_(n_threads > 0 ? n_threads : cpu_count()) {}

Expected<bool> CpuEncoder::encode(std::span<const int32_t> tokens, std::vector<float>& hidden) {
    const ModelParams& p = model_.params();
    const ModelWeights& W = model_.weights();
    if (!p.is_encoder()) return make_error("model '", p.arch, "' is not an encoder; embed it with its decoder forward");
    const int n = (int)tokens.size(), E = p.n_embd, NH = p.n_head, NKV = p.n_head_kv, HD = p.head_dim;
    const int QD = NH * HD, KVD = NKV * HD, F = p.n_ff;
    if (n <= 0) return make_error("an encoder input needs at least one token");
    if (n > p.n_ctx_train)
        return make_error("the input has ", n, " tokens, over the encoder's context of ", p.n_ctx_train,
                          " tokens (its position table's length); shorten it or split it");
    for (int t = 0; t < n; t++)
        if (tokens[(size_t)t] < 0 || tokens[(size_t)t] >= p.n_vocab)
            return make_error("token id ", tokens[(size_t)t], " at position ", t, " is outside the vocabulary of ",
                              p.n_vocab, " ids");

    // ---- input embedding: token + type 0 + position, then LayerNorm
    hidden.assign((size_t)n * E, 0.0f);
    float* x = hidden.data();
    std::vector<float> row((size_t)E);
    if (W.type_embd) dequantize_row(W.type_embd.type, W.type_embd.row(0), row.data(), E);
    for (int t = 0; t < n; t++) {
        float* xt = x + (int64_t)t * E;
        dequantize_row(W.tok_embd.type, W.tok_embd.row(tokens[(size_t)t]), xt, E);
        if (W.type_embd)
            for (int e = 0; e < E; e++) xt[e] += row[(size_t)e];
    }
    if (W.pos_embd)
        for (int t = 0; t < n; t++) {
            dequantize_row(W.pos_embd.type, W.pos_embd.row(t), row.data(), E);
            for (int e = 0; e < E; e++) x[(int64_t)t * E + e] += row[(size_t)e];
        }
    layer_norm(x, W.tok_norm, W.tok_norm_b, p.rms_eps, E, n);

    // ---- RoPE tables (nomic-bert): angles in double as the decoder forward's
    const bool rotary = !W.pos_embd;
    const int half = p.n_rot / 2;
    std::vector<float> rcos, rsin;
    if (rotary) {
        rcos.resize((size_t)n * half);
        rsin.resize((size_t)n * half);
        for (int i = 0; i < half; i++) {
            const double f = p.rope_inv_freq(i);
            for (int t = 0; t < n; t++) {
                rcos[(size_t)t * half + i] = (float)std::cos(t * f);
                rsin[(size_t)t * half + i] = (float)std::sin(t * f);
            }
        }
    }
    auto rope = [&](float* v, int n_heads, int width) {
        for (int t = 0; t < n; t++)
            for (int h = 0; h < n_heads; h++) {
                float* hv = v + (int64_t)t * width + (int64_t)h * HD;
                const float* cs = rcos.data() + (size_t)t * half;
                const float* sn = rsin.data() + (size_t)t * half;
                for (int i = 0; i < half; i++) {
                    const int a = p.rope_type == RopeType::NORM ? 2 * i : i;
                    const int b = p.rope_type == RopeType::NORM ? 2 * i + 1 : i + half;
                    const float x0 = hv[a], x1 = hv[b];
                    hv[a] = x0 * cs[i] - x1 * sn[i];
                    hv[b] = x0 * sn[i] + x1 * cs[i];
                }
            }
    };

    q_.resize((size_t)n * QD);
    k_.resize((size_t)n * KVD);
    v_.resize((size_t)n * KVD);
    att_.resize((size_t)n * QD);
    tmp_.resize((size_t)n * E);
    ff_.resize((size_t)n * F);
    const float scale = 1.0f / std::sqrt((float)HD);
    for (int l = 0; l < p.n_layer; l++) {
        const LayerWeights& L = W.layers[(size_t)l];
        matmul(L.wq, x, n, q_.data(), pool_);
        matmul(L.wk, x, n, k_.data(), pool_);
        matmul(L.wv, x, n, v_.data(), pool_);
        add_bias(q_.data(), L.bq, QD, n);
        add_bias(k_.data(), L.bk, KVD, n);
        add_bias(v_.data(), L.bv, KVD, n);
        if (rotary) {
            rope(q_.data(), NH, QD);
            rope(k_.data(), NKV, KVD);
        }
        // Attention: one chunk per (head, query token); softmax over every key (the causal prefix
        // when the model declares causal attention).
        pool_.parallel_for((int64_t)NH * n, [&](int64_t c) {
            const int h = (int)(c / n), i = (int)(c % n), g = h / (NH / NKV);
            const int n_keys = p.causal ? i + 1 : n;
            thread_local std::vector<float> s;  // scores: one buffer per thread, not one per (head, token)
            s.resize((size_t)n_keys);
            const float* qi = q_.data() + (int64_t)i * QD + (int64_t)h * HD;
            float mx = -INFINITY;
            for (int j = 0; j < n_keys; j++) {
                s[(size_t)j] = dot_f32(qi, k_.data() + (int64_t)j * KVD + (int64_t)g * HD, HD) * scale;
                mx = std::max(mx, s[(size_t)j]);
            }
            const float sum = exp_sub_sum(s.data(), n_keys, mx);
            float* out = att_.data() + (int64_t)i * QD + (int64_t)h * HD;
            std::fill(out, out + HD, 0.0f);
            for (int j = 0; j < n_keys; j++) axpy_f32(s[(size_t)j] / sum, v_.data() + (int64_t)j * KVD + (int64_t)g * HD, out, HD);
        });
        matmul(L.wo, att_.data(), n, tmp_.data(), pool_);
        add_bias(tmp_.data(), L.bo, E, n);
        for (int64_t i = 0; i < (int64_t)n * E; i++) x[i] += tmp_[(size_t)i];
        layer_norm(x, L.attn_out_norm, L.attn_out_norm_b, p.rms_eps, E, n);
        // FFN: GELU(up) for bert, SiLU(gate) * up for nomic-bert.
        matmul(L.w_up, x, n, ff_.data(), pool_);
        add_bias(ff_.data(), L.b_up, F, n);
        if (L.w_gate) {
            gate_.resize((size_t)n * F);
            matmul(L.w_gate, x, n, gate_.data(), pool_);
            swiglu(gate_.data(), ff_.data(), (int64_t)n * F);
            std::swap(gate_, ff_);
        } else {
            pool_.parallel_for(n, [&](int64_t t) { geglu_ggml(ff_.data() + t * F, nullptr, F); });
        }
        matmul(L.w_down, ff_.data(), n, tmp_.data(), pool_);
        add_bias(tmp_.data(), L.b_down, E, n);
        for (int64_t i = 0; i < (int64_t)n * E; i++) x[i] += tmp_[(size_t)i];
        layer_norm(x, L.layer_out_norm, L.layer_out_norm_b, p.rms_eps, E, n);
    }
    return true;
}

}  // namespace steward
