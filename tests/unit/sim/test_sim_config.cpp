// backend = "sim" in the config: [pool.sim], the device and model files it names, [bucket.sim] and
// [sim]; each mistake is an error naming the file, the key and the fix. A simulated pool loads as a
// model without weights whose KV is what the devices hold after the weights.
#include <catch2/catch.hpp>
#include "pool/config_check.h"
#include "test_paths.h"

#include <filesystem>
#include <fstream>

#include <steward/runtime.h>

#include "config/config.h"
#include "pool/pool.h"
#include "process_temp_dir.h"
#include "sim/cost_model.h"

using namespace steward;
using namespace steward_test;

namespace {

const std::filesystem::path& dir() {
    static const ProcessTempDir d("steward_test_sim_config_");
    return d.path();
}

std::string shipped(const std::string& f) { return std::string(STEWARD_SOURCE_DIR) + "/configs/sim/" + f; }

std::string write(const std::string& name, const std::string& text) {
    const std::string p = (dir() / name).string();
    std::ofstream(p) << text;
    return p;
}

std::string pool(const std::string& sim_keys, const std::string& pool_keys = "") {
    return "[[pool]]\nname = \"p\"\nbackend = \"sim\"\n" + pool_keys + "\n[pool.sim]\n" + sim_keys +
           "\n[[bucket]]\nname = \"b\"\npool = \"p\"\n";
}

std::string dm(const std::string& device, const std::string& model) {
    return "device = \"" + device + "\"\nmodel = \"" + model + "\"\n";
}

std::string error_of(const std::string& text) {
    auto c = parse_config(text, (dir() / "c.toml").string());
    if (c) return "";
    return c.error().message;
}

}  // namespace

TEST_CASE("sim config mistakes are errors naming the key, the file and the fix", "[sim][config]") {
    const std::string h200 = shipped("h200.toml"), m70 = shipped("llama-70b-fp8.toml");
    CHECK_THAT(error_of("[[pool]]\nname = \"p\"\nbackend = \"sim\"\n[[bucket]]\nname = \"b\"\npool = \"p\"\n"),
               Catch::Contains("no [pool.sim] table"));
    CHECK_THAT(error_of(pool(dm(h200, m70), "model = \"x.gguf\"")), Catch::Contains("'model' does not apply"));
    CHECK_THAT(error_of(pool("model = \"" + m70 + "\"")), Catch::Contains("needs device ="));
    CHECK_THAT(error_of(pool(dm((dir() / "none.toml").string(), m70))),
               Catch::Contains("none.toml") && Catch::Contains("relative to this config's folder"));
    const std::string typo = write("typo.toml", "[device]\nname = \"x\"\ntflops_16 = 1\nhbm_gbps = 1\nhbm_gib = 1\nhbm_gbs = 2\n");
    CHECK_THAT(error_of(pool(dm(typo, m70))), Catch::Contains("typo.toml:6") && Catch::Contains("unknown key 'hbm_gbs'"));
    const std::string missing = write("missing.toml", "[device]\nname = \"x\"\ntflops_16 = 1\nhbm_gib = 1\n");
    CHECK_THAT(error_of(pool(dm(missing, m70))), Catch::Contains("needs hbm_gbps"));
    const std::string no_link = write("nolink.toml", "[device]\ntflops_16 = 1\nhbm_gbps = 1\nhbm_gib = 1\n");
    CHECK_THAT(error_of(pool(dm(no_link, m70) + "tp = 2\n")), Catch::Contains("link_gbps"));
    const std::string bad_model = write("bad_model.toml", "[model]\nlayers = 2\ndim = 100\nheads = 3\nkv_heads = 2\nffn = 8\nvocab = 400\n");
    CHECK_THAT(error_of(pool(dm(h200, bad_model))), Catch::Contains("multiple of kv_heads"));
    const std::string small_vocab = write("v.toml", "[model]\nlayers = 2\ndim = 64\nheads = 2\nkv_heads = 1\nffn = 64\nvocab = 400\n");
    CHECK_THAT(error_of(pool(dm(h200, m70) + "draft = \"" + small_vocab + "\"\n")), Catch::Contains("shares the target's vocabulary"));
    CHECK_THAT(error_of(pool(dm(h200, m70) + "acceptance = 1.5\n")), Catch::Contains("acceptance is 1.5"));
    CHECK_THAT(error_of(pool(dm(h200, m70)) + "[bucket.sim]\nacceptance = -0.1\n"), Catch::Contains("[bucket.sim].acceptance"));
    CHECK_THAT(error_of("[sim]\ndilation = 0\n" + pool(dm(h200, m70))), Catch::Contains("[sim].dilation"));
    CHECK(error_of(pool(dm(h200, m70))).empty());
}

TEST_CASE("a simulated pool loads a model without weights and the KV its devices hold", "[sim][pool]") {
    auto c = parse_config("[sim]\ndilation = 8\n" + pool(dm(shipped("h200.toml"), shipped("llama-70b-fp8.toml")) +
                                                         "draft = \"" + shipped("llama-1b.toml") + "\"\n"),
                          (dir() / "c.toml").string());
    REQUIRE(c);
    CHECK(c->sim.dilation == 8);
    auto p = load_pool(c->pools[0], *c);
    REQUIRE(p);
    CHECK_FALSE(p->model->has_weights());
    CHECK(p->model->params().n_vocab == 128256);
    CHECK(p->model->params().n_layer == 80);
    CHECK(p->n_blocks == sim_kv_blocks(*c->pools[0].sim, 16));
    const EngineOptions eo = engine_options(*p, *c);
    REQUIRE(eo.sim);
    CHECK(eo.sim->draft);
    // The engine over it holds no KV storage for its ~10k blocks: its blocks are bookkeeping.
    auto made = make_engine(*p, *c);
    REQUIRE(made);
    auto& engine = *made;
    CHECK(engine->has_draft_model());
    CHECK(engine->backend_name() == "sim");
    CHECK(engine->kv_manager().stats().n_blocks_total == p->n_blocks);

    // A device figure is part of the pool's key: a reload that changes it builds a new engine.
    Config c2 = *c;
    c2.pools[0].sim->device.hbm_gbps = 1;
    CHECK(pool_key(c2.pools[0], c2) != pool_key(c->pools[0], *c));

    // 141 GB of BF16 weights on one 80 GB H100 do not fit: the error says what to change.
    auto big = parse_config(pool(dm(shipped("h100.toml"), shipped("llama-70b.toml"))), (dir() / "c.toml").string());
    REQUIRE(big);
    auto lp = load_pool(big->pools[0], *big);
    REQUIRE_FALSE(lp);
    CHECK_THAT(lp.error().message, Catch::Contains("raise tp"));
}

TEST_CASE("steward config check loads a simulated pool as run would: the shipped configs pass, a model that does not fit fails",
          "[sim][config]") {
    for (const char* f : {"configs/sim-h200-70b.toml", "configs/sim-4xh100-70b.toml"}) {
        auto ok = check_config(std::string(STEWARD_SOURCE_DIR) + "/" + f);
        INFO(f);
        CHECK(ok);
    }
    const std::string big = write("big.toml", pool(dm(shipped("h100.toml"), shipped("llama-70b.toml"))));
    auto bad = check_config(big);
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.error().message, Catch::Contains("raise tp"));
}
