// KV admission through the whole actor path (request -> router -> kv_allocator -> executor): a tenant
// over its KV quota is refused as overloaded naming the quota, requests that do not fit together wait
// and then all finish, and the admission figures reach the metrics JSON. Awaited with drain(), no sleeps.
#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <steward/runtime.h>

#include "process_temp_dir.h"

using namespace steward;

namespace {

const std::filesystem::path& temp_dir() {
    static const steward_test::ProcessTempDir dir("steward_test_kv_runtime_");
    return dir.path();
}

// One pool of 16 blocks of 16 tokens; tenant "small" may reserve a quarter of it (4 blocks).
std::unique_ptr<Runtime> start() {
    const std::string toml = fmt::format(R"(
[limits]
max_tokens_default = 16

[[pool]]
name = "tiny"
model = "{}"
threads = 1
kv_blocks = 16
block_size = 16
[pool.synth]
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 512
seed = 7

[[tenant]]
name = "small"
kv_quota = 0.25

[[bucket]]
name = "default"
pool = "tiny"
)",
                                         (temp_dir() / "tiny.gguf").string());
    auto c = parse_config(toml, (temp_dir() / "kv.toml").string());
    REQUIRE(c.ok());
    auto rt = Runtime::start(c.value());
    if (!rt) FAIL(rt.error().message);
    return std::move(rt.value());
}

GenerationRequest request(const std::string& tenant, int n_prompt, int max_tokens) {
    GenerationRequest q;
    for (int i = 0; i < n_prompt; i++) q.prompt_ids.push_back(300 + i);
    q.max_tokens = max_tokens;
    q.ignore_eos = true;
    q.tenant = tenant;
    return q;
}

}  // namespace

TEST_CASE("a request over its tenant's KV quota finishes overloaded naming the quota, others are served", "[runtime][admission]") {
    auto rt = start();
    const GenerationResult over = rt->generate(request("small", 10, 100));  // 7 blocks > 4
    CHECK(over.finish == FinishReason::OVERLOADED);
    CHECK(over.error.find("tenant 'small' has a KV quota of 4 blocks") != std::string::npos);
    const GenerationResult within = rt->generate(request("small", 10, 40));  // 4 blocks
    CHECK(within.finish == FinishReason::LENGTH);
    const GenerationResult other = rt->generate(request("other", 10, 100));  // no quota
    CHECK(other.finish == FinishReason::LENGTH);
    rt->drain();
    const nlohmann::json a = nlohmann::json::parse(rt->metrics_json())["admission"]["tiny"];
    CHECK(a["small"]["refused_tenant_quota"] == 1);
    CHECK(a["small"]["admitted"] == 1);
    CHECK(a["small"]["quota_blocks"] == 4);
    CHECK(a["other"]["admitted"] == 1);
    CHECK(a["other"]["blocks_reserved"] == 0);
}

TEST_CASE("requests whose reservations exceed the pool together wait their turn and all finish", "[runtime][admission]") {
    auto rt = start();
    const int n = 6;  // 8 blocks each (28 + 100 tokens): two fit at a time
    std::vector<GenerationResult> results(n);
    std::atomic<int> n_done{0};
    for (int i = 0; i < n; i++) {
        RequestCallbacks cb;
        cb.on_finish = [&, i](const GenerationResult& r) {
            results[i] = r;
            n_done++;
        };
        rt->submit(request("other", 28, 100), cb);
    }
    rt->drain();
    REQUIRE(n_done == n);
    for (const GenerationResult& r : results) {
        CHECK(r.finish == FinishReason::LENGTH);
        CHECK(r.tokens.size() == 100);
    }
    const nlohmann::json a = nlohmann::json::parse(rt->metrics_json())["admission"]["tiny"]["other"];
    CHECK(a["admitted"] == n);
    CHECK(a["queued"].get<int>() >= 1);  // six 100-token generations cannot finish while six are submitted
    CHECK(a["blocks_reserved"] == 0);
    CHECK(a["waiting"] == 0);
}
