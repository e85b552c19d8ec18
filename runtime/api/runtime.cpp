// Runtime::Impl: the actor system, the pools (model + engine + executor actor), the router and
// config actors, and the metrics registry. Requests are request actors spawned per submit().
#include "api/runtime.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <future>

#include <unistd.h>

#include "actors/actors.hpp"
#include "actors/shared_state.hpp"
#include "model/synth.h"

namespace steward {

namespace {

caf::actor_system_config& make_cfg(caf::actor_system_config& cfg) {
    add_message_types(cfg);
    // Request, router and config actors are light; the executors have threads of their own. One
    // scheduler thread that polls briefly leaves the cores to the forward pass's threads (CAF's
    // default aggressive polling competes with them on small machines).
    cfg.set("scheduler.max-threads", 1);
    cfg.set("work-stealing.aggressive-poll-attempts", 1);
    cfg.set("work-stealing.moderate-poll-attempts", 10);
    return cfg;
}

// Two processes starting on the same config may both find the model missing: each writes its own
// temp file and renames it into place (atomic on POSIX), so no reader ever sees a half-written file.
std::string temp_path_for(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

Expected<bool> rename_into_place(const std::string& tmp, const std::string& path) {
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (!ec) return true;
    std::filesystem::remove(tmp, ec);
    return make_error("cannot move the written model '", tmp, "' to '", path, "'; check the directory is writable");
}

// Writes a pool's synthetic model when its file is missing (drafts after their targets).
Expected<bool> ensure_models(const Config& c) {
    for (int pass = 0; pass < 2; pass++) {
        for (const PoolConfig& p : c.pools) {
            if (!p.synth || std::filesystem::exists(p.model)) continue;
            const SynthConfig& s = *p.synth;
            if ((pass == 0) != s.draft_from.empty()) continue;
            std::error_code ec;
            std::filesystem::create_directories(std::filesystem::path(p.model).parent_path(), ec);
            if (!s.draft_from.empty()) {
                const PoolConfig* t = c.find_pool(s.draft_from);
                if (!t) return make_error("pool '", p.name, "' synth.draft_from names pool '", s.draft_from, "', which is not defined");
                spdlog::info("writing draft model {} ({} layers of {})", p.model, s.keep_layers, t->model);
                const std::string tmp = temp_path_for(p.model);
                auto r = synth_draft(t->model, s.keep_layers, tmp);
                if (!r) {
                    std::filesystem::remove(tmp, ec);
                    return r.error();
                }
                auto mv = rename_into_place(tmp, p.model);
                if (!mv) return mv.error();
                continue;
            }
            SynthSpec spec;
            spec.arch = s.arch;
            spec.n_embd = s.dim;
            spec.n_layer = s.layers;
            spec.n_head = s.heads;
            spec.n_head_kv = s.kv_heads;
            spec.n_ff = s.ffn;
            spec.n_vocab = s.vocab;
            spec.n_ctx = s.ctx;
            spec.seed = s.seed;
            auto dt = parse_ggml_type(s.dtype);
            if (!dt) return make_error("pool '", p.name, "' synth dtype: ", dt.error().message);
            spec.dtype = *dt;
            spdlog::info("writing synthetic model {} (dim {}, {} layers, vocab {})", p.model, s.dim, s.layers, s.vocab);
            const std::string tmp = temp_path_for(p.model);
            auto r = synth_write(spec, tmp);
            if (!r) {
                std::filesystem::remove(tmp, ec);
                return make_error("pool '", p.name, "': ", r.error().message);
            }
            auto mv = rename_into_place(tmp, p.model);
            if (!mv) return make_error("pool '", p.name, "': ", mv.error().message);
        }
    }
    return true;
}

}  // namespace

struct Runtime::Impl {
    caf::actor_system_config cfg;
    std::unique_ptr<caf::actor_system> sys;
    std::shared_ptr<SharedState> shared = std::make_shared<SharedState>();
    caf::actor config_actor;
    std::atomic<uint64_t> next_id{1};
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Expected<std::unique_ptr<Runtime>> Runtime::start(const std::string& config_path) {
    auto c = load_config(config_path);
    if (!c) return c.error();
    return start(*c);
}

Expected<std::unique_ptr<Runtime>> Runtime::start(const Config& config) {
    auto ok = ensure_models(config);
    if (!ok) return ok.error();
    auto impl = std::make_unique<Impl>();
    SharedState& sh = *impl->shared;
    sh.config = std::make_shared<const Config>(config);
    MetricsConfig mc;
    for (const PoolConfig& pc : config.pools) {
        PoolRuntime pr;
        pr.cfg = pc;
        auto m = Model::load(pc.model);
        if (!m) return make_error("pool '", pc.name, "': ", m.error().message);
        pr.model = std::move(m.value());
        if (pc.backend == "cuda")
            spdlog::warn("pool '{}': backend \"cuda\" is not built into this binary; running on the CPU backend", pc.name);
        const ModelParams& mp = pr.model->params();
        const int elem = pc.kv_dtype == "f16" ? 2 : 4;
        const double block_bytes = 2.0 * mp.n_layer * pc.block_size * mp.n_head_kv * mp.head_dim * elem;
        pr.n_blocks = pc.kv_blocks > 0 ? pc.kv_blocks : (int)(pc.kv_gib * (double)(1ull << 30) / block_bytes);
        if (pr.n_blocks < 1) return make_error("pool '", pc.name, "': kv_gib ", std::to_string(pc.kv_gib), " holds no block");
        mc.prices[pc.name] = PoolPrice{pc.price_prompt, pc.price_cached, pc.price_output};
        if (!mc.kv) {
            KvShape ks;
            ks.n_layers = mp.n_layer;
            ks.n_blocks = pr.n_blocks;
            ks.block_size = pc.block_size;
            ks.n_kv_heads = mp.n_head_kv;
            ks.head_dim = mp.head_dim;
            ks.bytes_per_elem = elem;
            mc.kv = ks;
        }
        sh.pools.push_back(std::move(pr));
    }
    for (const BucketConfig& b : config.buckets) mc.slo[b.name] = BucketSlo{b.slo_ttft_ms, b.slo_tpot_ms};
    sh.metrics = std::make_unique<MetricsRegistry>(mc);

    impl->sys = std::make_unique<caf::actor_system>(make_cfg(impl->cfg));
    for (size_t i = 0; i < sh.pools.size(); i++) {
        PoolRuntime& pr = sh.pools[i];
        EngineOptions eo;
        eo.n_blocks = pr.n_blocks;
        eo.block_size = pr.cfg.block_size;
        eo.kv_dtype = pr.cfg.kv_dtype == "f16" ? KvDtype::F16 : KvDtype::F32;
        eo.max_batch = pr.cfg.max_batch;
        eo.max_batch_tokens = pr.cfg.max_batch_tokens;
        eo.max_queue = pr.cfg.max_queue;
        eo.n_threads = pr.cfg.threads;
        eo.prefix_cache = pr.cfg.prefix_cache;
        eo.session_ttl_s = config.limits.session_ttl_ms / 1e3;
        auto engine = std::make_unique<Engine>(*pr.model, eo);
        // Public prefixes are token sequences of each pool's own vocabulary.
        std::vector<std::vector<int32_t>> pubs;
        for (const auto& pp : config.public_prefixes)
            pubs.push_back(pr.model->tokenizer().encode(pp.text, pr.model->tokenizer().add_bos_default()));
        engine->set_public_prefixes(std::move(pubs));
        pr.executor = spawn_executor(*impl->sys, std::move(engine), impl->shared, (int)i);
    }
    sh.router = spawn_router(*impl->sys, sh.config, sh.generation);
    impl->config_actor = spawn_config(*impl->sys, sh.config);
    return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

Runtime::~Runtime() {
    if (!impl_) return;
    {
        std::lock_guard<std::mutex> lk(impl_->shared->inflight_mu);
        for (auto& [id, a] : impl_->shared->inflight) caf::anon_send(a, cancel_atom::value);
    }
    drain();
    for (auto& p : impl_->shared->pools) caf::anon_send_exit(p.executor, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(impl_->shared->router, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(impl_->config_actor, caf::exit_reason::user_shutdown);
    // Executors hold the shared state, which holds their handles: drop the handles, or the
    // detached threads wait forever for their actor objects to be destroyed.
    for (auto& p : impl_->shared->pools) p.executor = nullptr;
    impl_->shared->router = nullptr;
    impl_->config_actor = nullptr;
    impl_->sys.reset();  // waits for every actor
}

RequestHandle Runtime::submit(GenerationRequest req, RequestCallbacks cb) {
    auto ctx = std::make_shared<RequestContext>();
    ctx->id = impl_->next_id++;
    ctx->req = std::move(req);
    ctx->cb = std::move(cb);
    ctx->arrival_s = now_s();
    ctx->shared = impl_->shared;
    std::lock_guard<std::mutex> lk(impl_->shared->inflight_mu);
    // Spawned under the lock so finished() (which takes it) cannot run before the entry exists.
    impl_->shared->inflight[ctx->id] = spawn_request(*impl_->sys, ctx);
    return ctx->id;
}

bool Runtime::cancel(RequestHandle h) {
    std::lock_guard<std::mutex> lk(impl_->shared->inflight_mu);
    auto it = impl_->shared->inflight.find(h);
    if (it == impl_->shared->inflight.end()) return false;
    caf::anon_send(it->second, cancel_atom::value);
    return true;
}

GenerationResult Runtime::generate(GenerationRequest req) {
    auto p = std::make_shared<std::promise<GenerationResult>>();
    auto f = p->get_future();
    RequestCallbacks cb;
    cb.on_finish = [p](const GenerationResult& r) { p->set_value(r); };
    submit(std::move(req), std::move(cb));
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
    for (auto& p : impl_->shared->pools)
        for (const std::string& k : keys) caf::anon_send(p.executor, session_atom::value, k);
}

std::string Runtime::metrics_json() const {
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    return impl_->shared->metrics->to_json().dump(2);
}

std::string Runtime::metrics_table() const {
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    return impl_->shared->metrics->to_table();
}

std::string Runtime::metrics_prometheus() const {
    std::lock_guard<std::mutex> lk(impl_->shared->metrics_mu);
    return impl_->shared->metrics->to_prometheus();
}

const Config& Runtime::config() const { return *impl_->shared->config; }

void Runtime::drain() {
    std::unique_lock<std::mutex> lk(impl_->shared->inflight_mu);
    impl_->shared->inflight_cv.wait(lk, [&] { return impl_->shared->inflight.empty(); });
}

}  // namespace steward
