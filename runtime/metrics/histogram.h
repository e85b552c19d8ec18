// A log-bucketed histogram: exact count, sum, min and max; quantiles within a stated relative error.
// Plus the helpers that write it (and plain numbers) in the Prometheus text exposition format.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace steward {

// Buckets are log-spaced: bucket i holds [k_lo * r^i, k_lo * r^(i+1)) with r = 2^(1/8), so each
// bucket is r - 1 ≈ 9.05% wide. They cover [1e-6, ~1.008e6) in the recorded unit (record latencies
// in seconds: 1 µs to 11 days). Values below k_lo (zero, negatives) go to an underflow bucket,
// values at or above the top to an overflow bucket; count, sum, min and max stay exact for all.
// NaN is ignored (not counted).
//
// quantile(q) is the nearest-rank quantile: the x that is the ceil(q·n)-th smallest sample. For x
// inside the covered range the estimate e satisfies |e - x| / x <= k_quantile_rel_error
// (2^(1/16) - 1 ≈ 4.4%: the geometric middle of x's bucket), and e is clamped to [min, max], so
// q = 0 gives min and q = 1 gives max exactly. When x falls in the underflow bucket the estimate is
// min, in the overflow bucket max (exact when that bucket holds one distinct value, e.g. all zeros).
//
// Thread-safety: none; callers serialise. Copyable; about 2.6 KiB each.
class Histogram {
public:
    static constexpr int k_subdivisions = 8;  // buckets per power of two
    static constexpr double k_lo = 1e-6;      // lower edge of bucket 0
    static constexpr int n_buckets = 319;     // ceil(8 · log2(1e12)): up to k_lo · 2^(319/8) ≈ 1.008e6
    static double bucket_width();             // r - 1 = 2^(1/8) - 1 ≈ 0.0905 (relative)
    static constexpr double k_quantile_rel_error = 0.044273782427413755;  // 2^(1/16) - 1
    static double bucket_lower(int i);  // k_lo · 2^(i/8); bucket_lower(n_buckets) is the top

    void record(double value, uint64_t n = 1);
    // Adds another histogram's samples: afterwards this equals a histogram that recorded both.
    void merge(const Histogram& other);
    void clear() { *this = Histogram{}; }

    uint64_t count() const { return n_; }
    double sum() const { return sum_; }
    // NaN when empty.
    double min() const { return n_ ? min_ : std::numeric_limits<double>::quiet_NaN(); }
    double max() const { return n_ ? max_ : std::numeric_limits<double>::quiet_NaN(); }
    double mean() const { return n_ ? sum_ / (double)n_ : std::numeric_limits<double>::quiet_NaN(); }
    uint64_t n_underflow() const { return n_under_; }
    uint64_t n_overflow() const { return n_over_; }
    uint64_t bucket_count(int i) const { return buckets_[(size_t)i]; }

    // See the class comment for the error bound. q is clamped to [0, 1]; NaN when empty.
    double quantile(double q) const;

    // Estimated number of samples <= each bound (Prometheus "le" semantics), for bounds in any
    // order. Exact when a bound is >= max or < min; otherwise, for a bound >= k_lo, it lies between
    // the exact counts at bound / 2^(1/8) and bound · 2^(1/8) (the bucket holding the bound counts
    // when the bound is at or above its geometric middle); a bound in [min, k_lo) counts the whole
    // underflow bucket. Non-decreasing in the bound.
    std::vector<uint64_t> cumulative_counts(std::span<const double> bounds) const;

    // The index of the bucket holding v, -1 for underflow, n_buckets for overflow.
    static int bucket_index(double v);

private:
    std::array<uint64_t, n_buckets> buckets_{};
    uint64_t n_under_ = 0;
    uint64_t n_over_ = 0;
    uint64_t n_ = 0;
    double sum_ = 0.0;
    double min_ = std::numeric_limits<double>::infinity();
    double max_ = -std::numeric_limits<double>::infinity();
};

// Nearest-rank index helper shared with the tests' exact quantiles: the 1-based rank
// ceil(q·n) clamped to [1, n], computed so that e.g. q = 0.95, n = 100 gives 95, not 96.
uint64_t quantile_rank(double q, uint64_t n);

// Prometheus text exposition helpers. Pure functions, thread-safe.
// A sample value: shortest round-trip decimal, "+Inf", "-Inf" or "NaN".
std::string prometheus_number(double v);
// A label value with \, " and newline escaped (without the surrounding quotes).
std::string prometheus_label_value(std::string_view v);
// A scrape scoped to one tenant: every line of the exposition `text` except the samples whose
// `tenant` label names another tenant (series without a tenant label, the aggregates, stay).
std::string prometheus_for_tenant(std::string_view text, std::string_view tenant);
// The lines of one histogram series: name_bucket{labels,le="b"} cumulative for each bound
// (ascending), le="+Inf" = count, then name_sum and name_count. `labels` is already formatted
// (`bucket="short_qa"`) or empty. No # HELP / # TYPE lines: one metric family writes those once.
std::string prometheus_histogram(const Histogram& h, std::string_view name, std::string_view labels,
                                 std::span<const double> bounds);

}  // namespace steward
