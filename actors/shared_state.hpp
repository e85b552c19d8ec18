// Runtime-wide objects the actors share: config snapshots (a generation's config, pools and policy
// instances), the metrics registry, the in-flight table. A request holds the snapshot it started
// with until it finishes; a snapshot's pools and plugin libraries live as long as any holder.
#pragma once
#include <caf/all.hpp>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <steward/request.h>

#include "actors/messages.hpp"
#include "config/config.h"
#include "metrics/bucket_metrics.h"
#include "model/model.h"
#include "plugin/plugin_loader.h"
#include "plugin/policy_set.h"
#include "plugin/pool_estimates.h"
#include "pool/pool.h"
#include "plugin/route.h"
#include "request/otlp_trace.h"
#include "request/trace_store.h"

namespace steward {

// One pool as the actors run it: the core's Pool (model, KV size, profile, live figures) and its
// executor actor. Shared by every snapshot that keeps the pool; when the last holder lets go (a
// reload removed or changed it and its requests finished), the executor is told to exit: a
// removed pool drains cleanly.
// A remote pool (PoolConfig::remote) is a worker's: executor and kv_allocator are proxies of the
// worker's actors, and a monitor actor watches the worker; letting go of the handle unsubscribes from
// the worker's KV events and leaves its actors running.
struct PoolHandle : Pool {
    explicit PoolHandle(Pool p) : Pool(std::move(p)) {}
    ExecutorActor executor;
    uint64_t id = 0;           // this pool instance, in the cache actor's index (never reused); 0: not wired yet
    KvAllocatorActor kv_allocator;  // admission before the executor's queue
    std::vector<std::vector<int32_t>> public_prefixes;  // in this pool's vocabulary (cache queries hash with them)
    std::string worker;        // remote: the worker's "host:port"; "" local
    WorkerActor worker_actor;  // remote: the worker's published actor (hello, heartbeats)
    PoolMonitorActor monitor;  // remote: this pool's monitor (heartbeats, loss, rejoin); spawned when wired
    CacheActor cache;          // remote: the cache actor subscribed to the worker's KV events
    bool remote() const { return !worker.empty(); }
    ~PoolHandle() {
        if (remote()) {
            if (executor && cache) caf::anon_send(executor, kv_unsub_atom::value, cache);
            if (cache && id) caf::anon_send(cache, kv_drop_atom::value, id);
            if (monitor) caf::anon_send_exit(monitor, caf::exit_reason::user_shutdown);
            return;
        }
        // A worker's actors that a front has seen are in the system's registry (CAF's network layer
        // resolves incoming messages there), which holds them strongly until the front releases
        // them; a front that vanished never does, and the executor's thread would wait forever
        // for its actor to be destroyed.
        if (executor) {
            caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
            executor->home_system().registry().erase(executor->id());
        }
        if (kv_allocator) {
            caf::anon_send_exit(kv_allocator, caf::exit_reason::user_shutdown);
            kv_allocator->home_system().registry().erase(kv_allocator->id());
        }
    }
};

// One config generation.
struct Snapshot {
    uint64_t generation = 0;
    std::shared_ptr<const Config> config;
    std::vector<std::shared_ptr<PoolHandle>> pools;  // config.pools order
    std::vector<PoolProfile> profiles;               // pools order: what routing sees (this config's prices)
    std::vector<BucketPolicies> policies;            // config.buckets order
    RouterActor router;                              // this generation's router
    int pool_index(const std::string& name) const {
        for (size_t i = 0; i < pools.size(); i++)
            if (pools[i]->cfg.name == name) return (int)i;
        return -1;
    }
    ~Snapshot() {
        if (router) caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
    }
};

struct SharedState {
    // The live snapshot, and every generation still held by some request (for the executors).
    mutable std::mutex snap_mu;
    std::shared_ptr<Snapshot> current;
    std::map<uint64_t, std::weak_ptr<Snapshot>> generations;
    std::shared_ptr<Snapshot> snapshot() const {
        std::lock_guard<std::mutex> lk(snap_mu);
        return current;
    }
    std::shared_ptr<Snapshot> find_generation(uint64_t g) const {
        std::lock_guard<std::mutex> lk(snap_mu);
        auto it = generations.find(g);
        return it == generations.end() ? nullptr : it->second.lock();
    }
    void publish(std::shared_ptr<Snapshot> s) {
        std::lock_guard<std::mutex> lk(snap_mu);
        for (auto it = generations.begin(); it != generations.end();)
            it = it->second.expired() ? generations.erase(it) : std::next(it);
        generations[s->generation] = s;
        current = std::move(s);
    }

    CacheActor cache;                       // the runtime's cache actor (prefix index of every pool)
    ConfigActor config;                      // the runtime's config actor (reloads; a worker's rejoin)
    TimerActor timers;                      // the runtime's timer actor (request and admission deadlines)
    TraceStore traces;                      // the last requests' decision traces
    std::unique_ptr<OtlpFile> otlp;         // [tracing] otlp_file: every finished request's trace (null: none)
    std::atomic<uint64_t> next_pool_id{1};  // PoolHandle::id

    PluginLoader plugins;
    PolicyCounterRegistry policy_counters;

    // Tenant name -> small id for the KV layer (salts come from the config).
    std::mutex tenants_mu;
    std::map<std::string, int32_t> tenant_ids;
    int32_t tenant_id(const std::string& name) {
        std::lock_guard<std::mutex> lk(tenants_mu);
        auto it = tenant_ids.find(name);
        if (it != tenant_ids.end()) return it->second;
        const int32_t id = (int32_t)tenant_ids.size() + 1;
        tenant_ids.emplace(name, id);
        return id;
    }
    // The engine's session key: session ids are chosen by callers, so they are scoped to the tenant
    // (else a tenant naming another's session would attach to, or replace, that tenant's KV).
    static std::string session_key(int32_t tenant, const std::string& session) {
        return session.empty() ? std::string() : std::to_string(tenant) + "/" + session;
    }
    // Session key -> the pool that served its last turn (what routing plugins see as session_pool).
    SessionPools session_pools;

    mutable std::mutex metrics_mu;
    std::unique_ptr<MetricsRegistry> metrics;  // also what routers read of measured route quality

    // In-flight requests: handle -> request actor.
    std::mutex inflight_mu;
    std::condition_variable inflight_cv;
    std::map<uint64_t, RequestActor> inflight;
    void finished(uint64_t id) {
        std::lock_guard<std::mutex> lk(inflight_mu);
        inflight.erase(id);
        inflight_cv.notify_all();
    }
};

struct RequestContext {
    uint64_t id = 0;
    GenerationRequest req;
    RequestCallbacks cb;
    double arrival_s = 0;
    std::shared_ptr<SharedState> shared;
    std::shared_ptr<Snapshot> snap;  // the config generation the request started with
    // Its documents (docs/reuse.md), as the runtime resolved them: reuse::document_key of each, and
    // for a text prompt the leading bytes of req.prompt that hold them (0: a renderer says where).
    std::vector<uint64_t> reuse_keys;
    size_t documents_chars = 0;
};

}  // namespace steward
