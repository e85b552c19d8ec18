// Creating a config generation's policy instances, bucket by bucket.
#include "plugin/policy_set.h"

#include "plugin/plugin_check.h"

namespace steward {

std::shared_ptr<PolicyCounters> PolicyCounterRegistry::get(const std::string& bucket, const std::string& kind,
                                                           const std::string& plugin) {
    std::lock_guard<std::mutex> lk(mu_);
    auto& p = by_key_[{bucket, kind, plugin}];
    if (!p) {
        p = std::make_shared<PolicyCounters>();
        p->bucket = bucket;
        p->kind = kind;
        p->plugin = plugin;
    }
    return p;
}

std::vector<std::shared_ptr<PolicyCounters>> PolicyCounterRegistry::all() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::shared_ptr<PolicyCounters>> out;
    for (const auto& [k, v] : by_key_) out.push_back(v);
    return out;
}

namespace {

template <typename Policy>
Expected<std::shared_ptr<Policy>> make_policy(const PolicySpec& spec, PolicyKind kind, const BucketConfig& b,
                                              const Config& config, PluginLoader& loader, PolicyCounterRegistry& counters) {
    auto lib = loader.load(spec.plugin, kind, config.plugins.dirs);
    if (!lib) return make_error(spec.where, ": bucket '", b.name, "': ", lib.error().message);
    std::vector<std::string> pools;
    for (const PoolConfig& pc : config.pools) pools.push_back(pc.name);
    if (config.plugins.check_in_child) {
        auto ok = check_plugin_in_child(*lib, spec, b.name, pools, config.plugins.check_timeout_ms);
        if (!ok) return ok.error();
    }
    // Isolated: create() and every decision in a plugin host process (plugin/plugin_process.h).
    const InstanceIsolation iso{spec.isolation.value_or(config.plugins.isolation), config.plugins.check_timeout_ms};
    auto p = Policy::create(*lib, spec, b.name, counters.get(b.name, policy_kind_name(kind), spec.plugin), pools, iso);
    if (!p) return p.error();
    return std::shared_ptr<Policy>(std::move(*p));
}

}  // namespace

Expected<std::vector<BucketPolicies>> create_policies(const Config& config, PluginLoader& loader,
                                                      PolicyCounterRegistry& counters) {
    std::vector<BucketPolicies> out(config.buckets.size());
    for (size_t i = 0; i < config.buckets.size(); i++) {
        const BucketConfig& b = config.buckets[i];
        if (b.routing) {
            auto p = make_policy<RoutingPolicy>(*b.routing, PolicyKind::ROUTING, b, config, loader, counters);
            if (!p) return p.error();
            out[i].routing = *p;
            (*p)->set_budget_ms(config.plugins.decision_budget_ms);
        }
        if (b.eviction) {
            auto p = make_policy<PluginEvictionPolicy>(*b.eviction, PolicyKind::EVICTION, b, config, loader, counters);
            if (!p) return p.error();
            out[i].eviction = *p;
            (*p)->set_budget_ms(config.plugins.step_decision_budget_ms);
        }
        if (b.speculation) {
            auto p = make_policy<SpeculationPolicy>(*b.speculation, PolicyKind::SPECULATION, b, config, loader, counters);
            if (!p) return p.error();
            out[i].speculation = *p;
            // The router asks the per-bucket budget off any step: the routing budget applies; the
            // engine's per-sequence asks are inside a step.
            (*p)->set_budget_ms(config.plugins.decision_budget_ms);
            (*p)->set_step_budget_ms(config.plugins.step_decision_budget_ms);
        }
    }
    return out;
}

}  // namespace steward
