// The simulated backend through the whole runtime (actors, admission, the speculation plugin per
// step, the per-bucket metrics): requests finish with max_tokens of the generator's tokens, the
// same with speculation on, and each bucket's measured acceptance follows its [bucket.sim] rate; the
// adaptive plugin's choices on the cost model's step times, the same on any machine.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <nlohmann/json.hpp>
#include <vector>

#include <steward/runtime.h>

#include "run_all.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

namespace {

// Every clock of the runtime runs `dilation` times faster, deadlines too: none here (the default
// 120 s would be 2.4 s of real time, which a loaded machine running these requests can pass).
std::string sim_config(const std::string& buckets) {
    const std::string sim = std::string(STEWARD_SOURCE_DIR) + "/configs/sim/";
    return R"(
[sim]
dilation = 50
[limits]
max_draft_tokens = 4
request_timeout_ms = 0
[reload]
watch = false
[plugins]
dirs = [")" + std::string(STEWARD_PLUGIN_BUILD_DIR) + R"("]
)" + k_test_decision_budgets + R"(
[[pool]]
name = "h100"
backend = "sim"
max_batch = 64
max_batch_tokens = 2048
[pool.sim]
device = ")" + sim + R"(h100.toml"
model = ")" + sim + R"(llama-8b.toml"
draft = ")" + sim + R"(llama-1b.toml"
concentration = 1000
)" + buckets;
}

// A bucket of the h100 pool whose drafts are accepted at `acceptance`, speculating with `speculation`
// (the [bucket.speculation] lines; none when empty).
std::string sim_bucket(const std::string& name, const std::string& acceptance, const std::string& speculation) {
    std::string b = "[[bucket]]\nname = \"" + name + "\"\npool = \"h100\"\n[bucket.match]\nhint = \"" + name +
                    "\"\n[bucket.sim]\nacceptance = " + acceptance + "\n";
    if (!speculation.empty()) b += "[bucket.speculation]\n" + speculation + "\n";
    return b;
}

// n requests of the hint with max_tokens each; one after another when sequential.
std::vector<GenerationResult> generate(Runtime& rt, const std::string& hint, int n, int max_tokens,
                                       bool sequential = false) {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < n; i++) {
        GenerationRequest q;
        q.bucket_hint = hint;
        for (int j = 0; j < 30; j++) q.prompt_ids.push_back(300 + (j * 37 + i * 101) % 5000);
        q.max_tokens = max_tokens;
        reqs.push_back(q);
    }
    if (!sequential) return run_all(rt, reqs);
    std::vector<GenerationResult> out;
    for (const auto& q : reqs) out.push_back(rt.generate(q));
    return out;
}

}  // namespace

TEST_CASE("a simulated pool serves through the runtime: max_tokens each, and each bucket's acceptance as configured",
          "[sim][speculation]") {
    const std::string fixed = "plugin = \"fixed\"\nbudget = 4\nsource = \"draft\"";
    auto rt = Runtime::start(write_config("sim_runtime.toml", sim_config(sim_bucket("plain", "0.5", "") +
                                                                         sim_bucket("hot", "0.1", fixed) +
                                                                         sim_bucket("cold", "0.9", fixed))));
    REQUIRE(rt);
    const auto plain = generate(**rt, "plain", 16, 64);
    const auto hot = generate(**rt, "hot", 16, 64);
    const auto cold = generate(**rt, "cold", 16, 64);
    for (const auto* rs : {&plain, &hot, &cold})
        for (const auto& r : *rs) {
            REQUIRE(r.ok());
            CHECK(r.tokens.size() == 64);
        }
    // Each bucket's figures reach the metrics: none speculates but those with a policy.
    auto m = nlohmann::json::parse((*rt)->metrics_json())["buckets"];
    auto rate = [&](const char* b) {
        const auto& s = m[b]["speculation"];
        REQUIRE(s["draft_tokens"].get<int64_t>() > 100);
        // Accepted over proposed at position 0: a binomial proportion around the bucket's rate.
        const auto& at = s["acceptance_per_position"];
        return at.is_array() && !at.empty() ? at[0].get<double>() : -1.0;
    };
    CHECK(m["plain"]["speculation"]["drafts"].get<int64_t>() == 0);
    CHECK(rate("hot") == Approx(0.1).margin(0.06));
    CHECK(rate("cold") == Approx(0.9).margin(0.06));
}

TEST_CASE("adaptive on a simulated pool drafts long chains where drafts are accepted and only probes where they are not",
          "[sim][speculation]") {
    // The simulated pool prices each step and each draft with its cost model, so the policy reads the
    // same step times on any machine (a real pool's measured times move with the machine's load): an
    // 8B target on an H100 with a 1B draft, where a draft token costs about a sixth of a plain step.
    const std::string params = "plugin = \"adaptive\"\nprior_acceptance = 0.9\nprobe_every = 16\nk_max = 4\nsource = \"draft\"";
    auto rt = Runtime::start(write_config("sim_adaptive.toml", sim_config(sim_bucket("hi", "0.95", params) +
                                                                          sim_bucket("lo", "0.1", params))));
    REQUIRE(rt);
    const auto hi = generate(**rt, "hi", 6, 48, true);
    const auto lo = generate(**rt, "lo", 6, 48, true);
    for (const auto* rs : {&hi, &lo})
        for (const auto& r : *rs) {
            REQUIRE(r.ok());
            REQUIRE(r.tokens.size() == 48);
        }
    const int64_t n_hi = 6 * 48, n_lo = 6 * 48;
    auto m = nlohmann::json::parse((*rt)->metrics_json())["buckets"];
    auto fig = [&](const char* b, const char* f) { return m[b]["speculation"][f].get<int64_t>(); };
    // Accepted drafts: the policy drafts at (nearly) every step, the longest chains it may (4; fewer
    // only in a request's last tokens).
    CHECK(fig("hi", "draft_tokens") > n_hi / 2);
    CHECK(fig("hi", "draft_tokens") >= 3 * fig("hi", "drafts"));
    CHECK(fig("hi", "accepted_tokens") > fig("hi", "draft_tokens") * 3 / 4);
    // Rejected drafts: after the first request's few steps, only the probes (2 tokens per 16 steps).
    CHECK(fig("lo", "accepted_tokens") < fig("lo", "draft_tokens") / 2);
    CHECK(fig("lo", "draft_tokens") < n_lo / 5);
    CHECK(fig("hi", "draft_tokens") > 3 * fig("lo", "draft_tokens"));
}
