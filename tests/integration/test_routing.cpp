// Routing policies through the runtime on two pools (a synthetic model and its 1-layer draft):
// cost_quality's route distribution under extreme and balanced λ (worked out by hand from the
// configured prices and quality priors), cascade upgrades and per-route quality (checked against
// direct runs on each pool), two buckets with different parameters of one plugin, and invalid
// plugin decisions falling back and being counted.
#include <catch2/catch.hpp>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include <steward/runtime.h>

#include "run_all.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

namespace {

std::vector<int32_t> ids(int n, int salt) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; i++) v.push_back(1 + (i * 11 + salt * 17) % 500);
    return v;
}

std::unique_ptr<Runtime> start(const std::string& name, const std::string& text) {
    auto rt = Runtime::start(write_config(name, text));
    if (!rt) FAIL(rt.error().message);
    return std::move(rt.value());
}

std::string hint_bucket(const std::string& name, const std::string& routing) {
    return fmt::format("\n[[bucket]]\nname = \"{0}\"\npool = \"large\"\n[bucket.match]\nhint = \"{0}\"\n[bucket.routing]\n{1}\n",
                       name, routing);
}

}  // namespace

TEST_CASE("cost_quality sends everything to one pool under extreme λ and splits per bucket as the estimates say",
          "[routing]") {
    // Prices chosen so the cheaper pool depends on the request's shape: small is cheap on prompt
    // tokens (0.1 vs 0.5 per M) and dear on output (3.0 vs 1.5). Quality priors: small 0.5, large 1.
    TwoPoolOptions o;
    o.small_price_prompt = 0.1;
    o.small_price_output = 3.0;
    o.large_price_prompt = 0.5;
    o.large_price_output = 1.5;
    // Balanced between cost and quality (λ 1 each). Latency and risk are live figures (moving
    // averages of TTFT/TPOT, queue fill) that a hand computation cannot predict: λ 0 here.
    const std::string balanced =
        "plugin = \"cost_quality\"\nlambda_cost = 1.0\nlambda_quality = 1.0\nlambda_latency = 0.0\nlambda_risk = 0.0";
    std::string t = two_pool_toml(o);
    t += hint_bucket("cheap", "plugin = \"cost_quality\"\nlambda_cost = 1000.0");
    t += hint_bucket("best", "plugin = \"cost_quality\"\nlambda_quality = 1000.0");
    t += hint_bucket("prompt_heavy", balanced);
    t += hint_bucket("output_heavy", balanced);
    t += "\n[[bucket]]\nname = \"other\"\npool = \"large\"\n";
    auto rt = start("cost_quality.toml", t);

    std::vector<GenerationRequest> reqs;
    // Every prompt distinct (no prefix cache hit anywhere: cached tokens would change the costs).
    int salt = 100;
    for (int i = 0; i < 12; i++)
        for (const char* b : {"cheap", "best", "prompt_heavy", "output_heavy"}) {
            GenerationRequest q;
            q.bucket_hint = b;
            const bool long_prompt = std::string(b) == "prompt_heavy" || i % 2;
            q.prompt_ids = ids(long_prompt ? 200 : 10, salt++);
            q.max_tokens = std::string(b) == "output_heavy" ? 64 : 4;
            reqs.push_back(q);
        }
    // By hand, normalised by the max over the two pools (ĉ = cost / max cost), score = ĉ − quality:
    //   prompt_heavy (200 in, 4 out): small 200·0.1+4·3 = 32, large 200·0.5+4·1.5 = 106
    //     -> small 32/106 − 0.5 = −0.198 < large 1 − 1 = 0: small.
    //   output_heavy (10 in, 64 out): small 1+192 = 193, large 5+96 = 101
    //     -> small 1 − 0.5 = 0.5 > large 101/193 − 1 = −0.477: large.
    //   best (λ_quality 1000): large, the higher quality, whatever the cost.
    // One at a time (the extreme-λ buckets keep their default λ 1 for latency and risk, which
    // λ 1000 outweighs by far; no queue builds up either way).
    std::map<std::string, std::map<std::string, int>> got;
    for (const auto& q : reqs) {
        const GenerationResult res = rt->generate(q);
        REQUIRE(res.ok());
        CHECK_FALSE(res.fallback);
        got[res.bucket][res.pool]++;
    }
    CHECK(got["best"] == std::map<std::string, int>{{"large", 12}});
    CHECK(got["prompt_heavy"] == std::map<std::string, int>{{"small", 12}});
    CHECK(got["output_heavy"] == std::map<std::string, int>{{"large", 12}});
    // cheap: 200-token prompts (odd i) cost 32 on small vs 106 on large -> small; 10-token prompts
    // cost 13 on small vs 11 on large -> large. λ_cost dominates the quality term either way.
    CHECK(got["cheap"] == std::map<std::string, int>{{"small", 6}, {"large", 6}});
}

TEST_CASE("cascade upgrades on low confidence, reports upgrade rate and per-route quality against direct runs",
          "[routing]") {
    std::string t = two_pool_toml();
    // threshold 0: a mean log-probability is always below it -> always upgrade after 4 tokens.
    t += hint_bucket("always_up", "plugin = \"cascade\"\nstart_pool = \"small\"\nupgrade_pool = \"large\"\nk = 4\nthreshold = 0.0");
    // threshold -1e9: never; every request is also shadowed on the large pool.
    t += hint_bucket("never_up",
                     "plugin = \"cascade\"\nstart_pool = \"small\"\nupgrade_pool = \"large\"\nk = 4\nthreshold = -1e9\nshadow_fraction = 1.0");
    t += "\n[[bucket]]\nname = \"direct_small\"\npool = \"small\"\n[bucket.match]\nhint = \"direct_small\"\n";
    t += "\n[[bucket]]\nname = \"other\"\npool = \"large\"\n";
    auto rt = start("cascade.toml", t);

    const int n = 8;
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < n; i++)
        for (const char* b : {"always_up", "never_up", "direct_small", "other"}) {
            GenerationRequest q;
            q.bucket_hint = b;
            q.prompt_ids = ids(12 + i, i);
            q.max_tokens = 12;
            reqs.push_back(q);
        }
    auto res = run_all(*rt, reqs);
    double sum_agreement = 0;
    for (int i = 0; i < n; i++) {
        const GenerationResult& up = res[4 * i], &never = res[4 * i + 1], &small = res[4 * i + 2], &large = res[4 * i + 3];
        for (auto* r : {&up, &never, &small, &large}) REQUIRE(r->ok());
        // Upgraded: answered by the large pool, token for token what the large pool says directly.
        CHECK(up.upgraded);
        CHECK(up.pool == "large");
        CHECK(up.tokens == large.tokens);
        // Not upgraded: the small pool's own answer.
        CHECK_FALSE(never.upgraded);
        CHECK(never.pool == "small");
        CHECK(never.tokens == small.tokens);
        size_t common = 0;
        while (common < small.tokens.size() && common < large.tokens.size() && small.tokens[common] == large.tokens[common])
            common++;
        sum_agreement += (double)common / (double)std::max(small.tokens.size(), large.tokens.size());
    }
    auto j = nlohmann::json::parse(rt->metrics_json());
    const auto& up = j["buckets"]["always_up"]["routing"];
    CHECK(up["upgrade_rate"].get<double>() == 1.0);
    CHECK(up["fallback_rate"].get<double>() == 0.0);
    const auto& never = j["buckets"]["never_up"]["routing"];
    CHECK(never["upgrade_rate"].get<double>() == 0.0);
    CHECK(never["quality_by_route"]["small"]["shadowed"].get<int>() == n);
    CHECK(never["quality_by_route"]["small"]["agreement"].get<double>() == Approx(sum_agreement / n).margin(1e-12));
    CHECK(up["upgraded"].get<int>() == n);
    // And the table shows the columns.
    const std::string table = rt->metrics_table(true);  // the routing columns are the wide table's
    CHECK(table.find("upgr_%") != std::string::npos);
    CHECK(table.find("fallb_%") != std::string::npos);
    CHECK(table.find("route_q") != std::string::npos);
}

TEST_CASE("two buckets with different parameters of the same plugin route differently in one run", "[routing]") {
    std::string t = two_pool_toml();
    t += hint_bucket("pick0", "plugin = \"param_routing\"\npick = 0");
    t += hint_bucket("pick1", "plugin = \"param_routing\"\npick = 1");
    t += "\n[[bucket]]\nname = \"other\"\npool = \"large\"\n";
    auto rt = start("two_params.toml", t);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 10; i++) {
        GenerationRequest q;
        q.bucket_hint = i % 2 ? "pick1" : "pick0";
        q.prompt_ids = ids(10, i / 2);  // the same prompts in both buckets
        reqs.push_back(q);
    }
    for (const auto& r : run_all(*rt, reqs)) {
        REQUIRE(r.ok());
        CHECK(r.pool == (r.bucket == "pick0" ? "large" : "small"));
    }
}

TEST_CASE("invalid plugin decisions fall back to the bucket's pool, LRU and no drafts, and are counted", "[routing]") {
    TwoPoolOptions o;
    o.kv_blocks = 12;  // tight: requests evict each other's cached blocks
    std::string t = two_pool_toml(o);
    t += R"(
[[bucket]]
name = "broken"
pool = "small"
[bucket.match]
hint = "broken"
[bucket.routing]
plugin = "invalid_routing"
[bucket.eviction]
plugin = "invalid_eviction"
[bucket.speculation]
plugin = "invalid_speculation"

[[bucket]]
name = "other"
pool = "large"
[bucket.eviction]
plugin = "lfu"
)";
    auto rt = start("invalid.toml", t);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 24; i++) {
        GenerationRequest q;
        q.bucket_hint = i % 3 ? "broken" : "";
        q.prompt_ids = ids(40, i);  // distinct prompts: 3 full blocks each, cached then evicted
        q.max_tokens = 4;
        reqs.push_back(q);
    }
    int n_broken = 0;
    for (const auto& r : run_all(*rt, reqs)) {
        REQUIRE(r.ok());
        if (r.bucket == "broken") {
            n_broken++;
            CHECK(r.fallback);
            CHECK(r.pool == "small");
        } else {
            CHECK_FALSE(r.fallback);
        }
    }
    auto j = nlohmann::json::parse(rt->metrics_json());
    CHECK(j["buckets"]["broken"]["routing"]["fallback_rate"].get<double>() == 1.0);
    std::map<std::string, std::pair<int64_t, int64_t>> by_kind;  // kind -> (decisions, invalid) for "broken"
    for (const auto& p : j["policies"])
        if (p["bucket"] == "broken") by_kind[p["kind"]] = {p["decisions"].get<int64_t>(), p["invalid_decisions"].get<int64_t>()};
    CHECK(by_kind["routing"] == std::make_pair<int64_t, int64_t>(n_broken, n_broken));
    // Speculation: the router's per-request question and the engine's per-step ones, all invalid.
    CHECK(by_kind["speculation"].first > n_broken);
    CHECK(by_kind["speculation"].first == by_kind["speculation"].second);
    CHECK(by_kind["eviction"].first > 0);  // the pool was tight enough to evict
    CHECK(by_kind["eviction"].first == by_kind["eviction"].second);
    // Every block the broken policy was asked about was evicted (by LRU instead), counted per bucket.
    CHECK(j["buckets"]["broken"]["kv"]["evictions_by_policy"]["invalid_eviction"].get<int64_t>() == by_kind["eviction"].first);
    CHECK(rt->metrics_prometheus().find("steward_plugin_invalid_decisions_total{bucket=\"broken\",kind=\"routing\"") !=
          std::string::npos);
}

TEST_CASE("session_affinity keeps turn 2 of an agent session on turn 1's pool, where its KV is cached", "[routing]") {
    // Turn 1 is sent to "small" by a fixed router; turn 2's bucket scores "large" best (quality
    // 1.0 vs 0.5 under λ_quality 1000), so only the affinity can keep it on "small".
    const bool affinity = GENERATE(true, false);
    std::string t = two_pool_toml();
    t += hint_bucket("turn1", "plugin = \"param_routing\"\npick = 1");
    t += hint_bucket("agent", fmt::format("plugin = \"cost_quality\"\nlambda_quality = 1000.0\nsession_affinity = {}",
                                          affinity ? "true" : "false"));
    t += "\n[[bucket]]\nname = \"other\"\npool = \"large\"\n";
    auto rt = start(affinity ? "affinity.toml" : "no_affinity.toml", t);
    GenerationRequest q1;
    q1.bucket_hint = "turn1";
    q1.session = "conversation-1";
    q1.prompt_ids = ids(40, 3);
    q1.max_tokens = 4;
    q1.ignore_eos = true;
    const GenerationResult r1 = rt->generate(q1);
    REQUIRE(r1.ok());
    CHECK(r1.pool == "small");
    GenerationRequest q2 = q1;
    q2.bucket_hint = "agent";
    q2.prompt_ids.insert(q2.prompt_ids.end(), r1.tokens.begin(), r1.tokens.end());
    for (int32_t id : ids(12, 9)) q2.prompt_ids.push_back(id);
    const GenerationResult r2 = rt->generate(q2);
    REQUIRE(r2.ok());
    CHECK_FALSE(r2.fallback);
    if (affinity) {
        CHECK(r2.pool == "small");
        // Turn 1 left 40 + 4 tokens; the engine reuses the 43 whose KV was computed.
        CHECK(r2.metrics.cached_tokens >= 40);
    } else {
        CHECK(r2.pool == "large");
        CHECK(r2.metrics.cached_tokens == 0);  // "large" never saw this conversation
    }
}

TEST_CASE("an ABI 1 plugin and an ABI 2 plugin decide side by side in one config", "[routing]") {
    TwoPoolOptions o;
    o.kv_blocks = 12;  // tight: requests evict each other's cached blocks
    std::string t = two_pool_toml(o);
    t += R"(
[[bucket]]
name = "old"
pool = "large"
[bucket.match]
hint = "old"
[bucket.routing]
plugin = "v1_routing"
pick = 1
[bucket.eviction]
plugin = "v1_eviction"

[[bucket]]
name = "new"
pool = "large"
[bucket.match]
hint = "new"
[bucket.routing]
plugin = "outcome_routing"
[bucket.eviction]
plugin = "lfu"

[[bucket]]
name = "other"
pool = "large"
)";
    auto rt = start("v1_v2.toml", t);
    // One at a time, so that the learning router has seen every earlier outcome of its bucket.
    std::map<std::string, std::vector<std::string>> pools;
    for (int i = 0; i < 12; i++) {
        GenerationRequest q;
        q.bucket_hint = i % 2 ? "new" : "old";
        q.prompt_ids = ids(40, i);
        q.max_tokens = 4;
        q.ignore_eos = true;
        const GenerationResult r = rt->generate(q);
        REQUIRE(r.ok());
        CHECK_FALSE(r.fallback);
        pools[r.bucket].push_back(r.pool);
    }
    CHECK(pools["old"] == std::vector<std::string>(6, "small"));
    CHECK(pools["new"] == std::vector<std::string>{"large", "small", "large", "small", "large", "small"});
    auto j = nlohmann::json::parse(rt->metrics_json());
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> by;  // (bucket, kind) -> (calls, invalid)
    for (const auto& p : j["policies"])
        by[{p["bucket"], p["kind"]}] = {p["decisions"].get<int64_t>(), p["invalid_decisions"].get<int64_t>()};
    CHECK(by[{"old", "routing"}] == std::make_pair<int64_t, int64_t>(6, 0));
    CHECK(by[{"new", "routing"}] == std::make_pair<int64_t, int64_t>(6, 0));
    CHECK(by[{"old", "eviction"}].first > 0);
    CHECK(by[{"old", "eviction"}].second == 0);
    CHECK(j["buckets"]["old"]["kv"]["evictions_by_policy"]["v1_eviction"].get<int64_t>() > 0);
}

TEST_CASE("an eviction plugin that declines every candidate makes requests wait or be preempted, and all finish",
          "[routing]") {
    TwoPoolOptions o;
    o.kv_blocks = 12;  // 4 requests of 3 blocks fill the pool; finished ones leave cached blocks
    std::string t = two_pool_toml(o);
    t += R"(
[[bucket]]
name = "protective"
pool = "large"
[bucket.eviction]
plugin = "decline_eviction"
)";
    auto rt = start("decline.toml", t);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 24; i++) {
        GenerationRequest q;
        q.tenant = i % 2 ? "acme" : "globex";
        q.prompt_ids = ids(40, 100 + i);  // distinct prompts: each caches blocks that only eviction frees
        q.max_tokens = 6;
        q.ignore_eos = true;
        reqs.push_back(q);
    }
    for (const auto& r : run_all(*rt, reqs)) {
        REQUIRE(r.ok());
        CHECK(r.tokens.size() == 6);
    }
    auto j = nlohmann::json::parse(rt->metrics_json());
    int64_t calls = -1, invalid = -1, declined = -1;
    for (const auto& p : j["policies"])
        if (p["bucket"] == "protective" && p["kind"] == "eviction")
            calls = p["decisions"].get<int64_t>(), invalid = p["invalid_decisions"].get<int64_t>(),
            declined = p["declined_decisions"].get<int64_t>();
    CHECK(calls > 0);     // it was asked (and declined: it never evicted a block)...
    CHECK(declined == calls);  // ...every answer was a decline, reported as such...
    CHECK(invalid == 0);  // ...and a decline is not an invalid decision (the names reached it, else it errs)
    CHECK_THAT(rt->metrics_prometheus(), Catch::Contains("steward_plugin_declined_decisions_total{bucket=\"protective\""));
    const auto& ev = j["buckets"]["protective"]["kv"]["evictions_by_policy"];
    CHECK_FALSE(ev.contains("decline_eviction"));
    // Only a request that nothing else could make room for took LRU victims.
    CHECK(ev["lru"].get<int64_t>() > 0);
}

TEST_CASE("the cache actor's cached prompt tokens per pool reach the router: a warm prefix pulls a request to the pool holding it",
          "[routing]") {
    // Prices make "large" the cheaper pool for any cold prompt (0.5 vs 1.0 per M prompt tokens, the
    // same output price), and cached prompt tokens cost nothing: only the figure of the pool that
    // holds the prefix can make "small" cheaper. cost_quality weighs cost alone here.
    TwoPoolOptions o;
    o.small_price_prompt = 1.0;
    o.large_price_prompt = 0.5;
    o.small_price_output = o.large_price_output = 0.3;
    std::string t = two_pool_toml(o);
    t += hint_bucket("warm", "plugin = \"param_routing\"\npick = 1");
    t += hint_bucket("kv", "plugin = \"cost_quality\"\nlambda_latency = 0.0\nlambda_quality = 0.0\nlambda_risk = 0.0");
    t += "\n[[bucket]]\nname = \"other\"\npool = \"large\"\n";
    auto rt = start("cache_aware.toml", t);
    GenerationRequest warm;
    warm.bucket_hint = "warm";
    warm.prompt_ids = ids(100, 5);  // 6 full blocks of 16 are published on "small"
    warm.max_tokens = 2;
    const GenerationResult w = rt->generate(warm);
    REQUIRE(w.ok());
    REQUIRE(w.pool == "small");

    GenerationRequest hot = warm;  // the same prefix, another question, no session
    hot.bucket_hint = "kv";
    for (int32_t id : ids(12, 8)) hot.prompt_ids.push_back(id);
    const GenerationResult h = rt->generate(hot);
    REQUIRE(h.ok());
    CHECK(h.pool == "small");
    CHECK(h.metrics.cached_tokens == 96);

    GenerationRequest cold;  // a prompt no pool holds: the cold prices decide
    cold.bucket_hint = "kv";
    cold.prompt_ids = ids(112, 13);
    cold.max_tokens = 2;
    const GenerationResult c = rt->generate(cold);
    REQUIRE(c.ok());
    CHECK(c.pool == "large");
    CHECK(c.metrics.cached_tokens == 0);
}
