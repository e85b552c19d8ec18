// Tests for runtime/kv/admission (the kv_allocator actor's core): refusals name their limit, a waiting
// request is admitted when a reservation is released, FIFO order holds (per tenant under quotas), and
// random admit / release sequences keep the reserved figures equal to the test's own ledger.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <random>

#include "kv/admission.h"
#include "metrics/bucket_metrics.h"

using namespace steward;

namespace {

Admission make(int32_t n_blocks, int32_t max_queue = 8, double overcommit = 1.0) {
    AdmissionOptions o;
    o.pool = "tiny";
    o.n_blocks_total = n_blocks;
    o.max_queue = max_queue;
    o.overcommit = overcommit;
    return Admission(o);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("A reservation is the request's prompt and max_tokens rounded up to whole blocks", "[admission]") {
    CHECK(Admission::blocks_for(10, 6, 16) == 1);
    CHECK(Admission::blocks_for(10, 7, 16) == 2);
    CHECK(Admission::blocks_for(0, 0, 16) == 0);
}

TEST_CASE("A request larger than its tenant's quota or the pool is refused, naming the limit and the fix", "[admission]") {
    Admission a = make(10);
    a.set_tenant_quota("acme", 4);
    const AdmissionDecision q = a.request(1, "acme", 5);
    CHECK(q.verdict == AdmissionVerdict::REFUSE);
    CHECK(q.limit == AdmissionLimit::TENANT_QUOTA);
    CHECK(contains(q.message, "overloaded"));
    CHECK(contains(q.message, "tenant 'acme' has a KV quota of 4 blocks"));
    CHECK(contains(q.message, "kv_quota"));
    const AdmissionDecision c = a.request(2, "other", 11);
    CHECK(c.verdict == AdmissionVerdict::REFUSE);
    CHECK(c.limit == AdmissionLimit::POOL_CAPACITY);
    CHECK(contains(c.message, "pool 'tiny' can reserve at most 10"));
    CHECK(a.n_blocks_reserved() == 0);
    const auto f = a.figures();
    REQUIRE(f.size() == 2);
    CHECK(f[0].tenant == "acme");
    CHECK(f[0].n_refused_quota == 1);
    CHECK(f[1].n_refused_capacity == 1);
    CHECK(a.check_invariants() == "");
}

TEST_CASE("A request that does not fit now waits, and is admitted when a reservation is released", "[admission]") {
    Admission a = make(10);
    CHECK(a.request(1, "t", 6).verdict == AdmissionVerdict::ADMIT);
    const AdmissionDecision d = a.request(2, "t", 6);
    CHECK(d.verdict == AdmissionVerdict::QUEUE);
    CHECK(d.limit == AdmissionLimit::POOL_CAPACITY);
    CHECK(a.n_blocks_reserved() == 6);
    CHECK(a.is_waiting(2));
    const AdmissionUpdate u = a.release(1);
    CHECK(u.admitted == std::vector<uint64_t>{2});
    CHECK(a.is_admitted(2));
    CHECK(a.n_blocks_reserved() == 6);
    CHECK(a.release(2).admitted.empty());
    CHECK(a.n_blocks_reserved() == 0);
    CHECK(a.release(2).admitted.empty());  // a second release is ignored
    CHECK(a.n_blocks_reserved() == 0);
    const auto f = a.figures();
    REQUIRE(f.size() == 1);
    CHECK(f[0].n_admitted == 2);
    CHECK(f[0].n_queued == 1);
}

TEST_CASE("A small request does not jump a larger one waiting for the pool's capacity", "[admission]") {
    Admission a = make(10);
    CHECK(a.request(1, "a", 8).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.request(2, "b", 6).verdict == AdmissionVerdict::QUEUE);
    CHECK(a.request(3, "c", 2).verdict == AdmissionVerdict::QUEUE);  // would fit, but 2 waits first
    const AdmissionUpdate u = a.release(1);
    CHECK(u.admitted == std::vector<uint64_t>({2, 3}));
    CHECK(a.n_blocks_reserved() == 8);
}

TEST_CASE("A tenant at its quota waits without holding back other tenants", "[admission]") {
    Admission a = make(20);
    a.set_tenant_quota("t1", 8);
    CHECK(a.request(1, "t1", 5).verdict == AdmissionVerdict::ADMIT);
    const AdmissionDecision d = a.request(2, "t1", 5);
    CHECK(d.verdict == AdmissionVerdict::QUEUE);
    CHECK(d.limit == AdmissionLimit::TENANT_QUOTA);
    CHECK(a.request(3, "t1", 1).verdict == AdmissionVerdict::QUEUE);  // fits the quota, but FIFO within t1
    CHECK(a.request(4, "t2", 9).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.release(1).admitted == std::vector<uint64_t>({2, 3}));
    // A lower quota refuses what can now never fit and keeps what is held.
    CHECK(a.request(5, "t1", 4).verdict == AdmissionVerdict::QUEUE);
    const AdmissionUpdate u = a.set_tenant_quota("t1", 3);
    REQUIRE(u.refused.size() == 1);
    CHECK(u.refused[0].first == 5);
    CHECK(u.refused[0].second.limit == AdmissionLimit::TENANT_QUOTA);
    CHECK(a.is_admitted(2));
    CHECK(a.check_invariants() == "");
}

TEST_CASE("A full wait queue refuses, naming max_queue", "[admission]") {
    Admission a = make(10, 1);
    CHECK(a.request(1, "t", 10).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.request(2, "t", 1).verdict == AdmissionVerdict::QUEUE);
    const AdmissionDecision d = a.request(3, "t", 1);
    CHECK(d.verdict == AdmissionVerdict::REFUSE);
    CHECK(d.limit == AdmissionLimit::QUEUE_LENGTH);
    CHECK(contains(d.message, "max_queue 1"));
    CHECK(a.figures()[0].n_refused_queue == 1);
    CHECK(a.check_invariants() == "");
}

TEST_CASE("Overcommit lets reservations exceed the pool, never a single request", "[admission]") {
    Admission a = make(10, 8, 2.0);
    CHECK(a.capacity_blocks() == 20);
    CHECK(a.request(1, "t", 10).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.request(2, "t", 10).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.request(3, "t", 1).verdict == AdmissionVerdict::QUEUE);
    CHECK(a.request(4, "t", 11).limit == AdmissionLimit::POOL_CAPACITY);
}

TEST_CASE("Random admit and release sequences keep reserved equal to the live reservations, FIFO per tenant", "[admission]") {
    for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
        CAPTURE(seed);
        std::mt19937_64 rng(seed);
        const int32_t n_blocks = 16 + (int32_t)(rng() % 32);
        Admission a = make(n_blocks, 6);
        const std::vector<std::string> tenants = {"a", "b", "c"};
        std::map<std::string, int32_t> quota;
        for (const auto& t : tenants)
            if (rng() % 2) {
                quota[t] = 4 + (int32_t)(rng() % 16);
                a.set_tenant_quota(t, quota[t]);
            }
        // The test's own ledger: what was admitted (and with how much), what waits, in arrival order.
        std::map<uint64_t, std::pair<std::string, int32_t>> live;
        std::map<std::string, std::deque<uint64_t>> waiting;  // per tenant, arrival order
        std::map<uint64_t, std::pair<std::string, int32_t>> asked;
        int n_admitted_later = 0;
        auto on_admitted = [&](const std::vector<uint64_t>& ids) {
            for (uint64_t id : ids) {
                const std::string& t = asked.at(id).first;
                REQUIRE(!waiting[t].empty());
                REQUIRE(waiting[t].front() == id);  // FIFO within the tenant
                waiting[t].pop_front();
                live[id] = asked.at(id);
                ++n_admitted_later;
            }
        };
        uint64_t next_id = 1;
        for (int op = 0; op < 2000; ++op) {
            if (rng() % 2 || live.empty()) {
                const uint64_t id = next_id++;
                const std::string& t = tenants[rng() % tenants.size()];
                const int32_t n = 1 + (int32_t)(rng() % 12);
                asked[id] = {t, n};
                const AdmissionDecision d = a.request(id, t, n);
                const bool over_quota = quota.count(t) && n > quota[t];
                if (over_quota || n > n_blocks) {
                    REQUIRE(d.verdict == AdmissionVerdict::REFUSE);
                } else if (d.verdict == AdmissionVerdict::ADMIT) {
                    REQUIRE(waiting[t].empty());  // nobody of its tenant was jumped
                    live[id] = {t, n};
                } else if (d.verdict == AdmissionVerdict::QUEUE) {
                    waiting[t].push_back(id);
                } else {
                    REQUIRE(d.limit == AdmissionLimit::QUEUE_LENGTH);
                }
            } else {
                // End a random live or waiting request.
                uint64_t id = 0;
                if (rng() % 4 == 0) {
                    for (auto& [t, q] : waiting)
                        if (!q.empty()) {
                            id = q.back();
                            q.pop_back();
                            break;
                        }
                }
                if (id == 0) {
                    auto it = live.begin();
                    std::advance(it, (long)(rng() % live.size()));
                    id = it->first;
                    live.erase(it);
                }
                on_admitted(a.release(id).admitted);
            }
            int64_t sum = 0;
            std::map<std::string, int64_t> per;
            for (const auto& [id, r] : live) {
                sum += r.second;
                per[r.first] += r.second;
            }
            REQUIRE(a.n_blocks_reserved() == sum);
            REQUIRE(a.n_blocks_unreserved() >= 0);
            REQUIRE(a.n_reservations() == (int32_t)live.size());
            for (const TenantAdmission& f : a.figures()) {
                REQUIRE(f.n_blocks_reserved == per[f.tenant]);
                if (f.quota_blocks >= 0) REQUIRE(f.n_blocks_reserved <= f.quota_blocks);
                REQUIRE(f.n_waiting == (int32_t)waiting[f.tenant].size());
            }
            REQUIRE(a.check_invariants() == "");
        }
        // Releasing everything admits every waiting request and leaves nothing reserved.
        while (!live.empty()) {
            const uint64_t id = live.begin()->first;
            live.erase(live.begin());
            on_admitted(a.release(id).admitted);
        }
        CHECK(a.n_blocks_reserved() == 0);
        CHECK(a.n_waiting() == 0);
        CHECK(n_admitted_later > 20);
    }
}

TEST_CASE("Admission figures reach the metrics JSON and Prometheus text per pool and tenant", "[admission][metrics]") {
    Admission a = make(10, 1);
    a.set_tenant_quota("acme", 4);
    CHECK(a.request(1, "acme", 4).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.request(2, "acme", 5).verdict == AdmissionVerdict::REFUSE);  // over the quota
    CHECK(a.request(3, "beta", 6).verdict == AdmissionVerdict::ADMIT);
    CHECK(a.request(4, "beta", 3).verdict == AdmissionVerdict::QUEUE);
    CHECK(a.request(5, "beta", 3).verdict == AdmissionVerdict::REFUSE);  // queue full
    MetricsRegistry m;
    m.set_admission("tiny", a.figures());
    const nlohmann::json j = m.to_json();
    const nlohmann::json& acme = j["admission"]["tiny"]["acme"];
    CHECK(acme["admitted"] == 1);
    CHECK(acme["refused_tenant_quota"] == 1);
    CHECK(acme["blocks_reserved"] == 4);
    CHECK(acme["quota_blocks"] == 4);
    const nlohmann::json& beta = j["admission"]["tiny"]["beta"];
    CHECK(beta["queued"] == 1);
    CHECK(beta["waiting"] == 1);
    CHECK(beta["refused_queue_length"] == 1);
    CHECK(beta["quota_blocks"].is_null());
    const std::string text = m.to_prometheus();
    CHECK(contains(text, "steward_kv_admission_refused_requests_total{pool=\"tiny\",tenant=\"acme\",limit=\"tenant_quota\"} 1\n"));
    CHECK(contains(text, "steward_kv_admission_requests_total{pool=\"tiny\",tenant=\"beta\",result=\"queued\"} 1\n"));
    CHECK(contains(text, "steward_kv_admission_reserved_blocks{pool=\"tiny\",tenant=\"beta\"} 6\n"));
    a.release(3);
    m.set_admission("tiny", a.figures());
    CHECK(m.to_json()["admission"]["tiny"]["beta"]["blocks_reserved"] == 3);
}
