// Runtime::embed (steward/runtime.h): texts and token ids give the same vectors; an embedding runs
// beside the pool's decoding without changing either (its own forward, threads and KV); each
// failure is its EmbedStatus with a message naming the pool or the input.
#include <fmt/format.h>
#include <steward/runtime.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "process_temp_dir.h"
#include "test_paths.h"

using namespace steward;

namespace {

std::unique_ptr<Runtime> start_story() {
    static const steward_test::ProcessTempDir dir("steward_test_embed_rt_");
    const std::string model = std::string(STEWARD_TESTDATA_DIR) + "/real/TinyStories-656K.f32.gguf";
    const std::string sim = std::string(STEWARD_SOURCE_DIR) + "/configs/sim/";
    const std::string text = fmt::format(R"(
[limits]
request_timeout_ms = 120000
[reload]
watch = false

[[pool]]
name = "story"
model = "{1}"
threads = 1
kv_blocks = 64
max_batch_tokens = 32
prefix_cache = false  # the second decode computes what the first did, not from its cached blocks
ctx = 256             # the pool's context, below the model's 512: what embeddings are held to

[[pool]]
name = "sim"
backend = "sim"
[pool.sim]
device = "{0}h100.toml"
model = "{0}llama-1b.toml"
)",
                                         sim, model);
    const std::string path = (dir.path() / "embed.toml").string();
    std::ofstream(path) << text;
    auto rt = Runtime::start(path);
    if (!rt) FAIL(rt.error().message);
    return std::move(*rt);
}

const std::vector<std::string> k_texts = {"Once upon a time", "The little bird was sad because",
                                          "Lily and Ben went to the park. They saw a big dog with a red ball."};

}  // namespace

TEST_CASE("Runtime::embed gives texts and their ids one vector", "[runtime][embed]") {
    auto rt = start_story();
    EmbeddingRequest by_text;
    by_text.texts = k_texts;
    const EmbeddingResult a = rt->embed(by_text);
    INFO(a.error);
    REQUIRE(a.ok());
    CHECK(a.pool == "story");    // the first pool that can embed
    CHECK(a.pooling == "last");  // the GGUF declares none
    CHECK(a.n_embd == 128);
    REQUIRE(a.vectors.size() == k_texts.size());
    EmbeddingRequest by_ids;
    by_ids.pool = "story";
    for (const auto& t : k_texts) {
        auto ids = rt->tokenize("story", t, true);
        REQUIRE(ids.ok());
        by_ids.token_ids.push_back(*ids);
    }
    const EmbeddingResult b = rt->embed(by_ids);
    REQUIRE(b.ok());
    CHECK(b.vectors == a.vectors);
    CHECK(b.prompt_tokens == a.prompt_tokens);
    int64_t n = 0;
    for (const auto& ids : by_ids.token_ids) n += (int64_t)ids.size();
    CHECK(a.prompt_tokens == n);
    for (const auto& v : a.vectors) {
        double ss = 0;
        for (float x : v) ss += (double)x * x;
        CHECK(std::abs(ss - 1.0) < 1e-5);
    }
}

TEST_CASE("an embedding beside a decode changes neither", "[runtime][embed]") {
    auto rt = start_story();
    GenerationRequest g;
    g.prompt = "Once upon a time, there was a little girl named Lily.";
    g.max_tokens = 120;
    g.temperature = 0;
    g.ignore_eos = true;
    const GenerationResult alone = rt->generate(g);
    REQUIRE(alone.ok());
    EmbeddingRequest e;
    e.texts = k_texts;
    const EmbeddingResult first = rt->embed(e);
    REQUIRE(first.ok());
    // The same decode again, with embeddings running on the pool's embedding thread all along.
    std::promise<GenerationResult> done;
    RequestCallbacks cb;
    cb.on_finish = [&done](const GenerationResult& r) { done.set_value(r); };
    rt->submit(g, std::move(cb));
    auto fut = done.get_future();
    int n_embedded = 0;
    while (fut.wait_for(std::chrono::seconds(0)) != std::future_status::ready || n_embedded < 3) {
        const EmbeddingResult r = rt->embed(e);
        REQUIRE(r.ok());
        CHECK(r.vectors == first.vectors);
        n_embedded++;
    }
    const GenerationResult beside = fut.get();
    REQUIRE(beside.ok());
    CHECK(beside.tokens == alone.tokens);
    CHECK(n_embedded >= 3);
}

TEST_CASE("Runtime::embed failures name the pool or the input", "[runtime][embed]") {
    auto rt = start_story();
    auto run = [&](EmbeddingRequest req) { return rt->embed(std::move(req)); };
    EmbeddingRequest r;
    EmbeddingResult x = run(r);
    CHECK(x.status == EmbedStatus::INVALID_INPUT);
    CHECK_THAT(x.error, Catch::Contains("no input"));
    r.texts = {"a"};
    r.token_ids = {{1, 2}};
    CHECK(run(r).status == EmbedStatus::INVALID_INPUT);
    r = {};
    r.texts = {"a", ""};
    x = run(r);
    CHECK(x.status == EmbedStatus::INVALID_INPUT);
    CHECK_THAT(x.error, Catch::Contains("input 1 is empty"));
    r = {};
    r.token_ids = {std::vector<int32_t>(257, 5)};
    x = run(r);
    CHECK(x.status == EmbedStatus::CONTEXT_LENGTH_EXCEEDED);
    CHECK_THAT(x.error, Catch::Contains("257 tokens") && Catch::Contains("pool 'story''s context of 256"));
    r.token_ids = {std::vector<int32_t>(256, 5)};
    CHECK(run(r).ok());
    r = {};
    r.token_ids = {{1, 9999}};
    x = run(r);
    CHECK(x.status == EmbedStatus::INVALID_INPUT);
    CHECK_THAT(x.error, Catch::Contains("9999") && Catch::Contains("2048"));
    r = {};
    r.texts = {"a"};
    r.pool = "nope";
    x = run(r);
    CHECK(x.status == EmbedStatus::UNKNOWN_POOL);
    CHECK_THAT(x.error, Catch::Contains("'nope'") && Catch::Contains("story, sim"));
    r.pool = "sim";
    x = run(r);
    CHECK(x.status == EmbedStatus::UNSUPPORTED_POOL);
    CHECK_THAT(x.error, Catch::Contains("pool 'sim' is simulated"));
    CHECK(x.vectors.empty());
    // The async form answers once, on the pool's thread.
    std::promise<EmbeddingResult> p;
    EmbeddingRequest ok;
    ok.texts = {"Once upon a time"};
    rt->embed_async(ok, [&p](EmbeddingResult res) { p.set_value(std::move(res)); });
    CHECK(p.get_future().get().ok());
}

TEST_CASE("queued embeddings answer once as the runtime stops", "[runtime][embed]") {
    std::atomic<int> n_done{0}, n_ok{0}, n_stopped{0};
    {
        auto rt = start_story();
        EmbeddingRequest e;
        e.texts = k_texts;
        for (int i = 0; i < 50; i++)
            rt->embed_async(e, [&](EmbeddingResult r) {
                n_ok += r.ok();
                n_stopped +=
                    r.status == EmbedStatus::FAILED && r.error.find("the runtime stopped") != std::string::npos;
                n_done++;
            });
    }  // ~Runtime: the running one finishes, the queued ones answer FAILED
    CHECK(n_done == 50);
    CHECK(n_ok + n_stopped == 50);
}
