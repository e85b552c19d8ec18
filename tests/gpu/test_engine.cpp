// The engine on the CUDA backend (backend/cuda.h) against the engine on the CPU backend (the
// readable reference): the same requests, batched and chunked, reusing the prefix cache, a
// session's copy-on-write, self-drafted chains and trees (their accepted paths copied on the
// device) and a draft model, give the same greedy tokens (F32 weights: logits within 1e-4, so the
// argmax agrees); and a `backend = "cuda"` pool sizes its KV from the device and runs on it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda.h"
#include "memory_model.h"
#include "model/synth.h"
#include "pool/pool.h"
#include "sched/engine.h"

using namespace steward;

namespace {

SynthSpec target_spec() {
    SynthSpec s;
    s.n_embd = 128; s.n_layer = 4; s.n_head = 8; s.n_head_kv = 2; s.n_ff = 256; s.n_vocab = 512; s.n_ctx = 512;
    s.seed = 23;
    s.late_scale = 0.2f;  // the first 2 layers draft well: accepted and rejected drafts both
    s.late_from = 2;
    return s;
}

const Model& target() {
    static std::unique_ptr<Model> m = steward_test::memory_model(target_spec());
    return *m;
}

const Model& draft() {
    static std::unique_ptr<Model> m = [] {
        SynthSpec s = target_spec();
        s.n_layer = 2;
        s.late_scale = 1.0f;
        s.late_from = -1;
        return steward_test::memory_model(s);
    }();
    return *m;
}

EngineOptions options(bool cuda, bool graphs = true) {
    EngineOptions o;
    o.n_blocks = 128;
    o.block_size = 16;
    o.max_batch = 8;
    o.max_batch_tokens = 64;
    o.n_threads = 2;
    o.self_draft_layers = {2};
    o.draft_model = &draft();
    if (cuda) o.backend = cuda_backend_factory(graphs);
    return o;
}

SpecSettings spec_of(size_t i) {
    SpecSettings s;
    if (i % 4 == 0) return s;
    s.k = 4;
    if (i % 4 == 1) {
        s.source = SpecSource::SELF;
        s.self_layers = 2;
    } else if (i % 4 == 2) {
        s.source = SpecSource::SELF;
        s.self_layers = 2;
        s.tree = SpecTree::DYNAMIC;
        s.tree_branch = 2;
        s.tree_depth = 3;
    } else {
        s.source = SpecSource::DRAFT;
    }
    return s;
}

struct Out {
    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, FinishReason> finish;
    EngineStats stats;
    std::string backend;
};

// Two rounds of 8 requests sharing prefixes (the second round finds the first's blocks cached),
// then a session's second turn diverging inside its cached last block (copy-on-write).
Out run(bool cuda, bool graphs = true) {
    Engine e(target(), options(cuda, graphs));
    Out out;
    double t = 0;
    auto drain = [&] {
        while (e.has_work())
            for (auto& ev : e.step(t += 0.001)) {
                out.tokens[ev.id].insert(out.tokens[ev.id].end(), ev.tokens.begin(), ev.tokens.end());
                if (ev.finished) {
                    out.finish[ev.id] = ev.finish;
                    INFO(ev.error);
                    CHECK(ev.finish != FinishReason::ERROR);
                }
            }
    };
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < 8; i++) {
            EngineRequest r;
            r.id = 1 + round * 8 + i;
            for (int k = 0; k < 40; k++) r.prompt.push_back(300 + (k * 11 + (int)(i % 3) * 17) % 200);
            for (int k = 0; k < (int)i * 5; k++) r.prompt.push_back(100 + (k * 7 + (int)i) % 150);
            r.max_tokens = 16;
            r.spec = spec_of(i);
            REQUIRE(e.submit(r).ok());
        }
        drain();
    }
    EngineRequest s;
    s.id = 50;
    s.session = "agent";
    for (int k = 0; k < 28; k++) s.prompt.push_back(200 + (k * 5) % 90);
    s.max_tokens = 5;  // 28 + 4 computed: two full blocks of 16
    REQUIRE(e.submit(s).ok());
    drain();
    EngineRequest s2 = s;
    s2.id = 51;
    s2.prompt.push_back(out.tokens[50][0] == 460 ? 461 : 460);
    REQUIRE(e.submit(s2).ok());
    drain();
    e.end_session("agent");
    out.stats = e.stats();
    out.backend = e.backend_name();
    CHECK(out.stats.kv.n_blocks_in_use == 0);
    return out;
}

}  // namespace

TEST_CASE("the engine on the CUDA backend gives the CPU engine's greedy tokens: batched, chunked, cached, copy-on-write, self-drafted trees and a draft model", "[gpu_engine]") {
    const Out cpu = run(false);
    const Out gpu = run(true);
    CHECK(gpu.tokens == cpu.tokens);
    CHECK(gpu.finish == cpu.finish);
    CHECK(gpu.stats.n_drafts > 0);
    CHECK(gpu.stats.n_accepted_tokens > 0);
    CHECK(gpu.stats.kv.n_cow_blocks > 0);
    // Its decode steps replayed CUDA graphs (a refused capture would name itself here); with
    // cuda_graphs off, the same tokens from plain launches.
    INFO(gpu.backend);
    CHECK(gpu.backend.find("with CUDA graphs: ") != std::string::npos);
    CHECK(gpu.backend.find(" 0 replays") == std::string::npos);
    const Out eager = run(true, false);
    CHECK(eager.backend.find("without CUDA graphs") != std::string::npos);
    CHECK(eager.tokens == cpu.tokens);
}

TEST_CASE("a backend = \"cuda\" pool sizes its KV from the device's free memory and its engine runs on the device", "[gpu_engine]") {
    const auto dir = std::filesystem::temp_directory_path() / "steward_gpu_engine_test";
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "target.gguf").string();
    REQUIRE(synth_write(target_spec(), path).ok());
    Config config;
    PoolConfig pc;
    pc.name = "gpu";
    pc.model = path;
    pc.backend = "cuda";
    pc.gpu_memory_fraction = 0.05;  // a share of the device: the test leaves the rest alone
    config.pools.push_back(pc);
    auto p = load_pool(pc, config);
    REQUIRE(p);
    CHECK(p->backend == "cuda");
    auto free_b = cuda_free_bytes();
    REQUIRE(free_b);
    const int64_t block = kv_bytes(KvStorage::config_for(p->model->params(), 1, pc.block_size, KvDtype::F32));
    CHECK(p->n_blocks > 1000);
    CHECK((double)p->n_blocks * block <= 0.05 * (double)*free_b);
    auto engine = make_engine(*p, config);
    REQUIRE(engine);
    CHECK((*engine)->backend_name().rfind("cuda", 0) == 0);
    EngineRequest r;
    r.id = 1;
    for (int k = 0; k < 20; k++) r.prompt.push_back(300 + k);
    r.max_tokens = 8;
    REQUIRE((*engine)->submit(r).ok());
    std::vector<int32_t> got, want;
    while ((*engine)->has_work())
        for (auto& ev : (*engine)->step(0.0)) got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
    EngineOptions co;
    co.n_blocks = 64;
    co.n_threads = 2;
    Engine cpu(*p->model, co);
    REQUIRE(cpu.submit(r).ok());
    while (cpu.has_work())
        for (auto& ev : cpu.step(0.0)) want.insert(want.end(), ev.tokens.begin(), ev.tokens.end());
    CHECK(got.size() == 8);
    CHECK(got == want);
    // Explicit kv_blocks are taken as given (a Config built in code, kv_size_set not set).
    pc.kv_blocks = 64;
    auto q = load_pool(pc, config);
    REQUIRE(q);
    CHECK(q->n_blocks == 64);
    std::filesystem::remove_all(dir);
}

TEST_CASE("a request longer than the device's attention can span is refused at submit, naming the limit", "[gpu_engine]") {
    SynthSpec s;
    s.n_embd = 64; s.n_layer = 1; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512;
    s.n_ctx = 1 << 18;  // past what the attention's shared memory holds (~57k slots on an H100 / H200)
    auto model = steward_test::memory_model(s);
    EngineOptions o;
    o.n_blocks = 64;
    o.n_threads = 1;
    o.backend = cuda_backend_factory();
    Engine e(*model, o);
    EngineRequest r;
    r.id = 1;
    r.prompt = {300, 301, 302};
    r.max_tokens = (1 << 18) - 3;
    auto refused = e.submit(r);
    REQUIRE(!refused);
    INFO(refused.error().message);
    CHECK(refused.error().message.find("slots a sequence may span on this pool's backend (cuda") != std::string::npos);
    r.max_tokens = 20;  // within it
    REQUIRE(e.submit(r).ok());
    int n = 0;
    while (e.has_work())
        for (auto& ev : e.step(0.0)) n += (int)ev.tokens.size();
    CHECK(n == 20);
}
