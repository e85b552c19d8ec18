// Speculation for the engine: settings, n-gram / draft-model / self drafting as chains and trees,
// verification, and the engine's hooks (draft before the step's forward, commit after it).
#include "sched/speculate.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "spec/ngram.h"
#include "spec/suffix.h"

namespace steward {

Expected<bool> check_spec_settings(const SpecSettings& s, bool has_draft_model, int n_target_layers) {
    if (s.k < 0 || s.k > k_max_spec_tokens)
        return make_error("speculation k ", std::to_string(s.k), " is outside [0, ", std::to_string(k_max_spec_tokens),
                          "]; pick a draft length in that range");
    if (s.source == SpecSource::NGRAM && (s.ngram_min_n < 1 || s.ngram_max_n < s.ngram_min_n || s.ngram_max_n > 16))
        return make_error("speculation n-gram range [", std::to_string(s.ngram_min_n), ", ",
                          std::to_string(s.ngram_max_n), "] is invalid; it needs 1 <= min_n <= max_n <= 16");
    if (s.source == SpecSource::DRAFT && !has_draft_model)
        return make_error(
            "speculation source 'draft' asked of a pool without a draft model; configure the pool's "
            "draft model or use source 'ngram'");
    if (s.source == SpecSource::SELF && n_target_layers < 2)
        return make_error("speculation source 'self' asked of a target of ", std::to_string(n_target_layers),
                          " layer(s); self-speculation drafts with fewer layers than the target, so it needs at least "
                          "2; use source 'ngram' or a draft model");
    if (s.source == SpecSource::SELF && (s.self_layers < 1 || s.self_layers >= n_target_layers))
        return make_error("speculation self_layers ", std::to_string(s.self_layers), " is outside [1, ",
                          std::to_string(n_target_layers - 1), "] for a target of ", std::to_string(n_target_layers),
                          " layers; the self-draft runs the target's first self_layers layers, fewer than all of them");
    if (s.source == SpecSource::SUFFIX && (s.suffix_min_match < 1 || s.suffix_min_match > 16 || !(s.suffix_min_prob >= 0) ||
                                           s.suffix_min_prob > 1))
        return make_error("speculation suffix min_match ", std::to_string(s.suffix_min_match), " / min_prob ",
                          std::to_string(s.suffix_min_prob), " is invalid; it needs 1 <= min_match <= 16 and 0 <= min_prob <= 1");
    if (s.tree != SpecTree::CHAIN) {
        if (s.source == SpecSource::NGRAM)
            return make_error("speculation tree asked with source 'ngram'; its drafts are chains: use tree 'chain', "
                              "or source 'draft' / 'self' / 'suffix' (tree 'dynamic') for a tree");
        if (s.source == SpecSource::SUFFIX && s.tree != SpecTree::DYNAMIC)
            return make_error("speculation tree 'fixed' asked with source 'suffix'; a suffix tree grows where its "
                              "history branches: use tree 'dynamic' or 'chain'");
        if (s.tree_branch < 1 || s.tree_branch > k_max_tree_branch)
            return make_error("speculation tree_branch ", std::to_string(s.tree_branch), " is outside [1, ",
                              std::to_string(k_max_tree_branch), "]; pick the children per node in that range");
        if (s.tree_depth < 1 || s.tree_depth > k_max_spec_tokens)
            return make_error("speculation tree_depth ", std::to_string(s.tree_depth), " is outside [1, ",
                              std::to_string(k_max_spec_tokens), "]; pick the tree's depth in that range");
    }
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
            return make_error("draft model token ", std::to_string(i), " is '", d.token_text(i),
                              "' but the target's is '", t.token_text(i),
                              "'; a draft must share the target's tokenizer");
    return true;
}

bool speculation_control(uint64_t id, double share) {
    if (!(share > 0)) return false;
    uint64_t z = id + 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53 < share;
}

SpecDraft draft_ngram(std::span<const int32_t> all_tokens, const SpecSettings& s, int k) {
    SpecDraft d;
    d.kind = DraftKind::CHOSEN;
    if (k <= 0) return d;
    d.tokens = ngram_propose(all_tokens, NgramParams{s.ngram_min_n, s.ngram_max_n, k});
    if ((int)d.tokens.size() > k) d.tokens.resize((size_t)k);
    return d;
}

SpecDraft draft_suffix(std::span<const int32_t> all_tokens, const std::deque<SuffixCorpus::Text>* corpus,
                       const SpecSettings& s, int k, int max_depth) {
    SpecDraft d;
    d.kind = DraftKind::CHOSEN;
    if (k <= 0) return d;
    SuffixParams p;
    p.min_match = s.suffix_min_match;
    p.min_prob = s.suffix_min_prob;
    p.k = k;
    if (s.tree == SpecTree::CHAIN) {
        d.tokens = suffix_propose(all_tokens, corpus, p).tokens;
        return d;
    }
    // A tree where the history branches (k nodes at most, max_depth deep); one without a branch is
    // verified as the chain it is.
    SuffixTree t = suffix_propose_tree(all_tokens, corpus, p, max_depth);
    bool branches = false;
    for (size_t i = 0; i < t.parents.size(); i++) branches = branches || t.parents[i] != (int32_t)i;
    d.tokens = std::move(t.tokens);
    if (branches) d.parents = std::move(t.parents);
    return d;
}

TokenTree SpecDraft::tree() const {
    // The root's token is not read by verification (it is already the sequence's); -1 marks it.
    if (parents.empty()) return make_chain(-1, tokens);
    TokenTree t(-1);
    for (size_t i = 0; i < tokens.size(); i++) t.add(parents[i], tokens[i], 1.0f);
    return t;
}

SpecResult verify_decided(const SpecDraft& draft, std::span<const int32_t> row_tokens) {
    SpecResult r;
    int node = 0;
    for (;;) {
        const int32_t want = row_tokens[(size_t)node];
        int next = -1;
        for (int i = 1; i <= draft.k() && next < 0; i++) {
            const int parent = draft.is_tree() ? draft.parents[(size_t)i - 1] : i - 1;
            if (parent == node && draft.tokens[(size_t)i - 1] == want) next = i;
        }
        if (next < 0) break;
        r.tokens.push_back(want);
        r.nodes.push_back(node);
        r.n_accepted++;
        node = next;
    }
    r.tokens.push_back(row_tokens[(size_t)node]);
    r.nodes.push_back(node);
    return r;
}

SpecResult verify_draft(const SpecDraft& draft, std::span<const float> rows, int32_t n_vocab, const SamplingParams& sp,
                        std::mt19937_64& rng) {
    const TokenTree tree = draft.tree();
    const Verdict v = sp.temperature > 0.0f ? verify_sampled(tree, rows, n_vocab, sp, draft.kind, draft.probs, rng)
                                            : verify_greedy(tree, rows, n_vocab);
    SpecResult r;
    r.n_accepted = (int)v.accepted.size();
    r.nodes.push_back(0);
    for (int32_t id : v.accepted) {
        r.tokens.push_back(tree.node(id).token);
        r.nodes.push_back(id);
    }
    r.tokens.push_back(v.token);
    return r;
}

KvConfig kv_config_for_layers(const Model& m, int n_blocks, int block_size, KvDtype dtype_k, KvDtype dtype_v,
                               int n_layers) {
    KvConfig c = KvStorage::config_for(m.params(), n_blocks, block_size, dtype_k, dtype_v);
    c.n_layer = forward_layers(m.params(), n_layers);
    return c;
}

namespace {

// One draw from q (weights, not necessarily normalised) by inverse CDF over ascending ids, zero
// weights skipped, 53-bit uniforms as the sampler draws. -1 when nothing is drawable.
int32_t draw_token(std::span<const float> q, std::mt19937_64& rng) {
    double total = 0.0;
    for (float x : q) total += x;
    if (!(total > 0.0)) return -1;
    const double u = (double)(rng() >> 11) * 0x1.0p-53 * total;
    double cum = 0.0;
    int32_t tok = -1;
    for (int32_t t = 0; t < (int32_t)q.size(); t++) {
        if (!(q[(size_t)t] > 0.0f)) continue;
        tok = t;
        cum += q[(size_t)t];
        if (u < cum) break;
    }
    return tok;
}

// The draft's distribution after a node: the request's sampling distribution when it samples (the
// one the acceptance rule compares with the target's), the plain softmax when it is greedy (there
// the probabilities only rank children and paths).
std::vector<float> draft_distribution(std::span<const float> logits, const SamplingParams& sp) {
    if (sp.temperature > 0.0f) return dense_distribution(logits, sp);
    SamplingParams plain;
    plain.temperature = 1.0f;
    return dense_distribution(logits, plain);
}

// The b most likely tokens of q (ties: the lower id, as argmax), as proposals.
std::vector<Proposal> best_children(const std::vector<float>& q, int b) {
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < (int32_t)q.size(); t++)
        if (q[(size_t)t] > 0.0f) ids.push_back(t);
    const size_t n = std::min(ids.size(), (size_t)b);
    std::partial_sort(ids.begin(), ids.begin() + (std::ptrdiff_t)n, ids.end(), [&](int32_t a, int32_t c) {
        return q[(size_t)a] > q[(size_t)c] || (q[(size_t)a] == q[(size_t)c] && a < c);
    });
    std::vector<Proposal> out;
    for (size_t i = 0; i < n; i++) out.push_back({ids[i], std::min(1.0f, q[(size_t)ids[i]])});
    return out;
}

// b tokens drawn one after the other WITHOUT replacement from q (DraftKind::SAMPLED's rule; the
// first draw is the chain's draw).
std::vector<Proposal> drawn_children(const std::vector<float>& q, int b, std::mt19937_64& rng) {
    std::vector<float> w = q;
    std::vector<Proposal> out;
    for (int c = 0; c < b; c++) {
        const int32_t t = draw_token(w, rng);
        if (t < 0) break;
        out.push_back({t, std::min(1.0f, q[(size_t)t])});
        w[(size_t)t] = 0.0f;
    }
    return out;
}

}  // namespace

DraftModel::DraftModel(const Model& draft, std::unique_ptr<ForwardBackend> backend)
    : model_(draft), be_(std::move(backend)), mgr_(be_->kv_config().n_blocks, be_->kv_config().block_size) {}

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

Expected<bool> DraftModel::feed_pending(SeqId seq) {
    for (;;) {
        const SeqKv& kv = mgr_.seq(seq);
        const int n = std::min(kv.n_tokens() - kv.n_computed, be_->max_tokens());
        if (n <= 0) return true;
        SeqInput in;
        in.n_past = kv.n_computed;
        in.tokens = std::span<const int32_t>(kv.tokens).subspan((size_t)kv.n_computed, (size_t)n);
        in.block_table = kv.blocks;
        const bool last = kv.n_computed + n == kv.n_tokens();
        in.logits = last ? LogitsMode::LAST : LogitsMode::NONE;
        auto r = be_->forward(std::span<const SeqInput>(&in, 1), logits_);
        if (!r) return r.error();
        mgr_.commit_computed(seq, n);
        if (last) return true;
    }
}

Expected<SpecDraft> DraftModel::propose(SeqId* seq, std::span<const int32_t> all_tokens, const SpecSettings& s, int k,
                                        int max_depth, const SamplingParams& sp, std::mt19937_64& rng,
                                        const DraftConstraint* constraint) {
    SpecDraft none;
    none.kind = sp.temperature > 0.0f ? DraftKind::SAMPLED : DraftKind::CHOSEN;
    last_chain_forwards_ = 0;
    last_chain_ms_ = 0;
    last_catch_up_tokens_ = 0;
    last_catch_up_ms_ = 0;
    if (k <= 0 || all_tokens.empty()) return none;
    if (!*seq) *seq = mgr_.add_seq(0, {});
    // The draft's tokens are a prefix of the target's (rollback keeps it so); catch up on the rest,
    // root included (its logits start the draft, so it is fed even if it was computed before).
    {
        const SeqKv& kv = mgr_.seq(*seq);
        const int lim = std::min<int>(kv.n_computed, (int)all_tokens.size() - 1);
        int common = 0;
        while (common < lim && kv.tokens[(size_t)common] == all_tokens[(size_t)common]) common++;
        mgr_.truncate(*seq, common);
    }
    if (!grow(*seq, all_tokens.subspan((size_t)mgr_.seq(*seq).n_tokens()))) return none;
    {
        const auto t_catch_up = std::chrono::steady_clock::now();
        last_catch_up_tokens_ = mgr_.seq(*seq).n_tokens() - mgr_.seq(*seq).n_computed;
        if (auto r = feed_pending(*seq); !r) return r.error();
        last_catch_up_ms_ =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_catch_up).count();
    }
    if (s.tree == SpecTree::CHAIN) return propose_chain(*seq, k, sp, rng, constraint);
    return propose_tree(*seq, s, k, max_depth, sp, rng);
}

Expected<SpecDraft> DraftModel::propose_chain(SeqId seq, int k, const SamplingParams& sp, std::mt19937_64& rng,
                                              const DraftConstraint* constraint) {
    SpecDraft d;
    const bool sampled = sp.temperature > 0.0f;
    d.kind = sampled ? DraftKind::SAMPLED : DraftKind::CHOSEN;
    const int V = model_.params().n_vocab;
    if (sampled) d.probs.assign((size_t)(k + 1) * V, 0.0f);
    const auto t_chain = std::chrono::steady_clock::now();
    for (int i = 0; i < k; i++) {
        // The root's logits are there; every later draft token is fed first.
        if (i > 0) {
            if (auto r = feed_pending(seq); !r) return r.error();
            last_chain_forwards_++;
        }
        std::span<const float> row(logits_.data(), (size_t)V);
        if (constraint) {
            masked_.assign(row.begin(), row.end());
            if (!constraint->mask(masked_)) break;
            row = masked_;
        }
        int32_t tok;
        if (sampled) {
            std::vector<float> q = dense_distribution(row, sp);
            tok = draw_token(q, rng);
            if (tok < 0) break;  // nothing drawable: stop the chain here
            std::copy(q.begin(), q.end(), d.probs.begin() + (size_t)i * V);
        } else {
            tok = argmax(row);
        }
        d.tokens.push_back(tok);
        if (constraint && !constraint->accept(tok)) break;
        // The last draft token is only proposed; every earlier one is fed for the next.
        if (i + 1 < k && !grow(seq, std::span<const int32_t>(&tok, 1))) break;
    }
    if (last_chain_forwards_ > 0)
        last_chain_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_chain).count();
    if (sampled) d.probs.resize((size_t)(d.k() + 1) * V);
    // The draft token not fed stays out of the draft's tokens: the draft's known tokens are exactly
    // its computed ones after every proposal, so the rollback below has only KV to discard.
    mgr_.truncate(seq, mgr_.seq(seq).n_computed);
    return d;
}

// A tree is grown a depth at a time (token_tree.h's level growers). The draft's KV holds the
// sequence up to the root; each depth's nodes are computed in ONE draft forward that feeds the
// paths to them (their union, parents first) at scratch slots after the root with positions =
// depth and the ancestor mask, which are discarded right after. Re-feeding the shallower nodes
// costs tokens, not forwards, and a small forward is bound by reading the weights, not by its
// tokens; it keeps the forward's attention contract (every slot below n_past is visible) as it is.
// After verification the draft catches up on the accepted path in the forward that feeds the
// target's new token anyway, so the tree's draft KV never needs compacting.
Expected<SpecDraft> DraftModel::propose_tree(SeqId seq, const SpecSettings& s, int k, int max_depth,
                                             const SamplingParams& sp, std::mt19937_64& rng) {
    const bool sampled = sp.temperature > 0.0f;
    const bool drawn = sampled && s.tree == SpecTree::FIXED;
    const size_t V = (size_t)model_.params().n_vocab;
    const int n_root_end = mgr_.seq(seq).n_computed;  // the root is the last computed token
    // SAMPLED only: per candidate node that got children, the q they were drawn from (the rule
    // reads it); chosen children need no distribution kept.
    std::vector<std::vector<float>> dist;
    std::vector<float> root_logits(logits_.begin(), logits_.begin() + (ptrdiff_t)V);
    std::optional<Error> failed;

    auto propose_level = [&](const TokenTree& tree, std::span<const int32_t> nodes) {
        std::vector<std::vector<Proposal>> out;
        if (drawn && dist.size() < (size_t)tree.size()) dist.resize((size_t)tree.size());
        std::vector<int32_t> at;  // node id -> its row in logits_ (the root: root_logits)
        if (!(nodes.size() == 1 && nodes[0] == 0)) {
            // The union of the paths to `nodes`, the root excluded, in id order (parents first).
            std::vector<bool> on_path((size_t)tree.size(), false);
            for (int32_t n : nodes)
                for (int32_t j = n; j > 0 && !on_path[(size_t)j]; j = tree.node(j).parent) on_path[(size_t)j] = true;
            at.assign((size_t)tree.size(), -1);
            std::vector<int32_t> fed, tokens, positions;
            for (int32_t j = 1; j < tree.size(); j++)
                if (on_path[(size_t)j]) {
                    at[(size_t)j] = (int32_t)fed.size();
                    fed.push_back(j);
                    tokens.push_back(tree.node(j).token);
                    positions.push_back(n_root_end - 1 + tree.node(j).depth);
                }
            const size_t n = fed.size();
            if ((int)n > be_->max_tokens()) return out;  // too wide for one forward: the tree stops here
            std::vector<uint8_t> mask(n * n, 0);         // [n][n] ancestors (in fed) and self
            for (size_t i = 0; i < n; i++)
                for (int32_t j = fed[i]; j > 0; j = tree.node(j).parent) mask[i * n + (size_t)at[(size_t)j]] = 1;
            if (!grow(seq, tokens)) return out;  // no room in the draft's pool: no deeper tree
            const SeqKv& kv = mgr_.seq(seq);
            SeqInput in;
            in.n_past = n_root_end;
            in.tokens = tokens;
            in.positions = positions;
            in.mask = mask;
            in.block_table = kv.blocks;
            in.logits = LogitsMode::ALL;
            auto r = be_->forward(std::span<const SeqInput>(&in, 1), logits_);
            mgr_.truncate(seq, n_root_end);  // scratch: the slots after the root are free again
            if (!r) {
                failed = r.error();
                return out;
            }
        }
        for (int32_t node : nodes) {
            const float* row = node == 0 ? root_logits.data() : logits_.data() + (size_t)at[(size_t)node] * V;
            std::vector<float> q = draft_distribution(std::span<const float>(row, V), sp);
            if (drawn) {
                out.push_back(drawn_children(q, s.tree_branch, rng));
                dist[(size_t)node] = std::move(q);
            } else {
                out.push_back(best_children(q, s.tree_branch));
            }
        }
        return out;
    };

    const GrowLimits limits{k, max_depth, s.tree_branch};
    const TokenTree tree = s.tree == SpecTree::FIXED ? grow_tree_fixed(-1, limits, propose_level)
                                                     : grow_tree_dynamic(-1, limits, propose_level);
    if (failed) return *failed;

    SpecDraft d;
    d.kind = drawn ? DraftKind::SAMPLED : DraftKind::CHOSEN;
    const bool chain = tree.is_chain();  // e.g. branch 1: verified as a plain chain
    for (int32_t id = 1; id < tree.size(); id++) {
        d.tokens.push_back(tree.node(id).token);
        if (!chain) d.parents.push_back(tree.node(id).parent);
    }
    if (drawn && d.k() > 0) {  // a fixed tree: its node ids are the candidates'
        d.probs.assign((size_t)tree.size() * V, 0.0f);
        for (int32_t id = 0; id < tree.size(); id++)
            if (!tree.children(id).empty())
                std::copy(dist[(size_t)id].begin(), dist[(size_t)id].end(),
                          d.probs.begin() + (ptrdiff_t)((size_t)id * V));
    }
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

int32_t shared_kv_blocks(const Model& target, const Model* draft, int self_layers, int32_t n_blocks, int block_size,
                         KvDtype dtype_k, KvDtype dtype_v) {
    const double tb = (double)kv_bytes(KvStorage::config_for(target.params(), 1, block_size, dtype_k, dtype_v));
    const double db =
        draft ? (double)kv_bytes(KvStorage::config_for(draft->params(), 1, block_size, dtype_k, dtype_v)) : 0.0;
    const double sb = tb * self_layers / target.params().n_layer;  // a self-draft block: its layers' share
    return std::max<int32_t>(1, (int32_t)((double)n_blocks * tb / (tb + db + sb)));
}

}  // namespace steward

// ---- the engine's hooks (declared in sched/engine.h): draft before the forward, commit after

#include "sched/engine.h"

namespace steward {

DraftModel* Engine::drafter_for(const SpecSettings& spec) {
    if (spec.source == SpecSource::DRAFT) return draft_.get();
    if (spec.source != SpecSource::SELF) return nullptr;
    // One self-draft per layer count, made on first use: the target's weights, its own KV of
    // self_layers layers with a slot for every target slot (self_layers / n_layer of the target's
    // KV bytes, outside the pool's n_blocks budget).
    auto it = self_drafts_.find(spec.self_layers);
    if (it == self_drafts_.end()) {
        std::unique_ptr<DraftModel> d;
        try {
            d = make_drafter(model_, spec.self_layers);
        } catch (const std::exception& e) {  // kept null: its requests decode without drafts from now on
            spdlog::warn("self-draft of {} layers: {}; its requests decode without drafts", spec.self_layers, e.what());
        }
        it = self_drafts_.emplace(spec.self_layers, std::move(d)).first;
    }
    return it->second.get();
}

void Engine::release_draft(Seq& s) {
    if (s.draft_owner) s.draft_owner->release(&s.draft_kv);
    s.draft_owner = nullptr;
    s.draft_kv = 0;
}

const KvManager* Engine::self_draft_kv_manager(int n_layers) const {
    auto it = self_drafts_.find(n_layers);
    return it == self_drafts_.end() || !it->second ? nullptr : &it->second->manager();
}

SpecDraft Engine::draft_for(Seq& s, int max_k) {
    const SpecSettings& spec = s.req.spec;
    if (!spec.enabled() || max_k <= 0 || s.n_generated == 0 || !s.kv) return {};
    const SeqKv& kv = mgr_.seq(s.kv);
    if (kv.n_tokens() - kv.n_computed != 1) return {};  // only a decode step (the root is its one new token)
    // Draft tokens past max_tokens - 1 (the target adds one) or past the context cannot be output: a
    // chain's length and a tree's depth stop there; a tree's width only costs the step's budget.
    const int ctx = model_.params().n_ctx_train;
    const int n_out = std::min(s.req.max_tokens - s.n_generated - 1, ctx - (int)s.all_tokens.size());
    const bool tree = spec.tree != SpecTree::CHAIN && spec.source != SpecSource::NGRAM && !sim_;  // the sim drafts chains
    const int k = tree ? std::min(spec.k, max_k) : std::min({spec.k, max_k, n_out});
    // A suffix tree is as deep as its k allows (tree_depth shapes the draft models' trees).
    const int depth = spec.source == SpecSource::SUFFIX ? std::min(k, n_out) : std::min(spec.tree_depth, n_out);
    if (k <= 0 || n_out <= 0) return {};
    // Structured output: the draft follows the grammar from the request's state (its root included),
    // on a fork: a chain proposes only tokens the constrained target can accept.
    std::optional<GrammarMatcher> gm;
    DraftConstraint dc;
    if (s.matcher) {
        gm.emplace(s.matcher->fork());
        dc.mask = [&](std::span<float> row) {
            mask_words_.resize(s.masker->n_words());
            const MaskResult r = s.masker->fill_mask(*gm, mask_words_);
            apply_mask(mask_words_, row);
            return r.n_allowed > 0;
        };
        dc.accept = [&](int32_t tok) { return !s.masker->vocab().is_eog(tok) && s.masker->accept_token(*gm, tok); };
    }
    SpecDraft d;
    if (sim_) {
        d.tokens = sim_->propose(s.req.id, s.all_tokens.size(), k, s.sim_alpha, s.sim_rng);
    } else if (spec.source == SpecSource::NGRAM || spec.source == SpecSource::SUFFIX) {
        d = spec.source == SpecSource::NGRAM
                ? draft_ngram(s.all_tokens, spec, k)
                : draft_suffix(s.all_tokens, suffix_corpus_.texts({s.req.tenant, s.req.bucket}), spec, k, depth);
        if (gm && !d.is_tree()) {  // cut at the first token the grammar rejects (it could never be accepted)
            size_t n = 0;
            while (n < d.tokens.size() && dc.accept(d.tokens[n])) n++;
            d.tokens.resize(n);
        }
    } else if (DraftModel* dm = drafter_for(spec)) {
        if (s.draft_owner != dm) release_draft(s);  // the request changed sources: its old draft KV goes
        s.draft_owner = dm;
        // A failing draft forward only costs the speculation: the step decodes plainly.
        auto r = dm->propose(&s.draft_kv, s.all_tokens, spec, k, depth, s.req.sampling, s.sampler.rng(),
                             gm ? &dc : nullptr);
        if (!r) return {};
        d = std::move(*r);
    }
    if (d.k() == 0) return {};
    const int n_before = kv.n_tokens();
    const int n_past = kv.n_computed;
    mgr_.append_tokens(s.kv, d.tokens);
    // Slots for the drafts too; without room the step decodes plainly (speculation never preempts).
    if (!alloc_slots(s, 1 + d.k())) {
        mgr_.truncate(s.kv, n_before);
        return {};
    }
    if (d.is_tree()) {
        const TokenTree t = d.tree();
        d.positions = t.positions(n_past);
        d.mask = t.ancestor_mask();
    }
    return d;
}

void Engine::apply_spec(Seq& s, const SpecDraft& d, std::span<const float> rows, std::vector<EngineEvent>& events,
                        bool& finished) {
    const int V = model_.params().n_vocab;
    const int k = d.k();
    const SamplingParams& sp = s.req.sampling;
    if (sp.adjusts_logits()) {
        // Row i follows the output so far plus the draft tokens on node i's path: the penalties the
        // plain path would see there.
        const TokenTree tree = d.tree();
        spec_rows_.assign(rows.begin(), rows.end());
        const std::vector<int32_t> out(s.all_tokens.end() - s.n_generated, s.all_tokens.end());
        std::vector<int32_t> ctx_i;
        for (int i = 0; i <= k; i++) {
            ctx_i = out;
            const std::vector<int32_t> path = tree.path_to(i);
            for (size_t j = 1; j < path.size(); j++) ctx_i.push_back(tree.node(path[j]).token);
            adjust_logits(std::span<float>(spec_rows_).subspan((size_t)i * V, (size_t)V), sp, ctx_i);
        }
        rows = spec_rows_;
    }
    if (s.matcher) {
        // Structured output: row i is masked by the grammar's state after node i's path, so the
        // verification sees the constrained target exactly as the plain path would at that point.
        // A node the grammar rejects (or an end-of-generation draft) has no state: its parent's row
        // gives it probability 0, so it is never accepted and its own row is never read.
        if (!sp.adjusts_logits()) spec_rows_.assign(rows.begin(), rows.end());
        std::vector<std::optional<GrammarMatcher>> at((size_t)k + 1);
        at[0].emplace(s.matcher->fork());
        for (int i = 1; i <= k; i++) {
            const int p = d.is_tree() ? d.parents[(size_t)i - 1] : i - 1;
            const int32_t tok = d.tokens[(size_t)i - 1];
            if (!at[(size_t)p] || s.masker->vocab().is_eog(tok)) continue;
            GrammarMatcher m = at[(size_t)p]->fork();
            if (s.masker->accept_token(m, tok)) at[(size_t)i].emplace(std::move(m));
        }
        for (int i = 0; i <= k; i++)
            if (at[(size_t)i]) mask_row(s, *at[(size_t)i], std::span<float>(spec_rows_).subspan((size_t)i * V, (size_t)V));
        rows = spec_rows_;
    }
    const SpecResult r = verify_draft(d, rows, V, sp, s.sampler.rng());
    commit_spec(s, d, r, rows, events, finished);
}

void Engine::commit_spec(Seq& s, const SpecDraft& d, const SpecResult& r, std::span<const float> rows,
                         std::vector<EngineEvent>& events, bool& finished) {
    const int V = model_.params().n_vocab;
    const int ctx = model_.params().n_ctx_train;
    const int k = d.k();
    const SamplingParams& sp = s.req.sampling;
    const int n_past = mgr_.seq(s.kv).n_computed;  // the root's slot
    s.fig.n_drafts++;
    s.fig.n_draft_tokens += k;
    s.fig.n_accepted_tokens += r.n_accepted;
    // Per draft position (a tree's depth - 1): tokens proposed there, and the accepted path's one.
    // Branches: the tree's leaves (nodes no other node names as parent); a chain is one.
    int n_spec_branches = 1;
    if (d.is_tree()) {
        std::vector<int32_t> depth((size_t)k + 1, 0);  // [k + 1] node 0 is the root
        std::vector<bool> is_parent((size_t)k + 1, false);
        for (int i = 1; i <= k; i++) {
            depth[(size_t)i] = depth[(size_t)d.parents[(size_t)i - 1]] + 1;
            is_parent[(size_t)d.parents[(size_t)i - 1]] = true;
            s.fig.n_draft_tokens_at[(size_t)depth[(size_t)i] - 1]++;
        }
        n_spec_branches = (int)std::count(is_parent.begin() + 1, is_parent.end(), false);
    } else {
        for (int i = 0; i < k; i++) s.fig.n_draft_tokens_at[(size_t)i]++;
    }
    for (int i = 0; i < r.n_accepted; i++) s.fig.n_accepted_at[(size_t)i]++;
    stats_.n_drafts++;
    stats_.n_draft_tokens += k;
    stats_.n_accepted_tokens += r.n_accepted;
    s.fig.n_spec_branches += n_spec_branches;
    stats_.n_spec_branches += n_spec_branches;

    // Append token by token with the plain path's stop rules: an EOS ends the request there (not
    // output), as do max_tokens and the context.
    std::vector<int32_t> toks;
    std::vector<float> lps;
    std::vector<std::vector<TokenLogprob>> tops;
    FinishReason why = FinishReason::STOP;
    std::string error;
    finished = false;
    for (size_t j = 0; j < r.tokens.size(); j++) {
        const int32_t tok = r.tokens[j];
        const std::span<const float> row =
            rows.empty() ? rows : rows.subspan((size_t)r.nodes[j] * (size_t)V, (size_t)V);  // empty: the sim
        if ((s.req.stop_at_eos || s.matcher) && model_.tokenizer().is_eog(tok)) {
            finished = true;
            why = FinishReason::STOP;
            break;
        }
        // A constrained row that allowed nothing (all -inf: the draw fell on id 0): the grammar is
        // complete (STOP) or dead (ERROR), as on the plain path.
        if (s.matcher && !s.masker->accept_token(*s.matcher, tok)) {
            finished = true;
            why = s.matcher->is_accepting() ? FinishReason::STOP : FinishReason::ERROR;
            if (why == FinishReason::ERROR)
                error = dead_grammar_error(model_.tokenizer().decode(
                    std::span<const int32_t>(s.all_tokens).last((size_t)s.n_generated)));
            break;
        }
        s.all_tokens.push_back(tok);
        s.n_generated++;
        toks.push_back(tok);
        lps.push_back(row.empty() ? 0.0f : token_logprob(row, tok));
        if (sp.n_top_logprobs > 0 && !row.empty()) tops.push_back(top_logprobs(row, sp.n_top_logprobs));
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
    int n_keep = std::min(m, r.n_accepted);
    bool contiguous = true;  // a chain's accepted prefix, or a tree path down the first children
    for (int j = 1; j <= n_keep; j++) contiguous = contiguous && r.nodes[(size_t)j] == j;
    if (contiguous) {
        mgr_.truncate(s.kv, n_past + 1 + n_keep);
        mgr_.commit_computed(s.kv, 1 + n_keep);
    } else {
        // A tree path: node nodes[j]'s KV (written at slot n_past + nodes[j], position n_past + j,
        // attending exactly its ancestors) is what a plain decode would have written at slot
        // n_past + j, so it is copied there. The tokens after the root are rewritten through a
        // truncation, whose freed blocks the re-allocation may hand back: copy_slots reads every
        // source before writing, from the table as it was.
        const std::vector<int32_t> old_table = mgr_.seq(s.kv).blocks;
        std::vector<int32_t> src, dst;
        for (int j = 1; j <= n_keep; j++) {
            src.push_back(n_past + r.nodes[(size_t)j]);
            dst.push_back(n_past + j);
        }
        mgr_.truncate(s.kv, n_past + 1);
        mgr_.commit_computed(s.kv, 1);  // the root, whose slot and block stay
        mgr_.append_tokens(s.kv, std::span<const int32_t>(toks.data(), (size_t)n_keep));
        // The truncation freed at least the blocks this takes, so it finds room; if not, the path's
        // tokens stay known but not computed and the next step computes them (correct, slower).
        auto copies = mgr_.allocate_slots(s.kv, n_keep);
        demote_evicted(nullptr, s.req.tenant);  // blocks it reclaimed leave for the KV tiers before any copy
        if (copies) {
            for (const BlockCopy& c : *copies)
                kv_copy(be_->copy_block_slots(c.src_block, c.dst_block, c.n_slots));
            kv_copy(be_->copy_slots(old_table, src, mgr_.seq(s.kv).blocks, dst));
            mgr_.commit_computed(s.kv, n_keep);
        } else {
            mgr_.append_tokens(s.kv, std::span<const int32_t>(toks).subspan((size_t)n_keep));
            n_keep = -1;  // nothing more to append below
        }
    }
    if (n_keep >= 0 && m > n_keep) mgr_.append_tokens(s.kv, std::span<const int32_t>(&s.all_tokens.back(), 1));
    if (opt_.prefix_cache) mgr_.publish_full_blocks(s.kv);
    if (s.draft_owner) s.draft_owner->rollback(s.draft_kv, n_past + 1 + std::max(0, n_keep));
    if (n_keep < k) {
        s.fig.n_rollbacks++;
        stats_.n_rollbacks++;
    }

    EngineEvent e = make_event(s);
    e.tokens = std::move(toks);
    e.logprobs = std::move(lps);
    e.top_logprobs = std::move(tops);
    e.finished = finished;
    e.finish = why;
    e.error = std::move(error);
    events.push_back(std::move(e));
}

}  // namespace steward
