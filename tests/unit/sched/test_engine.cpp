// Engine (continuous batching over paged KV): greedy outputs equal the single-sequence Generator
// (an independent code path: contiguous KV, one sequence) however requests are batched, cached,
// preempted or squeezed into a pool much smaller than the workload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <span>

#include "greedy_reference.h"
#include "memory_model.h"
#include "model/synth.h"
#include "sched/engine.h"

using namespace steward;

namespace {

const Model& test_model() {
    static std::unique_ptr<Model> m = [] {
        SynthSpec s;
        s.n_embd = 64; s.n_layer = 2; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 512;
        s.seed = 7;
        return steward_test::memory_model(s);
    }();
    return *m;
}

// Prompts sharing prefixes (so the prefix cache has something to find), with unique tails.
std::vector<std::vector<int32_t>> make_prompts(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int32_t>> shared(3);
    for (auto& p : shared)
        for (int i = 0; i < 40; i++) p.push_back(300 + (int)(rng() % 200));
    std::vector<std::vector<int32_t>> out;
    for (int k = 0; k < n; k++) {
        std::vector<int32_t> p = shared[k % 3];
        p.resize(16 + rng() % 25);  // a prefix of the shared part
        const int tail = 1 + (int)(rng() % 20);
        for (int i = 0; i < tail; i++) p.push_back(300 + (int)(rng() % 200));
        out.push_back(p);
    }
    return out;
}

std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int n) {
    return steward_test::greedy_reference(test_model(), prompt, n);
}

// Runs every request through one engine, submitting them `at_once` at a time, until drained.
std::map<uint64_t, std::vector<int32_t>> run_engine(const EngineOptions& opt, const std::vector<std::vector<int32_t>>& prompts,
                                                    int max_tokens, int at_once, EngineStats* st_out = nullptr) {
    Engine e(test_model(), opt);
    std::map<uint64_t, std::vector<int32_t>> out;
    size_t next = 0;
    double t = 0;
    int live = 0;
    while (next < prompts.size() || e.has_work()) {
        while (next < prompts.size() && live < at_once) {
            EngineRequest r;
            r.id = next + 1;
            r.prompt = prompts[next];
            r.max_tokens = max_tokens;
            r.tenant = (int)(next % 3);
            REQUIRE(e.submit(r).ok());
            next++;
            live++;
        }
        for (auto& ev : e.step(t += 0.001)) {
            for (int32_t tok : ev.tokens) out[ev.id].push_back(tok);
            if (ev.finished) {
                REQUIRE(ev.finish != FinishReason::ERROR);
                live--;
            }
        }
    }
    if (st_out) *st_out = e.stats();
    const auto kst = e.stats().kv;
    CHECK(kst.n_blocks_in_use == 0);
    return out;
}

}  // namespace

TEST_CASE("greedy outputs are identical run alone, 32 at once, with the prefix cache off, and under forced preemption", "[engine]") {
    const auto prompts = make_prompts(32, 11);
    const int max_tokens = 12;
    std::vector<std::vector<int32_t>> ref;
    for (auto& p : prompts) ref.push_back(reference_greedy(p, max_tokens));

    EngineOptions base;
    base.n_blocks = 256;
    base.block_size = 16;
    base.max_batch = 32;
    base.max_batch_tokens = 128;
    base.n_threads = 1;

    SECTION("alone") {
        auto out = run_engine(base, prompts, max_tokens, 1);
        for (size_t k = 0; k < prompts.size(); k++) CHECK(out[k + 1] == ref[k]);
    }
    SECTION("32 at once") {
        EngineStats st;
        auto out = run_engine(base, prompts, max_tokens, 32, &st);
        for (size_t k = 0; k < prompts.size(); k++) CHECK(out[k + 1] == ref[k]);
        CHECK(st.kv.n_prefix_hit_tokens > 0);  // shared prefixes were found
    }
    SECTION("prefix cache off") {
        EngineOptions o = base;
        o.prefix_cache = false;
        EngineStats st;
        auto out = run_engine(o, prompts, max_tokens, 32, &st);
        for (size_t k = 0; k < prompts.size(); k++) CHECK(out[k + 1] == ref[k]);
        CHECK(st.kv.n_prefix_hit_tokens == 0);
    }
    SECTION("a tiny pool forces preemption, and a workload of 3x the pool completes correctly") {
        EngineOptions o = base;
        o.n_blocks = 12;  // 192 slots; 32 requests of up to ~72 tokens need ~3x that at once
        o.block_size = 8;
        EngineStats st;
        auto out = run_engine(o, prompts, max_tokens, 32, &st);
        for (size_t k = 0; k < prompts.size(); k++) CHECK(out[k + 1] == ref[k]);
        CHECK(st.n_preemptions > 0);
        int64_t total_slots = 0;
        for (auto& p : prompts) total_slots += (int64_t)p.size() + max_tokens;
        CHECK(total_slots >= 3 * o.n_blocks * o.block_size);
    }
    SECTION("block size 32 and small chunks") {
        EngineOptions o = base;
        o.block_size = 32;
        o.max_batch_tokens = 24;
        auto out = run_engine(o, prompts, max_tokens, 32);
        for (size_t k = 0; k < prompts.size(); k++) CHECK(out[k + 1] == ref[k]);
    }
}

TEST_CASE("admission control refuses past the queue, over the context, and over the whole pool", "[engine]") {
    EngineOptions o;
    o.n_blocks = 8;
    o.block_size = 16;
    o.max_queue = 2;
    o.n_threads = 1;
    Engine e(test_model(), o);
    EngineRequest r;
    r.prompt = {300, 301, 302};
    r.max_tokens = 4;
    r.id = 1;
    REQUIRE(e.submit(r).ok());
    r.id = 2;
    REQUIRE(e.submit(r).ok());
    r.id = 3;
    auto full = e.submit(r);
    REQUIRE(!full.ok());
    CHECK(full.error().code == ErrorCode::OVERLOADED);  // typed: the executor never parses the text
    CHECK_THAT(full.error().message, Catch::Contains("max_queue"));
    r.id = 4;
    r.max_tokens = 200;  // 203 tokens need 13 blocks > 8
    auto big = e.submit(r);
    REQUIRE(!big.ok());
    CHECK(big.error().code == ErrorCode::INVALID);
    CHECK_THAT(big.error().message, Catch::Contains("KV blocks"));
    r.max_tokens = 4;
    r.prompt.assign(600, 300);  // past the 512-token context
    auto ctx = e.submit(r);
    REQUIRE(!ctx.ok());
    CHECK_THAT(ctx.error().message, Catch::Contains("context"));
}

TEST_CASE("cancellation and deadlines end requests with their reason and free their blocks", "[engine]") {
    EngineOptions o;
    o.n_blocks = 64;
    o.n_threads = 1;
    Engine e(test_model(), o);
    EngineRequest a, b;
    a.id = 1;
    a.prompt = {300, 301, 302, 303};
    a.max_tokens = 100;
    b = a;
    b.id = 2;
    b.deadline_s = 0.5;
    REQUIRE(e.submit(a).ok());
    REQUIRE(e.submit(b).ok());
    std::map<uint64_t, FinishReason> fin;
    for (int i = 0; i < 3; i++)
        for (auto& ev : e.step(0.1 * i))
            if (ev.finished) fin[ev.id] = ev.finish;
    CHECK(fin.empty());
    e.cancel(1);
    for (auto& ev : e.step(1.0))
        if (ev.finished) fin[ev.id] = ev.finish;
    CHECK(fin[1] == FinishReason::CANCELLED);
    CHECK(fin[2] == FinishReason::TIMEOUT);
    CHECK(!e.has_work());
    CHECK(e.stats().kv.n_blocks_in_use == 0);
}

TEST_CASE("a session keeps its KV across turns so the next turn reuses it", "[engine]") {
    EngineOptions o;
    o.n_blocks = 64;
    o.n_threads = 1;
    o.prefix_cache = false;  // only the session can give reuse here
    Engine e(test_model(), o);
    EngineRequest r;
    r.id = 1;
    r.session = "agent-1";
    for (int i = 0; i < 30; i++) r.prompt.push_back(300 + i);
    r.max_tokens = 5;
    REQUIRE(e.submit(r).ok());
    std::vector<int32_t> out1;
    while (e.has_work())
        for (auto& ev : e.step(0.0)) out1.insert(out1.end(), ev.tokens.begin(), ev.tokens.end());
    CHECK(e.n_sessions() == 1);
    // Turn 2: the whole conversation plus a tool result.
    EngineRequest r2 = r;
    r2.id = 2;
    r2.prompt.insert(r2.prompt.end(), out1.begin(), out1.end());
    for (int i = 0; i < 10; i++) r2.prompt.push_back(400 + i);
    REQUIRE(e.submit(r2).ok());
    int cached = -1;
    std::vector<int32_t> out2;
    while (e.has_work())
        for (auto& ev : e.step(0.0)) {
            out2.insert(out2.end(), ev.tokens.begin(), ev.tokens.end());
            if (ev.finished) cached = ev.n_cached_prompt_tokens;
        }
    // Turn 1 computed prompt + 4 of its 5 outputs (the last one was sampled, never fed back).
    CHECK(cached == 30 + 4);
    CHECK(out2 == reference_greedy(r2.prompt, 5));
    e.end_session("agent-1");
    CHECK(e.stats().kv.n_blocks_in_use == 0);
}

TEST_CASE("after draining random workloads with cancellations, preemptions, sessions and expiry every block is free", "[engine]") {
    for (uint64_t seed = 1; seed <= 6; seed++) {
        std::mt19937_64 rng(seed);
        EngineOptions o;
        o.n_blocks = 10 + (int)(rng() % 10);  // small: forces preemption and eviction
        o.block_size = rng() % 2 ? 8 : 16;
        o.max_batch = 1 + (int)(rng() % 8);
        o.max_batch_tokens = 8 + (int)(rng() % 48);
        o.n_threads = 1;
        o.session_ttl_s = 0.05;
        Engine e(test_model(), o);
        const auto prompts = make_prompts(40, seed);
        std::map<uint64_t, int> finishes;
        double t = 0;
        size_t next = 0;
        uint64_t submitted = 0;
        while (next < prompts.size() || e.has_work()) {
            if (next < prompts.size() && rng() % 3 == 0) {
                EngineRequest r;
                r.id = ++submitted;
                r.prompt = prompts[next++];
                r.max_tokens = 1 + (int)(rng() % 10);
                r.tenant = (int)(rng() % 3);
                r.priority = (int)(rng() % 3);
                if (rng() % 4 == 0) r.session = "s" + std::to_string(rng() % 3);
                if (rng() % 8 == 0) r.deadline_s = t + 0.01 * (double)(rng() % 5);
                if (rng() % 5 == 0) r.sampling.temperature = 1.0f, r.sampling.seed = rng();
                const int64_t need = ((int64_t)r.prompt.size() + r.max_tokens + o.block_size - 1) / o.block_size;
                auto ok = e.submit(r);
                REQUIRE(ok.ok() == (need <= o.n_blocks));  // refused only when it could never fit
                if (!ok) finishes[r.id]++;
            }
            if (submitted > 0 && rng() % 7 == 0) e.cancel(1 + rng() % submitted);
            for (auto& ev : e.step(t += 0.002))
                if (ev.finished) finishes[ev.id]++;
            if (next >= prompts.size() && !e.has_work()) break;
        }
        // Every submitted request finished exactly once.
        CHECK(finishes.size() == submitted);
        for (auto& [id, n] : finishes) CHECK(n == 1);
        // Sessions expire after their TTL; then nothing holds a block.
        e.step(t + 1.0);
        const KvManager& m = e.kv_manager();
        CHECK(e.n_sessions() == 0);
        CHECK(m.seq_ids().empty());
        CHECK(m.pool().n_free() == m.pool().n_total());
        for (int32_t b = 0; b < m.pool().n_total(); b++) CHECK(m.pool().ref_count(b) == 0);
        CHECK(m.pool().check_invariants().empty());
        CHECK(e.stats().n_preemptions + e.stats().kv.n_evictions > 0);
    }
}

TEST_CASE("the configured tenant salt decides sharing: the same salt shares blocks, different salts never do", "[engine]") {
    auto cached_second = [](uint64_t salt_a, uint64_t salt_b) {
        EngineOptions o;
        o.n_blocks = 64;
        o.n_threads = 1;
        Engine e(test_model(), o);
        int cached = -1;
        for (int k = 0; k < 2; k++) {
            EngineRequest r;
            r.id = (uint64_t)k + 1;
            r.tenant = k + 1;  // two different tenant ids
            r.salt = k == 0 ? salt_a : salt_b;
            for (int i = 0; i < 40; i++) r.prompt.push_back(300 + i);
            r.max_tokens = 2;
            REQUIRE(e.submit(r).ok());
            while (e.has_work())
                for (auto& ev : e.step(0.0))
                    if (ev.finished && ev.id == 2) cached = ev.n_cached_prompt_tokens;
        }
        return cached;
    };
    CHECK(cached_second(77, 77) == 32);  // two full blocks of 16 (the last token is always computed)
    CHECK(cached_second(77, 78) == 0);
    CHECK(cached_second(0, 0) == 0);  // no configured salt: derived per tenant id, never shared
}

TEST_CASE("each finished request carries its own preemptions, equal to the times its KV was seen dropped", "[engine]") {
    EngineOptions o;
    o.n_blocks = 12;  // 192 slots for requests of 6 blocks each: preemption is certain
    o.n_threads = 1;
    o.max_batch_tokens = 64;
    Engine e(test_model(), o);
    std::vector<int32_t> pub;
    for (int i = 0; i < 32; i++) pub.push_back(300 + i);  // two full public blocks
    e.set_public_prefixes({pub});
    std::mt19937_64 rng(17);
    std::map<uint64_t, std::vector<int32_t>> prompts;
    for (uint64_t id = 1; id <= 6; id++) {
        EngineRequest r;
        r.id = id;
        r.tenant = (int32_t)id % 2 + 1;
        r.salt = 100 + (uint64_t)r.tenant;
        r.prompt = pub;
        for (int i = 0; i < 8; i++) r.prompt.push_back(340 + (int)(rng() % 150));
        r.max_tokens = 50;
        r.stop_at_eos = false;
        r.priority = (int)(id % 3);
        prompts[id] = r.prompt;
        REQUIRE(e.submit(r).ok());
    }
    // The independent count: between two steps a request's KV is held iff some live sequence starts
    // with its prompt (the prompts differ); a request that held KV, holds none after the next step
    // and did not finish in it was preempted (it cannot be re-admitted in the step that preempted it).
    auto holds_kv = [&](const std::vector<int32_t>& p) {
        for (SeqId s : e.kv_manager().seq_ids()) {
            const SeqKv& kv = e.kv_manager().seq(s);
            if (kv.tokens.size() >= p.size() && std::equal(p.begin(), p.end(), kv.tokens.begin())) return true;
        }
        return false;
    };
    std::map<uint64_t, int> seen_dropped;
    std::map<uint64_t, EngineEvent> fin;
    std::map<uint64_t, bool> held;
    double t = 0;
    while (e.has_work()) {
        std::set<uint64_t> finished_now;
        for (EngineEvent& ev : e.step(t += 0.001))
            if (ev.finished) {
                finished_now.insert(ev.id);
                fin[ev.id] = ev;
            }
        for (const auto& [id, p] : prompts) {
            if (fin.count(id)) continue;
            const bool now = holds_kv(p);
            if (held[id] && !now) seen_dropped[id]++;
            held[id] = now;
        }
    }
    int n_total = 0;
    for (const auto& [id, ev] : fin) {
        INFO("request " << id);
        CHECK(ev.finish == FinishReason::LENGTH);
        CHECK(ev.n_preemptions == seen_dropped[id]);
        if (ev.n_recomputed_tokens > 0) CHECK(ev.n_preemptions > 0);  // (the cache may give all of it back)
        // The cache shares come from the first admission only: never more than the public blocks,
        // however often a re-attach hits them again.
        CHECK(ev.n_cached_public + ev.n_cached_cross_tenant <= ev.n_cached_prompt_tokens);
        CHECK(ev.n_cached_public <= 32);
        CHECK(ev.n_cached_cross_tenant == 0);
        n_total += ev.n_preemptions;
    }
    CHECK(fin.size() == 6);
    CHECK(n_total > 0);
    CHECK(n_total == e.stats().n_preemptions);
}

TEST_CASE("a request's cache hits are split into public and cross-tenant shares by who wrote the blocks", "[engine]") {
    EngineOptions o;
    o.n_blocks = 64;
    o.n_threads = 1;
    Engine e(test_model(), o);
    std::vector<int32_t> pub;
    for (int i = 0; i < 32; i++) pub.push_back(300 + i);
    e.set_public_prefixes({pub});
    uint64_t next_id = 1;
    auto run = [&](int32_t tenant, uint64_t salt, std::vector<int32_t> prompt) {
        EngineRequest r;
        r.id = next_id++;
        r.tenant = tenant;
        r.salt = salt;
        r.prompt = std::move(prompt);
        r.max_tokens = 2;
        REQUIRE(e.submit(r).ok());
        EngineEvent last;
        while (e.has_work())
            for (EngineEvent& ev : e.step(0.0))
                if (ev.finished) last = ev;
        return last;
    };
    auto with_tail = [](std::vector<int32_t> p, int first) {
        for (int i = 0; i < 10; i++) p.push_back(first + i);
        return p;
    };
    const EngineEvent a1 = run(1, 11, with_tail(pub, 400));
    CHECK(a1.n_cached_prompt_tokens == 0);
    // Another tenant, another salt: only the public prefix's two full blocks are shared.
    const EngineEvent b1 = run(2, 22, with_tail(pub, 450));
    CHECK(b1.n_cached_prompt_tokens == 32);
    CHECK(b1.n_cached_public == 32);
    CHECK(b1.n_cached_cross_tenant == 0);
    // The writer's own blocks are neither: tenant 1 again hits its own (public and private) blocks.
    const EngineEvent a2 = run(1, 11, with_tail(pub, 400));
    CHECK(a2.n_cached_prompt_tokens == 32);  // (42 - 1) / 16 full blocks
    CHECK(a2.n_cached_public == 0);
    CHECK(a2.n_cached_cross_tenant == 0);
    // Two tenants configured with one salt share private blocks too: counted as cross-tenant, the
    // figure that shows such sharing (it must stay 0 unless salts are shared on purpose).
    std::vector<int32_t> priv;
    for (int i = 0; i < 40; i++) priv.push_back(200 + i);
    const EngineEvent c1 = run(3, 77, priv);
    CHECK(c1.n_cached_prompt_tokens == 0);
    const EngineEvent d1 = run(4, 77, priv);
    CHECK(d1.n_cached_prompt_tokens == 32);
    CHECK(d1.n_cached_cross_tenant == 32);
    CHECK(d1.n_cached_public == 0);
    CHECK(e.stats().kv.n_tenant_boundary_hit_tokens == 32);
    CHECK(e.stats().kv.n_public_cross_tenant_hit_tokens == 32);
}

TEST_CASE("a step whose forward throws fails every running request, keeps the waiting ones, and the engine goes on", "[engine]") {
    struct HookGuard {
        ~HookGuard() { set_forward_fault_hook({}); }
    } guard;
    EngineOptions o;
    o.n_blocks = 64;
    o.n_threads = 1;
    o.max_batch = 2;  // the third request waits
    Engine e(test_model(), o);
    const std::vector<std::vector<int32_t>> prompts = make_prompts(3, 5);
    for (uint64_t id = 1; id <= 3; id++) {
        EngineRequest r;
        r.id = id;
        r.prompt = prompts[id - 1];
        r.max_tokens = 8;
        r.stop_at_eos = false;
        REQUIRE(e.submit(r).ok());
    }
    int n_forwards = 0;
    set_forward_fault_hook([&](std::span<const uint64_t>) {
        if (++n_forwards == 3) throw std::runtime_error("injected fault");
    });
    std::map<uint64_t, EngineEvent> fin;
    std::map<uint64_t, std::vector<int32_t>> out;
    for (int i = 0; i < 3; i++)
        for (EngineEvent& ev : e.step(0.0)) {
            for (int32_t tok : ev.tokens) out[ev.id].push_back(tok);
            if (ev.finished) fin[ev.id] = ev;
        }
    // The third step threw: both running requests got their ERROR event, the waiting one none.
    REQUIRE(fin.size() == 2);
    for (uint64_t id : {1, 2}) {
        REQUIRE(fin.count(id));
        CHECK(fin[id].finish == FinishReason::ERROR);
        CHECK_THAT(fin[id].error, Catch::Contains("injected fault") && Catch::Contains("step failed"));
    }
    CHECK(e.stats().n_running == 0);
    CHECK(e.stats().n_waiting == 1);
    // Still usable: the waiting request and a new one run to the reference output.
    set_forward_fault_hook({});
    EngineRequest r;
    r.id = 4;
    r.prompt = prompts[0];
    r.max_tokens = 8;
    REQUIRE(e.submit(r).ok());
    while (e.has_work())
        for (EngineEvent& ev : e.step(0.0)) {
            for (int32_t tok : ev.tokens) out[ev.id].push_back(tok);
            if (ev.finished) fin[ev.id] = ev;
        }
    CHECK(fin[3].finish == FinishReason::LENGTH);
    CHECK(finish_reason_ok(fin[4].finish));
    CHECK(out[4] == reference_greedy(prompts[0], 8));
    CHECK(e.stats().kv.n_blocks_in_use == 0);
}

namespace {

// Steps until every request has its first token; the ids in the order their first tokens came.
std::vector<uint64_t> first_token_order(Engine& eng, size_t n) {
    std::vector<uint64_t> order;
    for (int guard = 0; order.size() < n && guard < 1000; guard++)
        for (const EngineEvent& e : eng.step(0.0))
            if (!e.tokens.empty() && std::find(order.begin(), order.end(), e.id) == order.end()) order.push_back(e.id);
    return order;
}

std::vector<int32_t> plain_prompt(int n, int first) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; i++) p.push_back(300 + (first + i * 7) % 200);
    return p;
}

}  // namespace

TEST_CASE("a short prompt queued behind a long prompt's chunks gets its first token first, FCFS keeps arrival order", "[engine]") {
    for (bool srpt : {true, false}) {
        INFO("prefill_srpt " << srpt);
        EngineOptions o;
        o.n_blocks = 64;
        o.max_batch_tokens = 32;  // the long prompt needs 8 chunks
        o.prefix_cache = false;
        o.prefill_srpt = srpt;
        Engine eng(test_model(), o);
        EngineRequest a;
        a.id = 1;
        a.prompt = plain_prompt(250, 1);
        a.max_tokens = 2;
        a.stop_at_eos = false;
        REQUIRE(eng.submit(a));
        eng.step(0.0);  // the long prompt's first chunk
        EngineRequest b;
        b.id = 2;
        b.prompt = plain_prompt(10, 5);
        b.max_tokens = 2;
        b.stop_at_eos = false;
        REQUIRE(eng.submit(b));
        const std::vector<uint64_t> order = first_token_order(eng, 2);
        CHECK(order == (srpt ? std::vector<uint64_t>{2, 1} : std::vector<uint64_t>{1, 2}));
    }
}

TEST_CASE("running decodes get their token in every step while a long prompt is prefilled", "[engine]") {
    EngineOptions o;
    o.n_blocks = 64;
    o.max_batch_tokens = 16;
    o.prefix_cache = false;
    Engine eng(test_model(), o);
    EngineRequest d;
    d.id = 1;
    d.prompt = plain_prompt(4, 3);
    d.max_tokens = 40;
    d.stop_at_eos = false;
    d.arrival_s = 1.0;  // arrived after the long one (say it was re-queued): arrival order alone would starve it
    REQUIRE(eng.submit(d));
    eng.step(0.0);  // its prompt and first token
    EngineRequest p;
    p.id = 2;
    p.prompt = plain_prompt(200, 9);
    p.max_tokens = 1;
    p.stop_at_eos = false;
    p.arrival_s = 0.5;
    REQUIRE(eng.submit(p));
    // Until the long prompt's first token, every step gives the decoding request its next token.
    bool long_done = false;
    for (int k = 0; k < 30 && !long_done; k++) {
        bool decode_token = false;
        for (const EngineEvent& e : eng.step(0.0)) {
            if (e.id == 1 && !e.tokens.empty()) decode_token = true;
            if (e.id == 2 && !e.tokens.empty()) long_done = true;
        }
        CHECK(decode_token);
    }
    CHECK(long_done);
}

TEST_CASE("KV per bucket counts the distinct blocks of its live sequences and pinned sessions, a shared block in each",
          "[engine]") {
    EngineOptions o;
    o.n_blocks = 64;
    o.block_size = 16;
    o.n_threads = 1;
    Engine e(test_model(), o);
    // Bucket a: two requests of 40 and 20 tokens sharing nothing; bucket b: one of 50 tokens whose
    // first 32 are a's first request's (two full blocks the prefix cache shares).
    std::vector<int32_t> a1, a2, b1;
    for (int i = 0; i < 40; i++) a1.push_back(300 + i);
    for (int i = 0; i < 20; i++) a2.push_back(100 + i);
    b1.assign(a1.begin(), a1.begin() + 32);
    for (int i = 0; i < 18; i++) b1.push_back(200 + i);
    auto req = [](uint64_t id, std::vector<int32_t> p, const char* bucket) {
        EngineRequest r;
        r.id = id;
        r.prompt = std::move(p);
        r.max_tokens = 100;
        r.stop_at_eos = false;
        r.bucket = bucket;
        return r;
    };
    REQUIRE(e.submit(req(1, a1, "a")).ok());
    while (e.has_work() && e.stats().n_decode_tokens == 0) e.step(0.0);  // a1's prefill done: its blocks are published
    REQUIRE(e.submit(req(2, a2, "a")).ok());
    REQUIRE(e.submit(req(3, b1, "b")).ok());
    for (int i = 0; i < 6; i++) e.step(0.0);  // every prompt computed, a few tokens each
    std::map<std::string, int64_t> got;
    for (const Engine::BucketKv& b : e.kv_by_bucket()) got[b.bucket] = b.n_blocks;
    // By hand: ceil(tokens / 16) per sequence, its prompt and at most 7 outputs so far (disjoint
    // within a bucket here); b's first two blocks are a1's, counted in b too, so the pool holds
    // a's + b's - 2.
    auto blocks = [](int64_t tokens) { return (tokens + 15) / 16; };
    const EngineStats st = e.stats();
    REQUIRE(got.count("a") == 1);
    REQUIRE(got.count("b") == 1);
    CHECK(got["a"] + got["b"] - 2 == st.kv.n_blocks_in_use);
    CHECK(got["a"] >= blocks(40) + blocks(20));
    CHECK(got["a"] <= blocks(40 + 7) + blocks(20 + 7));
    CHECK(got["b"] >= blocks(50));
    CHECK(got["b"] <= blocks(50 + 7));
    // Cancelled, the requests hold nothing: no bucket is listed.
    for (uint64_t id : {1, 2, 3}) e.cancel(id);
    while (e.has_work()) e.step(0.0);
    CHECK(e.kv_by_bucket().empty());
    // A finished session turn pins its KV: its bucket holds it while the session is idle.
    EngineRequest turn = req(4, a2, "c");
    turn.session = "s";
    turn.max_tokens = 5;
    REQUIRE(e.submit(turn).ok());
    while (e.has_work()) e.step(0.0);
    const std::vector<Engine::BucketKv> pinned = e.kv_by_bucket();
    REQUIRE(pinned.size() == 1);
    CHECK(pinned[0].bucket == "c");
    CHECK(pinned[0].n_blocks == blocks(20 + 4));  // the prompt and the 4 outputs fed back
    e.end_session("s");
    CHECK(e.kv_by_bucket().empty());
}
