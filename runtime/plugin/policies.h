// Host-side policy instances (`pools`: the generation's pool names, for the host API's
// pool_index): one per bucket and kind, created from the bucket's TOML parameters
// on a loaded plugin library. Every decision is validated; an error code or an invalid answer is
// logged once per instance, counted, and replaced by the safe default.
#pragma once
#include <steward/policy.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "kv/block_pool.h"
#include "plugin/decision_worker.h"
#include "plugin/plugin_call.h"
#include "plugin/plugin_loader.h"
#include "plugin/route.h"
#include "sched/spec_policy.h"

struct steward_params;  // defined in policies.cpp (opaque to plugins)

namespace steward {

// Decision counts of one (bucket, kind, plugin). Shared by the instances of successive config
// generations, so the figures survive reloads.
struct PolicyCounters {
    std::string bucket, kind, plugin;
    std::atomic<int64_t> n_calls{0};
    std::atomic<int64_t> n_invalid{0};  // error codes and rejected decisions (safe default used)
    std::atomic<int64_t> n_declined{0}; // eviction: "no victim" answers (an ordinary outcome, not invalid)
    std::atomic<int64_t> n_outcomes{0}; // routing: on_outcome calls
    // Decisions answered by the safe default because the plugin did not answer within the budget: the
    // call that overran, and every call made while that abandoned call was still running.
    std::atomic<int64_t> n_timed_out{0};
    // isolation = "process" (plugin/plugin_process.h): the instance's plugin host process ended (a
    // crash, an exit, a garbled answer, or killed after overrunning a budget); it was restarted; and
    // decisions answered by the safe default because it had died (the call that found it dead, and
    // every call while it was down).
    std::atomic<int64_t> n_crashed{0};
    std::atomic<int64_t> n_restarts{0};
    std::atomic<int64_t> n_unavailable{0};
};

// Where an instance's plugin runs (PluginIsolation, config.h); for PROCESS, how long create() may take
// in the plugin host.
struct InstanceIsolation {
    PluginIsolation where = PluginIsolation::IN_PROCESS;
    double create_timeout_ms = 5000;
};

class PluginProcess;

struct PolicyCore;  // the plugin's instance and the in-flight call's inputs and outputs (policies.cpp)

// What every instance shares: the library, the plugin's instance pointer, a lock (the ABI promises
// one call at a time per instance), counters and the logged-once flag.
//
// Time budget (set_budget_ms; 0 = none, the default for an instance made directly): each decision runs
// on the instance's own worker thread and the caller waits at most the budget. Past it the caller gets
// the safe default, counted in n_timed_out; the abandoned call runs on (on copies of its inputs) and,
// until it returns, every further call gets the safe default at once. So a plugin that sleeps or loops
// delays its caller by one budget, then by nothing; it never stalls the router or an engine step for
// longer. A plugin that never returns keeps one thread (and its library) until the process exits.
//
// Isolated (InstanceIsolation PROCESS): the plugin's instance lives in a plugin host process
// (plugin/plugin_process.h) and each decision is sent there with the same slots, waiting at most the
// budget; a crash or an overrun answers the safe default and the host is restarted. Validation and
// counting stay here, so both modes answer alike.
class PolicyInstance {
public:
    virtual ~PolicyInstance();
    PolicyInstance(const PolicyInstance&) = delete;
    PolicyInstance& operator=(const PolicyInstance&) = delete;

    const std::string& bucket() const { return bucket_; }
    const std::string& plugin() const { return plugin_; }  // as the config names it
    const PluginLibrary& library() const { return *lib_; }
    const std::shared_ptr<PolicyCounters>& counters() const { return counters_; }
    void set_budget_ms(double ms) { budget_ms_ = ms; }
    // The budget of the calls an engine step makes (a speculation policy's per-sequence asks; an
    // eviction policy's budget is set_budget_ms's); unset: budget_ms.
    void set_step_budget_ms(double ms) { step_budget_ms_ = ms; }
    double budget_ms() const { return budget_ms_; }
    bool busy() const { return worker_.busy(); }  // an abandoned call is still running
    bool isolated() const { return proc_ != nullptr; }  // in a plugin host process
    PluginProcess* process() const { return proc_.get(); }
    // The plugin's own instance (in-process only; null when isolated), for the plugin host, which
    // calls it through PluginCall::invoke.
    steward_policy* plugin_self() const;

protected:
    PolicyInstance() = default;
    // Creates the plugin's instance; fails with the plugin's message or an unknown-parameter error.
    Expected<bool> init(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec, const std::string& bucket,
                        std::shared_ptr<PolicyCounters> counters, const std::vector<std::string>& pools,
                        const InstanceIsolation& iso);
    // What every kind's create() does: a new P, initialised, or the error.
    template <typename P>
    static Expected<std::unique_ptr<P>> make(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec,
                                             const std::string& bucket, std::shared_ptr<PolicyCounters> counters,
                                             const std::vector<std::string>& pools, const InstanceIsolation& iso) {
        std::unique_ptr<P> p(new P());
        auto ok = p->init(std::move(lib), spec, bucket, std::move(counters), pools, iso);
        if (!ok) return ok.error();
        return p;
    }
    // Counts an invalid answer; logs the first one of this instance.
    void invalid(const std::string& what);
    // Runs `call` (which must touch only what it captures by value, e.g. core_) under the budget, with
    // mu_ held by the caller. False: the safe default is to be used (timed out or busy; counted, logged
    // once) and the call's outputs in core_ must not be read.
    // budget_ms < 0: the instance's budget_ms.
    bool call_plugin(const char* fn, std::function<void()> call, double budget_ms = -1);
    // Runs op on the slots in core_ (mu_ held, core_ filled): in the plugin host when isolated (a
    // dead or overrunning host answers false: the safe default, counted there), else through
    // call_plugin on the worker.
    bool call_op(const char* fn, PluginOp op, double budget_ms = -1);

    std::shared_ptr<PluginLibrary> lib_;
    std::shared_ptr<PolicyCore> core_;  // shared with an abandoned call
    std::mutex mu_;
    std::string bucket_, plugin_;
    std::shared_ptr<PolicyCounters> counters_;
    std::atomic<bool> logged_{false}, logged_timeout_{false};
    double budget_ms_ = 0;
    double step_budget_ms_ = -1;
    DecisionWorker worker_;  // declared after core_: stopped (or left to an abandoned call) first
    std::unique_ptr<PluginProcess> proc_;  // isolation = "process": the plugin host (else null)
};

class RoutingPolicy : public PolicyInstance {
public:
    static Expected<std::unique_ptr<RoutingPolicy>> create(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec,
                                                           const std::string& bucket,
                                                           std::shared_ptr<PolicyCounters> counters,
                                                           const std::vector<std::string>& pools,
                                                           const InstanceIsolation& iso = {});
    // The plugin's decision (route_v2 when it has one, else route), validated against `pools`; when it
    // is rejected, the default (start on default_pool, no upgrade, no shadow) and *fallback = true.
    // in.n_cached_prompt_tokens and in.pool_loads may be shorter than pools (the rest read unknown).
    // Thread-safe.
    steward_route_decision route(const RouteInput& in, const std::vector<steward_pool_view>& pools, int32_t default_pool,
                                 bool* fallback);
    bool has_check_upgrade() const { return lib_->routing()->check_upgrade != nullptr; }
    // Whether to upgrade after the first tokens; an error answers false with *fallback = true.
    bool check_upgrade(const RouteInput& in, const steward_token_view& tokens, bool* fallback);
    bool has_outcome() const { return lib_->routing()->on_outcome != nullptr; }
    // Tells the plugin how a request it routed ended (no-op without on_outcome); an error is logged
    // once, not counted as an invalid decision (nothing was decided).
    void on_outcome(const RouteInput& in, const RouteOutcome& outcome);
    ~RoutingPolicy() override;
};

class PluginEvictionPolicy : public PolicyInstance, public EvictionPolicy {
public:
    static Expected<std::unique_ptr<PluginEvictionPolicy>> create(std::shared_ptr<PluginLibrary> lib,
                                                                  const PolicySpec& spec, const std::string& bucket,
                                                                  std::shared_ptr<PolicyCounters> counters,
                                                                  const std::vector<std::string>& pools,
                                                           const InstanceIsolation& iso = {});
    // choose_victim_v2 when the plugin has it (with this bucket's name and the tenants' names from
    // ctx.tenant_names), else choose_victim. An invalid index or an error code answers 0 (least
    // recently used) and is counted as invalid; STEWARD_EVICT_NO_VICTIM from choose_victim_v2 answers
    // k_no_victim and is counted as declined.
    size_t choose_victim(const EvictionContext& ctx, std::span<const EvictionCandidate> candidates) override;
    ~PluginEvictionPolicy() override;
};

// SpecSeqStats (sched/spec_policy.h): what the engine passes per sequence and step.
class SpeculationPolicy : public PolicyInstance, public DraftBudgetPolicy {
public:
    static Expected<std::unique_ptr<SpeculationPolicy>> create(std::shared_ptr<PluginLibrary> lib,
                                                               const PolicySpec& spec, const std::string& bucket,
                                                               std::shared_ptr<PolicyCounters> counters,
                                                               const std::vector<std::string>& pools,
                                                           const InstanceIsolation& iso = {});
    // The per-bucket budget (ABI 1's question), validated to [0, stats.max_budget]; else 0 and
    // *fallback = true. A plugin with only draft_budget_seq is asked for a sequence at position 0.
    int32_t draft_budget(const steward_spec_stats& stats, bool* fallback);
    // One sequence's budget for the next step, validated to [0, seq.max_budget]; else 0 and *fallback
    // = true. A v1 plugin (no draft_budget_seq) answers through draft_budget with the figures the
    // sequence gives (see policy.h). Thread-safe; one call per sequence per step.
    int32_t draft_budget_seq(const SpecSeqStats& seq, bool* fallback) override;
    // A step's sequences in one call on the decision thread, under one budget for the lot (a time-out
    // or a busy thread answers every one the safe default, each counted); one at a time when the
    // instance lives in a plugin host process.
    void draft_budgets(std::span<const SpecSeqStats> seqs, std::span<int32_t> out, std::span<uint8_t> fallback) override;
    ~SpeculationPolicy() override;

private:
    int32_t ask(const steward_spec_stats* stats, const SpecSeqStats& seq, bool* fallback, double budget_ms);
    double step_budget() const { return step_budget_ms_ >= 0 ? step_budget_ms_ : budget_ms_; }
    int32_t checked(int rc, int32_t b, const SpecSeqStats& seq, bool per_bucket, bool* fallback);
};

}  // namespace steward
