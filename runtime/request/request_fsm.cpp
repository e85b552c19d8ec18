// The request state machine: runs, cascade hold-back, shadow agreement, the record and its cost.
#include "request/request_fsm.h"

#include <algorithm>
#include <cmath>

#include "plugin/pool_estimates.h"

namespace steward {

uint64_t run_engine_id(uint64_t request, RunRole role) { return request * 4 + (uint64_t)role; }
RunRole run_role_of(uint64_t engine_id) { return (RunRole)(engine_id & 3); }

RequestFsm::RequestFsm(RequestSetup setup, RequestVocab& vocab, RequestRouting& routing)
    : setup_(std::move(setup)), vocab_(vocab), routing_(routing), stop_(setup_.stop) {
    for (const RequestPool& p : setup_.pools) prices_.prices[p.name] = p.price;
}

RequestActions RequestFsm::on_route(const RouteDecision& route, double now) {
    RequestActions out;
    if (done_ || routed_ || answered_) return out;
    routed_ = true;
    route_ = route;
    if (cancel_requested_) {
        EngineEvent e;
        e.finish = FinishReason::CANCELLED;
        e.error = "cancelled by the caller";
        e.t_s = now;
        finish(e, now, out);
        maybe_done(out);
        return out;
    }
    decoder_ = vocab_.text_decoder(route.pool);
    holding_ = checks_cascade();
    submit(RunRole::PRIMARY, route.pool, now, out);
    if (route.shadow_pool >= 0) submit(RunRole::SHADOW, route.shadow_pool, now, out);
    drain_deferred(now, out);
    return out;
}

RequestActions RequestFsm::on_route_failed(const std::string& why, double now) {
    return on_refused("routing failed: " + why, now);
}

RequestActions RequestFsm::on_refused(const std::string& error, double now) {
    RequestActions out;
    if (done_ || routed_ || answered_) return out;
    routed_ = true;
    EngineEvent e;
    e.finish = FinishReason::ERROR;
    e.error = error;
    e.t_s = now;
    finish(e, now, out);
    maybe_done(out);
    return out;
}

RequestActions RequestFsm::on_tokens(RunRole role, const std::vector<int32_t>& tokens, const std::vector<float>& logprobs,
                                     double now, const std::vector<std::vector<TokenLogprob>>& top_logprobs,
                                     const std::vector<double>& token_t_s) {
    RequestActions out;
    Run& r = run(role);
    if (done_ || !r.active) return out;
    const bool timed = token_t_s.size() == tokens.size();
    for (size_t i = 0; i < tokens.size(); i++) {
        r.tokens.push_back(tokens[i]);
        r.times.push_back(timed ? token_t_s[i] : now);
        r.logprobs.push_back(i < logprobs.size() ? logprobs[i] : 0.0f);
        if (i < top_logprobs.size()) r.top_logprobs.push_back(top_logprobs[i]);
    }
    if (role == RunRole::SHADOW || role != answer_ || answered_) return out;
    if (holding_ && r.tokens.size() >= (size_t)route_.check_after_tokens && check_cascade(false, now, out)) {
        drain_deferred(now, out);
        return out;
    }
    stream(now, out);
    return out;
}

RequestActions RequestFsm::on_run_end(RunRole role, const EngineEvent& end, double now) {
    RequestActions out;
    if (done_ || !run(role).active) return out;
    end_run(role, end, now, out);
    drain_deferred(now, out);
    return out;
}

RequestActions RequestFsm::on_run_lost(RunRole role, const EngineEvent& end, int32_t retry_pool, double now) {
    RequestActions out;
    Run& r = run(role);
    if (done_ || !r.active) return out;
    const int32_t left = setup_.max_tokens < 0 ? 1 : setup_.max_tokens - (int32_t)r.tokens.size();
    if (retry_pool < 0 || retry_pool >= (int32_t)setup_.pools.size() || role == RunRole::SHADOW || role != answer_ ||
        answered_ || cancel_requested_ || left <= 0) {
        end_run(role, end, now, out);
    } else {
        const Run lost = r;
        submit(role, retry_pool, now, out, &lost);
    }
    drain_deferred(now, out);
    return out;
}

RequestActions RequestFsm::on_cancel() {
    RequestActions out;
    if (done_) return out;
    cancel_requested_ = true;
    for (int i = 0; i < n_run_roles; i++)
        if (runs_[i].active) out.push_back(CancelRun{(RunRole)i, runs_[i].pool, run_engine_id(setup_.id, (RunRole)i)});
    return out;
}

RequestActions RequestFsm::on_deadline(double now) {
    RequestActions out;
    if (done_ || answered_) return out;
    const bool was_routed = routed_;
    routed_ = true;  // a route answer arriving later starts nothing
    for (int i = 0; i < n_run_roles; i++)
        if (runs_[i].active) out.push_back(CancelRun{(RunRole)i, runs_[i].pool, run_engine_id(setup_.id, (RunRole)i)});
    EngineEvent e;
    e.finish = FinishReason::TIMEOUT;
    e.t_s = now;
    const double limit_ms = (setup_.deadline_s - setup_.arrival_s) * 1e3;
    e.error = std::string("timed out after ") + std::to_string((long long)std::llround(limit_ms)) + " ms (limits.request_timeout_ms) " +
              (was_routed ? "before its run finished" : "while it was being routed") +
              "; raise request_timeout_ms, or look at the pool's queue and steward_plugin_timed_out_decisions_total";
    if (was_routed) {
        const Run& a = run(answer_);
        e.n_prompt_tokens = a.end.n_prompt_tokens;
        e.n_cached_prompt_tokens = a.end.n_cached_prompt_tokens;
    }
    finish(e, now, out);
    maybe_done(out);
    return out;
}

void RequestFsm::end_run(RunRole role, const EngineEvent& run_end, double now, RequestActions& out) {
    Run& r = run(role);
    r.active = false;
    r.ended = true;
    EngineEvent end = run_end;
    if (r.n_carried > 0 && end.n_prompt_tokens > 0) {  // a retry's prompt held the tokens carried over: not prompt
        end.n_prompt_tokens = std::max<int64_t>(0, end.n_prompt_tokens - r.n_carried);
        end.n_cached_prompt_tokens = std::min(end.n_cached_prompt_tokens, end.n_prompt_tokens);
    }
    r.end = end;
    if (role == RunRole::SHADOW) {
        out.push_back(pool_sample(r, false));
        return maybe_done(out);
    }
    if (role != answer_) {
        // The cancelled cheap run of an upgrade: its prompt work is charged to the request.
        if (!prior_pools_.empty()) {
            prior_pools_.back().n_prompt_tokens = end.n_prompt_tokens;
            prior_pools_.back().n_cached_prompt_tokens = end.n_cached_prompt_tokens;
        }
        return maybe_done(out);
    }
    if (holding_ && check_cascade(true, now, out)) return;
    finish(end, now, out);
    maybe_done(out);
}

void RequestFsm::submit(RunRole role, int32_t pool, double now, RequestActions& out, const Run* continue_from) {
    Run& r = run(role);
    r = Run{};
    r.pool = pool;
    r.active = true;
    r.t_submit = now;
    if (continue_from) {  // what the caller has (or is held back) stays; the new run goes on from it
        r.tokens = continue_from->tokens;
        r.times = continue_from->times;
        r.logprobs = continue_from->logprobs;
        r.top_logprobs = continue_from->top_logprobs;
        r.t_submit = continue_from->t_submit;
        r.n_carried = (int32_t)r.tokens.size();
    }
    SubmitRun s;
    s.role = role;
    s.pool = pool;
    EngineRequest& e = s.run;
    e.generation = route_.generation;
    e.bucket_index = route_.bucket_index;
    e.bucket = route_.bucket;
    e.id = run_engine_id(setup_.id, role);
    e.tenant = setup_.tenant_id;
    e.salt = setup_.salt;
    e.prompt = vocab_.prompt_ids(pool);
    // The prompt alone fills the pool's context (nothing could be generated), or the prompt and
    // max_tokens together exceed it. Refused here, where the pool's own prompt is first known (a
    // chat is rendered and counted for the pool it runs on), with its length in the record
    // (n_prompt_tokens) so that a caller can tell this refusal apart. max_tokens -1: the rest.
    const int32_t n_ctx = pool >= 0 && pool < (int32_t)setup_.pools.size() ? setup_.pools[pool].n_ctx : 0;
    const int32_t n_prompt = (int32_t)e.prompt.size();
    e.max_tokens = setup_.max_tokens >= 0 ? setup_.max_tokens : std::max<int32_t>(n_ctx - n_prompt, 0);
    if (n_ctx > 0 && (n_prompt >= n_ctx || (int64_t)n_prompt + e.max_tokens > n_ctx)) {
        EngineEvent f;
        f.finish = FinishReason::ERROR;
        const std::string pool_s = " tokens of pool '" + setup_.pools[pool].name + "'";
        f.error = n_prompt >= n_ctx
                      ? "the prompt is " + std::to_string(n_prompt) + " tokens, over the context of " + std::to_string(n_ctx) +
                            pool_s + ": shorten it"
                      : "the prompt (" + std::to_string(n_prompt) + " tokens) and max_tokens (" + std::to_string(e.max_tokens) +
                            ") together exceed the context of " + std::to_string(n_ctx) + pool_s +
                            ": lower max_tokens to at most " + std::to_string(n_ctx - n_prompt) + " or shorten the prompt";
        f.n_prompt_tokens = n_prompt + r.n_carried;  // end_run takes a retry's carried tokens off again
        f.t_s = now;
        deferred_.emplace_back(role, f);
        return;
    }
    if (r.n_carried > 0 && !e.prompt.empty()) {
        e.prompt.insert(e.prompt.end(), r.tokens.begin(), r.tokens.end());
        e.max_tokens -= r.n_carried;
    }
    e.sampling = setup_.sampling;
    // Nobody reads this run's tokens one by one: the executor may send them merged, with their times.
    e.batch_tokens = !setup_.watched && setup_.stop.empty() && !checks_cascade();
    r.batched = e.batch_tokens;
    e.stop_at_eos = !setup_.ignore_eos;
    e.priority = route_.priority;
    e.arrival_s = setup_.arrival_s;
    e.deadline_s = setup_.deadline_s;
    // A shadow only measures: it neither keeps nor reuses the conversation's pinned KV.
    if (role != RunRole::SHADOW) e.session = setup_.session_key;
    e.tenant_name = setup_.tenant;
    if (setup_.kv_quota >= 0 && pool >= 0 && pool < (int32_t)setup_.pools.size())
        e.kv_quota_blocks = (int32_t)(setup_.kv_quota * setup_.pools[pool].n_blocks);
    // Its documents: the prompt up to their end keeps reuse priority; blocks from their start on
    // carry their keys (a changed document drops them).
    if (!setup_.reuse_keys.empty()) {
        const auto [from, to] = vocab_.documents_span(pool);
        if (to > from) {
            e.reuse_keyed_from = from;
            e.reuse_priority_tokens = to;
            e.reuse_keys = setup_.reuse_keys;
        }
    }
    if (e.prompt.empty()) {
        // Ended once the event's other actions are out (a shadow is still submitted first).
        EngineEvent f;
        f.finish = FinishReason::ERROR;
        f.error = vocab_.prompt_error(pool);
        f.t_s = now;
        deferred_.emplace_back(role, f);
        return;
    }
    out.push_back(std::move(s));
}

void RequestFsm::drain_deferred(double now, RequestActions& out) {
    while (!deferred_.empty()) {
        auto [role, end] = deferred_.front();
        deferred_.erase(deferred_.begin());
        if (!done_ && run(role).active) end_run(role, end, now, out);
    }
}

void RequestFsm::stream(double now, RequestActions& out) {
    const Run& r = run(answer_);
    if (holding_ || stop_.stopped() || r.tokens.size() <= n_streamed_) return;
    StreamText st;
    st.pool = r.pool;
    st.ids.assign(r.tokens.begin() + (long)n_streamed_, r.tokens.end());
    std::string decoded;
    for (size_t i = n_streamed_; i < r.tokens.size(); i++) {
        result_.tokens.push_back(r.tokens[i]);
        result_.logprobs.push_back(r.logprobs[i]);
        st.logprobs.push_back(r.logprobs[i]);
        if (i < r.top_logprobs.size()) {
            result_.top_logprobs.push_back(r.top_logprobs[i]);
            st.top.push_back(r.top_logprobs[i]);
        }
        token_times_.push_back(r.batched && i < r.times.size() ? r.times[i] : now);
        decoded += decoder_->push(r.tokens[i]);
    }
    n_streamed_ = r.tokens.size();
    StopMatcher::Out o = stop_.push(decoded);
    st.piece = std::move(o.emit);
    result_.text += st.piece;
    out.push_back(std::move(st));
    // A stop string: the answer is complete; its run is cancelled and its end answers STOP.
    if (o.stopped && r.active) out.push_back(CancelRun{answer_, r.pool, run_engine_id(setup_.id, answer_)});
}

bool RequestFsm::check_cascade(bool primary_ended, double now, RequestActions& out) {
    holding_ = false;
    if (cancel_requested_) return false;
    Run& r = run(RunRole::PRIMARY);
    bool fallback = false;
    const bool up = routing_.check_upgrade(r.tokens, r.logprobs, primary_ended, &fallback);
    if (fallback) route_.fallback = true;
    if (!up) return false;
    // Upgrade: the cheap run's work is recorded (and charged); the answer comes from the strong pool.
    PoolUse use;
    use.pool = setup_.pools.at(r.pool).name;
    use.n_output_tokens = (int64_t)r.tokens.size();
    if (r.ended) {
        use.n_prompt_tokens = r.end.n_prompt_tokens;
        use.n_cached_prompt_tokens = r.end.n_cached_prompt_tokens;
    }
    prior_pools_.push_back(use);
    if (r.active) out.push_back(CancelRun{RunRole::PRIMARY, r.pool, run_engine_id(setup_.id, RunRole::PRIMARY)});
    answer_ = RunRole::UPGRADE;
    decoder_ = vocab_.text_decoder(route_.upgrade_pool);
    submit(RunRole::UPGRADE, route_.upgrade_pool, now, out);
    return true;
}

RequestRecord RequestFsm::make_record(const EngineEvent& end, double t_finish) const {
    const Run& r = runs_[(int)answer_];
    RequestRecord rec;
    // The answering run's figures (its prompt, cache, preemptions, speculation, masks), as they came.
    static_cast<RunFigures&>(rec) = end;
    rec.bucket = route_.bucket;
    rec.tenant = setup_.tenant;
    if (r.pool >= 0) rec.pool = setup_.pools.at(r.pool).name;
    rec.t_arrival_s = setup_.arrival_s;
    if (end.first_scheduled_s >= 0) rec.t_scheduled_s = end.first_scheduled_s;
    if (!token_times_.empty()) rec.t_first_token_s = token_times_.front();
    rec.t_finish_s = t_finish;
    for (size_t i = 1; i < token_times_.size(); i++) rec.itl_s.push_back(token_times_[i] - token_times_[i - 1]);
    rec.n_output_tokens = (int64_t)result_.tokens.size();
    rec.finish = end.finish;
    rec.config_generation = route_.generation;
    rec.prior_pools = prior_pools_;
    rec.fallback = route_.fallback;
    return rec;
}

void RequestFsm::finish(const EngineEvent& run_end, double now, RequestActions& out) {
    if (answered_) return;
    answered_ = true;
    holding_ = false;
    if (decoder_) stream(now, out);
    // The text reached a stop string: the answer is complete, whether its run then ended by itself,
    // was cancelled for it, or the caller cancelled meanwhile.
    EngineEvent end = run_end;
    if (stop_.stopped() && (finish_reason_ok(end.finish) || end.finish == FinishReason::CANCELLED)) {
        end.finish = FinishReason::STOP;
        end.error.clear();
    }
    answer_reason_ = end.finish;
    GenerationResult& g = result_;
    g.id = setup_.id;
    g.finish = end.finish;
    g.error = end.error;
    g.bucket = route_.bucket;
    if (decoder_) {
        std::string rest;
        if (!stop_.stopped()) {
            StopMatcher::Out o = stop_.push(decoder_->flush());
            rest = std::move(o.emit);
            if (!o.stopped) rest += stop_.flush();  // held back, and no stop string came
        }
        g.text += rest;
        if (!rest.empty()) {
            StreamText st;
            st.piece = std::move(rest);
            st.pool = run(answer_).pool;
            out.push_back(std::move(st));
        }
    }
    // Finished when the caller is told, on the clock its tokens were stamped with (the executor's
    // finish stamp is earlier than the actor's receipt of the last tokens, so e2e < TTFT could read).
    const double t_finish = std::max({now, end.t_s, token_times_.empty() ? now : token_times_.back()});
    RequestRecord rec = make_record(end, t_finish);
    RequestMetrics& m = g.metrics;
    m.prompt_tokens = (int)end.n_prompt_tokens;
    m.cached_tokens = (int)end.n_cached_prompt_tokens;
    m.completion_tokens = (int)g.tokens.size();
    m.recomputed_tokens = (int)end.n_recomputed_tokens;
    m.e2e_ms = (t_finish - setup_.arrival_s) * 1e3;
    m.config_generation = route_.generation;
    if (end.first_scheduled_s >= 0) m.queue_ms = (end.first_scheduled_s - setup_.arrival_s) * 1e3;
    if (!token_times_.empty()) m.ttft_ms = (token_times_.front() - setup_.arrival_s) * 1e3;
    if (token_times_.size() >= 2)
        m.tpot_ms = (token_times_.back() - token_times_.front()) * 1e3 / (double)(token_times_.size() - 1);
    m.cost = request_cost(rec, prices_);
    g.pool = rec.pool;
    g.upgraded = !prior_pools_.empty();
    g.fallback = route_.fallback;
    const Run& r = runs_[(int)answer_];
    if (r.pool >= 0) out.push_back(pool_sample(r, !finish_reason_ok(end.finish) && end.finish != FinishReason::CANCELLED));
    out.push_back(FinishRequest{g, std::move(rec)});
}

PoolSample RequestFsm::pool_sample(const Run& r, bool failed) const {
    PoolSample s;
    s.pool = r.pool;
    s.failed = failed;
    if (!r.times.empty() && r.ended)
        s.prefill_ms_per_token = (r.times.front() - r.t_submit) * 1e3 / (double)std::max<int64_t>(1, r.end.n_prompt_tokens - r.end.n_cached_prompt_tokens);
    if (r.tokens.size() >= 2 && r.times.back() > r.times.front())
        s.tpot_ms = (r.times.back() - r.times.front()) * 1e3 / (double)(r.tokens.size() - 1);
    return s;
}

// Token agreement of the answer with the shadow: common prefix / longer output (greedy outputs
// diverge for good at their first difference), and exact match.
void RequestFsm::record_quality(RequestActions& out) {
    const Run& a = runs_[(int)answer_];
    const Run& s = run(RunRole::SHADOW);
    if (quality_recorded_ || s.pool < 0 || !s.ended || !answered_) return;
    quality_recorded_ = true;
    if (a.pool == s.pool || a.pool < 0) return;  // upgraded to the shadow's pool: nothing to compare
    if (!finish_reason_ok(s.end.finish) || !finish_reason_ok(answer_reason_)) return;
    size_t common = 0;
    while (common < a.tokens.size() && common < s.tokens.size() && a.tokens[common] == s.tokens[common]) common++;
    const size_t longer = std::max(a.tokens.size(), s.tokens.size());
    RecordQuality q;
    q.bucket = route_.bucket;
    q.pool = setup_.pools.at(a.pool).name;
    q.agreement = longer ? (double)common / (double)longer : 1.0;
    q.exact = a.tokens == s.tokens;
    out.push_back(std::move(q));
}

void RequestFsm::maybe_done(RequestActions& out) {
    if (done_ || !answered_) return;
    for (const Run& r : runs_)
        if (r.active) return;
    record_quality(out);
    done_ = true;
    out.push_back(RequestDone{});
}

}  // namespace steward
