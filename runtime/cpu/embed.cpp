// Embeddings: group the inputs into forwards of at most max_tokens tokens (a longer input alone, in
// chunks over its own KV), take each token's final-norm hidden state, pool per input, normalise.
#include "cpu/embed.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace steward {

namespace {

// Token slots per block of the embedder's own KV: any power of two works; the KV lives one call.
constexpr int kEmbedBlockSize = 16;

int blocks_for(int64_t n_tok) {
    return (int)((n_tok + kEmbedBlockSize - 1) / kEmbedBlockSize);
}

// One input's pooled vector, built from its hidden rows as they come (one forward, or chunk after chunk).
struct PoolAccumulator {
    Pooling pooling;
    std::vector<float>& out;  // [n_embd]: the chosen row (cls, last), the mean once finished
    int n_embd;
    int64_t n_seen = 0;
    std::vector<double> sum = std::vector<double>((size_t)(pooling == Pooling::MEAN ? n_embd : 0));  // [n_embd]
    // rows [n][n_embd]: the input's next n tokens' hidden states.
    void take(const float* rows, int n) {
        if (n <= 0) return;
        if (pooling == Pooling::MEAN) {  // in double: a long context's sum keeps its small rows
            for (int t = 0; t < n; t++)
                for (int e = 0; e < n_embd; e++) sum[(size_t)e] += rows[(int64_t)t * n_embd + e];
        } else if (pooling == Pooling::CLS) {
            if (n_seen == 0) std::copy(rows, rows + n_embd, out.begin());
        } else {
            std::copy(rows + (int64_t)(n - 1) * n_embd, rows + (int64_t)n * n_embd, out.begin());
        }
        n_seen += n;
    }
    void finish() {
        if (pooling == Pooling::MEAN && n_seen > 0)
            for (int e = 0; e < n_embd; e++) out[(size_t)e] = (float)(sum[(size_t)e] / (double)n_seen);
        l2_normalize(out);
    }
};

}  // namespace

const char* pooling_name(Pooling p) {
    switch (p) {
        case Pooling::MEAN: return "mean";
        case Pooling::CLS: return "cls";
        case Pooling::LAST: return "last";
    }
    return "?";
}

std::optional<Pooling> parse_pooling(std::string_view name) {
    if (name == "mean") return Pooling::MEAN;
    if (name == "cls") return Pooling::CLS;
    if (name == "last") return Pooling::LAST;
    return std::nullopt;
}

Expected<Pooling> embedding_pooling(const ModelParams& p, const std::string& configured) {
    if (!configured.empty()) {
        if (auto v = parse_pooling(configured)) return *v;
        return make_error("pooling \"", configured, "\" is not one Steward runs; use \"mean\", \"last\" or \"cls\"");
    }
    switch (p.pooling_type) {
        case -1: return Pooling::LAST;
        case 1: return Pooling::MEAN;
        case 2: return Pooling::CLS;
        case 3: return Pooling::LAST;
        case 0:
            return make_error("the model declares ", p.arch,
                              ".pooling_type 0 (none: a vector per token), which "
                              "/v1/embeddings cannot answer; set the pool's pooling = \"mean\", \"last\" or \"cls\"");
        case 4:
            return make_error(
                "the model declares ", p.arch,
                ".pooling_type 4 (rank: a reranker's score, not an "
                "embedding); set the pool's pooling = \"mean\", \"last\" or \"cls\" to embed with it anyway");
    }
    return make_error("the model declares ", p.arch, ".pooling_type ", p.pooling_type,
                      ", which is none of llama.cpp's (1 mean, 2 cls, 3 last); set the pool's pooling = \"mean\", "
                      "\"last\" or \"cls\"");
}

void l2_normalize(std::span<float> v) {
    double ss = 0.0;
    for (float x : v) ss += (double)x * x;
    const double norm = std::sqrt(ss);
    if (!(norm > 0.0)) return;
    for (float& x : v) x = (float)(x / norm);
}

std::vector<float> pool_hidden(std::span<const float> hidden, int n_tok, int n_embd, Pooling pooling) {
    std::vector<float> out((size_t)n_embd, 0.0f);
    PoolAccumulator acc{pooling, out, n_embd};
    acc.take(hidden.data(), n_tok);
    acc.finish();
    return out;
}

CpuEmbedder::CpuEmbedder(const Model& model, int n_threads, int max_tokens, KvDtype kv_dtype,
                         std::optional<KvDtype> kv_dtype_v)
    : kv_dtype_(kv_dtype), kv_dtype_v_(kv_dtype_v.value_or(kv_dtype)) {
    if (model.params().is_encoder())
        enc_ = std::make_unique<CpuEncoder>(model, n_threads);
    else
        fwd_ = std::make_unique<CpuForward>(model, n_threads, std::max(1, max_tokens));
}

Expected<std::vector<std::vector<float>>> CpuEmbedder::embed(std::span<const std::vector<int32_t>> inputs,
                                                             Pooling pooling) {
    const ModelParams& p = (fwd_ ? fwd_->model() : enc_->model()).params();
    const int E = p.n_embd;
    for (size_t i = 0; i < inputs.size(); i++) {
        const auto& in = inputs[i];
        if (in.empty()) return make_error("input ", i, " has no tokens; give it some text or token ids");
        if ((int64_t)in.size() > p.n_ctx_train)
            return make_error("input ", i, " has ", in.size(), " tokens, over the model's context of ", p.n_ctx_train,
                              " tokens; shorten it");
        for (int32_t id : in)
            if (id < 0 || id >= p.n_vocab)
                return make_error("input ", i, ": token id ", id, " is outside the vocabulary of ", p.n_vocab, " ids");
    }
    std::vector<std::vector<float>> out(inputs.size(), std::vector<float>((size_t)E, 0.0f));
    if (enc_) {  // an encoder: each input whole (its tokens attend to each other, both ways)
        for (size_t k = 0; k < inputs.size(); k++) {
            auto ok = enc_->encode(inputs[k], hidden_);
            if (!ok) return make_error("input ", k, ": ", ok.error().message);
            PoolAccumulator acc{pooling, out[k], E};
            acc.take(hidden_.data(), (int)inputs[k].size());
            acc.finish();
        }
        return out;
    }
    const int64_t T = fwd_->max_tokens();
    size_t i = 0;
    while (i < inputs.size()) {
        // Inputs [i, j) share one forward when together they fit max_tokens.
        size_t j = i;
        int64_t n_tok = 0;
        while (j < inputs.size() && n_tok + (int64_t)inputs[j].size() <= T) n_tok += (int64_t)inputs[j++].size();
        if (j == i) {
            // Longer than one forward: chunks over its own KV, each attending to those before.
            const auto& in = inputs[i];
            KvStorage kv(KvStorage::config_for(p, blocks_for((int64_t)in.size()), kEmbedBlockSize, kv_dtype_, kv_dtype_v_));
            std::vector<int32_t> table((size_t)blocks_for((int64_t)in.size()));
            for (size_t b = 0; b < table.size(); b++) table[b] = (int32_t)b;
            PoolAccumulator acc{pooling, out[i], E};
            for (int64_t c = 0; c < (int64_t)in.size(); c += T) {
                const int64_t n = std::min<int64_t>(T, (int64_t)in.size() - c);
                SeqInput s;
                s.n_past = (int32_t)c;
                s.tokens = std::span<const int32_t>(in.data() + c, (size_t)n);
                s.block_table = table;
                s.logits = LogitsMode::NONE;
                auto ok = fwd_->hidden_states(kv, std::span<const SeqInput>(&s, 1), hidden_);
                if (!ok) return make_error("input ", i, ": ", ok.error().message);
                acc.take(hidden_.data(), (int)n);
            }
            acc.finish();
            i++;
            continue;
        }
        // One forward over inputs [i, j): each its own blocks of one KV, made for this forward.
        int n_blocks = 0;
        for (size_t k = i; k < j; k++) n_blocks += blocks_for((int64_t)inputs[k].size());
        KvStorage kv(KvStorage::config_for(p, n_blocks, kEmbedBlockSize, kv_dtype_, kv_dtype_v_));
        std::vector<int32_t> ids((size_t)n_blocks);  // sequence k's table is a run of these
        for (int b = 0; b < n_blocks; b++) ids[(size_t)b] = b;
        std::vector<SeqInput> batch;
        int first_block = 0;
        for (size_t k = i; k < j; k++) {
            SeqInput s;
            s.tokens = inputs[k];
            const int nb = blocks_for((int64_t)inputs[k].size());
            s.block_table = std::span<const int32_t>(ids.data() + first_block, (size_t)nb);
            s.logits = LogitsMode::NONE;
            first_block += nb;
            batch.push_back(s);
        }
        auto ok = fwd_->hidden_states(kv, batch, hidden_);
        if (!ok) return make_error("inputs ", i, "..", j - 1, ": ", ok.error().message);
        int64_t row = 0;
        for (size_t k = i; k < j; k++) {
            PoolAccumulator acc{pooling, out[k], E};
            acc.take(hidden_.data() + row * E, (int)inputs[k].size());
            acc.finish();
            row += (int64_t)inputs[k].size();
        }
        i = j;
    }
    return out;
}

}  // namespace steward
