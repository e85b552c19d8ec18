// `steward serve -m` as a llama-server user types it: the config it builds (--print-config) holds
// what the flags say, and flags without an equivalent, a context past the model's and model flags
// without a model are refused with a message naming them.
#include <catch2/catch.hpp>

#include <steward/config.h>

#include <string>

#include "run_command.h"
#include "test_paths.h"

using namespace steward_test;

namespace {
std::string real_model() { return std::string(STEWARD_TESTDATA_DIR) + "/real/TinyStories-656K.f32.gguf"; }
}  // namespace

TEST_CASE("serve -m --print-config holds the flags", "[cli][serve_flags]") {
    const auto r = run_steward("serve -m " + real_model() + " -c 256 -np 3 -t 1 --alias story --api-key k1 --api-key k2 -n 40 "
                               "--port 9000 --print-config");
    REQUIRE(r.rc == 0);
    auto cfg = steward::parse_config(r.out, "printed");
    REQUIRE(cfg);
    REQUIRE(cfg->pools.size() == 1);
    const steward::PoolConfig& p = cfg->pools[0];
    CHECK(p.name == "story");
    CHECK(p.ctx == 256);
    CHECK(p.max_batch == 3);
    CHECK(p.threads == 1);
    CHECK(p.kv_blocks * p.block_size >= 256 * 3);  // three sequences of the whole context
    CHECK(cfg->server.port == 9000);
    CHECK(cfg->limits.max_tokens_default == 40);
    REQUIRE(cfg->tenants.size() == 1);
    CHECK(cfg->tenants[0].admin);
    CHECK(cfg->tenants[0].api_keys == std::vector<std::string>{"k1", "k2"});
}

TEST_CASE("serve -m KV tier flags become the pool's kv_tiers", "[cli][serve_flags][kv_tiers]") {
    auto r = run_steward("serve -m " + real_model() + " --cache-ram 512 --kv-disk-dir /tmp/steward-kv-x --kv-disk-gib 3 --print-config");
    REQUIRE(r.rc == 0);
    auto cfg = steward::parse_config(r.out, "printed");
    REQUIRE(cfg);
    CHECK(cfg->pools[0].kv_tiers.host_gib == Approx(0.5));
    CHECK(cfg->pools[0].kv_tiers.disk_gib == Approx(3));
    CHECK(cfg->pools[0].kv_tiers.disk_dir == "/tmp/steward-kv-x");
    r = run_steward("serve -m " + real_model() + " --kv-offloading-size 2 --print-config");
    REQUIRE(r.rc == 0);
    cfg = steward::parse_config(r.out, "printed");
    REQUIRE(cfg);
    CHECK(cfg->pools[0].kv_tiers.host_gib == Approx(2));
    r = run_steward("serve -m " + real_model() + " --kv-disk-gib 3 --print-config");
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("--kv-disk-dir"));
}

TEST_CASE("serve refuses what it cannot honour, by name", "[cli][serve_flags]") {
    const std::string m = " -m " + real_model();
    auto r = run_steward("serve" + m + " -ngl 99");
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("-ngl") && Catch::Contains("backend"));
    r = run_steward("serve" + m + " -c 9999 --print-config");
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("9999") && Catch::Contains("512"));
    r = run_steward("serve -c 100");
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("-m MODEL.gguf"));
    r = run_steward("serve" + m + " --no-such-flag");
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("--no-such-flag"));
    r = run_steward("serve" + m + " --draft-max 4 --print-config");
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("-md"));
}
