// The simulated backend through the whole runtime (actors, admission, the speculation plugin per
// step, the per-bucket metrics): requests finish with max_tokens of the generator's tokens, the
// same with speculation on, and each bucket's measured acceptance follows its [bucket.sim] rate.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <vector>

#include "api/runtime.h"
#include "run_all.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

namespace {

std::string sim_config() {
    const std::string sim = std::string(STEWARD_SOURCE_DIR) + "/configs/sim/";
    return R"(
[sim]
dilation = 50
[limits]
max_draft_tokens = 4
[reload]
watch = false
[plugins]
dirs = [")" + std::string(STEWARD_PLUGIN_BUILD_DIR) + R"("]
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
)" + [] {
        std::string b;
        for (auto [name, acc, spec] : {std::tuple{"plain", "0.5", ""}, std::tuple{"hot", "0.1", "fixed"},
                                       std::tuple{"cold", "0.9", "fixed"}}) {
            b += std::string("[[bucket]]\nname = \"") + name + "\"\npool = \"h100\"\n[bucket.match]\nhint = \"" + name +
                 "\"\n[bucket.sim]\nacceptance = " + acc + "\n";
            if (*spec) b += std::string("[bucket.speculation]\nplugin = \"") + spec + "\"\nbudget = 4\nsource = \"draft\"\n";
        }
        return b;
    }();
}

std::vector<GenerationResult> generate(Runtime& rt, const std::string& hint, int n, int max_tokens) {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < n; i++) {
        GenerationRequest q;
        q.bucket_hint = hint;
        for (int j = 0; j < 30; j++) q.prompt_ids.push_back(300 + (j * 37 + i * 101) % 5000);
        q.max_tokens = max_tokens;
        reqs.push_back(q);
    }
    return run_all(rt, reqs);
}

}  // namespace

TEST_CASE("a simulated pool serves through the runtime: max_tokens each, and each bucket's acceptance as configured",
          "[sim][speculation]") {
    auto rt = Runtime::start(write_config("sim_runtime.toml", sim_config()));
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
