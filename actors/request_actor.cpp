// request_actor: one per request. route (router) -> tokenize for the pool -> submit (executor,
// which owns reuse, allocation, prefill and decode) -> stream tokens to the caller -> finish:
// record the request's figures and call on_finish exactly once.
#include "actors/actors.hpp"
#include "actors/shared_state.hpp"
#include "model/tokenizer.h"

namespace steward {

namespace {

struct request_state {
    std::shared_ptr<RequestContext> ctx;
    RouteDecision route;
    std::unique_ptr<StreamDecoder> decoder;
    GenerationResult result;
    std::vector<double> token_times;
    bool done = false;
    bool cancel_requested = false;
    bool submitted = false;
    static inline const char* name = "request";
};

void finish(caf::stateful_actor<request_state>* self, const FinishInfo& f) {
    auto& st = self->state;
    if (st.done) return;
    st.done = true;
    const auto& ctx = *st.ctx;
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
    const auto& pools = ctx.shared->pools;
    if (st.route.pool >= 0 && st.route.pool < (int)pools.size()) {
        const PoolConfig& pc = pools[st.route.pool].cfg;
        rec.pool = pc.name;
        r.pool = pc.name;
        m.cost = ((f.n_prompt - f.n_cached) * pc.price_prompt + f.n_cached * pc.price_cached +
                  (double)r.tokens.size() * pc.price_output) / 1e6;
    }
    rec.t_arrival_s = ctx.arrival_s;
    if (f.first_scheduled_s >= 0) rec.t_scheduled_s = f.first_scheduled_s;
    if (!st.token_times.empty()) rec.t_first_token_s = st.token_times.front();
    rec.t_finish_s = f.t_s;
    // Tokens of one step arrive together; a step's gap goes to its first token, 0 to the others.
    for (size_t i = 1; i < st.token_times.size(); i++) rec.itl_s.push_back(st.token_times[i] - st.token_times[i - 1]);
    rec.n_prompt_tokens = f.n_prompt;
    rec.n_cached_prompt_tokens = f.n_cached;
    rec.n_output_tokens = (int64_t)r.tokens.size();
    rec.n_recomputed_tokens = f.n_recomputed;
    rec.finish = parse_finish_reason(f.reason).value_or(FinishReason::ERROR);
    rec.config_generation = st.route.generation;
    {
        std::lock_guard<std::mutex> lk(ctx.shared->metrics_mu);
        ctx.shared->metrics->record(rec);
    }
    if (ctx.cb.on_finish) ctx.cb.on_finish(r);
    ctx.shared->finished(ctx.id);
    self->quit();
}

void fail(caf::stateful_actor<request_state>* self, const std::string& reason, const std::string& msg) {
    FinishInfo f;
    f.id = self->state.ctx->id;
    f.reason = reason;
    f.error = msg;
    f.t_s = now_s();
    finish(self, f);
}

caf::behavior request_actor(caf::stateful_actor<request_state>* self, std::shared_ptr<RequestContext> ctx) {
    self->state.ctx = ctx;
    const GenerationRequest& req = ctx->req;
    const Config& cfg = *ctx->shared->config;
    auto& pools = ctx->shared->pools;
    // Classify with the first pool's tokenizer; re-tokenize if the routed pool's differs.
    const Tokenizer* tok0 = &pools.front().model->tokenizer();
    const bool add_bos = req.add_bos && tok0->add_bos_default();
    std::vector<int32_t> ids0 = req.prompt_ids.empty() ? tok0->encode(req.prompt, add_bos) : req.prompt_ids;
    RouteQuery q;
    q.hint = req.bucket_hint;
    q.prompt_tokens = (int32_t)ids0.size();
    q.max_tokens = req.max_tokens > 0 ? req.max_tokens : cfg.limits.max_tokens_default;
    q.temperature = req.temperature;
    q.tools = req.tools;
    q.response_format = req.response_format;
    q.tenant = req.tenant;
    self->request(ctx->shared->router, caf::infinite, route_atom::value, q)
        .then(
            [=](const RouteDecision& d) mutable {
                auto& st = self->state;
                st.route = d;
                if (st.cancel_requested) return fail(self, "cancelled", "cancelled by the caller");
                const PoolRuntime& pool = ctx->shared->pools.at(d.pool);
                const Tokenizer& tok = pool.model->tokenizer();
                std::vector<int32_t> ids = &tok == tok0 || !req.prompt_ids.empty()
                                               ? std::move(ids0)
                                               : tok.encode(req.prompt, req.add_bos && tok.add_bos_default());
                if (ids.empty()) {
                    if (tok.bos() < 0) return fail(self, "error", "empty prompt and the vocabulary has no BOS token");
                    ids.push_back(tok.bos());
                }
                st.decoder = std::make_unique<StreamDecoder>(tok);
                EngineSubmit m;
                m.id = ctx->id;
                m.tenant = ctx->shared->tenant_id(req.tenant);
                m.salt = ctx->shared->config->tenant_salt(req.tenant);
                m.prompt = std::move(ids);
                m.max_tokens = q.max_tokens;
                m.temperature = req.temperature;
                m.top_p = req.top_p;
                m.top_k = req.top_k;
                m.seed = req.seed;
                m.priority = d.priority;
                m.arrival_s = ctx->arrival_s;
                const double timeout = ctx->shared->config->limits.request_timeout_ms;
                m.deadline_s = timeout > 0 ? ctx->arrival_s + timeout / 1e3 : 0;
                m.session = SharedState::session_key(m.tenant, req.session);
                self->send(pool.executor, submit_atom::value, std::move(m));
                st.submitted = true;
            },
            [=](caf::error& err) { fail(self, "error", "routing failed: " + self->system().render(err)); });
    return {
        [=](token_atom, const TokenBatch& b) {
            auto& st = self->state;
            const double t = now_s();
            std::string piece;
            for (size_t i = 0; i < b.tokens.size(); i++) {
                st.result.tokens.push_back(b.tokens[i]);
                st.result.logprobs.push_back(i < b.logprobs.size() ? b.logprobs[i] : 0.0f);
                st.token_times.push_back(t);
                piece += st.decoder->push(b.tokens[i]);
            }
            st.result.text += piece;
            if (st.ctx->cb.on_token) st.ctx->cb.on_token(piece, b.tokens);
        },
        [=](finish_atom, const FinishInfo& f) { finish(self, f); },
        [=](cancel_atom) {
            auto& st = self->state;
            st.cancel_requested = true;
            if (st.submitted) self->send(st.ctx->shared->pools.at(st.route.pool).executor, cancel_atom::value, st.ctx->id);
        },
    };
}

}  // namespace

caf::actor spawn_request(caf::actor_system& sys, std::shared_ptr<RequestContext> ctx) {
    return sys.spawn(request_actor, std::move(ctx));
}

}  // namespace steward
