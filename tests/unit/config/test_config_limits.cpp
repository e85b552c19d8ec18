// Hostile configs (issue 9): every value `run` would refuse or choke on is refused by parse_config /
// check_config (the core of check_config_file) with file:line:column: no narrowing, no bool as an integer, no NaN or negative
// where meaningless, caps on what can be allocated, unique tenants, salts and keys, sane drafts,
// and regular files only (a FIFO or /dev/zero never blocks or grows memory).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <steward/runtime.h>

#include "config/config.h"
#include "config/limits.h"
#include "pool/config_check.h"
#include "process_temp_dir.h"

using namespace steward;

namespace {

const std::string k_pool = "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\n";

const std::filesystem::path& tmp() {
    static steward_test::ProcessTempDir d("steward-config-limits-");
    return d.path();
}

void write_file(const std::filesystem::path& p, const std::string& text) {
    std::ofstream f(p);
    f << text;
}

}  // namespace

TEST_CASE("hostile config values are refused with file:line:column and the rule, never narrowed", "[config][hostile]") {
    struct Case {
        std::string text, want;
    };
    const std::vector<Case> cases = {
        // Narrowing: 2^32 + 1 is not 1 block; a boolean is not an integer.
        {k_pool + "kv_blocks = 4294967297\n", "x.toml:4:13: [[pool]].kv_blocks is 4294967297, out of range"},
        {k_pool + "kv_blocks = true\n", "x.toml:4:13: [[pool]].kv_blocks must be an integer, got a boolean"},
        {k_pool + "max_batch = true\n", "[[pool]].max_batch must be an integer, got a boolean"},
        {k_pool + "kv_gib = true\n", "[[pool]].kv_gib must be a number, got a boolean"},
        {k_pool + "prefix_cache = -1\n", "x.toml:4:16: [[pool]].prefix_cache must be a boolean (true/false), got an integer"},
        {k_pool + "[[bucket]]\nname = \"b\"\n[bucket.match]\ntools = 1\n", "[bucket.match].tools must be a boolean"},
        {k_pool + "[[bucket]]\nname = \"b\"\n[bucket.match]\nmin_prompt_tokens = 9\nmax_prompt_tokens = 3\n",
         "a min_ bound is above its max_ bound"},
        // What would end in std::bad_alloc or std::system_error at `run`.
        {k_pool + "kv_blocks = 2147483647\n", "x.toml:4:13: [[pool]].kv_blocks is 2147483647; it must be in [0, 16777216]"},
        {k_pool + "max_batch = 2147483647\n", "[[pool]].max_batch is 2147483647; it must be in [1, 4096]"},
        {k_pool + "max_batch_tokens = 2147483647\n", "[[pool]].max_batch_tokens is 2147483647; it must be in [1, 65536]"},
        {k_pool + "threads = 100000\n", "[[pool]].threads is 100000; it must be 0 (all"},
        {k_pool + "threads = -1\n", "[[pool]].threads is -1"},
        {k_pool + "max_queue = -1\n", "[[pool]].max_queue is -1"},
        {k_pool + "max_queue = 0\n", "[[pool]].max_queue is 0; it must be in [1, 1048576] requests (0 would refuse every request)"},
        {k_pool + "spec_max_slowdown = -0.1\n", "[[pool]].spec_max_slowdown is -0.1; it must be in [0, 10]"},
        {k_pool + "spec_max_slowdown = nan\n", "[[pool]].spec_max_slowdown is nan"},
        // NaN, inf and negatives where they mean nothing.
        {k_pool + "price_prompt = nan\n", "x.toml:4:16: [[pool]].price_prompt is nan; it must be a finite number"},
        {k_pool + "price_output = -1.5\n", "[[pool]].price_output is -1.5; it must be a price >= 0"},
        {k_pool + "price_cached = inf\n", "[[pool]].price_cached is inf"},
        {k_pool + "quality = nan\n", "[[pool]].quality is nan"},
        {k_pool + "quality = -0.5\n", "[[pool]].quality is -0.5; it must be in [0, 1]"},
        {k_pool + "kv_overcommit = nan\n", "[[pool]].kv_overcommit is nan"},
        {k_pool + "kv_gib = -1\n", "[[pool]].kv_gib is -1"},
        {k_pool + "[limits]\nrequest_timeout_ms = -5\n", "x.toml:5:22: [limits].request_timeout_ms is -5"},
        {k_pool + "[limits]\nrequest_timeout_ms = nan\n", "[limits].request_timeout_ms is nan"},
        {k_pool + "[limits]\nsession_ttl_ms = 1e300\n", "[limits].session_ttl_ms is 1e+300; it must be in [0, 1e9] ms"},
        {k_pool + "[limits]\nmax_tokens_default = 0\n", "[limits].max_tokens_default is 0"},
        {k_pool + "[[tenant]]\nname = \"t\"\nkv_quota = -0.2\n", "[[tenant]].kv_quota is -0.2; it must be a share of the pool's KV"},
        {k_pool + "[[tenant]]\nname = \"t\"\nkv_quota = nan\n", "[[tenant]].kv_quota is nan"},
        {k_pool + "[[tenant]]\nname = \"t\"\nsalt = -3\n", "[[tenant]].salt is -3, out of range [0,"},
        {k_pool + "[[bucket]]\nname = \"b\"\nslo_ttft_ms = -1\n", "[[bucket]].slo_ttft_ms is -1"},
        {k_pool + "[[bucket]]\nname = \"b\"\nslo_tpot_ms = nan\n", "[[bucket]].slo_tpot_ms is nan"},
        {k_pool + "[[bucket]]\nname = \"b\"\n[bucket.match]\nmin_temperature = -1\n", "temperature bounds must be >= 0"},
        {k_pool + "[[bucket]]\nname = \"b\"\n[bucket.match]\nmax_prompt_tokens = 4294967296\n", "out of range"},
        {k_pool + "[server]\nport = 4294967376\n", "[server].port is 4294967376, out of range"},
        // Uniqueness: names, salts (they decide which KV blocks are shared) and api keys.
        {k_pool + "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\n", "x.toml:6:1: tenant 'a' is defined twice"},
        {k_pool + "[[tenant]]\nname = \"a\"\nsalt = 7\n[[tenant]]\nname = \"b\"\nsalt = 7\n",
         "tenant 'b' has the same salt as tenant 'a': they would share KV blocks"},
        {k_pool + "[[tenant]]\nname = \"a\"\napi_keys = [\"k1\"]\n[[tenant]]\nname = \"b\"\napi_keys = [\"k1\"]\n",
         "tenant 'b' uses an api key of tenant 'a'"},
        {k_pool + "[[public_prefix]]\nname = \"s\"\ntext = \"x\"\n[[public_prefix]]\nname = \"s\"\ntext = \"y\"\n",
         "[[public_prefix]] 's' is defined twice"},
        {k_pool + "[[bucket]]\nname = \"b\"\n[[bucket]]\nname = \"b\"\n", "bucket 'b' is defined twice"},
        // [pool.synth]: what writing the model would refuse, and drafts that cannot be written.
        {k_pool + "[pool.synth]\ndim = 100\nheads = 3\n", "x.toml:4:1: [pool.synth] of pool 'p': invalid synthetic model shape"},
        {k_pool + "[pool.synth]\ndtype = \"f64\"\n", "[pool.synth] of pool 'p': "},
        {k_pool + "[pool.synth]\nvocab = 10\n", "[pool.synth].vocab is 10; it must be in [354, 1048576]"},
        {k_pool + "[pool.synth]\nkeep_layers = 2\n", "keep_layers is only for a draft"},
        {k_pool + "[pool.synth]\ndraft_from = \"p\"\nkeep_layers = 1\n", "draft_from names the pool itself"},
        {k_pool + "[pool.synth]\ndraft_from = \"q\"\n", "draft_from needs keep_layers"},
        {k_pool + "[pool.synth]\ndraft_from = \"ghost\"\nkeep_layers = 1\n", "draft_from \"ghost\" names no pool"},
        {"[[pool]]\nname = \"a\"\nmodel = \"a.gguf\"\n[pool.synth]\ndraft_from = \"b\"\nkeep_layers = 1\n"
         "[[pool]]\nname = \"b\"\nmodel = \"b.gguf\"\n[pool.synth]\ndraft_from = \"a\"\nkeep_layers = 1\n",
         "x.toml:4:1: [pool.synth] of pool 'a': draft_from \"b\" is itself a draft (of \"a\")"},
        {"[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\n[pool.synth]\nlayers = 2\n"
         "[[pool]]\nname = \"d\"\nmodel = \"d.gguf\"\n[pool.synth]\ndraft_from = \"t\"\nkeep_layers = 3\n",
         "draft_from \"t\" has 2 layers; keep_layers 3 must be at most that"},
        // Speculation: a pool's draft, the synth fixture, a bucket's source.
        {k_pool + "draft = \"p\"\n", "pool 'p' draft = \"p\" names the pool itself"},
        {k_pool + "draft = \"ghost\"\n", "pool 'p' draft = \"ghost\" names no pool"},
        {k_pool + "[pool.synth]\nlate_scale = -1\n", "[pool.synth].late_scale is -1"},
        {k_pool + "[pool.synth]\nlayers = 4\nlate_from = 5\n", "late layers start at 5"},
        {"[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\n[pool.synth]\nlayers = 2\n"
         "[[pool]]\nname = \"d\"\nmodel = \"d.gguf\"\n[pool.synth]\ndraft_from = \"t\"\nkeep_layers = 1\nlate_scale = 0.1\n",
         "set them on the pool the draft is cut from (\"t\")"},
        {k_pool + "[[bucket]]\nname = \"b\"\n[bucket.speculation]\nplugin = \"adaptive\"\nsource = \"eagle\"\n",
         "[bucket.speculation] source of bucket 'b' is \"eagle\"; use \"draft\""},
        {k_pool + "[[bucket]]\nname = \"b\"\n[bucket.speculation]\nplugin = \"adaptive\"\nsource = \"draft\"\n",
         "bucket 'b' speculates with source \"draft\" but its pool 'p' has no draft model"},
    };
    for (const auto& c : cases) {
        auto r = parse_config(c.text, "x.toml");
        INFO(c.text);
        REQUIRE_FALSE(r.ok());
        INFO(r.error().message);
        CHECK_THAT(r.error().message, Catch::Contains(c.want));
    }
}

TEST_CASE("values at the edge of each range and an integer for a float are still accepted", "[config][hostile]") {
    const std::string text = k_pool + "kv_blocks = 16777216\nmax_batch = 4096\nmax_batch_tokens = 65536\nkv_gib = 1\n"
                                      "quality = 0\nprice_prompt = 0\n[limits]\nrequest_timeout_ms = 0\n"
                                      "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"b\"\nsalt = 5\nkv_quota = 1\n";
    auto r = parse_config(text, "x.toml");
    INFO((r ? "" : r.error().message));
    REQUIRE(r.ok());
    CHECK(r->pools[0].kv_blocks == 16777216);
    CHECK(r->pools[0].kv_gib == 1.0);
    CHECK(r->tenants[1].salt == 5);
}

TEST_CASE("config check refuses a pool whose KV exceeds the machine's memory before run would allocate it",
          "[config][hostile]") {
    // 2^24 blocks of a 32-layer model with one 128-wide KV head: 2*32*16*128*4 = 512 KiB a block, 8 TiB in all.
    const auto path = tmp() / "big_kv.toml";
    write_file(path, "[[pool]]\nname = \"big\"\nmodel = \"missing.gguf\"\nkv_blocks = 16777216\n[pool.synth]\n"
                     "dim = 128\nlayers = 32\nheads = 1\nkv_heads = 1\nvocab = 512\n");
    auto r = check_config(path.string());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("pool 'big'") && Catch::Contains("of physical memory") &&
                                      Catch::Contains("lower kv_blocks"));
    // The same pool with a few blocks passes.
    write_file(path, "[[pool]]\nname = \"big\"\nmodel = \"missing.gguf\"\nkv_blocks = 64\n[pool.synth]\n"
                     "dim = 128\nlayers = 32\nheads = 1\nkv_heads = 1\nvocab = 512\n");
    auto ok = check_config(path.string());
    INFO((ok ? "" : ok.error().message));
    CHECK(ok.ok());
}

TEST_CASE("a config that is a FIFO, /dev/zero behind a symlink or over 16 MiB is refused at once", "[config][hostile]") {
    const auto fifo = tmp() / "fifo.toml";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // nobody ever writes it: reading would block forever
    auto a = load_config(fifo.string());
    REQUIRE_FALSE(a.ok());
    CHECK_THAT(a.error().message, Catch::Contains("fifo.toml") && Catch::Contains("not a regular file"));
    auto ac = check_config(fifo.string());
    REQUIRE_FALSE(ac.ok());
    CHECK_THAT(ac.error().message, Catch::Contains("not a regular file"));

    const auto zero = tmp() / "zero.toml";
    std::filesystem::create_symlink("/dev/zero", zero);
    auto b = load_config(zero.string());
    REQUIRE_FALSE(b.ok());
    CHECK_THAT(b.error().message, Catch::Contains("not a regular file"));

    const auto big = tmp() / "big.toml";
    write_file(big, k_pool);
    std::filesystem::resize_file(big, (16u << 20) + 1);  // sparse: no 16 MiB written
    auto c = load_config(big.string());
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(c.error().message, Catch::Contains("over the limit of 16777216 bytes"));

    auto d = load_config((tmp() / "absent.toml").string());
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(d.error().message, Catch::Contains("cannot open config") && Catch::Contains("absent.toml"));
}

TEST_CASE("thread counts are 0 or 1 to 4 x the cores, and memory beyond the machine is refused", "[config][hostile]") {
    CHECK(check_threads(0, "t").ok());
    CHECK(check_threads(max_threads(), "t").ok());
    CHECK_FALSE(check_threads(max_threads() + 1, "t").ok());
    CHECK_FALSE(check_threads(-1, "t").ok());
    CHECK(max_threads() == 4 * n_cores());
    REQUIRE(physical_memory_bytes() > 0);
    CHECK(check_memory((double)physical_memory_bytes() / 2, "x", "y").ok());
    auto m = check_memory((double)physical_memory_bytes() * 2, "the thing", "lower it");
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("the thing needs") && Catch::Contains("lower it"));
}
