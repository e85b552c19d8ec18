// The runtime's configuration: pools, buckets (classification rules and routing), tenants,
// public prefixes, limits and the server. Parsed from TOML (toml++) and validated completely;
// an error names file:line:column, the key, the value and the fix.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "util/error.h"

namespace steward {

struct SynthConfig {  // generate the pool's model when the file is missing
    std::string arch = "llama";
    int dim = 256, layers = 4, heads = 4, kv_heads = 4, ffn = 688, vocab = 4096, ctx = 2048;
    std::string dtype = "f32";
    uint64_t seed = 1;
    std::string draft_from;  // pool name: derive by keeping the first keep_layers layers
    int keep_layers = 0;
};

struct PoolConfig {
    std::string name;
    std::string model;              // GGUF path (relative to the config file's directory)
    std::optional<SynthConfig> synth;
    std::string backend = "cpu";    // cpu | cuda (falls back to cpu with a log line)
    int threads = 0;                // 0: all cores
    int kv_blocks = 0;              // 0: derive from kv_gib
    double kv_gib = 0.25;
    int block_size = 16;
    std::string kv_dtype = "f32";   // f32 | f16
    int max_batch = 32;             // sequences per step
    int max_batch_tokens = 256;     // token budget per step (chunked prefill fills the rest)
    int max_queue = 256;            // waiting requests before 'overloaded'
    double kv_overcommit = 1.0;     // KV admission: reservations may total kv_blocks x this (>= 1; 1: no preemption among admitted requests)
    bool prefix_cache = true;
    // Prices per million tokens (cost/request in METRICS.md).
    double price_prompt = 0.0, price_output = 0.0, price_cached = 0.0;
    // Prior quality in [0, 1] a routing policy sees until shadowed requests measure it; < 0: the
    // pool's parameter count relative to the largest pool's.
    double quality = -1.0;
};

// One parameter of a policy plugin: the TOML scalar as written.
using PolicyParam = std::variant<int64_t, double, bool, std::string>;

// A plugin named by path (it contains '/' or ends in ".so") rather than by a name to search for.
bool plugin_is_path(const std::string& plugin);

// A bucket's [bucket.routing] / [bucket.eviction] / [bucket.speculation] table: the plugin (a name
// searched in the plugin directories, or a path) and every other key as its parameters.
struct PolicySpec {
    std::string plugin;
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

struct BucketConfig {
    std::string name;
    BucketMatch match;
    std::string pool;   // routing by rules: the pool this bucket's requests go to
    int priority = 0;   // higher runs first; the lowest is preempted first
    double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput targets (0: none)
    std::optional<PolicySpec> routing;      // none: route to `pool` (the rules)
    std::optional<PolicySpec> eviction;     // none: least recently used
    std::optional<PolicySpec> speculation;  // none: no draft tokens
};

struct TenantConfig {
    std::string name;
    uint64_t salt = 0;  // 0: derived from the name
    std::vector<std::string> api_keys;  // for the HTTP server; a non-empty list is a config error until it lands
    double kv_quota = -1;  // share of each pool's KV blocks for eviction policies (tenant_fair); < 0: none
};

struct PublicPrefixConfig {
    std::string name;
    std::string text;  // tokenized per pool; blocks fully inside it are shared across tenants
};

struct LimitsConfig {
    double request_timeout_ms = 120000;  // deadline from arrival; 0: none
    double session_ttl_ms = 60000;       // KV of an idle session stays pinned this long
    int max_tokens_default = 128;
    int max_draft_tokens = 16;           // a speculation policy's budget above this is invalid
};

struct PluginsConfig {
    std::vector<std::string> dirs;  // searched for plugins named by name (relative to the config file)
};

struct ReloadConfig {
    bool watch = true;      // reload when the config file changes (inotify)
    int debounce_ms = 100;  // wait this long after a change for the writer to finish
};

struct ServerConfig {
    std::string host = "127.0.0.1";
    int port = 8080;
};

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

    const PoolConfig* find_pool(const std::string& name) const;
    const TenantConfig* find_tenant(const std::string& name) const;
    uint64_t tenant_salt(const std::string& tenant) const;  // configured or derived from the name
};

Expected<Config> parse_config(const std::string& toml_text, const std::string& source_name = "<string>");
Expected<Config> load_config(const std::string& path);

// Request features the bucket rules look at.
struct RequestFeatures {
    std::string hint;
    int prompt_tokens = 0;
    int max_tokens = 0;
    double temperature = 0.0;
    bool tools = false;
    std::string response_format;
    std::string tenant;
};
// The response formats this build accepts, in a request or a [bucket.match]: "" (none) and "json".
// "json" is a classification feature only: the output is not constrained until structured output
// lands. The error names the value and the accepted ones.
Expected<bool> check_response_format(const std::string& value);

// Index of the first matching bucket; the last bucket when none matches (validation requires
// at least one bucket).
size_t classify(const Config& c, const RequestFeatures& f);

}  // namespace steward
