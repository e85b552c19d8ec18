// steward/config.h (public): the runtime's configuration as values: pools, buckets (classification
// rules and routing), tenants, public prefixes, limits and the server; docs/config.md, the config
// reference, documents every key. Runtime::start(const Config&) takes one, Runtime::config() shows
// the live one. parse_config / load_config read TOML and validate completely; an error names
// file:line:column, the key, the value and the fix. Plain value types (not synchronised); the
// functions are thread-safe. Standard library and <steward/expected.h> only.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <steward/expected.h>

namespace steward {

// [pool.synth]: a synthetic model written to the pool's model path when that file is missing.
struct SynthConfig {
    std::string arch = "llama";
    int dim = 256, layers = 4, heads = 4, kv_heads = 4, ffn = 688, vocab = 4096, ctx = 2048;
    std::string dtype = "f32";
    uint64_t seed = 1;
    std::string draft_from;  // pool name: derive by keeping the first keep_layers layers
    int keep_layers = 0;
    // Test fixture for speculation (model/synth.h): layers >= late_from get their residual branches
    // scaled by late_scale, so a draft of the first late_from layers agrees with the target often.
    double late_scale = 1.0;
    int late_from = -1;  // -1: off
};

// A simulated accelerator (backend = "sim"): one device's figures, read from a device profile file
// (configs/sim/*.toml, table [device]). Peaks are dense tensor-core rates without sparsity.
struct SimDeviceConfig {
    std::string name;
    std::string file;                 // where it was read from
    double tflops_16 = 0;             // TFLOP/s with 16-bit operands (BF16 / F16)
    double tflops_8 = 0;              // TFLOP/s with 8-bit operands (FP8); 0: tflops_16
    double tflops_32 = 0;             // TFLOP/s with F32 operands (a CPU's rate); 0: tflops_16 / 2
    double hbm_gbps = 0;              // memory bandwidth, GB/s (1e9 bytes)
    double hbm_gib = 0;               // memory per device, GiB
    double link_gbps = 0;             // tensor-parallel all-reduce bandwidth per device, GB/s (NVLink)
    double link_latency_us = 0;       // per all-reduce
    // Share of the peak each kernel class reaches: weight GEMMs, attention, memory streams.
    double eff_gemm = 0.7, eff_attn = 0.5, eff_mem = 0.8;
    // Attention of one-token rows (decode), when its kernel differs from prefill's; < 0: eff_attn.
    double eff_attn_decode = -1;
    // The GEMMs' ramp: with n tokens in a step they reach n / (n + gemm_ramp_tokens) of
    // peak x eff_gemm (small batches underuse the units); 0: no ramp.
    double gemm_ramp_tokens = 0;
    double step_overhead_us = 0;      // per forward (launch, scheduling, sampling)
    double layer_overhead_us = 0;     // per layer per forward (kernel launches)
};

// A simulated model's shape (a model shape file, table [model]). The sim builds a GGUF header of
// this shape (metadata, a synthetic tokenizer, tensor infos; no weights) and runs it as a model.
struct SimModelConfig {
    std::string name;
    std::string file;
    int layers = 0, dim = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, ctx = 8192;
    std::string weight_dtype = "bf16";  // f32 | bf16 | f16 | fp8
    std::string kv_dtype = "bf16";      // f32 | bf16 | f16 | fp8
};

// [pool.sim]: the simulated backend's device, model and token generator.
struct SimPoolConfig {
    SimDeviceConfig device;
    SimModelConfig model;
    std::optional<SimModelConfig> draft;  // a draft model's shape (speculation source "draft")
    int tp = 1;                           // tensor-parallel degree: devices per replica
    double memory_fraction = 0.9;         // of the devices' memory for weights + KV (vLLM's gpu_memory_utilization)
    double acceptance = 0.7;              // draft acceptance per position for buckets without [bucket.sim]
    double concentration = 8;             // a request's acceptance ~ Beta(mean, concentration)
    uint64_t seed = 1;
};

// [bucket.sim]: the bucket's draft acceptance on simulated pools: each request draws its own
// per-position acceptance from Beta(acceptance x concentration, (1 - acceptance) x concentration).
struct BucketSimConfig {
    double acceptance = -1;     // < 0: the pool's [pool.sim] acceptance
    double concentration = -1;  // < 0: the pool's
};

// [sim]: process-wide settings of simulated pools.
struct SimConfig {
    // Simulated seconds per real second: every clock of the runtime (latencies, deadlines, arrival
    // times of `steward run`) runs this much faster, and a simulated step sleeps its cost / dilation.
    // Read when the runtime starts (a reload keeps the first value).
    double dilation = 1;
};

// [pool.kv_tiers]: where cached KV blocks the pool evicts go instead of being lost (docs/kv-tiers.md).
struct KvTiersConfig {
    double host_gib = 0;   // host-memory tier budget (0: none)
    double disk_gib = 0;   // disk tier budget (0: none)
    std::string disk_dir;  // the disk tier's private directory (one per pool; relative: to the config file)
    bool enabled() const { return host_gib > 0 || disk_gib > 0; }
};

// One [[pool]]: a model with its own KV cache, batcher and prices.
struct PoolConfig {
    std::string name;
    std::string model;              // GGUF path (relative to the config file's directory)
    std::optional<SynthConfig> synth;
    std::string backend = "cpu";    // cpu | cuda (an error where no device is usable) | auto (cuda if found) | sim
    std::optional<SimPoolConfig> sim;  // [pool.sim], required with backend = "sim"
    int threads = 0;                // 0: all cores
    int kv_blocks = 0;              // 0: derive from kv_gib
    double kv_gib = 0.25;
    bool kv_size_set = false;       // kv_blocks or kv_gib was given (else a cuda pool sizes its KV from the device)
    // backend cuda without kv_blocks / kv_gib: the share of the device's free memory the pool takes
    // for weights, activations and KV together (vLLM's gpu_memory_utilization, of free memory)
    double gpu_memory_fraction = 0.9;
    // backend cuda: decode steps replay CUDA graphs (gpu/forward.h); false launches every kernel
    // (vLLM's enforce_eager)
    bool cuda_graphs = true;
    int block_size = 16;
    std::string kv_dtype = "f32";   // f32 | f16 | bf16 | q8_0 | q4_0 | fp8 (cuda): K and V both (docs/kv-cache-types.md)
    std::string kv_type_k;          // K's type, same names; empty: kv_dtype
    std::string kv_type_v;          // V's type, same names; empty: kv_dtype
    int max_batch = 32;             // sequences per step
    int max_batch_tokens = 512;     // token budget per step (chunked prefill fills the rest; bench_sched)
    // Speculation's cap on a step shared with sequences that do not draft (other buckets, controls,
    // prefill chunks): the drafts of a step may add at most this share of its predicted plain time
    // (priced at the measured cost per verified and per drafted token), so they cannot take more
    // than that from the others' TPOT. 0: no cap (the default; configs/default.toml sets 0.05). In
    // [0, 10].
    double spec_max_slowdown = 0.0;
    int max_queue = 256;            // waiting requests before 'overloaded'
    double kv_overcommit = 1.0;     // KV admission: reservations may total kv_blocks x this (>= 1; 1: no preemption among admitted requests)
    bool prefix_cache = true;
    // Prices per million tokens (cost/request in docs/metrics.md).
    double price_prompt = 0.0, price_output = 0.0, price_cached = 0.0;
    // Prior quality in [0, 1] a routing policy sees until shadowed requests measure it; < 0: the
    // pool's parameter count relative to the largest pool's.
    double quality = -1.0;
    // A Jinja chat template replacing the GGUF's tokenizer.chat_template (path relative to the
    // config file), and its text, read when the config is.
    std::string chat_template_file;
    std::string chat_template;
    // How /v1/embeddings pools this pool's final-norm hidden states: "mean", "last" or "cls" (the
    // first token); "": the GGUF's <arch>.pooling_type, else "last".
    std::string pooling;
    // A chat to a pool with no template (none in its GGUF, no chat_template_file): "" refuses it with
    // a 400 naming chat_template_file; "chatml" renders ChatML (<|im_start|>role ... <|im_end|>).
    std::string chat_template_fallback;
    // The context a request may fill (prompt + output), in tokens; 0: the model's trained context.
    // At most the trained context (a longer one would run RoPE past what the model learned).
    int ctx = 0;
    // The pool whose model is this pool's draft model for speculative decoding ("": none). Loaded
    // with this pool (same vocabulary required); its KV comes out of this pool's KV budget.
    std::string draft;
    // A pool hosted by a worker process (`steward worker --listen HOST:PORT`): "host:port" to connect
    // to; the model, KV and engine fields are the worker's (its own config), this entry gives the
    // name, prices and quality the front routes with. remote_pool: the pool's name in the worker's
    // config ("": this pool's name).
    std::string remote;
    std::string remote_pool;
    // [pool.kv_tiers] (none: evicted blocks are gone).
    KvTiersConfig kv_tiers;
};

// One parameter of a policy plugin: the TOML scalar as written.
using PolicyParam = std::variant<int64_t, double, bool, std::string>;

// A bucket's [bucket.routing] / [bucket.eviction] / [bucket.speculation] table: the plugin (a name
// searched in the plugin directories, or a path) and every other key as its parameters.
// Where a bucket's plugin instance runs ([plugins] isolation, or isolation in the policy's table).
enum class PluginIsolation {
    IN_PROCESS,  // "in_process": in the server's own process (the fastest; a crash takes the server down)
    PROCESS,     // "process": in a supervised plugin host process; a crash or hang costs that decision
};

struct PolicySpec {
    std::string plugin;
    std::optional<PluginIsolation> isolation;        // this table's `isolation`; none: [plugins] isolation
    std::map<std::string, PolicyParam> params;
    std::map<std::string, std::string> param_where;  // key -> file:line:column
    std::string where;                               // the table's file:line:column
};

// A request is put in the first bucket whose rules all match (absent rules match anything).
struct BucketMatch {
    std::vector<std::string> hints;  // the request's bucket hint is one of these
    std::optional<int> min_prompt_tokens, max_prompt_tokens;
    std::optional<int> min_max_tokens, max_max_tokens;
    std::optional<double> min_temperature, max_temperature;
    std::optional<bool> tools;
    std::optional<std::string> response_format;
    std::vector<std::string> tenants;
};

// One [[bucket]]: a workload class, its matching rules and its policies.
struct BucketConfig {
    std::string name;
    BucketMatch match;
    std::string pool;   // routing by rules: the pool this bucket's requests go to
    int priority = 0;   // higher runs first; the lowest is preempted first
    double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput targets (0: none)
    std::optional<PolicySpec> routing;      // none: route to `pool` (the rules)
    std::optional<PolicySpec> eviction;     // none: least recently used
    std::optional<PolicySpec> speculation;  // none: no draft tokens
    // [bucket.speculation] source: "draft" (the pool's draft model), "self" (the target's first
    // self_layers layers), "ngram" (prompt lookup) or "suffix" (suffix decoding); "" (omitted):
    // "draft" on a pool with a draft model, else "ngram".
    std::string speculation_source;
    int speculation_self_layers = 0;     // source "self": the target layers that draft (>= 1)
    std::string speculation_tree = "chain";  // "chain", "fixed" (branch per depth) or "dynamic" (EAGLE-2)
    int speculation_tree_branch = 2;     // fixed / dynamic: children per expanded node, [1, 8]
    int speculation_tree_depth = 4;      // fixed / dynamic: deepest draft token, [1, 16]
    // [bucket.speculation] control_share, [0, 0.5]: this share of the bucket's requests (chosen by a
    // hash of their id) run without speculation, as a control: their TPOT is the measured gain's
    // baseline in the same run (docs/metrics.md).
    double speculation_control_share = 0;
    // A run lost with its worker (the process died or stopped answering heartbeats): "retry" it on
    // another pool of the same vocabulary from its prompt and the tokens already streamed, or "fail"
    // the request with an error naming the worker.
    std::string on_worker_loss = "retry";
    BucketSimConfig sim;  // [bucket.sim]
};

// One [[tenant.tool_cache]]: a tool whose results Steward caches for the tenant (docs/reuse.md).
struct ToolCacheConfig {
    std::string tool;               // the function's name
    double ttl_s = 300;             // a result older than this is never served
    std::string scope = "session";  // "session", "tenant" (the caller's labels) or "public" (every tenant that declares it public)
    std::vector<std::string> key;   // the argument fields forming the key; empty: all of them
};

// One [[tenant]]: tenants never share KV blocks except inside public prefixes.
struct TenantConfig {
    std::string name;
    uint64_t salt = 0;  // 0: derived from the name
    std::vector<std::string> api_keys;  // bearer keys of the HTTP server: with any configured, a request's key names its tenant
    double kv_quota = -1;  // share of each pool's KV blocks for eviction policies (tenant_fair); < 0: none
    // Its keys may also POST /admin/* and read every tenant's series on /metrics (docs/http-api.md).
    bool admin = false;
    // Permission labels (docs/reuse.md): every request of the tenant carries `labels`; a request's
    // own "labels" field may add labels matching `allowed_labels` ("user:*": any label starting
    // "user:"). A document's acl is covered by any one label in common.
    std::vector<std::string> labels;
    std::vector<std::string> allowed_labels;
    std::vector<ToolCacheConfig> tool_cache;  // [[tenant.tool_cache]]
};

// One [[public_prefix]] (or RuntimeOptions::extra_public_prefixes): text every tenant may share.
struct PublicPrefixConfig {
    std::string name;
    std::string text;  // tokenized per pool; blocks fully inside it are shared across tenants
};

// [limits]
struct LimitsConfig {
    double request_timeout_ms = 120000;  // deadline from arrival; 0: none
    double session_ttl_ms = 60000;       // KV of an idle session stays pinned this long
    // A request without max_tokens: the library's (GenerationRequest::max_tokens 0) get this; the
    // HTTP server's get the rest of the pool's context (vLLM's and llama-server's default) unless
    // the file sets it (max_tokens_default_set).
    int max_tokens_default = 128;
    bool max_tokens_default_set = false;
    int max_draft_tokens = 16;           // a speculation policy's budget above this is invalid
};

// [plugins]
struct PluginsConfig {
    std::vector<std::string> dirs;  // searched for plugins named by name (relative to the config file)
    // Time budgets of one plugin decision (0: none, the plugin is called on the caller's thread).
    // Past it the safe default is used and counted (steward_plugin_timed_out_decisions_total).
    double decision_budget_ms = 50;       // routing (route, check_upgrade, on_outcome) and the router's draft budget
    double step_decision_budget_ms = 20;  // inside an engine step: eviction, per-sequence draft budgets
    // Before a config (at start or reload) adopts a plugin, load it in a forked child and run create()
    // and one decision of each kind there: a crash or hang fails the load, naming the plugin.
    bool check_in_child = false;
    double check_timeout_ms = 5000;  // the child's time limit
    // Where plugin instances run unless a policy table says otherwise (docs/plugin-abi.md#isolation).
    // "process": each instance in a plugin host process of its own, restarted after a crash or hang;
    // check_timeout_ms also bounds its create().
    PluginIsolation isolation = PluginIsolation::IN_PROCESS;
};

// [reload]
struct ReloadConfig {
    bool watch = true;      // reload when the config file changes (inotify)
    int debounce_ms = 100;  // wait this long after a change for the writer to finish
};

// [cluster]: how a front watches the workers of its remote pools, and how fronts and workers trust
// each other (docs/cluster.md#threat-model). TLS keys and bounds are read at start (a reload keeps
// the ones the process started with).
struct ClusterConfig {
    double connect_timeout_ms = 5000;    // connecting to a worker and its hello; on a worker, a front's TLS and BASP handshake
    double heartbeat_ms = 250;           // a heartbeat (load and KV figures) per remote pool
    double heartbeat_timeout_ms = 2000;  // no answer for this long: the worker is lost
    double reconnect_ms = 500;           // a lost worker is tried again this often; it rejoins when it answers
    // Mutual TLS between fronts and workers, all three or none (PEM, relative to the config's folder):
    // this process's certificate chain, its unencrypted key, and the CA the peer's certificate must chain to.
    std::string tls_cert, tls_key, tls_ca;
    bool insecure_loopback = false;         // no TLS: only with loopback addresses (workers' --listen, fronts' remote)
    int64_t max_frame_bytes = 64ll << 20;   // worker: a front's BASP frame announcing more closes its connection
    int max_connections = 64;               // worker: open connections past this are closed at once
    int64_t max_pending_bytes = 256ll << 20;  // worker: payload of frames in progress, all connections together

    bool tls() const { return !tls_cert.empty(); }
};

// [server]: `steward serve`'s HTTP server (docs/http-api.md).
struct ServerConfig {
    std::string host = "127.0.0.1";
    int port = 8080;                       // 0: an ephemeral port
    int io_threads = 2;                    // the server's own threads (never the runtime's)
    int max_connections = 1024;            // past it a new connection is closed at once
    int64_t max_body_bytes = 8 << 20;      // a larger body is answered 413
    int max_header_bytes = 16384;          // larger headers are answered 431
    double read_timeout_ms = 30000;        // a request (headers and body) must arrive within this: slow clients are dropped
    double idle_timeout_ms = 60000;        // a keep-alive connection may wait this long for its next request
    double write_timeout_ms = 30000;       // a response (or one streamed chunk) must be taken within this
    int64_t max_stream_buffer_bytes = 1 << 20;  // streamed output a slow reader may leave unread; past it the request is cancelled
    int trace_requests = 1024;             // decision traces kept (GET /admin/requests/{id})
};

// [metrics]: what /metrics (Runtime::metrics_prometheus) exports besides the steward_* families.
struct MetricsExportConfig {
    // Also export vLLM's names (vllm:num_requests_running, vllm:kv_cache_usage_perc, ...) with its
    // model_name label (the pool's name), for Grafana dashboards built for vLLM and the Gateway API
    // Inference Extension's endpoint picker (docs/metrics.md#vllm-names). Hot-reloads.
    bool vllm_names = false;
};

// [tracing]: where finished requests' decision traces go besides GET /admin/requests/{id}.
struct TracingConfig {
    // Non-empty: each finished request's trace as OTLP/JSON spans (one resourceSpans object per line,
    // a span per lifecycle stage) appended to this file (relative to the config's folder). Read at
    // start; a reload keeps the file the runtime started with.
    std::string otlp_file;
};

// [cpu]: the CPU plan's choices (runtime/cpu/plan.h), read at start (a reload keeps them).
// prefetch_bytes: how far ahead the int8 decode kernels prefetch weight rows; 0 takes the plan
// measured once per CPU model (cached), a value in [64, 65536] overrides it. gemm_min_tokens: from
// how many tokens a matmul takes the tiled GEMM instead of the streaming kernel, every weight type
// alike; 0 takes the plan's crossover per class of weight type, a value in [1, 4096] overrides it.
// f32_stream_rows: F32 weights at one token a row at a time (1) or in 4-row tiles (4); 0 takes the
// plan's measured choice. half_stream_rows: F16 and BF16 weights likewise, where the kernels stream
// them a row at a time (AMD's CPUs).
struct CpuConfig {
    int prefetch_bytes = 0;
    int gemm_min_tokens = 0;
    int f32_stream_rows = 0;
    int half_stream_rows = 0;
};

// A whole config file, validated (every cross-reference resolves).
struct Config {
    std::string path;  // the file it came from ("" for built-in)
    std::vector<PoolConfig> pools;
    std::vector<BucketConfig> buckets;
    std::vector<TenantConfig> tenants;
    std::vector<PublicPrefixConfig> public_prefixes;
    LimitsConfig limits;
    ServerConfig server;
    PluginsConfig plugins;
    ReloadConfig reload;
    ClusterConfig cluster;
    SimConfig sim;
    CpuConfig cpu;
    MetricsExportConfig metrics;
    TracingConfig tracing;

    // The entry of that name; nullptr when there is none. The pointer lives as long as the Config.
    const PoolConfig* find_pool(const std::string& name) const;
    const TenantConfig* find_tenant(const std::string& name) const;
    uint64_t tenant_salt(const std::string& tenant) const;  // configured or derived from the name
};

// Parses and validates TOML text. source_name is the file it came from: errors name it
// (file:line:column), relative paths (models, plugin dirs) are resolved against its directory and
// Config::path is set to it. Loads no model or plugin (Runtime::start and check_config_file do).
Expected<Config> parse_config(const std::string& toml_text, const std::string& source_name = "<string>");
// Reads the file and parses it as above; an unreadable file is an error naming it.
Expected<Config> load_config(const std::string& path);

}  // namespace steward
