// A naive encoder forward (bert, nomic-bert) for the tests only: scalar loops in double over one
// input, weights decoded element by element (naive_reference.h's decoders), sharing no code with
// runtime/cpu/encoder.cpp. Each feature can be turned off, so a test can show that leaving it out
// moves the result away from llama.cpp's (the test would catch its omission).
#pragma once
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "model/ggml_types.h"
#include "model/model.h"
#include "naive_reference.h"

namespace steward::test {

struct NaiveEncoderOptions {
    bool bidirectional = true;  // off: each token sees only itself and earlier tokens
    bool token_types = true;    // off: token type 0's row not added
    bool positions = true;      // off: neither the position rows (bert) nor RoPE (nomic-bert)
    bool attn_out_norm = true;  // off: the LayerNorm after the attention residual skipped
    bool tanh_gelu = true;      // off: the exact (erf) GELU instead of ggml's tanh approximation
};

// hidden [n][n_embd] after the last layer's output LayerNorm.
inline std::vector<double> naive_encode(const Model& m, std::span<const int32_t> ids, NaiveEncoderOptions o = {}) {
    const ModelParams& p = m.params();
    const ModelWeights& W = m.weights();
    const int n = (int)ids.size(), E = p.n_embd, H = p.n_head, HD = p.head_dim, G = p.n_head / p.n_head_kv;
    const int F = p.n_ff;
    auto el = [](const WeightView& w, int64_t r, int64_t c) { return ref_decode_elem(w.type, w.row(r), c); };
    // y[t][r] = sum_c W[r][c] x[t][c] (+ b[r])
    auto lin = [&](const WeightView& w, const WeightView& b, const std::vector<double>& x, int cols) {
        const int rows = (int)w.n_rows;
        std::vector<double> y((size_t)n * rows, 0.0);
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) {
                double s = b ? el(b, 0, r) : 0.0;
                for (int c = 0; c < cols; c++) s += el(w, r, c) * x[(size_t)t * cols + c];
                y[(size_t)t * rows + r] = s;
            }
        return y;
    };
    auto norm = [&](std::vector<double>& x, const WeightView& g, const WeightView& b) {
        for (int t = 0; t < n; t++) {
            double mean = 0, var = 0;
            for (int e = 0; e < E; e++) mean += x[(size_t)t * E + e];
            mean /= E;
            for (int e = 0; e < E; e++) var += (x[(size_t)t * E + e] - mean) * (x[(size_t)t * E + e] - mean);
            var /= E;
            for (int e = 0; e < E; e++)
                x[(size_t)t * E + e] = (x[(size_t)t * E + e] - mean) / std::sqrt(var + p.rms_eps) * el(g, 0, e) + el(b, 0, e);
        }
    };
    const bool rotary = p.arch == "nomic-bert";
    std::vector<double> x((size_t)n * E);
    for (int t = 0; t < n; t++)
        for (int e = 0; e < E; e++) {
            double v = el(W.tok_embd, ids[(size_t)t], e);
            if (o.token_types && W.type_embd) v += el(W.type_embd, 0, e);
            if (o.positions && !rotary) v += el(W.pos_embd, t, e);
            x[(size_t)t * E + e] = v;
        }
    norm(x, W.tok_norm, W.tok_norm_b);
    // NeoX rotation of pairs (i, i + n_rot/2) by t * base^(-2i / n_rot).
    auto rope = [&](std::vector<double>& v, int heads) {
        const int half = p.n_rot / 2;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < half; i++) {
                    const double th = t * std::pow((double)p.rope_freq_base, -2.0 * i / p.n_rot);
                    double& a = v[((size_t)t * heads + h) * HD + i];
                    double& b = v[((size_t)t * heads + h) * HD + i + half];
                    const double a0 = a, b0 = b;
                    a = a0 * std::cos(th) - b0 * std::sin(th);
                    b = a0 * std::sin(th) + b0 * std::cos(th);
                }
    };
    for (int l = 0; l < p.n_layer; l++) {
        const LayerWeights& L = W.layers[(size_t)l];
        std::vector<double> q = lin(L.wq, L.bq, x, E), k = lin(L.wk, L.bk, x, E), v = lin(L.wv, L.bv, x, E);
        if (rotary && o.positions) {
            rope(q, H);
            rope(k, p.n_head_kv);
        }
        const int KVD = p.n_head_kv * HD;
        std::vector<double> att((size_t)n * H * HD, 0.0);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < n; i++) {
                const int nk = o.bidirectional ? n : i + 1;
                std::vector<double> s((size_t)nk);
                double mx = -1e300, sum = 0;
                for (int j = 0; j < nk; j++) {
                    double d = 0;
                    for (int c = 0; c < HD; c++) d += q[((size_t)i * H + h) * HD + c] * k[(size_t)j * KVD + (h / G) * HD + c];
                    s[(size_t)j] = d / std::sqrt((double)HD);
                    mx = std::max(mx, s[(size_t)j]);
                }
                for (double& z : s) sum += (z = std::exp(z - mx));
                for (int j = 0; j < nk; j++)
                    for (int c = 0; c < HD; c++)
                        att[((size_t)i * H + h) * HD + c] += s[(size_t)j] / sum * v[(size_t)j * KVD + (h / G) * HD + c];
            }
        std::vector<double> a = lin(L.wo, L.bo, att, H * HD);
        for (size_t i = 0; i < a.size(); i++) a[i] += x[i];
        if (o.attn_out_norm) norm(a, L.attn_out_norm, L.attn_out_norm_b);
        std::vector<double> up = lin(L.w_up, L.b_up, a, E);
        if (L.w_gate) {
            const std::vector<double> g = lin(L.w_gate, WeightView{}, a, E);
            for (size_t i = 0; i < up.size(); i++) up[i] *= g[i] / (1.0 + std::exp(-g[i]));
        } else {
            for (double& u : up)
                u = o.tanh_gelu ? 0.5 * u * (1.0 + std::tanh(0.7978845608028654 * u * (1.0 + 0.044715 * u * u)))
                                : 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
        }
        std::vector<double> y = lin(L.w_down, L.b_down, up, F);
        for (size_t i = 0; i < y.size(); i++) y[i] += a[i];
        norm(y, L.layer_out_norm, L.layer_out_norm_b);
        x = std::move(y);
    }
    return x;
}

// Mean or first-token pooling of hidden [n][E], scaled to unit length.
inline std::vector<float> naive_pool(const std::vector<double>& h, int n, int E, bool mean) {
    std::vector<double> v((size_t)E, 0.0);
    for (int t = 0; t < (mean ? n : 1); t++)
        for (int e = 0; e < E; e++) v[(size_t)e] += h[(size_t)t * E + e];
    double ss = 0;
    for (double z : v) ss += z * z;
    std::vector<float> out((size_t)E);
    for (int e = 0; e < E; e++) out[(size_t)e] = (float)(v[(size_t)e] / std::sqrt(ss));
    return out;
}

}  // namespace steward::test
