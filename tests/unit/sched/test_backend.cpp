// The engine's backend seam (backend/backend.h, the CPU one backend/cpu.h): every forward and KV copy of the target, the draft
// model and the self-drafts goes through EngineOptions::backend's backends (the CUDA pool's path),
// shaped as the engine sizes them; a backend that stores the KV elsewhere gives the same outputs as
// the single-sequence Generator (an independent code path); a backend's errors fail only the
// requests they touch, with the backend's words, and the engine keeps serving.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu.h"
#include "greedy_reference.h"
#include "memory_model.h"
#include "model/synth.h"
#include "sched/engine.h"

using namespace steward;

namespace {

// llama, 4 layers (a self-draft of 2 has room), GQA.
const Model& test_model() {
    static std::unique_ptr<Model> m = [] {
        SynthSpec s;
        s.n_embd = 64; s.n_layer = 4; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 512;
        s.seed = 11;
        s.late_scale = 0.2f;  // the first 2 layers agree with the whole on most tokens: drafts accepted
        s.late_from = 2;
        return steward_test::memory_model(s);
    }();
    return *m;
}

std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int n) {
    return steward_test::greedy_reference(test_model(), prompt, n);
}

// What the factory was asked for, and what the backends were asked to do.
struct Log {
    struct Made {
        const Model* model;
        KvConfig kv;
        int n_layers;
    };
    std::vector<Made> made;
    int forwards = 0, block_copies = 0, slot_copies = 0;
    // Failures to inject: the n-th forward / block copy (1-based, 0: none) of the target (n_layers 0
    // of the test model) fails.
    int fail_forward_at = 0, fail_block_copy_at = 0;
    int max_context = 0;  // what the backends say of it
};

// A CPU backend whose physical blocks are stored reversed (block b at n_blocks - 1 - b of its own
// storage), so KV the engine reached other than through the backend would be in the wrong place,
// and that counts and injects failures.
class ReversedBackend final : public ForwardBackend {
public:
    ReversedBackend(const Model& m, const KvConfig& kv, int max_tokens, int n_layers, Log& log, bool target)
        : inner_(m, kv, max_tokens, n_layers, 1), log_(log), target_(target) {}
    std::string describe() const override { return "reversed cpu"; }
    Expected<bool> forward(std::span<const SeqInput> batch, std::vector<float>& logits) override {
        if (target_ && ++log_.forwards == log_.fail_forward_at) return make_error("injected device fault in the forward");
        std::vector<std::vector<int32_t>> tables;
        for (const SeqInput& in : batch) tables.push_back(flip(in.block_table));
        std::vector<SeqInput> b(batch.begin(), batch.end());
        for (size_t i = 0; i < b.size(); i++) b[i].block_table = tables[i];
        return inner_.forward(b, logits);
    }
    Expected<bool> copy_block_slots(int src_block, int dst_block, int n_slots) override {
        if (target_ && ++log_.block_copies == log_.fail_block_copy_at) return make_error("injected device fault in a copy");
        return inner_.copy_block_slots(flip(src_block), flip(dst_block), n_slots);
    }
    Expected<bool> copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                              std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) override {
        if (target_) log_.slot_copies++;
        return inner_.copy_slots(flip(src_table), src_slots, flip(dst_table), dst_slots);
    }
    const KvConfig& kv_config() const override { return inner_.kv_config(); }
    int max_tokens() const override { return inner_.max_tokens(); }
    int n_layers() const override { return inner_.n_layers(); }
    int max_context() const override { return log_.max_context; }
    ThreadPool& host_threads() override { return inner_.host_threads(); }

private:
    int flip(int b) const { return inner_.kv_config().n_blocks - 1 - b; }
    std::vector<int32_t> flip(std::span<const int32_t> t) const {
        std::vector<int32_t> out;
        for (int32_t b : t) out.push_back(flip(b));
        return out;
    }
    CpuBackend inner_;
    Log& log_;
    bool target_;
};

BackendFactory reversed_factory(std::shared_ptr<Log> log) {
    return [log](const Model& m, const KvConfig& kv, int max_tokens, int n_layers,
                 int) -> Expected<std::unique_ptr<ForwardBackend>> {
        log->made.push_back({&m, kv, n_layers});
        const bool target = &m == &test_model() && n_layers == 0;
        return std::unique_ptr<ForwardBackend>(std::make_unique<ReversedBackend>(m, kv, max_tokens, n_layers, *log, target));
    };
}

EngineOptions options(std::shared_ptr<Log> log) {
    EngineOptions o;
    o.n_blocks = 96;
    o.block_size = 8;
    o.max_batch = 8;
    o.max_batch_tokens = 48;  // prompts are chunked
    o.n_threads = 1;
    o.backend = reversed_factory(std::move(log));
    return o;
}

std::vector<std::vector<int32_t>> prompts(int n) {
    std::vector<std::vector<int32_t>> out;
    for (int k = 0; k < n; k++) {
        std::vector<int32_t> p;
        for (int i = 0; i < 20 + 7 * k; i++) p.push_back(300 + (i * 13 + k * 29) % 200);
        out.push_back(p);
    }
    return out;
}

// Submits ps as requests 1..n of max_tokens each, request i speculating as spec_of(i).
void submit_all(Engine& e, const std::vector<std::vector<int32_t>>& ps, int max_tokens,
                const std::function<SpecSettings(size_t)>& spec_of = [](size_t) { return SpecSettings{}; }) {
    for (size_t i = 0; i < ps.size(); i++) {
        EngineRequest r;
        r.id = i + 1;
        r.prompt = ps[i];
        r.max_tokens = max_tokens;
        r.spec = spec_of(i);
        REQUIRE(e.submit(r).ok());
    }
}

struct Done {
    std::vector<int32_t> out;
    FinishReason finish = FinishReason::LENGTH;
    std::string error;
};

std::map<uint64_t, Done> drain(Engine& e) {
    std::map<uint64_t, Done> res;
    double t = 0;
    while (e.has_work())
        for (auto& ev : e.step(t += 0.001)) {
            Done& d = res[ev.id];
            d.out.insert(d.out.end(), ev.tokens.begin(), ev.tokens.end());
            if (ev.finished) {
                d.finish = ev.finish;
                d.error = ev.error;
            }
        }
    return res;
}

SpecSettings self_spec(int layers, SpecTree tree) {
    SpecSettings s;
    s.source = SpecSource::SELF;
    s.k = 4;
    s.self_layers = layers;
    s.tree = tree;
    s.tree_branch = 2;
    s.tree_depth = 3;
    return s;
}

}  // namespace

TEST_CASE("the engine runs every forward and KV copy through its backend: outputs equal the Generator's with the KV stored elsewhere", "[engine][backend]") {
    auto log = std::make_shared<Log>();
    EngineOptions o = options(log);
    o.self_draft_layers = {2};
    Engine e(test_model(), o);
    CHECK(e.backend_name() == "reversed cpu");
    // Made at construction: the target over the engine's blocks, the self-draft the config names
    // over as many blocks of 2 layers.
    REQUIRE(log->made.size() == 2);
    CHECK(log->made[0].n_layers == 0);
    CHECK(log->made[0].kv.n_layer == 4);
    CHECK(log->made[0].kv.n_blocks == e.kv_manager().stats().n_blocks_total);
    CHECK(log->made[0].kv.block_size == 8);
    CHECK(log->made[1].n_layers == 2);
    CHECK(log->made[1].kv.n_layer == 2);
    CHECK(log->made[1].kv.n_blocks == log->made[0].kv.n_blocks);

    const auto ps = prompts(6);
    // Plain, a self-drafted chain, a self-drafted dynamic tree (its accepted paths copied into
    // place through the backend) and a self-draft of 3 layers made on first use.
    submit_all(e, ps, 12, [](size_t i) {
        return i % 4 == 1 ? self_spec(2, SpecTree::CHAIN) : i % 4 == 2 ? self_spec(2, SpecTree::DYNAMIC)
             : i % 4 == 3 ? self_spec(3, SpecTree::FIXED) : SpecSettings{};
    });
    auto res = drain(e);
    for (size_t i = 0; i < ps.size(); i++) {
        INFO("request " << i + 1);
        CHECK(res[i + 1].finish == FinishReason::LENGTH);
        CHECK(res[i + 1].out == reference_greedy(ps[i], 12));
    }
    REQUIRE(log->made.size() == 3);
    CHECK(log->made[2].n_layers == 3);
    CHECK(log->made[2].kv.n_layer == 3);
    CHECK(log->forwards == (int)e.stats().n_steps);
    CHECK(log->slot_copies > 0);  // accepted tree paths moved into place
    CHECK(e.stats().n_accepted_tokens > 0);

    // A session's next turn that diverges inside the session's last block (full, so in the prefix
    // cache) writes into a cached block: copy-on-write through the backend, then the same output
    // as the Generator's.
    EngineRequest s;
    s.id = 100;
    s.session = "agent";
    for (int i = 0; i < 20; i++) s.prompt.push_back(300 + (i * 7 + 3) % 200);  // not cached yet
    s.max_tokens = 5;
    REQUIRE(e.submit(s).ok());
    auto t1 = drain(e);
    EngineRequest s2 = s;
    s2.id = 101;
    // The session's 20 + 4 computed tokens fill its 3 blocks of 8.
    s2.prompt.push_back(t1[100].out[0] == 460 ? 461 : 460);  // diverges at token 20, in block 2
    for (int i = 0; i < 9; i++) s2.prompt.push_back(450 + i);
    const int copies_before = log->block_copies;
    REQUIRE(e.submit(s2).ok());
    auto t2 = drain(e);
    CHECK(log->block_copies > copies_before);
    CHECK(t2[101].out == reference_greedy(s2.prompt, 5));
    e.end_session("agent");
    CHECK(e.stats().kv.n_blocks_in_use == 0);
}

TEST_CASE("a draft model's forwards run on a backend of its own, shaped by the draft", "[engine][backend]") {
    static std::unique_ptr<Model> draft = [] {
        SynthSpec s;
        s.n_embd = 64; s.n_layer = 2; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 512;
        s.seed = 11;
        return steward_test::memory_model(s);
    }();
    auto log = std::make_shared<Log>();
    EngineOptions o = options(log);
    o.draft_model = draft.get();
    Engine e(test_model(), o);
    REQUIRE(log->made.size() == 2);
    CHECK(log->made[1].model == draft.get());
    CHECK(log->made[1].kv.n_layer == 2);
    CHECK(log->made[1].kv.n_blocks == log->made[0].kv.n_blocks);  // a draft slot for every target slot
    const auto ps = prompts(3);
    submit_all(e, ps, 10, [](size_t) {
        SpecSettings s;
        s.source = SpecSource::DRAFT;
        s.k = 3;
        return s;
    });
    auto res = drain(e);
    for (size_t i = 0; i < ps.size(); i++) CHECK(res[i + 1].out == reference_greedy(ps[i], 10));
    CHECK(e.stats().n_drafts > 0);
}

TEST_CASE("a backend that cannot be made is the engine's error, a self-draft's failure leaves its requests undrafted", "[engine][backend]") {
    EngineOptions o = options(std::make_shared<Log>());
    o.backend = [](const Model&, const KvConfig& kv, int, int, int) -> Expected<std::unique_ptr<ForwardBackend>> {
        return make_error("out of device memory for ", std::to_string(kv.n_blocks), " blocks");
    };
    try {
        Engine e(test_model(), o);
        FAIL("the engine was made without a backend");
    } catch (const std::runtime_error& err) {
        CHECK(std::string(err.what()) == "out of device memory for 96 blocks");
    }

    // The target's backend is made; a self-draft's (first used by a request) is not.
    auto log = std::make_shared<Log>();
    EngineOptions o2 = options(log);
    BackendFactory inner = o2.backend;
    o2.backend = [inner](const Model& m, const KvConfig& kv, int t, int n_layers, int th) -> Expected<std::unique_ptr<ForwardBackend>> {
        if (n_layers > 0) return make_error("no room for a self-draft");
        return inner(m, kv, t, n_layers, th);
    };
    Engine e(test_model(), o2);
    const auto ps = prompts(2);
    submit_all(e, ps, 8, [](size_t) { return self_spec(2, SpecTree::CHAIN); });
    auto res = drain(e);
    for (size_t i = 0; i < ps.size(); i++) {
        CHECK(res[i + 1].finish == FinishReason::LENGTH);
        CHECK(res[i + 1].out == reference_greedy(ps[i], 8));
    }
    CHECK(e.stats().n_drafts == 0);
}

TEST_CASE("a backend's forward error fails the batch's requests with its words, a copy error loses nothing queued, the engine keeps serving", "[engine][backend]") {
    SECTION("a forward") {
        auto log = std::make_shared<Log>();
        log->fail_forward_at = 3;
        Engine e(test_model(), options(log));
        const auto ps = prompts(2);
        submit_all(e, ps, 6);
        auto res = drain(e);
        // The third forward's batch fails; whatever was not in it completes.
        int failed = 0;
        for (auto& [id, d] : res)
            if (d.finish == FinishReason::ERROR) {
                failed++;
                CHECK(d.error.find("injected device fault in the forward") != std::string::npos);
            } else {
                CHECK(d.out == reference_greedy(ps[id - 1], 6));
            }
        CHECK(failed >= 1);
        // Later requests are served.
        EngineRequest r;
        r.id = 9;
        r.prompt = ps[0];
        r.max_tokens = 4;
        REQUIRE(e.submit(r).ok());
        auto after = drain(e);
        CHECK(after[9].finish == FinishReason::LENGTH);
        CHECK(after[9].out == reference_greedy(ps[0], 4));
        CHECK(e.stats().kv.n_blocks_in_use == 0);
    }
    SECTION("a copy-on-write while admitting a request") {
        // The step fails before the request joins the batch: it stays queued without the KV it
        // was given and is admitted again (its session's KV went with the failure), same output.
        auto log = std::make_shared<Log>();
        log->fail_block_copy_at = 1;
        Engine e(test_model(), options(log));
        EngineRequest s;
        s.id = 1;
        s.session = "agent";
        s.prompt = prompts(1)[0];
        s.max_tokens = 5;
        REQUIRE(e.submit(s).ok());
        auto t1 = drain(e);
        REQUIRE(t1[1].finish == FinishReason::LENGTH);
        REQUIRE(e.n_sessions() == 1);
        EngineRequest s2 = s;
        s2.id = 2;
        s2.prompt.push_back(t1[1].out[0] == 460 ? 461 : 460);  // diverges inside the session's cached last block
        REQUIRE(e.submit(s2).ok());
        auto t2 = drain(e);
        CHECK(log->block_copies >= 1);
        CHECK(t2[2].finish == FinishReason::LENGTH);
        CHECK(t2[2].out == reference_greedy(s2.prompt, 5));
        e.end_session("agent");
        CHECK(e.stats().kv.n_blocks_in_use == 0);
    }
}

TEST_CASE("a backend's context limit refuses at submit the requests that could outgrow it, drafts counted", "[engine][backend]") {
    auto log = std::make_shared<Log>();
    log->max_context = 40;
    Engine e(test_model(), options(log));
    EngineRequest r;
    r.id = 1;
    for (int i = 0; i < 30; i++) r.prompt.push_back(300 + i);
    r.max_tokens = 10;  // 40: fits
    REQUIRE(e.submit(r).ok());
    EngineRequest over = r;
    over.id = 2;
    over.max_tokens = 11;
    auto refused = e.submit(over);
    REQUIRE(!refused);
    CHECK(refused.error().message ==
          "request 2: prompt of 30 tokens + max_tokens 11 exceeds the 40 slots a sequence may span on this pool's "
          "backend (reversed cpu); shorten the prompt or lower max_tokens");
    EngineRequest drafted = r;
    drafted.id = 3;
    drafted.max_tokens = 8;
    drafted.spec = self_spec(2, SpecTree::CHAIN);  // k 4: 42
    auto refused2 = e.submit(drafted);
    REQUIRE(!refused2);
    CHECK(refused2.error().message.find("+ 4 draft tokens exceeds the 40 slots") != std::string::npos);
    auto res = drain(e);
    CHECK(res[1].out == reference_greedy(r.prompt, 10));
}
