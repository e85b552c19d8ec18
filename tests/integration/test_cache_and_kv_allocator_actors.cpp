// Tests for actors/cache_actor and actors/kv_allocator_actor, driven message by message with a
// scoped_actor (no sleeps: a reply, or a message sent before it by the same actor, is the sync point).
#include <catch2/catch.hpp>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/actors.hpp"
#include "kv/prefix_index.h"
#include "memory_model.h"
#include "model/synth.h"

using namespace steward;

namespace {

struct TestSystem {
    caf::actor_system_config cfg;
    std::unique_ptr<caf::actor_system> sys;
    TestSystem() {
        add_message_types(cfg);
        sys = std::make_unique<caf::actor_system>(cfg);
    }
};

CachedTokens ask(caf::scoped_actor& self, const CacheActor& cache, const CacheQuery& q) {
    CachedTokens out;
    self->request(cache, caf::infinite, cache_atom::value, q)
        .receive([&](const CachedTokens& c) { out = c; }, [&](caf::error& e) { FAIL(self->system().render(e)); });
    return out;
}

AdmitAnswer admit(caf::scoped_actor& self, const KvAllocatorActor& alloc, uint64_t id, const std::string& tenant, int32_t n) {
    AdmitAnswer out;
    self->request(alloc, caf::infinite, admit_atom::value, AdmitRequest{id, tenant, n})
        .receive([&](const AdmitAnswer& a) { out = a; }, [&](caf::error& e) { FAIL(self->system().render(e)); });
    return out;
}

// The next (admit_atom, AdmitAnswer) notice; the timeout only guards against a hang on failure.
AdmitAnswer next_notice(caf::scoped_actor& self) {
    AdmitAnswer out;
    self->receive([&](admit_atom, const AdmitAnswer& a) { out = a; },
                  caf::after(std::chrono::seconds(30)) >> [&] { FAIL("no admission notice arrived"); });
    return out;
}

AllocatorStats alloc_stats(caf::scoped_actor& self, const KvAllocatorActor& alloc) {
    AllocatorStats out;
    self->request(alloc, caf::infinite, stats_atom::value).receive([&](const AllocatorStats& s) { out = s; },
                                                                   [&](caf::error& e) { FAIL(self->system().render(e)); });
    return out;
}

const Model& tiny_model() { return steward_test::tiny_kv_model(); }

}  // namespace

TEST_CASE("A KV event batch survives CAF serialization with its kinds in order", "[actors][cache]") {
    TestSystem ts;
    KvEventBatch in{9, {{KvEventKind::STORED, 1}, {KvEventKind::REMOVED, 1}, {KvEventKind::STORED, 2}}};
    std::vector<char> buf;
    caf::binary_serializer sink{*ts.sys, buf};
    REQUIRE(!sink(in));
    KvEventBatch out;
    caf::binary_deserializer source{*ts.sys, buf};
    REQUIRE(!source(out));
    CHECK(out.pool_id == 9);
    CHECK(out.events == in.events);
}

TEST_CASE("The cache actor answers what an engine's KV events say each pool holds, and forgets a dropped pool", "[actors][cache]") {
    TestSystem ts;
    caf::scoped_actor self{*ts.sys};
    auto cache = spawn_cache(*ts.sys);
    EngineOptions opt;
    opt.n_blocks = 32;
    opt.block_size = 4;
    opt.kv_events = true;
    Engine e(tiny_model(), opt);
    const std::vector<int32_t> prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};  // 3 full blocks
    EngineRequest r;
    r.id = 1;
    r.tenant = 1;
    r.prompt = prompt;
    r.max_tokens = 2;
    r.stop_at_eos = false;
    REQUIRE(e.submit(r).ok());
    while (e.has_work()) {
        e.step(0);
        // As the executor does: one batch per step that had events.
        if (auto ev = e.take_kv_events(); !ev.empty()) self->send(cache, kv_events_atom::value, KvEventBatch{100, ev});
    }
    // Pool 100 served it; pool 200 has never seen it. Another tenant's salt finds nothing.
    std::vector<int32_t> next = prompt;
    next.push_back(99);
    const auto hashes = lookup_block_hashes(next, 4, 1, 0, {});
    const auto other = lookup_block_hashes(next, 4, 2, 0, {});
    CacheQuery q{7, {{100, 4, hashes}, {200, 4, hashes}, {100, 4, other}}};
    const CachedTokens c = ask(self, cache, q);
    REQUIRE(c.n_tokens.size() == 3);
    CHECK(c.n_tokens[0] == 12);
    CHECK(c.n_tokens[1] == 0);
    CHECK(c.n_tokens[2] == 0);
    // The engine agrees: the next request of tenant 1 finds 12 cached prompt tokens.
    r.id = 2;
    r.prompt = next;
    REQUIRE(e.submit(r).ok());
    int n_cached = -1;
    while (e.has_work())
        for (const EngineEvent& ev : e.step(0))
            if (ev.finished) n_cached = ev.n_cached_prompt_tokens;
    CHECK(n_cached == 12);
    self->send(cache, kv_drop_atom::value, uint64_t{100});
    CHECK(ask(self, cache, q).n_tokens[0] == 0);
    self->send_exit(cache, caf::exit_reason::user_shutdown);
}

TEST_CASE("The kv allocator admits, queues until a release, refuses naming the limit, and reports figures", "[actors][admission]") {
    TestSystem ts;
    caf::scoped_actor self{*ts.sys};
    std::vector<TenantAdmission> last;  // written on the allocator's thread, read after a reply
    std::mutex mu;
    AdmissionOptions o;
    o.pool = "tiny";
    o.n_blocks_total = 10;
    o.max_queue = 1;
    auto alloc = spawn_kv_allocator(*ts.sys, o, [&](const std::string& pool, std::vector<TenantAdmission> f) {
        CHECK(pool == "tiny");
        std::lock_guard<std::mutex> lk(mu);
        last = std::move(f);
    });
    self->send(alloc, quota_atom::value, std::string("acme"), int32_t{4});
    AdmitAnswer a = admit(self, alloc, 1, "beta", 7);
    CHECK(a.verdict == (int32_t)AdmissionVerdict::ADMIT);
    a = admit(self, alloc, 2, "acme", 5);
    CHECK(a.verdict == (int32_t)AdmissionVerdict::REFUSE);
    CHECK(a.limit == (int32_t)AdmissionLimit::TENANT_QUOTA);
    CHECK(a.message.find("quota of 4 blocks") != std::string::npos);
    a = admit(self, alloc, 3, "acme", 4);
    CHECK(a.verdict == (int32_t)AdmissionVerdict::QUEUE);
    CHECK(a.limit == (int32_t)AdmissionLimit::POOL_CAPACITY);
    a = admit(self, alloc, 4, "beta", 1);
    CHECK(a.verdict == (int32_t)AdmissionVerdict::REFUSE);
    CHECK(a.limit == (int32_t)AdmissionLimit::QUEUE_LENGTH);
    AllocatorStats s = alloc_stats(self, alloc);
    CHECK(s.n_blocks_reserved == 7);
    CHECK(s.n_waiting == 1);
    // Request 1 finishes: request 3 is told it is admitted.
    self->send(alloc, release_atom::value, uint64_t{1});
    const AdmitAnswer n = next_notice(self);
    CHECK(n.id == 3);
    CHECK(n.verdict == (int32_t)AdmissionVerdict::ADMIT);
    s = alloc_stats(self, alloc);
    CHECK(s.n_blocks_reserved == 4);
    CHECK(s.n_waiting == 0);
    {
        std::lock_guard<std::mutex> lk(mu);
        REQUIRE(last.size() == 2);
        CHECK(last[0].tenant == "acme");
        CHECK(last[0].n_refused_quota == 1);
        CHECK(last[0].n_admitted == 1);
        CHECK(last[0].n_blocks_reserved == 4);
        CHECK(last[1].n_refused_queue == 1);
    }
    // A queued request whose quota drops below it is told it is refused.
    CHECK(admit(self, alloc, 5, "beta", 7).verdict == (int32_t)AdmissionVerdict::QUEUE);
    self->send(alloc, quota_atom::value, std::string("beta"), int32_t{6});
    const AdmitAnswer r = next_notice(self);
    CHECK(r.id == 5);
    CHECK(r.verdict == (int32_t)AdmissionVerdict::REFUSE);
    CHECK(r.limit == (int32_t)AdmissionLimit::TENANT_QUOTA);
    self->send(alloc, release_atom::value, uint64_t{3});
    CHECK(alloc_stats(self, alloc).n_blocks_reserved == 0);
    self->send_exit(alloc, caf::exit_reason::user_shutdown);
}
