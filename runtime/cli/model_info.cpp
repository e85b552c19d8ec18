// steward model info M.gguf: what a GGUF file holds and what serving it costs, read from the file
// alone (no weights are touched): architecture and shape, tensor types with counts and bytes, the
// tokenizer, the chat template, and the two roofline figures (KV bytes per token, weight bytes read
// per decoded token).
#include <cstdio>
#include <map>
#include <string>

#include "cli/commands.h"
#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cpu/plan.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "serve/tool_calls.h"

namespace steward {

namespace {

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
    return buf;
}

}  // namespace

int cmd_model_info(const std::string& path) {
    auto f = GgufFile::open(path);  // refuses a tensor type Steward cannot load, naming it
    if (!f) return cli_fail(f.error().message);
    const GgufFile& g = **f;
    const std::string arch = std::string(g.get_string("general.architecture").value_or("(none)"));
    auto meta_int = [&](const std::string& key) { return g.get_int(arch + "." + key); };
    const int64_t n_embd = meta_int("embedding_length").value_or(0), n_layer = meta_int("block_count").value_or(0);
    const int64_t n_head = meta_int("attention.head_count").value_or(0);
    const int64_t n_head_kv = meta_int("attention.head_count_kv").value_or(n_head);
    const int64_t head_dim = meta_int("attention.key_length").value_or(n_head > 0 ? n_embd / n_head : 0);
    const int64_t n_ctx = meta_int("context_length").value_or(0), n_ff = meta_int("feed_forward_length").value_or(0);
    const auto tokens = g.get_string_array("tokenizer.ggml.tokens");
    const int64_t n_vocab = tokens ? (int64_t)tokens->size() : 0;

    std::printf("file          %s (GGUF v%u, %s)\n", path.c_str(), g.version(), human_bytes((double)g.mapped_size()).c_str());
    std::printf("architecture  %s", arch.c_str());
    if (auto name = g.get_string("general.name")) std::printf(" (%.*s)", (int)name->size(), name->data());
    std::printf("\nshape         dim %lld, %lld layers, %lld heads, %lld KV heads, head dim %lld, ffn %lld, vocab %lld, context %lld\n",
                (long long)n_embd, (long long)n_layer, (long long)n_head, (long long)n_head_kv, (long long)head_dim,
                (long long)n_ff, (long long)n_vocab, (long long)n_ctx);
    // RoPE and its scaling, as the loader reads them (docs/models.md): for the architectures that
    // rotate (the ones Steward runs, or a file that names a RoPE base), not for absolute positions.
    const bool encoder = arch == "bert" || arch == "nomic-bert";
    const bool rotary = (arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3" || arch == "phi3" ||
                         arch == "nomic-bert" || g.get_float(arch + ".rope.freq_base").has_value()) &&
                        arch != "bert";
    if (n_layer > 0 && rotary) {
        std::printf("rope          freq base %.10g, %lld dims", g.get_float(arch + ".rope.freq_base").value_or(10000.0),
                    (long long)meta_int("rope.dimension_count").value_or(head_dim));
        const std::string scaling(g.get_string(arch + ".rope.scaling.type").value_or("linear"));
        const double factor = g.get_float(arch + ".rope.scaling.factor").value_or(0.0);
        if (scaling == "yarn")
            std::printf("; YaRN, factor %g over %lld tokens", factor,
                        (long long)g.get_int(arch + ".rope.scaling.original_context_length").value_or(n_ctx));
        else if (scaling != "linear" && scaling != "none")
            std::printf("; scaling %s (not supported: the file is refused at load)", scaling.c_str());
        else if (scaling == "linear" && factor > 0 && factor != 1)
            std::printf("; linear scaling, angles / %g", factor);
        if (const GgufTensorInfo* rf = g.find_tensor("rope_freqs.weight"))
            std::printf("; per-pair factors (rope_freqs.weight, %lld)", (long long)rf->ne[0]);
        if (g.find_tensor("rope_factors_long.weight") || g.find_tensor("rope_factors_short.weight")) {
            if (arch == "phi3")
                std::printf("; LongRoPE factors (the long ones past %lld tokens of context, else the short ones)",
                            (long long)g.get_int(arch + ".rope.scaling.original_context_length").value_or(n_ctx));
            else
                std::printf("; LongRoPE factors (read for phi3 only: this file is refused at load)");
        }
        std::printf("\n");
    }

    // Gemma 2 / 3: the sliding window and the soft-caps, as the loader reads them (their defaults).
    if (arch == "gemma2" || arch == "gemma3") {
        const bool g2 = arch == "gemma2";
        const int64_t win = g.get_int(arch + ".attention.sliding_window").value_or(g2 ? 4096 : 0);
        const int64_t period = g.get_int(arch + ".attention.sliding_window_pattern").value_or(g2 ? 2 : 6);
        if (win > 0)
            std::printf("window        %lld tokens on %lld of every %lld layers", (long long)win, (long long)(period - 1),
                        (long long)period);
        else
            std::printf("window        none (every layer attends to the whole context)");
        const double acap = g.get_float(arch + ".attn_logit_softcapping").value_or(g2 ? 50.0 : 0.0);
        const double fcap = g.get_float(arch + ".final_logit_softcapping").value_or(g2 ? 30.0 : 0.0);
        if (acap > 0 && g2) std::printf("; attention soft-cap %g", acap);
        if (fcap > 0) std::printf("; logit soft-cap %g", fcap);
        std::printf("\n");
    }

    // gpt-oss: a window on every other layer from the first, sinks, the clamped SwiGLU.
    if (arch == "gpt-oss")
        std::printf("window        %lld tokens on every other layer (from the first); one attention sink per head; "
                    "clamped SwiGLU (limit 7); biases on q/k/v, the attention output, the router and the experts\n",
                    (long long)g.get_int(arch + ".attention.sliding_window").value_or(0));

    const int64_t expert_count = meta_int("expert_count").value_or(0);
    const int64_t n_expert = expert_count > 1 ? expert_count : 0;  // llama.cpp reads 1 as none
    const int64_t n_expert_used = meta_int("expert_used_count").value_or(0);
    if (n_expert > 0)
        std::printf("experts       %lld per layer, %lld per token (%s top-%lld%s), expert FFN %lld; "
                    "decode reads the router and %lld of %lld experts\n",
                    (long long)n_expert, (long long)n_expert_used, arch == "gpt-oss" ? "logits'" : "softmax",
                    (long long)n_expert_used, arch == "gpt-oss" ? ", a softmax over them" : ", renormalized",
                    (long long)meta_int("expert_feed_forward_length").value_or(n_ff), (long long)n_expert_used,
                    (long long)n_expert);

    struct TypeUse {
        int64_t n_tensors = 0, n_elements = 0, n_bytes = 0;
    };
    std::map<std::string, TypeUse> by_type;
    int64_t n_params = 0, bytes_total = 0, bytes_per_token = 0;
    for (const GgufTensorInfo& t : g.tensors()) {
        TypeUse& u = by_type[ggml_type_name((uint32_t)t.type)];
        u.n_tensors++;
        u.n_elements += t.n_elements();
        u.n_bytes += (int64_t)t.n_bytes;
        n_params += t.n_elements();
        bytes_total += (int64_t)t.n_bytes;
        // A decoded token reads every matrix once, but only its own row of the embedding table.
        const bool embedding = t.name == "token_embd.weight";
        const bool output_tied = embedding && !g.find_tensor("output.weight");
        // A mixture of experts reads expert_used_count of expert_count experts per token.
        const bool experts = t.name.find("_exps.") != std::string::npos;  // their weights and biases
        if (experts && n_expert > 0)
            bytes_per_token += (int64_t)t.n_bytes / n_expert * n_expert_used;
        else
            bytes_per_token += embedding && !output_tied ? (int64_t)t.n_bytes / std::max<int64_t>(1, t.ne[1]) : (int64_t)t.n_bytes;
    }
    std::printf("parameters    %.3f M in %zu tensors, %s\n", (double)n_params / 1e6, g.tensors().size(), human_bytes((double)bytes_total).c_str());
    std::printf("tensor types ");
    if (by_type.empty()) std::printf(" none (a vocabulary-only file)");
    for (const auto& [name, u] : by_type)
        std::printf(" %s: %lld tensors, %s (%.2f bits/weight);", name.c_str(), (long long)u.n_tensors, human_bytes((double)u.n_bytes).c_str(),
                    u.n_elements ? 8.0 * (double)u.n_bytes / (double)u.n_elements : 0.0);
    std::printf("\n");

    const std::string tok_model = std::string(g.get_string("tokenizer.ggml.model").value_or("(none)"));
    const std::string tok_pre = std::string(g.get_string("tokenizer.ggml.pre").value_or("(none: default)"));
    std::printf("tokenizer     %s, pre-tokenizer %s, %lld tokens\n", tok_model.c_str(), tok_pre.c_str(), (long long)n_vocab);
    if (auto t = g.get_string("tokenizer.chat_template"))
        std::printf("chat template yes (%zu bytes; tool calls: %s)\n", t->size(), tool_call_format_name(detect_tool_call_format(*t)));
    else
        std::printf("chat template no (a [[pool]] chat_template_file can give one; otherwise ChatML)\n");
    if (encoder) {
        // An encoder runs each input whole with no KV cache and has no LM head (cpu/encoder.h).
        static const char* pool_names[] = {"none", "mean", "cls", "last", "rank"};
        const int64_t pt = g.get_int(arch + ".pooling_type").value_or(-1);
        std::printf("encoder       %s attention, %s positions, pooling %s; embeds only (steward embed, /v1/embeddings): "
                    "no KV cache, no generation\n",
                    g.get_bool(arch + ".attention.causal").value_or(true) ? "causal" : "bidirectional",
                    arch == "bert" ? "absolute" : "rotary", pt >= 0 && pt <= 4 ? pool_names[pt] : "not declared (last)");
        std::printf("cpu kernels   %s on %s (supported: %s; STEWARD_CPU_LEVEL lowers it)\n", cpu_level_name(cpu_level()),
                    cpu_features().model_name.c_str(), cpu_level_name(cpu_level_supported()));
        return 0;
    }
    // KV per token: K and V, every layer, n_head_kv x head_dim elements each.
    const int64_t kv_elems = 2 * n_layer * n_head_kv * head_dim;
    std::printf("KV per token  %s in F32, %s in F16 (%lld bytes in F16: 2 x %lld layers x %lld KV heads x %lld head dim); a %lld-token context: %s in F16\n",
                human_bytes(4.0 * (double)kv_elems).c_str(), human_bytes(2.0 * (double)kv_elems).c_str(), (long long)(2 * kv_elems),
                (long long)n_layer,
                (long long)n_head_kv, (long long)head_dim, (long long)n_ctx, human_bytes(2.0 * (double)kv_elems * (double)n_ctx).c_str());
    // The same per KV cache type ([[pool]] kv_type_k / kv_type_v, docs/kv-cache-types.md): K and V
    // both of that type (a mixed pair is the mean of the two lines).
    std::printf("KV per token by cache type (K and V both; a %lld-token context in brackets):\n", (long long)n_ctx);
    for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::Q8_0, KvDtype::Q4_0}) {
        if (!kv_dtype_fits(t, (int)n_head_kv, (int)head_dim)) {
            std::printf("  %-5s n/a: head dim %lld x %lld KV heads fits no blocks of %d (needs head dim %% %d == 0, or head "
                        "dim dividing %d with KV heads x head dim %% %d == 0)\n",
                        kv_dtype_name(t), (long long)head_dim, (long long)n_head_kv, kv_dtype_block_elems(t),
                        kv_dtype_block_elems(t), kv_dtype_block_elems(t), kv_dtype_block_elems(t));
            continue;
        }
        const int64_t b = 2 * n_layer * kv_row_bytes(t, n_head_kv * head_dim);
        std::printf("  %-5s %lld bytes (%s) [%s]\n", kv_dtype_name(t), (long long)b, human_bytes((double)b).c_str(),
                    human_bytes((double)b * (double)n_ctx).c_str());
    }
    std::printf("decode reads  %s of weights per token (%lld bytes: every matrix once%s, one embedding row)\n",
                human_bytes((double)bytes_per_token).c_str(), (long long)bytes_per_token,
                n_expert > 0 ? ", the active experts only" : "");
    std::printf("cpu kernels   %s on %s (supported: %s; STEWARD_CPU_LEVEL lowers it)\n", cpu_level_name(cpu_level()),
                cpu_features().model_name.c_str(), cpu_level_name(cpu_level_supported()));
    std::printf("cpu plan      %s\n", describe_cpu_plan(start_cpu_plan()).c_str());
    for (GgmlType t : g.matrix_types()) std::printf("  %-7s %s\n", ggml_type_name((uint32_t)t), matmul_variant(t).c_str());
    return 0;
}

}  // namespace steward
