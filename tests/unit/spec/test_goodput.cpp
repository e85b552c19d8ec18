// Tests of the adaptive speculation choice (runtime/spec/goodput.h) on constructed cases.
#include <catch2/catch.hpp>
#include <algorithm>
#include <random>

#include "spec/goodput.h"

using namespace steward;

namespace {

AcceptanceEwma flat(double alpha, int max_k = 8) {
    AcceptanceEwma a(max_k, 0.1, alpha);
    return a;
}

// A memory-bound small batch: a step costs 10 ms whatever its tokens, drafting 1 ms a token.
constexpr StepCost kDecode{10.0, 0.05, 1.0, 0.0};

}  // namespace

TEST_CASE("expected tokens per verification follow the product of acceptances per position", "[spec][goodput]") {
    AcceptanceEwma a(3, 0.1, 0.0);
    a.alpha = {0.8, 0.5, 0.25};
    CHECK(expected_tokens(a, 0) == Approx(1.0));
    CHECK(expected_tokens(a, 1) == Approx(1.8));
    CHECK(expected_tokens(a, 3) == Approx(1.0 + 0.8 + 0.4 + 0.1));
    CHECK(expected_tokens(a, 5) == Approx(2.3));  // past the positions tracked: nothing more
    CHECK(step_ms(kDecode, 2, 4) == Approx(10.0 + 0.05 * 4 * 3 + 2 * 1.0));
}

TEST_CASE("the running acceptance learns per position from accepted prefixes", "[spec][goodput]") {
    AcceptanceEwma a(4, 0.5, 0.5);
    a.observe(4, 2);  // positions 0, 1 accepted, 2 rejected, 3 untested
    CHECK(a.alpha[0] == Approx(0.75));
    CHECK(a.alpha[1] == Approx(0.75));
    CHECK(a.alpha[2] == Approx(0.25));
    CHECK(a.alpha[3] == Approx(0.5));
    CHECK(a.n_seen[3] == 0);
    a.observe(4, 4);  // all accepted
    CHECK(a.alpha[3] == Approx(0.75));
    CHECK(a.n_seen[0] == 2);
}

TEST_CASE("high acceptance makes speculation pay and low acceptance turns it off", "[spec][goodput]") {
    const GoodputChoice high = best_k(flat(0.9), kDecode, 1, 8);
    CHECK(high.k >= 4);
    CHECK(high.gain > 2.0);
    const GoodputChoice low = best_k(flat(0.05), kDecode, 1, 8);
    CHECK(low.k == 0);
    CHECK(low.gain == 1.0);
    // The same high acceptance at a compute-bound batch (every token costs as much as the whole
    // memory-bound step): verifying drafts costs more than they save.
    const StepCost compute_bound{1.0, 0.5, 0.1, 0.1};
    CHECK(best_k(flat(0.6), compute_bound, 64, 8).k == 0);
    CHECK(best_k(flat(0.6), compute_bound, 1, 8).k > 0);
}

TEST_CASE("the adaptive choice switches after patience steps and probes while off", "[spec][goodput]") {
    AdaptiveState s;
    const Hysteresis h{0.05, 3, 10, 2};
    const AcceptanceEwma high = flat(0.9);
    CHECK(choose_k(s, high, kDecode, 1, 6, h) == 0);
    CHECK(choose_k(s, high, kDecode, 1, 6, h) == 0);
    const int32_t k = choose_k(s, high, kDecode, 1, 6, h);
    CHECK(k == best_k(high, kDecode, 1, 6).k);
    CHECK(k > 0);
    // Off again once acceptance collapses, then a probe every probe_every steps.
    const AcceptanceEwma low = flat(0.02);
    for (int i = 0; i < 3; ++i) choose_k(s, low, kDecode, 1, 6, h);
    CHECK(s.k == 0);
    int n_probes = 0;
    for (int i = 0; i < 30; ++i) n_probes += choose_k(s, low, kDecode, 1, 6, h) == 2;
    CHECK(n_probes == 3);
}

TEST_CASE("noisy acceptance around the break-even point does not flap the choice", "[spec][goodput]") {
    // Find the acceptance where k = 1 just pays: goodput(1) = goodput(0).
    // (1 + a) / (10 + 0.05 * 2 + 1) = 1 / (10 + 0.05)  ->  a = 11.1 / 10.05 - 1.
    const double a0 = 11.1 / 10.05 - 1.0;
    std::mt19937_64 rng(42);
    std::normal_distribution<double> noise(0.0, 0.02);
    AdaptiveState s;
    const Hysteresis h{0.05, 4, 0, 0};
    int n_switches = 0, n_raw_changes = 0, last = 0, last_raw = 0;
    for (int step = 0; step < 2000; ++step) {
        AcceptanceEwma a = flat(std::clamp(a0 + noise(rng), 0.0, 1.0), 1);
        const int32_t k = choose_k(s, a, kDecode, 1, 1, h);
        const int32_t raw = best_k(a, kDecode, 1, 1).k;
        n_switches += k != last;
        n_raw_changes += raw != last_raw;
        last = k;
        last_raw = raw;
    }
    // Without hysteresis the best k changes on about every other step.
    CHECK(n_raw_changes > 500);
    CHECK(n_switches <= 2);
}
