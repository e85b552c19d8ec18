// The steward CLI's subcommands beyond model tools and generate.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <steward/expected.h>

#include "workload/workload.h"

namespace steward {

int cli_fail(const std::string& msg);  // prints "steward: error: msg", returns 1

struct RunOptions {
    std::string config_path = "configs/default.toml";
    std::string workload_path;  // empty: generate the standard mixed workload
    std::string save_workload;
    std::string out_path = "out/report.json";
    int n_requests = 120;
    double rate = 2.0;
    double scale = 1.0;
    uint64_t seed = 1;
    bool burst = false;
    bool verbose = false;
    int n_tenants = 4;                   // 1-4
    bool greedy = false;                 // every request at temperature 0
    bool sequential = false;             // one request at a time in file order, arrivals ignored
    bool ignore_eos = false;             // every request generates its max_tokens (benchmarks)
    std::string outputs_path;            // JSONL of every request's output and token counts
    // Ablations in one run: comma-separated variants (baseline first, added when missing):
    // no_prefix_cache, no_speculation, global_speculation, no_routing, eviction=PLUGIN, no_reuse.
    std::string compare;
    // Reuse off in the runner (docs/reuse.md): documents inlined where each request's documents_at
    // says, in its order, and no agent tool call resolved from the runner's cache.
    bool no_reuse = false;
    bool wide = false;  // the report table's every column (the default stays within 120 characters)
    bool agent_tools = false;            // generated agent turns carry repeated idempotent tool calls
    double agent_repeat = 0;             // share of generated agent sessions that repeat an earlier one
    std::string mix;                     // "short_qa=2,agent=0": bucket weights (parse_workload_mix)
    double tool_pause_ms = 0;            // agent tool pauses (0: the standard 50-300 ms)
    int agent_turns = 0;                 // turns per agent session (0: the standard 3 or 4)
    double volatile_share = 0.2;         // of short_qa, long_output, high_temp prompts
    std::string volatile_at = "early";   // early (after the public system prompt) | late (at the end)
};
int cmd_run(const RunOptions& o);
// The generator's parameters from run's options (an error names a bad --volatile-at).
Expected<WorkloadGenParams> workload_gen_params(const RunOptions& o);
// steward bench gen: writes the generated workload to o.save_workload without running it.
int cmd_bench_gen(const RunOptions& o);

// steward model info M.gguf (runtime/cli/model_info.cpp)
int cmd_model_info(const std::string& path);

// steward template render (runtime/cli/template_cmd.cpp)
struct TemplateRenderOptions {
    std::string model_path;     // -m: read tokenizer.chat_template (and BOS/EOS) from this GGUF
    std::string template_path;  // --template: or from this file
    std::string messages_path;  // --messages: a JSON array (or a request body with "messages")
    std::string tools_path;     // --tools: a JSON array of tools
    std::string kwargs;         // --kwargs: a JSON object of extra variables
    bool add_generation_prompt = false;
    int64_t now_unix = -1;      // --now: strftime_now() renders this instant (UTC); -1: now
};
int cmd_template_render(const TemplateRenderOptions& o);

// steward serve: from a TOML config (--config), or from one model file with llama-server's flags
// (-m MODEL.gguf, or vLLM's `serve MODEL`): a one-pool config built in memory (serve_config_toml).
struct ServeOptions {
    std::string config_path;  // --config; empty: configs/default.toml when it exists (and no -m)
    std::string host;         // empty: [server] host
    int port = -1;            // < 0: [server] port
    // One model (llama-server's flags); a TOML config is the way to several pools and tenants.
    std::string model_path;          // -m / --model / the positional MODEL
    int ctx = -1;                    // -c / --ctx-size / --max-model-len: context per request (0: trained)
    int parallel = -1;               // -np / --parallel / --max-num-seqs: sequences per step (default 4)
    int threads = -1;                // -t / --threads (default: all cores)
    std::string chat_template_file;  // --chat-template-file
    std::string draft_path;          // -md / --model-draft
    int draft_max = -1;              // --draft-max: the longest draft (default 16)
    std::vector<std::string> api_keys;  // --api-key (repeatable)
    std::string alias;               // --alias / --served-model-name: the model name (default: the file's stem)
    int n_predict = -2;              // -n / --n-predict: default max_tokens (-1: the rest of the context)
    std::string cache_type_k;        // -ctk / --cache-type-k: [[pool]] kv_type_k (f32, f16, bf16, q8_0, q4_0)
    double cache_ram_mib = -1;       // --cache-ram (llama-server): [pool.kv_tiers] host_gib, in MiB; -1: none
    double kv_offload_gib = -1;      // --kv-offloading-size (vLLM): the same in GiB; -1: none
    std::string kv_disk_dir;         // --kv-disk-dir: [pool.kv_tiers] disk_dir
    double kv_disk_gib = -1;         // --kv-disk-gib: [pool.kv_tiers] disk_gib (default 10 with a dir)
    std::string cache_type_v;        // -ctv / --cache-type-v: [[pool]] kv_type_v
    std::string pooling;             // --pooling mean|cls|last: /v1/embeddings' pooling (default: the GGUF's, else last)
    bool print_config = false;       // --print-config: print the TOML and exit
};
int cmd_serve(const ServeOptions& o);
// The TOML config `steward serve -m ...` runs (what --print-config prints); an error names a bad flag.
Expected<std::string> serve_config_toml(const ServeOptions& o);
// llama-server and vLLM flags that steward serve refuses with a reason (e.g. -ngl): nullopt for any
// other argument. Checked before parsing so the message names the flag and the way to do it here.
std::optional<std::string> refused_server_flag(const std::string& arg);

// steward worker: hosts a config's pools for fronts ([[pool]] remote = "host:port") until SIGINT/SIGTERM.
struct WorkerOptions {
    std::string config_path = "configs/default.toml";
    std::string listen = "127.0.0.1:7600";  // host:port (port 0: ephemeral, printed)
    uint32_t wire_version = 0;               // hidden, tests: speak another wire protocol version
};
int cmd_worker(const WorkerOptions& o);

}  // namespace steward
