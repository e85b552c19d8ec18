// Pearson's chi-square goodness-of-fit test for the statistical tests of samplers: the statistic,
// its degrees of freedom and the p-value (upper regularized incomplete gamma, Numerical Recipes).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace steward_test {

// Q(a, x) = Gamma(a, x) / Gamma(a): series for x < a + 1, Lentz's continued fraction otherwise.
inline double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    const double gln = std::lgamma(a);
    if (x < a + 1.0) {
        double ap = a, sum = 1.0 / a, del = sum;
        for (int n = 0; n < 10000 && std::fabs(del) > std::fabs(sum) * 1e-15; ++n) sum += (del *= x / ++ap);
        return 1.0 - sum * std::exp(-x + a * std::log(x) - gln);
    }
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 10000; ++i) {
        const double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (std::fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        const double del = d * c;
        h *= del;
        if (std::fabs(del - 1.0) < 1e-15) break;
    }
    return std::exp(-x + a * std::log(x) - gln) * h;
}

struct ChiSquare {
    double statistic = 0.0;
    int df = 0;             // cells with expected probability > 0, minus 1
    double p_value = 1.0;   // 0 when a cell of probability 0 was observed
};

// observed counts against expected probabilities (summing to 1) over the same cells.
inline ChiSquare chi_square(const std::vector<int64_t>& observed, const std::vector<double>& expected) {
    int64_t n = 0;
    for (int64_t o : observed) n += o;
    ChiSquare r;
    int cells = 0;
    for (size_t i = 0; i < observed.size(); ++i) {
        if (expected[i] <= 0.0) {
            if (observed[i] > 0) return {INFINITY, 0, 0.0};
            continue;
        }
        const double e = expected[i] * (double)n, d = (double)observed[i] - e;
        r.statistic += d * d / e;
        cells++;
    }
    r.df = cells - 1;
    r.p_value = r.df > 0 ? gamma_q(r.df / 2.0, r.statistic / 2.0) : 1.0;
    return r;
}

}  // namespace steward_test
