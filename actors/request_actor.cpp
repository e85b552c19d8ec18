// request_actor: one per request. route (this generation's router, which asks the cache actor how much
// of the prompt each pool holds) -> admit (the pool's kv_allocator: admit, queue or refuse) -> submit
// (executor: reuse, allocation, prefill, decode) -> stream tokens to the caller -> finish: record the
// request's figures and call on_finish exactly once. With a cascade decision the first K tokens are
// held back until the routing policy's check: pass -> they stream and decoding goes on; fail -> the
// run is cancelled and the request re-runs on the stronger pool (an upgrade). A shadow run on the
// strongest pool is compared with the answer (per-route quality) and never reaches the caller.
#include <spdlog/spdlog.h>

#include "actors/actors.hpp"
#include "actors/shared_state.hpp"
#include "kv/prefix_index.h"
#include "model/tokenizer.h"

namespace steward {

namespace {

// The engine id of a run: a request may have up to three (answer, upgrade, shadow) on different pools.
enum Role : uint64_t { PRIMARY = 0, UPGRADE = 1, SHADOW = 2 };
uint64_t engine_id(uint64_t request, Role r) { return request * 4 + r; }
Role role_of(uint64_t engine) { return (Role)(engine & 3); }

struct Run {
    int32_t pool = -1;
    bool active = false;      // submitted and not finished
    double t_submit = 0, t_first = -1, t_last = -1;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    FinishInfo fin;
    bool finished = false;
    bool submitted = false;  // admitted by the pool's kv_allocator and sent to its executor
    EngineSubmit pending;    // what is sent once admitted
};

struct request_state {
    std::shared_ptr<RequestContext> ctx;
    RouteDecision route;
    Run runs[3];
    Role answer = PRIMARY;       // the run whose tokens reach the caller
    bool holding = false;        // cascade: tokens held back until the check
    size_t n_streamed = 0;       // tokens of the answer run handed to the caller
    std::unique_ptr<StreamDecoder> decoder;
    GenerationResult result;
    std::vector<double> token_times;
    std::vector<PoolUse> prior_pools;
    bool done = false;           // on_finish called
    bool cancel_requested = false;
    bool quality_recorded = false;
    int32_t n_prompt = 0;
    int32_t max_tokens = 0;            // the request's, or the config's default
    const Tokenizer* tok0 = nullptr;   // the tokenizer the prompt was classified with...
    std::vector<int32_t> ids0;         // ...and its ids, reused by every run on a pool sharing it
    std::vector<std::vector<int32_t>> ids_by_pool;  // prompt ids per pool, encoded once (cache query, runs)
    static inline const char* name = "request";
};

using self_ptr = caf::stateful_actor<request_state>*;

const PoolHandle& pool_of(self_ptr self, int32_t i) { return *self->state.ctx->snap->pools.at(i); }

std::vector<int32_t> prompt_for(self_ptr self, int32_t pool) {
    auto& st = self->state;
    const GenerationRequest& req = st.ctx->req;
    if (!req.prompt_ids.empty()) return req.prompt_ids;
    st.ids_by_pool.resize(st.ctx->snap->pools.size());
    if (!st.ids_by_pool[pool].empty()) return st.ids_by_pool[pool];
    const Tokenizer& tok = pool_of(self, pool).model->tokenizer();
    std::vector<int32_t> ids = &tok == st.tok0 ? st.ids0 : tok.encode(req.prompt, req.add_bos && tok.add_bos_default());
    if (ids.empty() && tok.bos() >= 0) ids.push_back(tok.bos());
    st.ids_by_pool[pool] = ids;
    return ids;
}

// The prompt's lookup hashes on every pool of the snapshot, for the router's cache query.
CacheQuery cache_query(self_ptr self) {
    const auto& ctx = *self->state.ctx;
    CacheQuery q;
    q.request_id = ctx.id;
    const int32_t tenant = ctx.shared->tenant_id(ctx.req.tenant);
    const uint64_t salt = ctx.snap->config->tenant_salt(ctx.req.tenant);
    for (size_t i = 0; i < ctx.snap->pools.size(); i++) {
        const PoolHandle& ph = *ctx.snap->pools[i];
        CachePoolQuery pq;
        pq.pool_id = ph.id;
        pq.block_size = ph.cfg.block_size;
        if (ph.cfg.prefix_cache)
            pq.hashes = lookup_block_hashes(prompt_for(self, (int32_t)i), ph.cfg.block_size, tenant, salt, ph.public_prefixes);
        q.pools.push_back(std::move(pq));
    }
    return q;
}

FinishInfo run_finish(uint64_t engine, const char* reason, const std::string& msg) {
    FinishInfo f;
    f.id = engine;
    f.reason = reason;
    f.error = msg;
    f.t_s = now_s();
    return f;
}

// The pool's kv_allocator answered for a run: admitted -> to the executor; refused -> the run finishes
// overloaded with the allocator's message; queued -> wait for its next (admit_atom, AdmitAnswer).
void on_admission(self_ptr self, Role role, const AdmitAnswer& a) {
    auto& st = self->state;
    Run& run = st.runs[role];
    // Cancelled meanwhile: its cancelled finish (and so its release) is already on the way.
    if (!run.active || run.submitted || st.cancel_requested) return;
    const PoolHandle& ph = pool_of(self, run.pool);
    if (a.verdict == (int32_t)AdmissionVerdict::REFUSE)
        return (void)self->send(self, finish_atom::value, run_finish(run.pending.id, "overloaded", a.message));
    if (a.verdict != (int32_t)AdmissionVerdict::ADMIT) return;
    run.submitted = true;
    self->send(ph.executor, submit_atom::value, std::move(run.pending));
}

void submit_run(self_ptr self, Role role, int32_t pool) {
    auto& st = self->state;
    const auto& ctx = *st.ctx;
    const GenerationRequest& req = ctx.req;
    Run& run = st.runs[role];
    run = Run{};
    run.pool = pool;
    run.active = true;
    run.t_submit = now_s();
    EngineSubmit m;
    m.id = engine_id(ctx.id, role);
    m.tenant = ctx.shared->tenant_id(req.tenant);
    m.salt = ctx.snap->config->tenant_salt(req.tenant);
    m.prompt = prompt_for(self, pool);
    m.max_tokens = st.max_tokens;
    m.temperature = req.temperature;
    m.top_p = req.top_p;
    m.top_k = req.top_k;
    m.seed = req.seed;
    m.ignore_eos = req.ignore_eos;
    m.priority = st.route.priority;
    m.arrival_s = ctx.arrival_s;
    const double timeout = ctx.snap->config->limits.request_timeout_ms;
    m.deadline_s = timeout > 0 ? ctx.arrival_s + timeout / 1e3 : 0;
    // A shadow only measures: it neither keeps nor reuses the conversation's pinned KV.
    if (role != SHADOW) m.session = SharedState::session_key(m.tenant, req.session);
    m.generation = st.route.generation;
    m.bucket_index = st.route.bucket_index;
    if (const TenantConfig* t = ctx.snap->config->find_tenant(req.tenant); t && t->kv_quota >= 0)
        m.kv_quota_blocks = (int32_t)(t->kv_quota * pool_of(self, pool).n_blocks);
    if (m.prompt.empty()) {
        FinishInfo f;
        f.id = m.id;
        f.reason = "error";
        f.error = "empty prompt and the vocabulary has no BOS token";
        f.t_s = now_s();
        self->send(self, finish_atom::value, f);
        return;
    }
    // KV admission first: the pool's kv_allocator reserves the run's worst-case blocks.
    const PoolHandle& ph = pool_of(self, pool);
    if ((int64_t)m.prompt.size() + m.max_tokens > ph.model->params().n_ctx_train) {
        // Invalid whatever the load: the engine refuses it with the context error, not "overloaded".
        run.submitted = true;
        return (void)self->send(ph.executor, submit_atom::value, std::move(m));
    }
    AdmitRequest ar{m.id, req.tenant, Admission::blocks_for((int64_t)m.prompt.size(), m.max_tokens, ph.cfg.block_size)};
    run.pending = std::move(m);
    self->request(ph.kv_allocator, caf::infinite, admit_atom::value, std::move(ar))
        .then([=](const AdmitAnswer& a) { on_admission(self, role, a); },
              [=](caf::error& err) {
                  self->send(self, finish_atom::value,
                             run_finish(engine_id(self->state.ctx->id, role), "error",
                                        "KV admission failed: " + self->system().render(err)));
              });
}

// Hands the answer run's tokens from n_streamed on to the caller.
void stream(self_ptr self) {
    auto& st = self->state;
    const Run& run = st.runs[st.answer];
    if (st.holding || run.tokens.size() <= st.n_streamed) return;
    const double t = now_s();
    std::vector<int32_t> ids(run.tokens.begin() + (long)st.n_streamed, run.tokens.end());
    std::string piece;
    for (size_t i = st.n_streamed; i < run.tokens.size(); i++) {
        st.result.tokens.push_back(run.tokens[i]);
        st.result.logprobs.push_back(run.logprobs[i]);
        st.token_times.push_back(t);
        piece += st.decoder->push(run.tokens[i]);
    }
    st.n_streamed = run.tokens.size();
    st.result.text += piece;
    if (st.ctx->cb.on_token) st.ctx->cb.on_token(piece, ids);
}

void update_live(self_ptr self, const Run& run, bool failed) {
    if (run.pool < 0) return;
    PoolLive& live = *pool_of(self, run.pool).live;
    std::lock_guard<std::mutex> lk(live.mu);
    live.stats.error_rate = ewma(live.stats.error_rate < 0 ? 0 : live.stats.error_rate, failed ? 1.0 : 0.0);
    if (run.t_first >= 0 && run.finished)
        live.stats.prefill_ms_per_token = ewma(live.stats.prefill_ms_per_token, (run.t_first - run.t_submit) * 1e3 /
                                                                                   (double)std::max(1, run.fin.n_prompt - run.fin.n_cached));
    if (run.tokens.size() >= 2 && run.t_last > run.t_first)
        live.stats.tpot_ms = ewma(live.stats.tpot_ms, (run.t_last - run.t_first) * 1e3 / (double)(run.tokens.size() - 1));
}

// Token agreement of a run with the shadow: common prefix / longer output (greedy outputs diverge for
// good at their first difference), and exact match.
void record_quality(self_ptr self) {
    auto& st = self->state;
    const Run& a = st.runs[st.answer];
    const Run& s = st.runs[SHADOW];
    if (st.quality_recorded || s.pool < 0 || !s.finished || !st.done) return;
    st.quality_recorded = true;
    if (a.pool == s.pool) return;  // upgraded to the shadow's pool: nothing to compare
    if (!finish_reason_ok(parse_finish_reason(s.fin.reason).value_or(FinishReason::ERROR)) ||
        !finish_reason_ok(parse_finish_reason(st.result.finish_reason).value_or(FinishReason::ERROR)))
        return;
    size_t common = 0;
    while (common < a.tokens.size() && common < s.tokens.size() && a.tokens[common] == s.tokens[common]) common++;
    const size_t longer = std::max(a.tokens.size(), s.tokens.size());
    const double agreement = longer ? (double)common / (double)longer : 1.0;
    const bool exact = a.tokens == s.tokens;
    const std::string& pool = pool_of(self, a.pool).cfg.name;
    auto& sh = *st.ctx->shared;
    std::lock_guard<std::mutex> lk(sh.metrics_mu);
    sh.metrics->record_quality(st.route.bucket, pool, agreement, exact);
}

void maybe_quit(self_ptr self) {
    auto& st = self->state;
    for (const Run& r : st.runs)
        if (r.active) return;
    if (!st.done) return;
    record_quality(self);
    st.ctx->shared->finished(st.ctx->id);
    self->quit();
}

void finish(self_ptr self, const FinishInfo& f) {
    auto& st = self->state;
    if (st.done) return;
    st.done = true;
    st.holding = false;
    stream(self);
    const auto& ctx = *st.ctx;
    const Run& run = st.runs[st.answer];
    GenerationResult& r = st.result;
    r.id = ctx.id;
    r.finish_reason = f.reason;
    r.error = f.error;
    r.bucket = st.route.bucket;
    if (st.decoder) {
        const std::string rest = st.decoder->flush();
        r.text += rest;
        if (!rest.empty() && ctx.cb.on_token) ctx.cb.on_token(rest, {});
    }
    RequestMetrics& m = r.metrics;
    m.prompt_tokens = f.n_prompt;
    m.cached_tokens = f.n_cached;
    m.completion_tokens = (int)r.tokens.size();
    m.recomputed_tokens = f.n_recomputed;
    m.e2e_ms = (f.t_s - ctx.arrival_s) * 1e3;
    m.config_generation = st.route.generation;
    if (f.first_scheduled_s >= 0) m.queue_ms = (f.first_scheduled_s - ctx.arrival_s) * 1e3;
    if (!st.token_times.empty()) m.ttft_ms = (st.token_times.front() - ctx.arrival_s) * 1e3;
    if (st.token_times.size() >= 2)
        m.tpot_ms = (st.token_times.back() - st.token_times.front()) * 1e3 / (double)(st.token_times.size() - 1);

    RequestRecord rec;
    rec.bucket = st.route.bucket;
    rec.tenant = ctx.req.tenant;
    if (run.pool >= 0) {
        rec.pool = pool_of(self, run.pool).cfg.name;
        r.pool = rec.pool;
    }
    rec.t_arrival_s = ctx.arrival_s;
    if (f.first_scheduled_s >= 0) rec.t_scheduled_s = f.first_scheduled_s;
    if (!st.token_times.empty()) rec.t_first_token_s = st.token_times.front();
    rec.t_finish_s = f.t_s;
    for (size_t i = 1; i < st.token_times.size(); i++) rec.itl_s.push_back(st.token_times[i] - st.token_times[i - 1]);
    rec.n_prompt_tokens = f.n_prompt;
    rec.n_cached_prompt_tokens = f.n_cached;
    rec.n_output_tokens = (int64_t)r.tokens.size();
    rec.n_recomputed_tokens = f.n_recomputed;
    rec.finish = parse_finish_reason(f.reason).value_or(FinishReason::ERROR);
    rec.config_generation = st.route.generation;
    rec.prior_pools = st.prior_pools;
    rec.fallback = st.route.fallback;
    r.upgraded = !st.prior_pools.empty();
    r.fallback = st.route.fallback;
    update_live(self, run, !finish_reason_ok(rec.finish) && rec.finish != FinishReason::CANCELLED);
    {
        std::lock_guard<std::mutex> lk(ctx.shared->metrics_mu);
        m.cost = request_cost(rec, ctx.shared->metrics->config());
        ctx.shared->metrics->record(rec);
    }
    if (ctx.cb.on_finish) ctx.cb.on_finish(r);
    // The caller has its answer; a shadow still running is cancelled only if the caller cancelled.
    maybe_quit(self);
}

void fail(self_ptr self, const std::string& reason, const std::string& msg) {
    FinishInfo f;
    f.id = engine_id(self->state.ctx->id, PRIMARY);
    f.reason = reason;
    f.error = msg;
    f.t_s = now_s();
    finish(self, f);
}

steward_route_request route_request(self_ptr self) {
    auto& st = self->state;
    const GenerationRequest& req = st.ctx->req;
    return steward_route_request{st.ctx->id, st.route.bucket.c_str(), req.tenant.c_str(),
                                 st.n_prompt, st.max_tokens, req.temperature,
                                 req.tools ? 1 : 0, req.response_format.c_str()};
}

// The cascade check on the first tokens: true when the request moved to the upgrade pool.
bool check_cascade(self_ptr self, bool finished) {
    auto& st = self->state;
    st.holding = false;
    const BucketPolicies& pol = st.ctx->snap->policies.at(st.route.bucket_index);
    if (!pol.routing || st.cancel_requested) return false;
    const Run& run = st.runs[PRIMARY];
    steward_token_view tv{run.tokens.data(), run.logprobs.data(), (uint32_t)run.tokens.size(), finished ? 1 : 0};
    bool fallback = false;
    const bool up = pol.routing->check_upgrade(route_request(self), tv, &fallback);
    if (fallback) st.route.fallback = true;
    if (!up) return false;
    // Upgrade: the cheap run's work is recorded (and charged); the answer comes from the strong pool.
    PoolUse use;
    use.pool = pool_of(self, run.pool).cfg.name;
    use.n_output_tokens = (int64_t)run.tokens.size();
    if (run.finished) {
        use.n_prompt_tokens = run.fin.n_prompt;
        use.n_cached_prompt_tokens = run.fin.n_cached;
    }
    st.prior_pools.push_back(use);
    if (run.active) self->send(pool_of(self, run.pool).executor, cancel_atom::value, engine_id(st.ctx->id, PRIMARY));
    st.answer = UPGRADE;
    st.decoder = std::make_unique<StreamDecoder>(pool_of(self, st.route.upgrade_pool).model->tokenizer());
    submit_run(self, UPGRADE, st.route.upgrade_pool);
    return true;
}

caf::behavior request_actor(self_ptr self, std::shared_ptr<RequestContext> ctx) {
    self->state.ctx = ctx;
    const GenerationRequest& req = ctx->req;
    const Snapshot& snap = *ctx->snap;
    // Classify with the first pool's tokenizer; a run re-tokenizes only if its pool's differs.
    auto& st0 = self->state;
    st0.tok0 = &snap.pools.front()->model->tokenizer();
    if (req.prompt_ids.empty()) st0.ids0 = st0.tok0->encode(req.prompt, req.add_bos && st0.tok0->add_bos_default());
    st0.n_prompt = (int32_t)(req.prompt_ids.empty() ? st0.ids0.size() : req.prompt_ids.size());
    st0.max_tokens = req.max_tokens > 0 ? req.max_tokens : snap.config->limits.max_tokens_default;
    RouteQuery q;
    q.request_id = ctx->id;
    q.hint = req.bucket_hint;
    q.prompt_tokens = st0.n_prompt;
    q.max_tokens = st0.max_tokens;
    q.temperature = req.temperature;
    q.tools = req.tools;
    q.response_format = req.response_format;
    q.tenant = req.tenant;
    q.cache = cache_query(self);
    self->request(snap.router, caf::infinite, route_atom::value, q)
        .then(
            [=](const RouteDecision& d) {
                auto& st = self->state;
                st.route = d;
                if (st.cancel_requested) return fail(self, "cancelled", "cancelled by the caller");
                st.decoder = std::make_unique<StreamDecoder>(pool_of(self, d.pool).model->tokenizer());
                st.holding = d.upgrade_pool >= 0 && d.check_after_tokens > 0;
                submit_run(self, PRIMARY, d.pool);
                if (d.shadow_pool >= 0) submit_run(self, SHADOW, d.shadow_pool);
            },
            [=](caf::error& err) { fail(self, "error", "routing failed: " + self->system().render(err)); });
    return {
        [=](token_atom, const TokenBatch& b) {
            auto& st = self->state;
            Run& run = st.runs[role_of(b.id)];
            const double t = now_s();
            if (run.t_first < 0) run.t_first = t;
            run.t_last = t;
            for (size_t i = 0; i < b.tokens.size(); i++) {
                run.tokens.push_back(b.tokens[i]);
                run.logprobs.push_back(i < b.logprobs.size() ? b.logprobs[i] : 0.0f);
            }
            const Role role = role_of(b.id);
            if (role == SHADOW || role != st.answer || st.done) return;
            if (st.holding && run.tokens.size() >= (size_t)st.route.check_after_tokens && check_cascade(self, false)) return;
            stream(self);
        },
        [=](admit_atom, const AdmitAnswer& a) { on_admission(self, role_of(a.id), a); },
        [=](finish_atom, const FinishInfo& f) {
            auto& st = self->state;
            const Role role = role_of(f.id);
            Run& run = st.runs[role];
            // The run's KV reservation ends with it (a refused or never-admitted run's release is ignored).
            if (run.pool >= 0) self->send(pool_of(self, run.pool).kv_allocator, release_atom::value, f.id);
            run.active = false;
            run.finished = true;
            run.fin = f;
            if (role == SHADOW) {
                update_live(self, run, false);
                return maybe_quit(self);
            }
            if (role != st.answer) {
                // The cancelled cheap run of an upgrade: its prompt work is charged to the request.
                if (!st.prior_pools.empty()) {
                    st.prior_pools.back().n_prompt_tokens = f.n_prompt;
                    st.prior_pools.back().n_cached_prompt_tokens = f.n_cached;
                }
                return maybe_quit(self);
            }
            if (st.holding && check_cascade(self, true)) return;
            finish(self, f);
        },
        [=](cancel_atom) {
            auto& st = self->state;
            st.cancel_requested = true;
            for (uint64_t r = 0; r < 3; r++) {
                Run& run = st.runs[r];
                if (!run.active) continue;
                const uint64_t id = engine_id(st.ctx->id, (Role)r);
                if (run.submitted)
                    self->send(pool_of(self, run.pool).executor, cancel_atom::value, id);
                else  // still waiting for KV admission: the finish releases its place in the queue
                    self->send(self, finish_atom::value, run_finish(id, "cancelled", "cancelled by the caller"));
            }
        },
    };
}

}  // namespace

caf::actor spawn_request(caf::actor_system& sys, std::shared_ptr<RequestContext> ctx) {
    return sys.spawn(request_actor, std::move(ctx));
}

}  // namespace steward
