// Tests for runtime/metrics/histogram: quantiles against exact sorted quantiles on several
// distributions, merge, bucket edges, cumulative counts and the Prometheus lines.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/histogram.h"

using steward::Histogram;
using steward::quantile_rank;
using steward::prometheus_for_tenant;

namespace {

std::vector<double> draw(const std::string& kind, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<double> v(n);
    std::uniform_real_distribution<double> uni(0.001, 1.0);
    std::exponential_distribution<double> expo(20.0);
    std::lognormal_distribution<double> logn(-3.0, 1.5);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (double& x : v) {
        if (kind == "uniform")
            x = uni(rng);
        else if (kind == "exponential")
            x = expo(rng);
        else if (kind == "lognormal")
            x = logn(rng);
        else if (kind == "bimodal")
            x = u01(rng) < 0.9 ? 0.02 + 0.005 * u01(rng) : 2.0 + u01(rng);
        else if (kind == "pareto")
            x = 0.01 / std::pow(1.0 - u01(rng), 1.0 / 1.2);  // heavy tail
        else if (kind == "integers")
            x = (double)(1 + (int)(u01(rng) * 300));  // token counts
        else
            x = 0.125;  // constant
    }
    return v;
}

double exact_quantile(std::vector<double> sorted, double q) {
    return sorted[quantile_rank(q, sorted.size()) - 1];
}

}  // namespace

TEST_CASE("quantile_rank is the nearest rank without floating-point overshoot", "[metrics]") {
    CHECK(quantile_rank(0.95, 100) == 95);
    CHECK(quantile_rank(0.99, 100) == 99);
    CHECK(quantile_rank(0.5, 1) == 1);
    CHECK(quantile_rank(0.0, 10) == 1);
    CHECK(quantile_rank(1.0, 10) == 10);
    CHECK(quantile_rank(0.5, 3) == 2);
    CHECK(quantile_rank(0.29, 100) == 29);
    CHECK(quantile_rank(2.0, 7) == 7);
    CHECK(quantile_rank(0.5, 0) == 0);
}

TEST_CASE("histogram quantiles are within the stated relative error of the exact quantiles", "[metrics]") {
    const double qs[] = {0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0};
    for (std::string kind : {"uniform", "exponential", "lognormal", "bimodal", "pareto", "integers", "constant"}) {
        for (size_t n : {1u, 2u, 7u, 100u, 10000u}) {
            std::vector<double> v = draw(kind, n, 42 + n);
            Histogram h;
            for (double x : v) h.record(x);
            std::sort(v.begin(), v.end());
            INFO(kind << " n=" << n);
            REQUIRE(h.count() == n);
            CHECK(h.min() == v.front());
            CHECK(h.max() == v.back());
            double sum = 0.0;
            for (double x : v) sum += x;
            CHECK(h.sum() == Approx(sum).epsilon(1e-12));
            for (double q : qs) {
                double exact = exact_quantile(v, q);
                double est = h.quantile(q);
                INFO("q=" << q << " exact=" << exact << " est=" << est);
                CHECK(std::abs(est - exact) / exact <= Histogram::k_quantile_rel_error + 1e-12);
            }
            CHECK(h.quantile(0.0) == v.front());
            CHECK(h.quantile(1.0) == v.back());
        }
    }
}

TEST_CASE("the stated resolution is a ninth of an octave", "[metrics]") {
    CHECK(Histogram::bucket_width() == Approx(0.0905077).epsilon(1e-5));
    CHECK(Histogram::k_quantile_rel_error == Approx(std::exp2(1.0 / 16) - 1).epsilon(1e-15));
    CHECK(Histogram::bucket_lower(0) == 1e-6);
    CHECK(Histogram::bucket_lower(Histogram::n_buckets) > 1e6);
    CHECK(Histogram::bucket_lower(Histogram::n_buckets - 1) < 1e6);
}

TEST_CASE("every bucket's lower edge lands in that bucket and just below it in the previous one", "[metrics]") {
    for (int i = 0; i < Histogram::n_buckets; ++i) {
        double lo = Histogram::bucket_lower(i);
        CHECK(Histogram::bucket_index(lo) == i);
        CHECK(Histogram::bucket_index(std::nextafter(lo, 0.0)) == i - 1);
    }
    CHECK(Histogram::bucket_index(0.0) == -1);
    CHECK(Histogram::bucket_index(-3.0) == -1);
    CHECK(Histogram::bucket_index(1e7) == Histogram::n_buckets);
    CHECK(Histogram::bucket_index(INFINITY) == Histogram::n_buckets);
}

TEST_CASE("values outside the range go to under/overflow while min, max, sum stay exact", "[metrics]") {
    Histogram h;
    h.record(0.0, 5);
    h.record(-1.0);
    h.record(3e6);
    h.record(2e7);
    h.record(NAN);  // ignored
    CHECK(h.count() == 8);
    CHECK(h.n_underflow() == 6);
    CHECK(h.n_overflow() == 2);
    CHECK(h.min() == -1.0);
    CHECK(h.max() == 2e7);
    CHECK(h.sum() == Approx(-1.0 + 3e6 + 2e7));
    CHECK(h.quantile(0.5) == -1.0);  // in the underflow bucket: reported as min
    CHECK(h.quantile(0.99) == 2e7);  // the overflow bucket: max

    Histogram zeros;
    zeros.record(0.0, 10);
    zeros.record(0.5);
    CHECK(zeros.quantile(0.5) == 0.0);  // exact: the underflow bucket holds only zeros
    CHECK(zeros.quantile(1.0) == 0.5);
}

TEST_CASE("an empty histogram reports NaN figures and zero counts", "[metrics]") {
    Histogram h;
    CHECK(h.count() == 0);
    CHECK(std::isnan(h.quantile(0.5)));
    CHECK(std::isnan(h.mean()));
    CHECK(std::isnan(h.min()));
    double bounds[] = {0.1, 1.0};
    CHECK(h.cumulative_counts(bounds) == std::vector<uint64_t>{0, 0});
}

TEST_CASE("merging histograms equals recording all their samples in one", "[metrics]") {
    std::vector<double> a = draw("lognormal", 3000, 1), b = draw("pareto", 2000, 2);
    b.push_back(0.0);
    b.push_back(5e6);
    Histogram ha, hb, hall;
    for (double x : a) ha.record(x), hall.record(x);
    for (double x : b) hb.record(x), hall.record(x);
    Histogram merged = ha;
    merged.merge(hb);
    CHECK(merged.count() == hall.count());
    CHECK(merged.min() == hall.min());
    CHECK(merged.max() == hall.max());
    CHECK(merged.sum() == Approx(hall.sum()).epsilon(1e-12));
    CHECK(merged.n_underflow() == hall.n_underflow());
    CHECK(merged.n_overflow() == hall.n_overflow());
    for (int i = 0; i < Histogram::n_buckets; ++i) REQUIRE(merged.bucket_count(i) == hall.bucket_count(i));
    for (double q : {0.1, 0.5, 0.9, 0.99}) CHECK(merged.quantile(q) == hall.quantile(q));

    Histogram empty;
    Histogram m2 = ha;
    m2.merge(empty);
    CHECK(m2.count() == ha.count());
    CHECK(m2.min() == ha.min());
    empty.merge(ha);
    CHECK(empty.quantile(0.5) == ha.quantile(0.5));
}

TEST_CASE("cumulative counts at bounds lie within one bucket of the exact counts", "[metrics]") {
    std::vector<double> v = draw("lognormal", 5000, 7);
    Histogram h;
    for (double x : v) h.record(x);
    std::sort(v.begin(), v.end());
    auto exact_le = [&](double b) { return (uint64_t)(std::upper_bound(v.begin(), v.end(), b) - v.begin()); };
    std::vector<double> bounds = {1e-4, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0, 1000.0};
    std::vector<uint64_t> c = h.cumulative_counts(bounds);
    double r = 1.0 + Histogram::bucket_width();
    for (size_t i = 0; i < bounds.size(); ++i) {
        INFO("le=" << bounds[i]);
        CHECK(c[i] >= exact_le(bounds[i] / r));
        CHECK(c[i] <= exact_le(bounds[i] * r));
        if (i) CHECK(c[i] >= c[i - 1]);
    }
    CHECK(c.back() == v.size());  // above max: exact
    double below[] = {v.front() / 2};
    CHECK(h.cumulative_counts(below)[0] == 0);
}

TEST_CASE("prometheus_histogram writes cumulative buckets, +Inf, sum and count", "[metrics]") {
    Histogram h;
    for (double x : {0.05, 0.2, 0.2, 3.0}) h.record(x);
    double bounds[] = {1.0, 0.1};  // any order: written ascending
    std::string s = steward::prometheus_histogram(h, "x_seconds", "bucket=\"a\"", bounds);
    CHECK(s ==
          "x_seconds_bucket{bucket=\"a\",le=\"0.1\"} 1\n"
          "x_seconds_bucket{bucket=\"a\",le=\"1\"} 3\n"
          "x_seconds_bucket{bucket=\"a\",le=\"+Inf\"} 4\n"
          "x_seconds_sum{bucket=\"a\"} 3.45\n"
          "x_seconds_count{bucket=\"a\"} 4\n");
    std::string bare = steward::prometheus_histogram(h, "y", "", bounds);
    CHECK(bare.find("y_bucket{le=\"0.1\"} 1\n") != std::string::npos);
    CHECK(bare.find("y_count 4\n") != std::string::npos);
    CHECK(steward::prometheus_number(INFINITY) == "+Inf");
    CHECK(steward::prometheus_number(NAN) == "NaN");
    CHECK(steward::prometheus_number(0.001) == "0.001");
    CHECK(steward::prometheus_label_value("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
}

TEST_CASE("a scrape scoped to a tenant keeps the aggregates and its own series, never another tenant's", "[metrics]") {
    // Written by hand: tenant names that look like labels or hold escapes must not confuse the scope.
    const std::string text =
        "# HELP steward_x A family.\n"
        "# TYPE steward_x counter\n"
        "steward_x{bucket=\"b\"} 1\n"
        "steward_x 2\n"
        "steward_t{bucket=\"b\",pool=\"p\",tenant=\"acme\"} 3\n"
        "steward_t{bucket=\"b\",pool=\"p\",tenant=\"globex\"} 4\n"
        "steward_t{tenant=\"acme\",pool=\"p\"} 5\n"
        "steward_t{bucket=\"a,tenant=\",pool=\"p\",tenant=\"globex\"} 6\n"
        "steward_t{bucket=\"tenant=\\\"acme\\\"\",tenant=\"globex\"} 7\n"
        "steward_t{pool=\"p\",tenant=\"ac\\\"me\"} 8\n"
        "steward_t{pool=\"p\",subtenant=\"acme\"} 9\n"
        "steward_t{pool=\"p\",tenant=\"acmeX\"} 10";
    const std::string acme =
        "# HELP steward_x A family.\n"
        "# TYPE steward_x counter\n"
        "steward_x{bucket=\"b\"} 1\n"
        "steward_x 2\n"
        "steward_t{bucket=\"b\",pool=\"p\",tenant=\"acme\"} 3\n"
        "steward_t{tenant=\"acme\",pool=\"p\"} 5\n"
        "steward_t{pool=\"p\",subtenant=\"acme\"} 9\n";
    CHECK(prometheus_for_tenant(text, "acme") == acme);
    CHECK(prometheus_for_tenant(text, "ac\"me") ==
          "# HELP steward_x A family.\n# TYPE steward_x counter\nsteward_x{bucket=\"b\"} 1\nsteward_x 2\n"
          "steward_t{pool=\"p\",tenant=\"ac\\\"me\"} 8\nsteward_t{pool=\"p\",subtenant=\"acme\"} 9\n");
    CHECK(prometheus_for_tenant(text, "globex").find("} 6\n") != std::string::npos);
    CHECK(prometheus_for_tenant(text, "globex").find("} 7\n") != std::string::npos);
    CHECK(prometheus_for_tenant(text, "globex").find("} 3\n") == std::string::npos);
}
