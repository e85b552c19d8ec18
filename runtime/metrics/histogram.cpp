// Log-bucketed histogram and the Prometheus text helpers (see histogram.h for the error bounds).
#include "metrics/histogram.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <optional>

namespace steward {

double Histogram::bucket_width() {
    return std::exp2(1.0 / k_subdivisions) - 1.0;
}

double Histogram::bucket_lower(int i) {
    return k_lo * std::exp2((double)i / k_subdivisions);
}

int Histogram::bucket_index(double v) {
    if (!(v >= k_lo)) return -1;
    if (v >= bucket_lower(n_buckets)) return n_buckets;
    double x = std::log2(v / k_lo) * k_subdivisions;
    int i = std::clamp((int)std::floor(x), 0, n_buckets - 1);
    // log2 may round across an edge; the edges as bucket_lower computes them are the truth.
    if (i > 0 && v < bucket_lower(i))
        --i;
    else if (i + 1 < n_buckets && v >= bucket_lower(i + 1))
        ++i;
    return i;
}

void Histogram::record(double value, uint64_t n) {
    if (std::isnan(value) || n == 0) return;
    int i = bucket_index(value);
    if (i < 0)
        n_under_ += n;
    else if (i >= n_buckets)
        n_over_ += n;
    else
        buckets_[(size_t)i] += n;
    n_ += n;
    sum_ += value * (double)n;
    min_ = std::min(min_, value);
    max_ = std::max(max_, value);
}

void Histogram::merge(const Histogram& other) {
    for (size_t i = 0; i < buckets_.size(); ++i) buckets_[i] += other.buckets_[i];
    n_under_ += other.n_under_;
    n_over_ += other.n_over_;
    n_ += other.n_;
    sum_ += other.sum_;
    min_ = std::min(min_, other.min_);
    max_ = std::max(max_, other.max_);
}

uint64_t quantile_rank(double q, uint64_t n) {
    if (n == 0) return 0;
    q = std::clamp(q, 0.0, 1.0);
    // q·n carries rounding (0.95 · 100 = 95.00000000000001); a relative slack well below 1/n keeps
    // integral products integral.
    double x = q * (double)n;
    double k = std::ceil(x - 1e-9 * std::max(1.0, x));
    return std::clamp<uint64_t>((uint64_t)std::max(0.0, k), 1, n);
}

double Histogram::quantile(double q) const {
    if (n_ == 0) return std::numeric_limits<double>::quiet_NaN();
    uint64_t rank = quantile_rank(q, n_);
    if (rank == 1) return min_;
    if (rank == n_) return max_;
    uint64_t seen = n_under_;
    if (rank <= seen) return min_;
    for (int i = 0; i < n_buckets; ++i) {
        seen += buckets_[(size_t)i];
        if (rank <= seen) {
            double mid = k_lo * std::exp2((i + 0.5) / k_subdivisions);
            return std::clamp(mid, min_, max_);
        }
    }
    return max_;  // in the overflow bucket
}

std::vector<uint64_t> Histogram::cumulative_counts(std::span<const double> bounds) const {
    std::vector<uint64_t> out;
    out.reserve(bounds.size());
    for (double b : bounds) {
        if (n_ == 0 || b < min_) {
            out.push_back(0);
            continue;
        }
        if (b >= max_) {
            out.push_back(n_);
            continue;
        }
        // min <= b < max: the underflow bucket counts whole (its values are below k_lo, and b >= min),
        // the overflow bucket never (its values are >= the top > ... and max > b).
        uint64_t c = n_under_;
        int ib = bucket_index(b);
        int n_full = std::clamp(ib, 0, n_buckets);
        for (int i = 0; i < n_full; ++i) c += buckets_[(size_t)i];
        if (ib >= 0 && ib < n_buckets && b >= k_lo * std::exp2((ib + 0.5) / k_subdivisions)) c += buckets_[(size_t)ib];
        out.push_back(std::min(c, n_));
    }
    return out;
}

std::string prometheus_number(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    assert(r.ec == std::errc{});
    return std::string(buf, r.ptr);
}

namespace {
// The raw (escaped) value of label `name` in one sample line, or nullopt when it has none. Labels
// are read in order (name="value", values escaping '"' and '\'), so a value never passes for a label.
std::optional<std::string_view> raw_label(std::string_view line, std::string_view name) {
    size_t at = line.find('{');
    if (at == std::string_view::npos) return std::nullopt;
    at++;
    while (at < line.size() && line[at] != '}') {
        const size_t eq = line.find('=', at);
        if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return std::nullopt;
        size_t end = eq + 2;
        while (end < line.size() && line[end] != '"') end += line[end] == '\\' ? 2 : 1;
        if (end >= line.size()) return std::nullopt;
        if (line.substr(at, eq - at) == name) return line.substr(eq + 2, end - eq - 2);
        at = end + 1;
        if (at < line.size() && line[at] == ',') at++;
    }
    return std::nullopt;
}
}  // namespace

std::string prometheus_for_tenant(std::string_view text, std::string_view tenant) {
    const std::string own = prometheus_label_value(tenant);
    std::string out;
    out.reserve(text.size());
    while (!text.empty()) {
        const size_t nl = text.find('\n');
        const std::string_view line = text.substr(0, nl == std::string_view::npos ? text.size() : nl + 1);
        text.remove_prefix(line.size());
        const auto t = line.starts_with("#") ? std::nullopt : raw_label(line, "tenant");
        if (!t || *t == own) out += line;
    }
    return out;
}

std::string prometheus_label_value(std::string_view v) {
    std::string s;
    s.reserve(v.size());
    for (char c : v) {
        if (c == '\\')
            s += "\\\\";
        else if (c == '"')
            s += "\\\"";
        else if (c == '\n')
            s += "\\n";
        else
            s += c;
    }
    return s;
}

std::string prometheus_histogram(const Histogram& h, std::string_view name, std::string_view labels,
                                 std::span<const double> bounds) {
    std::vector<double> sorted(bounds.begin(), bounds.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint64_t> cum = h.cumulative_counts(sorted);
    std::string sep = labels.empty() ? "" : ",";
    std::string out;
    for (size_t i = 0; i < sorted.size(); ++i) {
        out += std::string(name) + "_bucket{" + std::string(labels) + sep + "le=\"" + prometheus_number(sorted[i]) +
               "\"} " + std::to_string(cum[i]) + "\n";
    }
    out +=
        std::string(name) + "_bucket{" + std::string(labels) + sep + "le=\"+Inf\"} " + std::to_string(h.count()) + "\n";
    std::string braces = labels.empty() ? "" : "{" + std::string(labels) + "}";
    out += std::string(name) + "_sum" + braces + " " + prometheus_number(h.sum()) + "\n";
    out += std::string(name) + "_count" + braces + " " + std::to_string(h.count()) + "\n";
    return out;
}

}  // namespace steward
