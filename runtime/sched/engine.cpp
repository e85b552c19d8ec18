// The continuous-batching step: cancellations and deadlines, then (within each priority) every
// running sequence's decode token, then prefill work, running chunks and waiting requests together,
// shortest remaining prompt first with aging, while the token budget lasts; a failed allocation frees an idle session, then preempts the lowest-priority running sequence
// (its KV is dropped and recomputed later, as vLLM's recompute preemption).
#include "sched/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "backend/cpu.h"
#include "backend/sim.h"

namespace steward {

// Engine::draft_ms_per_token_ keeps one entry per SpecSource.
static_assert((int)SpecSource::SUFFIX == 4, "draft_ms_per_token_[5] is indexed by SpecSource");
static_assert(k_spec_positions == k_max_spec_tokens, "RunFigures counts every draft position");

namespace {

// SRPT aging: a waiting prompt's remaining count drops this much per second it has waited, so a
// long prompt goes first at the latest after (its length - the shorter one's) / this seconds.
constexpr double k_aging_tokens_per_s = 1000.0;

std::mutex g_fault_mu;
std::shared_ptr<const ForwardFaultHook> g_fault_hook;  // null: none

std::shared_ptr<const ForwardFaultHook> forward_fault_hook() {
    std::lock_guard<std::mutex> lk(g_fault_mu);
    return g_fault_hook;
}

}  // namespace

void set_forward_fault_hook(ForwardFaultHook hook) {
    std::lock_guard<std::mutex> lk(g_fault_mu);
    g_fault_hook = hook ? std::make_shared<const ForwardFaultHook>(std::move(hook)) : nullptr;
}

namespace {
std::shared_ptr<const ForcedTokenHook> g_forced_hook;  // under g_fault_mu; null: none
std::atomic<bool> g_forced_set{false};                 // the step's fast path reads only this
}  // namespace

void set_forced_token_hook(ForcedTokenHook hook) {
    std::lock_guard<std::mutex> lk(g_fault_mu);
    g_forced_hook = hook ? std::make_shared<const ForcedTokenHook>(std::move(hook)) : nullptr;
    g_forced_set = (bool)g_forced_hook;
}

namespace {
// With a draft model or reserved self-drafts the pool's blocks are split between the target and
// them (shared_kv_blocks).
EngineOptions with_draft_share(const Model& model, EngineOptions opt) {
    if (opt.draft_model)
        if (auto ok = check_draft_model(model, *opt.draft_model); !ok) throw std::invalid_argument(ok.error().message);
    int self_layers = 0;
    for (int l : opt.self_draft_layers)
        if (l >= 1 && l < model.params().n_layer) self_layers += l;
    if (!opt.draft_model && self_layers == 0) return opt;
    opt.n_blocks = shared_kv_blocks(model, opt.draft_model, self_layers, opt.n_blocks, opt.block_size, opt.kv_dtype_k,
                                    opt.kv_dtype_v);
    return opt;
}
}  // namespace

Engine::Engine(const Model& model, const EngineOptions& opt)
    : model_(model),
      opt_(with_draft_share(model, opt)),
      mgr_(opt_.n_blocks, opt.block_size) {
    if (!opt_.backend) opt_.backend = cpu_backend_factory();
    if (opt_.sim) {  // the simulator: its drafts are its own (SimBackend::propose), priced at the forward
        auto sim = std::make_unique<SimBackend>(model, opt_.sim, opt_.n_blocks, opt_.block_size,
                                                std::max(opt_.max_batch_tokens, opt_.max_batch));
        sim_ = sim.get();
        be_ = std::move(sim);
    } else {
        be_ = make_backend(model, 0, "");
        if (opt_.draft_model) draft_ = make_drafter(*opt_.draft_model, 0);
        for (int l : opt_.self_draft_layers)  // the ones the config names: made now, so a failure is the pool's
            if (l >= 1 && l < model.params().n_layer && !self_drafts_.count(l)) self_drafts_[l] = make_drafter(model_, l);
    }
    mgr_.set_block_bytes((double)be_->kv_storage_bytes() / opt_.n_blocks);
    mgr_.set_tenant_names(&tenant_names_);
    mgr_.set_record_kv_events(opt.kv_events);
    if (opt_.kv_tiers) {
        const int64_t payload = be_->block_payload_bytes();
        if (payload <= 0)
            throw std::invalid_argument("KV tiers need a backend holding KV bytes; " + be_->describe() +
                                        " holds none (remove [pool.kv_tiers] from a simulated pool)");
        if (payload != opt_.kv_tiers->identity().payload_bytes)
            throw std::invalid_argument("KV tiers opened for blocks of " + std::to_string(opt_.kv_tiers->identity().payload_bytes) +
                                        " bytes, but this pool's blocks hold " + std::to_string(payload));
        tiers_ = opt_.kv_tiers;
        tier_buf_.resize((size_t)payload);
        evict_buf_.resize((size_t)payload);
        mgr_.set_record_evicted(true);
        tiers_->set_record_events(opt.kv_events);
    }
}

Engine::~Engine() {
    try {
        persist_kv();
    } catch (const std::exception& e) {
        spdlog::warn("KV tiers: writing the pool's cached blocks to disk at shutdown failed: {}", e.what());
    }
}

int64_t Engine::persist_kv() {
    if (!tiers_ || tiers_->options().disk_bytes <= 0) return 0;
    int64_t n = 0;
    for (BlockHash h : mgr_.cached_hashes()) {
        const auto block = mgr_.pool().peek_cached(h);
        if (!block) continue;
        const BlockInfo info = mgr_.pool().info(*block);
        if (!be_->export_block(*block, tier_buf_)) continue;
        tiers_->persist({h, info.tenant, info.is_public, info.depth, info.n_hits, info.reuse_priority, info.reuse_keys}, tier_buf_);
        ++n;
    }
    for (const auto& [h, tier] : tiers_->held()) {
        if (tier != KvTier::HOST) continue;
        KvTier from = KvTier::HOST;
        if (auto meta = tiers_->take(h, tier_buf_, &from)) {
            tiers_->persist(*meta, tier_buf_);
            ++n;
        }
    }
    return n;
}

void Engine::demote_evicted(EvictionPolicy* policy, int32_t tenant) {
    if (!tiers_) return;
    for (const EvictedBlock& e : mgr_.take_evicted()) {
        kv_copy(be_->export_block(e.block, evict_buf_));
        EvictionContext ctx;
        ctx.requesting_tenant = tenant;
        ctx.block_size = opt_.block_size;
        ctx.block_bytes = (double)evict_buf_.size();
        ctx.tenant_names = &tenant_names_;
        tiers_->demote({e.hash, e.tenant, e.is_public, e.depth, e.n_hits, e.reuse_priority, e.reuse_keys}, evict_buf_, policy, &ctx);
    }
}

// Past the pool's cached chain, the prompt's next full blocks are looked up in the tiers and copied
// back into fresh pool blocks, one at a time, until a block is in no tier (or the pool is full: the
// block goes back to its tier). The request waits for its own blocks only: this runs at its admission.
void Engine::promote(Seq& s) {
    if (!tiers_) return;
    const auto t0 = std::chrono::steady_clock::now();
    int n_host = 0, n_disk = 0;
    while (auto h = mgr_.next_prompt_block_hash(s.kv)) {
        if (mgr_.pin_next_cached(s.kv)) continue;
        if (!tiers_->peek(*h)) break;
        KvTier from = KvTier::HOST;
        const auto meta = tiers_->take(*h, tier_buf_, &from);
        if (!meta) break;  // a file that failed its checks: dropped, the rest is computed
        // The hash carries the tenant's salt, so a non-public block reached by it is this tenant's
        // (tenant ids are per process: the stored one may be another's after a restart).
        const int32_t writer = meta->is_public ? meta->tenant : s.req.tenant;
        auto block = mgr_.adopt_next_block(s.kv, writer, meta->is_public);
        // A full pool: idle sessions' pinned KV goes first (to the tiers, as the admission does).
        while (!block && free_one_session()) block = mgr_.adopt_next_block(s.kv, writer, meta->is_public);
        if (!block) {
            tiers_->demote(*meta, tier_buf_);
            break;
        }
        // Its allocation may have evicted another block: that one's bytes leave first (through
        // evict_buf_: tier_buf_ holds the promoted bytes).
        demote_evicted(nullptr, s.req.tenant);
        kv_copy(be_->import_block(*block, tier_buf_));
        (from == KvTier::DISK ? n_disk : n_host)++;
    }
    if (n_host + n_disk == 0) return;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.first_scheduled_s < 0) {  // the request's figures are its first admission's (see Seq::fig)
        s.fig.n_cached_host_tokens = (int64_t)n_host * opt_.block_size;
        s.fig.n_cached_disk_tokens = (int64_t)n_disk * opt_.block_size;
        s.fig.n_promotions = 1;
        s.fig.promote_s = dt;
    }
    stats_.n_promotions++;
    stats_.n_promoted_host_blocks += n_host;
    stats_.n_promoted_disk_blocks += n_disk;
    stats_.promote_s += dt;
}

std::vector<KvEvent> Engine::take_kv_events() {
    std::vector<KvEvent> ev = mgr_.take_kv_events();
    if (tiers_) {
        std::vector<KvEvent> t = tiers_->take_events();
        ev.insert(ev.end(), t.begin(), t.end());
    }
    return ev;
}

std::vector<KvEvent> Engine::cached_block_events() const {
    std::vector<KvEvent> ev;
    for (BlockHash h : mgr_.cached_hashes()) ev.push_back({KvEventKind::STORED, h, KvTier::POOL});
    if (tiers_)
        for (const auto& [h, t] : tiers_->held()) ev.push_back({KvEventKind::STORED, h, t});
    return ev;
}

void Engine::kv_copy(const Expected<bool>& r) {
    if (!r) throw std::runtime_error("KV copy failed: " + r.error().message);
}

std::unique_ptr<ForwardBackend> Engine::make_backend(const Model& m, int n_layers, const std::string& what) {
    auto be = opt_.backend(m, kv_config_for_layers(m, opt_.n_blocks, opt_.block_size, opt_.kv_dtype_k, opt_.kv_dtype_v, n_layers),
                           std::max(opt_.max_batch_tokens, opt_.max_batch), n_layers, opt_.n_threads);
    if (!be) throw std::runtime_error(what + be.error().message);
    return std::move(*be);
}

std::unique_ptr<DraftModel> Engine::make_drafter(const Model& draft, int n_layers) {
    return std::make_unique<DraftModel>(draft, make_backend(draft, n_layers, "the draft's backend: "));
}

Expected<bool> Engine::submit(EngineRequest req) {
    const int ctx = model_.params().n_ctx_train;
    if (model_.params().is_encoder())
        return make_error("this pool's model is an encoder (", model_.params().arch,
                          "): it embeds text and does not generate; send its inputs to /v1/embeddings, and "
                          "generation to a pool of a decoder model");
    if (req.prompt.empty()) return make_error("request ", std::to_string(req.id), ": empty prompt");
    if (req.max_tokens <= 0) return make_error("request ", std::to_string(req.id), ": max_tokens must be >= 1");
    if ((int64_t)req.prompt.size() + req.max_tokens > ctx)
        return make_error("request ", std::to_string(req.id), ": prompt of ", std::to_string(req.prompt.size()),
                          " tokens + max_tokens ", std::to_string(req.max_tokens), " exceeds the model's context of ",
                          std::to_string(ctx), " tokens; shorten the prompt or lower max_tokens");
    for (int32_t t : req.prompt)
        if (t < 0 || t >= model_.params().n_vocab)
            return make_error("request ", std::to_string(req.id), ": token id ", std::to_string(t),
                              " is outside the vocabulary of ", std::to_string(model_.params().n_vocab));
    for (const auto& [t, bias] : req.sampling.logit_bias)
        if (t < 0 || t >= model_.params().n_vocab)
            return make_error("logit_bias names token id ", std::to_string(t), ", outside this pool's vocabulary of ",
                              std::to_string(model_.params().n_vocab), " ids (0..", std::to_string(model_.params().n_vocab - 1),
                              "); remove it (POST /tokenize gives a text's ids)");
    if (const int lim = be_->max_context(); lim > 0 && (int64_t)req.prompt.size() + req.max_tokens + req.spec.k > lim)
        return make_error("request ", std::to_string(req.id), ": prompt of ", std::to_string(req.prompt.size()),
                          " tokens + max_tokens ", std::to_string(req.max_tokens),
                          req.spec.k > 0 ? " + " + std::to_string(req.spec.k) + " draft tokens" : std::string(),
                          " exceeds the ", std::to_string(lim), " slots a sequence may span on this pool's backend (",
                          be_->describe(), "); shorten the prompt or lower max_tokens");
    const int64_t need = ((int64_t)req.prompt.size() + req.max_tokens + opt_.block_size - 1) / opt_.block_size;
    if (need > opt_.n_blocks)
        return make_error("request ", std::to_string(req.id), " needs ", std::to_string(need),
                          " KV blocks but the whole pool has ", std::to_string(opt_.n_blocks),
                          "; raise the pool's kv_blocks / kv_gib or lower max_tokens");
    if ((int)waiting_.size() >= opt_.max_queue)
        return make_error_code(ErrorCode::OVERLOADED, "overloaded: the pool's queue is full (",
                               std::to_string(waiting_.size()), " waiting); retry later or raise max_queue");
    if (seqs_.count(req.id)) return make_error("request id ", std::to_string(req.id), " is already in use");
    if (auto ok = check_spec_settings(req.spec, has_draft_model(), model_.params().n_layer); !ok)
        return make_error("request ", std::to_string(req.id), ": ", ok.error().message);
    if (auto intact = model_.check_file(); !intact) return intact.error();  // a changed model serves nothing
    const uint64_t id = req.id;
    if (req.kv_quota_blocks >= 0) mgr_.set_tenant_quota(req.tenant, req.kv_quota_blocks);
    if (!req.tenant_name.empty() && req.tenant >= 0 && req.tenant < (1 << 20)) {
        if ((size_t)req.tenant >= tenant_names_.size()) tenant_names_.resize((size_t)req.tenant + 1);
        tenant_names_[req.tenant] = req.tenant_name;
    }
    if (sim_) req.grammar = nullptr;  // the sim's tokens are a generator's: no grammar applies
    auto s = std::make_unique<Seq>(std::move(req));
    s->all_tokens = s->req.prompt;
    s->fig.n_prompt_tokens = (int64_t)s->req.prompt.size();
    if (sim_) s->sim_alpha = sim_->draw_acceptance(s->req.id, s->req.sim_acceptance, s->req.sim_concentration, s->sim_rng);
    if (s->req.grammar) {
        s->masker = masker_for(s->req.grammar);
        s->matcher.emplace(s->req.grammar);
    }
    if (s->req.spec.enabled()) {
        // A new sequence starts from what its bucket's sequences measured on this pool.
        s->bucket_acceptance = &bucket_acceptance_.try_emplace(s->req.bucket, k_max_spec_tokens).first->second;
        s->acceptance = *s->bucket_acceptance;  // with its counts: the bucket's figure weighs as measured
    }
    seqs_.emplace(id, std::move(s));
    waiting_.push_back(id);
    return true;
}

bool Engine::cancel(uint64_t id) {
    if (!seqs_.count(id)) return false;
    if (std::find(cancelled_.begin(), cancelled_.end(), id) == cancelled_.end()) cancelled_.push_back(id);
    return true;
}

void Engine::end_session(const std::string& session) {
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    mgr_.free(it->second.kv);
    sessions_.erase(it);
}

EngineEvent Engine::make_event(Seq& s) const {
    EngineEvent e;
    static_cast<RunFigures&>(e) = s.fig;
    e.id = s.req.id;
    e.first_scheduled_s = s.first_scheduled_s;
    return e;
}

// ---- structured output

std::shared_ptr<const TokenMasker> Engine::masker_for(const std::shared_ptr<const CompiledGrammar>& g) {
    if (!vocab_) vocab_ = TokenVocabulary::from_tokenizer(model_.tokenizer());
    if (auto it = maskers_.find(g.get()); it != maskers_.end()) return it->second;
    if (maskers_.size() >= 64)  // forget maskers no running request holds (their grammars may go)
        for (auto it = maskers_.begin(); it != maskers_.end();)
            it = it->second.use_count() == 1 ? maskers_.erase(it) : std::next(it);
    auto m = std::make_shared<const TokenMasker>(g, vocab_);
    maskers_.emplace(g.get(), m);
    return m;
}

MaskResult Engine::mask_row(Seq& s, const GrammarMatcher& m, std::span<float> row) {
    const auto t0 = std::chrono::steady_clock::now();
    mask_words_.resize(s.masker->n_words());
    MaskResult r = s.masker->fill_mask(m, mask_words_);
    const int V = (int)row.size();
    apply_mask(mask_words_, row);
    const int n_eog = r.eog_allowed ? (int)s.masker->vocab().eog_ids().size() : 0;
    if (!s.req.stop_at_eos && r.eog_allowed && r.n_allowed > n_eog) {  // ignore_eos: the end only when forced
        for (int32_t id : s.masker->vocab().eog_ids())
            if (id < V) row[(size_t)id] = -INFINITY;
        r.n_allowed -= n_eog;
        r.eog_allowed = false;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.fig.n_masked++;
    if (r.n_allowed == 1) s.fig.n_forced++;
    s.fig.mask_s += dt;
    stats_.n_masked++;
    if (r.n_allowed == 1) stats_.n_forced++;
    if (r.cache_hit) stats_.n_mask_cache_hits++;
    stats_.mask_s += dt;
    return r;
}

void apply_mask(std::span<const uint64_t> words, std::span<float> row) {
    // A word at a time: most of a JSON grammar's words allow nothing (filled) or everything (kept).
    const size_t n = row.size();
    for (size_t w = 0, base = 0; base < n; w++, base += 64) {
        const uint64_t bits = words[w];
        const size_t end = std::min(n, base + 64);
        if (bits == ~0ull) continue;
        if (bits == 0) {
            std::fill(row.begin() + (std::ptrdiff_t)base, row.begin() + (std::ptrdiff_t)end, -INFINITY);
            continue;
        }
        for (size_t id = base; id < end; id++)
            if (!((bits >> (id - base)) & 1)) row[id] = -INFINITY;
    }
}

// What a constrained request does at a row whose mask is r, before sampling: "" (sample), or it
// ends here: STOP when the grammar is complete and allows nothing else, ERROR otherwise.
std::optional<FinishReason> constrained_end(const MaskResult& r, const GrammarMatcher& m, size_t n_eog) {
    const bool only_end = r.eog_allowed && (size_t)r.n_allowed == n_eog;
    if (only_end || (r.n_allowed == 0 && m.is_accepting())) return FinishReason::STOP;
    if (r.n_allowed == 0) return FinishReason::ERROR;
    return std::nullopt;
}

std::string dead_grammar_error(const std::string& output) {
    std::string tail = output.size() > 80 ? "..." + output.substr(output.size() - 80) : output;
    return "the request's grammar allows no token after the output so far (\"" + tail +
           "\"): no token of this model's vocabulary continues it; check the grammar or schema (a "
           "literal the vocabulary cannot spell, or a rule that can never end)";
}

// ---- speculation's measurements and the per-step question to the policy

void Engine::TimeFit::observe(double tokens, double ms) {
    // Running means, equal weights for the first 20 steps, then an EWMA that follows load changes.
    n_obs++;
    const double w = std::max(1.0 / (double)n_obs, 0.05);
    n += w * (tokens - n);
    t += w * (ms - t);
    nn += w * (tokens * tokens - nn);
    nt += w * (tokens * ms - nt);
}

double Engine::TimeFit::slope() const {
    const double var = nn - n * n;
    if (n_obs < 2 || var < 0.25) return -1;  // every step had about the same token count
    return std::max(0.0, (nt - n * t) / var);
}

double Engine::TimeFit::at(double tokens) const {
    if (n_obs == 0) return -1;
    const double b = slope();
    // Without a slope yet, the mean step; never below a tenth of it (attention grows with context,
    // which a line through prefill chunks and decodes does not see).
    return b < 0 ? t : std::max(0.1 * t, t + b * (tokens - n));
}

double Engine::verify_ms_per_token() const {
    const double b = decode_fit_.slope();
    return b >= 0 ? b : forward_fit_.slope();
}

int Engine::draft_catch_up_tokens(const Seq& s) const {
    if (sim_ || (s.req.spec.source != SpecSource::DRAFT && s.req.spec.source != SpecSource::SELF)) return 0;
    const int n = (int)s.all_tokens.size();
    if (!s.draft_kv || !s.draft_owner) return n;
    return n - s.draft_owner->manager().seq(s.draft_kv).n_computed;
}

double Engine::draft_catch_up_ms(const Seq& s, int n_tokens) const {
    if (n_tokens <= 2) return 0;
    return catch_up_fit_[(int)s.req.spec.source].at(n_tokens);
}

double Engine::plain_step_ms(int n_plain_tokens, bool decode_only) const {
    const TimeFit& f = decode_only && decode_fit_.slope() >= 0 ? decode_fit_ : forward_fit_;
    return f.at(n_plain_tokens);
}

namespace {
// AcceptanceEwma::observe with a fast start: a position's first observations weigh 1 / (n + 2) (a
// running mean in which the prior counts as one observation) until that falls to the EWMA's weight,
// so a bucket whose drafts are rarely accepted is known as such after a few steps, not after dozens.
void observe_acceptance(AcceptanceEwma& a, int n_proposed, int n_accepted) {
    const int n = std::min<int>(n_proposed, (int)a.alpha.size());
    for (int i = 0; i < n && i <= n_accepted; i++) {
        const double w = std::max(a.weight, 1.0 / (double)(a.n_seen[(size_t)i] + 2));
        a.alpha[(size_t)i] += w * ((i < n_accepted ? 1.0 : 0.0) - a.alpha[(size_t)i]);
        a.n_seen[(size_t)i]++;
    }
}
}  // namespace

void Engine::observe_spec(Seq& s, int n_proposed, int n_accepted) {
    // What the policy reads next step: acceptance per position, of the sequence and its bucket.
    observe_acceptance(s.acceptance, n_proposed, n_accepted);
    if (s.bucket_acceptance) observe_acceptance(*s.bucket_acceptance, n_proposed, n_accepted);
    const double rate = (double)n_accepted / n_proposed;
    s.recent_acceptance = s.recent_acceptance < 0 ? rate : s.recent_acceptance + 0.2 * (rate - s.recent_acceptance);
}

void Engine::spec_question(Seq& s, int batch_size, int n_plain_tokens, SpecSeqStats& q, SpecAcceptRows& rows) const {
    q.request_id = s.req.id;
    q.bucket = s.req.bucket.c_str();
    q.tenant = s.req.tenant_name.c_str();
    q.max_budget = s.req.spec.k;
    q.last_budget = s.last_budget;
    q.position = (int32_t)s.all_tokens.size();
    q.n_generated = s.n_generated;
    q.max_tokens = s.req.max_tokens;
    q.batch_size = batch_size;
    q.n_steps = s.fig.n_drafts;
    q.n_proposed = s.fig.n_draft_tokens;
    q.n_accepted = s.fig.n_accepted_tokens;
    q.recent_acceptance = s.recent_acceptance;
    q.temperature = s.req.sampling.temperature;
    // A position never observed reads -1 (the policy's own prior then), not the estimator's start.
    auto measured = [](const AcceptanceEwma& a, std::array<double, k_max_spec_tokens>& out) {
        for (size_t i = 0; i < out.size(); i++) out[i] = i < a.alpha.size() && a.n_seen[i] > 0 ? a.alpha[i] : -1.0;
    };
    measured(s.acceptance, rows.own);
    q.accept_pos = rows.own.data();
    q.n_accept_pos = (uint32_t)rows.own.size();
    if (s.bucket_acceptance) {
        measured(*s.bucket_acceptance, rows.bucket);
        q.bucket_accept_pos = rows.bucket.data();
        q.n_bucket_accept_pos = (uint32_t)rows.bucket.size();
    }
    q.draft_source = (int32_t)s.req.spec.source;
    q.draft_ms_per_token = draft_ms_per_token_[(int)s.req.spec.source];
    q.verify_ms = verify_ms_;
    q.verify_ms_per_token = verify_ms_per_token();
    q.plain_step_ms = plain_step_ms(n_plain_tokens, n_plain_tokens == batch_size);
    const int n_catch_up = draft_catch_up_tokens(s);
    q.draft_catch_up_tokens = n_catch_up > 2 ? n_catch_up : 0;
    q.draft_catch_up_ms = draft_catch_up_ms(s, n_catch_up);
}

// Each sequence that could draft now asks its bucket's policy for k (once per step: a policy keeps
// per-sequence state such as probes); 0 where it may not or would not draft. The step's tokens left
// (budget) cap the drafts in plan order: a sequence is asked only while some are left after the
// drafts before it. The asks go in runs that the tokens left cover whatever the answers (each answer
// is at most min(spec.k, k_max_spec_tokens)), each policy's share of a run in one draft_budgets call,
// so the outcome is that of asking one by one with one hand-off per policy and run, not per sequence.
std::vector<int> Engine::ask_draft_budgets(const StepPlan& plan, int budget, int n_plain_tokens) {
    std::vector<int> want(plan.size(), 0);
    std::vector<size_t> cand;  // plan entries that may draft, in plan order
    for (size_t i = 0; i < plan.size(); i++) {
        const Seq& s = *seqs_.at(plan[i].id);
        if (plan[i].n == 1 && s.req.spec.enabled() && s.n_generated > 0 && s.kv &&
            mgr_.seq(s.kv).n_tokens() - mgr_.seq(s.kv).n_computed == 1 && s.req.max_tokens - s.n_generated >= 2)
            cand.push_back(i);
    }
    int left = budget;
    std::vector<SpecSeqStats> qs;
    std::vector<SpecAcceptRows> rows;
    std::vector<int32_t> answer;
    std::vector<uint8_t> fell_back;
    size_t pos = 0;
    while (pos < cand.size() && left > 0) {
        // The run: every candidate from pos on that is reached with some tokens left even if each
        // one before it in the run took its most.
        size_t end = pos;
        for (int worst = 0; end < cand.size() && worst < left; end++)
            worst += std::min(k_max_spec_tokens, std::max(0, seqs_.at(plan[cand[end]].id)->req.spec.k));
        const size_t n = end - pos;
        qs.assign(n, SpecSeqStats{});
        rows.assign(n, SpecAcceptRows{});  // sized before the questions point into it
        answer.assign(n, 0);
        fell_back.assign(n, 0);
        // Grouped by policy, each group in plan order; a sequence without a policy drafts its limit.
        std::vector<std::pair<DraftBudgetPolicy*, std::vector<size_t>>> groups;
        for (size_t j = 0; j < n; j++) {
            Seq& s = *seqs_.at(plan[cand[pos + j]].id);
            if (!s.req.speculation) {
                answer[j] = s.req.spec.k;
                continue;
            }
            spec_question(s, (int)plan.size(), n_plain_tokens, qs[j], rows[j]);
            auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == s.req.speculation.get(); });
            if (g == groups.end()) g = groups.insert(groups.end(), {s.req.speculation.get(), {}});
            g->second.push_back(j);
        }
        for (auto& [policy, members] : groups) {
            std::vector<SpecSeqStats> q(members.size());
            std::vector<int32_t> out(members.size(), 0);
            std::vector<uint8_t> fb(members.size(), 0);
            for (size_t m = 0; m < members.size(); m++) q[m] = qs[members[m]];
            policy->draft_budgets(q, out, fb);
            for (size_t m = 0; m < members.size(); m++) answer[members[m]] = out[m], fell_back[members[m]] = fb[m];
        }
        for (size_t j = 0; j < n && left > 0; j++) {
            Seq& s = *seqs_.at(plan[cand[pos + j]].id);
            int b = answer[j];
            if (s.req.speculation) {
                stats_.n_spec_asks++;
                if (fell_back[j] || b < 0 || b > s.req.spec.k) {  // the policy counted it; the step decodes plainly
                    s.fig.n_spec_fallbacks++;
                    stats_.n_spec_fallbacks++;
                    b = 0;
                }
                s.last_budget = b;
            }
            const int max_k = std::min(left, k_max_spec_tokens);
            want[cand[pos + j]] = std::max(0, std::min(max_k, b));
            left -= want[cand[pos + j]];
        }
        pos = end;
    }
    return want;
}

void Engine::release(Seq& s, bool keep_session, double now_s) {
    release_draft(s);
    if (!s.kv) return;
    if (keep_session && !s.req.session.empty()) {
        auto it = sessions_.find(s.req.session);
        if (it != sessions_.end()) mgr_.free(it->second.kv);  // a newer turn replaces an older one
        sessions_[s.req.session] = Session{s.kv, now_s + opt_.session_ttl_s, s.req.bucket};
    } else {
        mgr_.free(s.kv);
    }
    s.kv = 0;
}

bool Engine::free_one_session() {
    if (sessions_.empty()) return false;
    auto victim = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
        if (it->second.expires_s < victim->second.expires_s) victim = it;
    mgr_.free(victim->second.kv);
    sessions_.erase(victim);
    stats_.n_session_evictions++;
    return true;
}

void Engine::preempt(Seq& s) {
    const int computed = mgr_.seq(s.kv).n_computed;
    mgr_.free(s.kv);
    s.kv = 0;
    release_draft(s);
    s.sim_draft_computed = 0;  // a simulated draft's KV goes with it
    s.fig.n_recomputed_tokens += computed;  // less whatever the cache gives back at re-attach (see attach)
    s.fig.n_preemptions++;
    stats_.n_preemptions++;
}

// Gives a waiting sequence its KV: a kept session whose tokens it extends, else a fresh sequence
// with the prefix cache's longest hit.
void Engine::attach(Seq& s) {
    const bool first = s.first_scheduled_s < 0;
    int reused = 0;
    if (!s.req.session.empty()) {
        auto it = sessions_.find(s.req.session);
        if (it != sessions_.end()) {
            const SeqKv& kv = mgr_.seq(it->second.kv);
            int common = 0;
            const int lim = std::min<int>(kv.n_computed, (int)s.all_tokens.size() - 1);
            while (common < lim && kv.tokens[common] == s.all_tokens[common]) common++;
            if (common > 0) {
                s.kv = it->second.kv;
                sessions_.erase(it);
                mgr_.truncate(s.kv, common);
                mgr_.append_tokens(s.kv, std::span<const int32_t>(s.all_tokens).subspan(common));
                set_reuse(s);
                reused = common;
            }
        }
    }
    int n_cross = 0, n_public = 0;  // a session's own KV is the tenant's: neither
    if (!s.kv) {
        s.kv = mgr_.add_seq(s.req.tenant, s.all_tokens, s.req.salt);
        set_reuse(s);
        if (opt_.prefix_cache) {
            mgr_.get_computed_blocks(s.kv);
            promote(s);
            reused = mgr_.seq(s.kv).n_cached_tokens;
            n_cross = mgr_.seq(s.kv).n_cached_cross_tenant_tokens;
            n_public = mgr_.seq(s.kv).n_cached_public_tokens;
        }
    }
    if (first) {
        s.fig.n_cached_prompt_tokens = reused;
        s.fig.n_cached_cross_tenant = n_cross;
        s.fig.n_cached_public = n_public;
    } else {
        s.fig.n_recomputed_tokens -= std::min(s.fig.n_recomputed_tokens, (int64_t)reused);
    }
}

void Engine::set_reuse(Seq& s) {
    if (s.req.reuse_priority_tokens <= 0 && s.req.reuse_keys.empty()) return;
    mgr_.set_reuse(s.kv, s.req.reuse_priority_tokens, s.req.reuse_keyed_from,
                   std::make_shared<const std::vector<uint64_t>>(s.req.reuse_keys));
}

int Engine::invalidate_reuse(std::span<const uint64_t> keys) {
    int n = mgr_.invalidate_reuse(keys);
    if (tiers_) n += tiers_->invalidate_reuse(keys);
    return n;
}

void Engine::finish(uint64_t id, FinishReason why, const std::string& err, double now_s,
                    std::vector<EngineEvent>& events) {
    Seq& s = *seqs_.at(id);
    EngineEvent e = make_event(s);
    e.finished = true;
    e.finish = why;
    e.error = err;
    release(s, false, now_s);
    events.push_back(std::move(e));
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
    running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
    seqs_.erase(id);
}

std::vector<EngineEvent> Engine::step(double now_s) {
    const auto t0 = std::chrono::steady_clock::now();
    be_->begin_step();
    std::vector<EngineEvent> events;
    try {
        run_step(now_s, events);
    } catch (const std::exception& e) {
        fail_running(std::string("the engine step failed: ") + e.what(), now_s, events);
    } catch (...) {
        fail_running("the engine step failed with an unknown exception", now_s, events);
    }
    stats_.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return events;
}

// After a step threw: every running sequence may have been in the batch, half-committed or
// half-sampled, so its state is unknown and it fails. Waiting ones hold no KV (attach happens only
// on admission, which moves them to running) and stay queued. A request that already got its
// finished event this step keeps it (it was served) and is only released. The message names the
// failure; the KV they held goes back to the pool (not kept as a session: its content is unknown).
void Engine::fail_running(const std::string& what, double now_s, std::vector<EngineEvent>& events) {
    std::unordered_set<uint64_t> already;
    for (const EngineEvent& e : events)
        if (e.finished) already.insert(e.id);
    const std::vector<uint64_t> ids = running_;
    for (uint64_t id : ids) {
        if (!seqs_.count(id)) continue;
        if (already.count(id)) {
            release(*seqs_.at(id), false, now_s);
            running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
            seqs_.erase(id);
            continue;
        }
        finish(id, FinishReason::ERROR, what + "; the request was abandoned, retry it", now_s, events);
    }
    // A waiting sequence admitted half-way (attach without the move to running) holds KV: drop it.
    for (uint64_t id : waiting_) {
        Seq& s = *seqs_.at(id);
        if (s.kv) {
            mgr_.free(s.kv);
            s.kv = 0;
        }
    }
}

void Engine::run_step(double now_s, std::vector<EngineEvent>& events) {
    StepPlan plan = schedule(now_s, events);
    if (plan.empty()) return;
    Expected<bool> r = run(plan);
    if (!r) {
        for (const Planned& p : plan) finish(p.id, FinishReason::ERROR, "forward failed: " + r.error().message, now_s, events);
        return;
    }
    // A model file truncated or rewritten under the mapping: this forward may have read zero pages
    // (see MappedFileGuard), so nothing of it is committed and the batch fails with the reason.
    if (auto intact = model_.check_file(); !intact) {
        for (const Planned& p : plan) finish(p.id, FinishReason::ERROR, intact.error().message, now_s, events);
        return;
    }
    update(plan, now_s, events);
}

// Blocks for n more tokens of s; a partly filled block shared with the prefix cache is copied on
// write through the backend.
bool Engine::alloc_slots(Seq& s, int n, bool must_evict) {
    // Blocks this request needs are reclaimed by its bucket's eviction policy (LRU without one).
    mgr_.set_active_eviction(must_evict ? nullptr : s.req.eviction.get(), s.req.tenant);
    const int64_t evicted_before = mgr_.n_evictions();
    auto copies = mgr_.allocate_slots(s.kv, n);
    mgr_.set_active_eviction(nullptr, -1);
    demote_evicted(must_evict ? nullptr : s.req.eviction.get(), s.req.tenant);
    if (const int64_t d = mgr_.n_evictions() - evicted_before; d > 0)
        evictions_[{s.req.bucket, s.req.eviction && !must_evict ? s.req.eviction_name : std::string("lru")}] += d;
    if (!copies) return false;
    for (const BlockCopy& c : *copies) kv_copy(be_->copy_block_slots(c.src_block, c.dst_block, c.n_slots));
    return true;
}

Engine::StepPlan Engine::schedule(double now_s, std::vector<EngineEvent>& events) {
    auto finish = [&](uint64_t id, FinishReason why, const std::string& err) { this->finish(id, why, err, now_s, events); };

    // ---- cancellations, deadlines, expired sessions
    for (uint64_t id : cancelled_)
        if (seqs_.count(id)) finish(id, FinishReason::CANCELLED, "cancelled by the caller");
    cancelled_.clear();
    std::vector<uint64_t> late;
    for (auto& [id, s] : seqs_)
        if (s->req.deadline_s > 0 && now_s > s->req.deadline_s) late.push_back(id);
    for (uint64_t id : late)
        finish(id, FinishReason::TIMEOUT, "timed out: the request passed its deadline; raise request_timeout_ms");
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        if (it->second.expires_s < now_s) {
            mgr_.free(it->second.kv);
            it = sessions_.erase(it);
        } else {
            ++it;
        }
    }

    // ---- the batch. Decodes first: each running sequence's next token (1 each; a decode that waits
    // for a prefill chunk costs every stream a step). Then prefill work, running chunks and waiting
    // requests together, shortest remaining prompt first (SRPT: a short prompt no longer waits
    // behind a long document's chunks; it minimises mean TTFT), with aging so that a long prompt
    // cannot starve: its remaining count drops k_aging_tokens_per_s for every second it has waited.
    // Priority comes before both.
    auto remaining = [&](const Seq& s) {
        if (!s.kv) return (int)s.all_tokens.size();  // waiting: the prefix cache's share is known at attach
        const SeqKv& kv = mgr_.seq(s.kv);
        return kv.n_tokens() - kv.n_computed;
    };
    auto prefill_key = [&](const Seq& s) { return (double)remaining(s) - k_aging_tokens_per_s * std::max(0.0, now_s - s.req.arrival_s); };
    auto before = [&](uint64_t a, uint64_t b) {
        const Seq &sa = *seqs_.at(a), &sb = *seqs_.at(b);
        const EngineRequest &ra = sa.req, &rb = sb.req;
        if (ra.priority != rb.priority) return ra.priority > rb.priority;
        if (!opt_.prefill_srpt) {
            if (ra.arrival_s != rb.arrival_s) return ra.arrival_s < rb.arrival_s;
            return ra.id < rb.id;
        }
        const bool da = sa.kv && remaining(sa) <= 1, db = sb.kv && remaining(sb) <= 1;
        if (da != db) return da;
        if (!da) {
            const double ka = prefill_key(sa), kb = prefill_key(sb);
            if (ka != kb) return ka < kb;
        }
        if (ra.arrival_s != rb.arrival_s) return ra.arrival_s < rb.arrival_s;
        return ra.id < rb.id;
    };
    std::sort(running_.begin(), running_.end(), before);
    StepPlan plan;
    int budget = opt_.max_batch_tokens;
    std::vector<uint64_t> order = running_;
    size_t end = order.size();  // order[end..] were preempted this step
    std::vector<uint64_t> admitted;  // from waiting this step (running_ gets them after the loop)
    bool admitting = true;           // false once a waiting one found no room, or under pressure
    // The best waiting request (the first of the minimal ones), found once and again only after the
    // waiting queue changed: admit_one is asked before every running sequence, and a scan per ask
    // cost running x waiting comparisons a step (milliseconds with hundreds waiting).
    uint64_t best_id = 0;
    bool best_known = false;
    auto best_waiting = [&]() {
        if (!best_known) {
            best_id = waiting_.front();
            for (uint64_t id : waiting_)
                if (before(id, best_id)) best_id = id;
            best_known = true;
        }
        return best_id;
    };
    // Admits the best waiting request if it comes before `next` (0: whatever comes). False when none.
    auto admit_one = [&](uint64_t next) -> bool {
        if (!admitting || budget <= 0 || waiting_.empty() || (int)(end + admitted.size()) >= opt_.max_batch) return false;
        if (end < order.size()) return admitting = false;  // under memory pressure (a preemption) admit nothing new
        const uint64_t best = best_waiting();
        if (next && !before(best, next)) return false;
        Seq& s = *seqs_.at(best);
        if (!s.kv) attach(s);
        const SeqKv& kv = mgr_.seq(s.kv);
        const int n = std::min(kv.n_tokens() - kv.n_computed, budget);
        bool ok = alloc_slots(s, n);
        while (!ok && free_one_session()) ok = alloc_slots(s, n);
        // A request nothing else can make room for (nothing running) takes LRU victims even if its
        // policy would decline them, so a declining policy delays requests but never stalls the pool.
        if (!ok && end == 0 && admitted.empty()) ok = alloc_slots(s, n, true);
        if (!ok) {
            // Wait for running sequences to finish. Drop the pins it took: a waiting sequence that
            // holds blocks could starve everyone (nothing would be preemptable).
            mgr_.free(s.kv);
            s.kv = 0;
            return admitting = false;
        }
        if (s.first_scheduled_s < 0) s.first_scheduled_s = now_s;
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), best));
        best_known = false;
        admitted.push_back(s.req.id);
        plan.push_back({s.req.id, n, {}});
        budget -= n;
        return true;
    };
    for (size_t i = 0; i < end && budget > 0; i++) {
        while (admit_one(order[i])) {
        }
        if (budget <= 0) break;
        Seq& s = *seqs_.at(order[i]);
        const SeqKv& kv = mgr_.seq(s.kv);
        const int n = std::min(kv.n_tokens() - kv.n_computed, budget);
        bool ok = n > 0 && alloc_slots(s, n);
        while (n > 0 && !ok) {
            if (free_one_session()) {
                ok = alloc_slots(s, n);
                continue;
            }
            if (end - 1 > i) {  // preempt the lowest-priority running sequence after this one
                Seq& v = *seqs_.at(order[--end]);
                preempt(v);
                waiting_.push_front(v.req.id);
                best_known = false;
                ok = alloc_slots(s, n);
                continue;
            }
            break;
        }
        if (!ok) {  // nothing left to preempt but itself
            preempt(s);
            waiting_.push_front(s.req.id);
            best_known = false;
            end = i;
            break;
        }
        plan.push_back({s.req.id, n, {}});
        budget -= n;
    }
    while (admit_one(0)) {
    }
    running_.assign(order.begin(), order.begin() + (std::ptrdiff_t)end);
    running_.insert(running_.end(), admitted.begin(), admitted.end());
    if (plan.empty()) return plan;

    // ---- the drafts: decoding sequences that speculate draft into the budget left over. Each
    // one's k comes from its bucket's speculation policy (the per-step ABI), asked only for a
    // sequence that could draft now: a decode step with at least two tokens left to produce.
    int n_plain_tokens = 0;
    for (const Planned& p : plan) n_plain_tokens += p.n;
    const std::vector<int> want = g_forced_set.load(std::memory_order_relaxed) ? std::vector<int>(plan.size(), 0)
                                                                             : ask_draft_budgets(plan, budget, n_plain_tokens);
    // The cap on what the drafts may add to a step shared with sequences that do not draft in it (a
    // prefill chunk, a bucket without speculation, a sequence whose policy chose k = 0): a share of
    // the predicted plain forward, once the forward's cost per token is measured (< 0: no cap). Those
    // sequences gain nothing from the drafts and wait for their verification.
    // A fit through noisy step times can read a slope of 0 (it is clamped there); a verified token is
    // never free, so under the cap its cost is at least 1% of the plain step's mean per token.
    double allowance_ms = -1, min_token_ms = 0;
    if (opt_.spec_max_slowdown > 0 && !sim_) {
        bool others = false;
        for (size_t i = 0; i < plan.size(); i++) others = others || want[i] == 0;
        const double t_plain = plain_step_ms(n_plain_tokens, n_plain_tokens == (int)plan.size());
        if (others && verify_ms_per_token() >= 0 && t_plain > 0) {
            allowance_ms = opt_.spec_max_slowdown * t_plain;
            min_token_ms = 0.01 * t_plain / std::max(1, n_plain_tokens);
        }
    }
    for (size_t i = 0; i < plan.size(); i++) {
        if (budget <= 0) break;
        Planned& p = plan[i];
        Seq& s = *seqs_.at(p.id);
        int max_k = std::min(want[i], budget);
        if (max_k <= 0) continue;
        // Tokens the draft model must catch up on first (its whole prompt at the first draft,
        // the output since its last draft after k = 0 steps): such a draft's time is not per
        // token, and the catch-up is paid in this step whatever k is. (A simulated draft's time is
        // its device time, which the backend prices at the forward.)
        const int n_catch_up = draft_catch_up_tokens(s);
        const double catch_up_ms = std::max(0.0, draft_catch_up_ms(s, n_catch_up));
        double per_token_ms = 0;
        if (allowance_ms >= 0) {
            per_token_ms = std::max(min_token_ms, verify_ms_per_token() + std::max(0.0, draft_ms_per_token_[(int)s.req.spec.source]));
            max_k = std::min<int>(max_k, (int)std::floor((allowance_ms - catch_up_ms) / per_token_ms));
            if (max_k <= 0) {
                stats_.n_spec_capped++;
                continue;
            }
        }
        const auto t_draft = std::chrono::steady_clock::now();
        p.draft = draft_for(s, max_k);
        if (!sim_) {
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_draft).count();
            s.fig.draft_s += dt;
            stats_.draft_s += dt;
            if (s.draft_owner && s.draft_owner->last_catch_up_tokens() > 2) {
                const int n = s.draft_owner->last_catch_up_tokens();
                const double ms = s.draft_owner->last_catch_up_ms();
                catch_up_fit_[(int)s.req.spec.source].observe(n, ms);
                stats_.n_draft_catch_ups++;
                stats_.n_draft_catch_up_tokens += n;
                stats_.draft_catch_up_s += ms * 1e-3;
            }
            // A draft token's cost: the step's drafting per token when it caught up on at most 2
            // tokens; else (a first draft, a probe after k = 0 steps) the mean of its one-token
            // draft forwards, so that a draft that stopped at k = 0 is still measured.
            const int n = p.draft.k();
            double per = -1;
            if (n > 0 && n_catch_up <= 2) per = dt * 1e3 / n;
            else if (s.draft_owner && s.draft_owner->last_chain_forwards() > 0)
                per = s.draft_owner->last_chain_ms() / s.draft_owner->last_chain_forwards();
            if (per >= 0) {
                double& m = draft_ms_per_token_[(int)s.req.spec.source];
                m = m < 0 ? per : m + 0.1 * (per - m);
            }
        }
        p.n += p.draft.k();
        budget -= p.draft.k();
        if (allowance_ms >= 0) allowance_ms -= catch_up_ms + per_token_ms * p.draft.k();
    }
    return plan;
}

Expected<bool> Engine::run(const StepPlan& plan) {
    batch_.assign(plan.size(), SeqInput{});
    for (size_t k = 0; k < plan.size(); k++) {
        const Planned& p = plan[k];
        const SeqKv& kv = mgr_.seq(seqs_.at(p.id)->kv);
        SeqInput& in = batch_[k];
        in.id = p.id;
        in.n_past = kv.n_computed;
        in.tokens = std::span<const int32_t>(kv.tokens).subspan(kv.n_computed, p.n);
        in.block_table = kv.blocks;
        in.logits = kv.n_computed + p.n == kv.n_tokens() ? LogitsMode::LAST : LogitsMode::NONE;
        if (p.draft.k() > 0) in.logits = LogitsMode::ALL;
        in.positions = p.draft.positions;  // a tree's depths and ancestor mask (empty: causal)
        in.mask = p.draft.mask;
    }
    if (auto hook = forward_fault_hook()) {
        std::vector<uint64_t> ids;
        for (const Planned& p : plan) ids.push_back(p.id);
        (*hook)(ids);
    }
    if (sim_) price_sim_drafts(plan);
    const auto t_fwd = std::chrono::steady_clock::now();
    Expected<bool> r = be_->forward(batch_, logits_);
    double fwd_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fwd).count();
    if (const double t = be_->forward_time_s(); t >= 0) fwd_s = t;
    stats_.forward_s += fwd_s;
    stats_.n_steps++;
    int n_tokens = 0;
    bool verifies = false;
    for (const Planned& p : plan) {
        n_tokens += p.n;
        if (p.draft.k() == 0) continue;
        verifies = true;
        seqs_.at(p.id)->fig.verify_s += fwd_s;
        stats_.verify_s += fwd_s;
    }
    forward_fit_.observe(n_tokens, fwd_s * 1e3);
    bool decode_only = true;
    for (const Planned& p : plan) decode_only = decode_only && p.n == 1 + p.draft.k();
    if (decode_only) decode_fit_.observe(n_tokens, fwd_s * 1e3);
    if (verifies) verify_ms_ = verify_ms_ < 0 ? fwd_s * 1e3 : verify_ms_ + 0.1 * (fwd_s * 1e3 - verify_ms_);
    return r;
}

void Engine::price_sim_drafts(const StepPlan& plan) {
    std::vector<SimDraftWork> work;
    std::vector<SimSeqWork> decoding;
    for (size_t k = 0; k < plan.size(); k++) {
        const Seq& s = *seqs_.at(plan[k].id);
        if (s.n_generated > 0) decoding.push_back({1, (int)s.all_tokens.size(), 1});
        const int n = plan[k].draft.k();
        if (n == 0) continue;
        // A suffix draft is priced as an n-gram one: no model runs.
        const SpecSource src = s.req.spec.source == SpecSource::SUFFIX ? SpecSource::NGRAM : s.req.spec.source;
        work.push_back({k, (int)src, s.req.spec.self_layers, (int)s.all_tokens.size() - 1, s.sim_draft_computed, n});
    }
    if (work.empty()) return;
    std::array<double, 4> per_token_ms{-1, -1, -1, -1};
    const std::vector<double> share = sim_->price_drafts(work, decoding, per_token_ms);
    for (size_t w = 0; w < work.size(); w++) {
        seqs_.at(plan[work[w].entry].id)->fig.draft_s += share[w];
        stats_.draft_s += share[w];
    }
    for (size_t src = 0; src < per_token_ms.size(); src++) {
        if (per_token_ms[src] < 0) continue;
        double& m = draft_ms_per_token_[src];
        m = m < 0 ? per_token_ms[src] : m + 0.1 * (per_token_ms[src] - m);
    }
}

void Engine::update(const StepPlan& plan, double now_s, std::vector<EngineEvent>& events) {
    const int V = model_.params().n_vocab;
    const int ctx = model_.params().n_ctx_train;
    // A backend that decides the tokens itself (the simulator) gives one per row instead of logits.
    const std::span<const int32_t> decided = be_->decided_tokens();
    const bool by_logits = decided.empty();
    // Plain rows (no bias, penalties or top logprobs; no forced-token hook) are sampled first, in
    // parallel on the forward's threads: greedy still takes a pass of exp over the vocabulary per
    // row for the logprob (~45 us at 8k), which one thread doing it for every row made the step's
    // largest cost outside the forward. Each sequence's sampler is its own, so the draws do not
    // depend on the split.
    std::vector<int> rows(plan.size(), -1);
    std::vector<size_t> plain;
    for (size_t k = 0, r = 0; k < plan.size(); k++) {
        if (batch_[k].logits == LogitsMode::ALL) r += (size_t)plan[k].draft.k() + 1;  // speculating: k + 1 rows
        if (batch_[k].logits != LogitsMode::LAST) continue;
        rows[k] = (int)r++;
        const Seq& q = *seqs_.at(plan[k].id);
        const SamplingParams& sp = q.req.sampling;
        if (by_logits && !sp.adjusts_logits() && sp.n_top_logprobs == 0 && !q.matcher) plain.push_back(k);
    }
    std::vector<std::optional<Sampled>> pre(plan.size());
    if (plain.size() > 1 && !g_forced_set.load(std::memory_order_relaxed)) {
        std::vector<std::exception_ptr> failed(plain.size());
        be_->host_threads().parallel_for((int64_t)plain.size(), [&](int64_t j) {
            const size_t k = plain[(size_t)j];
            try {
                pre[k] = seqs_.at(plan[k].id)->sampler.sample(
                    std::span<const float>(logits_.data() + (size_t)rows[k] * V, V));
            } catch (...) {
                failed[(size_t)j] = std::current_exception();
            }
        });
        for (const std::exception_ptr& e : failed)
            if (e) std::rethrow_exception(e);  // step() turns it into the batch's ERROR
    }
    int row = 0;
    std::vector<std::pair<uint64_t, FinishReason>> done;
    for (size_t k = 0; k < plan.size(); k++) {
        const Planned& p = plan[k];
        Seq& s = *seqs_.at(p.id);
        if (p.draft.k() > 0) {
            const size_t n_rows = (size_t)p.draft.k() + 1;
            bool fin = false;
            const int accepted_before = s.fig.n_accepted_tokens;
            const int root = mgr_.seq(s.kv).n_computed;
            if (by_logits) {
                apply_spec(s, p.draft, std::span<const float>(logits_).subspan((size_t)row * V, n_rows * V), events, fin);
            } else {
                commit_spec(s, p.draft, verify_decided(p.draft, decided.subspan((size_t)row, n_rows)), {}, events, fin);
            }
            const int n_acc = s.fig.n_accepted_tokens - accepted_before;
            observe_spec(s, p.draft.k(), n_acc);
            // A simulated draft computed the root and its own tokens but the last; the accepted ones stay.
            if (sim_ && (s.req.spec.source == SpecSource::DRAFT || s.req.spec.source == SpecSource::SELF))
                s.sim_draft_computed = root + 1 + std::min(n_acc, p.draft.k() - 1);
            row += (int)n_rows;
            stats_.n_decode_tokens += p.n;
            if (fin) done.push_back({s.req.id, events.back().finish});
            continue;
        }
        const bool wants = batch_[k].logits == LogitsMode::LAST;
        mgr_.commit_computed(s.kv, p.n);
        if (opt_.prefix_cache) mgr_.publish_full_blocks(s.kv);
        if (s.n_generated == 0 || !wants) stats_.n_prompt_tokens_computed += p.n;
        else stats_.n_decode_tokens += p.n;
        if (!wants) continue;
        std::span<const float> dist = by_logits ? std::span<const float>(logits_.data() + (size_t)row * V, V)
                                                : std::span<const float>();
        const int this_row = row++;
        const SamplingParams& sp = s.req.sampling;
        std::optional<FinishReason> end;
        if (by_logits && (sp.adjusts_logits() || s.matcher)) {  // on a copy, the batch's logits stay as computed
            adjusted_.assign(dist.begin(), dist.end());
            if (sp.adjusts_logits())  // bias and penalties
                adjust_logits(adjusted_, sp, std::span<const int32_t>(s.all_tokens).last((size_t)s.n_generated));
            if (s.matcher)
                end = constrained_end(mask_row(s, *s.matcher, adjusted_), *s.matcher, s.masker->vocab().eog_ids().size());
            dist = adjusted_;
        }
        if (end) {  // a constrained request whose grammar ends here (or allows nothing): no sample
            EngineEvent e = make_event(s);
            e.finished = true;
            e.finish = *end;
            if (*end == FinishReason::ERROR) e.error = dead_grammar_error(model_.tokenizer().decode(std::span<const int32_t>(s.all_tokens).last((size_t)s.n_generated)));
            done.push_back({s.req.id, e.finish});
            events.push_back(std::move(e));
            continue;
        }
        Sampled sm = !by_logits ? Sampled{decided[(size_t)this_row], 0.0f} : pre[k] ? *pre[k] : s.sampler.sample(dist);
        if (by_logits && g_forced_set.load(std::memory_order_relaxed) && !s.matcher) {
            std::shared_ptr<const ForcedTokenHook> h;
            {
                std::lock_guard<std::mutex> lk(g_fault_mu);
                h = g_forced_hook;
            }
            if (h)
                if (const int32_t f = (*h)(s.n_generated); f >= 0 && f < V) sm = {f, token_logprob(dist, f)};
        }
        // A constrained request's end-of-generation was allowed by its mask (stop_at_eos or not).
        const bool eos = (s.req.stop_at_eos || s.matcher) && model_.tokenizer().is_eog(sm.token);
        if (s.matcher && !eos && !s.masker->accept_token(*s.matcher, sm.token)) {
            // Only a -inf everywhere row (the sampler's token 0) gets here: nothing allowed was drawable.
            EngineEvent e = make_event(s);
            e.finished = true;
            e.finish = FinishReason::ERROR;
            e.error = dead_grammar_error(model_.tokenizer().decode(std::span<const int32_t>(s.all_tokens).last((size_t)s.n_generated)));
            done.push_back({s.req.id, e.finish});
            events.push_back(std::move(e));
            continue;
        }
        EngineEvent e = make_event(s);
        if (!eos) {
            s.all_tokens.push_back(sm.token);
            mgr_.append_tokens(s.kv, std::span<const int32_t>(&sm.token, 1));
            s.n_generated++;
            e.tokens.push_back(sm.token);
            e.logprobs.push_back(sm.logprob);
            if (sp.n_top_logprobs > 0 && by_logits) e.top_logprobs.push_back(top_logprobs(dist, sp.n_top_logprobs));
        }
        if (eos) {
            e.finished = true;
            e.finish = FinishReason::STOP;
        } else if (s.n_generated >= s.req.max_tokens || (int)s.all_tokens.size() >= ctx) {
            e.finished = true;
            e.finish = FinishReason::LENGTH;
        }
        if (e.finished) done.push_back({s.req.id, e.finish});
        events.push_back(std::move(e));
    }
    retire(done, now_s);
}

void Engine::retire(const std::vector<std::pair<uint64_t, FinishReason>>& done, double now_s) {
    for (auto [id, why] : done) {
        Seq& s = *seqs_.at(id);
        // A suffix-decoding request's finished text (its prompt's end and its output: the corpus
        // keeps the last max_text tokens) joins its tenant and bucket's corpus, so that a later
        // request that repeats the prompt matches from its first output token on.
        if (s.req.spec.source == SpecSource::SUFFIX && s.n_generated > 0 && (why == FinishReason::STOP || why == FinishReason::LENGTH))
            suffix_corpus_.add({s.req.tenant, s.req.bucket}, s.all_tokens);
        release(s, true, now_s);
        running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
        seqs_.erase(id);
    }
}

std::vector<Engine::BucketLoad> Engine::load_by_bucket() const {
    std::map<std::string_view, BucketLoad> by;
    auto at = [&](uint64_t id) -> BucketLoad* {
        auto it = seqs_.find(id);
        if (it == seqs_.end()) return nullptr;
        BucketLoad& l = by[it->second->req.bucket];
        l.bucket = it->second->req.bucket;
        return &l;
    };
    for (uint64_t id : running_)
        if (BucketLoad* l = at(id)) l->n_running++;
    for (uint64_t id : waiting_)
        if (BucketLoad* l = at(id)) l->n_waiting++;
    std::vector<BucketLoad> out;
    out.reserve(by.size());
    for (auto& [b, l] : by) out.push_back(std::move(l));
    return out;
}

std::vector<Engine::BucketKv> Engine::kv_by_bucket() const {
    std::map<std::string_view, std::unordered_set<int32_t>> blocks;
    auto add = [&](std::string_view bucket, SeqId kv) {
        if (!kv) return;
        auto& set = blocks[bucket];
        for (int32_t b : mgr_.seq(kv).blocks) set.insert(b);
    };
    for (const auto& [id, s] : seqs_) add(s->req.bucket, s->kv);
    for (const auto& [name, sess] : sessions_) add(sess.bucket, sess.kv);
    std::vector<BucketKv> out;
    out.reserve(blocks.size());
    for (const auto& [b, set] : blocks) out.push_back({std::string(b), (int64_t)set.size()});
    return out;
}

EngineStats Engine::stats() const {
    EngineStats st = stats_;
    st.n_waiting = (int)waiting_.size();
    st.n_running = (int)running_.size();
    st.n_sessions = (int)sessions_.size();
    st.kv = mgr_.stats();
    if (tiers_) st.tiers = tiers_->stats();
    st.draft_ms_per_token_ngram = draft_ms_per_token_[(int)SpecSource::NGRAM];
    st.draft_ms_per_token_model = draft_ms_per_token_[(int)SpecSource::DRAFT];
    st.verify_ms = verify_ms_;
    st.verify_ms_per_token = verify_ms_per_token();
    if (sim_) {
        const SimFigures& f = sim_->figures();
        st.sim_device_s = f.device_s;
        st.sim_overruns = f.overruns;
        st.sim_overrun_s = f.overrun_s;
        st.sim_overruns_waiting = f.overruns_waiting;
        st.sim_stream_step_s = f.n_seq_steps > 0 ? f.seq_step_s / (double)f.n_seq_steps : 0;
        st.sim_gemm_s = f.gemm_s;
        st.sim_attn_s = f.attn_s;
        st.sim_comm_s = f.comm_s;
        st.sim_overhead_s = f.overhead_s;
        st.sim_draft_s = f.draft_s;
    }
    return st;
}

std::vector<EvictionCount> Engine::take_evictions() {
    std::vector<EvictionCount> out;
    for (const auto& [k, n] : evictions_) out.push_back({k.first, k.second, n});
    evictions_.clear();
    return out;
}

}  // namespace steward
