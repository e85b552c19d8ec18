// DeadlineQueue against a naive reference (a flat list scanned in full) under random adds, owner
// cancels and pops.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <tuple>

#include "util/deadline_queue.h"

using steward::DeadlineQueue;

TEST_CASE("DeadlineQueue fires in time order and forgets a cancelled owner, like a naive list", "[util]") {
    struct Ref {
        uint64_t owner;
        double at;
        uint64_t seq;
        int payload;
    };
    std::mt19937_64 rng(7);
    for (int round = 0; round < 20; round++) {
        DeadlineQueue<int> q;
        std::vector<Ref> ref;
        uint64_t seq = 0;
        double now = 0;
        for (int op = 0; op < 2000; op++) {
            const int kind = (int)(rng() % 10);
            if (kind < 5) {
                const uint64_t owner = rng() % 50;
                const double at = now + (double)(rng() % 100) / 10.0;
                const int payload = (int)(rng() % 1000000);
                q.add(owner, at, payload);
                ref.push_back({owner, at, seq++, payload});
            } else if (kind < 7) {
                const uint64_t owner = rng() % 50;
                const size_t before = ref.size();
                ref.erase(std::remove_if(ref.begin(), ref.end(), [&](const Ref& r) { return r.owner == owner; }), ref.end());
                REQUIRE(q.cancel_owner(owner) == before - ref.size());
            } else {
                now += (double)(rng() % 30) / 10.0;
                std::vector<Ref> due;
                for (const Ref& r : ref)
                    if (r.at <= now) due.push_back(r);
                std::sort(due.begin(), due.end(),
                          [](const Ref& a, const Ref& b) { return std::tie(a.at, a.seq) < std::tie(b.at, b.seq); });
                ref.erase(std::remove_if(ref.begin(), ref.end(), [&](const Ref& r) { return r.at <= now; }), ref.end());
                auto got = q.pop_due(now);
                REQUIRE(got.size() == due.size());
                for (size_t i = 0; i < due.size(); i++) {
                    CHECK(got[i].first == due[i].owner);
                    CHECK(got[i].second == due[i].payload);
                }
            }
            REQUIRE(q.size() == ref.size());
            if (ref.empty()) {
                CHECK(!q.next_s());
                CHECK(q.n_owners() == 0);
            } else {
                double earliest = ref[0].at;
                for (const Ref& r : ref) earliest = std::min(earliest, r.at);
                CHECK(q.next_s().value() == earliest);
            }
        }
    }
}
