// Synthetic llama-family models: deterministic random weights and an SPM tokenizer, written as a
// real GGUF. The weight scales are chosen so that greedy generation stays finite, does not lock
// onto one token, and has peaked next-token distributions (see output_scale below).
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "model/ggml_types.h"

namespace steward {

namespace {

uint64_t splitmix64(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

// Uniform in [-a, a] with a = sqrt(3) * stddev, seeded per tensor name so a draft derived from a
// target (or a target regenerated with other layers) has identical shared tensors.
std::vector<float> random_tensor(uint64_t seed, const std::string& name, int64_t n, float stddev, float mean = 0.0f) {
    uint64_t s = seed ^ fnv1a(name);
    const float a = std::sqrt(3.0f) * stddev;
    std::vector<float> v((size_t)n);
    for (auto& x : v) {
        const double u = (double)(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
        x = mean + (float)((2.0 * u - 1.0) * a);
    }
    return v;
}

std::vector<uint8_t> encode(const std::vector<float>& v, GgmlType t) {
    std::vector<uint8_t> out((size_t)ggml_row_bytes(t, (int64_t)v.size()));
    (void)quantize_row(t, v.data(), (int64_t)v.size(), out.data());  // synth_validate checked type and widths
    return out;
}

// The synthetic SentencePiece vocabulary: <unk> <s> </s>, the 256 byte-fallback tokens, single
// characters, then English-like words and syllables, each preceded by all its prefixes so the
// SPM bigram merge can reach it. Scores fall with the index (earlier pieces are preferred).
void synth_vocab(int n_vocab, std::vector<std::string>& tokens, std::vector<float>& scores,
                 std::vector<int32_t>& types) {
    std::set<std::string> seen;
    auto add = [&](const std::string& piece, int type) {
        if ((int)tokens.size() >= n_vocab || seen.count(piece)) return;
        seen.insert(piece);
        tokens.push_back(piece);
        scores.push_back(type == 1 ? -(float)tokens.size() * 0.01f : 0.0f);
        types.push_back(type);
    };
    add("<unk>", 2);
    add("<s>", 3);
    add("</s>", 3);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, 6);
    }
    const std::string sp = "\xe2\x96\x81";  // U+2581, SPM's space
    add(sp, 1);
    for (char c = 32; c < 127; c++)
        if (c != ' ') add(std::string(1, c), 1);
    auto add_word = [&](const std::string& w) {
        const std::string full = sp + w;
        for (size_t n = 2; n <= w.size(); n++) add(w.substr(0, n), 1);
        for (size_t n = 1; n <= w.size(); n++) add(sp + w.substr(0, n), 1);
        (void)full;
    };
    static const char* words[] = {
        "the", "of", "and", "to", "in", "is", "was", "that", "for", "on", "with", "as", "it", "by", "at",
        "from", "his", "her", "an", "were", "are", "which", "this", "be", "or", "had", "not", "one", "but",
        "they", "first", "new", "after", "who", "their", "has", "two", "been", "also", "its", "there", "into",
        "time", "would", "when", "more", "other", "all", "during", "some", "can", "will", "model", "token",
        "cache", "data", "request", "answer", "question", "story", "once", "upon", "little", "said", "day",
        "happy", "friend", "play", "went", "saw", "big", "very", "dog", "cat", "tree", "house", "sun",
        "water", "light", "world", "people", "work", "system", "memory", "block", "value", "agent", "tool",
        "call", "result", "json", "name", "type", "list", "number", "string", "true", "false", "null"};
    for (const char* w : words) add_word(w);
    static const char* cons[] = {"b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n",
                                 "p", "r", "s", "t", "v", "w", "z", "st", "tr", "ch"};
    static const char* vow[] = {"a", "e", "i", "o", "u"};
    for (int len = 1; len <= 3 && (int)tokens.size() < n_vocab; len++) {
        // Words of `len` consonant-vowel syllables, optionally closed by a consonant.
        std::vector<std::string> cur = {""};
        for (int s = 0; s < len; s++) {
            std::vector<std::string> next;
            for (auto& p : cur)
                for (const char* c : cons)
                    for (const char* v : vow) next.push_back(p + c + v);
            cur.swap(next);
        }
        for (auto& w : cur) {
            if ((int)tokens.size() >= n_vocab) break;
            add_word(w);
            for (const char* c : cons) add_word(w + c);
        }
    }
    for (int i = 0; (int)tokens.size() < n_vocab; i++) add("<unused" + std::to_string(i) + ">", 5);
}

// The synthetic WordPiece vocabulary, laid out as BERT's: [PAD] 0, unused 1..99, [UNK] 100,
// [CLS] 101, [SEP] 102, [MASK] 103, then characters and words in llama.cpp's converted form (a
// word's first piece starts with U+2581, a continuation piece is bare).
void synth_wpm_vocab(int n_vocab, std::vector<std::string>& tokens, std::vector<int32_t>& types) {
    std::set<std::string> seen;
    auto add = [&](const std::string& piece, int type) {
        if ((int)tokens.size() >= n_vocab || seen.count(piece)) return;
        seen.insert(piece);
        tokens.push_back(piece);
        types.push_back(type);
    };
    add("[PAD]", 3);
    for (int i = 1; i < 100; i++) add("[unused" + std::to_string(i) + "]", 5);
    add("[UNK]", 3);
    add("[CLS]", 3);
    add("[SEP]", 3);
    add("[MASK]", 3);
    const std::string sp = "\xe2\x96\x81";
    for (char c = 33; c < 127; c++)
        if (c < 'A' || c > 'Z') {  // lower-cased input: no capitals
            add(sp + std::string(1, c), 1);
            add(std::string(1, c), 1);
        }
    static const char* words[] = {"the", "of", "and", "to", "in", "is", "was", "that", "for", "on", "with", "as",
                                  "it", "by", "at", "from", "model", "token", "cache", "data", "request", "answer",
                                  "question", "story", "once", "upon", "little", "said", "day", "happy", "friend",
                                  "embedding", "vector", "search", "query", "document", "sentence", "meaning"};
    static const char* suffixes[] = {"s", "ed", "ing", "er", "ly", "tion", "ness", "ment"};
    for (const char* w : words) add(sp + w, 1);
    for (const char* x : suffixes) add(x, 1);
    static const char* cons[] = {"b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w"};
    static const char* vow[] = {"a", "e", "i", "o", "u"};
    for (const char* c : cons)
        for (const char* v : vow)
            for (const char* c2 : cons) {
                add(sp + c + v + c2, 1);
                add(std::string(c) + v + c2, 1);
            }
    for (int i = 0; (int)tokens.size() < n_vocab; i++) add("[extra" + std::to_string(i) + "]", 5);
}

}  // namespace

Expected<bool> synth_validate(const SynthSpec& s) {
    auto bad = [](const std::string& m) { return make_error("invalid synthetic model shape: ", m); };
    if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "mistral" && s.arch != "phi3" &&
        s.arch != "gemma2" && s.arch != "gemma3" && s.arch != "qwen3moe" && s.arch != "mixtral" && s.arch != "gpt-oss" &&
        s.arch != "bert" && s.arch != "nomic-bert")
        return bad("arch must be llama, mistral, qwen2, qwen3, qwen3moe, mixtral, gpt-oss, phi3, gemma2, gemma3, bert or "
                   "nomic-bert, got '" + s.arch + "'");
    if (!std::isfinite(s.yarn_factor) || (s.yarn_factor > 0.0f && s.rope_scaling_factor > 0.0f) || s.yarn_orig_ctx <= 0)
        return bad("YaRN: a finite factor (negative: the family's default, 0: none), not with --rope-scale, and a "
                   "positive original context");
    if (s.longrope_orig_ctx < 0 || (s.longrope_orig_ctx > 0 && (s.arch != "phi3" || s.rope_freqs_ramp > 0.0f)))
        return bad("LongRoPE factors are phi3's (as llama.cpp reads them), without --rope-freqs-ramp");
    if ((s.arch == "qwen3moe" || s.arch == "mixtral" || s.arch == "gpt-oss") &&
        (s.n_expert < 2 || s.n_expert > 512 || s.n_expert_used < 1 || s.n_expert_used > s.n_expert || s.n_ff_exp < 0))
        return bad("experts: at least 2 (at most 512), 1 to all of them used per token, expert width 0 (ffn) or positive");
    if (s.sliding_window < -1 || (s.sliding_window == -1 && s.arch != "gemma3"))
        return bad("sliding window must be 0 (the family's default), positive, or -1 (none, gemma3 only)");
    if (!std::isfinite(s.attn_softcap) || !std::isfinite(s.final_softcap))
        return bad("soft-caps must be finite (negative: the family's default, 0: none)");
    if ((s.arch == "bert" || s.arch == "nomic-bert") && s.n_head_kv != s.n_head)
        return bad("an encoder has as many KV heads as heads (llama.cpp's bert)");
    if ((s.arch == "bert" || s.arch == "nomic-bert") && (s.rope_scaling_factor > 0.0f || s.rope_freqs_ramp > 0.0f))
        return bad("RoPE scaling is for the decoders; bert has absolute positions and nomic-bert plain RoPE");
    if (s.arch == "phi3" && s.head_dim > 0 && s.head_dim * s.n_head != s.n_embd)
        return bad("phi3's heads x head size must be dim (llama.cpp's phi3 has no separate head size)");
    if (s.n_embd <= 0 || s.n_layer <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 || s.n_ctx <= 0 ||
        s.head_dim < 0)
        return bad("dim, layers, heads, kv heads, ffn and context must be positive (head size 0 or positive)");
    if (s.n_vocab < 259 + 95) return bad("vocab must be at least 354 (control, byte and character tokens)");
    if (s.head_dim == 0 && s.n_embd % s.n_head)
        return bad("dim " + std::to_string(s.n_embd) + " is not a multiple of heads " + std::to_string(s.n_head) +
                   "; give the head size (--head-dim)");
    if (s.n_head % s.n_head_kv) return bad("heads " + std::to_string(s.n_head) + " is not a multiple of kv heads " + std::to_string(s.n_head_kv));
    if (synth_head_dim(s) % 2) return bad("head size must be even for RoPE");
    if (s.late_from < -1 || s.late_from > s.n_layer)
        return bad("late layers start at " + std::to_string(s.late_from) + "; give -1 (off) or a layer in [0, " +
                   std::to_string(s.n_layer) + "]");
    if (!(s.rope_scaling_factor >= 0.0f) || !std::isfinite(s.rope_scaling_factor) || !(s.rope_freqs_ramp >= 0.0f) ||
        !std::isfinite(s.rope_freqs_ramp))
        return bad("RoPE scaling factor and factor ramp must be 0 (none) or positive");
    if (!(s.late_scale >= 0.0f) || !std::isfinite(s.late_scale))
        return bad("late layer scale is " + std::to_string(s.late_scale) + "; it must be a finite number >= 0");
    if (!quantize_supported(s.dtype))
        return bad(std::string("synth cannot write weight type ") + ggml_type_name((uint32_t)s.dtype) +
                   "; use f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m");
    const GgmlType mix_base = s.mix == QuantMix::Q4_K_M ? GgmlType::Q4_K : s.mix == QuantMix::Q5_K_M ? GgmlType::Q5_K : GgmlType::MXFP4;
    if (s.mix != QuantMix::NONE && s.dtype != mix_base)
        return bad("the mix's base type must be Q4_K for q4_k_m, Q5_K for q5_k_m and MXFP4 for mxfp4_moe");
    if (s.mix == QuantMix::NONE && s.dtype == GgmlType::MXFP4)
        return bad("MXFP4 is written as llama-quantize's mxfp4_moe mix (experts MXFP4, other matrices Q8_0)");
    // Every matrix row (dim, ffn for ffn_down, heads x head size for attn_output) must hold whole
    // blocks; a k-quant mix also writes Q6_K, so it needs 256 too.
    const int64_t width = s.mix == QuantMix::Q4_K_M || s.mix == QuantMix::Q5_K_M ? 256 : ggml_type_block_elems(s.dtype);
    const int64_t q_dim = (int64_t)synth_head_dim(s) * s.n_head;
    if (s.n_embd % width || s.n_ff % width || q_dim % width || (s.n_ff_exp > 0 && s.n_ff_exp % width))
        return bad(std::string(ggml_type_name((uint32_t)s.dtype)) + (s.mix != QuantMix::NONE ? " mix" : "") +
                   " needs dim (" + std::to_string(s.n_embd) + "), ffn (" + std::to_string(s.n_ff) +
                   ") and heads x head size (" + std::to_string(q_dim) + ") to be multiples of " + std::to_string(width));
    return true;
}

int synth_head_dim(const SynthSpec& s) { return s.head_dim > 0 ? s.head_dim : s.n_embd / std::max(1, s.n_head); }

namespace {

// bert (absolute positions, GELU FFN, biases everywhere, CLS pooling as BGE) or nomic-bert (RoPE,
// fused QKV, SwiGLU FFN, no biases, mean pooling as nomic-embed), as llama.cpp's converter writes
// them: post-norm blocks, LayerNorm gains near 1 with biases, a WordPiece vocabulary.
Expected<GgufWriter> synth_encoder(const SynthSpec& s, GgufWriter w) {
    const std::string a = s.arch;
    const bool nomic = a == "nomic-bert";
    const int head_dim = synth_head_dim(s);
    w.set_f32(a + ".attention.layer_norm_epsilon", 1e-12f);
    w.set_bool(a + ".attention.causal", false);
    w.set_u32(a + ".pooling_type", nomic ? 1 : 2);
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    synth_wpm_vocab(s.n_vocab, tokens, types);
    w.set_string("tokenizer.ggml.model", "bert");
    w.set_string("tokenizer.ggml.pre", "default");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.token_type_count", 2);
    w.set_u32("tokenizer.ggml.padding_token_id", 0);
    w.set_u32("tokenizer.ggml.unknown_token_id", 100);
    w.set_u32("tokenizer.ggml.bos_token_id", 101);
    w.set_u32("tokenizer.ggml.seperator_token_id", 102);
    w.set_u32("tokenizer.ggml.mask_token_id", 103);

    const WeightFormat format{s.dtype, s.mix};
    const int64_t E = s.n_embd, Q = (int64_t)s.n_head * head_dim, F = s.n_ff;
    const float in_scale = 1.0f / std::sqrt((float)E);
    auto mat = [&](const std::string& name, int64_t cols, int64_t rows, float stddev) {
        const GgmlType t = format_tensor_type(format, name, s.n_layer, true);
        if (s.shape_only) return w.add_tensor_shape(name, t, {cols, rows});
        w.add_tensor(name, t, {cols, rows}, encode(random_tensor(s.seed, name, cols * rows, stddev), t));
    };
    auto vec = [&](const std::string& name, int64_t n, float stddev, float mean) {
        if (s.shape_only) return w.add_tensor_shape(name, GgmlType::F32, {n});
        w.add_tensor(name, GgmlType::F32, {n}, encode(random_tensor(s.seed, name, n, stddev, mean), GgmlType::F32));
    };
    // Position and type rows as F32 (llama.cpp keeps 1-D-ish tables like these unquantized too).
    auto table = [&](const std::string& name, int64_t cols, int64_t rows, float stddev) {
        if (s.shape_only) return w.add_tensor_shape(name, GgmlType::F32, {cols, rows});
        w.add_tensor(name, GgmlType::F32, {cols, rows},
                     encode(random_tensor(s.seed, name, cols * rows, stddev), GgmlType::F32));
    };
    mat("token_embd.weight", E, s.n_vocab, 1.0f);
    if (!nomic) table("position_embd.weight", E, s.n_ctx, 0.5f);
    table("token_types.weight", E, 2, 0.5f);
    vec("token_embd_norm.weight", E, 0.1f, 1.0f);
    vec("token_embd_norm.bias", E, 0.1f, 0.0f);
    for (int l = 0; l < s.n_layer; l++) {
        const std::string b = "blk." + std::to_string(l) + ".";
        if (nomic) {
            mat(b + "attn_qkv.weight", E, 3 * Q, in_scale);
        } else {
            for (const char* x : {"attn_q", "attn_k", "attn_v"}) {
                mat(b + x + ".weight", E, Q, in_scale);
                vec(b + x + ".bias", Q, 0.1f, 0.0f);
            }
        }
        // Attention scores need some spread for the softmax to matter: q and k of ~unit length per
        // dimension give logits of stddev ~1 after the 1/sqrt(head size) scale.
        mat(b + "attn_output.weight", Q, E, 1.0f / std::sqrt((float)Q));
        if (!nomic) vec(b + "attn_output.bias", E, 0.1f, 0.0f);
        vec(b + "attn_output_norm.weight", E, 0.1f, 1.0f);
        vec(b + "attn_output_norm.bias", E, 0.1f, 0.0f);
        mat(b + "ffn_up.weight", E, F, in_scale);
        if (nomic) mat(b + "ffn_gate.weight", E, F, in_scale);
        if (!nomic) vec(b + "ffn_up.bias", F, 0.1f, 0.0f);
        mat(b + "ffn_down.weight", F, E, 1.0f / std::sqrt((float)F));
        if (!nomic) vec(b + "ffn_down.bias", E, 0.1f, 0.0f);
        vec(b + "layer_output_norm.weight", E, 0.1f, 1.0f);
        vec(b + "layer_output_norm.bias", E, 0.1f, 0.0f);
    }
    return w;
}

}  // namespace

Expected<GgufWriter> synth_model(const SynthSpec& s) {
    auto ok = synth_validate(s);
    if (!ok) return ok.error();
    GgufWriter w;
    const bool moe = s.arch == "qwen3moe" || s.arch == "mixtral" || s.arch == "gpt-oss";
    const bool oss = s.arch == "gpt-oss";
    const std::string a = s.arch == "mixtral" ? "llama" : s.arch;  // llama.cpp writes Mixtral as llama
    const int FE = s.n_ff_exp > 0 ? s.n_ff_exp : s.n_ff;
    const int head_dim = synth_head_dim(s);
    w.set_string("general.architecture", a);
    w.set_string("general.name", "steward-synth");
    const WeightFormat format{s.dtype, s.mix};
    w.set_u32("general.file_type", format_file_type(format));
    if (ggml_type_block_elems(s.dtype) > 1) w.set_u32("general.quantization_version", 2);  // as llama-quantize writes
    w.set_u64("steward.synth.seed", s.seed);
    if (s.late_from >= 0) {  // recorded so a fixture's acceptance can be traced back to it
        w.set_u32("steward.synth.late_from", (uint32_t)s.late_from);
        w.set_f32("steward.synth.late_scale", s.late_scale);
    }
    w.set_u32(a + ".context_length", (uint32_t)s.n_ctx);
    w.set_u32(a + ".embedding_length", (uint32_t)s.n_embd);
    w.set_u32(a + ".block_count", (uint32_t)s.n_layer);
    w.set_u32(a + ".feed_forward_length", (uint32_t)s.n_ff);
    w.set_u32(a + ".attention.head_count", (uint32_t)s.n_head);
    w.set_u32(a + ".attention.head_count_kv", (uint32_t)s.n_head_kv);
    const bool absolute = a == "bert";  // positions from a table, no RoPE keys
    if (!absolute) w.set_u32(a + ".rope.dimension_count", (uint32_t)head_dim);
    if (s.head_dim > 0) {
        w.set_u32(a + ".attention.key_length", (uint32_t)head_dim);
        w.set_u32(a + ".attention.value_length", (uint32_t)head_dim);
    }
    // Gemma 3's full layers rotate with base 1e6 and its window layers with the spec's base (10000),
    // as the released models do.
    // gpt-oss rotates with base 150000, as the released models.
    if (!absolute) w.set_f32(a + ".rope.freq_base", a == "gemma3" ? 1e6f : oss ? 150000.0f : s.rope_freq_base);
    const float yarn = s.yarn_factor >= 0.0f ? s.yarn_factor : (oss ? 32.0f : 0.0f);
    if (yarn > 0.0f && !absolute) {
        w.set_string(a + ".rope.scaling.type", "yarn");
        w.set_f32(a + ".rope.scaling.factor", yarn);
        w.set_u32(a + ".rope.scaling.original_context_length", (uint32_t)s.yarn_orig_ctx);
    }
    if (s.rope_scaling_factor > 0.0f && !absolute) {
        w.set_string(a + ".rope.scaling.type", "linear");
        w.set_f32(a + ".rope.scaling.factor", s.rope_scaling_factor);
    }
    if (a == "bert" || a == "nomic-bert") return synth_encoder(s, std::move(w));
    w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
    w.set_u32(a + ".vocab_size", (uint32_t)s.n_vocab);
    if (moe) {
        w.set_u32(a + ".expert_count", (uint32_t)s.n_expert);
        w.set_u32(a + ".expert_used_count", (uint32_t)s.n_expert_used);
        if (a == "qwen3moe" || oss) w.set_u32(a + ".expert_feed_forward_length", (uint32_t)FE);
    }
    if (oss) w.set_u32(a + ".attention.sliding_window", (uint32_t)(s.sliding_window > 0 ? s.sliding_window : 128));
    const bool gemma = a == "gemma2" || a == "gemma3";
    // Gemma 2's head is always the embedding (tied).
    const bool tied = s.tied_output || a == "gemma2";
    if (gemma) {
        const int window = s.sliding_window != 0 ? s.sliding_window : (a == "gemma2" ? 4096 : 512);
        if (window > 0) w.set_u32(a + ".attention.sliding_window", (uint32_t)window);
        if (a == "gemma3") w.set_f32(a + ".rope.freq_base_swa", s.rope_freq_base);
        const float acap = s.attn_softcap >= 0 ? s.attn_softcap : (a == "gemma2" ? 50.0f : 0.0f);
        const float fcap = s.final_softcap >= 0 ? s.final_softcap : (a == "gemma2" ? 30.0f : 0.0f);
        if (a == "gemma2") {  // llama.cpp reads both with defaults 50 and 30: written always
            w.set_f32(a + ".attn_logit_softcapping", acap);
            w.set_f32(a + ".final_logit_softcapping", fcap);
        } else if (fcap > 0) {
            w.set_f32(a + ".final_logit_softcapping", fcap);
        }
    }

    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    synth_vocab(s.n_vocab, tokens, scores, types);
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.unknown_token_id", 0);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_bool("tokenizer.ggml.add_eos_token", false);

    const int64_t E = s.n_embd, Q = (int64_t)s.n_head * head_dim, KV = (int64_t)s.n_head_kv * head_dim, F = s.n_ff;
    const float in_scale = 1.0f / std::sqrt((float)E);
    // Residual branches are damped by depth so the stream stays O(1) over many layers.
    const float branch = 1.0f / std::sqrt(2.0f * (float)s.n_layer);
    // Gemma's branches end in an RMSNorm whose gain is the branch's size against the stream's (~1 per
    // element): damped by depth like the others, except under a tied head (Gemma 2's), where the
    // stream must move well away from the last token's embedding or greedy decoding repeats it.
    const float gemma_gain = tied ? 4.0f : branch;
    auto mat = [&](const std::string& name, int64_t cols, int64_t rows, float stddev) {
        const GgmlType t = format_tensor_type(format, name, s.n_layer, tied);
        if (s.shape_only) return w.add_tensor_shape(name, t, {cols, rows});
        w.add_tensor(name, t, {cols, rows}, encode(random_tensor(s.seed, name, cols * rows, stddev), t));
    };
    auto table = [&](const std::string& name, int64_t cols, int64_t rows, float stddev) {
        if (s.shape_only) return w.add_tensor_shape(name, GgmlType::F32, {cols, rows});
        w.add_tensor(name, GgmlType::F32, {cols, rows}, encode(random_tensor(s.seed, name, cols * rows, stddev), GgmlType::F32));
    };
    // A stack of n matrices (the experts' 3-D tensors: [n][rows][cols]).
    auto mat3 = [&](const std::string& name, int64_t cols, int64_t rows, int64_t n, float stddev) {
        const GgmlType t = format_tensor_type(format, name, s.n_layer, tied);
        if (s.shape_only) return w.add_tensor_shape(name, t, {cols, rows, n});
        w.add_tensor(name, t, {cols, rows, n}, encode(random_tensor(s.seed, name, cols * rows * n, stddev), t));
    };
    // A fused matrix (phi3): the parts' rows one after the other, each part's values the ones a
    // separate tensor of that name would get, so a phi3 file holds a llama file's weights.
    auto fused = [&](const std::string& name, int64_t cols, std::initializer_list<std::pair<std::string, int64_t>> parts,
                     float stddev) {
        int64_t rows = 0;
        for (const auto& pr : parts) rows += pr.second;
        const GgmlType t = format_tensor_type(format, name, s.n_layer, tied);
        if (s.shape_only) return w.add_tensor_shape(name, t, {cols, rows});
        std::vector<float> v;
        v.reserve((size_t)(cols * rows));
        for (const auto& [part, n] : parts) {
            const std::vector<float> x = random_tensor(s.seed, part, cols * n, stddev);
            v.insert(v.end(), x.begin(), x.end());
        }
        w.add_tensor(name, t, {cols, rows}, encode(v, t));
    };
    auto vec = [&](const std::string& name, int64_t n, float stddev, float mean) {
        if (s.shape_only) return w.add_tensor_shape(name, GgmlType::F32, {n});
        w.add_tensor(name, GgmlType::F32, {n}, encode(random_tensor(s.seed, name, n, stddev, mean), GgmlType::F32));
    };
    // Gemma multiplies the embedding by sqrt(dim): rows of stddev 1 / sqrt(dim) enter at ~1.
    mat("token_embd.weight", E, s.n_vocab, gemma ? in_scale : 1.0f);
    // Per-pair factors rising linearly from 1 to `top`.
    auto ramp = [&](const std::string& name, float top) {
        const int half = head_dim / 2;
        std::vector<float> ff((size_t)half);
        for (int i = 0; i < half; i++) ff[(size_t)i] = 1.0f + (top - 1.0f) * (float)i / (float)std::max(1, half - 1);
        if (s.shape_only)
            w.add_tensor_shape(name, GgmlType::F32, {half});
        else
            w.add_tensor(name, GgmlType::F32, {half}, encode(ff, GgmlType::F32));
    };
    if (s.rope_freqs_ramp > 0.0f) ramp("rope_freqs.weight", s.rope_freqs_ramp);
    if (s.longrope_orig_ctx > 0) {
        const double orig = s.longrope_orig_ctx, scale = (double)s.n_ctx / orig;
        w.set_u32(a + ".rope.scaling.original_context_length", (uint32_t)s.longrope_orig_ctx);
        w.set_f32(a + ".rope.scaling.attn_factor", scale > 1.0 ? (float)std::sqrt(1.0 + std::log(scale) / std::log(orig)) : 1.0f);
        ramp("rope_factors_long.weight", 8.0f);
        ramp("rope_factors_short.weight", 1.5f);
    }
    for (int l = 0; l < s.n_layer; l++) {
        const std::string b = "blk." + std::to_string(l) + ".";
        // Only the branches' output projections: the layer still reads the stream as before, it just
        // writes less into it, so the late layers move the logits of the early ones less.
        const float late = s.late_from >= 0 && l >= s.late_from ? s.late_scale : 1.0f;
        vec(b + "attn_norm.weight", E, 0.1f, 1.0f);
        if (a == "phi3") {  // q, k and v rows in one tensor, each drawn as the llama file's
            fused(b + "attn_qkv.weight", E, {{b + "attn_q.weight", Q}, {b + "attn_k.weight", KV}, {b + "attn_v.weight", KV}},
                  in_scale);
        } else {
            mat(b + "attn_q.weight", E, Q, in_scale);
            mat(b + "attn_k.weight", E, KV, in_scale);
            mat(b + "attn_v.weight", E, KV, in_scale);
        }
        if (a == "qwen2" || oss) {
            vec(b + "attn_q.bias", Q, 0.1f, 0.0f);
            vec(b + "attn_k.bias", KV, 0.1f, 0.0f);
            vec(b + "attn_v.bias", KV, 0.1f, 0.0f);
        }
        if (a == "qwen3" || a == "qwen3moe" || a == "gemma3") {
            // Gains near 1 but far enough from it (stddev 0.2) that a pass skipping the norm, or
            // applying q's gain to k, gives other logits.
            vec(b + "attn_q_norm.weight", head_dim, 0.2f, 1.0f);
            vec(b + "attn_k_norm.weight", head_dim, 0.2f, 1.0f);
        }
        mat(b + "attn_output.weight", Q, E, late * branch / std::sqrt((float)Q));
        if (gemma) vec(b + "post_attention_norm.weight", E, 0.1f * gemma_gain, late * gemma_gain);
        if (oss) {
            vec(b + "attn_output.bias", E, 0.1f * branch, 0.0f);
            // Sink logits around e^1.5 ~ 4.5 times one key's weight: a tenth or more of a short
            // context's attention goes to the sink, so leaving it out moves the logits.
            vec(b + "attn_sinks.weight", s.n_head, 1.0f, 1.5f);
        }
        // gpt-oss's FFN norm is written as post_attention_norm (llama.cpp's converter).
        vec(b + (oss ? "post_attention_norm.weight" : "ffn_norm.weight"), E, 0.1f, 1.0f);
        if (a == "phi3") {  // the gate's rows, then up's
            fused(b + "ffn_up.weight", E, {{b + "ffn_gate.weight", F}, {b + "ffn_up.weight", F}}, in_scale);
        } else if (moe) {
            // The router's logits ~N(0, 1) over the experts: some tokens pick clearly, some nearly tie.
            // The router stays F32 in every file type, as llama-quantize leaves ffn_gate_inp.
            table(b + "ffn_gate_inp.weight", E, s.n_expert, in_scale);
            // gpt-oss: gate and up of stddev ~4, so that its clamp at 7 bites on some values.
            const float gu = oss ? 4.0f * in_scale : in_scale;
            mat3(b + "ffn_gate_exps.weight", E, FE, s.n_expert, gu);
            mat3(b + "ffn_up_exps.weight", E, FE, s.n_expert, gu);
            mat3(b + "ffn_down_exps.weight", FE, E, s.n_expert, late * 2.0f * branch / std::sqrt((float)FE) / (oss ? 8.0f : 1.0f));
            if (oss) {  // biases: the router's [n_expert], the experts' one row each
                vec(b + "ffn_gate_inp.bias", s.n_expert, 0.5f, 0.0f);
                table(b + "ffn_gate_exps.bias", FE, s.n_expert, 0.5f);
                table(b + "ffn_up_exps.bias", FE, s.n_expert, 0.5f);
                table(b + "ffn_down_exps.bias", E, s.n_expert, 0.1f * branch);
            }
        } else {
            mat(b + "ffn_gate.weight", E, F, in_scale);
            mat(b + "ffn_up.weight", E, F, in_scale);
        }
        if (!moe) mat(b + "ffn_down.weight", F, E, late * 2.0f * branch / std::sqrt((float)F));
        if (gemma) vec(b + "post_ffw_norm.weight", E, 0.1f * gemma_gain, late * gemma_gain);
    }
    vec("output_norm.weight", E, 0.1f, 1.0f);
    if (!tied) {
        // A random tied head gives near-flat logits (greedy picks near-ties, useless for exactness
        // tests). An untied head with logit stddev ~4 makes the top token stand out.
        const float output_scale = 4.0f;
        mat("output.weight", E, s.n_vocab, output_scale * in_scale);
    }
    return w;
}

Expected<bool> synth_write(const SynthSpec& spec, const std::string& path) {
    auto w = synth_model(spec);
    if (!w) return w.error();
    return w->write(path);
}

Expected<bool> synth_draft(const std::string& target_path, int keep_layers, const std::string& out_path) {
    auto f = GgufFile::open(target_path);
    if (!f) return f.error();
    const GgufFile& t = **f;
    auto arch = t.get_string("general.architecture");
    if (!arch) return make_error("'", target_path, "' has no general.architecture; not a model");
    const std::string a(*arch);
    auto n_layer = t.get_int(a + ".block_count");
    if (!n_layer) return make_error("'", target_path, "' has no ", a, ".block_count");
    if (keep_layers <= 0 || keep_layers > *n_layer)
        return make_error("--keep-layers ", std::to_string(keep_layers), " must be between 1 and the target's ",
                          std::to_string(*n_layer), " layers");
    GgufWriter w;
    for (const auto& [key, v] : t.metadata()) {
        if (key == "general.alignment") continue;
        if (key == a + ".block_count") {
            w.set_u32(key, (uint32_t)keep_layers);
            continue;
        }
        auto r = w.set_value(key, v);
        if (!r) return r.error();
    }
    w.set_string("general.name", "steward-synth-draft");
    for (const auto& ti : t.tensors()) {
        if (ti.name.rfind("blk.", 0) == 0) {
            const int layer = std::atoi(ti.name.c_str() + 4);
            if (layer >= keep_layers) continue;
        }
        std::vector<int64_t> dims(ti.ne, ti.ne + ti.n_dims);
        w.add_tensor(ti.name, ti.type, dims, std::vector<uint8_t>(ti.data, ti.data + ti.n_bytes));
    }
    return w.write(out_path, t.alignment());
}

}  // namespace steward

namespace steward {

Expected<std::vector<uint8_t>> synth_header_bytes(SynthSpec spec) {
    spec.shape_only = true;
    auto w = synth_model(spec);
    if (!w) return w.error();
    return w->header_bytes();
}

}  // namespace steward
