// `steward serve [--config FILE | -m MODEL.gguf ...] [--host H] [--port P]`: the OpenAI-compatible
// HTTP server over a Runtime until SIGINT or SIGTERM (then /health answers 503, running requests are
// cancelled, the server stops). It listens first (503 "loading" while the models load); SIGHUP
// reloads a config file. Prints the address it listens on (port 0: the one it got). With -m, the
// config is one pool built in memory from llama-server's flags (serve_config_toml).
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "model/gguf.h"

#include <steward/runtime.h>

#include "cli/commands.h"
#include "util/strings.h"
#include "config/config.h"
#include "serve/http_server.h"

namespace {

int g_stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
    const char c = (char)sig;
    (void)!::write(g_stop_pipe[1], &c, 1);  // async-signal-safe; a full pipe already holds a stop
}

// SIGINT / SIGTERM: a handler writes the signal to a pipe that the main thread reads once all is
// up. A handler, not sigwait with the signals blocked: threads that libraries start on their own
// (BLAS, OpenMP) need not have them blocked, and the default action would end the process.
bool catch_stop_signals() {
    if (::pipe(g_stop_pipe) != 0) return false;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    return true;
}

// Blocks until one of them arrives; returns which.
char wait_for_stop_signal() {
    char sig = 0;
    while (::read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    return sig;
}

}  // namespace

namespace steward {

namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_str(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += (char)c;
        else if (c < 0x20 || c == 0x7f) {
            char b[8];
            snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else o += (char)c;
    }
    return o + "\"";
}

std::string absolute(const std::string& p) {
    std::error_code ec;
    auto a = std::filesystem::absolute(p, ec);
    return ec ? p : a.lexically_normal().string();
}

}  // namespace

std::optional<std::string> refused_server_flag(const std::string& arg) {
    const std::string flag = arg.substr(0, arg.find('='));
    struct Refusal {
        std::initializer_list<const char*> names;
        const char* why;
    };
    static const Refusal refusals[] = {
        {{"-ngl", "--n-gpu-layers", "--gpu-layers"},
         "Steward runs a whole model on one backend: a config's [[pool]] backend = \"cuda\" (or \"auto\") puts every layer on the GPU"},
        {{"-fa", "--flash-attn"}, "the backend picks its attention kernels; drop the flag"},
        {{"-b", "--batch-size", "-ub", "--ubatch-size", "--max-num-batched-tokens"},
         "the step's token budget is a config's [[pool]] max_batch_tokens (steward serve --print-config, then edit it)"},
        {{"--kv-cache-dtype"},
         "give the KV cache types as llama-server does, -ctk TYPE -ctv TYPE (f32, f16, bf16, q8_0, q4_0), or a config's "
         "[[pool]] kv_type_k / kv_type_v (fp8 with backend = \"cuda\")"},
        {{"--lora", "--lora-scaled", "--lora-base"}, "LoRA adapters are not supported"},
        {{"-sm", "--split-mode", "-ts", "--tensor-split", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size"},
         "a model runs on one device; several machines serve as workers (steward worker, docs/cluster.md)"},
        {{"--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"},
         "RoPE comes from the GGUF; contexts past the trained one are refused"},
        {{"--mlock", "--no-mmap", "--numa"}, "memory placement is Steward's (huge pages; STEWARD_MMAP=1 maps the file)"},
        {{"--slots", "--slot-save-path", "--props"}, "slots are llama-server's; Steward's sessions keep a conversation's KV (docs/http-api.md)"},
        {{"-hf", "--hf-repo", "-mu", "--model-url", "--download-dir"}, "Steward loads a local GGUF file: give -m PATH"},
        {{"--gpu-memory-utilization"}, "a config's [[pool]] gpu_memory_fraction (with backend = \"cuda\")"},
    };
    for (const Refusal& r : refusals)
        for (const char* n : r.names)
            if (flag == n)
                return "serve: " + flag + " (llama-server's / vLLM's) is not a Steward flag: " + r.why +
                       " (flags: docs/serve-flags.md)";
    return std::nullopt;
}

Expected<std::string> serve_config_toml(const ServeOptions& o) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.model_path, ec))
        return make_error("-m ", o.model_path, ": no such model file; give the path of a GGUF model");
    auto file = GgufFile::open(o.model_path);
    if (!file) return make_error("-m ", o.model_path, ": ", file.error().message);
    const std::string arch(file.value()->get_string("general.architecture").value_or(""));
    const int64_t trained = file.value()->get_int(arch + ".context_length").value_or(0);
    if (o.ctx > 0 && trained > 0 && o.ctx > trained)
        return make_error("-c ", std::to_string(o.ctx), " is longer than the model's trained context of ", std::to_string(trained),
                          " tokens (", o.model_path, "); give -c ", std::to_string(trained), " or less (0: the trained context)");
    const int parallel = o.parallel > 0 ? o.parallel : 4;
    const int64_t ctx = o.ctx > 0 ? o.ctx : trained > 0 ? trained : 4096;
    std::string name = o.alias;
    if (name.empty()) name = std::filesystem::path(o.model_path).stem().string();
    if (name.empty() || name == "steward") name = "model";
    const int block = 16;
    const int64_t kv_blocks = std::max<int64_t>(1, (ctx * parallel + block - 1) / block);
    std::string t;
    t += "# The config of `steward serve -m`: one pool of one model. `steward serve --config FILE` runs the same;\n";
    t += "# a file is the way to several pools, buckets and tenants (docs/config.md).\n";
    t += "[server]\nhost = " + toml_str(o.host.empty() ? "127.0.0.1" : o.host) + "\nport = " +
         std::to_string(o.port >= 0 ? o.port : 8080) + "\n\n";
    if (o.n_predict != -2) {
        if (o.n_predict == 0 || o.n_predict < -1) return make_error("-n ", std::to_string(o.n_predict), ": give N >= 1, or -1 (the rest of the context)");
        if (o.n_predict > 0) t += "[limits]\nmax_tokens_default = " + std::to_string(o.n_predict) + "\n\n";
    }
    t += "[[pool]]\nname = " + toml_str(name) + "\nmodel = " + toml_str(absolute(o.model_path)) + "\n";
    if (o.threads > 0) t += "threads = " + std::to_string(o.threads) + "\n";
    if (o.ctx > 0) t += "ctx = " + std::to_string(o.ctx) + "\n";
    t += "max_batch = " + std::to_string(parallel) + "\n";
    t += "# KV for " + std::to_string(parallel) + " sequences of the whole context (" + std::to_string(ctx) + " tokens each)\n";
    t += "kv_blocks = " + std::to_string(kv_blocks) + "\nblock_size = " + std::to_string(block) + "\n";
    if (!o.chat_template_file.empty()) t += "chat_template_file = " + toml_str(absolute(o.chat_template_file)) + "\n";
    if (!o.pooling.empty()) t += "pooling = " + toml_str(o.pooling) + "\n";  // the config checks the value
    // llama-server's -ctk / -ctv names; its other cache types (q4_1, q5_0, q5_1, iq4_nl) have no kernels here.
    for (auto [flag, key, value] : {std::tuple{"-ctk", "kv_type_k", &o.cache_type_k}, std::tuple{"-ctv", "kv_type_v", &o.cache_type_v}}) {
        if (value->empty()) continue;
        std::string v = *value;
        for (char& ch : v) ch = (char)std::tolower((unsigned char)ch);
        if (v != "f32" && v != "f16" && v != "bf16" && v != "q8_0" && v != "q4_0")
            return make_error(flag, " ", *value, ": not a KV cache type Steward has; use f32, f16, bf16, q8_0 or q4_0 (docs/kv-cache-types.md)");
        t += std::string(key) + " = " + toml_str(v) + "\n";
    }
    if (!o.draft_path.empty()) t += "draft = " + toml_str(name + "-draft") + "\n";
    // KV tiers: llama-server's --cache-ram (MiB) or vLLM's --kv-offloading-size (GiB), and a disk tier.
    if (o.cache_ram_mib >= 0 && o.kv_offload_gib >= 0)
        return make_error("--cache-ram and --kv-offloading-size both size the host KV tier; give one");
    const double host_gib = o.cache_ram_mib >= 0 ? o.cache_ram_mib / 1024.0 : o.kv_offload_gib;
    if (o.kv_disk_gib >= 0 && o.kv_disk_dir.empty()) return make_error("--kv-disk-gib needs --kv-disk-dir DIR (a private directory for the KV files)");
    if (host_gib > 0 || !o.kv_disk_dir.empty()) {
        t += "[pool.kv_tiers]\n";
        if (host_gib > 0) t += "host_gib = " + std::to_string(host_gib) + "\n";
        if (!o.kv_disk_dir.empty())
            t += "disk_gib = " + std::to_string(o.kv_disk_gib >= 0 ? o.kv_disk_gib : 10.0) + "\ndisk_dir = " + toml_str(absolute(o.kv_disk_dir)) + "\n";
    }
    if (!o.draft_path.empty()) {
        t += "\n# The draft model (-md): a pool of its own, which the target loads again as its drafter.\n";
        t += "[[pool]]\nname = " + toml_str(name + "-draft") + "\nmodel = " + toml_str(absolute(o.draft_path)) + "\n";
        if (o.threads > 0) t += "threads = " + std::to_string(o.threads) + "\n";
        t += "max_batch = 1\nkv_blocks = " + std::to_string(std::max<int64_t>(1, (ctx + block - 1) / block)) + "\n";
    }
    for (const std::string& k : o.api_keys)
        if (k.empty()) return make_error("--api-key: an empty key would let anyone in; give a key");
    if (!o.api_keys.empty()) {
        t += "\n# --api-key: one tenant whose keys may do everything, llama-server's single key.\n";
        t += "[[tenant]]\nname = \"default\"\nadmin = true\napi_keys = [";
        for (size_t i = 0; i < o.api_keys.size(); i++) t += (i ? ", " : "") + toml_str(o.api_keys[i]);
        t += "]\n";
    }
    t += "\n[[bucket]]\nname = \"default\"\npool = " + toml_str(name) + "\n";
    if (!o.draft_path.empty()) {
        const int k = o.draft_max > 0 ? o.draft_max : 16;
        if (k > 16) return make_error("--draft-max ", std::to_string(k), ": at most 16 draft tokens per step");
        t += "[bucket.speculation]\nplugin = \"adaptive\"\nsource = \"draft\"\nk_max = " + std::to_string(k) + "\n";
    } else if (o.draft_max > 0) {
        return make_error("--draft-max needs a draft model: add -md DRAFT.gguf");
    }
    return t;
}

int cmd_serve(const ServeOptions& o) {
    const bool from_model = !o.model_path.empty();
    if (from_model && !o.config_path.empty())
        return cli_fail("serve: give a model (-m) or a config (--config), not both; a config names its models in [[pool]]");
    const bool model_flags = o.ctx >= 0 || o.parallel > 0 || o.threads > 0 || !o.chat_template_file.empty() || !o.draft_path.empty() ||
                             o.draft_max > 0 || !o.api_keys.empty() || !o.alias.empty() || o.n_predict != -2 || o.print_config ||
                             !o.pooling.empty() || !o.cache_type_k.empty() || !o.cache_type_v.empty() || o.cache_ram_mib >= 0 ||
                             o.kv_offload_gib >= 0 || !o.kv_disk_dir.empty() || o.kv_disk_gib >= 0;
    if (!from_model && model_flags)
        return cli_fail("serve: -c, -np, -t, --chat-template-file, -md, --draft-max, --api-key, --alias, -n, --pooling, -ctk, -ctv, --cache-ram, "
                        "--kv-offloading-size, --kv-disk-dir, --kv-disk-gib and --print-config "
                        "build a config from a model: add -m MODEL.gguf (with --config, set them in the file)");
    std::string config_path = o.config_path;
    if (!from_model && config_path.empty()) {
        std::error_code ec;
        if (!std::filesystem::exists("configs/default.toml", ec))
            return cli_fail("serve: give a model (steward serve -m MODEL.gguf) or a config (steward serve --config FILE.toml); "
                            "there is no configs/default.toml here");
        config_path = "configs/default.toml";
    }
    Expected<Config> cfg = make_error("");
    if (from_model) {
        auto toml = serve_config_toml(o);
        if (!toml) return cli_fail("serve: " + toml.error().message);
        if (o.print_config) {
            std::fputs(toml->c_str(), stdout);
            return 0;
        }
        cfg = parse_config(*toml, "<steward serve -m>");
    } else {
        cfg = load_config(config_path);
    }
    if (!cfg) return cli_fail(cfg.error().message);
    ServerConfig sc = cfg->server;
    if (!o.host.empty()) sc.host = o.host;
    if (o.port >= 0) sc.port = o.port;
    if (!catch_stop_signals()) return cli_fail("serve: cannot create the stop pipe");

    // Listening before the models load: /health answers 503 "loading" until the runtime is up.
    auto server = serve::HttpServer::start(nullptr, sc);
    if (!server) return cli_fail(server.error().message);
    std::printf("steward serve: listening on http://%s:%u (OpenAI base_url http://%s:%u/v1)\n", sc.host.c_str(),
                (unsigned)(*server)->port(), sc.host.c_str(), (unsigned)(*server)->port());
    std::fflush(stdout);
    RuntimeOptions ro;
    ro.trace_capacity = (size_t)sc.trace_requests;
    // From a file: reloads re-read it (SIGHUP too). From -m: no file to re-read.
    auto rt = from_model ? Runtime::start(*cfg, ro) : Runtime::start(config_path, ro);
    if (!rt) {
        (*server)->stop();
        return cli_fail(rt.error().message);
    }
    if (!from_model) Runtime::route_sighup_to_reload();
    (*server)->attach(**rt);
    std::fprintf(stderr, "steward serve: ready\n");
    const char sig = wait_for_stop_signal();
    std::fprintf(stderr, "steward serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    (*server)->set_draining(true);
    (*server)->stop();  // before the runtime goes: nothing of the server calls into it after this
    return 0;
}

int cmd_worker(const WorkerOptions& o) {
    std::string host;
    int port = 0;
    if (!split_host_port(o.listen, host, port, 0))
        return cli_fail("worker: --listen '" + o.listen + "' is not HOST:PORT (port 0..65535, 0: an ephemeral one)");
    if (!catch_stop_signals()) return cli_fail("worker: cannot create the stop pipe");
    auto rt = Runtime::start(o.config_path);
    if (!rt) return cli_fail(rt.error().message);
    Runtime::route_sighup_to_reload();
    auto bound = (*rt)->listen_for_fronts(host, port, o.wire_version);
    if (!bound) return cli_fail("worker: " + bound.error().message);
    std::string pools;
    for (const PoolInfo& p : (*rt)->pools()) pools += (pools.empty() ? "" : ", ") + p.name;
    std::printf("steward worker: listening on %s:%d for fronts (pools: %s)\n", host.c_str(), *bound, pools.c_str());
    std::fflush(stdout);
    const char sig = wait_for_stop_signal();
    std::fprintf(stderr, "steward worker: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    // Fronts retry what ran here. The runtime stops within milliseconds (on this thread: CAF's actor
    // system must end where it began; ~Runtime waits for its executors before the middleman stops,
    // which once hung 1 shutdown in 4). The watchdog is a last resort only: the cluster test fails
    // if it ever fires.
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::fprintf(stderr, "steward worker: the runtime did not stop within 10 s; exiting\n");
        std::fflush(stderr);
        std::_Exit(0);
    }).detach();
    rt->reset();
    return 0;
}

}  // namespace steward
