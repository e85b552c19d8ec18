// Spawn functions of Steward's actors. Each actor is a small state struct plus a behavior; the
// work is done by the runtime/ cores they call.
#pragma once
#include <caf/all.hpp>

#include <functional>
#include <memory>

#include "actors/messages.hpp"
#include "config/config.h"
#include "kv/admission.h"
#include "sched/engine.h"

namespace steward {

struct SharedState;  // runtime-wide objects the actors share (defined in actors/shared_state.hpp)
struct Snapshot;
struct PoolLive;
class Model;

// One per pool; detached (its own thread) because a step blocks while the forward runs. Holds the
// model as long as it runs; exits when the pool's last snapshot lets go of it.
ExecutorActor spawn_executor(caf::actor_system& sys, std::unique_ptr<Engine> engine, std::shared_ptr<const Model> model,
                          std::shared_ptr<PoolLive> live, std::shared_ptr<SharedState> shared, std::string pool_name);
// One per config generation: classifies requests into buckets and asks the bucket's routing
// policy for the pool. Holds no owning reference to its snapshot (the snapshot owns the router).
RouterActor spawn_router(caf::actor_system& sys, std::weak_ptr<Snapshot> snap, std::weak_ptr<SharedState> shared);
// One per runtime, detached (a reload loads models and plugins): answers reload_atom by calling
// `reload` (parse, validate completely, swap).
// (rejoin_atom) calls `rejoin`: a lost worker answers again, rebuild the generation around it.
using ReloadFn = std::function<Expected<uint64_t>()>;
ConfigActor spawn_config(caf::actor_system& sys, ReloadFn reload, std::function<void()> rejoin, std::weak_ptr<SharedState> shared);
// One per runtime: the prefix index of every pool (runtime/kv/prefix_index), fed by the executors'
// KvEventBatch messages and kv_drop_atom (a pool stopped); answers CacheQuery with CachedTokens.
CacheActor spawn_cache(caf::actor_system& sys);
// One per pool: KV admission (runtime/kv/admission). Answers (admit_atom, AdmitRequest) with an
// AdmitAnswer; a queued request later gets (admit_atom, AdmitAnswer) from it. (release_atom, id) ends a
// request; (quota_atom, tenant, quota_blocks) sets a quota. on_figures, when set, is called with the
// pool's per-tenant figures after every change (the runtime puts them into the metrics).
using AdmissionFiguresFn = std::function<void(const std::string& pool, std::vector<TenantAdmission> figures)>;
KvAllocatorActor spawn_kv_allocator(caf::actor_system& sys, AdmissionOptions opt, AdmissionFiguresFn on_figures = {});
// One per runtime: deadlines by owner (runtime/util/deadline_queue). (timer_add_atom, owner, at_s,
// target, kind, arg) sends `target` req_deadline_atom (kind TimerKind::request) or (deadline_atom, arg)
// (kind TimerKind::admission) at now_s() >= at_s; (timer_cancel_atom, owner) forgets every deadline
// of the owner and its handle. Unlike delayed_send to itself, a finished request is not held alive
// until its deadline.
enum class TimerKind : int32_t { request = 0, admission = 1 };
TimerActor spawn_timer(caf::actor_system& sys);
// ---- workers (actors/worker_actor.cpp)
// A worker process's published actor: answers (hello_atom, wire version) with WorkerInfo (its live
// pools and their executor and kv_allocator actors, or why it refuses) and heartbeat_atom with
// WorkerLoad. `version` is k_wire_version (a test may give another).
WorkerActor spawn_worker(caf::actor_system& sys, std::weak_ptr<SharedState> shared, std::string name, uint32_t version);
// Connects to the worker at "host:port" and says hello; errors name the worker and the fix.
struct WorkerConnection {
    WorkerActor worker;
    WorkerInfo info;
};
// Through CAF's TLS transport when the actor system was started with [cluster] TLS keys, in plain
// BASP with cluster.insecure_loopback, else an error naming the keys to set.
Expected<WorkerConnection> connect_worker(caf::actor_system& sys, const std::string& address, const ClusterConfig& cluster);
// The front's watch over one remote pool (detached: reconnecting blocks). Heartbeats the worker,
// writes its load into `live`, and declares the worker lost on a down message of its executor or
// worker actor or a heartbeat past the timeout: live->lost, then (lost_atom, pool_id, why) to every
// request that sent (watch_atom, actor). Lost, it tries the worker again every reconnect_ms and, once
// the worker answers with the pool, sends rejoin_atom to the config actor.
struct PoolMonitorArgs {
    WorkerActor worker;
    ExecutorActor executor;
    std::string address, remote_pool, pool;
    uint64_t pool_id = 0;
    std::shared_ptr<PoolLive> live;
    ClusterConfig cluster;
    std::weak_ptr<SharedState> shared;
};
PoolMonitorActor spawn_pool_monitor(caf::actor_system& sys, PoolMonitorArgs args);
// One per request.
struct RequestContext;
RequestActor spawn_request(caf::actor_system& sys, std::shared_ptr<RequestContext> ctx);

}  // namespace steward
