// Chain speculation for the engine: settings, n-gram and draft-model drafting, verification.
#include "sched/speculate.h"

#include <algorithm>
#include <string>

#include "spec/ngram.h"
#include "spec/token_tree.h"

namespace steward {

Expected<bool> check_spec_settings(const SpecSettings& s, bool has_draft_model) {
    if (s.k < 0 || s.k > k_max_spec_tokens)
        return make_error("speculation k ", std::to_string(s.k), " is outside [0, ", std::to_string(k_max_spec_tokens),
                          "]; pick a draft length in that range");
    if (s.source == SpecSource::NGRAM && (s.ngram_min_n < 1 || s.ngram_max_n < s.ngram_min_n || s.ngram_max_n > 16))
        return make_error("speculation n-gram range [", std::to_string(s.ngram_min_n), ", ", std::to_string(s.ngram_max_n),
                          "] is invalid; it needs 1 <= min_n <= max_n <= 16");
    if (s.source == SpecSource::DRAFT && !has_draft_model)
        return make_error("speculation source 'draft' asked of a pool without a draft model; configure the pool's "
                          "draft model or use source 'ngram'");
    return true;
}

Expected<bool> check_draft_model(const Model& target, const Model& draft) {
    const Tokenizer &t = target.tokenizer(), &d = draft.tokenizer();
    if (target.params().n_vocab != draft.params().n_vocab || t.n_vocab() != d.n_vocab())
        return make_error("draft model vocabulary of ", std::to_string(draft.params().n_vocab),
                          " tokens differs from the target's ", std::to_string(target.params().n_vocab),
                          "; a draft must share the target's tokenizer (use a model of the same family)");
    if (t.eos() != d.eos())
        return make_error("draft model EOS id ", std::to_string(d.eos()), " differs from the target's ",
                          std::to_string(t.eos()), "; a draft must share the target's tokenizer");
    for (int32_t i = 0; i < t.n_vocab(); i++)
        if (t.token_text(i) != d.token_text(i))
            return make_error("draft model token ", std::to_string(i), " is '", d.token_text(i), "' but the target's is '",
                              t.token_text(i), "'; a draft must share the target's tokenizer");
    return true;
}

SpecDraft draft_ngram(std::span<const int32_t> all_tokens, const SpecSettings& s, int k) {
    SpecDraft d;
    d.kind = DraftKind::CHOSEN;
    if (k <= 0) return d;
    d.tokens = ngram_propose(all_tokens, NgramParams{s.ngram_min_n, s.ngram_max_n, k});
    if ((int)d.tokens.size() > k) d.tokens.resize((size_t)k);
    return d;
}

SpecResult verify_chain(const SpecDraft& draft, std::span<const float> rows, int32_t n_vocab,
                        const SamplingParams& sp, std::mt19937_64& rng) {
    // The root's token is not read by verification (it is already the sequence's); -1 marks it.
    const TokenTree tree = make_chain(-1, draft.tokens);
    const Verdict v = sp.temperature > 0.0f
                          ? verify_sampled(tree, rows, n_vocab, sp, draft.kind, draft.probs, rng)
                          : verify_greedy(tree, rows, n_vocab);
    SpecResult r;
    r.n_accepted = (int)v.accepted.size();
    for (int32_t id : v.accepted) r.tokens.push_back(tree.node(id).token);
    r.tokens.push_back(v.token);
    return r;
}

DraftModel::DraftModel(const Model& draft, int n_blocks, int block_size, KvDtype dtype, int n_threads, int max_tokens)
    : model_(draft),
      fwd_(draft, n_threads, max_tokens),
      kv_(KvStorage::config_for(draft.params(), n_blocks, block_size, dtype)),
      mgr_(n_blocks, block_size) {}

bool DraftModel::grow(SeqId seq, std::span<const int32_t> tokens) {
    const int n_before = mgr_.seq(seq).n_tokens();
    mgr_.append_tokens(seq, tokens);
    const SeqKv& kv = mgr_.seq(seq);
    if (!mgr_.allocate_slots(seq, kv.n_tokens() - kv.n_computed)) {  // no prefix cache: never a copy
        mgr_.truncate(seq, n_before);
        return false;
    }
    return true;
}

Expected<SpecDraft> DraftModel::propose(SeqId* seq, std::span<const int32_t> all_tokens, int k, const SamplingParams& sp,
                                        std::mt19937_64& rng) {
    SpecDraft d;
    const bool sampled = sp.temperature > 0.0f;
    d.kind = sampled ? DraftKind::SAMPLED : DraftKind::CHOSEN;
    const int V = model_.params().n_vocab;
    if (k <= 0 || all_tokens.empty()) return d;
    if (!*seq) *seq = mgr_.add_seq(0, {});
    // The draft's tokens are a prefix of the target's (rollback keeps it so); catch up on the rest,
    // root included, in chunks that fit one forward.
    {
        const SeqKv& kv = mgr_.seq(*seq);
        const int lim = std::min<int>(kv.n_computed, (int)all_tokens.size());
        int common = 0;
        while (common < lim && kv.tokens[(size_t)common] == all_tokens[(size_t)common]) common++;
        mgr_.truncate(*seq, common);
    }
    if (!grow(*seq, all_tokens.subspan(mgr_.seq(*seq).n_tokens()))) return d;
    if (sampled) d.probs.assign((size_t)(k + 1) * V, 0.0f);
    for (int i = 0; i < k; i++) {
        // Feed what the draft has not computed (the catch-up and root first, then the last draft
        // token) and read the logits after it.
        for (;;) {
            const SeqKv& kv = mgr_.seq(*seq);
            const int n = std::min(kv.n_tokens() - kv.n_computed, fwd_.max_tokens());
            SeqInput in;
            in.n_past = kv.n_computed;
            in.tokens = std::span<const int32_t>(kv.tokens).subspan((size_t)kv.n_computed, (size_t)n);
            in.block_table = kv.blocks;
            const bool last = kv.n_computed + n == kv.n_tokens();
            in.logits = last ? LogitsMode::LAST : LogitsMode::NONE;
            auto r = fwd_.forward(kv_, std::span<const SeqInput>(&in, 1), logits_);
            if (!r) return r.error();
            mgr_.commit_computed(*seq, n);
            if (last) break;
        }
        const std::span<const float> row(logits_.data(), (size_t)V);
        int32_t tok;
        if (sampled) {
            std::vector<float> q = dense_distribution(row, sp);
            // Drawn by inverse CDF over ascending ids, 53-bit uniforms as the sampler draws.
            double total = 0.0;
            for (float x : q) total += x;
            const double u = (double)(rng() >> 11) * 0x1.0p-53 * total;
            double cum = 0.0;
            tok = -1;
            for (int32_t t = 0; t < V; t++) {
                if (!(q[(size_t)t] > 0.0f)) continue;
                tok = t;
                cum += q[(size_t)t];
                if (u < cum) break;
            }
            if (tok < 0) break;  // nothing drawable: stop the chain here
            std::copy(q.begin(), q.end(), d.probs.begin() + (size_t)i * V);
        } else {
            tok = argmax(row);
        }
        d.tokens.push_back(tok);
        // The last draft token is only proposed; every earlier one is fed for the next.
        if (i + 1 < k && !grow(*seq, std::span<const int32_t>(&tok, 1))) break;
    }
    if (sampled) d.probs.resize((size_t)(d.k() + 1) * V);
    // The draft token not fed stays out of the draft's tokens: the draft's known tokens are exactly
    // its computed ones after every proposal, so the rollback below has only KV to discard.
    mgr_.truncate(*seq, mgr_.seq(*seq).n_computed);
    return d;
}

void DraftModel::rollback(SeqId seq, int n_valid) {
    if (!seq) return;
    mgr_.truncate(seq, std::min(n_valid, mgr_.seq(seq).n_tokens()));
}

void DraftModel::release(SeqId* seq) {
    if (*seq) mgr_.free(*seq);
    *seq = 0;
}

int32_t shared_kv_blocks(const Model& target, const Model& draft, int32_t n_blocks, int block_size, KvDtype dtype) {
    const double tb = (double)kv_bytes(KvStorage::config_for(target.params(), 1, block_size, dtype));
    const double db = (double)kv_bytes(KvStorage::config_for(draft.params(), 1, block_size, dtype));
    return std::max<int32_t>(1, (int32_t)((double)n_blocks * tb / (tb + db)));
}

}  // namespace steward

// ---- the engine's two hooks (declared in sched/engine.h): draft before the forward, commit after

#include "sched/engine.h"

namespace steward {

SpecDraft Engine::draft_for(Seq& s, int max_k, const std::function<bool(Seq&, int)>& alloc) {
    const SpecSettings& spec = s.req.spec;
    if (!spec.enabled() || max_k <= 0 || s.n_generated == 0 || !s.kv) return {};
    const SeqKv& kv = mgr_.seq(s.kv);
    if (kv.n_tokens() - kv.n_computed != 1) return {};  // only a decode step (the root is its one new token)
    // At most max_tokens - 1 drafts (the target adds one) and no position past the context.
    const int ctx = model_.params().n_ctx_train;
    const int k = std::min({spec.k, max_k, s.req.max_tokens - s.n_generated - 1, ctx - (int)s.all_tokens.size()});
    if (k <= 0) return {};
    SpecDraft d;
    if (spec.source == SpecSource::NGRAM) {
        d = draft_ngram(s.all_tokens, spec, k);
    } else if (spec.source == SpecSource::DRAFT && draft_) {
        // A failing draft forward only costs the speculation: the step decodes plainly.
        auto r = draft_->propose(&s.draft_kv, s.all_tokens, k, s.req.sampling, s.sampler.rng());
        if (!r) return {};
        d = std::move(*r);
    }
    if (d.k() == 0) return {};
    const int n_before = kv.n_tokens();
    mgr_.append_tokens(s.kv, d.tokens);
    // Slots for the drafts too; without room the step decodes plainly (speculation never preempts).
    if (!alloc(s, 1 + d.k())) {
        mgr_.truncate(s.kv, n_before);
        return {};
    }
    return d;
}

void Engine::apply_spec(Seq& s, const SpecDraft& d, std::span<const float> rows, std::vector<EngineEvent>& events,
                        bool& finished) {
    const int V = model_.params().n_vocab;
    const int ctx = model_.params().n_ctx_train;
    const int k = d.k();
    const SamplingParams& sp = s.req.sampling;
    const int n_past = mgr_.seq(s.kv).n_computed;  // the root's slot
    if (sp.adjusts_logits()) {
        // Row i follows the output so far plus drafts [0, i): the penalties the plain path would see.
        spec_rows_.assign(rows.begin(), rows.end());
        std::vector<int32_t> out(s.all_tokens.end() - s.n_generated, s.all_tokens.end());
        for (int i = 0; i <= k; i++) {
            adjust_logits(std::span<float>(spec_rows_).subspan((size_t)i * V, (size_t)V), sp, out);
            if (i < k) out.push_back(d.tokens[(size_t)i]);
        }
        rows = spec_rows_;
    }
    const SpecResult r = verify_chain(d, rows, V, sp, s.sampler.rng());
    s.n_drafts++;
    s.n_draft_tokens += k;
    s.n_accepted_tokens += r.n_accepted;
    for (int i = 0; i < k; i++) s.n_draft_tokens_at[(size_t)i]++;
    for (int i = 0; i < r.n_accepted; i++) s.n_accepted_at[(size_t)i]++;
    stats_.n_drafts++;
    stats_.n_draft_tokens += k;
    stats_.n_accepted_tokens += r.n_accepted;

    // Append token by token with the plain path's stop rules: an EOS ends the request there (not
    // output), as do max_tokens and the context.
    std::vector<int32_t> toks;
    std::vector<float> lps;
    std::vector<std::vector<TokenLogprob>> tops;
    FinishReason why = FinishReason::STOP;
    finished = false;
    for (size_t j = 0; j < r.tokens.size(); j++) {
        const int32_t tok = r.tokens[j];
        const std::span<const float> row = rows.subspan(j * (size_t)V, (size_t)V);
        if (s.req.stop_at_eos && model_.tokenizer().is_eog(tok)) {
            finished = true;
            why = FinishReason::STOP;
            break;
        }
        s.all_tokens.push_back(tok);
        s.n_generated++;
        toks.push_back(tok);
        lps.push_back(token_logprob(row, tok));
        if (sp.n_top_logprobs > 0) tops.push_back(top_logprobs(row, sp.n_top_logprobs));
        if (s.n_generated >= s.req.max_tokens || (int)s.all_tokens.size() >= ctx) {
            finished = true;
            why = FinishReason::LENGTH;
            break;
        }
    }
    // KV: the root and the accepted drafts that were output stay computed; the rest is rolled back
    // (blocks past the new end go back to the pool). Publishing only now means the prefix cache
    // never indexes a rejected token. An output target token is known, not computed, as in decode.
    const int m = (int)toks.size();
    const int n_keep = std::min(m, r.n_accepted);
    mgr_.truncate(s.kv, n_past + 1 + n_keep);
    mgr_.commit_computed(s.kv, 1 + n_keep);
    if (m > n_keep) mgr_.append_tokens(s.kv, std::span<const int32_t>(&s.all_tokens.back(), 1));
    if (opt_.prefix_cache) mgr_.publish_full_blocks(s.kv);
    if (draft_) draft_->rollback(s.draft_kv, n_past + 1 + n_keep);
    if (n_keep < k) {
        s.n_rollbacks++;
        stats_.n_rollbacks++;
    }

    EngineEvent e = make_event(s);
    e.tokens = std::move(toks);
    e.logprobs = std::move(lps);
    e.top_logprobs = std::move(tops);
    e.finished = finished;
    e.finish = why;
    events.push_back(std::move(e));
}

}  // namespace steward
