// Runtime-wide objects the actors share: the pools (model + executor handle), the metrics
// registry, the in-flight table. Everything here is either immutable after start or locked.
#pragma once
#include <caf/all.hpp>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/runtime.h"
#include "metrics/bucket_metrics.h"
#include "model/model.h"

namespace steward {

struct PoolRuntime {
    PoolConfig cfg;
    std::unique_ptr<Model> model;
    caf::actor executor;
    int n_blocks = 0;
};

struct SharedState {
    std::shared_ptr<const Config> config;
    uint64_t generation = 1;
    std::vector<PoolRuntime> pools;  // fixed after start
    caf::actor router;

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

    mutable std::mutex metrics_mu;
    std::unique_ptr<MetricsRegistry> metrics;

    // In-flight requests: handle -> request actor.
    std::mutex inflight_mu;
    std::condition_variable inflight_cv;
    std::map<uint64_t, caf::actor> inflight;
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
};

}  // namespace steward
