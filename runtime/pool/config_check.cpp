// check_config (pool/config_check.h): a config file checked as `run` and a reload would, without
// serving. Plain cores only (no actor system is started).
#include "pool/config_check.h"

#include <filesystem>
#include <sstream>

#include "config/limits.h"
#include "model/model.h"
#include "model/synth.h"
#include "plugin/plugin_loader.h"
#include "plugin/policy_set.h"
#include "pool/pool.h"

namespace steward {

namespace {

// The shape a [pool.synth] would write (parse_config validated it), without writing it.
ModelParams synth_params(const SynthConfig& s) {
    ModelParams mp;
    mp.arch = s.arch;
    mp.n_vocab = s.vocab;
    mp.n_ctx_train = s.ctx;
    mp.n_embd = s.dim;
    mp.n_layer = s.layers;
    mp.n_head = s.heads;
    mp.n_head_kv = s.kv_heads;
    mp.n_ff = s.ffn;
    mp.head_dim = s.dim / s.heads;
    mp.n_rot = mp.head_dim;
    return mp;
}

// Bytes synth_model holds while it writes: every weight, F32 norms aside.
double synth_bytes(const SynthConfig& s) {
    const double e = s.dim, kv = (double)s.kv_heads * (s.dim / s.heads), f = s.ffn, v = s.vocab;
    const double per_elem = s.dtype == "f32" ? 4 : s.dtype == "q8_0" ? 34.0 / 32 : 2;
    return (2 * v * e + s.layers * (2 * e * e + 2 * e * kv + 3 * e * f)) * per_elem;
}

}  // namespace

Expected<std::string> check_config(const std::string& path) {
    auto c = load_config(path);
    if (!c) return c.error();
    int n_remote = 0;
    for (const PoolConfig& p : c->pools) {
        if (!p.remote.empty()) {  // the worker's config holds its model; the front connects at start
            n_remote++;
            continue;
        }
        if (p.sim || std::filesystem::exists(p.model)) {  // a simulated pool: its shape, KV and fit
            auto pool = load_pool(p, *c);  // the model, its KV size and memory, as `run` loads them
            if (!pool) return pool.error();
            continue;
        }
        if (!p.synth)
            return make_error(path, ": pool '", p.name, "' model '", p.model,
                              "' does not exist and the pool has no [pool.synth] to write it; fix the path or add [pool.synth]");
        ModelParams mp;
        if (p.synth->draft_from.empty()) {
            if (auto m = check_memory(synth_bytes(*p.synth), "pool '" + p.name + "' [pool.synth] model", "make it smaller"); !m)
                return m.error();
            mp = synth_params(*p.synth);
        } else {
            const PoolConfig* t = c->find_pool(p.synth->draft_from);  // parse_config checked it is a full model
            if (std::filesystem::exists(t->model)) {
                auto tm = Model::load(t->model);
                if (!tm) return make_error("pool '", t->name, "': ", tm.error().message);
                mp = (*tm)->params();
            } else if (t->synth) {
                mp = synth_params(*t->synth);
            } else {
                return make_error(path, ": pool '", p.name, "' is a draft of pool '", t->name, "', whose model '", t->model,
                                  "' does not exist and has no [pool.synth]");
            }
            if (p.synth->keep_layers > mp.n_layer)
                return make_error(path, ": pool '", p.name, "' [pool.synth] keep_layers ", std::to_string(p.synth->keep_layers),
                                  " exceeds the ", std::to_string(mp.n_layer), " layers of pool '", t->name, "'");
            mp.n_layer = p.synth->keep_layers;
        }
        if (auto n = kv_block_count(p, mp, p.backend != "cuda"); !n) return n.error();
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
    if (n_remote > 0)
        o << "; " << n_remote << " remote pool" << (n_remote > 1 ? "s" : "")
          << " not contacted (a front connects to its workers when it starts: check their configs where they run)";
    return o.str();
}

}  // namespace steward
