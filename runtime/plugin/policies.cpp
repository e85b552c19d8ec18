// Policy instances over the C ABI: the host API a plugin reads its parameters through, creation,
// and the validation of every decision (invalid -> counted, logged once, safe default). Each call goes
// to the newest function the plugin's table has (route_v2, choose_victim_v2, draft_budget_seq).
#include "plugin/policies.h"

#include "plugin/plugin_process.h"

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

// The plugin's instance and the one call in flight: its inputs are copied here (strings and arrays
// included) before the call and its outputs read from here after it, so an abandoned call reads and
// writes only memory it keeps alive. Only one call at a time touches the slots (the worker refuses a
// second while one runs). destroy() runs when the last owner (the instance, or an abandoned call that
// finally returned) lets go.
struct PolicyCore : PluginCall {
    std::shared_ptr<PluginLibrary> lib;
    steward_policy* self = nullptr;  // null when the instance lives in a plugin host process
    std::unique_ptr<steward_params> params;

    ~PolicyCore() {
        if (!self || !lib) return;
        switch (lib->kind()) {
            case PolicyKind::ROUTING: lib->routing()->destroy(self); break;
            case PolicyKind::EVICTION: lib->eviction()->destroy(self); break;
            case PolicyKind::SPECULATION: lib->speculation()->destroy(self); break;
        }
    }
};

namespace {

const PolicyParam* find_param(const steward_params* p, const char* key) {
    if (!p || !key || !p->spec) return nullptr;
    p->asked.insert(key);
    auto it = p->spec->params.find(key);
    return it == p->spec->params.end() ? nullptr : &it->second;
}

int host_param_double(const steward_params* p, const char* key, double* out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto d = std::get_if<double>(v)) return *out = *d, STEWARD_PLUGIN_OK;
    if (auto i = std::get_if<int64_t>(v)) return *out = (double)*i, STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
int host_param_int(const steward_params* p, const char* key, int64_t* out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto i = std::get_if<int64_t>(v)) return *out = *i, STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
int host_param_bool(const steward_params* p, const char* key, int* out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto b = std::get_if<bool>(v)) return *out = *b ? 1 : 0, STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
}
int host_param_string(const steward_params* p, const char* key, const char** out) {
    const PolicyParam* v = find_param(p, key);
    if (!v) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    if (auto s = std::get_if<std::string>(v)) return *out = s->c_str(), STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_PARAM;
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
    if (!p || !name || !p->spec) return STEWARD_PLUGIN_ERR_NOT_FOUND;
    for (size_t i = 0; i < p->pools.size(); i++)
        if (p->pools[i] == name) return *out = (int32_t)i, STEWARD_PLUGIN_OK;
    return STEWARD_PLUGIN_ERR_NOT_FOUND;
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

PolicyInstance::~PolicyInstance() = default;  // worker_ first (see the header), then core_

bool PolicyInstance::call_plugin(const char* fn, std::function<void()> call, double budget_ms) {
    if (budget_ms < 0) budget_ms = budget_ms_;
    if (budget_ms <= 0) {
        call();
        return true;
    }
    const DecisionWorker::Result r = worker_.run(std::move(call), budget_ms);
    if (r == DecisionWorker::Result::DONE) return true;
    counters_->n_timed_out++;
    if (!logged_timeout_.exchange(true))
        spdlog::warn("{} plugin '{}' (bucket {}): {} {}; using the safe default, and for every call until it returns "
                     "(logged once per instance, counted in steward_plugin_timed_out_decisions_total)",
                     policy_kind_name(lib_->kind()), plugin_, bucket_, fn,
                     r == DecisionWorker::Result::BUSY ? "is still running from an earlier call"
                                                       : "did not answer within its budget of " + std::to_string((int)budget_ms) + " ms");
    return false;
}

bool PolicyInstance::call_op(const char* fn, PluginOp op, double budget_ms) {
    if (budget_ms < 0) budget_ms = budget_ms_;
    if (!proc_) return call_plugin(fn, [core = core_, op] { core->invoke(*core->lib, core->self, op); }, budget_ms);
    switch (proc_->call(op, *core_, budget_ms)) {
        case PluginProcess::Result::DONE: return true;
        case PluginProcess::Result::TIMED_OUT: counters_->n_timed_out++; return false;  // the process logged it
        case PluginProcess::Result::FAILED:
        case PluginProcess::Result::DOWN: return false;  // counted and logged by the process
    }
    return false;
}

steward_policy* PolicyInstance::plugin_self() const { return core_ ? core_->self : nullptr; }

Expected<bool> PolicyInstance::init(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec, const std::string& bucket,
                                    std::shared_ptr<PolicyCounters> counters, const std::vector<std::string>& pools,
                                    const InstanceIsolation& iso) {
    lib_ = std::move(lib);
    bucket_ = bucket;
    plugin_ = spec.plugin;
    counters_ = std::move(counters);
    core_ = std::make_shared<PolicyCore>();
    core_->lib = lib_;
    core_->params = std::make_unique<steward_params>();
    auto& params_ = core_->params;
    params_->spec = &spec;
    params_->bucket = bucket;
    params_->plugin = spec.plugin;
    params_->kind = policy_kind_name(lib_->kind());
    params_->pools = pools;
    if (iso.where == PluginIsolation::PROCESS) {
        // create() runs in the plugin host (the same code as below, there); params_ stays for the bucket
        // name the eviction request carries.
        auto proc = PluginProcess::start({lib_, spec, bucket, pools, counters_, iso.create_timeout_ms});
        if (!proc) return proc.error();
        proc_ = std::move(*proc);
        params_->spec = nullptr;
        return true;
    }
    char err[512] = {0};
    steward_policy* out = nullptr;
    int rc = STEWARD_PLUGIN_ERR;
    switch (lib_->kind()) {
        case PolicyKind::ROUTING: rc = call_create(lib_->routing(), params_.get(), &out, err, sizeof err); break;
        case PolicyKind::EVICTION: rc = call_create(lib_->eviction(), params_.get(), &out, err, sizeof err); break;
        case PolicyKind::SPECULATION: rc = call_create(lib_->speculation(), params_.get(), &out, err, sizeof err); break;
    }
    err[sizeof err - 1] = 0;
    const std::string ctx = spec.where + ": bucket '" + bucket + "' " + params_->kind + " plugin '" + spec.plugin + "'";
    if (rc != STEWARD_PLUGIN_OK) {
        if (out) core_->self = out;  // a plugin that returns an error and an instance: still destroy it
        return make_error(ctx, " refused its parameters: ", err[0] ? err : "create() returned error " + std::to_string(rc));
    }
    if (!out) return make_error(ctx, ": create() returned OK without an instance; the plugin must set *out");
    core_->self = out;
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
                     "steward_plugin_invalid_decisions_total)",
                     policy_kind_name(lib_->kind()), plugin_, bucket_, what);
}

// ---- routing

Expected<std::unique_ptr<RoutingPolicy>> RoutingPolicy::create(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec,
                                                               const std::string& bucket,
                                                               std::shared_ptr<PolicyCounters> counters,
                                                               const std::vector<std::string>& pools, const InstanceIsolation& iso) {
    return make<RoutingPolicy>(std::move(lib), spec, bucket, std::move(counters), pools, iso);
}

RoutingPolicy::~RoutingPolicy() = default;

namespace {

int32_t finish_code(FinishReason r) {
    switch (r) {
        case FinishReason::STOP: return STEWARD_FINISH_STOP;
        case FinishReason::LENGTH: return STEWARD_FINISH_LENGTH;
        case FinishReason::CANCELLED: return STEWARD_FINISH_CANCELLED;
        case FinishReason::TIMEOUT: return STEWARD_FINISH_TIMEOUT;
        case FinishReason::ERROR: return STEWARD_FINISH_ERROR;
        case FinishReason::OVERLOADED: return STEWARD_FINISH_OVERLOADED;
    }
    return STEWARD_FINISH_ERROR;
}

}  // namespace

steward_route_decision RoutingPolicy::route(const RouteInput& in, const std::vector<steward_pool_view>& pools,
                                            int32_t default_pool, bool* fallback) {
    steward_route_decision safe{default_pool, -1, 0, -1};
    *fallback = false;
    const steward_routing_table& t = *lib_->routing();
    const char* fn = t.route_v2 ? "route_v2()" : "route()";
    steward_route_decision d = safe;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (worker_.busy()) {  // an abandoned call still owns the slots: do not touch them
            call_plugin(fn, [] {});
            *fallback = true;
            return safe;
        }
        PolicyCore& c = *core_;
        c.in = in;
        c.pools = pools;
        c.pool_names.resize(pools.size());
        for (size_t i = 0; i < pools.size(); i++) {
            c.pool_names[i] = pools[i].name ? pools[i].name : "";
            c.pools[i].name = c.pool_names[i].c_str();
        }
        c.point_route_views(pools.size());
        c.d = safe;
        counters_->n_calls++;
        if (!call_op(fn, PluginOp::ROUTE)) {
            *fallback = true;
            return safe;
        }
        rc = c.rc;
        d = c.d;
    }
    const int32_t n = (int32_t)pools.size();
    auto usable = [&](int32_t i) { return i >= 0 && i < n && pools[i].available; };
    std::string why;
    if (rc != STEWARD_PLUGIN_OK)
        why = std::string(fn) + " returned error " + std::to_string(rc);
    else if (!usable(d.pool))
        why = std::string(fn) + " chose pool " + std::to_string(d.pool) + ", which " +
              (d.pool >= 0 && d.pool < n ? "is not available" : "does not exist (" + std::to_string(n) + " pools)");
    else if (d.upgrade_pool != -1 && (!usable(d.upgrade_pool) || d.upgrade_pool == d.pool))
        why = std::string(fn) + " chose upgrade pool " + std::to_string(d.upgrade_pool) + ", which is not another available pool";
    else if (d.upgrade_pool != -1 && d.check_after_tokens <= 0)
        why = std::string(fn) + " set an upgrade pool with check_after_tokens " + std::to_string(d.check_after_tokens) + " (must be > 0)";
    else if (d.shadow_pool != -1 && (!usable(d.shadow_pool) || d.shadow_pool == d.pool))
        why = std::string(fn) + " chose shadow pool " + std::to_string(d.shadow_pool) + ", which is not another available pool";
    else if (d.upgrade_pool != -1 && !has_check_upgrade())
        why = std::string(fn) + " set an upgrade pool but the plugin has no check_upgrade function";
    if (why.empty()) return d;
    invalid(why);
    *fallback = true;
    return safe;
}

bool RoutingPolicy::check_upgrade(const RouteInput& in, const steward_token_view& tokens, bool* fallback) {
    *fallback = false;
    if (!has_check_upgrade()) return false;
    int32_t up = 0;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (worker_.busy()) {
            call_plugin("check_upgrade()", [] {});
            *fallback = true;
            return false;
        }
        PolicyCore& c = *core_;
        c.in = in;
        c.point_route_views(0);
        c.tokens.assign(tokens.tokens, tokens.tokens + (tokens.tokens ? tokens.n : 0));
        c.logprobs.assign(tokens.logprobs, tokens.logprobs + (tokens.logprobs ? tokens.n : 0));
        c.token_view = steward_token_view{tokens.tokens ? c.tokens.data() : nullptr, tokens.logprobs ? c.logprobs.data() : nullptr,
                                          tokens.n, tokens.finished};
        c.up = 0;
        counters_->n_calls++;
        if (!call_op("check_upgrade()", PluginOp::CHECK_UPGRADE)) {
            *fallback = true;
            return false;
        }
        rc = c.rc;
        up = c.up;
    }
    if (rc != STEWARD_PLUGIN_OK || (up != 0 && up != 1)) {
        invalid(rc != STEWARD_PLUGIN_OK ? "check_upgrade() returned error " + std::to_string(rc)
                                        : "check_upgrade() answered " + std::to_string(up) + " (must be 0 or 1)");
        *fallback = true;
        return false;
    }
    return up == 1;
}

void RoutingPolicy::on_outcome(const RouteInput& in, const RouteOutcome& o) {
    if (!has_outcome()) return;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (worker_.busy()) {  // nothing is decided: the outcome is dropped, counted as timed out
            call_plugin("on_outcome()", [] {});
            return;
        }
        PolicyCore& c = *core_;
        c.in = in;
        c.point_route_views(0);
        steward_route_outcome& out = c.outcome;
        out = steward_route_outcome{};
        out.size = sizeof out;
        out.pool = o.pool;
        out.finish_reason = finish_code(o.finish);
        out.upgraded = o.upgraded ? 1 : 0;
        out.n_prompt_tokens = o.n_prompt_tokens;
        out.n_cached_prompt_tokens = o.n_cached_prompt_tokens;
        out.n_output_tokens = o.n_output_tokens;
        out.ttft_ms = o.ttft_ms;
        out.tpot_ms = o.tpot_ms;
        out.e2e_ms = o.e2e_ms;
        out.cost = o.cost;
        counters_->n_outcomes++;
        if (!call_op("on_outcome()", PluginOp::ON_OUTCOME)) return;
        rc = c.rc;
    }
    if (rc != STEWARD_PLUGIN_OK && !logged_.exchange(true))
        spdlog::warn("routing plugin '{}' (bucket {}): on_outcome() returned error {} (logged once per instance)", plugin_, bucket_, rc);
}

// ---- eviction

Expected<std::unique_ptr<PluginEvictionPolicy>> PluginEvictionPolicy::create(std::shared_ptr<PluginLibrary> lib,
                                                                             const PolicySpec& spec, const std::string& bucket,
                                                                             std::shared_ptr<PolicyCounters> counters,
                                                                             const std::vector<std::string>& pools, const InstanceIsolation& iso) {
    return make<PluginEvictionPolicy>(std::move(lib), spec, bucket, std::move(counters), pools, iso);
}

PluginEvictionPolicy::~PluginEvictionPolicy() = default;

size_t PluginEvictionPolicy::choose_victim(const EvictionContext& ctx, std::span<const EvictionCandidate> candidates) {
    const steward_eviction_table& t = *lib_->eviction();
    const char* fn = t.choose_victim_v2 ? "choose_victim_v2()" : "choose_victim()";
    uint32_t victim = 0;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (worker_.busy()) {
            call_plugin(fn, [] {});
            return 0;  // least recently used
        }
        // The C views are rebuilt in the core's buffers, kept across calls (no allocation per eviction).
        PolicyCore& c = *core_;
        c.cands.resize(candidates.size());
        for (size_t i = 0; i < candidates.size(); i++) {
            const EvictionCandidate& e = candidates[i];
            c.cands[i] = {e.block, e.tenant, e.is_public ? 1 : 0, e.depth, e.last_access_tick, e.n_hits};
        }
        c.reuse_priority.resize(candidates.size());
        for (size_t i = 0; i < candidates.size(); i++) c.reuse_priority[i] = candidates[i].reuse_priority;
        c.tenants.resize(ctx.tenants.size());
        for (size_t i = 0; i < ctx.tenants.size(); i++)
            c.tenants[i] = {ctx.tenants[i].tenant, ctx.tenants[i].n_held, ctx.tenants[i].quota_blocks};
        c.ecx = steward_evict_context{ctx.now_tick,          ctx.n_blocks_total, ctx.block_size,
                                      ctx.block_bytes,       ctx.requesting_tenant, c.tenants.data(),
                                      (uint32_t)c.tenants.size()};
        if (t.choose_victim_v2) {
            auto name_of = [&](int32_t id) -> const char* {
                return ctx.tenant_names && id >= 0 && (size_t)id < ctx.tenant_names->size() ? (*ctx.tenant_names)[id].c_str() : "";
            };
            c.tenant_name_store.resize(ctx.tenants.size());
            c.tenant_names.resize(ctx.tenants.size());
            for (size_t i = 0; i < ctx.tenants.size(); i++) c.tenant_name_store[i] = name_of(ctx.tenants[i].tenant);
            for (size_t i = 0; i < ctx.tenants.size(); i++) c.tenant_names[i] = c.tenant_name_store[i].c_str();
            c.requesting_tenant = name_of(ctx.requesting_tenant);
            c.erq = steward_evict_request{sizeof(steward_evict_request), c.params->bucket.c_str(), c.requesting_tenant.c_str(),
                                          c.tenant_names.data(), (int32_t)ctx.tier, c.reuse_priority.data()};
        }
        c.victim = 0;
        counters_->n_calls++;
        if (!call_op(fn, PluginOp::CHOOSE_VICTIM)) return 0;
        rc = c.rc;
        victim = c.victim;
    }
    if (rc != STEWARD_PLUGIN_OK) {
        invalid(std::string(fn) + " returned error " + std::to_string(rc));
        return 0;
    }
    if (t.choose_victim_v2 && victim == STEWARD_EVICT_NO_VICTIM) {
        counters_->n_declined++;
        return k_no_victim;
    }
    if (victim >= candidates.size()) {
        invalid(std::string(fn) + " chose index " + std::to_string(victim) + " of " + std::to_string(candidates.size()) +
                " candidates (only evictable, unreferenced blocks may be chosen)");
        return 0;
    }
    return victim;
}

// ---- speculation

Expected<std::unique_ptr<SpeculationPolicy>> SpeculationPolicy::create(std::shared_ptr<PluginLibrary> lib,
                                                                       const PolicySpec& spec, const std::string& bucket,
                                                                       std::shared_ptr<PolicyCounters> counters,
                                                                       const std::vector<std::string>& pools, const InstanceIsolation& iso) {
    return make<SpeculationPolicy>(std::move(lib), spec, bucket, std::move(counters), pools, iso);
}

SpeculationPolicy::~SpeculationPolicy() = default;

namespace {

steward_spec_seq seq_view(const SpecSeqStats& q) {
    steward_spec_seq v{};
    v.size = sizeof v;
    v.request_id = q.request_id;
    v.bucket = q.bucket ? q.bucket : "";
    v.tenant = q.tenant ? q.tenant : "";
    v.max_budget = q.max_budget;
    v.last_budget = q.last_budget;
    v.position = q.position;
    v.n_generated = q.n_generated;
    v.max_tokens = q.max_tokens;
    v.batch_size = q.batch_size;
    v.n_steps = q.n_steps;
    v.n_proposed = q.n_proposed;
    v.n_accepted = q.n_accepted;
    v.recent_acceptance = q.recent_acceptance;
    v.temperature = q.temperature;
    v.accept_pos = q.accept_pos;
    v.n_accept_pos = q.accept_pos ? q.n_accept_pos : 0;
    v.bucket_accept_pos = q.bucket_accept_pos;
    v.n_bucket_accept_pos = q.bucket_accept_pos ? q.n_bucket_accept_pos : 0;
    v.draft_ms_per_token = q.draft_ms_per_token;
    v.verify_ms = q.verify_ms;
    v.verify_ms_per_token = q.verify_ms_per_token;
    v.plain_step_ms = q.plain_step_ms;
    v.draft_source = q.draft_source;
    v.draft_catch_up_tokens = q.draft_catch_up_tokens;
    v.draft_catch_up_ms = q.draft_catch_up_ms;
    return v;
}

}  // namespace

int32_t SpeculationPolicy::draft_budget(const steward_spec_stats& stats, bool* fallback) {
    SpecSeqStats q;
    q.bucket = bucket_.c_str();
    q.max_budget = stats.max_budget;
    q.last_budget = stats.last_budget;
    q.batch_size = stats.batch_size;
    return ask(&stats, q, fallback, budget_ms_);
}

int32_t SpeculationPolicy::draft_budget_seq(const SpecSeqStats& seq, bool* fallback) {
    return ask(nullptr, seq, fallback, step_budget());
}

namespace {

// The slots of one speculation question (a PluginCall's, or one entry of a step's batch): the C view
// and the storage it points into, named as PluginCall names them.
struct SpecSlots {
    std::string spec_bucket, spec_tenant;
    std::vector<double> spec_accept, spec_bucket_accept;
    steward_spec_seq seq{};
    steward_spec_stats stats{};
};

// Fills c's slots for seq (and the per-bucket question when stats is not null). The arrays are copied
// too: an abandoned call keeps reading them after the caller returns (capacity is kept, so a steady
// state allocates nothing).
template <typename Slots>
void fill_spec_slots(Slots& c, const steward_spec_stats* stats, const SpecSeqStats& seq) {
    c.spec_bucket = seq.bucket ? seq.bucket : "";
    c.spec_tenant = seq.tenant ? seq.tenant : "";
    c.seq = seq_view(seq);
    c.seq.bucket = c.spec_bucket.c_str();
    c.seq.tenant = c.spec_tenant.c_str();
    c.spec_accept.assign(seq.accept_pos, seq.accept_pos + c.seq.n_accept_pos);
    c.spec_bucket_accept.assign(seq.bucket_accept_pos, seq.bucket_accept_pos + c.seq.n_bucket_accept_pos);
    c.seq.accept_pos = c.spec_accept.empty() ? nullptr : c.spec_accept.data();
    c.seq.bucket_accept_pos = c.spec_bucket_accept.empty() ? nullptr : c.spec_bucket_accept.data();
    if (stats) {
        c.stats = *stats;
    } else {
        // ABI 1: the per-bucket question, with what one sequence's history says.
        c.stats = steward_spec_stats{};
        c.stats.max_budget = seq.max_budget;
        c.stats.last_budget = seq.last_budget;
        c.stats.batch_size = seq.batch_size;
        c.stats.n_steps = seq.n_steps;
        c.stats.mean_accepted = seq.n_steps > 0 ? (double)seq.n_accepted / (double)seq.n_steps : 0.0;
    }
}

}  // namespace

// The answer rc / b to seq's question, validated; else 0 and *fallback (counted, logged once).
int32_t SpeculationPolicy::checked(int rc, int32_t b, const SpecSeqStats& seq, bool per_bucket, bool* fallback) {
    if (rc != STEWARD_PLUGIN_OK || b < 0 || b > seq.max_budget) {
        invalid(rc != STEWARD_PLUGIN_OK ? "draft budget call returned error " + std::to_string(rc)
                : "draft budget " + std::to_string(b) + (per_bucket ? std::string() : " for request " + std::to_string(seq.request_id)) +
                      " is outside [0, " + std::to_string(seq.max_budget) + "] (limits.max_draft_tokens)");
        *fallback = true;
        return 0;
    }
    return b;
}

// stats: the per-bucket question (ABI 1's draft_budget) when not null, else one sequence's.
int32_t SpeculationPolicy::ask(const steward_spec_stats* stats, const SpecSeqStats& seq, bool* fallback, double budget_ms) {
    *fallback = false;
    int32_t b = 0;
    int rc;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (worker_.busy()) {
            call_plugin("draft budget call", [] {});
            *fallback = true;
            return 0;
        }
        PolicyCore& c = *core_;
        fill_spec_slots(c, stats, seq);
        c.budget = 0;
        counters_->n_calls++;
        if (!call_op("draft budget call", PluginOp::DRAFT_BUDGET, budget_ms)) {
            *fallback = true;
            return 0;
        }
        rc = c.rc;
        b = c.budget;
    }
    return checked(rc, b, seq, stats != nullptr, fallback);
}

// One job on the decision thread for the whole step, under one budget: the questions are copied into
// the job's own storage (an abandoned job keeps reading them), the answers read back only when it
// finished in time. A plugin host process is asked one question at a time (its own round trips).
void SpeculationPolicy::draft_budgets(std::span<const SpecSeqStats> seqs, std::span<int32_t> out, std::span<uint8_t> fallback) {
    if (proc_ || seqs.size() <= 1) return DraftBudgetPolicy::draft_budgets(seqs, out, fallback);
    struct Batch {
        std::vector<SpecSlots> q;
        std::vector<int> rc;
        std::vector<int32_t> budget;
    };
    auto batch = std::make_shared<Batch>();
    batch->q.resize(seqs.size());  // sized first: the views point into the entries
    for (size_t i = 0; i < seqs.size(); i++) fill_spec_slots(batch->q[i], nullptr, seqs[i]);
    batch->rc.assign(seqs.size(), STEWARD_PLUGIN_ERR);
    batch->budget.assign(seqs.size(), 0);
    bool ok;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (worker_.busy()) {  // an abandoned call still owns the slots (not a call: as in ask)
            call_plugin("draft budget call", [] {});
            ok = false;
        } else {
            counters_->n_calls += (int64_t)seqs.size();
            ok = call_plugin("draft budgets of a step", [core = core_, batch] {
                for (size_t i = 0; i < batch->q.size(); i++) {
                    core->seq = batch->q[i].seq;
                    core->stats = batch->q[i].stats;
                    core->budget = 0;
                    core->invoke(*core->lib, core->self, PluginOp::DRAFT_BUDGET);
                    batch->rc[i] = core->rc;
                    batch->budget[i] = core->budget;
                }
            }, step_budget());
        }
        // Every question of the batch took the safe default, and each is counted as such.
        if (!ok) counters_->n_timed_out += (int64_t)seqs.size() - 1;
    }
    for (size_t i = 0; i < seqs.size(); i++) {
        bool fb = !ok;
        out[i] = ok ? checked(batch->rc[i], batch->budget[i], seqs[i], false, &fb) : 0;
        fallback[i] = fb ? 1 : 0;
    }
}

}  // namespace steward
