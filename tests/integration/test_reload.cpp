// Hot reload through the runtime: requests keep the config generation they started with, a bad file
// changes nothing, a removed pool drains, and a plugin library rebuilt at the same path decides new
// requests while in-flight ones finish on the old code. No sleeps: futures, drain() and counters.
#include <signal.h>
#include <sys/stat.h>
#include "test_paths.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <catch2/catch.hpp>
#include <filesystem>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include <steward/runtime.h>

#include "forward_gate.h"
#include "two_pool_config.h"

using namespace steward;
using namespace steward_test;

namespace {

std::string buckets_rules(const std::string& qa_pool) {
    return fmt::format(R"(
[[bucket]]
name = "short_qa"
pool = "{}"
[bucket.match]
hint = "short_qa"

[[bucket]]
name = "other"
pool = "large"
[bucket.eviction]
plugin = "lru"
)",
                       qa_pool);
}

std::vector<int32_t> ids(int n, int salt) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; i++) v.push_back(1 + (i * 7 + salt * 13) % 500);
    return v;
}

}  // namespace

TEST_CASE("1000 requests across 5 reloads (valid and invalid): none lost, none failed, each keeps its generation",
          "[reload]") {
    // A reload every 150 requests. Generations: 1 at start; reload 1 valid (short_qa -> large) -> 2;
    // 2 invalid (syntax); 3 valid (pool "small" removed) -> 3; 4 invalid (unknown plugin); 5 valid
    // (small back, short_qa -> small) -> 4.
    const std::string path = write_config("reload.toml", two_pool_toml() + buckets_rules("small"));
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;

    struct Outcome {
        uint64_t gen_at_submit = 0;
        GenerationResult res;
    };
    std::vector<Outcome> out(1000);
    std::atomic<int> n_finished{0};
    std::mutex mu;

    const std::vector<std::string> texts = {
        two_pool_toml() + buckets_rules("large"),
        two_pool_toml() + buckets_rules("large") + "\n[[bucket]\n",  // TOML syntax error
        two_pool_toml(TwoPoolOptions{.include_small = false}) + buckets_rules("large"),
        two_pool_toml() + buckets_rules("small") + "\n[[bucket]]\nname = \"x\"\n[bucket.routing]\nplugin = \"no_such_router\"\n",
        two_pool_toml() + buckets_rules("small"),
    };
    const bool valid[] = {true, false, true, false, true};
    uint64_t expect_gen = 1;
    int n_reload_ok = 0, n_reload_failed = 0;
    for (int i = 0; i < 1000; i++) {
        if (i > 0 && i % 150 == 0 && i / 150 <= 5) {
            const int k = i / 150 - 1;
            write_config("reload.toml", texts[k]);
            auto g = r.reload();
            if (valid[k]) {
                REQUIRE(g.ok());
                expect_gen++;
                n_reload_ok++;
                CHECK(*g == expect_gen);
            } else {
                REQUIRE_FALSE(g.ok());
                n_reload_failed++;
                // The error names the file and the position (syntax) or the plugin.
                CHECK(g.error().message.find(k == 1 ? "reload.toml:" : "no_such_router") != std::string::npos);
            }
            CHECK(r.config_generation() == expect_gen);
        }
        GenerationRequest q;
        q.prompt_ids = ids(8 + i % 24, i);
        q.max_tokens = 3 + i % 5;
        q.bucket_hint = i % 2 ? "short_qa" : "";
        out[i].gen_at_submit = r.config_generation();
        RequestCallbacks cb;
        cb.on_finish = [&, i](const GenerationResult& res) {
            std::lock_guard<std::mutex> lk(mu);
            out[i].res = res;
            n_finished++;
        };
        r.submit(std::move(q), std::move(cb));
    }
    r.drain();
    REQUIRE(n_finished == 1000);
    std::map<uint64_t, int> by_gen;
    std::map<std::string, int> qa_pool_by_gen[7];
    for (int i = 0; i < 1000; i++) {
        const GenerationResult& res = out[i].res;
        INFO("request " << i << ": " << finish_reason_name(res.finish) << " " << res.error);
        CHECK(res.ok());
        CHECK(res.metrics.config_generation == out[i].gen_at_submit);
        by_gen[res.metrics.config_generation]++;
        if (res.bucket == "short_qa") qa_pool_by_gen[res.metrics.config_generation][res.pool]++;
    }
    CHECK(by_gen == std::map<uint64_t, int>{{1, 150}, {2, 300}, {3, 300}, {4, 250}});
    // Each generation routed by its own rules: short_qa -> small, large, large (small removed), small.
    CHECK(qa_pool_by_gen[1] == std::map<std::string, int>{{"small", 75}});
    CHECK(qa_pool_by_gen[2] == std::map<std::string, int>{{"large", 150}});
    CHECK(qa_pool_by_gen[3] == std::map<std::string, int>{{"large", 150}});
    CHECK(qa_pool_by_gen[4] == std::map<std::string, int>{{"small", 125}});
    auto j = nlohmann::json::parse(r.metrics_json());
    CHECK(j["config"]["reloads_ok"] == n_reload_ok);
    CHECK(j["config"]["reloads_failed"] == n_reload_failed);
    CHECK(j["config"]["generation"] == expect_gen);
    CHECK(r.metrics_prometheus().find("steward_config_reloads_total{result=\"error\"} 2") != std::string::npos);
}

TEST_CASE("a reload with a bad file changes nothing and reports file:line:column", "[reload]") {
    const std::string path = write_config("bad_reload.toml", two_pool_toml() + buckets_rules("small"));
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;
    write_config("bad_reload.toml", two_pool_toml() + buckets_rules("small") + "\n[limits]\nmax_tokens_default = 4\n");
    auto g = r.reload();
    REQUIRE_FALSE(g.ok());
    CHECK(g.error().message.find("bad_reload.toml:") != std::string::npos);
    CHECK(r.config_generation() == 1);
    GenerationRequest q;
    q.prompt_ids = ids(10, 1);
    q.bucket_hint = "short_qa";
    auto res = r.generate(q);
    CHECK(res.ok());
    CHECK(res.pool == "small");
    CHECK(res.metrics.config_generation == 1);
}

TEST_CASE("a plugin rebuilt at the same path decides new requests after a reload, in-flight ones finish on the old",
          "[reload]") {
    namespace fs = std::filesystem;
    const fs::path lib = two_pool_dir() / "my_router.so";
    fs::remove(lib);
    fs::copy_file(fs::path(STEWARD_TEST_PLUGIN_DIR) / "swap_v1.so", lib);
    const std::string buckets = fmt::format(R"(
[[bucket]]
name = "swapped"
pool = "large"
[bucket.routing]
plugin = "{}"
)",
                                            lib.string());
    const std::string path = write_config("swap.toml", two_pool_toml() + buckets);
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;

    // A long request routed by v1 (pool 0 = large); it is still running when the reload completes:
    // every forward after its prompt's waits until the reload has returned.
    ForwardGate gate(1);
    std::promise<void> first_token;
    std::atomic<bool> got_token{false};
    std::promise<GenerationResult> a_done;
    std::atomic<bool> a_finished{false};
    GenerationRequest a;
    a.prompt_ids = ids(16, 3);
    a.max_tokens = 600;
    a.ignore_eos = true;
    RequestCallbacks cb;
    cb.on_token = [&](const std::string&, const std::vector<int32_t>&) {
        if (!got_token.exchange(true)) first_token.set_value();
    };
    cb.on_finish = [&](const GenerationResult& res) {
        a_finished = true;
        a_done.set_value(res);
    };
    r.submit(a, cb);
    first_token.get_future().wait();

    // "Rebuild" the plugin: a new file at the same path (as a linker writes it).
    fs::remove(lib);
    fs::copy_file(fs::path(STEWARD_TEST_PLUGIN_DIR) / "swap_v2.so", lib);
    auto g = r.reload();
    REQUIRE(g.ok());
    CHECK(*g == 2);
    const bool a_in_flight_at_reload = !a_finished.load();
    gate.release();

    GenerationRequest b;
    b.prompt_ids = ids(16, 4);
    b.max_tokens = 4;
    const GenerationResult rb = r.generate(b);
    const GenerationResult ra = a_done.get_future().get();
    CHECK(a_in_flight_at_reload);
    CHECK(ra.ok());
    CHECK(ra.pool == "large");  // v1's decision
    CHECK(ra.metrics.config_generation == 1);
    CHECK((int)ra.tokens.size() == 600);
    CHECK(rb.ok());
    CHECK(rb.pool == "small");  // v2's decision
    CHECK(rb.metrics.config_generation == 2);
}

namespace {
// Waits (bounded) for an event outside our control: the kernel's inotify or a signal's delivery.
bool wait_for_generation(Runtime& r, uint64_t g) {
    for (int i = 0; i < 1000 && r.config_generation() < g; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return r.config_generation() >= g;
}
}  // namespace

TEST_CASE("saving the config file reloads it, and so does SIGHUP", "[reload]") {
    std::string text = two_pool_toml() + buckets_rules("small");
    const auto watched = [](std::string t) {
        const std::string from = "[reload]\nwatch = false";
        t.replace(t.find(from), from.size(), "[reload]\nwatch = true\ndebounce_ms = 20");
        return t;
    };
    const std::string path = write_config("watched.toml", watched(text));
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;
    REQUIRE(r.config_generation() == 1);
    write_config("watched.toml", watched(two_pool_toml() + buckets_rules("large")));  // an editor's save
    REQUIRE(wait_for_generation(r, 2));
    GenerationRequest q;
    q.prompt_ids = ids(10, 9);
    q.bucket_hint = "short_qa";
    CHECK(r.generate(q).pool == "large");

    Runtime::route_sighup_to_reload();
    ::raise(SIGHUP);
    REQUIRE(wait_for_generation(r, 3));
    auto j = nlohmann::json::parse(r.metrics_json());
    CHECK(j["config"]["reloads_ok"] == 2);
}

TEST_CASE("a reload keeps an unchanged pool (and its cache) but starts afresh on a model file rewritten on disk",
          "[reload]") {
    const std::string path = write_config("mtime.toml", two_pool_toml() + buckets_rules("small"));
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;
    GenerationRequest q;
    q.prompt_ids = ids(65, 21);  // 4 full blocks + 1 token (the last token is always computed)
    q.max_tokens = 2;
    REQUIRE(r.generate(q).ok());
    REQUIRE(r.reload().ok());
    CHECK(r.generate(q).metrics.cached_tokens == 64);  // same pool, same cache
    // The large model "rebuilt": a newer mtime. Its pool (and cache) is replaced at the next reload.
    const auto model = two_pool_dir() / "large128.gguf";
    std::filesystem::last_write_time(model, std::filesystem::last_write_time(model) + std::chrono::seconds(5));
    REQUIRE(r.reload().ok());
    const GenerationResult fresh = r.generate(q);
    CHECK(fresh.ok());
    CHECK(fresh.pool == "large");
    CHECK(fresh.metrics.cached_tokens == 0);
}

TEST_CASE("a runtime started as steward run starts it keeps its pools, their cache and its public prefixes across a reload",
          "[reload]") {
    // steward run adds the workload's public segments as start options; a reload of the unchanged
    // file applies them again, so every pool key is the same and every engine (and cache) is kept.
    const std::string path = write_config("run_reload.toml", two_pool_toml() + buckets_rules("small"));
    RuntimeOptions ro;
    ro.extra_public_prefixes.push_back({"sys", "You are a careful assistant. Answer in one short sentence."});
    auto rt = Runtime::start(path, ro);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;
    GenerationRequest q;
    q.prompt_ids = ids(65, 33);  // 4 full blocks + 1 token
    q.max_tokens = 2;
    REQUIRE(r.generate(q).ok());
    REQUIRE(r.reload().ok());
    CHECK(r.config_generation() == 2);
    const auto cfg = r.config();
    REQUIRE(cfg->public_prefixes.size() == 1);
    CHECK(cfg->public_prefixes[0].name == "sys");
    const GenerationResult again = r.generate(q);
    CHECK(again.ok());
    CHECK(again.pool == "large");
    CHECK(again.metrics.cached_tokens == 64);  // the same engine: a prefix hit

    // The way steward run started before: the prefixes added to a loaded Config value are not in
    // the file, so a reload drops them, every key changes and the cache is gone.
    auto c = load_config(path);
    REQUIRE(c.ok());
    c->public_prefixes = ro.extra_public_prefixes;
    auto old_way = Runtime::start(*c);
    if (!old_way) FAIL(old_way.error().message);
    REQUIRE((*old_way)->generate(q).ok());
    REQUIRE((*old_way)->reload().ok());
    CHECK((*old_way)->config()->public_prefixes.empty());
    CHECK((*old_way)->generate(q).metrics.cached_tokens == 0);
}

TEST_CASE("a reload of a config replaced by a FIFO or a symlink to /dev/zero is refused at once and changes nothing",
          "[reload][hostile]") {
    const std::string path = write_config("hostile_reload.toml", two_pool_toml() + buckets_rules("small"));
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;
    std::filesystem::remove(path);
    std::filesystem::create_symlink("/dev/zero", path);  // read to the end, it would grow without bound
    auto z = r.reload();
    REQUIRE_FALSE(z.ok());
    CHECK(z.error().message.find("not a regular file") != std::string::npos);
    std::filesystem::remove(path);
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);  // nobody writes it: a blocking open would wait forever
    auto f = r.reload();
    REQUIRE_FALSE(f.ok());
    CHECK(f.error().message.find("not a regular file") != std::string::npos);
    CHECK(r.config_generation() == 1);
    GenerationRequest q;
    q.prompt_ids = ids(10, 2);
    q.bucket_hint = "short_qa";
    auto res = r.generate(q);
    CHECK(res.ok());
    CHECK(res.metrics.config_generation == 1);
    std::filesystem::remove(path);
}
