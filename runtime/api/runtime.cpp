// Runtime::Impl: the actor system, the pools (model + engine + executor actor), the router and
// config actors, and the metrics registry. Requests are request actors spawned per submit().
#include <steward/runtime.h>

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <pthread.h>
#include <unordered_map>
#include <sstream>
#include <thread>

#include "actors/actors.hpp"
#include "cpu/plan.h"
#include "sim/sim_clock.h"
#include "actors/shared_state.hpp"
#include "api/config_watcher.h"
#include "api/embed_service.h"
#include "api/reuse_stores.h"
#include "cluster/worker_gate.h"
#include "metrics/histogram.h"
#include "pool/config_check.h"
#include "pool/pool.h"
#include "util/strings.h"

namespace steward {

namespace {

caf::actor_system_config& make_cfg(caf::actor_system_config& cfg, const ClusterConfig& cluster) {
    add_message_types(cfg);
    // CAF's network layer: remote pools (a front) and `steward worker` (a worker) talk through it.
    cfg.load<caf::io::middleman>();
    // With [cluster] TLS keys, a front connects to its workers through CAF's OpenSSL transport, which
    // presents this certificate and requires the worker's to chain to tls_ca (a worker's own side of
    // TLS is its gate's, cluster/worker_gate.h). Keys are the start config's: CAF reads them once.
    if (cluster.tls()) {
        cfg.load<caf::openssl::manager>();
        cfg.openssl_certificate = cluster.tls_cert;
        cfg.openssl_key = cluster.tls_key;
        cfg.openssl_cafile = cluster.tls_ca;
    }
    // Request, router and config actors are light; the executors, and the buckets' plugin deciders,
    // have threads of their own. A quarter of the cores (1 to 8) for the rest: on a big host a request
    // actor that tokenizes a long prompt holds one scheduler thread while the others keep routing and
    // streaming; on a small one (under 8 cores) one thread, and the forward threads keep the rest.
    // An idle one polls its queue once and then sleeps on its condition variable, which an enqueue
    // wakes. CAF's default polls first (aggressively, then 50 us sleeps), and each of those wake-ups
    // takes a core from a forward thread: bench_runtime counted 1,330 context switches a second on
    // the scheduler thread with 10 such sleeps per idle spell, against 245 without them, and the
    // executor and forward threads were switched out 4x and 8x as often (docs/benchmarks.md).
    cfg.set("scheduler.max-threads", (size_t)std::clamp((int)std::thread::hardware_concurrency() / 4, 1, 8));
    cfg.set("work-stealing.aggressive-poll-attempts", 1);
    cfg.set("work-stealing.moderate-poll-attempts", 0);
    return cfg;
}

std::vector<const Pool*> pools_of(const Snapshot& s) {
    std::vector<const Pool*> v;
    for (const auto& p : s.pools) v.push_back(p.get());
    return v;
}

// The options' additions to a config read from the file (at start and at every reload).
void apply_options(Config& c, const RuntimeOptions& o) {
    for (const PublicPrefixConfig& pp : o.extra_public_prefixes) {
        const bool declared = std::any_of(c.public_prefixes.begin(), c.public_prefixes.end(),
                                          [&](const PublicPrefixConfig& q) { return q.name == pp.name; });
        if (!declared) c.public_prefixes.push_back(pp);
    }
}

}  // namespace

// One submit_choices: choices 1..n-1 wait for choice 0's first token (or its finish).
struct ChoiceFanOut {
    GenerationRequest req;  // choice 0's; choice i runs it with seed + i
    std::vector<RequestHandle> ids;
    std::vector<RequestCallbacks> cbs;
    std::mutex mu;
    bool released = false;        // under mu: choices 1..n-1 submitted or answered
    std::vector<bool> cancelled;  // under mu: cancel() before the choice started
    std::atomic<bool> released_hint{false};  // read per token without the lock
};

struct Runtime::Impl {
    caf::actor_system_config cfg;
    std::unique_ptr<caf::actor_system> sys;
    std::shared_ptr<SharedState> shared = std::make_shared<SharedState>();
    ConfigActor config_actor;
    std::atomic<uint64_t> next_id{1};
    std::string config_path;  // "" when started from a Config value
    RuntimeOptions options;   // applied to every reading of config_path
    std::mutex reload_mu;     // one reload at a time
    bool stopping = false;    // under reload_mu: the destructor has begun, no more generations
    std::unique_ptr<ConfigWatcher> watcher;
    WorkerActor worker;       // published to fronts (listen_for_fronts), or null
    uint16_t worker_port = 0;  // CAF's middleman, on loopback: only the gate connects to it
    std::unique_ptr<WorkerGate> gate;  // the worker's public port
    // Choices of submit_choices not submitted yet, for cancel().
    std::mutex choices_mu;
    std::unordered_map<RequestHandle, std::weak_ptr<ChoiceFanOut>> waiting_choices;
    // Runtime::embed's threads, one per pool that has embedded (api/embed_service.h).
    std::unique_ptr<EmbedService> embeds = std::make_unique<EmbedService>();
    // Reuse beyond the prefix (docs/reuse.md, api/reuse_stores.h).
    reuse::DocumentStore documents;
    reuse::ToolResultCache tool_results;
    // The documents' sweeper: once a second while documents exist, expired ones are dropped and
    // their KV with them (sweep_documents), so an expiry frees its blocks without any traffic.
    std::mutex sweep_mu;
    std::condition_variable sweep_cv;
    bool sweep_stop = false;
    std::thread sweeper;
    double last_expire_s = 0;  // under sweep_mu

    // Documents that stopped being servable (a new version, a TTL past, a DELETE): their KV blocks
    // are dropped from every pool and its tiers (Engine::invalidate_reuse, by reuse::document_key).
    // Called after every document operation, by each request that names documents and by the
    // sweeper; a full expiry pass at most four times a second.
    void sweep_documents() {
        const double now = reuse_clock_s();
        {
            std::lock_guard<std::mutex> lk(sweep_mu);
            if (!sweeper.joinable() && !sweep_stop)
                sweeper = std::thread([this] {
                    pthread_setname_np(pthread_self(), "steward-docs");
                    std::unique_lock<std::mutex> lk2(sweep_mu);
                    while (!sweep_stop) {
                        sweep_cv.wait_for(lk2, std::chrono::seconds(1));
                        if (sweep_stop) break;
                        lk2.unlock();
                        sweep_documents();
                        lk2.lock();
                    }
                });
            if (now - last_expire_s >= 0.25) {
                last_expire_s = now;
                documents.expire(now);
            }
        }
        const auto gone = documents.take_invalidations();
        if (gone.empty()) return;
        std::vector<uint64_t> keys;
        for (const auto& g : gone) keys.push_back(reuse::document_key(g.tenant, g.id, g.version));
        if (auto snap = shared->snapshot())
            for (const auto& p : snap->pools)
                if (p->executor) caf::anon_send(p->executor, invalidate_atom::value, keys);
    }
    ~Impl() { stop_sweeper(); }
    void stop_sweeper() {
        {
            std::lock_guard<std::mutex> lk(sweep_mu);
            sweep_stop = true;
        }
        sweep_cv.notify_all();
        if (sweeper.joinable()) sweeper.join();
    }

    // A request's documents (GenerationRequest::documents), resolved for its tenant and labels:
    // their keys (reuse::document_key), so that their KV is kept and dropped with them; put before
    // a text prompt, sorted by id, as one block (*chars: its bytes), or left to the render callback
    // (which says where it placed them); the reuse trace names them. The refusal's message
    // otherwise (403 / 404 / 409 in the HTTP API's terms).
    std::optional<std::string> place_documents(GenerationRequest& req, std::vector<uint64_t>& keys, size_t& chars) {
        if (req.documents.empty()) return std::nullopt;
        if (!req.render && !req.prompt_ids.empty())
            return std::string("documents need a text prompt (prompt_ids given): the documents are text");
        std::vector<reuse::DocumentRef> refs;
        for (const auto& d : req.documents)
            refs.push_back({d.id, d.version ? std::optional<uint64_t>(d.version) : std::nullopt});
        reuse::DocumentRefusal refusal;
        auto docs = documents.resolve(req.tenant, req.labels, refs, reuse_clock_s(), refusal);
        if (!docs) return refusal.message;
        for (const auto& d : *docs) keys.push_back(reuse::document_key(req.tenant, d->id, d->version));
        sweep_documents();
        if (req.render) {  // the renderer placed them (PoolPrompt::documents_begin / end)
            req.documents.clear();
            return std::nullopt;
        }
        nlohmann::json used = nlohmann::json::array();
        for (const auto& d : *docs) used.push_back({{"id", d->id}, {"version", d->version}});
        const std::string block = reuse::documents_block(*docs);
        chars = block.size();
        req.prompt = block + "\n\n" + req.prompt;
        nlohmann::json trace = req.reuse_trace.empty() ? nlohmann::json::object() : nlohmann::json::parse(req.reuse_trace, nullptr, false);
        if (!trace.is_object()) trace = nlohmann::json::object();
        trace["documents"] = std::move(used);
        req.reuse_trace = trace.dump();
        req.documents.clear();
        return std::nullopt;
    }

    void submit_as(RequestHandle id, GenerationRequest req, RequestCallbacks cb) {
        std::vector<uint64_t> reuse_keys;
        size_t documents_chars = 0;
        if (auto refused = place_documents(req, reuse_keys, documents_chars)) {
            GenerationResult r;
            r.id = id;
            r.finish = FinishReason::ERROR;
            r.error = *refused;
            if (cb.on_finish) cb.on_finish(r);
            return;
        }
        auto ctx = std::make_shared<RequestContext>();
        ctx->id = id;
        ctx->req = std::move(req);
        ctx->cb = std::move(cb);
        ctx->arrival_s = now_s();
        ctx->reuse_keys = std::move(reuse_keys);
        ctx->documents_chars = documents_chars;
        ctx->shared = shared;
        ctx->snap = shared->snapshot();  // the generation this request starts (and finishes) with
        std::lock_guard<std::mutex> lk(shared->inflight_mu);
        // Spawned under the lock so finished() (which takes it) cannot run before the entry exists.
        shared->inflight[ctx->id] = spawn_request(*sys, ctx);
    }

    // Choices 1..n-1 of f: submitted, or (failed: choice 0's result before its first token) each
    // answered with that result; one cancelled while it waited finishes CANCELLED. Once. The
    // submits happen under f->mu, so a cancel() that finds the fan-out released finds them running.
    void release_choices(const std::shared_ptr<ChoiceFanOut>& f, const GenerationResult* failed) {
        std::vector<std::pair<size_t, GenerationResult>> answers;
        {
            std::lock_guard<std::mutex> lk(f->mu);
            if (f->released) return;
            f->released = true;
            f->released_hint = true;
            for (size_t k = 1; k < f->ids.size(); k++) {
                if (failed || f->cancelled[k]) {
                    GenerationResult r;
                    if (failed) {
                        r = *failed;
                    } else {
                        r.finish = FinishReason::CANCELLED;
                        r.error = "cancelled before it started";
                    }
                    r.id = f->ids[k];
                    answers.emplace_back(k, std::move(r));
                    continue;
                }
                GenerationRequest g = f->req;
                g.seed = f->req.seed + k;
                submit_as(f->ids[k], std::move(g), std::move(f->cbs[k]));
            }
            // Only now: a cancel() that looked in the in-flight table before these submits finds
            // the fan-out here, waits on f->mu and then finds them running.
            std::lock_guard<std::mutex> lk2(choices_mu);
            for (size_t k = 1; k < f->ids.size(); k++) waiting_choices.erase(f->ids[k]);
        }
        for (auto& [k, r] : answers)
            if (f->cbs[k].on_finish) f->cbs[k].on_finish(r);
    }

    // A remote pool of `config`: connect to its worker and describe the pool (not wired yet: build()
    // subscribes it to the cache and spawns its monitor once the generation validated).
    Expected<std::shared_ptr<PoolHandle>> connect_pool(const PoolConfig& pc, const Config& config) {
        auto c = connect_worker(*sys, pc.remote, config.cluster);
        if (!c) return make_error("pool '", pc.name, "': ", c.error().message);
        std::string names;
        for (RemotePoolInfo& i : c->info.pools) {
            if (i.pool != pc.remote_pool) {
                names += (names.empty() ? "" : ", ") + i.pool;
                continue;
            }
            RemoteDescription d;
            d.pool = i.pool;
            d.block_size = i.block_size;
            d.n_blocks = i.n_blocks;
            d.max_queue = i.max_queue;
            d.prefix_cache = i.prefix_cache;
            d.model_header = std::move(i.model_header);
            d.model_path = i.model_path;
            d.public_prefixes = i.public_prefixes;
            auto p = remote_pool(pc, config, std::move(d));
            if (!p) return p.error();
            auto ph = std::make_shared<PoolHandle>(std::move(*p));
            ph->executor = i.executor;
            ph->kv_allocator = i.kv_allocator;
            ph->public_prefixes = std::move(i.public_prefixes);
            ph->worker = pc.remote;
            ph->worker_actor = c->worker;
            return ph;
        }
        return make_error("pool '", pc.name, "': the worker at ", pc.remote, " has no pool '", pc.remote_pool, "' (it has: ",
                          names.empty() ? std::string("none") : names, "); set remote_pool to one of them");
    }

    // Builds the next generation from `config`, reusing unchanged pools of the live one. Nothing is
    // published on error (new pools and plugin instances are released; their executors exit).
    Expected<std::shared_ptr<Snapshot>> build(const Config& config, const Snapshot* prev) {
        auto ok = ensure_models(config);
        if (!ok) return ok.error();
        auto snap = std::make_shared<Snapshot>();
        snap->generation = prev ? prev->generation + 1 : 1;
        snap->config = std::make_shared<const Config>(config);
        const std::vector<PoolPlan> plan = plan_generation(config, prev ? pools_of(*prev) : std::vector<const Pool*>{});
        for (size_t i = 0; i < plan.size(); i++) {
            const std::shared_ptr<PoolHandle> kept = plan[i].keep >= 0 ? prev->pools[plan[i].keep] : nullptr;
            if (kept && !kept->live->lost) {
                snap->pools.push_back(kept);
                continue;
            }
            if (!config.pools[i].remote.empty()) {
                auto ph = connect_pool(config.pools[i], config);
                if (!ph && kept) {  // still lost: keep the pool (unavailable) until its worker answers
                    snap->pools.push_back(kept);
                    continue;
                }
                if (!ph) return ph.error();
                snap->pools.push_back(std::move(*ph));
                continue;
            }
            auto p = load_pool(config.pools[i], config);
            if (!p) return p.error();
            snap->pools.push_back(std::make_shared<PoolHandle>(std::move(*p)));
        }
        auto policies = create_policies(config, shared->plugins, shared->policy_counters);
        if (!policies) return policies.error();
        snap->policies = std::move(*policies);
        // The config is valid: the new local pools' engines, one after the other (a CUDA pool sizes
        // its KV from what the engines before it left free, uploads its weights and allocates its KV
        // here: the device's errors refuse the config before anything starts).
        std::map<const PoolHandle*, std::unique_ptr<Engine>> engines;
        for (auto& ph : snap->pools) {
            if (ph->id != 0 || ph->remote()) continue;
            if (kv_sized_by_device(*ph) && prev && prev->config->find_pool(ph->cfg.name))
                spdlog::warn("pool '{}' is rebuilt on the device while its previous engine still holds its memory: its KV "
                             "is sized from what that leaves; set kv_blocks or kv_gib for pools you change by reload",
                             ph->cfg.name);
            if (auto s = size_device_kv(*ph, config); !s) return s.error();
            auto e = make_engine(*ph, config);
            if (!e) return e.error();
            engines[ph.get()] = std::move(*e);
        }
        // The profiles after the engines: a device-sized pool's KV blocks are known only now.
        std::vector<const Pool*> pools;
        for (auto& ph : snap->pools) pools.push_back(ph.get());
        snap->profiles = generation_profiles(config, pools);
        // Validation is complete: start the new pools' executors.
        for (auto& ph : snap->pools) {
            if (ph->id != 0) continue;  // wired in an earlier generation
            if (ph->remote()) {
                ph->id = shared->next_pool_id++;
                ph->cache = shared->cache;
                caf::anon_send(ph->executor, kv_events_atom::value, shared->cache, ph->id);
                PoolMonitorArgs ma;
                ma.worker = ph->worker_actor;
                ma.executor = ph->executor;
                ma.address = ph->worker;
                ma.remote_pool = ph->cfg.remote_pool;
                ma.pool = ph->cfg.name;
                ma.pool_id = ph->id;
                ma.live = ph->live;
                ma.cluster = config.cluster;
                ma.shared = shared;
                ph->monitor = spawn_pool_monitor(*sys, std::move(ma));
                spdlog::info("pool '{}' is the worker {}'s pool '{}' ({} KV blocks of {} tokens)", ph->cfg.name, ph->worker,
                             ph->cfg.remote_pool, ph->n_blocks, ph->cfg.block_size);
                continue;
            }
            ph->public_prefixes = public_prefix_ids(*ph, config);
            ph->executor = spawn_executor(*sys, std::move(engines.at(ph.get())), ph->model, ph->live, shared, ph->cfg.name);
            // KV wiring: the executor feeds the cache actor; a kv_allocator admits before its queue.
            ph->id = shared->next_pool_id++;
            caf::anon_send(ph->executor, kv_events_atom::value, shared->cache, ph->id);
            AdmissionOptions ao;
            ao.pool = ph->cfg.name;
            ao.n_blocks_total = ph->n_blocks;
            ao.max_queue = ph->cfg.max_queue;
            ao.overcommit = ph->cfg.kv_overcommit;
            std::weak_ptr<SharedState> weak = shared;  // the allocator must not keep the runtime alive
            ph->kv_allocator = spawn_kv_allocator(*sys, ao, [weak](const std::string& pool, std::vector<TenantAdmission> f) {
                auto sh = weak.lock();
                if (!sh) return;
                std::lock_guard<std::mutex> lk(sh->metrics_mu);
                if (sh->metrics) sh->metrics->set_admission(pool, std::move(f));
            });
        }
        // Tenant KV quotas (a share of each pool's blocks) of this generation, also for kept pools; a
        // tenant the new file no longer names loses the quota it had.
        for (auto& ph : snap->pools) {
            for (const TenantConfig& t : config.tenants)
                caf::anon_send(ph->kv_allocator, quota_atom::value, t.name,
                               (int32_t)(t.kv_quota >= 0 ? t.kv_quota * ph->n_blocks : -1));
            if (prev)
                for (const TenantConfig& t : prev->config->tenants)
                    if (!config.find_tenant(t.name)) caf::anon_send(ph->kv_allocator, quota_atom::value, t.name, (int32_t)-1);
        }
        snap->router = spawn_router(*sys, snap, shared);
        return snap;
    }

    // The config file as this runtime reads it: the file plus the start options' additions.
    Expected<Config> read_config() const {
        auto c = load_config(config_path);
        if (!c) return c.error();
        apply_options(*c, options);
        return c;
    }

    // A lost worker answers again (its pool monitor asked): the live config, rebuilt, reconnects every
    // lost remote pool that answers (build() keeps the others as they are).
    void rejoin() {
        std::lock_guard<std::mutex> lk(reload_mu);
        if (stopping) return;
        auto prev = shared->snapshot();
        bool any_lost = false;
        for (const auto& ph : prev->pools) any_lost |= ph->remote() && ph->live->lost;
        if (!any_lost) return;
        auto snap = build(*prev->config, prev.get());
        if (!snap) {
            spdlog::warn("a lost worker answered again, but rebuilding generation {} failed: {}", prev->generation,
                         snap.error().message);
            return;
        }
        const uint64_t g = (*snap)->generation;
        {
            std::lock_guard<std::mutex> mk(shared->metrics_mu);
            shared->metrics->update_config(metrics_config(*prev->config, pools_of(**snap)));
        }
        shared->publish(std::move(*snap));
        spdlog::info("config generation {} is live: lost workers rejoined", g);
    }

    Expected<uint64_t> reload() {
        std::lock_guard<std::mutex> lk(reload_mu);
        auto fail = [&](const std::string& msg) -> Expected<uint64_t> {
            const uint64_t g = shared->snapshot()->generation;
            spdlog::error("config reload failed, generation {} stays live: {}", g, msg);
            std::lock_guard<std::mutex> mk(shared->metrics_mu);
            shared->metrics->record_reload(false, g, msg);
            return make_error(msg);
        };
        if (stopping) return make_error("the runtime is shutting down");
        if (config_path.empty()) return fail("this runtime was started from a Config value, not a file; there is nothing to reload");
        auto c = read_config();
        if (!c) return fail(c.error().message);
        auto prev = shared->snapshot();
        auto snap = build(*c, prev.get());
        if (!snap) return fail(snap.error().message);
        const uint64_t g = (*snap)->generation;
        {
            std::lock_guard<std::mutex> mk(shared->metrics_mu);
            shared->metrics->update_config(metrics_config(*c, pools_of(**snap)));
            shared->metrics->record_reload(true, g);
        }
        shared->publish(std::move(*snap));
        spdlog::info("config generation {} is live ({})", g, config_path);
        return g;
    }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Expected<std::unique_ptr<Runtime>> Runtime::start(const std::string& config_path, RuntimeOptions options) {
    auto c = load_config(config_path);
    if (!c) return c.error();
    apply_options(*c, options);
    return start_with(*c, std::move(options));
}

Expected<std::unique_ptr<Runtime>> Runtime::start(const Config& config, RuntimeOptions options) {
    Config c = config;
    apply_options(c, options);
    return start_with(c, std::move(options));
}

Expected<std::unique_ptr<Runtime>> Runtime::start_with(const Config& config, RuntimeOptions options) {
    // [sim] dilation: every clock of the runtime runs this many simulated seconds per real second
    // (1 without it). Set before any actor reads the clock; a reload keeps it.
    set_time_dilation(config.sim.dilation);
    // The CPU plan before any pool runs a forward: [cpu] prefetch_bytes and gemm_min_tokens, else the
    // measurement cached for this CPU model, else measured now (~0.5 s, once per machine).
    start_cpu_plan(config.cpu.prefetch_bytes, config.cpu.gemm_min_tokens, config.cpu.f32_stream_rows, config.cpu.half_stream_rows);
    if (config.cluster.tls())  // checked here: CAF's TLS layer would abort on a bad file in the middle of a connect
        if (std::string e = tls_files_error(config.cluster.tls_cert, config.cluster.tls_key, config.cluster.tls_ca); !e.empty())
            return make_error(config.path, ": ", e);
    auto impl = std::make_unique<Impl>();
    impl->sys = std::make_unique<caf::actor_system>(make_cfg(impl->cfg, config.cluster));
    impl->config_path = config.path == "<string>" ? "" : config.path;
    impl->options = std::move(options);
    impl->shared->traces.set_capacity(impl->options.trace_capacity);
    if (!config.tracing.otlp_file.empty()) {
        auto f = OtlpFile::open(config.tracing.otlp_file);
        if (!f) return f.error();
        impl->shared->otlp = std::move(*f);
    }
    impl->shared->cache = spawn_cache(*impl->sys);
    impl->shared->timers = spawn_timer(*impl->sys);
    auto snap = impl->build(config, nullptr);
    if (!snap) {  // build() spawns executors only once everything validated
        caf::anon_send_exit(impl->shared->cache, caf::exit_reason::user_shutdown);
        caf::anon_send_exit(impl->shared->timers, caf::exit_reason::user_shutdown);
        return snap.error();
    }
    SharedState& sh = *impl->shared;
    sh.metrics = std::make_unique<MetricsRegistry>(metrics_config(config, pools_of(**snap)));
    sh.publish(std::move(*snap));
    Impl* raw = impl.get();
    impl->config_actor = spawn_config(*impl->sys, [raw] { return raw->reload(); }, [raw] { raw->rejoin(); }, impl->shared);
    impl->shared->config = impl->config_actor;
    if (!impl->config_path.empty()) {  // SIGHUP always; the file itself with [reload] watch
        ConfigActor ca = impl->config_actor;
        impl->watcher = std::make_unique<ConfigWatcher>(impl->config_path, config.reload.watch, config.reload.debounce_ms,
                                                        [ca] { caf::anon_send(ca, reload_atom::value); });
    }
    return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

Runtime::~Runtime() {
    if (!impl_) return;
    impl_->stop_sweeper();  // it sends to executors: stopped before anything is torn down
    impl_->watcher.reset();  // no reload may start from here on
    {
        std::lock_guard<std::mutex> lk(impl_->shared->inflight_mu);
        for (auto& [id, a] : impl_->shared->inflight) caf::anon_send(a, cancel_atom::value);
    }
    drain();
    impl_->embeds.reset();  // queued embeddings answer FAILED; a running one finishes first
    if (impl_->worker) {  // closes the ports first: an actor system with a published actor never finishes
        impl_->gate.reset();  // fronts' connections end here; CAF sees each close
        impl_->sys->middleman().unpublish(impl_->worker, impl_->worker_port);
        caf::anon_send_exit(impl_->worker, caf::exit_reason::user_shutdown);
    }
    caf::anon_send_exit(impl_->config_actor, caf::exit_reason::user_shutdown);
    impl_->config_actor = nullptr;
    impl_->shared->config = nullptr;
    std::vector<caf::weak_actor_ptr> executors;  // of every generation still alive
    {
        std::lock_guard<std::mutex> lk(impl_->reload_mu);  // a reload in progress finishes first
        impl_->stopping = true;
        // Executors hold the shared state, which holds the snapshots that hold their handles: drop
        // the snapshots (their destructors tell routers and executors to exit), or the detached
        // threads wait forever for their actor objects to be destroyed.
        std::shared_ptr<Snapshot> cur;
        {
            std::lock_guard<std::mutex> sl(impl_->shared->snap_mu);
            if (impl_->shared->current)
                for (const auto& ph : impl_->shared->current->pools)
                    if (ph->executor) executors.push_back(caf::actor_cast<caf::weak_actor_ptr>(ph->executor));
            for (const auto& [g, w] : impl_->shared->generations)
                if (auto sn = w.lock())
                    for (const auto& ph : sn->pools)
                        if (ph->executor) executors.push_back(caf::actor_cast<caf::weak_actor_ptr>(ph->executor));
            cur = std::move(impl_->shared->current);
            impl_->shared->generations.clear();
        }
        cur.reset();
    }
    caf::anon_send_exit(impl_->shared->cache, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(impl_->shared->timers, caf::exit_reason::user_shutdown);
    // Wait (5 s at most) until every executor's actor object is gone before the actor system stops.
    // An executor exits on its own thread, after the snapshots above let go of it, and its exit
    // notifies whoever monitors or links it with messages that carry a strong handle to it (the
    // middleman's BASP broker monitors it once a front holds a handle). CAF 0.17 stops the middleman
    // as soon as no actor is *running*, before those messages are handled; when one is still in
    // flight then, it is never freed, the executor keeps one strong reference (measured), and the
    // actor system's destructor waits forever for the executor's thread. It happened in 1 worker
    // shutdown in 4 after a front's request; with this wait, in none of 24 (docs/cluster.md).
    for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5);) {
        if (std::all_of(executors.begin(), executors.end(), [](const caf::weak_actor_ptr& w) { return !w || w->strong_refs == 0; })) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    impl_->sys.reset();  // waits for every actor
}

RequestHandle Runtime::submit(GenerationRequest req, RequestCallbacks cb) {
    const RequestHandle id = impl_->next_id++;
    impl_->submit_as(id, std::move(req), std::move(cb));
    return id;
}

std::vector<RequestHandle> Runtime::submit_choices(GenerationRequest req, int n,
                                                   const std::function<RequestCallbacks(int choice)>& callbacks) {
    n = std::clamp(n, 1, 128);
    auto f = std::make_shared<ChoiceFanOut>();
    const RequestHandle first = impl_->next_id.fetch_add((uint64_t)n);
    for (int i = 0; i < n; i++) {
        f->ids.push_back(first + (uint64_t)i);
        f->cbs.push_back(callbacks(i));
    }
    f->cancelled.assign((size_t)n, false);
    f->req = req;
    if (n > 1) {
        std::lock_guard<std::mutex> lk(impl_->choices_mu);
        for (int i = 1; i < n; i++) impl_->waiting_choices[f->ids[(size_t)i]] = f;
    }
    RequestCallbacks c0 = f->cbs[0];
    if (n > 1) {
        Impl* impl = impl_.get();  // callbacks run before ~Runtime returns (it waits for every actor)
        c0.on_token = [impl, f, user = f->cbs[0].on_token](const std::string& piece, const std::vector<int32_t>& ids) {
            if (!f->released_hint.load(std::memory_order_relaxed)) impl->release_choices(f, nullptr);
            if (user) user(piece, ids);
        };
        c0.on_finish = [impl, f, user = f->cbs[0].on_finish](const GenerationResult& r) {
            if (user) user(r);
            impl->release_choices(f, r.ok() ? nullptr : &r);
        };
    }
    impl_->submit_as(f->ids[0], std::move(req), std::move(c0));
    return f->ids;
}

std::vector<PoolInfo> Runtime::pools() const {
    std::vector<PoolInfo> out;
    auto snap = impl_->shared->snapshot();
    if (!snap) return out;
    for (const auto& ph : snap->pools) {
        PoolInfo i;
        i.name = ph->cfg.name;
        i.model_path = ph->cfg.model;
        const ModelParams& mp = ph->model->params();
        i.arch = mp.arch;
        i.n_ctx = mp.n_ctx_train;
        i.n_vocab = mp.n_vocab;
        PromptPool pp = prompt_pool(*ph);  // the template a chat routed here renders with
        i.chat_template = std::move(pp.chat_template);
        i.chat_template_source = std::move(pp.template_source);
        i.bos_token = std::move(pp.bos_token);
        i.eos_token = std::move(pp.eos_token);
        i.model_bytes = (int64_t)ph->model->file().mapped_size();
        // KV this process holds: none for a simulated pool (bookkeeping only) or a worker's.
        if (!ph->cfg.sim && ph->cfg.remote.empty())
            i.kv_bytes = kv_bytes(KvStorage::config_for(mp, ph->n_blocks, ph->cfg.block_size, kv_types_of(ph->cfg).k,
                                                          kv_types_of(ph->cfg).v));
        out.push_back(std::move(i));
    }
    return out;
}

namespace {

Expected<std::shared_ptr<PoolHandle>> find_pool(const SharedState& sh, const std::string& name) {
    auto snap = sh.snapshot();
    if (snap)
        for (const auto& ph : snap->pools)
            if (ph->cfg.name == name) return ph;
    std::string names;
    if (snap)
        for (const auto& ph : snap->pools) names += (names.empty() ? "" : ", ") + ph->cfg.name;
    return make_error("no pool named '", name, "' (pools: ", names, ")");
}

}  // namespace

Expected<std::vector<int32_t>> Runtime::tokenize(const std::string& pool, const std::string& text, bool add_special) const {
    auto ph = find_pool(*impl_->shared, pool);
    if (!ph) return ph.error();
    const Tokenizer& tok = (*ph)->model->tokenizer();
    return tok.encode(text, add_special && tok.add_bos_default(), add_special);
}

Expected<std::string> Runtime::detokenize(const std::string& pool, const std::vector<int32_t>& ids) const {
    auto ph = find_pool(*impl_->shared, pool);
    if (!ph) return ph.error();
    const Tokenizer& tok = (*ph)->model->tokenizer();
    for (int32_t id : ids)
        if (id < 0 || id >= tok.n_vocab())
            return make_error("token id ", id, " is outside pool '", pool, "''s vocabulary of ", tok.n_vocab(), " ids");
    return tok.decode(ids);
}

Expected<std::vector<std::string>> Runtime::token_pieces(const std::string& pool, const std::vector<int32_t>& ids) const {
    auto ph = find_pool(*impl_->shared, pool);
    if (!ph) return ph.error();
    const Tokenizer& tok = (*ph)->model->tokenizer();
    std::vector<std::string> out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
        if (id < 0 || id >= tok.n_vocab())
            return make_error("token id ", id, " is outside pool '", pool, "''s vocabulary of ", tok.n_vocab(), " ids");
        out.push_back(tok.token_to_bytes(id));
    }
    return out;
}

std::string Runtime::request_trace_json(RequestHandle h, const std::string& tenant) const {
    return impl_->shared->traces.json(h, tenant);
}

bool Runtime::cancel(RequestHandle h) {
    {
        std::lock_guard<std::mutex> lk(impl_->shared->inflight_mu);
        auto it = impl_->shared->inflight.find(h);
        if (it != impl_->shared->inflight.end()) {
            caf::anon_send(it->second, cancel_atom::value);
            return true;
        }
    }
    // A choice still waiting for choice 0: it finishes CANCELLED when the others are released.
    std::shared_ptr<ChoiceFanOut> f;
    {
        std::lock_guard<std::mutex> lk(impl_->choices_mu);
        auto it = impl_->waiting_choices.find(h);
        if (it != impl_->waiting_choices.end()) f = it->second.lock();
    }
    if (!f) return false;
    {
        std::lock_guard<std::mutex> lk(f->mu);
        if (!f->released) {
            for (size_t k = 1; k < f->ids.size(); k++)
                if (f->ids[k] == h) f->cancelled[k] = true;
            return true;
        }
    }
    // Released since the lookup: it is running now (or already answered).
    std::lock_guard<std::mutex> lk(impl_->shared->inflight_mu);
    auto it = impl_->shared->inflight.find(h);
    if (it == impl_->shared->inflight.end()) return false;
    caf::anon_send(it->second, cancel_atom::value);
    return true;
}

Expected<std::string> check_config_file(const std::string& path) { return check_config(path); }

GenerationResult Runtime::generate(GenerationRequest req) {
    auto p = std::make_shared<std::promise<GenerationResult>>();
    auto f = p->get_future();
    RequestCallbacks cb;
    cb.on_finish = [p](const GenerationResult& r) { p->set_value(r); };
    submit(std::move(req), std::move(cb));
    return f.get();
}

void Runtime::embed_async(EmbeddingRequest req, std::function<void(EmbeddingResult)> done) {
    impl_->embeds->submit(impl_->shared->snapshot(), std::move(req), std::move(done));
}

EmbeddingResult Runtime::embed(EmbeddingRequest req) {
    auto p = std::make_shared<std::promise<EmbeddingResult>>();  // shared: set_value may still run as get() returns
    auto f = p->get_future();
    embed_async(std::move(req), [p](EmbeddingResult r) { p->set_value(std::move(r)); });
    return f.get();
}

void Runtime::end_session(const std::string& session) {
    // Engine sessions are keyed per tenant (SharedState::session_key); this API names none, so it
    // ends the session of every tenant that has one by this name.
    std::vector<std::string> keys;
    {
        std::lock_guard<std::mutex> lk(impl_->shared->tenants_mu);
        for (const auto& [name, id] : impl_->shared->tenant_ids) keys.push_back(SharedState::session_key(id, session));
    }
    for (auto& p : impl_->shared->snapshot()->pools)
        for (const std::string& k : keys) caf::anon_send(p->executor, session_atom::value, k);
}

namespace {
void refresh_policy_figures(SharedState& sh) {
    std::vector<PolicyFigure> f;
    for (const auto& c : sh.policy_counters.all()) f.push_back({c->bucket, c->kind, c->plugin, c->n_calls.load(), c->n_invalid.load(), c->n_declined.load(), c->n_timed_out.load(),
                                                              c->n_crashed.load(), c->n_restarts.load(), c->n_unavailable.load()});
    sh.metrics->set_policy_figures(std::move(f));
}

// Every live pool's scheduler load as its executor (or a remote pool's heartbeat) last published
// it. Read before taking metrics_mu: the pools' locks are never held under it.
std::vector<PoolLoad> pool_loads(const SharedState& sh) {
    std::vector<PoolLoad> loads;
    auto snap = sh.snapshot();
    if (!snap) return loads;
    for (const auto& ph : snap->pools) {
        PoolLoad l;
        l.pool = ph->cfg.name;
        l.block_size = ph->cfg.block_size;
        l.n_blocks = ph->n_blocks;
        std::lock_guard<std::mutex> lk(ph->live->mu);
        l.n_running = ph->live->stats.n_running;
        l.n_waiting = ph->live->stats.n_waiting;
        l.tiers = ph->live->stats.tiers;
        l.n_kv_priority_blocks = ph->live->stats.n_kv_priority_blocks;
        l.n_kv_priority_evictions = ph->live->stats.n_kv_priority_evictions;
        l.n_kv_reuse_invalidated = ph->live->stats.n_kv_reuse_invalidated;
        for (const Engine::BucketLoad& b : ph->live->load_by_bucket)
            l.by_bucket.push_back({b.bucket, b.n_running, b.n_waiting});
        loads.push_back(std::move(l));
    }
    return loads;
}
}  // namespace

reuse::DocumentStore& runtime_documents(Runtime& rt) { return rt.internals().documents; }
reuse::ToolResultCache& runtime_tool_results(Runtime& rt) { return rt.internals().tool_results; }
double reuse_clock_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Expected<uint64_t> Runtime::put_document(const std::string& tenant, const std::string& id, DocumentSpec doc) {
    reuse::DocumentRefusal refusal;
    auto r = impl_->documents.put(tenant, id, {std::move(doc.text), doc.version, doc.ttl_s, std::move(doc.acl)},
                                  reuse_clock_s(), refusal);
    if (!r) return make_error(refusal.message);
    impl_->sweep_documents();
    return r->version;
}

bool Runtime::remove_document(const std::string& tenant, const std::string& id) {
    const bool removed = impl_->documents.remove(tenant, id);
    impl_->sweep_documents();
    return removed;
}

void sweep_documents(Runtime& rt) { rt.internals().sweep_documents(); }

void Runtime::record_reuse(const std::string& bucket, const ReuseCounts& counts) {
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    impl_->shared->metrics->record_reuse(bucket, counts);
}

std::string Runtime::metrics_json() const {
    std::vector<PoolLoad> loads = pool_loads(*impl_->shared);
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    refresh_policy_figures(*impl_->shared);
    impl_->shared->metrics->set_pool_loads(std::move(loads));
    return impl_->shared->metrics->to_json().dump(2);
}

std::string Runtime::metrics_table() const { return metrics_table(false); }

std::string Runtime::metrics_table(bool wide) const {
    std::vector<PoolLoad> loads = pool_loads(*impl_->shared);
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    impl_->shared->metrics->set_pool_loads(std::move(loads));
    return impl_->shared->metrics->to_table(wide);
}

std::string Runtime::metrics_prometheus() const {
    std::vector<PoolLoad> loads = pool_loads(*impl_->shared);
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    refresh_policy_figures(*impl_->shared);
    impl_->shared->metrics->set_pool_loads(std::move(loads));
    return impl_->shared->metrics->to_prometheus();
}

std::string Runtime::metrics_prometheus_for_tenant(const std::string& tenant) const {
    return prometheus_for_tenant(metrics_prometheus(), tenant);
}

std::shared_ptr<const Config> Runtime::config() const { return impl_->shared->snapshot()->config; }

uint64_t Runtime::config_generation() const { return impl_->shared->snapshot()->generation; }

Expected<uint64_t> Runtime::reload() {
    // Through the config actor, like a file change or a SIGHUP: one reload path.
    caf::scoped_actor self{*impl_->sys};
    Expected<uint64_t> out = make_error("config reload: no answer from the config actor");
    self->request(impl_->config_actor, caf::infinite, reload_atom::value)
        .receive(
            [&](bool ok, uint64_t g, const std::string& err) { out = ok ? Expected<uint64_t>(g) : Expected<uint64_t>(make_error(err)); },
            [&](caf::error& e) { out = make_error("config reload: ", impl_->sys->render(e)); });
    return out;
}

Expected<int> Runtime::listen_for_fronts(const std::string& host, int port, uint32_t wire_version) {
    for (const auto& ph : impl_->shared->snapshot()->pools)
        if (ph->remote())
            return make_error("pool '", ph->cfg.name, "' is itself remote (", ph->worker,
                              "); a worker hosts its pools itself: give it only local pools");
    if (impl_->worker) return make_error("this runtime already listens for fronts");
    const ClusterConfig& cl = impl_->shared->snapshot()->config->cluster;
    const std::string name = host + ":" + std::to_string(port);
    if (!cl.tls() && !cl.insecure_loopback)
        return make_error("listening on ", name, " needs [cluster] tls_cert, tls_key and tls_ca (fronts must present a certificate of "
                          "that CA; docs/cluster.md#tls), or [cluster] insecure_loopback = true with a loopback --listen address");
    if (cl.insecure_loopback && !is_loopback_host(host))
        return make_error("[cluster] insecure_loopback = true allows only a loopback --listen address, and --listen ", name,
                          " is not one; give [cluster] tls_cert, tls_key and tls_ca instead (docs/cluster.md#tls), or --listen 127.0.0.1:",
                          std::to_string(port));
    auto w = spawn_worker(*impl_->sys, impl_->shared, name, wire_version ? wire_version : k_wire_version);
    // CAF's middleman listens on loopback only; the public port is the gate's, which bounds and
    // authenticates what reaches CAF (docs/cluster.md#threat-model).
    auto bound = impl_->sys->middleman().publish(w, 0, "127.0.0.1", true);
    if (!bound) {
        caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
        return make_error("cannot publish the worker on loopback: ", impl_->sys->render(bound.error()));
    }
    WorkerGateOptions go;
    go.host = host;
    go.port = port;
    go.upstream_port = *bound;
    go.tls = cl.tls();
    go.cert = cl.tls_cert;
    go.key = cl.tls_key;
    go.ca = cl.tls_ca;
    go.limits.max_frame_bytes = (uint32_t)cl.max_frame_bytes;
    go.max_connections = cl.max_connections;
    go.max_pending_bytes = cl.max_pending_bytes;
    go.handshake_timeout_ms = cl.connect_timeout_ms;
    auto gate = WorkerGate::start(go);
    if (!gate) {
        impl_->sys->middleman().unpublish(w, *bound);
        caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
        return gate.error();
    }
    impl_->worker = w;
    impl_->worker_port = *bound;
    impl_->gate = std::move(*gate);
    return impl_->gate->port();
}

void Runtime::route_sighup_to_reload() { ConfigWatcher::install_sighup_handler(); }

void Runtime::drain() {
    std::unique_lock<std::mutex> lk(impl_->shared->inflight_mu);
    impl_->shared->inflight_cv.wait(lk, [&] { return impl_->shared->inflight.empty(); });
}

}  // namespace steward
