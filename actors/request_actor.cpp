// request_actor: one per request, thin. It asks this generation's router for a route (the router
// asks the cache actor how much of the prompt each pool holds), then hands every event (route, a
// run's tokens, a run's end, cancel) to the request core (runtime/request/request_fsm.h) and
// executes the actions it returns: submit a run (first the pool's kv_allocator admits, queues or
// refuses it, then the executor gets it) or cancel one, stream text to the caller, fold figures
// into the pool's live stats and the metrics, call on_finish (exactly once, the core sees to it)
// and stop when the core is done. The prompt of each pool (request/pool_prompts.h) is the one a
// pool's run, its cache lookup and its output constraint read: a chat is rendered per pool by the
// caller's hook, so the routed pool's run gets that pool's own rendering.
#include <chrono>
#include <cmath>
#include <set>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/actors.hpp"
#include "request/request_check.h"
#include "grammar/constraint.h"
#include "actors/shared_state.hpp"
#include "kv/admission.h"
#include "kv/prefix_index.h"
#include "model/tokenizer.h"
#include "request/pool_prompts.h"
#include "request/request_fsm.h"

namespace steward {

namespace {

// The request's prompt on each pool of its generation (request/pool_prompts.h): as given, or
// rendered by the caller's hook with that pool's template, tokenized once with its tokenizer.
std::unique_ptr<PoolPrompts> make_prompts(const RequestContext& ctx) {
    std::vector<PromptTarget> targets;
    // A prompt given as is needs only the pools' names (its errors name them), not their templates.
    for (const auto& ph : ctx.snap->pools)
        targets.push_back({ctx.req.render ? prompt_pool(*ph) : PromptPool{ph->cfg.name}, &ph->model->tokenizer()});
    return std::make_unique<PoolPrompts>(ctx.req, std::move(targets), ctx.documents_chars);
}

// The bucket's routing policy of the request's generation.
class BucketRouting : public RequestRouting {
public:
    BucketRouting(const RequestContext& ctx, int32_t n_prompt, int32_t max_tokens)
        : ctx_(ctx), n_prompt_(n_prompt), max_tokens_(max_tokens) {}
    void set_route(const RouteDecision& d) { route_ = d; }
    bool check_upgrade(const std::vector<int32_t>& tokens, const std::vector<float>& logprobs, bool finished,
                       bool* fallback) override {
        const BucketPolicies& pol = ctx_.snap->policies.at(route_.bucket_index);
        if (!pol.routing) return false;
        const steward_token_view tv{tokens.data(), logprobs.data(), (uint32_t)tokens.size(), finished ? 1 : 0};
        return pol.routing->check_upgrade(route_.input, tv, fallback);
    }
    // Tells the bucket's router how the request ended (a router may learn from it).
    void report_outcome(const RequestRecord& rec, const GenerationResult& g) const {
        if (route_.bucket.empty()) return;  // never routed
        const auto& routing = ctx_.snap->policies.at(route_.bucket_index).routing;
        if (!routing || !routing->has_outcome()) return;
        const RequestMetrics& m = g.metrics;
        routing->on_outcome(route_.input, RouteOutcome{ctx_.snap->pool_index(rec.pool), rec.finish, g.upgraded,
                                                       m.prompt_tokens, m.cached_tokens, m.completion_tokens, m.ttft_ms,
                                                       m.tpot_ms, m.e2e_ms, m.cost});
    }

private:
    const RequestContext& ctx_;
    int32_t n_prompt_, max_tokens_;
    RouteDecision route_;
};

// A run between the core's SubmitRun and the executor: the pool's kv_allocator reserves its
// worst-case blocks first (admit), or holds it in its queue, or refuses it (overloaded).
struct RunAdmission {
    int32_t pool = -1;     // the run's pool (its allocator gets the release when the run ends)
    bool waiting = false;  // asked the allocator, not admitted yet
    bool inflight = false; // counted in the pool's n_inflight (until its end)
    int32_t n_blocks = 0;  // and its prompt's blocks in n_blocks_inflight
    EngineRequest pending;  // sent to the executor once admitted
};

struct request_state {
    std::shared_ptr<RequestContext> ctx;
    std::unique_ptr<PoolPrompts> vocab;        // declared before the core, which holds references
    std::unique_ptr<BucketRouting> routing;
    std::unique_ptr<RequestFsm> core;
    RunAdmission admission[3];                 // by RunRole
    int32_t bucket_index = -1;                 // the route's bucket (its on_worker_loss)
    std::set<uint64_t> watching;               // remote pools whose monitor tells this request of a loss
    int n_releases_pending = 0;                // releases the allocators have not confirmed yet
    bool core_done = false;                    // the core said RequestDone
    nlohmann::ordered_json trace;              // the decision trace so far (published at every change)
    int32_t answer_pool = -1;                  // the pool the caller's on_pool last heard of
    static inline const char* name = "request";
};

using self_ptr = RequestActor::stateful_pointer<request_state>;

const char* role_name(RunRole r) { return r == RunRole::PRIMARY ? "primary" : r == RunRole::UPGRADE ? "upgrade" : "shadow"; }

void publish_trace(self_ptr self) {
    self->state.ctx->shared->traces.put(self->state.ctx->id, self->state.ctx->req.tenant, self->state.trace);
}

void trace_route(self_ptr self, const RouteDecision& d) {
    const Snapshot& snap = *self->state.ctx->snap;
    nlohmann::ordered_json& t = self->state.trace;
    t["state"] = "routed";
    t["bucket"] = {{"name", d.bucket}, {"why", d.bucket_why}};
    nlohmann::ordered_json pools = nlohmann::ordered_json::array();
    for (size_t i = 0; i < snap.pools.size(); i++) {
        nlohmann::ordered_json p = {{"name", snap.pools[i]->cfg.name}};
        p["cached_prompt_tokens"] = i < d.input.n_cached_prompt_tokens.size() ? d.input.n_cached_prompt_tokens[i] : -1;
        auto put = [&](const char* k, const std::vector<double>& v) {
            if (i < v.size() && std::isfinite(v[i])) p[k] = v[i];
        };
        put("est_cost", d.est_cost);
        put("est_ttft_ms", d.est_ttft_ms);
        put("est_latency_ms", d.est_latency_ms);
        put("quality", d.quality);
        put("risk", d.risk);
        pools.push_back(std::move(p));
    }
    auto pool_name = [&](int32_t i) -> nlohmann::ordered_json {
        if (i < 0 || i >= (int32_t)snap.pools.size()) return nullptr;
        return snap.pools[(size_t)i]->cfg.name;
    };
    t["route"] = {{"generation", d.generation},  {"pool", pool_name(d.pool)},
                  {"why", d.route_why},          {"fallback", d.fallback},
                  {"upgrade_pool", pool_name(d.upgrade_pool)}, {"check_after_tokens", d.check_after_tokens},
                  {"shadow_pool", pool_name(d.shadow_pool)},   {"draft_budget_per_step", d.draft_budget},
                  {"session_pool", pool_name(d.input.session_pool)}, {"pools", std::move(pools)}};
    // The template the routed pool renders the prompt with (rendered per pool: after routing).
    if (self->state.vocab->per_pool()) t["route"]["template"] = self->state.vocab->template_used(d.pool);
    publish_trace(self);
}

void trace_admission(self_ptr self, RunRole role, int32_t pool, int64_t n_blocks, const char* verdict, const std::string& msg) {
    nlohmann::ordered_json a = {{"run", role_name(role)},
                                {"pool", self->state.ctx->snap->pools.at(pool)->cfg.name},
                                {"blocks", n_blocks},
                                {"verdict", verdict}};
    if (!msg.empty()) a["message"] = msg;
    self->state.trace["admission"].push_back(std::move(a));
    publish_trace(self);
}

RequestSetup make_setup(const RequestContext& ctx, int32_t max_tokens) {
    const GenerationRequest& req = ctx.req;
    const Config& c = *ctx.snap->config;
    RequestSetup s;
    s.id = ctx.id;
    s.tenant = req.tenant;
    s.tenant_id = ctx.shared->tenant_id(req.tenant);
    s.salt = c.tenant_salt(req.tenant);
    s.session_key = SharedState::session_key(s.tenant_id, req.session);
    s.max_tokens = max_tokens;
    s.sampling = sampling_of(req);
    s.stop = req.stop;
    s.reuse_keys = ctx.reuse_keys;
    s.watched = ctx.cb.on_token || ctx.cb.on_logprobs;
    s.ignore_eos = req.ignore_eos;
    s.arrival_s = ctx.arrival_s;
    const double timeout = c.limits.request_timeout_ms;
    s.deadline_s = timeout > 0 ? ctx.arrival_s + timeout / 1e3 : 0;
    if (const TenantConfig* t = c.find_tenant(req.tenant); t && t->kv_quota >= 0) s.kv_quota = t->kv_quota;
    // A request is charged the prices of the generation it started with.
    for (size_t i = 0; i < ctx.snap->pools.size(); i++) {
        const PoolConfig& pc = i < c.pools.size() ? c.pools[i] : ctx.snap->pools[i]->cfg;
        s.pools.push_back({ctx.snap->pools[i]->cfg.name, ctx.snap->pools[i]->n_blocks,
                           PoolPrice{pc.price_prompt, pc.price_cached, pc.price_output},
                           ctx.snap->pools[i]->model->params().n_ctx_train});
    }
    return s;
}


// The prompt's lookup hashes on every pool of the snapshot, for the router's cache query.
CacheQuery cache_query(const RequestContext& ctx, PoolPrompts& vocab) {
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
            pq.hashes = lookup_block_hashes(vocab.prompt_ids((int32_t)i), ph.cfg.block_size, tenant, salt, ph.public_prefixes);
        q.pools.push_back(std::move(pq));
    }
    return q;
}

// A run's end the actor itself reports (admission refused or failed, cancelled while queued): a
// message to itself, so the core sees it like an executor's and never re-entrantly.
void end_run(self_ptr self, uint64_t engine_id, FinishReason why, const std::string& msg) {
    EngineEvent f;
    f.id = engine_id;
    f.finished = true;
    f.finish = why;
    f.error = msg;
    f.t_s = now_s();
    self->send(self, event_atom::value, std::move(f));
}

// The pool's count of runs sent there and not ended (what kv_aware routing balances on).
// Counted at submission with its prompt's blocks (n_prompt), uncounted at its end: the front's own,
// instant view of each pool's load (heartbeats are up to heartbeat_ms old).
void count_inflight(self_ptr self, RunRole role, bool on, int64_t n_prompt = 0) {
    RunAdmission& ad = self->state.admission[(int)role];
    if (ad.pool < 0 || ad.inflight == on) return;
    ad.inflight = on;
    const PoolHandle& ph = *self->state.ctx->snap->pools.at(ad.pool);
    if (on) ad.n_blocks = (int32_t)((n_prompt + ph.cfg.block_size - 1) / ph.cfg.block_size);
    std::lock_guard<std::mutex> lk(ph.live->mu);
    ph.live->stats.n_inflight += on ? 1 : -1;
    ph.live->stats.n_blocks_inflight += on ? ad.n_blocks : -ad.n_blocks;
}

// Tokens and ends count only from the executor the run is on now (or from this actor itself): a run
// moved off a lost worker that still talks must not add to the new one.
bool from_current_run(self_ptr self, RunRole role) {
    const caf::strong_actor_ptr& sender = self->current_sender();
    if (!sender || sender == self->ctrl()) return true;
    const int32_t pool = self->state.admission[(int)role].pool;
    return pool < 0 || caf::actor_cast<caf::actor_addr>(sender) == self->state.ctx->snap->pools.at(pool)->executor.address();
}

// Where a run lost with its worker goes on: the up pool of the same vocabulary with the fewest runs in
// flight (-1: none, or the bucket says fail).
int32_t retry_pool_for(const Snapshot& snap, int32_t bucket_index, int32_t lost) {
    if (bucket_index >= 0 && bucket_index < (int32_t)snap.config->buckets.size() &&
        snap.config->buckets[bucket_index].on_worker_loss == "fail")
        return -1;
    int32_t best = -1, best_load = 0;
    for (int32_t i = 0; i < (int32_t)snap.pools.size(); i++) {
        const PoolHandle& ph = *snap.pools[i];
        if (i == lost || ph.live->lost || ph.vocab_id != snap.pools.at(lost)->vocab_id) continue;
        int32_t load;
        {
            std::lock_guard<std::mutex> lk(ph.live->mu);
            if (!ph.live->stats.available) continue;
            load = ph.live->stats.n_inflight;
        }
        if (best < 0 || load < best_load) best = i, best_load = load;
    }
    return best;
}

void execute(self_ptr self, RequestActions&& actions);

// Run `role` was on a pool whose worker is lost: it is retried on another pool (the core carries its
// tokens over) or ends with an error naming the worker.
void run_lost(self_ptr self, RunRole role, const std::string& why) {
    auto& st = self->state;
    RunAdmission& ad = st.admission[(int)role];
    if (ad.pool < 0 || !ad.inflight) return;  // ended already
    const Snapshot& snap = *st.ctx->snap;
    const PoolHandle& ph = *snap.pools.at(ad.pool);
    const uint64_t engine_id = run_engine_id(st.ctx->id, role);
    ad.waiting = false;
    // A worker that only stopped answering heartbeats may still run it: let it go there.
    caf::anon_send(ph.executor, cancel_atom::value, engine_id);
    if (ph.kv_allocator) caf::anon_send(ph.kv_allocator, release_atom::value, engine_id);
    count_inflight(self, role, false);
    EngineEvent e;
    e.finished = true;
    e.finish = FinishReason::ERROR;
    e.t_s = now_s();
    e.error = "the worker " + ph.worker + " of pool '" + ph.cfg.name + "' was lost (" + why + ")";
    const int32_t retry = retry_pool_for(snap, st.bucket_index, ad.pool);
    const bool fail_by_bucket = st.bucket_index >= 0 && snap.config->buckets.at(st.bucket_index).on_worker_loss == "fail";
    if (retry < 0)
        e.error += fail_by_bucket ? "; bucket '" + snap.config->buckets.at(st.bucket_index).name +
                                        "' has on_worker_loss = \"fail\": retry the request"
                                  : "; no other pool with the same vocabulary is up to go on with it: retry the request";
    for (auto& r : st.trace["runs"])
        if (r["run"] == role_name(role) && !r.contains("finish") && !r.contains("lost")) r["lost"] = e.error;
    spdlog::warn("request {}: {}{}", st.ctx->id, e.error, retry >= 0 ? "; going on with it on pool '" + snap.pools[retry]->cfg.name + "'" : "");
    execute(self, st.core->on_run_lost(role, e, retry, e.t_s));
}

void on_admission(self_ptr self, RunRole role, const AdmitAnswer& a) {
    RunAdmission& ad = self->state.admission[(int)role];
    if (!ad.waiting) return;  // cancelled meanwhile
    const int64_t n_blocks = Admission::blocks_for((int64_t)ad.pending.prompt.size(), ad.pending.max_tokens,
                                                   self->state.ctx->snap->pools.at(ad.pool)->cfg.block_size);
    if (a.verdict == (int32_t)AdmissionVerdict::REFUSE) {
        ad.waiting = false;
        trace_admission(self, role, ad.pool, n_blocks, "refused", a.message);
        return end_run(self, ad.pending.id, FinishReason::OVERLOADED, a.message);
    }
    if (a.verdict != (int32_t)AdmissionVerdict::ADMIT) {  // queued: the allocator answers again
        trace_admission(self, role, ad.pool, n_blocks, "queued", a.message);
        return;
    }
    trace_admission(self, role, ad.pool, n_blocks, "admitted", "");
    ad.waiting = false;
    self->send(self->state.ctx->snap->pools.at(ad.pool)->executor, submit_atom::value, std::move(ad.pending));
}

void submit(self_ptr self, SubmitRun&& s) {
    auto& st = self->state;
    const PoolHandle& ph = *st.ctx->snap->pools.at(s.pool);
    const RunRole role = s.role;
    RunAdmission& ad = st.admission[(int)role];
    count_inflight(self, role, false);  // a retried run leaves its lost pool's count
    ad = RunAdmission{};
    ad.pool = s.pool;
    count_inflight(self, role, true, (int64_t)s.run.prompt.size());
    if (ph.remote()) {
        // A lost worker: straight to the loss path (a message, so the core is never re-entered).
        if (ph.live->lost) return (void)self->send(self, lost_atom::value, ph.id, std::string("it was lost before this run"));
        if (st.watching.insert(ph.id).second) self->send(ph.monitor, watch_atom::value, caf::actor_cast<RequestActor>(self));
    }
    const int32_t pool_index = s.pool;
    EngineRequest m = std::move(s.run);
    // A worker's clock is not ours: its runs' token times would not compare with the front's.
    if (ph.remote()) m.batch_tokens = false;
    // The pool's own constraint: a rendering may bring one (a tool call in that pool's template's
    // format); check_request refused bad request fields, the prompts a grammar that does not compile.
    if (auto c = st.vocab->constraint(pool_index); c && c->active()) {
        m.grammar_kind = (int32_t)c->kind;
        m.grammar_text = c->text;
    }
    // Past the model's context it is invalid whatever the load: the engine's context error says so.
    if (!ph.kv_allocator || (int64_t)m.prompt.size() + m.max_tokens > ph.model->params().n_ctx_train)
        return (void)self->send(ph.executor, submit_atom::value, std::move(m));
    AdmitRequest ar{m.id, st.ctx->req.tenant, Admission::blocks_for((int64_t)m.prompt.size(), m.max_tokens, ph.cfg.block_size)};
    const uint64_t id = m.id;
    // The engine enforces the deadline once the run is there; while it waits for admission, a timer.
    if (m.deadline_s > 0)
        self->send(st.ctx->shared->timers, timer_add_atom::value, st.ctx->id, m.deadline_s, caf::actor_cast<RequestActor>(self),
                   (int32_t)TimerKind::admission, id);
    ad.waiting = true;
    ad.pending = std::move(m);
    // A run retried after a worker loss keeps its engine id on another pool: answers about the
    // lost pool's admission must not admit (or fail) the retry.
    const int32_t pool = ad.pool;
    self->request(ph.kv_allocator, caf::infinite, admit_atom::value, std::move(ar))
        .then([=](const AdmitAnswer& a) {
                  if (self->state.admission[(int)role].pool == pool) on_admission(self, role, a);
              },
              [=](caf::error& err) {
                  RunAdmission& a = self->state.admission[(int)role];
                  if (!a.waiting || a.pending.id != id || a.pool != pool) return;  // lost meanwhile, and moved on
                  const PoolHandle& p = *self->state.ctx->snap->pools.at(a.pool);
                  if (p.remote()) return run_lost(self, role, "its KV admission failed: " + self->system().render(err));
                  a.waiting = false;
                  end_run(self, id, FinishReason::ERROR, "KV admission failed: " + self->system().render(err));
              });
}

// The request leaves the in-flight table (drain() waits for that) once the core is done AND every
// allocator confirmed its release: after drain(), every reservation is released and in the figures.
void maybe_quit(self_ptr self) {
    auto& st = self->state;
    if (!st.core_done || st.n_releases_pending > 0) return;
    st.ctx->shared->finished(st.ctx->id);
    self->send(st.ctx->shared->timers, timer_cancel_atom::value, st.ctx->id);  // its handle goes with them
    for (const auto& ph : st.ctx->snap->pools)
        if (st.watching.count(ph->id)) self->send(ph->monitor, unwatch_atom::value, caf::actor_cast<RequestActor>(self));
    self->quit();
}

// Executes the core's actions in order.
void execute(self_ptr self, RequestActions&& actions) {
    auto& st = self->state;
    RequestContext& ctx = *st.ctx;
    SharedState& sh = *ctx.shared;
    for (RequestAction& a : actions) {
        if (auto* s = std::get_if<SubmitRun>(&a)) {
            const PoolHandle& ph = *ctx.snap->pools.at(s->pool);
            nlohmann::ordered_json run = {{"run", role_name(s->role)}, {"pool", ph.cfg.name}, {"prompt_tokens", s->run.prompt.size()}};
            if (st.vocab->per_pool()) run["template"] = st.vocab->template_used(s->pool);
            if (ph.remote()) run["worker"] = ph.worker;
            st.trace["runs"].push_back(std::move(run));
            submit(self, std::move(*s));
        } else if (auto* c = std::get_if<CancelRun>(&a)) {
            RunAdmission& ad = st.admission[(int)c->role];
            if (ad.waiting) {  // still in the allocator's queue: its end (below) frees the place
                ad.waiting = false;
                end_run(self, c->engine_id, FinishReason::CANCELLED, "cancelled by the caller");
            } else {
                self->send(ctx.snap->pools.at(c->pool)->executor, cancel_atom::value, c->engine_id);
            }
        } else if (auto* t = std::get_if<StreamText>(&a)) {
            if (t->pool >= 0 && t->pool != st.answer_pool) {
                st.answer_pool = t->pool;
                if (ctx.cb.on_pool) ctx.cb.on_pool(ctx.snap->pools.at(t->pool)->cfg.name);
            }
            if (ctx.cb.on_logprobs && !t->ids.empty()) ctx.cb.on_logprobs(t->ids, t->logprobs, t->top);
            if (ctx.cb.on_token) ctx.cb.on_token(t->piece, t->ids);
        } else if (auto* p = std::get_if<PoolSample>(&a)) {
            PoolLive& live = *ctx.snap->pools.at(p->pool)->live;
            std::lock_guard<std::mutex> lk(live.mu);
            PoolLiveStats& ls = live.stats;
            ls.error_rate = ewma(ls.error_rate < 0 ? 0 : ls.error_rate, p->failed ? 1.0 : 0.0);
            if (p->prefill_ms_per_token >= 0) ls.prefill_ms_per_token = ewma(ls.prefill_ms_per_token, p->prefill_ms_per_token);
            if (p->tpot_ms >= 0) ls.tpot_ms = ewma(ls.tpot_ms, p->tpot_ms);
        } else if (auto* f = std::get_if<FinishRequest>(&a)) {
            {
                std::lock_guard<std::mutex> lk(sh.metrics_mu);
                sh.metrics->record(f->record);
            }
            // The session's KV stays on the pool that served this turn (the engine keeps it on success).
            if (!ctx.req.session.empty() && !f->record.pool.empty() && finish_reason_ok(f->record.finish))
                sh.session_pools.record(SharedState::session_key(sh.tenant_id(ctx.req.tenant), ctx.req.session),
                                        f->record.pool, f->result.metrics.prompt_tokens + f->result.metrics.completion_tokens);
            st.routing->report_outcome(f->record, f->result);
            {
                const GenerationResult& g = f->result;
                nlohmann::ordered_json fin = {{"reason", finish_reason_name(g.finish)}, {"pool", g.pool},
                                              {"upgraded", g.upgraded},                {"fallback", g.fallback},
                                              {"prompt_tokens", g.metrics.prompt_tokens},
                                              {"cached_tokens", g.metrics.cached_tokens},
                                              {"completion_tokens", g.metrics.completion_tokens},
                                              {"recomputed_tokens", g.metrics.recomputed_tokens},
                                              {"ttft_ms", g.metrics.ttft_ms}, {"e2e_ms", g.metrics.e2e_ms},
                                              {"cost", g.metrics.cost}};
                if (!g.error.empty()) fin["error"] = g.error;
                st.trace["state"] = "finished";
                st.trace["finish"] = std::move(fin);
                publish_trace(self);
                if (sh.otlp) {  // one line per request, appended under the file's own lock
                    const double unix_minus_clock =
                        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                        now_s();
                    sh.otlp->write(otlp_resource_spans(st.trace, f->record, unix_minus_clock, sh.otlp->trace_id_hi()));
                }
            }
            if (ctx.cb.on_finish) ctx.cb.on_finish(f->result);
        } else if (auto* q = std::get_if<RecordQuality>(&a)) {
            std::lock_guard<std::mutex> lk(sh.metrics_mu);
            sh.metrics->record_quality(q->bucket, q->pool, q->agreement, q->exact);
        } else if (std::holds_alternative<RequestDone>(a)) {
            st.core_done = true;
            maybe_quit(self);
        }
    }
}

// A run's end (its last event): its place in the pool's count and its KV reservation go, the trace
// notes it, and the core hears of it.
void run_end(self_ptr self, RunRole role, const EngineEvent& f) {
    count_inflight(self, role, false);
    // The run's KV reservation (or queue place) ends with it; the allocator ignores an
    // unknown id (a refused run, or one that never asked).
    if (const int32_t pool = self->state.admission[(int)role].pool; pool >= 0)
        if (const auto& alloc = self->state.ctx->snap->pools.at(pool)->kv_allocator) {
            self->state.n_releases_pending++;
            auto confirmed = [=] {
                self->state.n_releases_pending--;
                maybe_quit(self);
            };
            // A worker's allocator may be gone with its worker: wait a bounded time for it.
            const bool remote = self->state.ctx->snap->pools.at(pool)->remote();
            const caf::duration wait = remote ? caf::duration(std::chrono::seconds(2)) : caf::infinite;
            self->request(alloc, wait, release_atom::value, f.id)
                .then([=]() { confirmed(); }, [=](caf::error&) { confirmed(); });
        }
    {
        nlohmann::ordered_json& runs = self->state.trace["runs"];
        for (auto& r : runs)
            if (r["run"] == role_name(role) && !r.contains("finish")) {
                r["finish"] = finish_reason_name(f.finish);
                r["cached_prompt_tokens"] = f.n_cached_prompt_tokens;
                r["preemptions"] = f.n_preemptions;
                if (!f.error.empty()) r["error"] = f.error;
            }
    }
    execute(self, self->state.core->on_run_end(role, f, now_s()));
}

RequestActor::behavior_type request_actor(self_ptr self, std::shared_ptr<RequestContext> ctx) {
    auto& st = self->state;
    st.ctx = ctx;
    const GenerationRequest& req = ctx->req;
    const Snapshot& snap = *ctx->snap;
    // -1 (the rest of the context, the HTTP default): the run's limit is its pool's context less its
    // prompt; routing and classification estimate with the config's default.
    const int32_t max_tokens = req.max_tokens > 0 ? req.max_tokens : snap.config->limits.max_tokens_default;
    st.vocab = make_prompts(*ctx);
    st.routing = std::make_unique<BucketRouting>(*ctx, st.vocab->n_prompt_estimate(), max_tokens);
    st.core = std::make_unique<RequestFsm>(make_setup(*ctx, req.max_tokens < 0 ? -1 : max_tokens), *st.vocab, *st.routing);
    RouteQuery q;
    q.request_id = ctx->id;
    q.features.hint = req.bucket_hint;
    // Routing comes before the pool's rendering: a chat's length here is the first pool's
    // rendering's (an estimate when pools render differently); each run counts its own.
    q.features.prompt_tokens = st.vocab->n_prompt_estimate();
    q.features.max_tokens = max_tokens;
    q.features.temperature = req.temperature;
    q.features.tools = req.tools;
    q.features.response_format = req.response_format;
    // A JSON constraint without a response_format still classifies as JSON (the structured bucket).
    if (q.features.response_format.empty() && (!req.json_schema.empty() || req.json_object)) q.features.response_format = "json";
    q.features.tenant = req.tenant;
    q.session = req.session;
    q.arrival_s = ctx->arrival_s;
    q.cache = cache_query(*ctx, *st.vocab);
    st.trace = {{"id", ctx->id},
                {"tenant", req.tenant},
                {"state", "routing"},
                {"request", {{"prompt_tokens", q.features.prompt_tokens}, {"max_tokens", max_tokens}, {"temperature", req.temperature},
                             {"bucket_hint", req.bucket_hint}, {"session", req.session}, {"pool", req.pool},
                             {"stop", req.stop.size()}}}};
    // What the caller reused for it (documents, cached tool results; docs/reuse.md).
    if (!req.reuse_trace.empty())
        if (auto r = nlohmann::ordered_json::parse(req.reuse_trace, nullptr, false); r.is_object()) st.trace["reuse"] = std::move(r);
    if (st.vocab->per_pool()) {
        const int32_t from = st.vocab->estimate_pool();
        st.trace["request"]["prompt_tokens_from"] =
            from < 0 ? std::string("no pool's rendering (0)")
                     : "pool '" + snap.pools[(size_t)from]->cfg.name + "' rendering (an estimate for routing; each run counts its own)";
    }
    // Refused before routing: the request never reaches a pool.
    auto ok = check_request(req);
    if (ok && !req.pool.empty() && (q.pinned_pool = snap.pool_index(req.pool)) < 0) {
        std::string names;
        for (const auto& p : snap.pools) names += (names.empty() ? "" : ", ") + p->cfg.name;
        ok = make_error("no pool named '", req.pool, "' (pools: ", names, ")");
    }
    if (!ok) {
        st.trace["state"] = "refused";
        publish_trace(self);
        execute(self, st.core->on_refused(ok.error().message, now_s()));
        // Over already (the core finished it): every message is dropped until it stops.
        return {[](event_atom, const EngineEvent&) {}, [](admit_atom, const AdmitAnswer&) {}, [](deadline_atom, uint64_t) {},
                [](lost_atom, uint64_t, const std::string&) {}, [](cancel_atom) {}, [](req_deadline_atom) {}};
    }
    publish_trace(self);
    // The request's own deadline, a timer: it answers TIMEOUT even when the router, a plugin or an engine
    // is stuck. A short grace after the deadline lets the engine's and the admission queue's more specific
    // timeouts (same deadline) answer first when they can.
    if (const double timeout = snap.config->limits.request_timeout_ms; timeout > 0) {
        const double dl = ctx->arrival_s + timeout / 1e3;
        constexpr double k_grace_s = 0.025;
        self->send(ctx->shared->timers, timer_add_atom::value, ctx->id, dl + k_grace_s, caf::actor_cast<RequestActor>(self),
                   (int32_t)TimerKind::request, uint64_t{0});
    }
    self->request(snap.router, caf::infinite, route_atom::value, q)
        .then(
            [=](const RouteDecision& d) {
                trace_route(self, d);
                self->state.routing->set_route(d);
                self->state.bucket_index = d.bucket_index;
                execute(self, self->state.core->on_route(d, now_s()));
            },
            [=](caf::error& err) { execute(self, self->state.core->on_route_failed(self->system().render(err), now_s())); });
    return {
        [=](event_atom, const EngineEvent& ev) {
            const RunRole role = run_role_of(ev.id);
            if (!from_current_run(self, role)) return;
            if (!ev.tokens.empty()) execute(self, self->state.core->on_tokens(role, ev.tokens, ev.logprobs, now_s(), ev.top_logprobs, ev.token_t_s));
            if (ev.finished) run_end(self, role, ev);
        },
        [=](admit_atom, const AdmitAnswer& a) {
            // From the allocator of the run's pool now (a lost worker's may still answer).
            const int32_t pool = self->state.admission[(int)run_role_of(a.id)].pool;
            const caf::strong_actor_ptr& from = self->current_sender();
            if (pool >= 0 && from &&
                caf::actor_cast<caf::actor_addr>(from) != self->state.ctx->snap->pools.at(pool)->kv_allocator.address())
                return;
            on_admission(self, run_role_of(a.id), a);
        },
        [=](deadline_atom, uint64_t id) {
            RunAdmission& ad = self->state.admission[(int)run_role_of(id)];
            if (!ad.waiting || ad.pending.id != id) return;  // admitted (the engine times it) or over
            ad.waiting = false;
            end_run(self, id, FinishReason::TIMEOUT,
                    "timed out waiting for KV admission on pool '" + self->state.ctx->snap->pools.at(ad.pool)->cfg.name +
                        "' (its reservations were full); raise request_timeout_ms, kv_blocks or kv_overcommit");
        },
        [=](lost_atom, uint64_t pool_id, const std::string& why) {
            for (int r = 0; r < n_run_roles; r++) {
                const int32_t pool = self->state.admission[r].pool;
                if (pool >= 0 && self->state.admission[r].inflight && self->state.ctx->snap->pools.at(pool)->id == pool_id)
                    run_lost(self, (RunRole)r, why);
            }
        },
        [=](cancel_atom) { execute(self, self->state.core->on_cancel()); },
        [=](req_deadline_atom) { execute(self, self->state.core->on_deadline(now_s())); },
    };
}

}  // namespace

RequestActor spawn_request(caf::actor_system& sys, std::shared_ptr<RequestContext> ctx) {
    return sys.spawn(request_actor, std::move(ctx));
}

}  // namespace steward
