// Loading a llama-family model: hyper-parameters from `<arch>.*` metadata, weights as views
// into the mapping, every tensor shape checked against the hyper-parameters.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "model/quants.h"

namespace steward {

namespace {

// Architectures that are the llama block with at most metadata or bias differences.
RopeType rope_type_for(const std::string& arch) {
    static const std::set<std::string> neox = {"qwen2", "qwen3", "qwen", "phi3", "stablelm", "gptneox", "falcon",
                                              "bert",  "nomic-bert", "gemma2", "gemma3", "qwen3moe", "gpt-oss"};
    return neox.count(arch) ? RopeType::NEOX : RopeType::NORM;
}

// llama.cpp writes Mistral, DeepSeek-R1's Llama distills and SmolLM / SmolLM2 as `llama` (their
// tokenizers differ, not the block) and the Qwen distills as `qwen2`; `mistral` is kept for files
// from other converters. qwen3 is qwen2 without the QKV biases, with a per-head RMSNorm on q and k.
// phi3 is the llama block with NeoX RoPE and two fused matrices: attn_qkv (q, k, v rows in that
// order) and ffn_up (the gate's n_ff rows, then up's), bound here as row ranges of those tensors.
// llama.cpp ignores its sliding window (full attention), and so does Steward.
// bert and nomic-bert are encoders (bound by bind_encoder below, run by cpu/encoder.h).
bool arch_supported(const std::string& arch) {
    return arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3" || arch == "phi3" ||
           arch == "gemma2" || arch == "gemma3" || arch == "qwen3moe" || arch == "gpt-oss" || arch == "bert" ||
           arch == "nomic-bert";
}

// Rows [r0, r0 + n) of w (rows are contiguous in every type): a weight fused into a larger tensor.
WeightView rows_of(const WeightView& w, int64_t r0, int64_t n) {
    return WeightView{w.type, w.data ? w.row(r0) : nullptr, w.n_cols, n};
}

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::string& path) {
    // The path must still name the file that was mapped: otherwise the guard may watch one file and
    // the model serve another.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    auto f = GgufFile::open(path);
    if (!f) {
        if (fd >= 0) ::close(fd);
        return f.error();
    }
    struct stat a {}, b {};
    if (fd < 0 || fstat(fd, &a) != 0 || stat(path.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev ||
        a.st_size != b.st_size || (size_t)a.st_size != f.value()->mapped_size()) {
        if (fd >= 0) ::close(fd);
        return make_error("the model file '", path, "' changed while it was being loaded; load it again once it is written");
    }
    ::close(fd);  // the file's own guard (GgufFile::open) watches it from here on
    auto m = from_gguf(std::move(f.value()));
    if (!m) return m.error();
    if (auto ok = m.value()->check_file(); !ok) return ok.error();
    return m;
}

Expected<std::unique_ptr<Model>> Model::from_gguf(std::unique_ptr<GgufFile> file) {
    std::unique_ptr<Model> m(new Model());
    m->file_ = std::move(file);
    const GgufFile& f = *m->file_;
    const std::string& path = f.path();
    ModelParams& p = m->params_;

    auto arch = f.get_string("general.architecture");
    if (!arch) return make_error("'", path, "' has no general.architecture key: it is a vocabulary-only or non-model GGUF");
    p.arch = std::string(*arch);
    if (!arch_supported(p.arch))
        return make_error("'", path, "' is a '", p.arch,
                          "' model; Steward runs the llama family (llama and Mixtral, mistral, qwen2, qwen3, qwen3moe, phi3), "
                          "gpt-oss, gemma2, gemma3 and the encoders bert and nomic-bert");
    auto need_int = [&](const std::string& suffix, int& out) -> Expected<bool> {
        auto v = f.get_int(p.arch + "." + suffix);
        if (!v || *v <= 0 || *v > (1 << 24))
            return make_error("'", path, "': metadata key '", p.arch, ".", suffix,
                              "' is missing or not a positive integer; the file is not a complete model");
        out = (int)*v;
        return true;
    };
    for (auto [k, dst] : {std::pair<const char*, int*>{"context_length", &p.n_ctx_train},
                          {"embedding_length", &p.n_embd},
                          {"block_count", &p.n_layer},
                          {"feed_forward_length", &p.n_ff},
                          {"attention.head_count", &p.n_head}}) {
        auto r = need_int(k, *dst);
        if (!r) return r.error();
    }
    p.n_head_kv = (int)f.get_int(p.arch + ".attention.head_count_kv").value_or(p.n_head);
    if (p.n_head_kv <= 0 || p.n_head % p.n_head_kv != 0)
        return make_error("'", path, "': head_count ", std::to_string(p.n_head), " is not a multiple of head_count_kv ",
                          std::to_string(p.n_head_kv));
    // Qwen3 sets the head size apart from n_embd / n_head (0.6B: 1024 / 16 heads, head size 128).
    const auto key_length = f.get_int(p.arch + ".attention.key_length");
    if (!key_length && p.n_embd % p.n_head != 0)
        return make_error("'", path, "': embedding_length ", std::to_string(p.n_embd), " is not a multiple of head_count ",
                          std::to_string(p.n_head), " and no attention.key_length gives the head size");
    if (key_length && (*key_length <= 0 || *key_length > (1 << 16)))
        return make_error("'", path, "': ", p.arch, ".attention.key_length ", std::to_string(*key_length),
                          " is not a plausible head size");
    p.head_dim = key_length ? (int)*key_length : p.n_embd / p.n_head;
    if (auto v = f.get_int(p.arch + ".attention.value_length"); v && *v != p.head_dim)
        return make_error("'", path, "': ", p.arch, ".attention.value_length ", std::to_string(*v),
                          " differs from key_length ", std::to_string(p.head_dim),
                          "; Steward needs one head size for K and V");
    p.n_rot = (int)f.get_int(p.arch + ".rope.dimension_count").value_or(p.head_dim);
    if (p.head_dim <= 0 || p.head_dim % 2 || p.n_rot <= 0 || p.n_rot > p.head_dim || p.n_rot % 2)
        return make_error("'", path, "': head size ", std::to_string(p.head_dim), " / rope dimension ",
                          std::to_string(p.n_rot), " are inconsistent (both even, rope <= head size)");
    p.rms_eps = p.is_encoder() ? (float)f.get_float(p.arch + ".attention.layer_norm_epsilon").value_or(1e-12)
                               : (float)f.get_float(p.arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5);
    p.causal = f.get_bool(p.arch + ".attention.causal").value_or(true);
    if (p.is_encoder()) {
        auto tt = f.get_int("tokenizer.ggml.token_type_count");
        if (!tt || *tt <= 0 || *tt > (1 << 16))
            return make_error("'", path, "': an encoder needs tokenizer.ggml.token_type_count (a positive count of ",
                              "token types, 1 or 2 for BERT); the file is incomplete: convert it again");
        p.n_token_types = (int)*tt;
    }
    p.rope_freq_base = (float)f.get_float(p.arch + ".rope.freq_base").value_or(10000.0);
    if (!(p.rms_eps > 0) || !(p.rope_freq_base > 0))
        return make_error("'", path, "': rms epsilon and rope freq_base must be positive");
    p.rope_type = rope_type_for(p.arch);
    // RoPE scaling (llama.cpp's rules: the type defaults to linear, a factor of 0 or none is 1).
    const std::string scaling(f.get_string(p.arch + ".rope.scaling.type").value_or("linear"));
    if (scaling != "linear" && scaling != "none" && scaling != "yarn")
        return make_error("'", path, "': ", p.arch, ".rope.scaling.type is '", scaling,
                          "'; Steward implements linear and YaRN RoPE scaling and per-dimension factors (rope_freqs), "
                          "not LongRoPE: use a file without it");
    if (scaling == "linear" || scaling == "yarn") {
        auto factor = f.get_float(p.arch + ".rope.scaling.factor");
        if (!factor) factor = f.get_float(p.arch + ".rope.scale_linear");
        if (factor && *factor != 0.0) {
            if (!(*factor > 0.0) || !std::isfinite(*factor))
                return make_error("'", path, "': ", p.arch, ".rope.scaling.factor must be positive");
            p.rope_freq_scale = (float)(1.0 / *factor);
        }
    }
    if (auto af = f.get_float(p.arch + ".rope.scaling.attn_factor")) {
        if (!(*af > 0.0) || !std::isfinite(*af))
            return make_error("'", path, "': ", p.arch, ".rope.scaling.attn_factor must be positive");
        p.rope_attn_factor = (float)*af;
    }
    if (scaling == "yarn") {
        // llama.cpp's context setup: ext_factor 1, beta_fast 32, beta_slow 1 (its yarn_* keys are
        // written by converters but not read), the correction dims from the original context, and an
        // attention factor that cancels the magnitude scale of get_mscale (so cos / sin carry
        // 1 + 0.1 ln(factor), rope_mscale).
        if (auto lm = f.get_float(p.arch + ".rope.scaling.yarn_log_multiplier"); lm && *lm != 0.0)
            return make_error("'", path, "': ", p.arch, ".rope.scaling.yarn_log_multiplier (DeepSeek's YaRN) is not read "
                              "by Steward; use a file without it");
        const int64_t orig = f.get_int(p.arch + ".rope.scaling.original_context_length").value_or(p.n_ctx_train);
        if (orig <= 0 || orig > (1 << 30))
            return make_error("'", path, "': ", p.arch, ".rope.scaling.original_context_length must be positive");
        p.yarn_ext_factor = 1.0f;
        auto corr_dim = [&](float beta) {
            return (float)p.n_rot * std::log((float)orig / (beta * 2.0f * (float)M_PI)) / (2.0f * std::log(p.rope_freq_base));
        };
        p.yarn_corr[0] = std::max(0.0f, std::floor(corr_dim(32.0f)));
        p.yarn_corr[1] = std::min((float)(p.n_rot - 1), std::ceil(corr_dim(1.0f)));
        const float factor = 1.0f / p.rope_freq_scale;
        const float mscale = factor <= 1.0f ? 1.0f : 0.1f * std::log(factor) + 1.0f;
        p.rope_attn_factor *= mscale * (1.0f / (1.0f + 0.1f * std::log(factor)));
    }
    if (auto v = f.get_int(p.arch + ".pooling_type"); v && *v >= 0 && *v < (1 << 16)) p.pooling_type = (int)*v;
    // Mixture of experts: <arch>.expert_count (llama.cpp reads 1 as none) and expert_used_count;
    // qwen3moe's expert width from expert_feed_forward_length (else n_ff / used), Mixtral's is n_ff.
    if (auto ne = f.get_int(p.arch + ".expert_count"); ne && *ne > 1) {
        if (*ne > 512) return make_error("'", path, "': ", p.arch, ".expert_count ", std::to_string(*ne), " is over 512");
        auto nu = f.get_int(p.arch + ".expert_used_count");
        if (!nu || *nu <= 0 || *nu > *ne)
            return make_error("'", path, "': ", p.arch, ".expert_used_count must be between 1 and expert_count (",
                              std::to_string(*ne), ")");
        if (p.arch != "llama" && p.arch != "mistral" && p.arch != "qwen3moe" && p.arch != "gpt-oss")
            return make_error("'", path, "': ", p.arch, " with experts is not a layout Steward reads (llama / Mixtral, "
                              "qwen3moe and gpt-oss are)");
        p.n_expert = (int)*ne;
        p.n_expert_used = (int)*nu;
        p.n_ff_exp = p.arch == "qwen3moe" || p.arch == "gpt-oss"
                         ? (int)f.get_int(p.arch + ".expert_feed_forward_length").value_or(p.n_ff / p.n_expert_used)
                         : p.n_ff;
        if (p.n_ff_exp <= 0 || p.n_ff_exp > (1 << 20))
            return make_error("'", path, "': the expert FFN width ", std::to_string(p.n_ff_exp), " is not plausible");
        if (auto s = f.get_float(p.arch + ".expert_weights_scale"); s && *s != 0.0 && *s != 1.0)
            return make_error("'", path, "': ", p.arch, ".expert_weights_scale ", std::to_string(*s),
                              " is not read by Steward yet; use a file without it");
    } else if (p.arch == "qwen3moe" || p.arch == "gpt-oss") {
        return make_error("'", path, "': ", p.arch, " needs ", p.arch, ".expert_count > 1 and expert_used_count");
    }
    // Sliding-window layers as llama.cpp's set_swa_pattern lays them out: layer l slides when
    // l % period < period - 1 (period 0: every layer), the family's period unless
    // <arch>.attention.sliding_window_pattern gives one (its per-layer array form is not read); the
    // window layers rotate with base_swa / scale_swa.
    auto set_swa_layers = [&](int64_t period, float base_swa, float scale_swa) -> Expected<bool> {
        if (f.find(p.arch + ".attention.sliding_window_pattern")) {
            auto n = f.get_int(p.arch + ".attention.sliding_window_pattern");
            if (!n)
                return make_error("'", path, "': ", p.arch, ".attention.sliding_window_pattern is a per-layer array, "
                                  "which Steward does not read; use a file with a period");
            if (*n < 0 || *n > (1 << 16))
                return make_error("'", path, "': ", p.arch, ".attention.sliding_window_pattern ", std::to_string(*n),
                                  " is not a period");
            period = *n;
        }
        p.swa_layers.assign((size_t)p.n_layer, 0);
        for (int l = 0; l < p.n_layer; l++) p.swa_layers[(size_t)l] = period == 0 || (l % period) < period - 1;
        p.rope_freq_base_swa = base_swa;
        p.rope_freq_scale_swa = scale_swa;
        if (!(p.rope_freq_base_swa > 0.0f))
            return make_error("'", path, "': ", p.arch, ".rope.freq_base_swa must be positive");
        return true;
    };
    // gpt-oss as llama.cpp's openai-moe graph reads it: every other layer (from the first) a sliding
    // window of attention.sliding_window tokens with the full layers' RoPE (YaRN included), queries
    // scaled by 1 / sqrt(n_rot), sinks, biases, the clamped SwiGLU and softmax-after-top-k gating.
    if (p.arch == "gpt-oss") {
        const auto win = f.get_int(p.arch + ".attention.sliding_window");
        if (!win || *win <= 0 || *win > (1 << 24))
            return make_error("'", path, "': gpt-oss needs ", p.arch, ".attention.sliding_window (a positive window)");
        p.n_swa = (int)*win;
        auto swa = set_swa_layers(2, (float)f.get_float(p.arch + ".rope.freq_base_swa").value_or(p.rope_freq_base),
                                  p.rope_freq_scale);
        if (!swa) return swa.error();
        p.attn_scale = 1.0f / std::sqrt((float)p.n_rot);
        p.attn_sinks = p.swiglu_oai = p.moe_softmax_after_topk = true;
    }
    // Gemma 2 / 3 as llama.cpp's loader reads them (src/models/gemma2.cpp, gemma3.cpp).
    const bool gemma2 = p.arch == "gemma2", gemma3 = p.arch == "gemma3";
    if (gemma2 || gemma3) {
        p.embd_scale = std::sqrt((float)p.n_embd);
        p.ffn_gelu = true;
        // The 27B models scale queries by 1 / sqrt(n_embd / n_head), the others by 1 / sqrt(head size).
        const bool big = p.n_layer == (gemma2 ? 46 : 62);
        p.attn_scale = 1.0f / std::sqrt(big ? (float)(p.n_embd / p.n_head) : (float)p.head_dim);
        if (gemma2) {
            p.attn_softcap = (float)f.get_float(p.arch + ".attn_logit_softcapping").value_or(50.0);
            p.final_softcap = (float)f.get_float(p.arch + ".final_logit_softcapping").value_or(30.0);
        } else {
            p.final_softcap = (float)f.get_float(p.arch + ".final_logit_softcapping").value_or(0.0);
        }
        if (!(p.attn_softcap >= 0.0f) || !(p.final_softcap >= 0.0f) || !std::isfinite(p.attn_softcap) ||
            !std::isfinite(p.final_softcap))
            return make_error("'", path, "': ", p.arch, ".attn_logit_softcapping / final_logit_softcapping must be >= 0");
        // Sliding windows: Gemma 2 always (4096 unless the file says), every other layer from the
        // first; Gemma 3 when the file names a window, 5 of every 6 layers. The pattern key may
        // change the period; its array form (per-layer flags) is not read.
        const auto win = f.get_int(p.arch + ".attention.sliding_window");
        if (win && (*win < 0 || *win > (1 << 24)))
            return make_error("'", path, "': ", p.arch, ".attention.sliding_window ", std::to_string(*win),
                              " is not a window size");
        p.n_swa = gemma2 ? (int)win.value_or(4096) : (int)win.value_or(0);
        if (p.n_swa > 0) {
            auto swa = set_swa_layers(
                gemma2 ? 2 : 6, gemma2 ? p.rope_freq_base : (float)f.get_float(p.arch + ".rope.freq_base_swa").value_or(10000.0),
                gemma2 ? p.rope_freq_scale : 1.0f);
            if (!swa) return swa.error();
        }
    }

    // YaRN's correction dims depend on the RoPE base: computed for the full layers' base only.
    if (p.yarn_ext_factor != 0.0f && !p.swa_layers.empty() && p.rope_freq_base_swa != p.rope_freq_base)
        return make_error("'", path, "': YaRN with a window RoPE base of its own (rope.freq_base_swa) is not read by "
                          "Steward; use a file without rope.freq_base_swa");

    auto tok = Tokenizer::from_gguf(f);
    if (!tok) return make_error("'", path, "': tokenizer: ", tok.error().message);
    m->tokenizer_ = std::move(tok.value());

    const auto* embd = f.find_tensor("token_embd.weight");
    if (!embd) return make_error("'", path, "': tensor 'token_embd.weight' is missing");
    p.n_vocab = (int)embd->ne[1];
    if (p.n_vocab != m->tokenizer_->n_vocab())
        return make_error("'", path, "': token_embd has ", std::to_string(p.n_vocab), " rows but the tokenizer has ",
                          std::to_string(m->tokenizer_->n_vocab()), " tokens");

    // Looks up a tensor and checks its shape: ne0 = cols, ne1 = rows (rows = 1 for vectors).
    auto get = [&](const std::string& name, int64_t cols, int64_t rows, bool required,
                   WeightView& out) -> Expected<bool> {
        const auto* t = f.find_tensor(name);
        if (!t) {
            if (required) return make_error("'", path, "': tensor '", name, "' is missing");
            return true;
        }
        const bool is_vec = rows == 1;
        if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1 || (is_vec && t->n_dims != 1))
            return make_error("'", path, "': tensor '", name, "' has shape [", std::to_string(t->ne[0]), ", ",
                              std::to_string(t->ne[1]), "], expected [", std::to_string(cols),
                              is_vec ? "" : ", " + std::to_string(rows), "] from the metadata");
        const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;  // gpt-oss's experts' are 2-D
        if ((is_vec || bias) && t->type != GgmlType::F32)
            return make_error("'", path, "': ", is_vec ? "vector tensor '" : "tensor '", name, "' is ",
                              ggml_type_name((uint32_t)t->type), "; norms and biases must be F32");
        out = WeightView{t->type, t->data, cols, rows};
        return true;
    };
    // A stack of n matrices [n][rows][cols] (the experts' 3-D tensors), bound as n * rows rows.
    auto get3 = [&](const std::string& name, int64_t cols, int64_t rows, int64_t n, WeightView& out) -> Expected<bool> {
        const auto* t = f.find_tensor(name);
        if (!t) return make_error("'", path, "': tensor '", name, "' is missing");
        if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n || t->ne[3] != 1)
            return make_error("'", path, "': tensor '", name, "' has shape [", std::to_string(t->ne[0]), ", ",
                              std::to_string(t->ne[1]), ", ", std::to_string(t->ne[2]), "], expected [",
                              std::to_string(cols), ", ", std::to_string(rows), ", ", std::to_string(n),
                              "] from the metadata");
        out = WeightView{t->type, t->data, cols, rows * n};
        return true;
    };
    const int64_t E = p.n_embd, Q = (int64_t)p.n_head * p.head_dim, KV = (int64_t)p.n_head_kv * p.head_dim;
    ModelWeights& w = m->weights_;
    Expected<bool> r = get("token_embd.weight", E, p.n_vocab, true, w.tok_embd);
    if (r && !p.is_encoder()) r = get("output_norm.weight", E, 1, true, w.output_norm);
    // Gemma 2's head is always the token embedding (llama.cpp reads no output.weight for it).
    if (r && !p.is_encoder() && p.arch != "gemma2") r = get("output.weight", E, p.n_vocab, false, w.output);
    if (!r) return r.error();
    if (!w.output && !p.is_encoder()) {
        w.output = w.tok_embd;
        w.tied_output = true;
    }
    // Per-dimension RoPE factors (Llama 3.1 and later: llama.cpp's converter writes them as a tensor).
    if (const auto* rf = f.find_tensor("rope_freqs.weight")) {
        if (rf->type != GgmlType::F32 || rf->n_dims != 1 || rf->ne[0] != p.n_rot / 2)
            return make_error("'", path, "': tensor 'rope_freqs.weight' must be F32 [", std::to_string(p.n_rot / 2),
                              "] (one factor per rotary pair)");
        if (rf->data) {
            p.rope_freq_factors.assign(reinterpret_cast<const float*>(rf->data),
                                       reinterpret_cast<const float*>(rf->data) + p.n_rot / 2);
            for (float x : p.rope_freq_factors)
                if (!(x > 0.0f) || !std::isfinite(x))
                    return make_error("'", path, "': tensor 'rope_freqs.weight' holds ", std::to_string(x),
                                      "; RoPE factors must be positive and finite");
        }
    }
    // Phi-3's long-context files (128k) scale RoPE per dimension (LongRoPE): a long and a short set of
    // factors, chosen by the context served (ModelParams::choose_rope_factors). llama.cpp reads them
    // for phi3 only; another architecture carrying them is refused rather than run without them.
    p.n_ctx_orig = (int)std::clamp<int64_t>(f.get_int(p.arch + ".rope.scaling.original_context_length").value_or(p.n_ctx_train),
                                            1, 1 << 30);
    for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
        const auto* rf = f.find_tensor(name);
        if (!rf) continue;
        if (p.arch != "phi3")
            return make_error("'", path, "' scales RoPE per dimension (LongRoPE, tensor '", name, "'), which Steward "
                              "reads for phi3 only (as llama.cpp does); use a file without it");
        if (!p.rope_freq_factors.empty())
            return make_error("'", path, "' carries both rope_freqs.weight and LongRoPE factors ('", name,
                              "'); use a file with one of them");
        if (rf->type != GgmlType::F32 || rf->n_dims != 1 || rf->ne[0] != p.n_rot / 2)
            return make_error("'", path, "': tensor '", name, "' must be F32 [", std::to_string(p.n_rot / 2),
                              "] (one factor per rotary pair)");
        if (!rf->data) continue;
        std::vector<float>& dst = std::string(name) == "rope_factors_long.weight" ? p.rope_factors_long : p.rope_factors_short;
        dst.assign(reinterpret_cast<const float*>(rf->data), reinterpret_cast<const float*>(rf->data) + p.n_rot / 2);
        for (float x : dst)
            if (!(x > 0.0f) || !std::isfinite(x))
                return make_error("'", path, "': tensor '", name, "' holds ", std::to_string(x),
                                  "; RoPE factors must be positive and finite");
    }
    if (p.rope_factors_long.empty() != p.rope_factors_short.empty())
        return make_error("'", path, "': LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight; ",
                          "the file has one of them: convert it again");
    p.choose_rope_factors();
    if (p.is_encoder()) {
        // llama.cpp's bert / nomic-bert tensors: absolute positions (bert) or RoPE (nomic-bert), the
        // input LayerNorm, and post-norm blocks with q/k/v (or fused qkv), biases where present, a
        // GELU FFN (bert) or SwiGLU (nomic-bert).
        const bool rotary = p.arch == "nomic-bert";
        if (!rotary) r = get("position_embd.weight", E, p.n_ctx_train, true, w.pos_embd);
        if (r) r = get("token_types.weight", E, p.n_token_types, false, w.type_embd);
        if (r) r = get("token_embd_norm.weight", E, 1, true, w.tok_norm);
        if (r) r = get("token_embd_norm.bias", E, 1, true, w.tok_norm_b);
        if (r && w.type_embd && w.type_embd.type != GgmlType::F32 && w.type_embd.type != GgmlType::F16)
            return make_error("'", path, "': tensor 'token_types.weight' is ", ggml_type_name((uint32_t)w.type_embd.type),
                              "; Steward reads token type rows in F32 or F16");
        w.layers.reserve(std::min<size_t>((size_t)p.n_layer, f.tensors().size()));
        for (int l = 0; l < p.n_layer && r; l++) {
            LayerWeights& L = w.layers.emplace_back();
            const std::string b = "blk." + std::to_string(l) + ".";
            if (f.find_tensor(b + "attn_qkv.weight")) {
                WeightView qkv;
                r = get(b + "attn_qkv.weight", E, Q + 2 * KV, true, qkv);
                if (r && f.find_tensor(b + "attn_qkv.bias"))
                    return make_error("'", path, "': tensor '", b, "attn_qkv.bias' (a fused QKV bias) is not read by ",
                                      "Steward yet; convert the model with separate attn_q / attn_k / attn_v biases");
                if (r) {
                    L.wq = rows_of(qkv, 0, Q);
                    L.wk = rows_of(qkv, Q, KV);
                    L.wv = rows_of(qkv, Q + KV, KV);
                }
            } else {
                r = get(b + "attn_q.weight", E, Q, true, L.wq);
                if (r) r = get(b + "attn_k.weight", E, KV, true, L.wk);
                if (r) r = get(b + "attn_v.weight", E, KV, true, L.wv);
            }
            if (r) r = get(b + "attn_q.bias", Q, 1, false, L.bq);
            if (r) r = get(b + "attn_k.bias", KV, 1, false, L.bk);
            if (r) r = get(b + "attn_v.bias", KV, 1, false, L.bv);
            if (r) r = get(b + "attn_output.weight", Q, E, true, L.wo);
            if (r) r = get(b + "attn_output.bias", E, 1, false, L.bo);
            if (r) r = get(b + "attn_output_norm.weight", E, 1, true, L.attn_out_norm);
            if (r) r = get(b + "attn_output_norm.bias", E, 1, true, L.attn_out_norm_b);
            if (r) r = get(b + "ffn_up.weight", E, p.n_ff, true, L.w_up);
            if (r) r = get(b + "ffn_up.bias", p.n_ff, 1, false, L.b_up);
            if (r) r = get(b + "ffn_gate.weight", E, p.n_ff, rotary, L.w_gate);
            if (r) r = get(b + "ffn_down.weight", p.n_ff, E, true, L.w_down);
            if (r) r = get(b + "ffn_down.bias", E, 1, false, L.b_down);
            if (r) r = get(b + "layer_output_norm.weight", E, 1, true, L.layer_out_norm);
            if (r) r = get(b + "layer_output_norm.bias", E, 1, true, L.layer_out_norm_b);
        }
        if (!r) return r.error();
    }
    // Grown layer by layer: a hostile block_count (up to 2^24) must not allocate gigabytes before
    // the first missing tensor is noticed (found by fuzz_gguf).
    if (!p.is_encoder()) w.layers.reserve(std::min<size_t>((size_t)p.n_layer, f.tensors().size()));
    for (int l = 0; l < p.n_layer && r && !p.is_encoder(); l++) {
        LayerWeights& L = w.layers.emplace_back();
        const std::string b = "blk." + std::to_string(l) + ".";
        r = get(b + "attn_norm.weight", E, 1, true, L.attn_norm);
        const bool fused = p.arch == "phi3", oss = p.arch == "gpt-oss";
        if (fused) {
            WeightView qkv;
            if (r) r = get(b + "attn_qkv.weight", E, Q + 2 * KV, true, qkv);
            if (r) {
                L.wq = rows_of(qkv, 0, Q);
                L.wk = rows_of(qkv, Q, KV);
                L.wv = rows_of(qkv, Q + KV, KV);
            }
        } else {
            if (r) r = get(b + "attn_q.weight", E, Q, true, L.wq);
            if (r) r = get(b + "attn_k.weight", E, KV, true, L.wk);
            if (r) r = get(b + "attn_v.weight", E, KV, true, L.wv);
        }
        if (r) r = get(b + "attn_output.weight", Q, E, true, L.wo);
        if (r) r = get(b + "attn_output.bias", E, 1, oss, L.bo);
        if (r) r = get(b + "attn_sinks.weight", p.n_head, 1, oss, L.attn_sinks);
        if (r) r = get(b + "attn_q.bias", Q, 1, false, L.bq);
        if (r) r = get(b + "attn_k.bias", KV, 1, false, L.bk);
        if (r) r = get(b + "attn_v.bias", KV, 1, false, L.bv);
        const bool qk_norm = p.arch == "qwen3" || p.arch == "qwen3moe" || gemma3;
        if (r) r = get(b + "attn_q_norm.weight", p.head_dim, 1, qk_norm, L.q_norm);
        if (r) r = get(b + "attn_k_norm.weight", p.head_dim, 1, qk_norm, L.k_norm);
        // gpt-oss's FFN norm is named post_attention_norm (llama.cpp's attn_post_norm, applied
        // before the FFN, not to the attention's output).
        if (r && !oss) r = get(b + "post_attention_norm.weight", E, 1, gemma2 || gemma3, L.attn_post_norm);
        if (r) r = get(b + (oss ? "post_attention_norm.weight" : "ffn_norm.weight"), E, 1, true, L.ffn_norm);
        if (fused) {
            WeightView gate_up;
            if (r) r = get(b + "ffn_up.weight", E, 2 * (int64_t)p.n_ff, true, gate_up);
            if (r) {
                L.w_gate = rows_of(gate_up, 0, p.n_ff);
                L.w_up = rows_of(gate_up, p.n_ff, p.n_ff);
            }
        } else if (p.is_moe()) {
            const int64_t X = p.n_expert, FE = p.n_ff_exp;
            if (r) r = get(b + "ffn_gate_inp.weight", E, X, true, L.ffn_gate_inp);
            if (r) r = get3(b + "ffn_gate_exps.weight", E, FE, X, L.gate_exps);
            if (r) r = get3(b + "ffn_up_exps.weight", E, FE, X, L.up_exps);
            if (r) r = get3(b + "ffn_down_exps.weight", FE, E, X, L.down_exps);
            if (oss) {  // the router's and the experts' biases, [n_expert] and one row per expert
                if (r) r = get(b + "ffn_gate_inp.bias", X, 1, true, L.ffn_gate_inp_b);
                if (r) r = get(b + "ffn_gate_exps.bias", FE, X, true, L.gate_exps_b);
                if (r) r = get(b + "ffn_up_exps.bias", FE, X, true, L.up_exps_b);
                if (r) r = get(b + "ffn_down_exps.bias", E, X, true, L.down_exps_b);
            }
            if (r && f.find_tensor(b + "ffn_gate_shexp.weight"))
                return make_error("'", path, "': shared experts (", b, "ffn_gate_shexp.weight) are not read by Steward "
                                  "yet; qwen2moe-style files are refused");
        } else {
            if (r) r = get(b + "ffn_gate.weight", E, p.n_ff, true, L.w_gate);
            if (r) r = get(b + "ffn_up.weight", E, p.n_ff, true, L.w_up);
        }
        if (r && !p.is_moe()) r = get(b + "ffn_down.weight", p.n_ff, E, true, L.w_down);
        if (r) r = get(b + "post_ffw_norm.weight", E, 1, gemma2 || gemma3, L.ffn_post_norm);
    }
    if (!r) return r.error();
    // A NaN or inf weight turns every output into NaN (a model that prints one token forever): the
    // norms, biases and the token embedding are read whole and such a file is refused. The other
    // matrices are not (a full scan of a 7B file costs seconds at every load).
    auto finite = [&](const std::string& name, const WeightView& v) -> Expected<bool> {
        if (!v || v.n_cols <= 0) return true;
        std::vector<float> row((size_t)v.n_cols);
        for (int64_t i = 0; i < v.n_rows; i++) {
            if (!dequantize_row(v.type, v.row(i), v.n_cols, row.data())) return true;  // no reference dequantizer
            for (int64_t c = 0; c < v.n_cols; c++)
                if (!std::isfinite(row[(size_t)c]))
                    return make_error("'", path, "': tensor '", name, "' holds ", std::isnan(row[(size_t)c]) ? "NaN" : "inf",
                                      " at [", std::to_string(c), ", ", std::to_string(i),
                                      "]; the file is corrupt: convert or download the model again");
        }
        return true;
    };
    r = finite("token_embd.weight", w.tok_embd);
    if (r) r = finite("output_norm.weight", w.output_norm);
    if (r) r = finite("token_embd_norm.weight", w.tok_norm);
    if (r) r = finite("token_embd_norm.bias", w.tok_norm_b);
    if (r) r = finite("position_embd.weight", w.pos_embd);
    if (r) r = finite("token_types.weight", w.type_embd);
    for (int l = 0; l < p.n_layer && r; l++) {
        const LayerWeights& L = w.layers[(size_t)l];
        const std::string b = "blk." + std::to_string(l) + ".";
        for (const auto& [n, v] : {std::pair{"attn_norm.weight", &L.attn_norm}, {"ffn_norm.weight", &L.ffn_norm}, {"attn_q.bias", &L.bq},
                                   {"attn_k.bias", &L.bk}, {"attn_v.bias", &L.bv}, {"attn_q_norm.weight", &L.q_norm}, {"attn_k_norm.weight", &L.k_norm},
                                   {"attn_output.bias", &L.bo}, {"attn_sinks.weight", &L.attn_sinks}, {"ffn_gate_inp.bias", &L.ffn_gate_inp_b},
                                   {"ffn_gate_exps.bias", &L.gate_exps_b}, {"ffn_up_exps.bias", &L.up_exps_b}, {"ffn_down_exps.bias", &L.down_exps_b},
                                   {"post_attention_norm.weight", &L.attn_post_norm}, {"post_ffw_norm.weight", &L.ffn_post_norm}, {"ffn_up.bias", &L.b_up}, {"ffn_down.bias", &L.b_down},
                                   {"attn_output_norm.weight", &L.attn_out_norm}, {"attn_output_norm.bias", &L.attn_out_norm_b},
                                   {"layer_output_norm.weight", &L.layer_out_norm}, {"layer_output_norm.bias", &L.layer_out_norm_b}})
            if (r) r = finite(b + n, *v);
    }
    if (!r) return r.error();
    return m;
}

int64_t Model::weight_bytes_per_token() const {
    const auto& w = weights_;
    int64_t b = w.tok_embd.row_bytes() + p_bytes(w.output) + p_bytes(w.output_norm) + p_bytes(w.tok_norm) +
                p_bytes(w.tok_norm_b) + (w.pos_embd ? w.pos_embd.row_bytes() : 0) + (w.type_embd ? w.type_embd.row_bytes() : 0);
    for (const auto& L : w.layers) {
        b += p_bytes(L.ffn_gate_inp) + p_bytes(L.ffn_gate_inp_b);
        for (const WeightView* v : {&L.gate_exps, &L.up_exps, &L.down_exps, &L.gate_exps_b, &L.up_exps_b, &L.down_exps_b})  // the experts a token runs
            b += params_.n_expert > 0 ? p_bytes(*v) / params_.n_expert * params_.n_expert_used : 0;
    }
    for (const auto& L : w.layers)
        for (const WeightView* v : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv, &L.q_norm,
                                    &L.k_norm, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down, &L.bo, &L.b_up,
                                    &L.attn_post_norm, &L.ffn_post_norm, &L.attn_sinks,
                                    &L.b_down, &L.attn_out_norm, &L.attn_out_norm_b, &L.layer_out_norm,
                                    &L.layer_out_norm_b})
            b += p_bytes(*v);
    return b;
}

int64_t Model::n_params() const {
    int64_t n = 0;
    for (const auto& t : file_->tensors()) n += t.n_elements();
    return n;
}

}  // namespace steward
