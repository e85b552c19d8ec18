// The prefix-miss diagnosis: shared-prefix lengths against a naive all-pairs reference on random
// prompts, and planted volatile spans found at their position with their tokens (and not found once
// moved after the shared part, nor where prompts simply differ).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "report/prefix_diagnosis.h"

using namespace steward;

namespace {

std::string detok(const std::string&, const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += (s.empty() ? "t" : " t") + std::to_string(id);
    return s;
}

std::vector<int32_t> range(int32_t from, int n) {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; i++) v[i] = from + i;
    return v;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> v;
    for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
}

}  // namespace

TEST_CASE("shared-prefix lengths and their positions match an all-pairs reference on random prompts", "[prefix_diagnosis]") {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> tok(0, 3), len(1, 40), scope(0, 2);
    std::vector<DiagnosisPrompt> ps;
    for (int i = 0; i < 300; i++) {
        DiagnosisPrompt p;
        p.bucket = i % 3 == 0 ? "a" : "b";
        p.scope = "s" + std::to_string(scope(rng));
        const int n = len(rng);
        for (int k = 0; k < n; k++) p.ids.push_back(tok(rng));  // 4 symbols: long shared prefixes
        ps.push_back(p);
    }
    const auto d = diagnose_prefix_misses(ps, detok);
    REQUIRE(d.size() == 2);
    for (const auto& b : d) {
        int64_t sum = 0;
        int n_with = 0, n_first = 0, n_prompts = 0;
        std::vector<int> hist(6, 0);
        for (size_t i = 0; i < ps.size(); i++) {
            if (ps[i].bucket != b.bucket) continue;
            n_prompts++;
            int best = -1;
            for (size_t j = 0; j < i; j++) {
                if (ps[j].scope != ps[i].scope) continue;
                size_t l = 0;
                while (l < ps[i].ids.size() && l < ps[j].ids.size() && ps[i].ids[l] == ps[j].ids[l]) l++;
                best = std::max(best, (int)l);
            }
            if (best < 0) {
                n_first++;
                continue;
            }
            n_with++;
            sum += best;
            if (best == (int)ps[i].ids.size()) hist[5]++;
            else hist[best < 16 ? 0 : best < 64 ? 1 : 2]++;
        }
        INFO("bucket " << b.bucket);
        CHECK(b.n_prompts == n_prompts);
        CHECK(b.n_first == n_first);
        CHECK(b.mean_shared == Approx((double)sum / n_with));
        CHECK(b.position_hist == hist);
    }
}

TEST_CASE("a volatile span after the shared system prompt is found at its position with its tokens, and moving it "
          "after the shared part clears it", "[prefix_diagnosis]") {
    const std::vector<int32_t> sys = range(1000, 20), tenant = range(2000, 30);
    const std::vector<int32_t> tail = range(3000, 20);
    std::vector<DiagnosisPrompt> early, late, plain, tailed;
    for (int k = 0; k < 10; k++) {
        const std::vector<int32_t> vol{5000 + k, 6000 + k};  // an id and a time
        const std::vector<int32_t> question = range(10000 + 100 * k, 10);
        early.push_back({"qa", "t1", cat({sys, vol, tenant, question})});
        late.push_back({"qa", "t1", cat({sys, tenant, question, vol})});
        plain.push_back({"qa", "t1", cat({sys, tenant, question})});
        // Different questions, then a common tail: content that differs, not volatile text.
        tailed.push_back({"qa", "t1", cat({sys, tenant, question, tail})});
    }
    const auto e = diagnose_prefix_misses(early, detok);
    REQUIRE(e.size() == 1);
    CHECK(e[0].n_first == 1);
    CHECK(e[0].n_volatile == 9);
    REQUIRE(e[0].spots.size() == 1);
    const VolatileSpot& s = e[0].spots[0];
    CHECK(s.position == 20);
    CHECK(s.count == 9);
    CHECK(s.tokens_lost == 9 * 30);  // the tenant part agrees again, then the questions differ
    CHECK(s.example == "t5001 t6001");
    REQUIRE(s.top_tokens.size() == 5);  // 18 distinct tokens once each, the first 5 kept
    for (const auto& [text, n] : s.top_tokens) {
        CHECK((text.rfind("t5", 0) == 0 || text.rfind("t6", 0) == 0));
        CHECK(n == 1);
    }
    CHECK(s.advice.find("token ~20") != std::string::npos);
    CHECK(s.advice.find("move it after the shared part") != std::string::npos);
    CHECK(e[0].position_hist[1] == 9);  // 20 is in 16-63

    for (const auto* ps : {&late, &plain, &tailed}) {
        const auto d = diagnose_prefix_misses(*ps, detok);
        REQUIRE(d.size() == 1);
        CHECK(d[0].n_volatile == 0);
        CHECK(d[0].spots.empty());
        CHECK(d[0].mean_shared == Approx(50.0));  // sys + tenant now shared
    }

    // Another scope does not see the first one's prompts; a share below min_share is not reported.
    std::vector<DiagnosisPrompt> mixed = early;
    mixed.push_back({"qa", "t2", early[3].ids});
    for (int k = 0; k < 200; k++) mixed.push_back({"qa", "t1", cat({sys, tenant, range(50000 + 20 * k, 10)})});
    const auto m = diagnose_prefix_misses(mixed, detok);
    CHECK(m[0].n_first == 2);
    // The 9, and the first plain prompt: its best earlier match carried the span at 20 (the span is
    // then the earlier prompt's).
    CHECK(m[0].n_volatile == 10);
    CHECK(m[0].spots.empty());  // 9 of 211 prompts: under 5%
}
