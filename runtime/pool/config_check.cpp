// check_config_file (declared in <steward/runtime.h>): everything `run` and a reload would refuse,
// without serving: the TOML, every pool's model (present, or synthesizable), every bucket's plugins
// loaded with their parameters. Plain cores only (no actor system is started).
#include <filesystem>
#include <sstream>

#include <steward/runtime.h>

#include "model/model.h"
#include "plugin/plugin_loader.h"
#include "plugin/policy_set.h"

namespace steward {

Expected<std::string> check_config_file(const std::string& path) {
    auto c = load_config(path);
    if (!c) return c.error();
    for (const PoolConfig& p : c->pools) {
        if (std::filesystem::exists(p.model)) {
            auto m = Model::load(p.model);
            if (!m) return make_error("pool '", p.name, "': ", m.error().message);
        } else if (!p.synth) {
            return make_error(path, ": pool '", p.name, "' model '", p.model,
                              "' does not exist and the pool has no [pool.synth] to write it; fix the path or add [pool.synth]");
        }
    }
    PluginLoader loader;
    PolicyCounterRegistry counters;
    auto pol = create_policies(*c, loader, counters);
    if (!pol) return pol.error();
    int n_plugins = 0;
    for (const auto& b : *pol) n_plugins += (b.routing ? 1 : 0) + (b.eviction ? 1 : 0) + (b.speculation ? 1 : 0);
    std::ostringstream o;
    o << path << ": ok (" << c->pools.size() << " pools, " << c->buckets.size() << " buckets, " << c->tenants.size()
      << " tenants, " << n_plugins << " plugin instances)";
    return o.str();
}

}  // namespace steward
