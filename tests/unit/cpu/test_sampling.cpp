// Tests for runtime/cpu/sampling: greedy, logprob, seeding, and chi-square fits of the sampled
// frequencies against softmax probabilities computed independently here in long double.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "cpu/sampling.h"

using steward::Sampled;
using steward::Sampler;
using steward::SamplingParams;

namespace {

constexpr float k_inf = std::numeric_limits<float>::infinity();
constexpr float k_nan = std::numeric_limits<float>::quiet_NaN();

// Reference softmax(logits / temperature) in long double, no tricks beyond a plain loop.
std::vector<long double> reference_softmax(const std::vector<float>& logits, long double temperature = 1.0L) {
    std::vector<long double> e(logits.size());
    long double sum = 0.0L;
    for (size_t i = 0; i < logits.size(); ++i) {
        e[i] = std::exp(static_cast<long double>(logits[i]) / temperature);
        sum += e[i];
    }
    for (auto& v : e) v /= sum;
    return e;
}

// Logits drawn from our own generator, so the test does not depend on libstdc++ distributions.
std::vector<float> random_logits(size_t n, uint64_t seed, float scale) {
    std::mt19937_64 rng(seed);
    std::vector<float> l(n);
    for (auto& v : l) v = static_cast<float>((static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5) * 2.0 * scale);
    return l;
}

std::vector<long> count_draws(Sampler& s, const std::vector<float>& logits, int n_draws) {
    std::vector<long> counts(logits.size(), 0);
    long n_out_of_range = 0;  // one assertion per batch, not per draw: Catch assertions are slow
    for (int i = 0; i < n_draws; ++i) {
        const Sampled r = s.sample(logits);
        if (r.token < 0 || static_cast<size_t>(r.token) >= logits.size())
            ++n_out_of_range;
        else
            ++counts[static_cast<size_t>(r.token)];
    }
    REQUIRE(n_out_of_range == 0);
    return counts;
}

// Pearson chi-square statistic over the categories with expected probability > 0.
// `probs` needs not be normalised over all categories: only `support` ids are used and renormalised.
double chi_square(const std::vector<long>& counts, const std::vector<long double>& probs,
                  const std::vector<int>& support, long n_total) {
    long double mass = 0.0L;
    for (int id : support) mass += probs[static_cast<size_t>(id)];
    long double stat = 0.0L;
    for (int id : support) {
        const long double expected = n_total * probs[static_cast<size_t>(id)] / mass;
        const long double d = counts[static_cast<size_t>(id)] - expected;
        stat += d * d / expected;
    }
    return static_cast<double>(stat);
}

// Upper critical values of the chi-square distribution at p = 0.001, by degrees of freedom.
double chi_square_critical_p001(size_t df) {
    static const double table[] = {0.0, 10.828, 13.816, 16.266, 18.467, 20.515};
    REQUIRE(df >= 1);
    REQUIRE(df <= 5);
    return table[df];
}

std::vector<int> all_ids(size_t n) {
    std::vector<int> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int>(i);
    return ids;
}

// softmax: id 0: .1074, 1: .2920, 2: .0652, 3: .0145, 4: .4814, 5: .0395.
// Sorted: 4 (.4814), 1 (cum .7734), 0 (cum .8808) -> the top_p = 0.8 nucleus is {4, 1, 0},
// well clear of the boundary on both sides.
const std::vector<float> k_logits = {1.0f, 2.0f, 0.5f, -1.0f, 2.5f, 0.0f};
constexpr int k_n_draws = 100000;

}  // namespace

TEST_CASE("greedy picks the argmax found by a plain loop, on a 150k vocabulary", "[sampling]") {
    const auto logits = random_logits(150000, 7, 10.0f);
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[best]) best = i;

    Sampler s(SamplingParams{});  // temperature 0: greedy
    const Sampled r = s.sample(logits);
    CHECK(r.token == static_cast<int32_t>(best));
    CHECK(steward::argmax(logits) == static_cast<int32_t>(best));
}

TEST_CASE("argmax equals a plain strict-greater scan with ties, NaN, infinities and signed zeros",
          "[sampling]") {
    // The reference: the first id whose value is above every earlier one (NaN never is), 0 when
    // nothing is above -inf.
    auto plain = [](const std::vector<float>& v) {
        int32_t best = 0;
        float bv = -std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < v.size(); ++i)
            if (v[i] > bv) bv = v[i], best = static_cast<int32_t>(i);
        return best;
    };
    std::mt19937 rng(91);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, inf, -inf, nan, 7.0f, 7.0f};
    for (int trial = 0; trial < 4000; ++trial) {
        const size_t n = 1 + rng() % 70;  // every remainder of 4, vectors shorter and longer than a lane
        std::vector<float> v(n);
        for (float& f : v) f = pool[rng() % std::size(pool)];
        if (trial % 3 == 0)  // mostly ordinary values, the maximum repeated
            for (float& f : v) f = (float)(rng() % 5) - 2.0f;
        INFO("trial " << trial << " n " << n);
        CHECK(steward::argmax(v) == plain(v));
    }
    // All NaN, all -inf, empty: id 0, as the plain scan.
    CHECK(steward::argmax(std::vector<float>(9, nan)) == 0);
    CHECK(steward::argmax(std::vector<float>(9, -inf)) == 0);
    CHECK(steward::argmax(std::vector<float>{}) == 0);
}

TEST_CASE("greedy breaks ties towards the lowest token id", "[sampling]") {
    const std::vector<float> logits = {0.0f, 3.0f, -1.0f, 3.0f, 3.0f};
    Sampler s(SamplingParams{.temperature = 0.0f});
    CHECK(s.sample(logits).token == 1);
    Sampler negative(SamplingParams{.temperature = -1.0f});
    CHECK(negative.sample(logits).token == 1);
}

TEST_CASE("the logprob equals log(exp(l_i) / sum exp) computed in long double", "[sampling]") {
    const auto logits = random_logits(150000, 11, 8.0f);
    long double sum = 0.0L;
    for (float v : logits) sum += std::exp(static_cast<long double>(v));
    auto reference = [&](int32_t t) {
        return static_cast<double>(std::log(std::exp(static_cast<long double>(logits[static_cast<size_t>(t)])) / sum));
    };

    Sampler greedy(SamplingParams{});
    const Sampled g = greedy.sample(logits);
    CHECK(g.logprob == Approx(reference(g.token)).margin(1e-5));

    for (int32_t t : {0, 1, 4242, 149999})
        CHECK(steward::token_logprob(logits, t) == Approx(reference(t)).margin(1e-5));

    // A tempered, truncated draw still reports the logprob under the unmodified softmax.
    Sampler tempered(SamplingParams{.temperature = 0.5f, .top_k = 40, .top_p = 0.9f, .seed = 3});
    for (int i = 0; i < 20; ++i) {
        const Sampled r = tempered.sample(logits);
        CHECK(r.logprob == Approx(reference(r.token)).margin(1e-5));
    }
}

TEST_CASE("the logprob stays finite and exact for logits far from zero", "[sampling]") {
    // exp(1000) overflows float and double; a stable implementation subtracts the max first.
    const std::vector<float> logits = {1000.0f, 999.0f, 998.0f};
    const long double lse = 1000.0L + std::log(1.0L + std::exp(-1.0L) + std::exp(-2.0L));
    CHECK(steward::token_logprob(logits, 0) == Approx(static_cast<double>(1000.0L - lse)).margin(1e-6));
    CHECK(steward::token_logprob(logits, 2) == Approx(static_cast<double>(998.0L - lse)).margin(1e-6));
}

TEST_CASE("the same seed gives the same 1000 draws and another seed gives different ones", "[sampling]") {
    const auto logits = random_logits(1000, 5, 2.0f);
    for (const SamplingParams base :
         {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.8f, .top_k = 50},
          SamplingParams{.temperature = 1.2f, .top_p = 0.9f},
          SamplingParams{.temperature = 1.0f, .top_k = 100, .top_p = 0.7f}}) {
        SamplingParams p = base;
        p.seed = 1234;
        Sampler a(p), b(p);
        p.seed = 1235;
        Sampler c(p);
        std::vector<int32_t> seq_a, seq_b, seq_c;
        for (int i = 0; i < 1000; ++i) {
            seq_a.push_back(a.sample(logits).token);
            seq_b.push_back(b.sample(logits).token);
            seq_c.push_back(c.sample(logits).token);
        }
        CHECK(seq_a == seq_b);
        CHECK(seq_a != seq_c);
    }
}

TEST_CASE("temperature 1 draws fit softmax(logits) by a chi-square test", "[sampling]") {
    Sampler s(SamplingParams{.temperature = 1.0f, .seed = 101});
    const auto counts = count_draws(s, k_logits, k_n_draws);
    const auto support = all_ids(k_logits.size());
    const double stat = chi_square(counts, reference_softmax(k_logits), support, k_n_draws);
    INFO("chi-square = " << stat);
    CHECK(stat < chi_square_critical_p001(support.size() - 1));
}

TEST_CASE("temperature 0.5 draws fit softmax(logits / 0.5) and not softmax(logits)", "[sampling]") {
    Sampler s(SamplingParams{.temperature = 0.5f, .seed = 102});
    const auto counts = count_draws(s, k_logits, k_n_draws);
    const auto support = all_ids(k_logits.size());
    const double stat = chi_square(counts, reference_softmax(k_logits, 0.5L), support, k_n_draws);
    INFO("chi-square = " << stat);
    CHECK(stat < chi_square_critical_p001(support.size() - 1));
    // The test has power: the untempered distribution is rejected by a wide margin.
    CHECK(chi_square(counts, reference_softmax(k_logits), support, k_n_draws) > 1000.0);
}

TEST_CASE("top-k 3 draws only the three largest logits, at renormalised probabilities", "[sampling]") {
    Sampler s(SamplingParams{.temperature = 1.0f, .top_k = 3, .seed = 103});
    const auto counts = count_draws(s, k_logits, k_n_draws);
    const std::vector<int> top3 = {4, 1, 0};  // logits 2.5, 2.0, 1.0
    for (int id : {2, 3, 5}) CHECK(counts[static_cast<size_t>(id)] == 0);
    const double stat = chi_square(counts, reference_softmax(k_logits), top3, k_n_draws);
    INFO("chi-square = " << stat);
    CHECK(stat < chi_square_critical_p001(top3.size() - 1));
}

TEST_CASE("top-p 0.8 draws only the nucleus, at renormalised probabilities", "[sampling]") {
    const auto probs = reference_softmax(k_logits);
    const std::vector<int> nucleus = {4, 1, 0};  // by hand, see k_logits
    // Guard the hand computation: two tokens fall short of 0.8, three reach it.
    REQUIRE(probs[4] + probs[1] < 0.8L);
    REQUIRE(probs[4] + probs[1] + probs[0] >= 0.8L);

    Sampler s(SamplingParams{.temperature = 1.0f, .top_p = 0.8f, .seed = 104});
    const auto counts = count_draws(s, k_logits, k_n_draws);
    for (int id : {2, 3, 5}) CHECK(counts[static_cast<size_t>(id)] == 0);
    const double stat = chi_square(counts, probs, nucleus, k_n_draws);
    INFO("chi-square = " << stat);
    CHECK(stat < chi_square_critical_p001(nucleus.size() - 1));
}

TEST_CASE("top-p is measured on the top-k renormalised distribution", "[sampling]") {
    // Over {4, 1, 0} the renormalised masses are .5466, .3315, .1219: 4 and 1 reach 0.8.
    const auto probs = reference_softmax(k_logits);
    const long double top3 = probs[4] + probs[1] + probs[0];
    REQUIRE(probs[4] / top3 < 0.8L);
    REQUIRE((probs[4] + probs[1]) / top3 >= 0.8L);

    Sampler s(SamplingParams{.temperature = 1.0f, .top_k = 3, .top_p = 0.8f, .seed = 105});
    const auto counts = count_draws(s, k_logits, k_n_draws);
    for (int id : {0, 2, 3, 5}) CHECK(counts[static_cast<size_t>(id)] == 0);
    const double stat = chi_square(counts, probs, {4, 1}, k_n_draws);
    INFO("chi-square = " << stat);
    CHECK(stat < chi_square_critical_p001(1));
}

TEST_CASE("top-p 0 or below keeps exactly the most likely token", "[sampling]") {
    Sampler s(SamplingParams{.temperature = 1.0f, .top_p = 0.0f, .seed = 106});
    for (int i = 0; i < 100; ++i) CHECK(s.sample(k_logits).token == 4);
}

TEST_CASE("top-p on a 150k vocabulary draws only from the nucleus found by a full sort", "[sampling]") {
    const auto logits = random_logits(150000, 13, 12.0f);
    const float top_p = 0.9f;
    const auto probs = reference_softmax(logits);
    std::vector<int> order = all_ids(logits.size());
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    std::set<int32_t> nucleus;
    long double cum = 0.0L;
    for (int id : order) {
        nucleus.insert(id);
        cum += probs[static_cast<size_t>(id)];
        if (cum >= top_p) break;
    }
    INFO("nucleus size " << nucleus.size());
    REQUIRE(nucleus.size() > 1);

    Sampler s(SamplingParams{.temperature = 1.0f, .top_p = top_p, .seed = 107});
    std::set<int32_t> seen;
    for (int i = 0; i < 100; ++i) seen.insert(s.sample(logits).token);
    for (int32_t t : seen) CHECK(nucleus.count(t) == 1);
}

TEST_CASE("NaN and -inf logits are never drawn while a finite alternative exists", "[sampling]") {
    const std::vector<float> logits = {k_nan, -k_inf, 0.5f, k_nan, 1.0f, -k_inf, 0.0f, k_nan};
    const std::set<int32_t> finite = {2, 4, 6};
    for (const SamplingParams p :
         {SamplingParams{.temperature = 0.0f}, SamplingParams{.temperature = 1.0f, .seed = 1},
          SamplingParams{.temperature = 100.0f, .seed = 2}, SamplingParams{.temperature = 1.0f, .top_k = 5, .seed = 3},
          SamplingParams{.temperature = 1.0f, .top_p = 0.99f, .seed = 4},
          SamplingParams{.temperature = 1.0f, .top_k = 7, .top_p = 0.999f, .seed = 5}}) {
        Sampler s(p);
        std::set<int32_t> seen;
        bool all_logprobs_finite = true;
        for (int i = 0; i < 2000; ++i) {
            const Sampled r = s.sample(logits);
            seen.insert(r.token);
            all_logprobs_finite = all_logprobs_finite && std::isfinite(r.logprob);
        }
        for (int32_t t : seen) CHECK(finite.count(t) == 1);
        CHECK(all_logprobs_finite);
    }
    CHECK(steward::argmax(logits) == 4);
    CHECK(std::isinf(steward::token_logprob(logits, 0)));
    CHECK(std::isinf(steward::token_logprob(logits, 1)));
    // The NaN slots weigh nothing: the logprob matches softmax over the finite logits only.
    const long double sum = std::exp(0.5L) + std::exp(1.0L) + std::exp(0.0L);
    CHECK(steward::token_logprob(logits, 4) ==
          Approx(static_cast<double>(std::log(std::exp(1.0L) / sum))).margin(1e-6));
}

TEST_CASE("all -inf or NaN logits give token 0 with logprob -inf without crashing", "[sampling]") {
    const std::vector<std::vector<float>> cases = {
        {-k_inf, -k_inf, -k_inf}, {k_nan, k_nan}, {k_nan, -k_inf, k_nan, -k_inf}};
    for (const auto& logits : cases) {
        for (const SamplingParams p :
             {SamplingParams{.temperature = 0.0f}, SamplingParams{.temperature = 1.0f, .top_k = 2, .top_p = 0.5f}}) {
            Sampler s(p);
            const Sampled r = s.sample(logits);
            CHECK(r.token == 0);
            CHECK(r.logprob == -k_inf);
        }
    }
    Sampler s(SamplingParams{.temperature = 1.0f});
    CHECK(s.sample(std::vector<float>{}).token == -1);
}

TEST_CASE("+inf logits take all the mass, shared evenly", "[sampling]") {
    const std::vector<float> logits = {1.0f, k_inf, k_nan, k_inf, 3.0f};
    Sampler s(SamplingParams{.temperature = 1.0f, .seed = 9});
    std::vector<long> counts(logits.size(), 0);
    std::set<float> logprobs;
    for (int i = 0; i < 10000; ++i) {
        const Sampled r = s.sample(logits);
        ++counts[static_cast<size_t>(r.token)];
        logprobs.insert(r.logprob);
    }
    CHECK(counts[1] + counts[3] == 10000);
    REQUIRE(logprobs.size() == 1);
    CHECK(*logprobs.begin() == Approx(-std::log(2.0)));
    CHECK(counts[1] > 4000);
    CHECK(counts[3] > 4000);
    Sampler greedy(SamplingParams{});
    CHECK(greedy.sample(logits).token == 1);
}
