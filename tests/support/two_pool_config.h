// A two-pool test setup for the plugin, routing and reload tests: "large" (a synthetic llama) and
// "small" (its first layer, same vocabulary), models written once per test process to a temp dir,
// and a TOML text with caller-supplied buckets written to a file there (reload re-reads files).
#pragma once
#include <fmt/format.h>
#include "test_paths.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "process_temp_dir.h"

namespace steward_test {

inline const std::filesystem::path& two_pool_dir() {
    static const ProcessTempDir dir("steward_test_two_pool_");
    return dir.path();
}

// [plugins] decision budgets far past any scheduling delay. A plugin's decision runs on a worker
// thread that the caller waits for; with the defaults (50 ms, 20 ms in a step) a loaded CI machine
// can fail to schedule that thread in time, and a test would read the fallback as the plugin's
// answer. The tests of the budgets themselves set their own (test_plugin_faults.cpp).
inline const std::string k_test_decision_budgets = "decision_budget_ms = 60000\nstep_decision_budget_ms = 60000\n";

struct TwoPoolOptions {
    double small_price_prompt = 0.10, small_price_output = 0.30;
    double large_price_prompt = 0.50, large_price_output = 1.50;
    double small_quality = 0.5, large_quality = 1.0;
    int kv_blocks = 128;
    int large_dim = 128;
    bool include_small = true;
    std::string plugin_keys = k_test_decision_budgets;  // the [plugins] table's keys besides dirs
};

// One [[pool]] table with the test's batch and queue sizes.
inline std::string pool_toml(const std::string& name, const std::string& model, int kv_blocks, double price_prompt,
                             double price_output, double quality, const std::string& synth) {
    return fmt::format(R"(
[[pool]]
chat_template_fallback = "chatml"
name = "{}"
model = "{}"
threads = 1
kv_blocks = {}
block_size = 16
max_batch = 16
max_batch_tokens = 128
max_queue = 2048
price_prompt = {}
price_output = {}
quality = {}
[pool.synth]
{}
)",
                       name, model, kv_blocks, price_prompt, price_output, quality, synth);
}

// The pools and plugin directories; append [[bucket]] tables after it.
inline std::string two_pool_toml(const TwoPoolOptions& o = {}) {
    const std::string dir = two_pool_dir().string();
    std::string t = fmt::format(R"(
[limits]
request_timeout_ms = 120000
session_ttl_ms = 60000
max_tokens_default = 8

[reload]
watch = false

[plugins]
dirs = ["{}", "{}"]
{}
)",
                                STEWARD_PLUGIN_BUILD_DIR, STEWARD_TEST_PLUGIN_DIR, o.plugin_keys);
    t += pool_toml("large", fmt::format("{}/large{}.gguf", dir, o.large_dim), o.kv_blocks, o.large_price_prompt,
                   o.large_price_output, o.large_quality,
                   fmt::format("dim = {}\nlayers = 3\nheads = 4\nkv_heads = 2\nffn = {}\nvocab = 512\nctx = 1024\nseed = 11",
                               o.large_dim, o.large_dim * 2));
    if (o.include_small)
        t += pool_toml("small", fmt::format("{}/small{}.gguf", dir, o.large_dim), o.kv_blocks, o.small_price_prompt,
                       o.small_price_output, o.small_quality, "draft_from = \"large\"\nkeep_layers = 1");
    return t;
}

inline std::string write_config(const std::string& name, const std::string& text) {
    const auto p = two_pool_dir() / name;
    const auto tmp = two_pool_dir() / (name + ".tmp");
    {
        std::ofstream f(tmp);
        f << text;
    }
    std::filesystem::rename(tmp, p);  // atomic, as an editor's save would be
    return p.string();
}

}  // namespace steward_test
