// The policies of one config generation: for every bucket its routing, eviction and speculation
// instance (each optional: absent means the built-in default), created from the bucket's TOML.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "plugin/plugin_loader.h"
#include "plugin/policies.h"

namespace steward {

struct BucketPolicies {
    std::shared_ptr<RoutingPolicy> routing;            // null: the bucket's configured pool
    std::shared_ptr<PluginEvictionPolicy> eviction;    // null: least recently used
    std::shared_ptr<SpeculationPolicy> speculation;    // null: no draft tokens
};

// Counters per (bucket, kind, plugin), kept across config generations. Thread-safe.
class PolicyCounterRegistry {
public:
    std::shared_ptr<PolicyCounters> get(const std::string& bucket, const std::string& kind, const std::string& plugin);
    std::vector<std::shared_ptr<PolicyCounters>> all() const;

private:
    mutable std::mutex mu_;
    std::map<std::tuple<std::string, std::string, std::string>, std::shared_ptr<PolicyCounters>> by_key_;
};

// One BucketPolicies per config bucket (same order). Loads every plugin and creates every instance;
// the first failure is returned (file:line:column, bucket, plugin, what and the fix) and nothing
// is kept.
Expected<std::vector<BucketPolicies>> create_policies(const Config& config, PluginLoader& loader,
                                                      PolicyCounterRegistry& counters);

}  // namespace steward
