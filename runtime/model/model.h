// A llama-family model loaded from GGUF: hyper-parameters from metadata, weights as views
// into the memory-mapped file in their stored type (never widened in memory).
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/mapping_guard.h"
#include "model/tokenizer.h"

namespace steward {

enum class RopeType {
    NORM,  // rotate adjacent pairs (x[2i], x[2i+1]): GGUF `llama` (llama.cpp permutes Q/K at conversion)
    NEOX,  // rotate halves (x[i], x[i + d/2]): GGUF `qwen2`, `qwen3` and other NeoX-style families
};

struct ModelParams {
    std::string arch;       // general.architecture: llama (Mixtral with experts), mistral, qwen2, qwen3, qwen3moe, gpt-oss, phi3, gemma2, gemma3; bert, nomic-bert
    int n_vocab = 0;
    int n_ctx_train = 0;    // <arch>.context_length
    int n_embd = 0;         // dim
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int n_ff = 0;
    int head_dim = 0;       // n_embd / n_head unless <arch>.attention.key_length says otherwise
    int n_rot = 0;          // <arch>.rope.dimension_count (defaults to head_dim)
    float rms_eps = 1e-5f;  // the norms' epsilon: RMSNorm's, or an encoder's LayerNorm (attention.layer_norm_epsilon)
    float rope_freq_base = 10000.0f;
    // RoPE scaling as llama.cpp reads it: linear (<arch>.rope.scaling.type "linear" or absent, with
    // <arch>.rope.scaling.factor f: every angle times 1 / f), YaRN (type "yarn": see yarn_ext_factor),
    // and per-dimension factors (the `rope_freqs.weight` tensor, [n_rot / 2]: Llama 3.1's long-context
    // scaling, angle i divided by factor i). LongRoPE is refused at load.
    float rope_freq_scale = 1.0f;
    std::vector<float> rope_freq_factors;  // empty: none
    // Phi-3's LongRoPE (the 128k files): two sets of per-pair factors, `rope_factors_long.weight` and
    // `rope_factors_short.weight`; rope_freq_factors is the long set when the context served
    // (n_ctx_train, lowered to a pool's ctx by Model::limit_context) exceeds n_ctx_orig
    // (rope.scaling.original_context_length), else the short one (llama.cpp's get_rope_factors), and
    // cos / sin carry rope.scaling.attn_factor.
    std::vector<float> rope_factors_long, rope_factors_short;
    int n_ctx_orig = 0;
    void choose_rope_factors() {
        if (!rope_factors_long.empty()) rope_freq_factors = n_ctx_train > n_ctx_orig ? rope_factors_long : rope_factors_short;
    }
    // YaRN (ggml's rope_yarn, with llama.cpp's defaults): pair i's angle blends the interpolated one
    // (times freq_scale) and the extrapolated one (unscaled) by ramp_i * yarn_ext_factor, ramp_i
    // falling from 1 to 0 between the correction dims yarn_corr[0..1] (the pairs that turn
    // beta_fast = 32 and beta_slow = 1 times over rope.scaling.original_context_length); cos and sin
    // are multiplied by rope_mscale(). 0: no YaRN.
    float yarn_ext_factor = 0.0f;
    float yarn_corr[2] = {0.0f, 0.0f};
    float rope_attn_factor = 1.0f;  // <arch>.rope.scaling.attn_factor; llama.cpp's yarn_attn_factor folds into it
    float rope_mscale() const {
        return yarn_ext_factor != 0.0f ? rope_attn_factor * (1.0f + 0.1f * std::log(1.0f / rope_freq_scale)) : rope_attn_factor;
    }
    // The angle per position of rotary pair i: base^(-2i / n_rot) * freq_scale / factor_i (YaRN's
    // blend where set). A sliding-window layer (is_swa) of a model with its own window RoPE (Gemma 3)
    // uses rope_freq_base_swa / rope_freq_scale_swa instead (llama.cpp's rule).
    double rope_inv_freq(int i) const { return rope_inv_freq_of(i, rope_freq_base, rope_freq_scale); }
    double rope_inv_freq(int i, int layer) const {
        if (!is_swa(layer)) return rope_inv_freq(i);
        return rope_inv_freq_of(i, rope_freq_base_swa, rope_freq_scale_swa);
    }
    double rope_inv_freq_of(int i, float base, float scale) const {
        const double f = rope_freq_factors.empty() ? 1.0 : (double)rope_freq_factors[(size_t)i];
        const double extrap = std::pow((double)base, -2.0 * i / n_rot) / f;
        if (yarn_ext_factor == 0.0f) return extrap * scale;
        const float y = ((float)i - yarn_corr[0]) / std::max(0.001f, yarn_corr[1] - yarn_corr[0]);
        const double mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * yarn_ext_factor;
        return extrap * scale * (1.0 - mix) + extrap * mix;
    }
    RopeType rope_type = RopeType::NORM;
    // <arch>.pooling_type as written (llama.cpp's values: 0 none, 1 mean, 2 cls, 3 last, 4 rank);
    // -1 when absent. How embeddings pool a sequence (cpu/embed.h embedding_pooling).
    int pooling_type = -1;
    // Encoders (bert, nomic-bert): bidirectional attention (<arch>.attention.causal false), LayerNorm
    // after each residual, no LM head; they embed and never generate (cpu/encoder.h).
    bool causal = true;
    int n_token_types = 0;  // tokenizer.ggml.token_type_count: rows of token_types.weight (encoders)
    bool is_encoder() const { return arch == "bert" || arch == "nomic-bert"; }
    // Gemma 2 / 3 (llama.cpp's gemma2 / gemma3 graphs): the token embedding times sqrt(n_embd), a
    // GeGLU FFN (GELU of the gate, ggml's tanh form), RMSNorms after the attention and FFN branches
    // (LayerWeights attn_post_norm / ffn_post_norm), attention scores times attn_scale and soft-capped
    // (cap * tanh(s / cap), Gemma 2), logits soft-capped the same way, and interleaved sliding-window
    // layers: a query at position p sees keys at positions > p - n_swa only.
    float embd_scale = 1.0f;
    float attn_scale = 0.0f;     // 0: 1 / sqrt(head_dim)
    float attn_softcap = 0.0f;   // 0: none
    float final_softcap = 0.0f;  // 0: none
    bool ffn_gelu = false;       // GeGLU instead of SwiGLU
    int n_swa = 0;               // the window in tokens; 0: every layer attends to the whole context
    std::vector<uint8_t> swa_layers;  // [n_layer]: 1 for a sliding-window layer (empty: none)
    float rope_freq_base_swa = 10000.0f, rope_freq_scale_swa = 1.0f;
    bool is_swa(int layer) const {
        return n_swa > 0 && layer >= 0 && (size_t)layer < swa_layers.size() && swa_layers[(size_t)layer];
    }
    float attention_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt((float)head_dim); }
    // Mixture of experts (qwen3moe; llama with experts: Mixtral): each token's FFN is the weighted sum
    // of n_expert_used of n_expert SwiGLU experts of width n_ff_exp, chosen by the top softmax
    // probabilities of a router (ffn_gate_inp), the chosen probabilities renormalized to sum to 1.
    int n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    bool is_moe() const { return n_expert > 0; }
    // gpt-oss (llama.cpp's openai-moe graph): the router's top-k by logit (with its bias), then a
    // softmax over the k chosen logits (moe_softmax_after_topk; no renormalisation), experts with
    // biases and a clamped SwiGLU (swiglu_oai: gate x = min(g, 7), up y = clamp(u, -7, 7),
    // x * sigmoid(1.702 x) * (y + 1)), an output bias on the attention, and one learned sink logit
    // per head (LayerWeights::attn_sinks) that joins every softmax's denominator and no value.
    bool moe_softmax_after_topk = false;
    bool swiglu_oai = false;
    bool attn_sinks = false;
};

// A weight matrix as stored: ne0 = columns (input dim, contiguous), ne1 = rows (output dim).
struct WeightView {
    GgmlType type = GgmlType::F32;
    const void* data = nullptr;
    int64_t n_cols = 0;  // ne0
    int64_t n_rows = 0;  // ne1
    int64_t row_bytes() const { return ggml_row_bytes(type, n_cols); }
    const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
    explicit operator bool() const { return data != nullptr; }
};

// Bytes of a bound weight; 0 for an absent optional one. By shape, not data: a model from a header
// alone (Model::has_weights() false) has every weight's shape and no data, and the same sizes.
inline int64_t p_bytes(const WeightView& w) { return w.n_rows > 0 && w.n_cols > 0 ? w.row_bytes() * w.n_rows : 0; }

// Expert e's matrix of a stacked expert tensor of n_expert experts.
inline WeightView expert_matrix(const WeightView& w, int e, int n_expert) {
    const int64_t per = w.n_rows / n_expert;
    return WeightView{w.type, w.data ? w.row((int64_t)e * per) : nullptr, w.n_cols, per};
}

struct LayerWeights {
    WeightView attn_norm;                 // [n_embd]
    WeightView wq, wk, wv, wo;            // [n_head*head_dim][n_embd], [n_kv*hd][n_embd] x2, [n_embd][n_head*hd]
    WeightView bq, bk, bv;                // optional biases (qwen2)
    WeightView q_norm, k_norm;            // [head_dim] RMSNorm gains per q / k head before RoPE (qwen3, gemma3)
    WeightView attn_post_norm, ffn_post_norm;  // [n_embd] RMSNorm gains of the branches' outputs (gemma2 / gemma3)
    // Mixture of experts: the router [n_expert][n_embd], and the experts' matrices stacked (GGUF's
    // 3-D tensors as n_expert x n_ff_exp rows, or n_expert x n_embd for down): expert e's matrix is
    // rows [e * per, (e + 1) * per) (expert_matrix).
    WeightView ffn_gate_inp, gate_exps, up_exps, down_exps;
    // gpt-oss: the router's bias [n_expert], the experts' biases ([n_expert][n_ff_exp] x2,
    // [n_expert][n_embd]; expert e's is row e), and the per-head sink logits [n_head].
    WeightView ffn_gate_inp_b, gate_exps_b, up_exps_b, down_exps_b, attn_sinks;
    WeightView ffn_norm;                  // [n_embd]
    WeightView w_gate, w_up, w_down;      // [n_ff][n_embd] x2, [n_embd][n_ff]
    // Encoders (post-norm blocks): biases of the output projection and the FFN, and the LayerNorms
    // (gain, bias) after the attention residual and after the FFN residual.
    WeightView bo, b_up, b_down;
    WeightView attn_out_norm, attn_out_norm_b, layer_out_norm, layer_out_norm_b;
};

struct ModelWeights {
    WeightView tok_embd;     // [n_vocab][n_embd]
    WeightView output_norm;  // [n_embd]
    WeightView output;       // [n_vocab][n_embd]; equals tok_embd when tied
    bool tied_output = false;
    // Encoders: absolute positions (bert; [n_ctx_train][n_embd]), token type 0's row added to every
    // token (optional), and the LayerNorm of the summed input embedding.
    WeightView pos_embd, type_embd, tok_norm, tok_norm_b;
    std::vector<LayerWeights> layers;
};

class Model {
public:
    // Loads hyper-parameters, weights and tokenizer from a GGUF file. Errors name the key or
    // tensor that is missing or malformed.
    static Expected<std::unique_ptr<Model>> load(const std::string& path);
    // Builds from an already parsed file (takes ownership); a mapped file brings its guard.
    static Expected<std::unique_ptr<Model>> from_gguf(std::unique_ptr<GgufFile> file);

    const ModelParams& params() const { return params_; }
    // Serves at most n tokens of context (a pool's ctx): n_ctx_train becomes min(n, trained).
    void limit_context(int n) {
        if (n > 0 && n < params_.n_ctx_train) params_.n_ctx_train = n;
        params_.choose_rope_factors();
    }
    const ModelWeights& weights() const { return weights_; }
    const Tokenizer& tokenizer() const { return *tokenizer_; }
    const GgufFile& file() const { return *file_; }
    // False for a model built from a header (GgufFile::header_from_bytes): a remote pool's
    // description on the front, with params and tokenizer but no weights to run.
    bool has_weights() const { return !file_->header_only(); }
    // Bytes of weights read per decoded token (every matrix once, one embedding row; of a mixture of
    // experts, the router and n_expert_used of the n_expert experts).
    int64_t weight_bytes_per_token() const;
    int64_t n_params() const;
    // Whether the mapped file is still what was loaded: an error once it was truncated (a fault in
    // the mapping, answered with zero pages) or rewritten in place; sticky. Engines call it after
    // every forward and before accepting a request. Always ok for a model built from memory.
    Expected<bool> check_file() const { return file_->guard() ? file_->guard()->check() : Expected<bool>(true); }

private:
    std::unique_ptr<GgufFile> file_;
    ModelParams params_;
    ModelWeights weights_;
    std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace steward
