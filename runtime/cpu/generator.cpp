// Prefill the prompt in chunks of the backend's max batch, then decode one token at a time.
#include "cpu/generator.h"

#include <chrono>

#include "config/limits.h"

namespace steward {

Generator::Generator(const Model& model, int n_threads, KvDtype kv_dtype, int block_size,
                     std::optional<KvDtype> kv_dtype_v)
    : model_(model),
      fwd_(model, n_threads, 512),
      kv_dtype_(kv_dtype),
      kv_dtype_v_(kv_dtype_v.value_or(kv_dtype)),
      block_size_(block_size) {}

Expected<GenerateStats> Generator::generate(std::vector<int32_t> prompt, int n_predict, const SamplingParams& sp,
                                            const std::function<bool(int32_t, float)>& on_token) {
    using clock = std::chrono::steady_clock;
    const ModelParams& p = model_.params();
    const Tokenizer& tok = model_.tokenizer();
    if (prompt.empty()) {
        if (tok.bos() < 0) return make_error("empty prompt and the vocabulary has no BOS token to start from");
        prompt.push_back(tok.bos());
    }
    if ((int64_t)prompt.size() + n_predict > p.n_ctx_train)
        return make_error("prompt of ", std::to_string(prompt.size()), " tokens + ", std::to_string(n_predict),
                          " to generate exceeds the model's context of ", std::to_string(p.n_ctx_train),
                          " tokens; shorten the prompt or lower -n");
    if (n_predict < 0) return make_error("n_predict is ", std::to_string(n_predict), "; it must be >= 0");
    if (auto ok = check_sampling(sp); !ok) return ok.error();
    const int n_blocks = (int)(((int64_t)prompt.size() + n_predict + block_size_ - 1) / block_size_);
    if (!kv_ || kv_->config().n_blocks < n_blocks) {
        const KvConfig kc = KvStorage::config_for(p, n_blocks, block_size_, kv_dtype_, kv_dtype_v_);
        if (auto ok = check_kv_types(kc, false); !ok) return ok.error();
        if (auto m = check_memory((double)kv_bytes(kc), "the KV of " + std::to_string((int64_t)prompt.size() + n_predict) + " tokens",
                                  "shorten the prompt or lower -n");
            !m)
            return m.error();
        kv_.reset();  // free the old one first
        kv_ = std::make_unique<KvStorage>(kc);
        table_.resize(n_blocks);
        for (size_t i = 0; i < table_.size(); i++) table_[i] = (int32_t)i;
    }
    KvStorage& kv = *kv_;
    GenerateStats st;
    st.n_prompt = (int)prompt.size();
    Sampler sampler(sp);
    std::vector<float> logits;
    auto t0 = clock::now();
    int n_past = 0;
    for (size_t b = 0; b < prompt.size(); b += fwd_.max_tokens()) {
        const size_t e = std::min(prompt.size(), b + fwd_.max_tokens());
        SeqInput in;
        in.n_past = n_past;
        in.tokens = std::span<const int32_t>(prompt.data() + b, e - b);
        in.block_table = table_;
        in.logits = e == prompt.size() ? LogitsMode::LAST : LogitsMode::NONE;
        auto r = fwd_.forward(kv, std::span<const SeqInput>(&in, 1), logits);
        if (!r) return r.error();
        n_past = (int)e;
    }
    auto t1 = clock::now();
    st.prefill_s = std::chrono::duration<double>(t1 - t0).count();
    for (int k = 0; k < n_predict; k++) {
        const Sampled s = sampler.sample(logits);
        if (tok.is_eog(s.token)) break;
        st.n_generated++;
        if (!on_token(s.token, s.logprob)) break;
        if (k + 1 == n_predict) break;
        SeqInput in;
        in.n_past = n_past;
        in.tokens = std::span<const int32_t>(&s.token, 1);
        in.block_table = table_;
        auto r = fwd_.forward(kv, std::span<const SeqInput>(&in, 1), logits);
        if (!r) return r.error();
        n_past++;
    }
    st.decode_s = std::chrono::duration<double>(clock::now() - t1).count();
    return st;
}

}  // namespace steward
