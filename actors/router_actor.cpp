// router_actor: one per config generation. Classifies a request into a bucket by the config's rules,
// then asks the bucket's routing policy (plugin) for the pool, an upgrade check and a shadow run,
// with pool estimates from live figures, the session's pool and cached tokens per pool (RouteInput,
// kept in the decision for the request's later plugin calls); the speculation policy gives the
// draft budget. The decision carries the generation. Every bucket's requests pass through this one
// actor, so it never calls a plugin itself: a bucket whose decision calls one (routing or
// speculation) is decided by that bucket's decider, a detached actor with a thread of its own, so a
// slow plugin delays only its own bucket. There each plugin call waits at most its [plugins] budget
// (then the safe default), and while that call is still running the plugin's later calls answer at
// once.
#include <spdlog/spdlog.h>

#include <cmath>

#include "actors/actors.hpp"
#include "actors/shared_state.hpp"

namespace steward {

namespace {

struct router_state {
    std::weak_ptr<Snapshot> snap;
    std::weak_ptr<SharedState> shared;
    // Per bucket: its decider where the bucket's decision calls a plugin, else null (decided here).
    std::vector<DeciderActor> deciders;
    static inline const char* name = "router";
};

// cached: prompt tokens each pool of the snapshot holds (the cache actor's answer); empty: unknown.
RouteDecision decide(const Snapshot& snap, SharedState* shared, const RouteQuery& q, std::vector<int32_t> cached) {
    const Config& c = *snap.config;
    const RequestFeatures& f = q.features;
    const size_t bi = classify(c, f);
    const BucketConfig& b = c.buckets[bi];
    RouteDecision d;
    d.bucket = b.name;
    d.bucket_index = (int32_t)bi;
    d.priority = b.priority;
    d.generation = snap.generation;
    d.pool = std::max(0, snap.pool_index(b.pool));
    d.bucket_why = explain_classification(c, f);
    d.route_why = "the bucket's pool '" + b.pool + "' (rules)";
    const BucketPolicies& pol = snap.policies[bi];
    // What the plugin is told, kept in the decision for check_upgrade and on_outcome.
    RouteInput& in = d.input;
    in.request_id = q.request_id;
    in.bucket = b.name;
    in.tenant = q.features.tenant;
    in.response_format = q.features.response_format;
    in.n_prompt_tokens = q.features.prompt_tokens;
    in.max_tokens = q.features.max_tokens;
    in.temperature = q.features.temperature;
    in.tools = q.features.tools;
    in.session = q.session;
    in.priority = b.priority;
    in.slo_ttft_ms = b.slo_ttft_ms;
    in.slo_tpot_ms = b.slo_tpot_ms;
    if (const double timeout = c.limits.request_timeout_ms; timeout > 0)
        in.deadline_ms = std::max(1e-3, timeout - (now_s() - q.arrival_s) * 1e3);
    // Per pool: the cache actor's count of this tenant's prompt blocks it holds (-1: unknown); the
    // session's pool may hold more (its last, partly filled block), which apply_session_place adds.
    in.n_cached_prompt_tokens = std::move(cached);
    in.n_cached_prompt_tokens.resize(snap.pools.size(), -1);
    if (shared && !q.session.empty()) {
        std::vector<std::string> names;
        for (const auto& p : snap.pools) names.push_back(p->cfg.name);
        apply_session_place(in, shared->session_pools.find(SharedState::session_key(shared->tenant_id(q.features.tenant), q.session)), names);
    }
    {
        // Live estimates per pool; measured quality of this bucket's routes, else the prior.
        std::vector<PoolLiveStats> live(snap.pools.size());
        for (size_t i = 0; i < snap.pools.size(); i++) {
            std::lock_guard<std::mutex> lk(snap.pools[i]->live->mu);
            live[i] = snap.pools[i]->live->stats;
        }
        std::vector<double> quality(snap.pools.size(), std::nan(""));
        if (shared) {
            std::lock_guard<std::mutex> lk(shared->metrics_mu);
            if (const BucketMetrics* m = shared->metrics->bucket(b.name))
                for (size_t i = 0; i < snap.pools.size(); i++)
                    if (auto it = m->route_quality.find(snap.pools[i]->cfg.name); it != m->route_quality.end())
                        quality[i] = it->second.agreement();
        }
        // What kv_aware-style policies balance on: each pool's KV in use, runs in flight, worker.
        in.pool_loads.resize(snap.pools.size());
        for (size_t i = 0; i < snap.pools.size(); i++) {
            RouteInput::PoolLoad& pl = in.pool_loads[i];
            // Busy blocks as this front counts them (its runs in flight, their prompts), not the last
            // heartbeat's, which lags by up to heartbeat_ms: routing in a burst sees every earlier
            // decision (Dynamo's router counts its active blocks the same way).
            pl.n_kv_blocks_used = live[i].n_blocks_inflight;
            pl.n_kv_blocks_total = live[i].n_kv_blocks_total >= 0 ? live[i].n_kv_blocks_total : snap.pools[i]->n_blocks;
            pl.block_size = snap.pools[i]->cfg.block_size;
            pl.n_inflight = live[i].n_inflight;
            pl.worker = snap.pools[i]->worker;
        }
        std::vector<steward_pool_view> views(snap.pools.size());
        for (size_t i = 0; i < snap.pools.size(); i++)
            views[i] = make_pool_view(snap.profiles[i], live[i], quality[i], q.features.prompt_tokens, q.features.max_tokens,
                                      in.n_cached_prompt_tokens[i]);
        for (const steward_pool_view& v : views) {
            d.est_cost.push_back(v.est_cost);
            d.est_ttft_ms.push_back(v.est_ttft_ms);
            d.est_latency_ms.push_back(v.est_latency_ms);
            d.quality.push_back(v.quality);
            d.risk.push_back(v.risk);
        }
        if (q.pinned_pool >= 0 && q.pinned_pool < (int32_t)snap.pools.size()) {
            d.pool = q.pinned_pool;
            d.route_why = "pool '" + snap.pools[(size_t)q.pinned_pool]->cfg.name + "' named by the request (no routing policy)";
        } else if (pol.routing) {
            bool fallback = false;
            const steward_route_decision r = pol.routing->route(in, views, d.pool, &fallback);
            d.pool = r.pool;
            d.upgrade_pool = r.upgrade_pool;
            d.check_after_tokens = r.upgrade_pool >= 0 ? r.check_after_tokens : 0;
            d.shadow_pool = r.shadow_pool;
            d.fallback = fallback;
            d.route_why = "routing plugin '" + pol.routing->plugin() + "'" +
                          (fallback ? ": its decision was rejected, the bucket's pool (safe default)" : "");
        }
    }
    // A remote pool whose worker is lost takes nothing new: the up pool of the same vocabulary with the
    // fewest runs in flight does (none: the request fails at submission, naming the worker).
    auto up = [&](int32_t i) { return i >= 0 && i < (int32_t)snap.pools.size() && !snap.pools[(size_t)i]->live->lost; };
    if (!up(d.pool) && d.pool >= 0 && d.pool < (int32_t)snap.pools.size()) {
        int32_t alt = -1, alt_load = 0;
        for (int32_t i = 0; i < (int32_t)snap.pools.size(); i++) {
            if (!up(i) || snap.pools[(size_t)i]->vocab_id != snap.pools[(size_t)d.pool]->vocab_id) continue;
            std::lock_guard<std::mutex> lk(snap.pools[(size_t)i]->live->mu);
            if (alt < 0 || snap.pools[(size_t)i]->live->stats.n_inflight < alt_load)
                alt = i, alt_load = snap.pools[(size_t)i]->live->stats.n_inflight;
        }
        if (alt >= 0) {
            d.route_why += "; its pool '" + snap.pools[(size_t)d.pool]->cfg.name + "' is lost with worker " +
                           snap.pools[(size_t)d.pool]->worker + ", so '" + snap.pools[(size_t)alt]->cfg.name +
                           "' (same vocabulary, fewest runs in flight)";
            d.pool = alt;
        }
    }
    if (d.upgrade_pool >= 0 && !up(d.upgrade_pool)) d.upgrade_pool = -1, d.check_after_tokens = 0;
    if (d.shadow_pool >= 0 && !up(d.shadow_pool)) d.shadow_pool = -1;
    if (pol.speculation) {
        steward_spec_stats st{};
        st.max_budget = c.limits.max_draft_tokens;
        bool fallback = false;
        d.draft_budget = pol.speculation->draft_budget(st, &fallback);
    }
    return d;
}

// One bucket's decisions when they call a plugin: on a thread of its own (detached), where waiting
// out a plugin's budget holds up this bucket's requests only. Linked to the router: it exits with it.
DeciderActor::behavior_type bucket_decider(DeciderActor::pointer, std::weak_ptr<Snapshot> snap,
                                           std::weak_ptr<SharedState> shared) {
    return {
        [=](route_atom, const RouteQuery& q, const CachedTokens& cached) -> caf::result<RouteDecision> {
            auto s = snap.lock();
            if (!s) return caf::make_error(caf::sec::invalid_argument, "the config generation was released");
            auto sh = shared.lock();
            return decide(*s, sh.get(), q, cached.n_tokens);
        },
    };
}

// Decides q on the router when its bucket calls no plugin, else on the bucket's decider.
void decide_for(RouterActor::stateful_pointer<router_state> self, const std::shared_ptr<Snapshot>& s,
                const std::shared_ptr<SharedState>& sh, const RouteQuery& q, std::vector<int32_t> cached,
                caf::typed_response_promise<RouteDecision> rp) {
    const size_t bi = classify(*s->config, q.features);
    if (bi >= self->state.deciders.size() || !self->state.deciders[bi]) {
        rp.deliver(decide(*s, sh.get(), q, std::move(cached)));
        return;
    }
    self->request(self->state.deciders[bi], caf::infinite, route_atom::value, q, CachedTokens{std::move(cached)})
        .then([=](const RouteDecision& d) mutable { rp.deliver(d); },
              [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
}

RouterActor::behavior_type router_actor(RouterActor::stateful_pointer<router_state> self, std::weak_ptr<Snapshot> snap,
                                        std::weak_ptr<SharedState> shared) {
    self->state.snap = std::move(snap);
    self->state.shared = std::move(shared);
    if (auto s = self->state.snap.lock()) {
        self->state.deciders.resize(s->policies.size());
        for (size_t i = 0; i < s->policies.size(); i++)
            if (s->policies[i].routing || s->policies[i].speculation)
                self->state.deciders[i] =
                    self->spawn<caf::detached + caf::linked>(bucket_decider, self->state.snap, self->state.shared);
    }
    return {
        [=](route_atom, const RouteQuery& q) -> caf::result<RouteDecision> {
            // The asking request holds the snapshot, so it is alive while the question is.
            auto s = self->state.snap.lock();
            if (!s) return caf::make_error(caf::sec::invalid_argument, "the config generation was released");
            auto sh = self->state.shared.lock();
            auto rp = self->make_response_promise<RouteDecision>();
            if (!sh || !sh->cache || q.cache.pools.size() != s->pools.size()) {
                decide_for(self, s, sh, q, {}, rp);
                return rp;
            }
            // Ask the cache actor how much of the prompt each pool holds, then decide. The request holds
            // the snapshot and the shared state until it has its answer.
            self->request(sh->cache, caf::infinite, cache_atom::value, q.cache)
                .then([=](const CachedTokens& c) mutable { decide_for(self, s, sh, q, c.n_tokens, rp); },
                      [=](caf::error&) mutable { decide_for(self, s, sh, q, {}, rp); });  // route without it
            return rp;
        },
    };
}

}  // namespace

RouterActor spawn_router(caf::actor_system& sys, std::weak_ptr<Snapshot> snap, std::weak_ptr<SharedState> shared) {
    return sys.spawn(router_actor, std::move(snap), std::move(shared));
}

}  // namespace steward
