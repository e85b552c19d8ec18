// Every message type exchanged between Steward's actors, in one place, each with a CAF 0.17
// inspect() so it can cross the network between a front and its workers (add_message_types, at the
// end, registers them all; every node's runtime calls it).
#pragma once
#include <caf/all.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <steward/finish_reason.h>

#include "config/config.h"
#include "plugin/route.h"
#include "kv/kv_event.h"
#include "request/request_fsm.h"

namespace steward {

// ---- atoms (10 characters at most)
using route_atom = caf::atom_constant<caf::atom("route")>;
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using event_atom = caf::atom_constant<caf::atom("event")>;  // a run's step: its tokens and / or its end
using relay_atom = caf::atom_constant<caf::atom("relay")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;  // figures of the cache and kv_allocator actors
using session_atom = caf::atom_constant<caf::atom("session")>;
using reload_atom = caf::atom_constant<caf::atom("reload")>;
using kv_events_atom = caf::atom_constant<caf::atom("kv_events")>;
using kv_drop_atom = caf::atom_constant<caf::atom("kv_drop")>;
using cache_atom = caf::atom_constant<caf::atom("cache")>;
using admit_atom = caf::atom_constant<caf::atom("admit")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using quota_atom = caf::atom_constant<caf::atom("quota")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;  // a run's deadline passed while it waited
using req_deadline_atom = caf::atom_constant<caf::atom("reqdeadln")>;  // the request's deadline timer fired
using timer_add_atom = caf::atom_constant<caf::atom("timeradd")>;        // timer_actor: a deadline for an owner
using timer_cancel_atom = caf::atom_constant<caf::atom("timercncl")>;    // timer_actor: forget an owner's deadlines
using timer_tick_atom = caf::atom_constant<caf::atom("timertick")>;      // timer_actor, to itself
// Workers (steward worker) and the front's remote pools.
using hello_atom = caf::atom_constant<caf::atom("hello")>;          // front -> worker: describe your pools
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;  // front -> worker: alive? your load
using kv_unsub_atom = caf::atom_constant<caf::atom("kv_unsub")>;    // front -> remote executor: stop the events
using invalidate_atom = caf::atom_constant<caf::atom("invalid")>;   // runtime -> executor: a document changed
using watch_atom = caf::atom_constant<caf::atom("watch")>;          // request -> pool monitor: tell me if the worker is lost
using unwatch_atom = caf::atom_constant<caf::atom("unwatch")>;
using lost_atom = caf::atom_constant<caf::atom("wlost")>;           // pool monitor -> request: the worker is lost
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;        // pool monitor -> config actor: rebuild, a worker is back
using mon_tick_atom = caf::atom_constant<caf::atom("mon_tick")>;    // pool monitor, to itself: heartbeat or reconnect
// The config actor's interface (actors.hpp, spawn_config): a reload answers (ok, live generation,
// error message); a rejoin rebuilds the generation around a worker that answers again.
using ConfigActor = caf::typed_actor<caf::replies_to<reload_atom>::with<bool, uint64_t, std::string>,
                                     caf::reacts_to<rejoin_atom>>;

// ---- cache actor (one per runtime): which pool holds which prefix blocks.

// The kind travels as an int32_t (CAF 0.17 cannot inspect an enum class).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvEvent& x) {
    int32_t kind = static_cast<int32_t>(x.kind), tier = static_cast<int32_t>(x.tier);
    return f(caf::meta::type_name("KvEvent"), x.hash, kind, tier, caf::meta::load_callback([&]() -> caf::error {
                 if (kind < 0 || kind > 1 || tier < 0 || tier > 2) return caf::sec::invalid_argument;
                 x.kind = static_cast<KvEventKind>(kind);
                 x.tier = static_cast<KvTier>(tier);
                 return caf::none;
             }));
}

// executor_actor -> cache_actor: the block stored / removed events of one step, in the pool's order.
// pool_id names the pool instance (a reload that replaces a pool gives the new one a new id).
struct KvEventBatch {
    uint64_t pool_id = 0;
    std::vector<KvEvent> events;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvEventBatch& x) {
    return f(caf::meta::type_name("KvEventBatch"), x.pool_id, x.events);
}

// One pool's part of a cache query: the prompt's lookup hashes for that pool (lookup_block_hashes with
// the pool's tokenizer, block size and public prefixes, and the tenant's salt).
struct CachePoolQuery {
    uint64_t pool_id = 0;
    int32_t block_size = 0;
    std::vector<uint64_t> hashes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CachePoolQuery& x) {
    return f(caf::meta::type_name("CachePoolQuery"), x.pool_id, x.block_size, x.hashes);
}

// router_actor (or anyone) -> cache_actor, answered with CachedTokens.
struct CacheQuery {
    uint64_t request_id = 0;
    std::vector<CachePoolQuery> pools;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CacheQuery& x) {
    return f(caf::meta::type_name("CacheQuery"), x.request_id, x.pools);
}

// cache_actor -> asker: prompt tokens each queried pool holds in its prefix cache, in query order.
struct CachedTokens {
    std::vector<int32_t> n_tokens;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CachedTokens& x) {
    return f(caf::meta::type_name("CachedTokens"), x.n_tokens);
}

// cache_actor -> anyone who asks (stats_atom): the block hashes each pool holds.
struct CacheStats {
    std::vector<uint64_t> pool_ids;
    std::vector<int64_t> n_blocks;  // [pool_ids]
    int64_t n_events = 0;           // applied since start
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CacheStats& x) {
    return f(caf::meta::type_name("CacheStats"), x.pool_ids, x.n_blocks, x.n_events);
}

// The cache actor's interface (one per runtime, spawn_cache): KV events in, a pool dropped, the
// cached tokens of a prompt per pool, its figures. A message it does not take fails to compile.
using CacheActor = caf::typed_actor<caf::reacts_to<kv_events_atom, KvEventBatch>, caf::reacts_to<kv_drop_atom, uint64_t>,
                                    caf::replies_to<cache_atom, CacheQuery>::with<CachedTokens>,
                                    caf::replies_to<stats_atom, std::vector<uint64_t>>::with<CacheStats>>;

// ---- request, router and executor actors

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestFeatures& x) {
    return f(caf::meta::type_name("RequestFeatures"), x.hint, x.prompt_tokens, x.max_tokens, x.temperature, x.tools,
             x.response_format, x.tenant);
}

// request_actor -> router_actor: what the bucket rules look at (features, as classify() takes
// them), and what the router adds for the routing plugin.
struct RouteQuery {
    uint64_t request_id = 0;
    RequestFeatures features;
    std::string session;     // the caller's session id ("" none)
    double arrival_s = 0;    // now_s() at arrival: the router derives the time left before the timeout
    CacheQuery cache;  // the prompt's lookup hashes per pool; the router asks the cache actor with it
    int32_t pinned_pool = -1;  // >= 0: the caller named this pool; no routing policy runs
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteQuery& x) {
    return f(caf::meta::type_name("RouteQuery"), x.request_id, x.features, x.session, x.arrival_s, x.cache, x.pinned_pool);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteInput::PoolLoad& x) {
    return f(caf::meta::type_name("RouteInput::PoolLoad"), x.n_kv_blocks_used, x.n_kv_blocks_total, x.block_size, x.n_inflight,
             x.worker);
}

// Part of RouteDecision: what the routing plugin was told (plugin/route.h).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteInput& x) {
    return f(caf::meta::type_name("RouteInput"), x.request_id, x.bucket, x.tenant, x.response_format, x.n_prompt_tokens,
             x.max_tokens, x.temperature, x.tools, x.session, x.session_pool, x.priority, x.slo_ttft_ms, x.slo_tpot_ms,
             x.deadline_ms, x.n_cached_prompt_tokens, x.pool_loads);
}

// router_actor -> request_actor: RouteDecision (plugin/route.h).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteDecision& x) {
    return f(caf::meta::type_name("RouteDecision"), x.bucket, x.bucket_index, x.pool, x.priority, x.generation,
             x.draft_budget, x.upgrade_pool, x.check_after_tokens, x.shadow_pool, x.fallback, x.input, x.bucket_why,
             x.route_why, x.est_cost, x.est_ttft_ms, x.est_latency_ms, x.quality, x.risk);
}

// The router's interface (one per config generation, spawn_router): a request's route. And a bucket
// decider's (the router's, for a bucket whose decision calls a plugin): the route given the cached
// tokens the router learned from the cache actor. A message they do not take fails to compile.
using RouterActor = caf::typed_actor<caf::replies_to<route_atom, RouteQuery>::with<RouteDecision>>;
using DeciderActor = caf::typed_actor<caf::replies_to<route_atom, RouteQuery, CachedTokens>::with<RouteDecision>>;

// request_actor -> executor_actor (submit_atom): EngineRequest (sched/engine.h), the run as it is;
// the sender receives its events (event_atom). Its resolved fields (policies, the compiled
// grammar) stay behind: the executor resolves them from its own config.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
    return f(caf::meta::type_name("SamplingParams"), x.temperature, x.top_k, x.top_p, x.seed, x.presence_penalty,
             x.frequency_penalty, x.logit_bias, x.n_top_logprobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EngineRequest& x) {
    return f(caf::meta::type_name("EngineRequest"), x.id, x.tenant, x.tenant_name, x.salt, x.prompt, x.max_tokens,
             x.sampling, x.priority, x.arrival_s, x.deadline_s, x.session, x.stop_at_eos, x.kv_quota_blocks, x.bucket,
             x.bucket_index, x.generation, x.grammar_kind, x.grammar_text, x.reuse_priority_tokens, x.reuse_keyed_from,
             x.reuse_keys, x.batch_tokens);
}

// executor_actor -> request_actor (event_atom): EngineEvent (sched/engine.h), a run's step as the
// engine reported it: the tokens it produced, and, when finished, how the run ended and its figures
// (RunFigures). One message per run per step, or, for a batch_tokens run, several steps' tokens
// merged with their times (sched/token_batcher.h); unchanged from the executor to the request core.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenLogprob& x) {
    return f(caf::meta::type_name("TokenLogprob"), x.id, x.logprob);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunFigures& x) {
    return f(caf::meta::type_name("RunFigures"), x.n_prompt_tokens, x.n_cached_prompt_tokens, x.n_cached_cross_tenant,
             x.n_cached_public, x.n_cached_host_tokens, x.n_cached_disk_tokens, x.n_promotions, x.promote_s,
             x.n_recomputed_tokens, x.n_preemptions, x.n_drafts, x.n_draft_tokens,
             x.n_accepted_tokens, x.n_rollbacks, x.n_spec_branches, x.n_draft_tokens_at, x.n_accepted_at, x.draft_s,
             x.verify_s, x.n_spec_fallbacks, x.n_masked, x.n_forced, x.mask_s);
}
// The reason travels as an int32_t (CAF 0.17 cannot inspect an enum class).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EngineEvent& x) {
    int32_t finish = static_cast<int32_t>(x.finish);
    return f(caf::meta::type_name("EngineEvent"), x.id, x.tokens, x.top_logprobs, x.logprobs, x.token_t_s, x.finished, finish, x.error,
             x.first_scheduled_s, x.t_s, static_cast<RunFigures&>(x), caf::meta::load_callback([&]() -> caf::error {
                 if (finish < 0 || finish >= n_finish_reasons) return caf::sec::invalid_argument;
                 x.finish = static_cast<FinishReason>(finish);
                 return caf::none;
             }));
}

// The executor's interface (one per pool, spawn_executor): runs to start, runs to cancel, kept
// sessions to end, document keys whose KV to drop (reuse::document_key), KV event subscribers to add and drop, and its own step ticks. A message it does
// not take fails to compile at the sender.
using ExecutorActor = caf::typed_actor<caf::reacts_to<submit_atom, EngineRequest>, caf::reacts_to<cancel_atom, uint64_t>,
                                       caf::reacts_to<session_atom, std::string>,
                                       caf::reacts_to<invalidate_atom, std::vector<uint64_t>>,
                                       caf::reacts_to<kv_events_atom, CacheActor, uint64_t>,
                                       caf::reacts_to<kv_unsub_atom, CacheActor>, caf::reacts_to<step_atom>>;

// ---- kv_allocator actor (one per pool): admission before the engine's queue.

// request_actor -> kv_allocator_actor (admit_atom): reserve n_blocks for engine request `id`.
struct AdmitRequest {
    uint64_t id = 0;
    std::string tenant;
    int32_t n_blocks = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AdmitRequest& x) {
    return f(caf::meta::type_name("AdmitRequest"), x.id, x.tenant, x.n_blocks);
}

// kv_allocator_actor -> request_actor: the reply to AdmitRequest and, for a queued request, a later
// (admit_atom, AdmitAnswer) when it is admitted or refused. verdict / limit: AdmissionVerdict /
// AdmissionLimit as int32_t.
struct AdmitAnswer {
    uint64_t id = 0;
    int32_t verdict = 0;
    int32_t limit = 0;
    int32_t n_blocks = 0;
    std::string message;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AdmitAnswer& x) {
    return f(caf::meta::type_name("AdmitAnswer"), x.id, x.verdict, x.limit, x.n_blocks, x.message);
}

// kv_allocator_actor -> anyone who asks (stats_atom).
struct AllocatorStats {
    int32_t n_blocks_total = 0, capacity_blocks = 0, n_blocks_reserved = 0, n_reservations = 0, n_waiting = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AllocatorStats& x) {
    return f(caf::meta::type_name("AllocatorStats"), x.n_blocks_total, x.capacity_blocks, x.n_blocks_reserved,
             x.n_reservations, x.n_waiting);
}

// The kv_allocator's interface (one per pool, spawn_kv_allocator): admit (answered now; a queued
// request hears later, as a one-way (admit_atom, AdmitAnswer) message), release (answered once the
// release is counted), a tenant's quota, its figures. A message it does not take fails to compile.
using KvAllocatorActor = caf::typed_actor<caf::replies_to<admit_atom, AdmitRequest>::with<AdmitAnswer>,
                                          caf::reacts_to<release_atom, uint64_t>,
                                          caf::reacts_to<quota_atom, std::string, int32_t>,
                                          caf::replies_to<stats_atom>::with<AllocatorStats>>;

// ---- the request actor (one per request): what the actors that serve a request tell it.

// The request actor's interface (spawn_request): a run's steps, its tokens and its end (from the
// executor the run is on, through its relay, or from the request itself), a queued run's admission answer (from
// its pool's kv_allocator), a run's admission deadline (deadline_atom, from the timer), a lost worker
// (lost_atom, from the pool's monitor), the caller's cancel and the request's own deadline. A
// message it does not take fails to compile at the sender; a request still checks who sent its
// tokens, ends and admission answers (a lost worker's executor may go on talking).
using RequestActor = caf::typed_actor<caf::reacts_to<event_atom, EngineEvent>, caf::reacts_to<admit_atom, AdmitAnswer>, caf::reacts_to<deadline_atom, uint64_t>,
                                      caf::reacts_to<lost_atom, uint64_t, std::string>, caf::reacts_to<cancel_atom>,
                                      caf::reacts_to<req_deadline_atom>>;

// The timer actor's interface (actors.hpp, spawn_timer): a message it does not take is a compile
// error at the sender. Local to a process (it never crosses to a worker).
using TimerActor = caf::typed_actor<caf::reacts_to<timer_add_atom, uint64_t, double, RequestActor, int32_t, uint64_t>,
                                    caf::reacts_to<timer_cancel_atom, uint64_t>, caf::reacts_to<timer_tick_atom>>;

// executor_actor -> its relay (one message per step, relay_atom): every request's event of the step,
// each with the request actor it goes to. The relay (on CAF's scheduler) sends them on, in order,
// so the executor's thread enqueues one message per step however many requests it serves. Never
// crosses the wire.
struct StepOutput {
    struct Item {
        RequestActor to;
        EngineEvent event;
    };
    std::vector<Item> items;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepOutput::Item& x) {
    return f(caf::meta::type_name("StepOutput::Item"), x.to, x.event);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepOutput& x) {
    return f(caf::meta::type_name("StepOutput"), x.items);
}

// A remote pool's monitor (one per remote pool on a front, spawn_pool_monitor): requests running
// there watch it (lost_atom when the worker is lost) and unwatch it; its own heartbeat ticks.
using PoolMonitorActor = caf::typed_actor<caf::reacts_to<watch_atom, RequestActor>, caf::reacts_to<unwatch_atom, RequestActor>,
                                          caf::reacts_to<mon_tick_atom>>;

// The executor's relay (one per executor, on CAF's scheduler): a step's StepOutput.
using RelayActor = caf::typed_actor<caf::reacts_to<relay_atom, StepOutput>>;

// ---- workers: what crosses the wire between a front and a worker besides the messages above.

// The wire protocol's version: a front and a worker of different versions refuse each other at hello.
// Raise it with every change to a message type above or below.
inline constexpr uint32_t k_wire_version = 2;

// One pool of a worker (pool/pool.h's RemoteDescription, plus its actors).
struct RemotePoolInfo {
    std::string pool;
    ExecutorActor executor;
    KvAllocatorActor kv_allocator;
    int32_t block_size = 0, n_blocks = 0, max_queue = 0;
    bool prefix_cache = true;
    std::vector<uint8_t> model_header;
    std::string model_path;
    std::vector<std::vector<int32_t>> public_prefixes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RemotePoolInfo& x) {
    return f(caf::meta::type_name("RemotePoolInfo"), x.pool, x.executor, x.kv_allocator, x.block_size, x.n_blocks,
             x.max_queue, x.prefix_cache, x.model_header, x.model_path, x.public_prefixes);
}

// worker -> front: the answer to (hello_atom, version). refused: why the worker will not serve this
// front (another version); else its pools.
struct WorkerInfo {
    uint32_t version = 0;
    std::string worker;  // its --listen address
    std::string refused;
    std::vector<RemotePoolInfo> pools;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerInfo& x) {
    return f(caf::meta::type_name("WorkerInfo"), x.version, x.worker, x.refused, x.pools);
}

// worker -> front: the answer to heartbeat_atom, per pool of the worker.
struct PoolLoadInfo {
    std::string pool;
    int32_t n_waiting = 0, n_running = 0, n_kv_blocks_used = -1, n_kv_blocks_total = -1;
    double fragmentation = 0, n_branches = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PoolLoadInfo& x) {
    return f(caf::meta::type_name("PoolLoadInfo"), x.pool, x.n_waiting, x.n_running, x.n_kv_blocks_used, x.n_kv_blocks_total,
             x.fragmentation, x.n_branches);
}
struct WorkerLoad {
    std::vector<PoolLoadInfo> pools;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerLoad& x) {
    return f(caf::meta::type_name("WorkerLoad"), x.pools);
}

// A worker process's published actor (spawn_worker): hello with the front's wire version ->
// WorkerInfo, heartbeat -> WorkerLoad. A front connects to an address and takes what answers there
// as this interface (connect_worker); a message it does not take fails to compile at the sender.
using WorkerActor = caf::typed_actor<caf::replies_to<hello_atom, uint32_t>::with<WorkerInfo>,
                                     caf::replies_to<heartbeat_atom>::with<WorkerLoad>>;

// Registers every type above with a config (each node that sends or receives them).
inline void add_message_types(caf::actor_system_config& cfg) {
    cfg.add_message_type<RouteQuery>("RouteQuery");
    cfg.add_message_type<RouteDecision>("RouteDecision");
    cfg.add_message_type<RouteInput>("RouteInput");
    cfg.add_message_type<EngineRequest>("EngineRequest");
    cfg.add_message_type<EngineEvent>("EngineEvent");
    cfg.add_message_type<KvEvent>("KvEvent");
    cfg.add_message_type<KvEventBatch>("KvEventBatch");
    cfg.add_message_type<CachePoolQuery>("CachePoolQuery");
    cfg.add_message_type<CacheQuery>("CacheQuery");
    cfg.add_message_type<CachedTokens>("CachedTokens");
    cfg.add_message_type<CacheStats>("CacheStats");
    cfg.add_message_type<AdmitRequest>("AdmitRequest");
    cfg.add_message_type<AdmitAnswer>("AdmitAnswer");
    cfg.add_message_type<AllocatorStats>("AllocatorStats");
    cfg.add_message_type<RemotePoolInfo>("RemotePoolInfo");
    cfg.add_message_type<WorkerInfo>("WorkerInfo");
    cfg.add_message_type<PoolLoadInfo>("PoolLoadInfo");
    cfg.add_message_type<WorkerLoad>("WorkerLoad");
    cfg.add_message_type<std::vector<int32_t>>("std::vector<int32_t>");
    cfg.add_message_type<std::vector<float>>("std::vector<float>");
    cfg.add_message_type<std::vector<uint64_t>>("std::vector<uint64_t>");
}

double now_s();  // one monotonic clock for every actor (steady_clock, seconds)

}  // namespace steward
