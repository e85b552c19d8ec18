// The batched forward pass over paged KV, read top to bottom: validate, embed, then per layer
// rmsnorm -> QKV (-> q/k head norms) -> RoPE -> write KV -> attention -> output projection -> rmsnorm -> SwiGLU FFN,
// then the final norm and the output head for the rows that asked for logits.
#include "cpu/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu/kernels.h"
#include "model/quantize.h"
#include "model/quants.h"

namespace steward {

CpuForward::CpuForward(const Model& model, int n_threads, int max_tokens, int n_layers)
    : model_(model),
      n_threads_(n_threads > 0 ? n_threads : cpu_count()),
      max_tokens_(max_tokens),
      n_layers_(forward_layers(model.params(), n_layers)),
      pool_(n_threads_) {
    const ModelParams& p = model.params();
    const size_t T = (size_t)max_tokens;
    x_.resize(T * p.n_embd);
    xn_.resize(T * p.n_embd);
    q_.resize(T * p.n_head * p.head_dim);
    k_.resize(T * p.n_head_kv * p.head_dim);
    v_.resize(T * p.n_head_kv * p.head_dim);
    att_.resize(T * p.n_head * p.head_dim);
    gate_.resize(T * p.n_ff);
    up_.resize(T * p.n_ff);
    tmp_.resize(T * std::max(p.n_embd, p.n_head * p.head_dim));
    // We split matmuls across our own threads; OpenBLAS runs single-threaded inside each slice.
    blas_set_threads(1);
}

namespace {

// Where each new token of the batch lives.
struct TokenRef {
    int seq;     // index in the batch
    int i;       // index among the sequence's new tokens
    int pos;     // RoPE position
    int slot;    // logical KV slot
};

// Rotates pairs of x (one head, n_rot dims) by pos * theta_i.
void rope_head(float* x, const float* cs, const float* sn, int n_rot, RopeType type) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        const int a = type == RopeType::NORM ? 2 * i : i;
        const int b = type == RopeType::NORM ? 2 * i + 1 : i + half;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
    }
}

// gpt-oss's clamped SwiGLU in place of g (ggml_swiglu_oai, alpha 1.702, limit 7): x = min(g, 7),
// y = clamp(u, -7, 7), g = x / (1 + e^(-1.702 x)) * (y + 1).
void swiglu_oai(float* g, const float* u, int64_t n) {
    constexpr float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        const float x = std::min(g[i], limit), y = std::clamp(u[i], -limit, limit);
        g[i] = x / (1.0f + std::exp(alpha * (-x))) * (y + 1.0f);
    }
}

// A softmax's exponentials in place over x[0..n) (with mx the largest score) and the inverse of
// their sum; a sink logit (gpt-oss; -inf: none) joins the max and the sum and weighs no value, as
// ggml's soft_max with sinks (exp(-inf) is 0).
inline float softmax_inv_sum(float* x, int n, float mx, float sink) {
    mx = std::max(mx, sink);
    return 1.0f / (exp_sub_sum(x, n, mx) + std::exp(sink - mx));
}

// fn(t0, t1) over chunks of a step's n_tok tokens: across the pool once there are enough of them to
// pay for a join (a prefill's chunk), on the caller otherwise (a decode step). For the per-token
// work between the matmuls (norms, biases, RoPE, the KV writes, the residual adds), which ran on
// the caller alone while the other threads waited. A 128-token prefill at 2 threads, with and
// without, alternating in one process (AMD EPYC Zen 3): the 110M model in F16 1.018x, the serving
// bench's model 1.021x, the logits the same bits.
template <class F>
void each_tokens(ThreadPool& pool, int n_tok, F&& fn) {
    constexpr int kChunk = 16;
    if (pool.n_threads() == 1 || n_tok < 2 * kChunk) {
        fn(0, n_tok);
        return;
    }
    pool.parallel_for((n_tok + kChunk - 1) / kChunk,
                      [&](int64_t c) { fn((int)c * kChunk, std::min(n_tok, (int)(c + 1) * kChunk)); });
}

// Gemma's soft-capping: cap * tanh(s / cap), as ggml's scale, tanh, scale.
inline float soft_cap(float s, float cap) { return cap * std::tanh(s * (1.0f / cap)); }

void add_bias(float* y, const WeightView& b, int n, int n_tok) {
    if (!b) return;
    const float* bv = static_cast<const float*>(b.data);
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < n; i++) y[(int64_t)t * n + i] += bv[i];
}

// qwen3: RMSNorm over each head's vector with the layer's [head_dim] gain (x is [n_tok * n_heads][hd]).
void norm_heads(float* x, const WeightView& gain, float eps, int hd, int n_heads, int n_tok) {
    if (!gain) return;
    rmsnorm(x, static_cast<const float*>(gain.data), eps, hd, n_tok * n_heads, x);
}

// One row of n values (whole blocks for Q8_0 / Q4_0) into the KV's element type. Q8_0 and Q4_0 use
// ggml's quantizers, so a row holds what llama.cpp's cache of that type would (llama.cpp quantizes K
// with the same q8_0 as weights). The forward stores a whole slot row (n_head_kv * head_dim values)
// at once, so with head dim 16 or 8 one block holds 2 or 4 heads' values. FP8 never reaches here
// (check_batch refuses it).
void kv_store_row(KvDtype t, const float* x, uint8_t* dst, int n) {
    switch (t) {
        case KvDtype::F32: std::memcpy(dst, x, (size_t)n * 4); return;
        case KvDtype::F16: to_f16(x, reinterpret_cast<uint16_t*>(dst), n); return;
        case KvDtype::BF16:
            for (int i = 0; i < n; i++) reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(x[i]);
            return;
        case KvDtype::Q8_0: quantize_row_q8_0(x, reinterpret_cast<BlockQ8_0*>(dst), n); return;
        case KvDtype::Q4_0: quantize_row_q4_0(x, reinterpret_cast<BlockQ4_0*>(dst), n); return;
        case KvDtype::FP8_E4M3: break;
    }
}

// One KV row back to F32 (the prefill gather). The types that have only an axpy kernel take it with
// a = 1 over zeros: 1 * d * q + 0 is d * q exactly, the dequantized value.
void kv_load_row(KvDtype t, const uint8_t* src, float* y, int n) {
    switch (t) {
        case KvDtype::F32: std::memcpy(y, src, (size_t)n * 4); return;
        case KvDtype::F16: from_f16(reinterpret_cast<const uint16_t*>(src), y, n); return;
        default: break;
    }
    std::fill(y, y + n, 0.0f);
    if (t == KvDtype::BF16) axpy_bf16(1.0f, reinterpret_cast<const uint16_t*>(src), y, n);
    if (t == KvDtype::Q8_0) axpy_q8_0(1.0f, src, y, n);
    if (t == KvDtype::Q4_0) axpy_q4_0(1.0f, src, y, n);
}

// Code j of a block (value = d * code).
inline int kv_code(const BlockQ8_0& b, int j) { return b.qs[j]; }
inline int kv_code(const BlockQ4_0& b, int j) { return (j < 16 ? b.qs[j] & 0x0f : b.qs[j - 16] >> 4) - 8; }

// Values [off, off + n) of the blocks from b on, to F32: d * code, the dequantized value (what the
// axpy kernels give with a = 1).
template <class Block>
void kv_load_span(const Block* b, int off, float* y, int n) {
    for (; n > 0; b++, off = 0) {
        const float d = f16_to_f32(b->d);
        const int m = std::min(n, 32 - off);
        for (int j = 0; j < m; j++) y[j] = d * (float)kv_code(*b, off + j);
        y += m, n -= m;
    }
}

// Values [first, first + n) of a slot row back to F32, for any head row of any type: for the block
// types a head row shorter than a block (head dim 16, 8) starts inside block first / 32.
void kv_load(KvDtype t, const uint8_t* slot, int64_t first, float* y, int n) {
    const int be = kv_dtype_block_elems(t);
    if (be == 1) return kv_load_row(t, slot + kv_row_bytes(t, first), y, n);
    const int off = (int)(first % be);
    if (off == 0 && n % be == 0) return kv_load_row(t, slot + kv_row_bytes(t, first), y, n);
    if (t == KvDtype::Q8_0) return kv_load_span(reinterpret_cast<const BlockQ8_0*>(slot) + first / be, off, y, n);
    kv_load_span(reinterpret_cast<const BlockQ4_0*>(slot) + first / be, off, y, n);
}

// q . row and y += a * row over one KV head row, per type (the F32 and F16 cases first: the branch
// is the same every call of a step, so it predicts).
inline float kv_dot(KvDtype t, const float* q, const uint8_t* row, int n) {
    switch (t) {
        case KvDtype::F32: return dot_f32(q, reinterpret_cast<const float*>(row), n);
        case KvDtype::F16: return dot_f16(q, reinterpret_cast<const uint16_t*>(row), n);
        case KvDtype::BF16: return dot_bf16(q, reinterpret_cast<const uint16_t*>(row), n);
        case KvDtype::Q8_0: return dot_q8_0(q, row, n);
        case KvDtype::Q4_0: return dot_q4_0(q, row, n);
        case KvDtype::FP8_E4M3: break;
    }
    return 0.0f;
}
inline void kv_axpy(KvDtype t, float a, const uint8_t* row, float* y, int n) {
    switch (t) {
        case KvDtype::F32: axpy_f32(a, reinterpret_cast<const float*>(row), y, n); return;
        case KvDtype::F16: axpy_f16(a, reinterpret_cast<const uint16_t*>(row), y, n); return;
        case KvDtype::BF16: axpy_bf16(a, reinterpret_cast<const uint16_t*>(row), y, n); return;
        case KvDtype::Q8_0: axpy_q8_0(a, row, y, n); return;
        case KvDtype::Q4_0: axpy_q4_0(a, row, y, n); return;
        case KvDtype::FP8_E4M3: return;
    }
}

// Below this many new tokens a sequence's attention goes token by token (decode, speculation);
// at or above it, as matrix products over keys gathered once (prefill chunks).
constexpr int kAttnBlockMin = 8;

// One sequence's new tokens [b, e) against one KV head g, as matrix products: the head's keys and
// values over the sequence's n_slots slots are gathered once into F32 [n_slots][hd] (not once per
// token and query head), then for each of the gqa query heads sharing g: S = scale Q K^T
// [n_new][n_slots], each row's softmax over that token's visible slots (vis), out = S V.
// sinks (gpt-oss; nullptr: none): per query head a logit that joins the softmax's max and sum (as
// ggml's soft_max with sinks) and adds no value.
void attend_block(const KvStorage& kv, int l, std::span<const int32_t> block_table, int n_slots, int g, int hd,
                  int gqa, float scale, float softcap, const float* sinks, const float* q, float* att, int ld, int b,
                  int e, const std::vector<int>& vis, const std::vector<int>& vis_off) {
    thread_local std::vector<float> keys, vals, sc, row;
    const int n_new = e - b, bs = kv.config().block_size;
    const KvDtype tk = kv.config().dtype_k, tv = kv.config().dtype_v;
    keys.resize((size_t)n_slots * hd);  // [n_slots][hd]
    vals.resize((size_t)n_slots * hd);  // [n_slots][hd]
    const int64_t first = (int64_t)g * hd;  // the head's values start at this element of the slot row
    for (int s = 0; s < n_slots; s++) {
        kv_load(tk, kv.k_slot(l, block_table[s / bs], s % bs), first, keys.data() + (size_t)s * hd, hd);
        kv_load(tv, kv.v_slot(l, block_table[s / bs], s % bs), first, vals.data() + (size_t)s * hd, hd);
    }
    sc.resize((size_t)n_new * n_slots);  // [n_new][n_slots]
    row.resize((size_t)n_slots);
    for (int j = 0; j < gqa; j++) {
        const int64_t col = (int64_t)(g * gqa + j) * hd;  // this query head's columns in q and att
        gemm_f32(true, n_new, n_slots, hd, scale, q + (int64_t)b * ld + col, ld, keys.data(), hd, sc.data(), n_slots);
        for (int i = 0; i < n_new; i++) {
            float* si = sc.data() + (size_t)i * n_slots;
            const int* vs = vis.data() + vis_off[b + i];
            const int n_vis = vis_off[b + i + 1] - vis_off[b + i];
            if (n_vis == 0) {
                std::fill(si, si + n_slots, 0.0f);
                continue;
            }
            if (softcap == 0.0f && vs[n_vis - 1] == n_vis - 1) {
                // The visible slots are 0 .. n_vis - 1 (vis is ascending, no repeats): a causal
                // prefill's, without a tree mask or a window. The softmax in place, the rest 0
                // (the serving model's 512- and 1024-token prefill, against the gather below,
                // alternating in one process, AMD EPYC Zen 4: 1.01x, the same logits).
                const float inv = softmax_inv_sum(si, n_vis, *std::max_element(si, si + n_vis),
                                                  sinks ? sinks[g * gqa + j] : -INFINITY);
                for (int k = 0; k < n_vis; k++) si[k] *= inv;
                std::fill(si + n_vis, si + n_slots, 0.0f);
                continue;
            }
            float mx = -INFINITY;  // softmax over the visible slots only; the others get weight 0
            for (int k = 0; k < n_vis; k++) mx = std::max(mx, row[k] = softcap > 0.0f ? soft_cap(si[vs[k]], softcap) : si[vs[k]]);
            const float inv = softmax_inv_sum(row.data(), n_vis, mx, sinks ? sinks[g * gqa + j] : -INFINITY);
            std::fill(si, si + n_slots, 0.0f);
            for (int k = 0; k < n_vis; k++) si[vs[k]] = row[k] * inv;
        }
        gemm_f32(false, n_new, hd, n_slots, 1.0f, sc.data(), n_slots, vals.data(), hd, att + (int64_t)b * ld + col, ld);
    }
}

}  // namespace

Expected<int> check_batch(const ModelParams& p, const KvConfig& kc, int n_layers, int max_tokens,
                          std::span<const SeqInput> batch) {
    if (kc.n_layer != n_layers || kc.n_head_kv != p.n_head_kv || kc.head_dim != p.head_dim)
        return make_error("KV storage shape (layers ", std::to_string(kc.n_layer), ", kv heads ",
                          std::to_string(kc.n_head_kv), ", head dim ", std::to_string(kc.head_dim),
                          ") does not match the model's (layers run ", std::to_string(n_layers), ", kv heads ",
                          std::to_string(p.n_head_kv), ", head dim ", std::to_string(p.head_dim),
                          "); size the KV storage for this forward");
    if (auto ok = check_kv_types(kc, false); !ok) return ok.error();
    int n_out = 0;
    int64_t n_tok = 0;
    for (size_t s = 0; s < batch.size(); s++) {
        const SeqInput& in = batch[s];
        const int n = (int)in.tokens.size();
        const std::string who = "sequence " + std::to_string(s) + " of the batch";
        if (in.n_past < 0) return make_error(who, ": n_past is negative (", std::to_string(in.n_past), ")");
        if (!in.positions.empty() && (int)in.positions.size() != n)
            return make_error(who, ": ", std::to_string(in.positions.size()), " positions for ", std::to_string(n), " tokens");
        if (!in.mask.empty() && (int64_t)in.mask.size() != (int64_t)n * n)
            return make_error(who, ": attention mask has ", std::to_string(in.mask.size()), " entries, expected ",
                              std::to_string((int64_t)n * n), " (n_new x n_new)");
        const int64_t n_slots = (int64_t)in.n_past + n;
        const int64_t need_blocks = (n_slots + kc.block_size - 1) / kc.block_size;
        if ((int64_t)in.block_table.size() < need_blocks)
            return make_error(who, ": block table has ", std::to_string(in.block_table.size()), " blocks but ",
                              std::to_string(n_slots), " slots need ", std::to_string(need_blocks));
        for (int64_t b = 0; b < need_blocks; b++)
            if (in.block_table[b] < 0 || in.block_table[b] >= kc.n_blocks)
                return make_error(who, ": block id ", std::to_string(in.block_table[b]), " is outside the pool of ",
                                  std::to_string(kc.n_blocks), " blocks");
        for (int i = 0; i < n; i++) {
            if (in.tokens[i] < 0 || in.tokens[i] >= p.n_vocab)
                return make_error(who, ": token id ", std::to_string(in.tokens[i]), " is outside the vocabulary of ",
                                  std::to_string(p.n_vocab));
            const int pos = in.positions.empty() ? in.n_past + i : in.positions[i];
            if (pos < 0 || pos >= p.n_ctx_train)
                return make_error(who, ": position ", std::to_string(pos), " is past the model's context of ",
                                  std::to_string(p.n_ctx_train),
                                  " tokens; shorten the prompt or max_tokens");
        }
        n_tok += n;
        n_out += in.logits == LogitsMode::ALL ? n : (in.logits == LogitsMode::LAST && n > 0 ? 1 : 0);
    }
    if (n_tok > max_tokens)
        return make_error("batch of ", std::to_string(n_tok), " tokens exceeds this backend's max of ",
                          std::to_string(max_tokens), "; split it into chunks");
    return n_out;
}

void CpuForward::moe_ffn(const LayerWeights& L, int n_tok) {
    const ModelParams& p = model_.params();
    const int E = p.n_embd, X = p.n_expert, K = p.n_expert_used, F = p.n_ff_exp;
    router_.resize((size_t)n_tok * X);
    matmul(L.ffn_gate_inp, xn_.data(), n_tok, router_.data(), pool_);  // [n_tok][n_expert]
    add_bias(router_.data(), L.ffn_gate_inp_b, X, n_tok);
    // Each token's experts: the K largest softmax probabilities (llama.cpp's build_moe_ffn with
    // SOFTMAX gating and norm_w), renormalized to sum to 1 (the sum clamped at F16's smallest normal);
    // gpt-oss (SOFTMAX_WEIGHT, no norm_w): the K largest logits, weighted by a softmax over those K.
    auto& by_expert = moe_groups_;  // expert -> (token, weight); emptied, capacity kept across steps
    by_expert.resize((size_t)X);
    for (auto& g : by_expert) g.clear();
    std::vector<int>& order = moe_order_;
    std::vector<float>& prob = moe_prob_;
    order.resize((size_t)X);
    prob.resize((size_t)X);
    for (int t = 0; t < n_tok; t++) {
        const float* r = router_.data() + (size_t)t * X;
        if (p.moe_softmax_after_topk) {
            for (int e = 0; e < X; e++) order[(size_t)e] = e;
            std::partial_sort(order.begin(), order.begin() + K, order.end(),
                              [&](int a, int b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
            const float top = r[order[0]];
            double sum = 0;
            for (int k = 0; k < K; k++) sum += (prob[(size_t)k] = std::exp(r[order[(size_t)k]] - top));
            for (int k = 0; k < K; k++) by_expert[(size_t)order[(size_t)k]].push_back({t, (float)(prob[(size_t)k] / sum)});
            continue;
        }
        const float mx = *std::max_element(r, r + X);
        double sum = 0;
        for (int e = 0; e < X; e++) sum += (prob[(size_t)e] = std::exp(r[e] - mx));
        for (int e = 0; e < X; e++) prob[(size_t)e] = (float)(prob[(size_t)e] / sum);
        for (int e = 0; e < X; e++) order[(size_t)e] = e;
        std::partial_sort(order.begin(), order.begin() + K, order.end(),
                          [&](int a, int b) { return prob[(size_t)a] > prob[(size_t)b] || (prob[(size_t)a] == prob[(size_t)b] && a < b); });
        float wsum = 0;
        for (int k = 0; k < K; k++) wsum += prob[(size_t)order[(size_t)k]];
        wsum = std::max(wsum, 6.103515625e-5f);
        for (int k = 0; k < K; k++) by_expert[(size_t)order[(size_t)k]].push_back({t, prob[(size_t)order[(size_t)k]] / wsum});
    }
    std::fill(tmp_.begin(), tmp_.begin() + (size_t)n_tok * E, 0.0f);
    for (int e = 0; e < X; e++) {
        const auto& group = by_expert[(size_t)e];
        const int n = (int)group.size();
        if (n == 0) continue;  // an expert no token chose is never read
        moe_x_.resize((size_t)n * E);
        moe_g_.resize((size_t)n * F);
        moe_u_.resize((size_t)n * F);
        moe_d_.resize((size_t)n * E);
        for (int i = 0; i < n; i++)
            std::memcpy(moe_x_.data() + (size_t)i * E, xn_.data() + (size_t)group[(size_t)i].first * E, (size_t)E * 4);
        const WeightView eg = expert_matrix(L.gate_exps, e, X), eu = expert_matrix(L.up_exps, e, X);
        const MatmulOut gate_up[] = {{&eg, moe_g_.data()}, {&eu, moe_u_.data()}};
        matmul_many(gate_up, 2, moe_x_.data(), n, pool_);
        add_bias(moe_g_.data(), expert_matrix(L.gate_exps_b, e, X), F, n);
        add_bias(moe_u_.data(), expert_matrix(L.up_exps_b, e, X), F, n);
        if (p.swiglu_oai)
            swiglu_oai(moe_g_.data(), moe_u_.data(), (int64_t)n * F);
        else
            swiglu(moe_g_.data(), moe_u_.data(), (int64_t)n * F);
        matmul(expert_matrix(L.down_exps, e, X), moe_g_.data(), n, moe_d_.data(), pool_);
        add_bias(moe_d_.data(), expert_matrix(L.down_exps_b, e, X), E, n);
        for (int i = 0; i < n; i++) {
            float* y = tmp_.data() + (size_t)group[(size_t)i].first * E;
            const float w = group[(size_t)i].second;
            const float* d = moe_d_.data() + (size_t)i * E;
            for (int c = 0; c < E; c++) y[c] += w * d[c];
        }
    }
}

Expected<bool> CpuForward::forward(KvStorage& kv, std::span<const SeqInput> batch, std::vector<float>& logits) {
    return run(kv, batch, &logits, nullptr);
}

Expected<bool> CpuForward::hidden_states(KvStorage& kv, std::span<const SeqInput> batch, std::vector<float>& hidden) {
    return run(kv, batch, nullptr, &hidden);
}

Expected<bool> CpuForward::run(KvStorage& kv, std::span<const SeqInput> batch, std::vector<float>* logits,
                               std::vector<float>* hidden) {
    const ModelParams& p = model_.params();
    const ModelWeights& W = model_.weights();
    const KvConfig& kc = kv.config();
    // ---- validate everything before touching the KV
    auto checked = check_batch(p, kc, n_layers_, max_tokens_, batch);
    if (!checked) return checked.error();
    const int n_out = *checked;
    std::vector<TokenRef> refs;
    for (size_t s = 0; s < batch.size(); s++) {
        const SeqInput& in = batch[s];
        for (int i = 0; i < (int)in.tokens.size(); i++)
            refs.push_back({(int)s, i, in.positions.empty() ? in.n_past + i : in.positions[i], in.n_past + i});
    }
    const int n_tok = (int)refs.size();
    if (logits) logits->assign((size_t)n_out * p.n_vocab, 0.0f);
    if (hidden) hidden->clear();
    if (n_tok == 0) return true;

    const int E = p.n_embd, HD = p.head_dim, NH = p.n_head, NKV = p.n_head_kv;
    const int QD = NH * HD, KVD = NKV * HD;
    const KvDtype tk = kc.dtype_k, tv = kc.dtype_v;

    // ---- RoPE tables: [n_tok][n_rot/2] cos and sin, angles in double so long positions stay exact
    const int half = p.n_rot / 2;
    // The tables of layer l's RoPE: theta_i = pos * inv_freq_i (pow once per i, not per token), cos and
    // sin times YaRN's magnitude (1 without it).
    auto rope_tables = [&](int l, std::vector<float>& cs, std::vector<float>& sn) {
        std::vector<double> inv_freq(half);
        for (int i = 0; i < half; i++) inv_freq[i] = p.rope_inv_freq(i, l);
        const float msc = p.rope_mscale();
        cs.resize((size_t)n_tok * half);
        sn.resize((size_t)n_tok * half);
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < half; i++) {
                const double theta = refs[t].pos * inv_freq[i];
                cs[(size_t)t * half + i] = (float)std::cos(theta) * msc;
                sn[(size_t)t * half + i] = (float)std::sin(theta) * msc;
            }
    };
    std::vector<float> rcos, rsin;
    rope_tables(-1, rcos, rsin);  // the full layers' (layer -1 is never a window layer)
    // Sliding-window layers with a RoPE of their own (Gemma 3: base 10000 beside the full layers' 1e6).
    int first_swa = -1;
    for (int l = 0; l < n_layers_ && first_swa < 0; l++)
        if (p.is_swa(l)) first_swa = l;
    std::vector<float> rcos_swa, rsin_swa;
    if (first_swa >= 0 && (p.rope_freq_base_swa != p.rope_freq_base || p.rope_freq_scale_swa != p.rope_freq_scale))
        rope_tables(first_swa, rcos_swa, rsin_swa);

    // ---- embeddings
    float* x = x_.data();  // [n_tok][E]
    for (int t = 0; t < n_tok; t++) {
        const SeqInput& in = batch[refs[t].seq];
        dequantize_row(W.tok_embd.type, W.tok_embd.row(in.tokens[refs[t].i]), x + (int64_t)t * E, E);
        if (p.embd_scale != 1.0f)
            for (int e = 0; e < E; e++) x[(int64_t)t * E + e] *= p.embd_scale;
    }

    // First token index of each sequence in refs.
    std::vector<int> seq_start(batch.size() + 1, 0);
    for (size_t s = 0; s < batch.size(); s++) seq_start[s + 1] = seq_start[s] + (int)batch[s].tokens.size();

    // Visible slots per new token: [0, n_past) and the new slots its mask allows (causal by
    // default). The same for every layer and head, so built once: vis[vis_off[t] .. vis_off[t+1]).
    std::vector<int> vis, vis_off(n_tok + 1, 0);
    for (int t = 0; t < n_tok; t++) {
        const TokenRef& r = refs[t];
        const SeqInput& in = batch[r.seq];
        const int n_new = (int)in.tokens.size();
        for (int s = 0; s < in.n_past; s++) vis.push_back(s);
        for (int j = 0; j < n_new; j++) {
            const bool ok = in.mask.empty() ? j <= r.i : in.mask[(size_t)r.i * n_new + j] != 0;
            if (ok) vis.push_back(in.n_past + j);
        }
        vis_off[t + 1] = (int)vis.size();
    }
    // The same for the sliding-window layers: only keys at positions > the query's - n_swa (llama.cpp's
    // is_masked_swa). A committed slot's position is its index; a new token's, its given position.
    // Slots outside the window are never read by these layers.
    std::vector<int> vis_swa, vis_swa_off;
    if (p.n_swa > 0 && !p.swa_layers.empty()) {
        vis_swa_off.assign(n_tok + 1, 0);
        for (int t = 0; t < n_tok; t++) {
            const TokenRef& r = refs[t];
            const SeqInput& in = batch[r.seq];
            for (int k = vis_off[t]; k < vis_off[t + 1]; k++) {
                const int s = vis[k];
                const int kpos = s < in.n_past ? s : (in.positions.empty() ? s : in.positions[s - in.n_past]);
                if (r.pos - kpos < p.n_swa) vis_swa.push_back(s);
            }
            vis_swa_off[t + 1] = (int)vis_swa.size();
        }
    }

    // Which sequences' attention runs as matrix products (kAttnBlockMin new tokens or more), and
    // the tokens of the others, which attend one by one.
    std::vector<int> block_seqs, single_toks;
    for (size_t s = 0; s < batch.size(); s++) {
        if ((int)batch[s].tokens.size() >= kAttnBlockMin)
            block_seqs.push_back((int)s);
        else
            for (int t = seq_start[s]; t < seq_start[s + 1]; t++) single_toks.push_back(t);
    }
    // The single tokens' visible slots' rows in a layer's K and V (block * block_size + place in
    // the block), token after token (single_toks[i]'s from at_off[i]): the same in every layer, so
    // their attention finds a slot's rows without a block-table look-up and two divisions per slot,
    // layer and pass.
    auto slot_rows = [&](const std::vector<int>& v, const std::vector<int>& off, std::vector<int64_t>& at,
                         std::vector<size_t>& at_off) {
        if (off.empty()) return;
        at_off.assign(single_toks.size() + 1, 0);
        for (size_t i = 0; i < single_toks.size(); i++) {
            const int t = single_toks[i];
            const SeqInput& in = batch[refs[t].seq];
            for (int k = off[t]; k < off[t + 1]; k++)
                at.push_back((int64_t)in.block_table[v[(size_t)k] / kc.block_size] * kc.block_size + v[(size_t)k] % kc.block_size);
            at_off[i + 1] = at.size();
        }
    };
    // The single tokens longest first (their visible slots): the attention's work items are taken
    // in that order, so a long context's token does not start last while the other threads idle.
    // The serving model's decode at 8 sequences, one of 1500 tokens and seven of 150, the long one
    // last in the batch, alternating in one process (AMD EPYC Zen 4, 2 threads): 1.10x and 1.13x;
    // the 110M Q4_K_M model so at 8 sequences 1.14x, at 4 (two head ranges a token) 0.95-1.01x;
    // equal lengths 0.99x; one thread 1.01x. Splitting each token into twice the ranges instead:
    // 0.99x. The same logits either way.
    std::vector<int> single_order(single_toks.size());
    for (size_t i = 0; i < single_order.size(); i++) single_order[i] = (int)i;
    std::stable_sort(single_order.begin(), single_order.end(), [&](int a, int b) {
        return vis_off[single_toks[a] + 1] - vis_off[single_toks[a]] > vis_off[single_toks[b] + 1] - vis_off[single_toks[b]];
    });
    std::vector<int64_t> vis_at, vis_swa_at;
    std::vector<size_t> at_off, at_swa_off;
    slot_rows(vis, vis_off, vis_at, at_off);
    slot_rows(vis_swa, vis_swa_off, vis_swa_at, at_swa_off);

    const float scale = p.attention_scale(), softcap = p.attn_softcap;
    const int bs = kc.block_size;
    const int gqa = NH / NKV;

    for (int l = 0; l < n_layers_; l++) {
        const LayerWeights& L = W.layers[l];
        const bool swa = p.is_swa(l) && !vis_swa_off.empty();
        const std::vector<int>& lvis = swa ? vis_swa : vis;
        const std::vector<int>& lvis_off = swa ? vis_swa_off : vis_off;
        const std::vector<int64_t>& lvis_at = swa ? vis_swa_at : vis_at;
        const std::vector<size_t>& lat_off = swa ? at_swa_off : at_off;
        const std::vector<float>& lcos = swa && !rcos_swa.empty() ? rcos_swa : rcos;
        const std::vector<float>& lsin = swa && !rsin_swa.empty() ? rsin_swa : rsin;
        const float* sinks = L.attn_sinks ? static_cast<const float*>(L.attn_sinks.data) : nullptr;
        // -- attention block
        each_tokens(pool_, n_tok, [&](int t0, int t1) {
            rmsnorm(x + (int64_t)t0 * E, static_cast<const float*>(L.attn_norm.data), p.rms_eps, E, t1 - t0,
                    xn_.data() + (int64_t)t0 * E);
        });
        {  // q [n_tok][QD], k and v [n_tok][KVD]
            const MatmulOut qkv[] = {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}};
            matmul_many(qkv, 3, xn_.data(), n_tok, pool_);
        }
        each_tokens(pool_, n_tok, [&](int t0, int t1) {
            const int n = t1 - t0;
            float* q = q_.data() + (int64_t)t0 * QD;
            float* k = k_.data() + (int64_t)t0 * KVD;
            float* v = v_.data() + (int64_t)t0 * KVD;
            add_bias(q, L.bq, QD, n);
            add_bias(k, L.bk, KVD, n);
            add_bias(v, L.bv, KVD, n);
            norm_heads(q, L.q_norm, p.rms_eps, HD, NH, n);
            norm_heads(k, L.k_norm, p.rms_eps, HD, NKV, n);
            for (int t = t0; t < t1; t++) {
                const float* cs = lcos.data() + (size_t)t * half;
                const float* sn = lsin.data() + (size_t)t * half;
                for (int h = 0; h < NH; h++) rope_head(q_.data() + (int64_t)t * QD + h * HD, cs, sn, p.n_rot, p.rope_type);
                for (int h = 0; h < NKV; h++) rope_head(k_.data() + (int64_t)t * KVD + h * HD, cs, sn, p.n_rot, p.rope_type);
            }
            // Write the new K/V into their slots. KV layout per slot: [n_head_kv][head_dim]. Each
            // token has a slot of its own (the engine gives a step's tokens distinct slots), so the
            // chunks never write the same row.
            for (int t = t0; t < t1; t++) {
                const SeqInput& in = batch[refs[t].seq];
                const int slot = refs[t].slot;
                const int blk = in.block_table[slot / bs];
                // The slot row is whole blocks (check_kv_types): a block type quantizes its KVD values
                // in one call, block by block (head by head when head_dim % 32 == 0; with head dim 16
                // or 8 a block holds 2 or 4 heads).
                kv_store_row(tk, k_.data() + (int64_t)t * KVD, kv.k_slot(l, blk, slot % bs), KVD);
                kv_store_row(tv, v_.data() + (int64_t)t * KVD, kv.v_slot(l, blk, slot % bs), KVD);
            }
        });
        // Attention. Sequences with many new tokens: one work item per (sequence, KV head), as
        // matrix products (attend_block). The other tokens: one work item per (token, KV head)
        // over the token's visible slots; the gqa query heads that share a KV head are done
        // together, so each key and value row is read once per group rather than once per head.
        pool_.parallel_for((int64_t)block_seqs.size() * NKV, [&](int64_t it) {
            const int s = block_seqs[it / NKV], g = (int)(it % NKV);
            const SeqInput& in = batch[s];
            attend_block(kv, l, in.block_table, in.n_past + (int)in.tokens.size(), g, HD, gqa, scale, softcap, sinks,
                         q_.data(), att_.data(), QD, seq_start[s], seq_start[s + 1], lvis, lvis_off);
        });
        // Single tokens: a work item is a token and a range of its KV heads, walked slot by slot so
        // that each slot's keys (then values) for those heads are one contiguous read; walking head
        // by head instead strode through the cache a slot apart (n_head_kv * head_dim elements) per
        // key, ~10% of a 1-thread decode step (110M, F16). Ranges are split finely enough to keep
        // every thread busy at batch 1.
        const int n_single = (int)single_toks.size();
        const int per_tok = n_single == 0 ? 1 : std::clamp((4 * pool_.n_threads() + n_single - 1) / n_single, 1, NKV);
        const int GH = (NKV + per_tok - 1) / per_tok, n_ranges = (NKV + GH - 1) / GH;
        // Head rows that are whole blocks (or one-value types) are read in place by the type's
        // dot / axpy kernel; head rows inside a block (q8_0 / q4_0 with head dim 16 or 8) are
        // dequantized, the range's heads of a slot at once, into F32 first.
        const bool kwhole = kv.k_rows_whole(), vwhole = kv.v_rows_whole();
        const int64_t krb = kwhole ? kv.k_row_bytes() : 0, vrb = vwhole ? kv.v_row_bytes() : 0;  // bytes of one head row
        pool_.parallel_for((int64_t)n_single * n_ranges, [&](int64_t it) {
            thread_local std::vector<float> sc;  // [heads of the range][n_slots] scores over the visible slots
            thread_local std::vector<float> rows;  // [KV heads of the range][HD]: one slot's rows in F32
            const int i_tok = single_order[it / n_ranges];
            const int t = single_toks[i_tok];
            const int g0 = (int)(it % n_ranges) * GH, g1 = std::min(NKV, g0 + GH), nh = (g1 - g0) * gqa;
            const std::span<const int> slots(lvis.data() + lvis_off[t], lvis_off[t + 1] - lvis_off[t]);
            const int64_t* at = lvis_at.data() + lat_off[i_tok];  // slots[k]'s row: k_rows + at[k] * k_slot_bytes
            const uint8_t* k_rows = kv.k_slot(l, 0, 0);
            const uint8_t* v_rows = kv.v_slot(l, 0, 0);
            const int64_t ksb = kv.k_slot_bytes(), vsb = kv.v_slot_bytes();
            const int64_t n_s = (int64_t)slots.size();
            const float* q0 = q_.data() + (int64_t)t * QD + (int64_t)g0 * gqa * HD;  // [nh][HD]
            float* out0 = att_.data() + (int64_t)t * QD + (int64_t)g0 * gqa * HD;    // [nh][HD]
            std::fill(out0, out0 + (int64_t)nh * HD, 0.0f);
            if (slots.empty()) return;
            sc.resize((size_t)(nh * n_s));
            const int n_rv = (g1 - g0) * HD;  // values of the range's KV heads in a slot row
            if (!kwhole || !vwhole) rows.resize((size_t)n_rv);
            // An F16 or F32 cache (F16 is llama.cpp's default, F32 a pool's): 16 slots at a time per
            // head through the many-row kernels, one call per head and group instead of one per head
            // and slot (the calls and their reductions were most of a small model's decode time
            // outside the matmuls).
            const bool f16_rows = tk == KvDtype::F16 && tv == KvDtype::F16 && kwhole && vwhole;
            const bool f32_rows = tk == KvDtype::F32 && tv == KvDtype::F32 && kwhole && vwhole;
            thread_local std::vector<const uint16_t*> ptr;  // f16_rows: [KV heads of the range][16] row pointers
            thread_local std::vector<const float*> ptrf;    // f32_rows: the same
            const int nkv = g1 - g0;
            if (f16_rows) ptr.resize((size_t)nkv * 16);
            if (f32_rows) ptrf.resize((size_t)nkv * 16);
            // The range's key (or value) rows of slots [k0, k0 + cnt) into ptr (or ptrf), and the
            // next 16 slots' rows asked for: a long context's cache comes from memory (8 sequences
            // of 600 slots are ~40 MB for the serving bench's model) and the row kernels, reading a
            // group's rows only as they reach them, waited on each group. Decode of that model at 8
            // sequences from position 600, with and without, alternating in one process (AMD EPYC
            // Zen 3): 1.03x at one thread, 1.07x at two; from position 0 1.02x; the 110M model at
            // one sequence from 300 1.00x.
            // The rows kAttnFarSlots ahead are asked for too, into L2 (locality 2: prefetcht1),
            // the slots entering that window each group (at the first group all of it): the
            // weights a token streams push the cache out of L3 between tokens, and nearer requests
            // alone left most of the attention's time waiting on memory. The 110M Q4_K_M model's
            // decode, alternating in one process (AMD EPYC Zen 4): from position 256 1.07x at one
            // and at two threads, from 0 1.02x (32 and 128 slots ahead within 1%; the same window
            // in L1, or all of a range's rows asked for at its start, 0.99-1.01x).
            constexpr int64_t kAttnFarSlots = 64;
            auto slot_row = [&](bool keys, int64_t k) { return keys ? k_rows + at[k] * ksb : v_rows + at[k] * vsb; };
            auto gather = [&](bool keys, int64_t k0, int cnt) {
                const int64_t rb = keys ? krb : vrb;
                for (int64_t j = k0 + cnt; j < std::min<int64_t>(n_s, k0 + cnt + 16); j++) {
                    const uint8_t* next = slot_row(keys, j) + g0 * rb;
                    for (int64_t b = 0; b < nkv * rb; b += 64) __builtin_prefetch(next + b, 0, 3);
                }
                const int64_t far_end = std::min<int64_t>(n_s, k0 + cnt + kAttnFarSlots);
                for (int64_t j = std::max(k0 + cnt + 16, k0 == 0 ? 0 : far_end - cnt); j < far_end; j++) {
                    const uint8_t* next = slot_row(keys, j) + g0 * rb;
                    for (int64_t b = 0; b < nkv * rb; b += 64) __builtin_prefetch(next + b, 0, 2);
                }
                for (int j = 0; j < cnt; j++) {
                    const uint8_t* base = slot_row(keys, k0 + j) + g0 * rb;
                    for (int g = 0; g < nkv; g++) {
                        if (f16_rows) ptr[(size_t)g * 16 + j] = reinterpret_cast<const uint16_t*>(base + g * rb);
                        else ptrf[(size_t)g * 16 + j] = reinterpret_cast<const float*>(base + g * rb);
                    }
                }
            };
            if (f16_rows || f32_rows) {
                for (int64_t k0 = 0; k0 < n_s; k0 += 16) {
                    const int cnt = (int)std::min<int64_t>(16, n_s - k0);
                    gather(true, k0, cnt);
                    for (int h = 0; h < nh; h++) {
                        float* sh = sc.data() + h * n_s + k0;
                        if (f16_rows) dot_f16_rows(q0 + h * HD, ptr.data() + (h / gqa) * 16, cnt, HD, sh);
                        else dot_f32_rows(q0 + h * HD, ptrf.data() + (h / gqa) * 16, cnt, HD, sh);
                        for (int j = 0; j < cnt; j++) sh[j] *= scale;
                    }
                }
            } else {
                for (int64_t k = 0; k < n_s; k++) {
                    const uint8_t* ks = slot_row(true, k);
                    if (kwhole) {
                        const uint8_t* kp = ks + g0 * krb;
                        for (int h = 0; h < nh; h++)  // query head h of the range reads KV head h / gqa
                            sc[h * n_s + k] = scale * kv_dot(tk, q0 + h * HD, kp + (h / gqa) * krb, HD);
                    } else {
                        kv_load(tk, ks, (int64_t)g0 * HD, rows.data(), n_rv);
                        for (int h = 0; h < nh; h++)
                            sc[h * n_s + k] = scale * dot_f32(q0 + h * HD, rows.data() + (h / gqa) * HD, HD);
                    }
                }
            }
            if (softcap > 0.0f)
                for (int64_t i = 0; i < (int64_t)nh * n_s; i++) sc[(size_t)i] = soft_cap(sc[(size_t)i], softcap);
            for (int h = 0; h < nh; h++) {  // softmax of each head's scores, in place (with its sink)
                float* sj = sc.data() + h * n_s;
                const float inv = softmax_inv_sum(sj, (int)n_s, *std::max_element(sj, sj + n_s),
                                                  sinks ? sinks[g0 * gqa + h] : -INFINITY);
                for (int64_t k = 0; k < n_s; k++) sj[k] *= inv;
            }
            if (f16_rows || f32_rows) {
                for (int64_t k0 = 0; k0 < n_s; k0 += 16) {
                    const int cnt = (int)std::min<int64_t>(16, n_s - k0);
                    gather(false, k0, cnt);
                    for (int h = 0; h < nh; h++) {
                        if (f16_rows) axpy_f16_rows(sc.data() + h * n_s + k0, ptr.data() + (h / gqa) * 16, cnt, HD, out0 + h * HD);
                        else axpy_f32_rows(sc.data() + h * n_s + k0, ptrf.data() + (h / gqa) * 16, cnt, HD, out0 + h * HD);
                    }
                }
            } else {
                for (int64_t k = 0; k < n_s; k++) {
                    const uint8_t* vs = slot_row(false, k);
                    if (vwhole) {
                        const uint8_t* vp = vs + g0 * vrb;
                        for (int h = 0; h < nh; h++) kv_axpy(tv, sc[h * n_s + k], vp + (h / gqa) * vrb, out0 + h * HD, HD);
                    } else {
                        kv_load(tv, vs, (int64_t)g0 * HD, rows.data(), n_rv);
                        for (int h = 0; h < nh; h++)
                            axpy_f32(sc[h * n_s + k], rows.data() + (h / gqa) * HD, out0 + h * HD, HD);
                    }
                }
            }
        });
        matmul(L.wo, att_.data(), n_tok, tmp_.data(), pool_);  // [n_tok][E]
        each_tokens(pool_, n_tok, [&](int t0, int t1) {  // the residual, then the FFN's norm
            const int n = t1 - t0;
            float* o = tmp_.data() + (int64_t)t0 * E;
            float* xt = x + (int64_t)t0 * E;
            add_bias(o, L.bo, E, n);
            if (L.attn_post_norm) rmsnorm(o, static_cast<const float*>(L.attn_post_norm.data), p.rms_eps, E, n, o);
            for (int64_t i = 0; i < (int64_t)n * E; i++) xt[i] += o[i];
            rmsnorm(xt, static_cast<const float*>(L.ffn_norm.data), p.rms_eps, E, n, xn_.data() + (int64_t)t0 * E);
        });

        // -- feed-forward block
        if (p.is_moe()) {
            moe_ffn(L, n_tok);
            each_tokens(pool_, n_tok, [&](int t0, int t1) {
                for (int64_t i = (int64_t)t0 * E; i < (int64_t)t1 * E; i++) x[i] += tmp_[i];
            });
            continue;
        }
        {  // gate and up [n_tok][n_ff]
            const MatmulOut gate_up[] = {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}};
            matmul_many(gate_up, 2, xn_.data(), n_tok, pool_);
        }
        if (p.ffn_gelu) {
            // ggml_vec_geglu_f32, a row of tokens per chunk across the pool.
            pool_.parallel_for(n_tok, [&](int64_t t) {
                geglu_ggml(gate_.data() + t * p.n_ff, up_.data() + t * p.n_ff, p.n_ff);
            });
        } else if (n_tok == 1) {
            swiglu(gate_.data(), up_.data(), p.n_ff);
        } else {  // a row of tokens per chunk across the pool (a prefill's n_tok * n_ff exps)
            pool_.parallel_for(n_tok, [&](int64_t t) { swiglu(gate_.data() + t * p.n_ff, up_.data() + t * p.n_ff, p.n_ff); });
        }
        matmul(L.w_down, gate_.data(), n_tok, tmp_.data(), pool_);  // [n_tok][E]
        each_tokens(pool_, n_tok, [&](int t0, int t1) {
            const int n = t1 - t0;
            float* o = tmp_.data() + (int64_t)t0 * E;
            float* xt = x + (int64_t)t0 * E;
            if (L.ffn_post_norm) rmsnorm(o, static_cast<const float*>(L.ffn_post_norm.data), p.rms_eps, E, n, o);
            for (int64_t i = 0; i < (int64_t)n * E; i++) xt[i] += o[i];
        });
    }

    if (hidden) {  // every token's state after the final norm, no output head
        hidden->resize((size_t)n_tok * E);  // [n_tok][E]
        rmsnorm(x, static_cast<const float*>(W.output_norm.data), p.rms_eps, E, n_tok, hidden->data());
        return true;
    }
    // ---- output head for the rows that want logits, gathered into xn_ [n_out][E]
    if (n_out == 0) return true;
    int o = 0;
    for (size_t s = 0; s < batch.size(); s++) {
        const int b = seq_start[s], e = seq_start[s + 1];
        if (e == b) continue;
        if (batch[s].logits == LogitsMode::ALL) {
            for (int t = b; t < e; t++) std::memcpy(tmp_.data() + (int64_t)(o++) * E, x + (int64_t)t * E, (size_t)E * 4);
        } else if (batch[s].logits == LogitsMode::LAST) {
            std::memcpy(tmp_.data() + (int64_t)(o++) * E, x + (int64_t)(e - 1) * E, (size_t)E * 4);
        }
    }
    rmsnorm(tmp_.data(), static_cast<const float*>(W.output_norm.data), p.rms_eps, E, n_out, xn_.data());
    matmul(W.output, xn_.data(), n_out, logits->data(), pool_);
    if (p.final_softcap > 0.0f)
        for (float& z : *logits) z = soft_cap(z, p.final_softcap);
    return true;
}

}  // namespace steward
