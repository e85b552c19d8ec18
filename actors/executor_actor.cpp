// executor_actor: one per pool, detached. Owns the pool's Engine (scheduler + KV + forward); a
// step is one forward over the whole batch, then ONE message with every request's new tokens and
// ends to the executor's relay, which sends them on to the request actors from CAF's scheduler
// (a run nobody reads token by token gets its tokens merged: sched/token_batcher.h).
// Block allocation and the prefix match live inside the Engine's KvManager: they are on the step's
// critical path, so they are calls there, not messages (vLLM's scheduler does the same). Above the
// pool, each step's block stored / removed events go to the cache actor, and admission is the pool's
// kv_allocator actor's, before a request reaches this actor.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include <pthread.h>
#include <spdlog/spdlog.h>

#include "actors/actors.hpp"
#include "actors/shared_state.hpp"
#include "grammar/constraint.h"
#include "sched/token_batcher.h"
#include "sim/sim_clock.h"

namespace steward {

double now_s() { return sim_now_s(); }  // steady_clock, dilated by [sim] dilation (1 without)

namespace {

struct executor_state {
    std::shared_ptr<const Model> model;  // declared before the engine: destroyed after it
    std::unique_ptr<Engine> engine;
    std::shared_ptr<PoolLive> live;
    std::shared_ptr<SharedState> shared;
    std::string pool;
    std::unordered_map<uint64_t, RequestActor> reply_to;
    // Sends each step's tokens and ends on to the request actors (StepOutput): on CAF's scheduler,
    // so this thread enqueues one message per step.
    RelayActor relay;
    // Cache actors that get each step's KV events (kv_events_atom subscribes one), with this pool's
    // id in each one's index: the runtime's own, and the fronts of a worker's pool.
    std::vector<std::pair<CacheActor, uint64_t>> caches;
    bool step_pending = false;
    // Runs whose requester reads the tokens at the end: their events go merged (sched/token_batcher.h).
    TokenBatcher batcher;
    double last_kv_sample = 0;
    std::set<std::string> kv_buckets;  // buckets with a KV reading so far: an idle one reads 0, not its last
    static inline const char* name = "executor";
    ~executor_state() {
        // A simulated pool says how busy its device was and whether the host kept up with the
        // dilation (an overrun: a step whose host work outlasted its device time / dilation).
        if (!engine || !engine->options().sim) return;
        const EngineStats es = engine->stats();
        if (es.n_steps == 0) return;
        spdlog::info("pool '{}' (simulated {}): {} steps, device busy {:.1f} s (simulated: GEMMs {:.1f}, attention {:.1f}, "
                     "all-reduce {:.1f}, overheads {:.1f}, drafts {:.1f}), median step {:.2f} ms, a stream's mean step {:.2f} ms, "
                     "a stream's step p50 {:.2f} ms, "
                     "{} steps ({:.1f}%) overran their device time / dilation, by {:.1f} ms in all ({} of them with the "
                     "host thread's own CPU time inside it: it waited, on another thread or for a core){}",
                     pool, engine->options().sim->device.name, es.n_steps, es.sim_device_s, es.sim_gemm_s, es.sim_attn_s,
                     es.sim_comm_s, es.sim_overhead_s, es.sim_draft_s, engine->sim_median_step_s() * 1e3,
                     es.sim_stream_step_s * 1e3, engine->sim_stream_step_p50_s() * 1e3, es.sim_overruns,
                     100.0 * (double)es.sim_overruns / (double)es.n_steps, es.sim_overrun_s * 1e3, es.sim_overruns_waiting,
                     es.sim_overruns * 10 > es.n_steps ? ": lower [sim] dilation for faithful latencies" : "");
    }
};

void ensure_stepping(ExecutorActor::stateful_pointer<executor_state> self) {
    auto& st = self->state;
    if (!st.step_pending && st.engine->has_work()) {
        st.step_pending = true;
        self->send(self, step_atom::value);
    }
}

// The scheduler's load as the /metrics gauges read it (running, waiting, per bucket): after every
// submit, cancel and step, so that a scrape sees each change, the last one (idle) included.
void publish_load(executor_state& st) {
    std::vector<Engine::BucketLoad> by_bucket = st.engine->load_by_bucket();  // not stats(): no KV walk per step
    int n_running = 0, n_waiting = 0;
    for (const Engine::BucketLoad& b : by_bucket) n_running += b.n_running, n_waiting += b.n_waiting;
    std::lock_guard<std::mutex> lk(st.live->mu);
    st.live->stats.n_waiting = n_waiting;
    st.live->stats.n_running = n_running;
    st.live->load_by_bucket = std::move(by_bucket);
}

void push_kv_sample(executor_state& st, double t) {
    const EngineStats es = st.engine->stats();
    {
        std::lock_guard<std::mutex> lk(st.live->mu);
        st.live->stats.n_waiting = es.n_waiting;
        st.live->stats.n_running = es.n_running;
        st.live->stats.n_kv_blocks_used = es.kv.n_blocks_in_use;
        st.live->stats.n_kv_blocks_total = es.kv.n_blocks_total;
        st.live->stats.kv_fragmentation = es.kv.fragmentation;
        st.live->stats.n_kv_branches = (double)es.kv.n_branches;
        st.live->stats.tiers = es.tiers;
        st.live->stats.n_kv_priority_blocks = es.kv.n_blocks_priority;
        st.live->stats.n_kv_priority_evictions = es.kv.n_priority_evictions;
        st.live->stats.n_kv_reuse_invalidated = es.kv.n_reuse_invalidated + (es.tiers ? es.tiers->n_invalidated : 0);
    }
    KvSample s;
    s.t_s = t;
    s.n_blocks_used = es.kv.n_blocks_in_use;
    s.n_blocks_total = es.kv.n_blocks_total;
    s.fragmentation = es.kv.fragmentation;
    s.n_branches = es.kv.n_branches;
    s.pool = st.pool;
    s.block_bytes = st.engine->kv_block_bytes();
    // Each bucket's share of the pool: the blocks its sequences and pinned sessions hold (the
    // bucket rows' kv_peak_GiB and page_mean_%).
    const std::vector<Engine::BucketKv> by_bucket = st.engine->kv_by_bucket();
    std::lock_guard<std::mutex> lk(st.shared->metrics_mu);
    st.shared->metrics->record_kv(s);
    std::map<std::string, int64_t> held;
    for (const std::string& b : st.kv_buckets) held[b] = 0;
    for (const Engine::BucketKv& b : by_bucket) held[b.bucket] = b.n_blocks, st.kv_buckets.insert(b.bucket);
    for (const auto& [bucket, n] : held) {
        KvSample bs;
        bs.t_s = t;
        bs.bucket = bucket;
        bs.n_blocks_used = n;
        bs.n_blocks_total = es.kv.n_blocks_total;
        bs.pool = st.pool;
        bs.block_bytes = s.block_bytes;
        bs.fragmentation = std::numeric_limits<double>::quiet_NaN();  // the pool's figure, not a bucket's
        st.shared->metrics->record_kv(bs);
    }
}

// Last resort when something escaped Engine::step (which catches its own failures): every request
// of this pool in flight finishes with ERROR now, and is cancelled in the engine so that it frees
// its KV; the actor lives on and serves later requests.
void fail_all(ExecutorActor::stateful_pointer<executor_state> self, const std::string& what) {
    auto& st = self->state;
    const double t = now_s();
    std::vector<EngineEvent> ends;
    for (auto& [id, to] : st.reply_to) {
        EngineEvent e;
        e.id = id;
        e.finished = true;
        e.finish = FinishReason::ERROR;
        e.error = what + "; the request was abandoned, retry it";
        e.t_s = t;
        ends.push_back(std::move(e));
        st.engine->cancel(id);
    }
    st.batcher.apply(ends, t);  // a held run's tokens go with its end
    StepOutput out;
    for (EngineEvent& e : ends) {
        auto to = st.reply_to.find(e.id);
        if (to == st.reply_to.end()) continue;
        StepOutput::Item item;
        item.to = to->second;
        item.event = std::move(e);
        out.items.push_back(std::move(item));
    }
    if (!out.items.empty()) self->send(st.relay, relay_atom::value, std::move(out));
    st.reply_to.clear();
}

// The executor's relay: sends a step's tokens and ends on as the executor (a request actor takes a
// run's messages only from the executor the run is on). It holds the executor weakly: they are
// linked, and a strong handle both ways would keep both alive.
RelayActor::behavior_type relay_actor(RelayActor::pointer, caf::actor_addr executor) {
    return {
        [=](relay_atom, StepOutput& out) {
            auto from = caf::actor_cast<caf::actor>(executor);
            if (!from) return;
            for (StepOutput::Item& it : out.items) caf::send_as(from, it.to, event_atom::value, std::move(it.event));
        },
    };
}

ExecutorActor::behavior_type executor_actor(ExecutorActor::stateful_pointer<executor_state> self, std::unique_ptr<Engine>* engine,
                             std::shared_ptr<const Model> model, std::shared_ptr<PoolLive> live,
                             std::shared_ptr<SharedState> shared, std::string pool) {
    pthread_setname_np(pthread_self(), "steward-exec");  // its own thread (detached): named for ps and gdb
    self->state.model = std::move(model);
    self->state.engine = std::move(*engine);
    delete engine;
    self->state.live = std::move(live);
    self->state.shared = std::move(shared);
    self->state.pool = std::move(pool);
    self->state.relay = self->spawn<caf::linked>(relay_actor, self->address());
    return {
        [=](submit_atom, EngineRequest r) {
            auto& st = self->state;
            auto sender = caf::actor_cast<RequestActor>(self->current_sender());
            // The bucket's eviction policy of the generation the request started with (it holds
            // that snapshot until it finishes, so the lookup cannot miss while it runs). A front's
            // request on a worker's pool names a generation of the front: the worker takes the bucket
            // of that name in its own live config (none there: the default eviction, no speculation).
            auto snap = st.shared->find_generation(r.generation);
            auto is_bucket = [&](const Snapshot& sn, int32_t i) {
                return i >= 0 && i < (int32_t)sn.policies.size() && (r.bucket.empty() || sn.config->buckets[i].name == r.bucket);
            };
            if (!r.bucket.empty() && !(snap && is_bucket(*snap, r.bucket_index))) {
                snap = st.shared->snapshot();
                r.bucket_index = -1;
                for (size_t i = 0; snap && i < snap->config->buckets.size(); i++)
                    if (snap->config->buckets[i].name == r.bucket) r.bucket_index = (int32_t)i;
            }
            if (snap)
                if (r.bucket_index >= 0 && r.bucket_index < (int32_t)snap->policies.size()) {
                    r.bucket = snap->config->buckets[r.bucket_index].name;
                    r.sim_acceptance = snap->config->buckets[r.bucket_index].sim.acceptance;
                    r.sim_concentration = snap->config->buckets[r.bucket_index].sim.concentration;
                    r.eviction = snap->policies[r.bucket_index].eviction;
                    if (r.eviction) r.eviction_name = snap->policies[r.bucket_index].eviction->plugin();
                    // Its speculation policy: asked per step for k; the source and limit from the config.
                    // A control share of the bucket's runs decode plainly (their TPOT is the
                    // measured gain's baseline).
                    const BucketConfig& bc = snap->config->buckets[r.bucket_index];
                    if (auto& sp = snap->policies[r.bucket_index].speculation;
                        sp && !speculation_control(r.id, bc.speculation_control_share)) {
                        r.speculation = sp;
                        r.spec = spec_settings_for(bc, *snap->config, st.engine->has_draft_model(),
                                                   st.engine->model().params().n_layer);
                    }
                }
            const uint64_t id = r.id;
            const bool batch = r.batch_tokens;
            Expected<bool> ok = make_error("request ", std::to_string(id), ": not submitted");
            try {
                auto g = compile_constraint((ConstraintKind)r.grammar_kind, r.grammar_text);  // cached
                if (g) r.grammar = *g;
                ok = g ? st.engine->submit(std::move(r)) : Expected<bool>(g.error());
            } catch (const std::exception& e) {  // e.g. bad_alloc: refuse this one, keep serving
                ok = make_error("request ", std::to_string(id), ": the engine failed to queue it: ", e.what());
            }
            if (!ok) {
                EngineEvent f;
                f.id = id;
                f.finished = true;
                f.finish = ok.error().code == ErrorCode::OVERLOADED ? FinishReason::OVERLOADED : FinishReason::ERROR;
                f.error = ok.error().message;
                f.t_s = now_s();
                self->send(sender, event_atom::value, std::move(f));
                return;
            }
            st.reply_to[id] = sender;
            if (batch) st.batcher.add(id);
            publish_load(st);
            ensure_stepping(self);
        },
        [=](cancel_atom, uint64_t id) {
            self->state.engine->cancel(id);
            publish_load(self->state);
            ensure_stepping(self);
        },
        [=](session_atom, const std::string& session) { self->state.engine->end_session(session); },
        [=](invalidate_atom, const std::vector<uint64_t>& keys) {
            const int n = self->state.engine->invalidate_reuse(keys);
            if (n > 0) {
                spdlog::debug("pool '{}': {} KV blocks of changed documents dropped", self->state.pool, n);
                push_kv_sample(self->state, now_s());
            }
        },
        [=](kv_events_atom, CacheActor cache, uint64_t pool_id) {
            auto& st = self->state;
            // Events recorded since the last step go to the present subscribers first; the new one
            // starts from every hash cached now (a front that connects to a running worker).
            if (auto kv = st.engine->take_kv_events(); !kv.empty())
                for (auto& [c, id] : st.caches) self->send(c, kv_events_atom::value, KvEventBatch{id, kv});
            auto it = std::find_if(st.caches.begin(), st.caches.end(), [&](const auto& e) { return e.first == cache; });
            if (it != st.caches.end()) {
                it->second = pool_id;
            } else {
                st.caches.emplace_back(cache, pool_id);
                // Sent after this actor's last event batch, so the index forgets the pool for good.
                self->attach_functor([cache, pool_id](const caf::error&) { caf::anon_send(cache, kv_drop_atom::value, pool_id); });
            }
            KvEventBatch now{pool_id, st.engine->cached_block_events()};
            if (!now.events.empty()) self->send(cache, kv_events_atom::value, std::move(now));
        },
        [=](kv_unsub_atom, CacheActor cache) {
            auto& st = self->state;
            st.caches.erase(std::remove_if(st.caches.begin(), st.caches.end(), [&](const auto& e) { return e.first == cache; }),
                            st.caches.end());
        },
        [=](step_atom) {
            auto& st = self->state;
            st.step_pending = false;
            const double t = now_s();
            std::vector<EngineEvent> events;
            try {
                events = st.engine->step(t);  // step() turns its own failures into ERROR events
            } catch (const std::exception& e) {
                fail_all(self, std::string("the pool's executor caught an exception from the engine step: ") + e.what());
            } catch (...) {
                fail_all(self, "the pool's executor caught an unknown exception from the engine step");
            }
            // KV events first: whoever hears of a finish and then asks the cache sees this step's blocks.
            if (auto kv = st.engine->take_kv_events(); !kv.empty())
                for (auto& [c, id] : st.caches) self->send(c, kv_events_atom::value, KvEventBatch{id, kv});
            const double te = now_s();
            st.batcher.apply(events, te);
            StepOutput out;
            out.items.reserve(events.size());
            for (EngineEvent& ev : events) {
                auto it = st.reply_to.find(ev.id);
                if (it == st.reply_to.end() || (ev.tokens.empty() && !ev.finished)) continue;
                StepOutput::Item item;
                item.to = it->second;
                if (ev.finished) st.reply_to.erase(it);
                ev.t_s = te;
                item.event = std::move(ev);
                out.items.push_back(std::move(item));
            }
            if (!out.items.empty()) self->send(st.relay, relay_atom::value, std::move(out));
            if (auto ev = st.engine->take_evictions(); !ev.empty()) {
                std::lock_guard<std::mutex> lk(st.shared->metrics_mu);
                for (const EvictionCount& e : ev) st.shared->metrics->add_evictions(e.n, e.policy, e.bucket, st.pool);
            }
            // KV gauges at most every 50 ms, and when the pool goes idle (the gauges then hold its
            // resting state, not the last busy sample).
            if (t - st.last_kv_sample > 0.05 || !st.engine->has_work()) {
                st.last_kv_sample = t;
                push_kv_sample(st, t);
            }
            publish_load(st);
            ensure_stepping(self);
        },
    };
}

}  // namespace

ExecutorActor spawn_executor(caf::actor_system& sys, std::unique_ptr<Engine> engine, std::shared_ptr<const Model> model,
                          std::shared_ptr<PoolLive> live, std::shared_ptr<SharedState> shared, std::string pool_name) {
    // unique_ptr is move-only; CAF copies spawn arguments, so hand over a raw owner.
    auto* owner = new std::unique_ptr<Engine>(std::move(engine));
    return sys.spawn<caf::detached>(executor_actor, owner, std::move(model), std::move(live), std::move(shared),
                                    std::move(pool_name));
}

}  // namespace steward
