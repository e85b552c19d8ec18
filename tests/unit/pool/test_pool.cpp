// The pool core without actors: pool keys (what a reload compares), KV sizing against the formula,
// the PoolConfig -> engine options mapping, generation plans, quality priors and model synthesis.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "config/config.h"
#include "pool/pool.h"
#include "process_temp_dir.h"

using namespace steward;
using namespace steward_test;

namespace {

const std::filesystem::path& pool_dir() {
    static const ProcessTempDir dir("steward_test_pool_");
    return dir.path();
}

struct PoolText {
    std::string name = "a";
    std::string model = "a.gguf";
    std::string extra;  // more keys of the [[pool]] table
    std::string synth = "dim = 64\nlayers = 2\nheads = 2\nkv_heads = 1\nffn = 128\nvocab = 400\nctx = 256\nseed = 3";
};

std::string pool_text(const PoolText& p) {
    return fmt::format("\n[[pool]]\nname = \"{}\"\nmodel = \"{}\"\nkv_blocks = 32\n{}\n[pool.synth]\n{}\n", p.name,
                       (pool_dir() / p.model).string(), p.extra, p.synth);
}

Config config_of(const std::string& text) {
    auto c = parse_config(text + "\n[[bucket]]\nname = \"all\"\npool = \"a\"\n");
    if (!c) FAIL(c.error().message);
    return *c;
}

}  // namespace

TEST_CASE("a pool key changes when an engine field, the session TTL, a public prefix or the model's mtime changes, and only then",
          "[pool]") {
    PoolText base;
    base.model = "key.gguf";
    const Config c0 = config_of(pool_text(base));
    REQUIRE(ensure_models(c0).ok());
    const std::string k0 = pool_key(c0.pools[0], c0);
    CHECK(pool_key(c0.pools[0], config_of(pool_text(base))) == k0);  // the same file read again

    // What the engine is made of: each change gives a new key.
    for (const std::string extra : {"threads = 3", "kv_gib = 0.5", "block_size = 32", "kv_dtype = \"f16\"", "max_batch = 7",
                                    "max_batch_tokens = 99", "max_queue = 5", "prefix_cache = false", "backend = \"cuda\""}) {
        PoolText p = base;
        p.extra = extra;
        const Config c = config_of(pool_text(p));
        INFO(extra);
        CHECK(pool_key(c.pools[0], c) != k0);
    }
    {
        const Config c = config_of(pool_text(base) + "\n[limits]\nsession_ttl_ms = 1234\n");
        CHECK(pool_key(c.pools[0], c) != k0);
    }
    {
        const Config c = config_of(pool_text(base) + "\n[[public_prefix]]\nname = \"sys\"\ntext = \"You are helpful.\"\n");
        CHECK(pool_key(c.pools[0], c) != k0);
    }
    // What the engine is not made of: prices, the quality prior, buckets, other limits.
    for (const std::string extra : {"price_prompt = 3.0", "price_output = 9.0", "price_cached = 0.5", "quality = 0.25"}) {
        PoolText p = base;
        p.extra = extra;
        const Config c = config_of(pool_text(p) + "\n[limits]\nmax_tokens_default = 3\n");
        INFO(extra);
        CHECK(pool_key(c.pools[0], c) == k0);
    }
    // The model file rewritten (a newer mtime).
    const auto model = pool_dir() / "key.gguf";
    std::filesystem::last_write_time(model, std::filesystem::last_write_time(model) + std::chrono::seconds(3));
    CHECK(pool_key(c0.pools[0], c0) != k0);
}

TEST_CASE("a pool's KV block count is kv_gib over 2*L*T*H_kv*D_head*bytes, or kv_blocks when set", "[pool]") {
    ModelParams mp;
    mp.n_layer = 3;
    mp.n_head_kv = 2;
    mp.head_dim = 32;
    PoolConfig pc;
    pc.name = "p";
    pc.block_size = 16;
    pc.kv_gib = 0.01;
    for (const auto& [dtype, bytes] : {std::pair<std::string, int>{"f32", 4}, {"f16", 2}}) {
        pc.kv_dtype = dtype;
        // M_KV = 2 * L * B * T * H_kv * D_head * bytes  =>  B = floor(M_KV / (2 * L * T * H_kv * D_head * bytes)).
        const double block_bytes = 2.0 * 3 * 16 * 2 * 32 * bytes;
        const int expect = (int)std::floor(0.01 * 1073741824.0 / block_bytes);
        auto n = kv_block_count(pc, mp);
        REQUIRE(n.ok());
        CHECK(*n == expect);
        CHECK(*n * block_bytes <= 0.01 * 1073741824.0);
        CHECK((*n + 1) * block_bytes > 0.01 * 1073741824.0);
    }
    pc.kv_blocks = 77;
    CHECK(*kv_block_count(pc, mp) == 77);
    pc.kv_blocks = 0;
    pc.kv_gib = 1e-9;
    auto none = kv_block_count(pc, mp);
    REQUIRE_FALSE(none.ok());
    CHECK(none.error().message.find("pool 'p'") != std::string::npos);
    CHECK(none.error().message.find("kv_gib") != std::string::npos);
}

TEST_CASE("backend = \"cuda\" where no device is usable is a config error naming the fix, \"auto\" loads on the CPU",
          "[pool]") {
    PoolText p;
    p.model = "backend.gguf";
    p.extra = "backend = \"cuda\"";
    const Config c = config_of(pool_text(p));
    REQUIRE(ensure_models(c).ok());
    auto cuda = load_pool(c.pools[0], c);
    if (!cuda.ok()) {  // every machine without a GPU (CI): no CUDA build, no driver or no device
        CHECK(cuda.error().message.find("pool 'a': backend = \"cuda\"") != std::string::npos);
        CHECK(cuda.error().message.find("set backend = \"cpu\"") != std::string::npos);
    }
    p.extra = "backend = \"auto\"";
    const Config ca = config_of(pool_text(p));
    auto autop = load_pool(ca.pools[0], ca);
    REQUIRE(autop.ok());
    // auto is the device where "cuda" loads, the CPU where it does not; the engine runs on it.
    CHECK(autop->backend == (cuda.ok() ? "cuda" : "cpu"));
    auto engine = make_engine(*autop, ca);
    REQUIRE(engine.ok());
    CHECK((*engine)->backend_name().rfind(autop->backend, 0) == 0);
    // The KV size given or not (a cuda pool sizes an unset one from the device), and the device
    // share checked in load_pool too (a Config built in code skips the parser's range).
    CHECK(ca.pools[0].kv_size_set);  // kv_blocks = 32
    std::string unsized = pool_text(p);
    unsized.erase(unsized.find("kv_blocks = 32\n"), 15);
    CHECK(!config_of(unsized).pools[0].kv_size_set);
    PoolConfig bad = ca.pools[0];
    bad.gpu_memory_fraction = 0;
    auto refused = load_pool(bad, ca);
    REQUIRE(!refused.ok());
    CHECK(refused.error().message.find("gpu_memory_fraction 0.000000 is outside [0.05, 1]") != std::string::npos);
    p.extra = "backend = \"tpu\"";
    CHECK_FALSE(parse_config(pool_text(p) + "\n[[bucket]]\nname = \"all\"\npool = \"a\"\n").ok());
}

TEST_CASE("a loaded pool's engine options and metrics KV shape come from its config and model", "[pool]") {
    PoolText p;
    p.model = "load.gguf";
    p.extra = "kv_dtype = \"f16\"\nmax_batch = 5\nmax_batch_tokens = 64\nmax_queue = 9\nthreads = 1\nprefix_cache = false\n"
              "price_prompt = 2.0\nprice_output = 4.0\nprice_cached = 1.0";
    const Config c = config_of(pool_text(p) + "\n[limits]\nsession_ttl_ms = 2500\n");
    REQUIRE(ensure_models(c).ok());
    auto pool = load_pool(c.pools[0], c);
    REQUIRE(pool.ok());
    CHECK(pool->key == pool_key(c.pools[0], c));
    CHECK(pool->n_blocks == 32);
    CHECK(pool->profile.n_layers == 2);
    const EngineOptions eo = engine_options(*pool, c);
    CHECK(eo.n_blocks == 32);
    CHECK(eo.block_size == 16);
    CHECK(eo.kv_dtype_k == KvDtype::F16);
    CHECK(eo.kv_dtype_v == KvDtype::F16);
    CHECK(eo.max_batch == 5);
    CHECK(eo.max_batch_tokens == 64);
    CHECK(eo.max_queue == 9);
    CHECK(eo.n_threads == 1);
    CHECK_FALSE(eo.prefix_cache);
    CHECK(eo.session_ttl_s == Approx(2.5));
    const MetricsConfig mc = metrics_config(c, {&*pool});
    REQUIRE(mc.kv);
    // 2 (K and V) * 2 layers * 16 slots * 1 kv head * 32 (64 / 2 heads) * 2 bytes.
    CHECK(mc.kv->block_bytes() == 2.0 * 2 * 16 * 1 * 32 * 2);
    CHECK(mc.kv->n_blocks == 32);
    CHECK(mc.prices.at("a").prompt_per_mtok == 2.0);
    CHECK(mc.prices.at("a").cached_prompt_per_mtok == 1.0);
    CHECK(mc.prices.at("a").output_per_mtok == 4.0);
}

TEST_CASE("a generation plan keeps the previous pools whose key is unchanged and loads the others", "[pool]") {
    PoolText a, b, d;
    a.model = "plan_a.gguf";
    b.name = "b";
    b.model = "plan_b.gguf";
    d.name = "d";
    d.model = "plan_d.gguf";
    const Config c1 = config_of(pool_text(a) + pool_text(b));
    std::vector<Pool> prev(2);
    for (int i = 0; i < 2; i++) prev[i].key = pool_key(c1.pools[i], c1);
    const std::vector<const Pool*> prev_ptrs{&prev[0], &prev[1]};

    CHECK(plan_generation(c1, {}).at(0).keep == -1);  // the first generation loads everything
    const std::vector<PoolPlan> same = plan_generation(c1, prev_ptrs);
    REQUIRE(same.size() == 2);
    CHECK(same[0].keep == 0);
    CHECK(same[1].keep == 1);

    // b changed, a re-ordered after a new pool d: a is kept, b and d are loaded.
    PoolText b2 = b;
    b2.extra = "max_batch = 3";
    const Config c2 = config_of(pool_text(d) + pool_text(b2) + pool_text(a));
    const std::vector<PoolPlan> plan = plan_generation(c2, prev_ptrs);
    REQUIRE(plan.size() == 3);
    CHECK(plan[0].keep == -1);
    CHECK(plan[1].keep == -1);
    CHECK(plan[2].keep == 0);
    for (size_t i = 0; i < plan.size(); i++) CHECK(plan[i].key == pool_key(c2.pools[i], c2));
}

TEST_CASE("quality priors are the configured quality, else the parameter count relative to the largest pool's",
          "[pool]") {
    PoolText a, b, d;
    b.name = "b";
    d.name = "d";
    a.extra = "quality = 0.3";
    const Config c = config_of(pool_text(a) + pool_text(b) + pool_text(d));
    std::vector<Pool> pools(3);
    pools[0].profile.n_params = 100;
    pools[1].profile.n_params = 400;
    pools[2].profile.n_params = 100;
    const auto pr = generation_profiles(c, {&pools[0], &pools[1], &pools[2]});
    REQUIRE(pr.size() == 3);
    CHECK(pr[0].quality_prior == 0.3);
    CHECK(pr[1].quality_prior == 1.0);
    CHECK(pr[2].quality_prior == 0.25);
}

TEST_CASE("a generation's profiles take this config's prices and leave the kept pool's own profile alone", "[pool]") {
    PoolText a;
    a.extra = "price_prompt = 2.0\nprice_output = 6.0";
    const Config c = config_of(pool_text(a));
    Pool kept;
    kept.profile.n_params = 100;
    kept.profile.price_prompt = 1.0;  // what an older generation's router was given
    kept.profile.price_output = 3.0;
    const auto pr = generation_profiles(c, {&kept});
    REQUIRE(pr.size() == 1);
    CHECK(pr[0].price_prompt == 2.0);
    CHECK(pr[0].price_output == 6.0);
    CHECK(pr[0].n_params == 100);
    CHECK(kept.profile.price_prompt == 1.0);  // not written in place: older routers may be reading it
}

TEST_CASE("synthesis writes a draft after the target it is cut from, even when the draft's pool comes first", "[pool]") {
    PoolText draft, target;
    draft.model = "synth_draft.gguf";
    draft.synth = "draft_from = \"t\"\nkeep_layers = 1";
    target.name = "t";
    target.model = "synth_target.gguf";
    target.synth = "dim = 64\nlayers = 3\nheads = 2\nkv_heads = 1\nffn = 128\nvocab = 400\nctx = 256\nseed = 5";
    const Config c = config_of(pool_text(draft) + pool_text(target));
    REQUIRE(ensure_models(c).ok());
    auto pd = load_pool(c.pools[0], c);
    auto pt = load_pool(c.pools[1], c);
    REQUIRE(pd.ok());
    REQUIRE(pt.ok());
    CHECK(pt->model->params().n_layer == 3);
    CHECK(pd->model->params().n_layer == 1);
    CHECK(pd->model->params().n_embd == 64);
    CHECK(std::filesystem::last_write_time(c.pools[0].model) >= std::filesystem::last_write_time(c.pools[1].model));
    // Present files are left alone (a second start neither rewrites nor re-keys them).
    const std::string key = pool_key(c.pools[0], c);
    REQUIRE(ensure_models(c).ok());
    CHECK(pool_key(c.pools[0], c) == key);
    // A draft naming no defined pool is refused with the names.
    PoolText orphan;
    orphan.model = "synth_orphan.gguf";
    orphan.synth = "draft_from = \"nope\"\nkeep_layers = 1";
    auto bad = parse_config(pool_text(orphan) + "\n[[bucket]]\nname = \"all\"\npool = \"a\"\n");
    const std::string msg = bad ? (ensure_models(*bad).ok() ? "" : ensure_models(*bad).error().message) : bad.error().message;
    CHECK(msg.find("nope") != std::string::npos);
}

TEST_CASE("a bucket's speculation settings follow its source, the pool's draft model and max_draft_tokens", "[pool]") {
    auto c = parse_config("[limits]\nmax_draft_tokens = 40\n[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\ndraft = \"d\"\n"
                          "[[pool]]\nname = \"d\"\nmodel = \"d.gguf\"\n"
                          "[[bucket]]\nname = \"auto\"\npool = \"t\"\n[bucket.speculation]\nplugin = \"adaptive\"\n"
                          "[[bucket]]\nname = \"ngram\"\npool = \"t\"\n[bucket.speculation]\nplugin = \"fixed\"\nsource = \"ngram\"\n"
                          "[[bucket]]\nname = \"plain\"\npool = \"t\"\n",
                          "x.toml");
    REQUIRE(c.ok());
    REQUIRE(c->buckets.size() == 3);
    CHECK(c->pools[0].draft == "d");
    const SpecSettings a = spec_settings_for(c->buckets[0], *c, true, 4);
    CHECK(a.source == SpecSource::DRAFT);
    CHECK(a.k == k_max_spec_tokens);  // 40 is past what the engine verifies
    CHECK(spec_settings_for(c->buckets[0], *c, false, 4).source == SpecSource::NGRAM);  // routed to a pool without a draft
    CHECK(spec_settings_for(c->buckets[1], *c, true, 4).source == SpecSource::NGRAM);
    CHECK_FALSE(spec_settings_for(c->buckets[2], *c, true, 4).enabled());
    CHECK(c->buckets[0].speculation->params.count("source") == 0);  // not a plugin parameter
    c->limits.max_draft_tokens = 0;
    CHECK_FALSE(spec_settings_for(c->buckets[0], *c, true, 4).enabled());
}

TEST_CASE("a bucket speculating with the target's own first layers or a token tree gets those settings", "[pool]") {
    auto c = parse_config("[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\n"
                          "[[bucket]]\nname = \"self\"\npool = \"t\"\n[bucket.speculation]\nplugin = \"fixed\"\n"
                          "source = \"self\"\nself_layers = 2\ntree = \"dynamic\"\ntree_branch = 3\ntree_depth = 5\n"
                          "[[bucket]]\nname = \"ngram\"\npool = \"t\"\n[bucket.speculation]\nplugin = \"fixed\"\nsource = \"ngram\"\n",
                          "x.toml");
    REQUIRE(c.ok());
    const SpecSettings s = spec_settings_for(c->buckets[0], *c, false, 6);
    CHECK(s.source == SpecSource::SELF);
    CHECK(s.self_layers == 2);
    CHECK(s.tree == SpecTree::DYNAMIC);
    CHECK(s.tree_branch == 3);
    CHECK(s.tree_depth == 5);
    CHECK(c->buckets[0].speculation->params.count("self_layers") == 0);  // host keys, not plugin parameters
    CHECK(c->buckets[0].speculation->params.count("tree") == 0);
    // Routed to a target with no more layers than self_layers: the pool's draft, else n-gram.
    CHECK(spec_settings_for(c->buckets[0], *c, true, 2).source == SpecSource::DRAFT);
    CHECK(spec_settings_for(c->buckets[0], *c, false, 2).source == SpecSource::NGRAM);
    CHECK(spec_settings_for(c->buckets[1], *c, false, 6).tree == SpecTree::CHAIN);
    // Suffix decoding: the same with or without a draft model.
    auto sx = parse_config("[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\n[[bucket]]\nname = \"agent\"\npool = \"t\"\n"
                           "[bucket.speculation]\nplugin = \"adaptive\"\nsource = \"suffix\"\n",
                           "x.toml");
    REQUIRE(sx.ok());
    CHECK(spec_settings_for(sx->buckets[0], *sx, true, 6).source == SpecSource::SUFFIX);
    CHECK(spec_settings_for(sx->buckets[0], *sx, false, 6).source == SpecSource::SUFFIX);
    CHECK(spec_settings_for(sx->buckets[0], *sx, false, 6).tree == SpecTree::CHAIN);
    CHECK(sx->buckets[0].speculation_control_share == 0.0);
    auto ctl = parse_config("[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\n[[bucket]]\nname = \"agent\"\npool = \"t\"\n"
                            "[bucket.speculation]\nplugin = \"adaptive\"\ncontrol_share = 0.2\n",
                            "x.toml");
    REQUIRE(ctl.ok());
    CHECK(ctl->buckets[0].speculation_control_share == 0.2);
    CHECK(ctl->buckets[0].speculation->params.count("control_share") == 0);  // a host key
    // Refusals name the field and the fix.
    const std::string head = "[[pool]]\nname = \"t\"\nmodel = \"t.gguf\"\n[[bucket]]\nname = \"b\"\npool = \"t\"\n"
                             "[bucket.speculation]\nplugin = \"fixed\"\n";
    const std::pair<const char*, const char*> bad[] = {
        {"source = \"self\"\n", "needs self_layers"},
        {"self_layers = 2\n", "only for source = \"self\""},
        {"source = \"self\"\nself_layers = 0\n", "self_layers"},
        {"tree = \"bush\"\n", "\"dynamic\""},
        {"source = \"ngram\"\ntree = \"fixed\"\n", "n-gram draft is a chain"},
        {"source = \"suffix\"\ntree = \"fixed\"\n", "use tree = \"dynamic\""},
        {"source = \"lookahead\"\n", "\"suffix\" (suffix decoding"},
        {"control_share = 0.7\n", "control_share"},
        {"tree = \"fixed\"\ntree_branch = 9\n", "tree_branch"},
        {"tree = \"fixed\"\ntree_depth = 17\n", "tree_depth"},
    };
    for (const auto& [text, want] : bad) {
        INFO(text);
        auto r = parse_config(head + text, "x.toml");
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().message.find(want) != std::string::npos);
    }
}

TEST_CASE("loaded pools of one vocabulary share a vocabulary id and another vocabulary's differs", "[pool]") {
    // What a run lost with its worker may move between; unset (0) on local pools it matched every pool.
    PoolText a, b, c;
    a.model = "voc_a.gguf";
    b.name = "b", b.model = "voc_b.gguf";  // same synth: same vocabulary, another file
    c.name = "c", c.model = "voc_c.gguf";
    c.synth = "dim = 64\nlayers = 2\nheads = 2\nkv_heads = 1\nffn = 128\nvocab = 401\nctx = 256\nseed = 3";
    const Config cfg = config_of(pool_text(a) + pool_text(b) + pool_text(c));
    REQUIRE(ensure_models(cfg).ok());
    auto pa = load_pool(cfg.pools[0], cfg), pb = load_pool(cfg.pools[1], cfg), pc = load_pool(cfg.pools[2], cfg);
    REQUIRE((pa.ok() && pb.ok() && pc.ok()));
    CHECK(pa->vocab_id != 0);
    CHECK(pa->vocab_id == pb->vocab_id);
    CHECK(pa->vocab_id != pc->vocab_id);
}
