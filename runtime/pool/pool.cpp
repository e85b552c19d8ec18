// Pool lifecycle: model synthesis, pool keys, loading and KV sizing, engine options, generation plans.
#include "pool/pool.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "config/limits.h"
#include "kv/block_hash.h"
#include "kv/kv_storage.h"
#include "kv/kv_tier.h"
#include "model/synth.h"
#include "sim/cost_model.h"
#include "sim/sim_model.h"
#ifdef STEWARD_HAVE_CUDA
#include "backend/cuda.h"
#include "gpu/device.h"
#include "gpu/forward.h"
#endif

namespace steward {

namespace {

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

Expected<bool> write_draft(const Config& c, const PoolConfig& p) {
    const SynthConfig& s = *p.synth;
    const PoolConfig* t = c.find_pool(s.draft_from);
    if (!t) return make_error("pool '", p.name, "' synth.draft_from names pool '", s.draft_from, "', which is not defined");
    spdlog::info("writing draft model {} ({} layers of {})", p.model, s.keep_layers, t->model);
    const std::string tmp = temp_path_for(p.model);
    auto r = synth_draft(t->model, s.keep_layers, tmp);
    if (!r) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        return r.error();
    }
    return rename_into_place(tmp, p.model);
}

Expected<bool> write_synthetic(const PoolConfig& p) {
    const SynthConfig& s = *p.synth;
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
    spec.late_scale = (float)s.late_scale;
    spec.late_from = s.late_from;
    auto dt = parse_ggml_type(s.dtype);
    if (!dt) return make_error("pool '", p.name, "' synth dtype: ", dt.error().message);
    spec.dtype = *dt;
    spdlog::info("writing synthetic model {} (dim {}, {} layers, vocab {})", p.model, s.dim, s.layers, s.vocab);
    const std::string tmp = temp_path_for(p.model);
    auto r = synth_write(spec, tmp);
    if (!r) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        return make_error("pool '", p.name, "': ", r.error().message);
    }
    auto mv = rename_into_place(tmp, p.model);
    if (!mv) return make_error("pool '", p.name, "': ", mv.error().message);
    return true;
}

}  // namespace

Expected<bool> ensure_models(const Config& c) {
    // Pass 0 writes targets, pass 1 the drafts cut from them.
    for (int pass = 0; pass < 2; pass++) {
        for (const PoolConfig& p : c.pools) {
            if (!p.synth || std::filesystem::exists(p.model)) continue;
            const bool is_draft = !p.synth->draft_from.empty();
            if (is_draft != (pass == 1)) continue;
            std::error_code ec;
            std::filesystem::create_directories(std::filesystem::path(p.model).parent_path(), ec);
            auto ok = is_draft ? write_draft(c, p) : write_synthetic(p);
            if (!ok) return ok.error();
        }
    }
    return true;
}

std::string pool_key(const PoolConfig& p, const Config& c) {
    std::ostringstream o;
    // A remote pool is its worker's: the front only connects (a down worker's pool is replaced by
    // the runtime when it rejoins, whatever the key).
    if (!p.remote.empty()) return "remote|" + p.name + "|" + p.remote + "|" + p.remote_pool;
    o << p.name << '|' << p.model << '|' << p.backend << '|' << p.threads << '|' << p.kv_blocks << '|' << p.kv_gib << '|'
      << p.block_size << '|' << p.kv_dtype << '|' << p.kv_type_k << '|' << p.kv_type_v << '|' << p.max_batch << '|' << p.max_batch_tokens << '|' << p.max_queue << '|'
      << p.prefix_cache << '|' << c.limits.session_ttl_ms << '|' << p.kv_overcommit << '|' << p.draft << '|'
      << p.kv_size_set << '|' << p.gpu_memory_fraction << '|' << p.cuda_graphs << '|' << p.ctx << '|'
      << p.kv_tiers.host_gib << ',' << p.kv_tiers.disk_gib << ',' << p.kv_tiers.disk_dir;
    for (const auto& pp : c.public_prefixes) o << '|' << pp.text;
    if (p.sim) {  // a simulated pool: its device, shapes and generator (the files' contents, as read)
        const SimPoolConfig& s = *p.sim;
        const SimDeviceConfig& d = s.device;
        o << "|sim|" << d.name << ',' << d.tflops_16 << ',' << d.tflops_8 << ',' << d.tflops_32 << ',' << d.hbm_gbps << ','
          << d.hbm_gib << ',' << d.link_gbps << ',' << d.link_latency_us << ',' << d.eff_gemm << ',' << d.eff_attn << ','
          << d.eff_mem << ',' << d.eff_attn_decode << ',' << d.gemm_ramp_tokens << ',' << d.step_overhead_us << ','
          << d.layer_overhead_us;
        for (const SimModelConfig* m : {&s.model, s.draft ? &*s.draft : nullptr})
            if (m)
                o << '|' << m->name << ',' << m->layers << ',' << m->dim << ',' << m->heads << ',' << m->kv_heads << ','
                  << m->head_dim << ',' << m->ffn << ',' << m->vocab << ',' << m->ctx << ',' << m->weight_dtype << ',' << m->kv_dtype;
        o << '|' << s.tp << ',' << s.memory_fraction << ',' << s.acceptance << ',' << s.concentration << ',' << s.seed;
    }
    std::error_code ec;
    auto t = std::filesystem::last_write_time(p.model, ec);
    o << '|' << (ec ? 0 : (int64_t)t.time_since_epoch().count());
    if (const PoolConfig* d = p.draft.empty() ? nullptr : c.find_pool(p.draft)) {  // a rewritten draft is a new engine
        auto dt = std::filesystem::last_write_time(d->model, ec);
        o << '|' << d->model << '|' << (ec ? 0 : (int64_t)dt.time_since_epoch().count());
    }
    return o.str();
}

KvTypes kv_types_of(const PoolConfig& p) {
    auto type = [&](const std::string& name) { return parse_kv_dtype(name.empty() ? p.kv_dtype : name).value_or(KvDtype::F32); };
    return {type(p.kv_type_k), type(p.kv_type_v)};
}

Expected<int> kv_block_count(const PoolConfig& pc, const ModelParams& mp, bool host_memory) {
    const KvTypes kt = kv_types_of(pc);
    const double block_bytes = (double)kv_bytes(KvStorage::config_for(mp, 1, pc.block_size, kt.k, kt.v));
    double n = pc.kv_blocks;
    if (pc.kv_blocks <= 0) {
        n = std::floor(pc.kv_gib * (double)(1ull << 30) / block_bytes);
        if (n < 1)
            return make_error("pool '", pc.name, "': kv_gib ", std::to_string(pc.kv_gib), " holds no block of ",
                              std::to_string((int64_t)block_bytes), " bytes; raise kv_gib or set kv_blocks");
        if (n > (double)k_max_kv_blocks)
            return make_error("pool '", pc.name, "': kv_gib ", std::to_string(pc.kv_gib), " is ", std::to_string((int64_t)n),
                              " blocks, over the limit of ", std::to_string(k_max_kv_blocks), "; lower kv_gib");
    }
    // What the engine allocates up front: the KV (M_KV = 2*L*B*T*H_kv*D_head*bytes) and the
    // forward pass's activations for one step's tokens. More than the machine has would end in
    // std::bad_alloc (or the OOM killer) after `config check` said ok.
    if (!host_memory) return (int)n;
    const double step_tokens = std::max(pc.max_batch_tokens, pc.max_batch);
    const double act_floats = 3.0 * mp.n_embd + 2.0 * mp.n_head * mp.head_dim + 2.0 * mp.n_head_kv * mp.head_dim + 2.0 * mp.n_ff;
    const double bytes = n * block_bytes + step_tokens * act_floats * 4.0;
    auto mem = check_memory(bytes, "pool '" + pc.name + "' (" + std::to_string((int64_t)n) + " KV blocks of " +
                                       std::to_string((int64_t)block_bytes) + " bytes, and activations for " +
                                       std::to_string((int64_t)step_tokens) + " tokens a step)",
                            "lower kv_blocks / kv_gib or max_batch_tokens");
    if (!mem) return mem.error();
    return (int)n;
}

namespace {

// What a pool runs on: "cpu" or "cuda". backend = "cuda" where no device can be used is a config
// error; "auto" takes the CUDA backend where a device is found and the CPU with one log line where
// not (no driver, no device, or a binary built without nvcc).
Expected<std::string> resolve_backend(const PoolConfig& pc) {
    if (pc.backend == "cpu") return std::string("cpu");
#ifdef STEWARD_HAVE_CUDA
    const GpuInfo g = gpu_probe();
    if (g.status != GpuProbeStatus::GPU_PROBE_OK) {
        if (pc.backend == "cuda")
            return make_error("pool '", pc.name, "': backend = \"cuda\" but this machine has ", gpu_describe(g),
                              "; set backend = \"cpu\" (or \"auto\": CUDA where a device is found)");
        spdlog::info("pool '{}': backend \"auto\": {}; running on the CPU backend", pc.name, gpu_describe(g));
        return std::string("cpu");
    }
    spdlog::info("pool '{}': CUDA backend on {}", pc.name, gpu_describe(g));
    return std::string("cuda");
#else
    if (pc.backend == "cuda")
        return make_error("pool '", pc.name, "': backend = \"cuda\" but this binary was built without the CUDA backend ",
                          "(nvcc was not found when it was configured); rebuild with nvcc on PATH, or set backend = \"cpu\"");
    spdlog::info("pool '{}': backend \"auto\": this binary has no CUDA backend; running on the CPU backend", pc.name);
    return std::string("cpu");
#endif
}

#ifdef STEWARD_HAVE_CUDA
// A cuda pool's KV blocks when the config gives neither kv_blocks nor kv_gib: gpu_memory_fraction
// of the device's free memory, less what the forwards take (the target's and the draft model's
// weights and scratch; each self-draft's scratch, as it reads the target's weights) and a reserve
// for the CUDA context and cuBLAS, in target blocks (the engine splits them with the drafts as on
// the CPU).
Expected<int> cuda_kv_block_count(const Pool& p, const Config& config, bool log) {
    const PoolConfig& pc = p.cfg;
    const ModelParams& mp = p.model->params();
    auto free_b = cuda_free_bytes();
    if (!free_b) return make_error("pool '", pc.name, "': ", free_b.error().message);
    const int step_tokens = std::max(pc.max_batch_tokens, pc.max_batch);
    int64_t fwd = GpuForward::device_bytes(*p.model, step_tokens, 0);
    if (p.draft_model) fwd += GpuForward::device_bytes(*p.draft_model, step_tokens, 0);
    for (const BucketConfig& b : config.buckets)
        if (b.pool == pc.name && b.speculation && b.speculation_source == "self" && b.speculation_self_layers < mp.n_layer)
            fwd += GpuForward::device_bytes(*p.model, step_tokens, b.speculation_self_layers, false);  // shares the weights
    const int64_t reserve = 512ll << 20;
    const KvTypes kt = kv_types_of(pc);
    const double block_bytes = (double)kv_bytes(KvStorage::config_for(mp, 1, pc.block_size, kt.k, kt.v));
    const double room = (double)*free_b * pc.gpu_memory_fraction - (double)fwd - (double)reserve;
    const double n = std::min(std::floor(room / block_bytes), (double)k_max_kv_blocks);
    if (n < 1)
        return make_error("pool '", pc.name, "': gpu_memory_fraction ", std::to_string(pc.gpu_memory_fraction), " of the device's ",
                          std::to_string(*free_b >> 20), " MiB free leaves no KV block after the weights and scratch (",
                          std::to_string(fwd >> 20), " MiB) and a ", std::to_string(reserve >> 20),
                          " MiB reserve; raise gpu_memory_fraction, lower max_batch_tokens or use a smaller model");
    if (log)
        spdlog::info("pool '{}': {} KV blocks on the device ({:.2f} GiB; weights and scratch {:.2f} GiB, of {:.2f} GiB free)", pc.name,
                 (int64_t)n, n * block_bytes / (1ull << 30), (double)fwd / (1ull << 30), (double)*free_b / (1ull << 30));
    return (int)n;
}
#endif

}  // namespace

namespace {

// What routing sees of a pool whose model and cfg are set (local or remote), and its vocabulary's id.
void describe_pool(Pool& p) {
    PoolProfile& pr = p.profile;
    pr.name = p.cfg.name;
    pr.n_layers = p.model->params().n_layer;
    pr.model_bytes = (double)p.model->weight_bytes_per_token();
    pr.n_params = (double)p.model->n_params();
    pr.max_queue = p.cfg.max_queue;
    pr.price_prompt = p.cfg.price_prompt;
    pr.price_output = p.cfg.price_output;
    p.vocab_id = vocabulary_fingerprint(p.model->tokenizer());
}

}  // namespace

namespace {

// A simulated pool: a model of the shape without weights (a synthetic tokenizer of its vocabulary),
// its KV blocks from the devices' memory left after the weights.
Expected<Pool> load_sim_pool(const PoolConfig& pc, const Config& config) {
    const SimPoolConfig& sim = *pc.sim;
    auto model = sim_model(sim.model);
    if (!model) return make_error("pool '", pc.name, "': model shape ", sim.model.file, ": ", model.error().message);
    Pool p;
    p.cfg = pc;
    p.key = pool_key(pc, config);
    p.model = std::shared_ptr<Model>(std::move(model.value()));
    if (pc.kv_blocks > 0) {
        p.n_blocks = pc.kv_blocks;
    } else {
        const int64_t n = sim_kv_blocks(sim, pc.block_size);
        if (n < 1) return make_error("pool '", pc.name, "': ", sim_fit_error(sim, pc.block_size));
        p.n_blocks = (int)std::min<int64_t>(n, k_max_kv_blocks);
    }
    describe_pool(p);
    return p;
}

}  // namespace

Expected<Pool> load_pool(const PoolConfig& pc, const Config& config) {
    // parse_config refuses these; a Config built in code (Runtime::start(const Config&)) meets the
    // same limits here instead of std::system_error / std::bad_alloc in the engine.
    if (auto t = check_threads(pc.threads, "pool '" + pc.name + "' threads"); !t) return t.error();
    if (pc.max_batch < 1 || pc.max_batch > k_max_batch || pc.max_batch_tokens < 1 || pc.max_batch_tokens > k_max_batch_tokens ||
        pc.kv_blocks < 0 || pc.kv_blocks > k_max_kv_blocks || pc.max_queue < 0 || pc.max_queue > k_max_queue ||
        !(pc.gpu_memory_fraction >= 0.05 && pc.gpu_memory_fraction <= 1))
        return make_error("pool '", pc.name, "': max_batch ", std::to_string(pc.max_batch), ", max_batch_tokens ",
                          std::to_string(pc.max_batch_tokens), ", kv_blocks ", std::to_string(pc.kv_blocks), " or max_queue ",
                          std::to_string(pc.max_queue), " is out of range (1..4096, 1..65536, 0..2^24, 0..2^20), or gpu_memory_fraction ",
                          std::to_string(pc.gpu_memory_fraction), " is outside [0.05, 1]");
    if (pc.sim) return load_sim_pool(pc, config);
    Pool p;
    p.cfg = pc;
    p.key = pool_key(pc, config);
    auto m = Model::load(pc.model);
    if (!m) return make_error("pool '", pc.name, "': ", m.error().message);
    if (pc.ctx > 0) {
        if (pc.ctx > (*m)->params().n_ctx_train)
            return make_error("pool '", pc.name, "': ctx ", std::to_string(pc.ctx), " is longer than the model's trained context of ",
                              std::to_string((*m)->params().n_ctx_train), " tokens (", pc.model, "); give ctx <= ",
                              std::to_string((*m)->params().n_ctx_train), " or 0 (the trained context)");
        (*m)->limit_context(pc.ctx);
    }
    p.model = std::shared_ptr<Model>(std::move(m.value()));
    auto backend = resolve_backend(pc);
    if (!backend) return backend.error();
    p.backend = *backend;
    if (!pc.draft.empty()) {
        const PoolConfig* d = config.find_pool(pc.draft);
        if (!d) return make_error("pool '", pc.name, "': draft = \"", pc.draft, "\" names no pool; define it or drop draft");
        auto dm = Model::load(d->model);
        if (!dm) return make_error("pool '", pc.name, "': its draft (pool '", d->name, "'): ", dm.error().message);
        if (auto ok = check_draft_model(*p.model, **dm); !ok)
            return make_error("pool '", pc.name, "': draft = \"", pc.draft, "\" cannot draft for it: ", ok.error().message,
                              "; or drop draft from pool '", pc.name, "'");
        p.draft_model = std::shared_ptr<Model>(std::move(dm.value()));
    }
    const ModelParams& mp = p.model->params();
    const KvTypes kt = kv_types_of(pc);
    for (const Model* m : {p.model.get(), p.draft_model.get()})
        if (m)
            if (auto ok = check_kv_types(KvStorage::config_for(m->params(), 1, pc.block_size, kt.k, kt.v), p.backend == "cuda"); !ok)
                return make_error("pool '", pc.name, "' (kv_type_k ", kv_dtype_name(kt.k), ", kv_type_v ", kv_dtype_name(kt.v), ", backend ",
                                  p.backend, "): ", ok.error().message);
    for (const BucketConfig& b : config.buckets)
        if (b.pool == pc.name && b.speculation && b.speculation_source == "self" && b.speculation_self_layers >= mp.n_layer)
            return make_error("bucket '", b.name, "': [bucket.speculation] self_layers = ", std::to_string(b.speculation_self_layers),
                              " is not below the ", std::to_string(mp.n_layer), " layers of pool '", pc.name,
                              "''s model; use 1..", std::to_string(mp.n_layer - 1), " (fewer layers than the target draft)");
    if (kv_sized_by_device(p)) {
        if (auto s = size_device_kv(p, config, false); !s) return s.error();
        return p;
    }
    // The KV and activations live in host memory on the CPU backend; on a cuda pool kv_blocks /
    // kv_gib size the device's KV and kv_block_count's host check is the CPU's only.
    auto n_blocks = kv_block_count(pc, mp, p.backend == "cpu");
    if (!n_blocks) return n_blocks.error();
    p.n_blocks = *n_blocks;
    describe_pool(p);
    return p;
}

bool kv_sized_by_device(const Pool& p) { return p.backend == "cuda" && !p.cfg.kv_size_set && p.cfg.kv_blocks <= 0; }

Expected<bool> size_device_kv(Pool& p, const Config& config, bool log) {
#ifdef STEWARD_HAVE_CUDA
    if (!kv_sized_by_device(p)) return true;
    auto n = cuda_kv_block_count(p, config, log);
    if (!n) return n.error();
    p.n_blocks = *n;
    describe_pool(p);
#else
    (void)p, (void)config, (void)log;
#endif
    return true;
}

// ChatML, for [[pool]] chat_template_fallback = "chatml": each message as
// <|im_start|>role\ncontent<|im_end|>\n, then <|im_start|>assistant\n.
extern const char* const k_chatml_template;
const char* const k_chatml_template =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

PromptPool prompt_pool(const Pool& p) {
    PromptPool out;
    out.name = p.cfg.name;
    if (!p.cfg.chat_template.empty()) {
        out.chat_template = p.cfg.chat_template;
        out.template_source = p.cfg.chat_template_file.empty() ? "config chat_template" : "chat_template_file " + p.cfg.chat_template_file;
    } else if (auto t = p.model->file().get_string("tokenizer.chat_template")) {
        out.chat_template = std::string(*t);
        out.template_source = "GGUF tokenizer.chat_template";
    } else if (p.cfg.chat_template_fallback == "chatml") {
        out.chat_template = k_chatml_template;
        out.template_source = "chat_template_fallback chatml";
    } else {
        out.template_source = "none";
    }
    const Tokenizer& tok = p.model->tokenizer();
    if (tok.bos() >= 0 && tok.bos() < tok.n_vocab()) out.bos_token = tok.token_text(tok.bos());
    if (tok.eos() >= 0 && tok.eos() < tok.n_vocab()) out.eos_token = tok.token_text(tok.eos());
    return out;
}

uint64_t vocabulary_fingerprint(const Tokenizer& tok) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)tok.n_vocab();  // FNV-1a over the texts, 0xff between
    for (int32_t i = 0; i < tok.n_vocab(); i++) {
        for (unsigned char ch : tok.token_text(i)) h = (h ^ ch) * 1099511628211ull;
        h = (h ^ 0xffu) * 1099511628211ull;
    }
    return h;
}

Expected<Pool> remote_pool(const PoolConfig& front, const Config& config, RemoteDescription d) {
    const std::string at = "pool '" + front.name + "' (worker " + front.remote + ", its pool '" + d.pool + "')";
    if (d.block_size <= 0 || d.block_size > 256 || d.n_blocks <= 0 || d.max_queue < 0)
        return make_error(at, ": the worker described block_size ", std::to_string(d.block_size), ", ", std::to_string(d.n_blocks),
                          " KV blocks and max_queue ", std::to_string(d.max_queue), "; a worker of another Steward version?");
    auto file = GgufFile::header_from_bytes(std::move(d.model_header), front.remote + ":" + d.model_path);
    if (!file) return make_error(at, ": its model header: ", file.error().message);
    auto m = Model::from_gguf(std::move(*file));
    if (!m) return make_error(at, ": its model header: ", m.error().message);
    Pool p;
    p.cfg = front;
    p.cfg.model = d.model_path;
    p.cfg.block_size = d.block_size;
    p.cfg.max_queue = d.max_queue;
    p.cfg.prefix_cache = d.prefix_cache;
    p.key = pool_key(front, config);
    p.model = std::shared_ptr<Model>(std::move(m.value()));
    p.n_blocks = d.n_blocks;
    describe_pool(p);
    return p;
}

EngineOptions engine_options(const Pool& p, const Config& config) {
    const PoolConfig& pc = p.cfg;
    EngineOptions eo;
    eo.n_blocks = p.n_blocks;
    eo.block_size = pc.block_size;
    eo.kv_dtype_k = kv_types_of(pc).k;
    eo.kv_dtype_v = kv_types_of(pc).v;
    eo.max_batch = pc.max_batch;
    eo.max_batch_tokens = pc.max_batch_tokens;
    eo.spec_max_slowdown = pc.spec_max_slowdown;
    eo.max_queue = pc.max_queue;
    eo.n_threads = pc.threads;
    eo.prefix_cache = pc.prefix_cache;
    eo.session_ttl_s = config.limits.session_ttl_ms / 1e3;
    eo.kv_events = pc.prefix_cache;  // they feed the cache actor's index of which pool holds which blocks
    eo.draft_model = p.draft_model.get();
    eo.draft_model_keep = p.draft_model;
    if (pc.sim) eo.sim = std::make_shared<const SimPoolConfig>(*pc.sim);
#ifdef STEWARD_HAVE_CUDA
    if (p.backend == "cuda") eo.backend = cuda_backend_factory(pc.cuda_graphs);
#endif
    const int n_layer = p.model->params().n_layer;
    for (const BucketConfig& b : config.buckets)
        if (b.pool == pc.name && b.speculation && b.speculation_source == "self" && b.speculation_self_layers < n_layer &&
            std::find(eo.self_draft_layers.begin(), eo.self_draft_layers.end(), b.speculation_self_layers) ==
                eo.self_draft_layers.end())
            eo.self_draft_layers.push_back(b.speculation_self_layers);
    return eo;
}

SpecSettings spec_settings_for(const BucketConfig& b, const Config& c, bool has_draft, int n_target_layers) {
    SpecSettings s;
    if (!b.speculation) return s;
    if (b.speculation_source == "self" && b.speculation_self_layers < n_target_layers) {
        s.source = SpecSource::SELF;
        s.self_layers = b.speculation_self_layers;
    } else if (b.speculation_source == "suffix") {
        s.source = SpecSource::SUFFIX;
    } else {
        s.source = b.speculation_source == "ngram" || !has_draft ? SpecSource::NGRAM : SpecSource::DRAFT;
    }
    if (s.source != SpecSource::NGRAM && s.source != SpecSource::SUFFIX) {
        s.tree = b.speculation_tree == "fixed" ? SpecTree::FIXED : b.speculation_tree == "dynamic" ? SpecTree::DYNAMIC : SpecTree::CHAIN;
        s.tree_branch = b.speculation_tree_branch;
        s.tree_depth = b.speculation_tree_depth;
    }
    s.k = std::min(c.limits.max_draft_tokens, k_max_spec_tokens);
    if (s.k <= 0) s.source = SpecSource::NONE;
    return s;
}

std::vector<std::vector<int32_t>> public_prefix_ids(const Pool& p, const Config& config) {
    const Tokenizer& tok = p.model->tokenizer();
    std::vector<std::vector<int32_t>> pubs;
    for (const auto& pp : config.public_prefixes) pubs.push_back(tok.encode(pp.text, tok.add_bos_default()));
    return pubs;
}

uint64_t model_file_fingerprint(const std::string& path) {
    // The size and 16 spread 64 KiB samples (the first holds the header and metadata): a rewritten,
    // requantized or replaced file changes it; reading all of a multi-GiB file at every start would not pay.
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) return 0;
    std::vector<uint8_t> bytes(reinterpret_cast<const uint8_t*>(&size), reinterpret_cast<const uint8_t*>(&size) + sizeof size);
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
        constexpr size_t chunk = 64 << 10;
        for (int i = 0; i < 16; i++) {
            const uintmax_t off = size <= chunk ? 0 : (size - chunk) / 15 * (uintmax_t)i;
            if (std::fseek(f, (long)off, SEEK_SET) != 0) break;
            const size_t at = bytes.size();
            bytes.resize(at + chunk);
            bytes.resize(at + std::fread(bytes.data() + at, 1, chunk, f));
            if (size <= chunk) break;
        }
        std::fclose(f);
    }
    return splitmix64(fnv1a_64(bytes));
}

Expected<std::shared_ptr<KvTiers>> open_kv_tiers(const Pool& p, const Config& config) {
    const KvTiersConfig& kt = p.cfg.kv_tiers;
    const ModelParams& mp = p.model->params();
    const KvTypes types = kv_types_of(p.cfg);
    const KvConfig one = KvStorage::config_for(mp, 1, p.cfg.block_size, types.k, types.v);
    KvTierIdentity id;
    id.payload_bytes = kv_bytes(one);  // one block: every layer's K and V
    std::ostringstream layout;
    layout << model_file_fingerprint(p.cfg.model) << '|' << p.cfg.block_size << '|' << kv_dtype_name(types.k) << '|'
           << kv_dtype_name(types.v) << '|' << mp.n_layer << '|' << mp.n_head_kv << '|' << mp.head_dim << '|' << id.payload_bytes;
    id.layout = splitmix64(fnv1a_64(std::span<const uint8_t>((const uint8_t*)layout.str().data(), layout.str().size())));
    std::ostringstream salts;  // the configured salts: a tenant's derived salt depends on its name only
    for (const TenantConfig& t : config.tenants)
        if (t.salt) salts << t.name << '=' << t.salt << ';';
    id.salts = splitmix64(fnv1a_64(std::span<const uint8_t>((const uint8_t*)salts.str().data(), salts.str().size())));
    KvTierOptions o;
    o.host_bytes = (int64_t)(kt.host_gib * (double)(1ull << 30));
    o.disk_bytes = (int64_t)(kt.disk_gib * (double)(1ull << 30));
    o.disk_dir = kt.disk_dir;
    auto tiers = KvTiers::open(o, id);
    if (!tiers) return make_error("pool '", p.cfg.name, "' [pool.kv_tiers]: ", tiers.error().message);
    return std::shared_ptr<KvTiers>(std::move(*tiers));
}

Expected<std::unique_ptr<Engine>> make_engine(const Pool& p, const Config& config) {
    std::unique_ptr<Engine> engine;
    EngineOptions eo = engine_options(p, config);
    if (p.cfg.kv_tiers.enabled()) {
        auto tiers = open_kv_tiers(p, config);
        if (!tiers) return tiers.error();
        eo.kv_tiers = std::move(*tiers);
        const KvTierStats& st = eo.kv_tiers->stats();
        spdlog::info("pool '{}': KV tiers host {:.2f} GiB, disk {:.2f} GiB{}{}: {} blocks found on disk, {} files dropped",
                     p.cfg.name, p.cfg.kv_tiers.host_gib, p.cfg.kv_tiers.disk_gib,
                     p.cfg.kv_tiers.disk_dir.empty() ? "" : " in ", p.cfg.kv_tiers.disk_dir,
                     st.tier[(int)KvTier::DISK].n_blocks, st.n_dropped_files);
    }
    try {
        engine = std::make_unique<Engine>(*p.model, eo);
    } catch (const std::exception& e) {  // the backend's (device memory) or the draft's
        return make_error("pool '", p.cfg.name, "': ", e.what());
    }
    if (!p.backend.empty() && p.backend != "cpu") spdlog::info("pool '{}' runs on {}", p.cfg.name, engine->backend_name());
    engine->set_public_prefixes(public_prefix_ids(p, config));
    return engine;
}

MetricsConfig metrics_config(const Config& config, const std::vector<const Pool*>& pools) {
    MetricsConfig mc;
    for (const PoolConfig& pc : config.pools) mc.prices[pc.name] = PoolPrice{pc.price_prompt, pc.price_cached, pc.price_output};
    if (!pools.empty()) {
        const Pool& p = *pools.front();
        const ModelParams& mp = p.model->params();
        KvShape ks;
        ks.n_layers = mp.n_layer;
        ks.n_blocks = p.n_blocks;
        ks.block_size = p.cfg.block_size;
        ks.n_kv_heads = mp.n_head_kv;
        ks.head_dim = mp.head_dim;
        // The mean bytes of a K and a V element, so that the 2 * L * T * H * D * bytes formula gives
        // k_slot_bytes + v_slot_bytes per layer and slot for any pair of types (q8_0: 34 / 32).
        const KvTypes kt = kv_types_of(p.cfg);
        const KvConfig one = KvStorage::config_for(mp, 1, p.cfg.block_size, kt.k, kt.v);
        ks.bytes_per_elem = (double)(one.k_slot_bytes() + one.v_slot_bytes()) / (2.0 * mp.n_head_kv * mp.head_dim);
        mc.kv = ks;
    }
    for (const BucketConfig& b : config.buckets) mc.slo[b.name] = BucketSlo{b.slo_ttft_ms, b.slo_tpot_ms};
    mc.vllm_names = config.metrics.vllm_names;
    return mc;
}

std::vector<PoolPlan> plan_generation(const Config& config, const std::vector<const Pool*>& previous) {
    std::vector<PoolPlan> plan;
    for (const PoolConfig& pc : config.pools) {
        PoolPlan pp;
        pp.key = pool_key(pc, config);
        for (size_t i = 0; i < previous.size(); i++)
            if (previous[i]->key == pp.key) pp.keep = (int)i;
        plan.push_back(std::move(pp));
    }
    return plan;
}

std::vector<PoolProfile> generation_profiles(const Config& config, const std::vector<const Pool*>& pools) {
    double max_params = 0;
    for (const Pool* p : pools) max_params = std::max(max_params, p->profile.n_params);
    std::vector<PoolProfile> out;
    for (size_t i = 0; i < pools.size(); i++) {
        PoolProfile pr = pools[i]->profile;  // the model's figures, taken at load
        const PoolConfig& pc = i < config.pools.size() ? config.pools[i] : pools[i]->cfg;
        pr.max_queue = pc.max_queue;
        pr.price_prompt = pc.price_prompt;
        pr.price_output = pc.price_output;
        pr.price_cached = pc.price_cached;
        pr.quality_prior = pc.quality >= 0 ? pc.quality : (max_params > 0 ? pr.n_params / max_params : 1.0);
        out.push_back(std::move(pr));
    }
    return out;
}

}  // namespace steward
