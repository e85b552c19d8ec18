// Policy instances over the C ABI: the host API a plugin reads its parameters through, creation,
// and the validation of every decision (invalid -> counted, logged once, safe default).
#include "plugin/policies.h"

#include <spdlog/spdlog.h>

#include <cstring>

// The parameters a plugin's create() reads: the bucket's table, and which keys were asked for (any
// other key is reported as unknown). Lives as long as the instance, so log() may use it.
struct steward_params {
    const steward::PolicySpec* spec = nullptr;
    std::string bucket, plugin, kind;
    std::vector<std::string> pools;  // the generation's pools, config order
    mutable std::set<std::string> asked;
};

namespace steward {

namespace {

const PolicyParam* find_param(const steward_params* p, const char* key) {
    if (!p || !key || !p->spec) return nullptr;
    p->asked.insert(key);
    auto it = p->spec->params.find(key);
    return it == p->spec->params.end() ? nullptr : &it->second;
}

int host_param_double(const steward_params* p, const char* key, double* out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_ERR_NOT_FOUND;
    if (auto d = std::get_if<double>(v)) return *out = *d, STEWARD_OK;
    if (auto i = std::get_if<int64_t>(v)) return *out = (double)*i, STEWARD_OK;
    return STEWARD_ERR_PARAM;
}
int host_param_int(const steward_params* p, const char* key, int64_t* out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_ERR_NOT_FOUND;
    if (auto i = std::get_if<int64_t>(v)) return *out = *i, STEWARD_OK;
    return STEWARD_ERR_PARAM;
}
int host_param_bool(const steward_params* p, const char* key, int* out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_ERR_NOT_FOUND;
    if (auto b = std::get_if<bool>(v)) return *out = *b ? 1 : 0, STEWARD_OK;
    return STEWARD_ERR_PARAM;
}
int host_param_string(const steward_params* p, const char* key, const char** out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_ERR_NOT_FOUND;
    if (auto s = std::get_if<std::string>(v)) return *out = s->c_str(), STEWARD_OK;
    return STEWARD_ERR_PARAM;
}
void host_log(const steward_params* p, int level, const char* msg) {
    const std::string who = p ? p->kind + " plugin '" + p->plugin + "' (bucket " + p->bucket + ")" : "plugin";
    const char* m = msg ? msg : "";
    switch (level) {
        case 0: spdlog::debug("{}: {}", who, m); break;
        case 1: spdlog::info("{}: {}", who, m); break;
        case 2: spdlog::warn("{}: {}", who, m); break;
        default: spdlog::error("{}: {}", who, m); break;
    }
}

int host_pool_index(const steward_params* p, const char* name, int32_t* out) {
    if (!p || !name || !p->spec) return STEWARD_ERR_NOT_FOUND;
    for (size_t i = 0; i < p->pools.size(); i++)
        if (p->pools[i] == name) return *out = (int32_t)i, STEWARD_OK;
    return STEWARD_ERR_NOT_FOUND;
}

const steward_host_api k_host_api = {
    STEWARD_HOST_API_VERSION, sizeof(steward_host_api), host_param_double, host_param_int, host_param_bool,
    host_param_string,        host_log,                 host_pool_index,
};

template <typename Table>
int call_create(const Table* t, steward_params* params, steward_policy** out, char* err, size_t n) {
    return t->create(&k_host_api, params, out, err, n);
}

std::string param_name_list(const std::set<std::string>& s) {
    std::string out;
    for (const auto& k : s) out += (out.empty() ? "" : ", ") + k;
    return out.empty() ? "none" : out;
}

}  // namespace

PolicyInstance::~PolicyInstance() {
    if (!self_ || !lib_) return;
    switch (lib_->kind()) {
        case PolicyKind::ROUTING: lib_->routing()->destroy(self_); break;
        case PolicyKind::EVICTION: lib_->eviction()->destroy(self_); break;
        case PolicyKind::SPECULATION: lib_->speculation()->destroy(self_); break;
    }
    self_ = nullptr;
}

Expected<bool> PolicyInstance::init(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec, const std::string& bucket,
                                    std::shared_ptr<PolicyCounters> counters, const std::vector<std::string>& pools) {
    lib_ = std::move(lib);
    bucket_ = bucket;
    plugin_ = spec.plugin;
    counters_ = std::move(counters);
    params_ = std::make_unique<steward_params>();
    params_->spec = &spec;
    params_->bucket = bucket;
    params_->plugin = spec.plugin;
    params_->kind = policy_kind_name(lib_->kind());
    params_->pools = pools;
    char err[512] = {0};
    steward_policy* out = nullptr;
    int rc = STEWARD_ERR;
    switch (lib_->kind()) {
        case PolicyKind::ROUTING: rc = call_create(lib_->routing(), params_.get(), &out, err, sizeof err); break;
        case PolicyKind::EVICTION: rc = call_create(lib_->eviction(), params_.get(), &out, err, sizeof err); break;
        case PolicyKind::SPECULATION: rc = call_create(lib_->speculation(), params_.get(), &out, err, sizeof err); break;
    }
    err[sizeof err - 1] = 0;
    const std::string ctx = spec.where + ": bucket '" + bucket + "' " + params_->kind + " plugin '" + spec.plugin + "'";
    if (rc != STEWARD_OK) {
        if (out) self_ = out;  // a plugin that returns an error and an instance: still destroy it
        return make_error(ctx, " refused its parameters: ", err[0] ? err : "create() returned error " + std::to_string(rc));
    }
    if (!out) return make_error(ctx, ": create() returned OK without an instance; the plugin must set *out");
    self_ = out;
    for (const auto& [key, value] : spec.params) {
        if (params_->asked.count(key)) continue;
        auto w = spec.param_where.find(key);
        return make_error(w != spec.param_where.end() ? w->second : spec.where, ": unknown parameter '", key, "' for ",
                          params_->kind, " plugin '", spec.plugin, "' in bucket '", bucket, "'; it reads: ",
                          param_name_list(params_->asked));
    }
    params_->spec = nullptr;  // the spec may go away; later param reads answer NOT_FOUND
    return true;
}

void PolicyInstance::invalid(const std::string& what) {
    counters_->n_invalid++;
    if (!logged_.exchange(true))
        spdlog::warn("{} plugin '{}' (bucket {}): {}; using the safe default (logged once per instance, counted in "
                     "steward:plugin_invalid_decisions_total)",
                     policy_kind_name(lib_->kind()), plugin_, bucket_, what);
}

// ---- routing

Expected<std::unique_ptr<RoutingPolicy>> RoutingPolicy::create(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec,
                                                               const std::string& bucket,
                                                               std::shared_ptr<PolicyCounters> counters,
                                                               const std::vector<std::string>& pools) {
    return make<RoutingPolicy>(std::move(lib), spec, bucket, std::move(counters), pools);
}

RoutingPolicy::~RoutingPolicy() = default;

steward_route_decision RoutingPolicy::route(const steward_route_request& req, const std::vector<steward_pool_view>& pools,
                                            int32_t default_pool, bool* fallback) {
    steward_route_decision safe{default_pool, -1, 0, -1};
    steward_route_decision d = safe;
    *fallback = false;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        counters_->n_calls++;
        rc = lib_->routing()->route(self_, &req, pools.data(), (uint32_t)pools.size(), &d);
    }
    const int32_t n = (int32_t)pools.size();
    auto usable = [&](int32_t i) { return i >= 0 && i < n && pools[i].available; };
    std::string why;
    if (rc != STEWARD_OK)
        why = "route() returned error " + std::to_string(rc);
    else if (!usable(d.pool))
        why = "route() chose pool " + std::to_string(d.pool) + ", which " +
              (d.pool >= 0 && d.pool < n ? "is not available" : "does not exist (" + std::to_string(n) + " pools)");
    else if (d.upgrade_pool != -1 && (!usable(d.upgrade_pool) || d.upgrade_pool == d.pool))
        why = "route() chose upgrade pool " + std::to_string(d.upgrade_pool) + ", which is not another available pool";
    else if (d.upgrade_pool != -1 && d.check_after_tokens <= 0)
        why = "route() set an upgrade pool with check_after_tokens " + std::to_string(d.check_after_tokens) + " (must be > 0)";
    else if (d.shadow_pool != -1 && (!usable(d.shadow_pool) || d.shadow_pool == d.pool))
        why = "route() chose shadow pool " + std::to_string(d.shadow_pool) + ", which is not another available pool";
    else if (d.upgrade_pool != -1 && !has_check_upgrade())
        why = "route() set an upgrade pool but the plugin has no check_upgrade function";
    if (why.empty()) return d;
    invalid(why);
    *fallback = true;
    return safe;
}

bool RoutingPolicy::check_upgrade(const steward_route_request& req, const steward_token_view& tokens, bool* fallback) {
    *fallback = false;
    if (!has_check_upgrade()) return false;
    int32_t up = 0;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        counters_->n_calls++;
        rc = lib_->routing()->check_upgrade(self_, &req, &tokens, &up);
    }
    if (rc != STEWARD_OK || (up != 0 && up != 1)) {
        invalid(rc != STEWARD_OK ? "check_upgrade() returned error " + std::to_string(rc)
                                 : "check_upgrade() answered " + std::to_string(up) + " (must be 0 or 1)");
        *fallback = true;
        return false;
    }
    return up == 1;
}

// ---- eviction

Expected<std::unique_ptr<PluginEvictionPolicy>> PluginEvictionPolicy::create(std::shared_ptr<PluginLibrary> lib,
                                                                             const PolicySpec& spec, const std::string& bucket,
                                                                             std::shared_ptr<PolicyCounters> counters,
                                                                             const std::vector<std::string>& pools) {
    return make<PluginEvictionPolicy>(std::move(lib), spec, bucket, std::move(counters), pools);
}

PluginEvictionPolicy::~PluginEvictionPolicy() = default;

size_t PluginEvictionPolicy::choose_victim(const EvictionContext& ctx, std::span<const EvictionCandidate> candidates) {
    uint32_t victim = 0;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        // The C views are rebuilt in buffers kept across calls (no allocation per eviction).
        cands_.resize(candidates.size());
        for (size_t i = 0; i < candidates.size(); i++) {
            const EvictionCandidate& e = candidates[i];
            cands_[i] = {e.block, e.tenant, e.is_public ? 1 : 0, e.depth, e.last_access_tick, e.n_hits};
        }
        tenants_.resize(ctx.tenants.size());
        for (size_t i = 0; i < ctx.tenants.size(); i++)
            tenants_[i] = {ctx.tenants[i].tenant, ctx.tenants[i].n_held, ctx.tenants[i].quota_blocks};
        const steward_evict_context cx{ctx.now_tick,          ctx.n_blocks_total, ctx.block_size,
                                       ctx.block_bytes,       ctx.requesting_tenant, tenants_.data(),
                                       (uint32_t)tenants_.size()};
        counters_->n_calls++;
        rc = lib_->eviction()->choose_victim(self_, &cx, cands_.data(), (uint32_t)cands_.size(), &victim);
    }
    if (rc != STEWARD_OK) {
        invalid("choose_victim() returned error " + std::to_string(rc));
        return 0;
    }
    if (victim >= candidates.size()) {
        invalid("choose_victim() chose index " + std::to_string(victim) + " of " + std::to_string(candidates.size()) +
                " candidates (only evictable, unreferenced blocks may be chosen)");
        return 0;
    }
    return victim;
}

// ---- speculation

Expected<std::unique_ptr<SpeculationPolicy>> SpeculationPolicy::create(std::shared_ptr<PluginLibrary> lib,
                                                                       const PolicySpec& spec, const std::string& bucket,
                                                                       std::shared_ptr<PolicyCounters> counters,
                                                                       const std::vector<std::string>& pools) {
    return make<SpeculationPolicy>(std::move(lib), spec, bucket, std::move(counters), pools);
}

SpeculationPolicy::~SpeculationPolicy() = default;

int32_t SpeculationPolicy::draft_budget(const steward_spec_stats& stats, bool* fallback) {
    *fallback = false;
    int32_t b = 0;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        counters_->n_calls++;
        rc = lib_->speculation()->draft_budget(self_, &stats, &b);
    }
    if (rc != STEWARD_OK || b < 0 || b > stats.max_budget) {
        invalid(rc != STEWARD_OK ? "draft_budget() returned error " + std::to_string(rc)
                                 : "draft_budget() answered " + std::to_string(b) + ", outside [0, " +
                                       std::to_string(stats.max_budget) + "] (limits.max_draft_tokens)");
        *fallback = true;
        return 0;
    }
    return b;
}

}  // namespace steward
