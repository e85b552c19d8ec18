// The run report as one HTML page: a few small SVG chart writers (grouped bars, step CDFs, stacked
// shares) over the JSON report's per-bucket rows, and tables for the rest.
#include "report/html_report.h"
#include "report/prefix_diagnosis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>
#include <vector>

namespace steward {

namespace {

using nlohmann::json;
constexpr double k_nan = std::numeric_limits<double>::quiet_NaN();

// Series colours (bars, curves, pools); cycled when there are more series.
constexpr const char* k_colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr size_t n_colors = sizeof k_colors / sizeof k_colors[0];

const char* color(size_t i) {
    return k_colors[i % n_colors];
}

// The value at `path` inside `j`, or nullptr when any step is missing or not an object.
const json* at(const json& j, std::initializer_list<const char*> path) {
    const json* p = &j;
    for (const char* k : path) {
        if (!p->is_object()) return nullptr;
        auto it = p->find(k);
        if (it == p->end()) return nullptr;
        p = &*it;
    }
    return p;
}

double number(const json* j) {
    return j && j->is_number() ? j->get<double>() : k_nan;
}

double number(const json& j, std::initializer_list<const char*> path) {
    return number(at(j, path));
}

std::string text_of(const json* j) {
    if (!j || j->is_null()) return "-";
    if (j->is_string()) return j->get<std::string>();
    return j->dump(-1, ' ', false, json::error_handler_t::replace);
}

// A figure for a table cell: "-" when missing or not finite.
std::string fmt(double v, const char* f = "%.1f") {
    if (!std::isfinite(v)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string fmt_pct(double fraction) {
    return std::isfinite(fraction) ? fmt(fraction * 100.0, "%.1f") + "%" : "-";
}

std::string fmt_count(double v) {
    return fmt(v, "%.0f");
}

// Coordinates in SVG: two decimals are plenty and keep the file small.
std::string c(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return buf;
}

// A round number >= v for an axis top (1, 2, 2.5, 5 times a power of ten).
double nice_ceil(double v) {
    if (!(v > 0) || !std::isfinite(v)) return 1.0;
    const double p = std::pow(10.0, std::floor(std::log10(v)));
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
        if (m * p >= v * (1 - 1e-12)) return m * p;
    return 10.0 * p;
}

std::string axis_label(double v) {
    if (v == 0) return "0";
    if (std::fabs(v) >= 100 || v == std::floor(v)) return fmt(v, "%.0f");
    return fmt(v, "%.3g");
}

struct Svg {
    int width = 1000, height = 280;
    std::string body;
    void text(double x, double y, const std::string& s, const char* anchor = "middle", const char* cls = "") {
        body += "<text x=\"" + c(x) + "\" y=\"" + c(y) + "\" text-anchor=\"" + anchor + "\"";
        if (*cls) body += std::string(" class=\"") + cls + "\"";
        body += ">" + html_escape(s) + "</text>\n";
    }
    void line(double x1, double y1, double x2, double y2, const char* cls = "axis") {
        body += "<line x1=\"" + c(x1) + "\" y1=\"" + c(y1) + "\" x2=\"" + c(x2) + "\" y2=\"" + c(y2) + "\" class=\"" +
                cls + "\"/>\n";
    }
    void rect(double x, double y, double w, double h, const char* fill, const std::string& tip) {
        body += "<rect x=\"" + c(x) + "\" y=\"" + c(y) + "\" width=\"" + c(std::max(w, 0.0)) + "\" height=\"" +
                c(std::max(h, 0.0)) + "\" fill=\"" + fill + "\"><title>" + html_escape(tip) + "</title></rect>\n";
    }
    void legend(const std::vector<std::string>& names, double x, double y) {
        for (size_t i = 0; i < names.size(); ++i) {
            const double yy = y + 16.0 * (double)i;
            body += "<rect x=\"" + c(x) + "\" y=\"" + c(yy - 9) + "\" width=\"10\" height=\"10\" fill=\"" + color(i) +
                    "\"/>\n";
            text(x + 14, yy, names[i], "start", "legend");
        }
    }
    std::string str(const std::string& title) const {
        return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
               std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
               "\" role=\"img\" aria-label=\"" + html_escape(title) + "\">\n<title>" + html_escape(title) +
               "</title>\n" + body + "</svg>\n";
    }
};

// Plot area of every chart.
constexpr double k_left = 70, k_top = 30, k_right = 200, k_bottom = 60;

// The linear y axis of a chart with values in [0, top]: five grid lines with their labels (percent
// when pct), the axis line and the rotated unit.
void y_axis(Svg& s, double top, bool pct, const std::string& unit) {
    const double pw = s.width - k_left - k_right, ph = s.height - k_top - k_bottom;
    const double x0 = k_left, y0 = k_top + ph;
    for (int t = 0; t <= 4; ++t) {
        const double v = top * t / 4.0, y = y0 - ph * t / 4.0;
        s.line(x0, y, x0 + pw, y, t == 0 ? "axis" : "grid");
        s.text(x0 - 6, y + 4, pct ? axis_label(v * 100) + "%" : axis_label(v), "end");
    }
    s.line(x0, k_top, x0, y0);
    s.body += "<text x=\"16\" y=\"" + c(k_top + ph / 2) + "\" text-anchor=\"middle\" class=\"unit\" transform=\"rotate(-90 16 " +
              c(k_top + ph / 2) + ")\">" + html_escape(unit) + "</text>\n";
}

// Grouped bars: one group per label, one bar per series; NaN bars draw "-" on the axis.
std::string svg_bars(const std::string& title, const std::vector<std::string>& series,
                     const std::vector<std::pair<std::string, std::vector<double>>>& groups, const std::string& unit,
                     double y_max = k_nan, bool pct = false) {
    Svg s;
    const double pw = s.width - k_left - k_right, ph = s.height - k_top - k_bottom;
    const double x0 = k_left, y0 = k_top + ph;
    double vmax = 0;
    for (const auto& [_, vs] : groups)
        for (double v : vs)
            if (std::isfinite(v)) vmax = std::max(vmax, v);
    const double top = std::isfinite(y_max) ? y_max : nice_ceil(vmax);
    y_axis(s, top, pct, unit);
    if (groups.empty()) s.text(x0 + pw / 2, k_top + ph / 2, "no data", "middle", "nodata");
    const double gw = groups.empty() ? pw : pw / (double)groups.size();
    const double bw = std::min(40.0, gw * 0.8 / (double)std::max<size_t>(1, series.size()));
    // Labels that would overlap their neighbours are left out or shortened (about 6.5 px a
    // character): a value wider than its bar stays in the bar's tooltip only, and a group label
    // wider than its group shows its last word ("position 12" -> "12").
    auto fits = [&](const std::string& l, double w) { return (double)l.size() * 6.5 <= w; };
    auto group_label = [&](const std::string& l) {
        if (fits(l, gw * 0.95)) return l;
        const size_t sp = l.rfind(' ');
        return sp == std::string::npos ? l : l.substr(sp + 1);
    };
    for (size_t g = 0; g < groups.size(); ++g) {
        const double gx = x0 + gw * (double)g + (gw - bw * (double)series.size()) / 2;
        const auto& vs = groups[g].second;
        for (size_t k = 0; k < series.size(); ++k) {
            const double v = k < vs.size() ? vs[k] : k_nan;
            const double bx = gx + bw * (double)k;
            const std::string label = pct ? fmt_pct(v) : fmt(v, v >= 100 ? "%.0f" : "%.3g");
            if (!std::isfinite(v)) {
                s.text(bx + bw / 2, y0 - 4, "-", "middle", "value");
                continue;
            }
            const double h = top > 0 ? ph * std::min(v, top) / top : 0;
            s.rect(bx, y0 - h, bw - 1, h, color(k), groups[g].first + " " + series[k] + ": " + label);
            if (fits(label, bw + 4)) s.text(bx + bw / 2, y0 - h - 3, label, "middle", "value");
        }
        s.text(x0 + gw * ((double)g + 0.5), y0 + 18, group_label(groups[g].first), "middle", "group");
    }
    s.legend(series, x0 + pw + 20, k_top + 10);
    return s.str(title);
}

struct Curve {
    std::string name;
    std::vector<std::pair<double, double>> points;  // (x, cumulative fraction), x ascending
    bool steps = true;  // from histogram buckets; false: straight lines through quantiles
};

// CDFs on a log x axis (latencies of different buckets differ by orders of magnitude).
std::string svg_cdf(const std::string& title, const std::vector<Curve>& curves, const std::string& unit) {
    Svg s;
    s.height = 300;
    const double pw = s.width - k_left - k_right, ph = s.height - k_top - k_bottom;
    const double x0 = k_left, y0 = k_top + ph;
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const Curve& cv : curves)
        for (const auto& [x, _] : cv.points)
            if (x > 0 && std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
    const bool any = hi > 0;
    if (!any) lo = 1, hi = 10;
    double llo = std::floor(std::log10(lo)), lhi = std::ceil(std::log10(hi));
    if (lhi <= llo) lhi = llo + 1;
    auto px = [&](double x) { return x0 + pw * (std::log10(std::max(x, lo)) - llo) / (lhi - llo); };
    auto py = [&](double f) { return y0 - ph * std::clamp(f, 0.0, 1.0); };
    for (int t = 0; t <= 4; ++t) {
        s.line(x0, py(t / 4.0), x0 + pw, py(t / 4.0), t == 0 ? "axis" : "grid");
        s.text(x0 - 6, py(t / 4.0) + 4, fmt(t * 25.0, "%.0f") + "%", "end");
    }
    for (double d = llo; d <= lhi + 1e-9; d += 1) {
        const double x = x0 + pw * (d - llo) / (lhi - llo);
        s.line(x, k_top, x, y0, "grid");
        s.text(x, y0 + 16, axis_label(std::pow(10.0, d)));
    }
    s.line(x0, k_top, x0, y0);
    s.text(x0 + pw / 2, y0 + 36, unit + " (log scale)", "middle", "unit");
    if (!any) s.text(x0 + pw / 2, k_top + ph / 2, "no data", "middle", "nodata");
    std::vector<std::string> names;
    for (size_t i = 0; i < curves.size(); ++i) {
        const Curve& cv = curves[i];
        names.push_back(cv.name);
        if (cv.points.empty()) continue;
        std::string pts;
        double prev = 0;
        bool first = true;
        for (const auto& [x, f] : cv.points) {
            if (!std::isfinite(x) || !std::isfinite(f)) continue;
            if (cv.steps) {
                if (first) pts += c(px(x)) + "," + c(py(0)) + " ";
                pts += c(px(x)) + "," + c(py(prev)) + " ";
            }
            pts += c(px(x)) + "," + c(py(f)) + " ";
            prev = f;
            first = false;
        }
        s.body += std::string("<polyline fill=\"none\" stroke-width=\"2\" stroke=\"") + color(i) + "\"" +
                  (cv.steps ? "" : " stroke-dasharray=\"6 3\"") + " points=\"" + pts + "\"><title>" +
                  html_escape(cv.name) + "</title></polyline>\n";
        for (const auto& [x, f] : cv.points)
            if (!cv.steps && std::isfinite(x) && std::isfinite(f))
                s.body += "<circle cx=\"" + c(px(x)) + "\" cy=\"" + c(py(f)) + "\" r=\"3\" fill=\"" + color(i) + "\"/>\n";
    }
    s.legend(names, x0 + pw + 20, k_top + 10);
    return s.str(title);
}

// Lines over a linear x axis (time): y in [0, y_max] (auto from the data when y_max <= 0).
std::string svg_lines(const std::string& title, const std::vector<Curve>& curves, const std::string& x_unit,
                      const std::string& y_unit, double y_max, bool pct) {
    Svg s;
    s.height = 300;
    const double pw = s.width - k_left - k_right, ph = s.height - k_top - k_bottom;
    const double x0 = k_left, y0 = k_top + ph;
    double xhi = 0, yhi = 0;
    for (const Curve& cv : curves)
        for (const auto& [x, y] : cv.points)
            if (std::isfinite(x) && std::isfinite(y)) xhi = std::max(xhi, x), yhi = std::max(yhi, y);
    const bool any = xhi > 0;
    xhi = nice_ceil(std::max(xhi, 1e-9));
    const double ytop = y_max > 0 ? y_max : nice_ceil(std::max(yhi, 1.0));
    auto px = [&](double x) { return x0 + pw * std::clamp(x / xhi, 0.0, 1.0); };
    auto py = [&](double y) { return y0 - ph * std::clamp(y / ytop, 0.0, 1.0); };
    y_axis(s, ytop, pct, y_unit);
    for (int t = 0; t <= 5; ++t) {
        const double v = xhi * t / 5.0;
        s.text(px(v), y0 + 16, axis_label(v));
    }
    s.text(x0 + pw / 2, y0 + 36, x_unit, "middle", "unit");
    if (!any) s.text(x0 + pw / 2, k_top + ph / 2, "no data", "middle", "nodata");
    std::vector<std::string> names;
    for (size_t i = 0; i < curves.size(); ++i) {
        names.push_back(curves[i].name);
        std::string pts;
        for (const auto& [x, y] : curves[i].points)
            if (std::isfinite(x) && std::isfinite(y)) pts += c(px(x)) + "," + c(py(y)) + " ";
        if (pts.empty()) continue;
        s.body += std::string("<polyline fill=\"none\" stroke-width=\"2\" stroke=\"") + color(i) + "\" points=\"" + pts +
                  "\"><title>" + html_escape(curves[i].name) + "</title></polyline>\n";
    }
    s.legend(names, x0 + pw + 20, k_top + 10);
    return s.str(title);
}

// Horizontal stacked shares: one row per label, one segment per key.
std::string svg_shares(const std::string& title, const std::vector<std::string>& keys,
                       const std::vector<std::pair<std::string, std::vector<double>>>& rows) {
    Svg s;
    const double row_h = 26;
    s.height = (int)(k_top + row_h * (double)std::max<size_t>(1, rows.size()) + 50 +
                     std::max(0.0, 16.0 * (double)keys.size() - row_h * (double)rows.size()));
    const double lw = 160, x0 = k_left + lw - 40, pw = s.width - x0 - k_right;
    if (rows.empty()) s.text(x0 + pw / 2, k_top + 16, "no requests", "middle", "nodata");
    for (size_t r = 0; r < rows.size(); ++r) {
        const double y = k_top + row_h * (double)r;
        const auto& vs = rows[r].second;
        double total = 0;
        for (double v : vs)
            if (std::isfinite(v)) total += v;
        s.text(x0 - 8, y + row_h / 2 + 4, rows[r].first, "end", "group");
        double x = x0;
        for (size_t k = 0; k < keys.size() && total > 0; ++k) {
            const double v = k < vs.size() && std::isfinite(vs[k]) ? vs[k] : 0;
            if (v <= 0) continue;
            const double w = pw * v / total;
            s.rect(x, y + 3, w, row_h - 6, color(k),
                   rows[r].first + " -> " + keys[k] + ": " + fmt_count(v) + " (" + fmt_pct(v / total) + ")");
            if (w > 40) s.text(x + w / 2, y + row_h / 2 + 4, fmt_pct(v / total), "middle", "inbar");
            x += w;
        }
        if (total <= 0) s.text(x0 + 4, y + row_h / 2 + 4, "-", "start", "value");
    }
    const double yb = k_top + row_h * (double)std::max<size_t>(1, rows.size()) + 4;
    s.line(x0, yb, x0 + pw, yb);
    for (int t = 0; t <= 4; ++t) s.text(x0 + pw * t / 4.0, yb + 16, fmt(t * 25.0, "%.0f") + "%");
    s.legend(keys, x0 + pw + 20, k_top + 10);
    return s.str(title);
}

// The rows the report draws: each bucket, then "all".
std::vector<std::pair<std::string, const json*>> rows_of(const json& metrics) {
    std::vector<std::pair<std::string, const json*>> rows;
    if (const json* b = at(metrics, {"buckets"}); b && b->is_object())
        for (const auto& [name, row] : b->items())
            if (row.is_object()) rows.emplace_back(name, &row);
    if (const json* a = at(metrics, {"all"}); a && a->is_object()) rows.emplace_back("all", a);
    return rows;
}

// Keys of an object (nothing when it is not one), in order.
std::vector<std::string> keys_of(const json* j) {
    std::vector<std::string> ks;
    if (j && j->is_object())
        for (const auto& [k, _] : j->items()) ks.push_back(k);
    return ks;
}

// A table: header cells, then rows of cells; every cell is escaped here.
std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    std::string t = "<div class=\"scroll\"><table>\n<thead><tr>";
    for (const std::string& h : header) t += "<th>" + html_escape(h) + "</th>";
    t += "</tr></thead>\n<tbody>\n";
    for (const auto& r : rows) {
        t += "<tr>";
        for (size_t i = 0; i < r.size(); ++i) t += (i == 0 ? "<th>" : "<td>") + html_escape(r[i]) + (i == 0 ? "</th>" : "</td>");
        t += "</tr>\n";
    }
    if (rows.empty()) t += "<tr><td colspan=\"" + std::to_string(header.size()) + "\">no buckets</td></tr>\n";
    return t + "</tbody>\n</table></div>\n";
}

// A distribution's CDF: its "cdf" points when present, else the quantiles (p50, p95, p99, max).
Curve curve_of(const std::string& name, const json* dist) {
    Curve cv{name, {}, true};
    const double n = dist ? number(*dist, {"count"}) : k_nan;
    if (const json* cdf = dist ? at(*dist, {"cdf"}) : nullptr; cdf && cdf->is_array() && n > 0) {
        for (const json& p : *cdf)
            if (p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number())
                cv.points.emplace_back(p[0].get<double>(), p[1].get<double>() / n);
        if (!cv.points.empty()) return cv;
    }
    cv.steps = false;
    if (!dist || !(n > 0)) return cv;
    const std::pair<const char*, double> qs[] = {{"p50", 0.5}, {"p95", 0.95}, {"p99", 0.99}, {"max", 1.0}};
    for (const auto& [k, f] : qs) {
        const double x = number(*dist, {k});
        if (std::isfinite(x) && (cv.points.empty() || x >= cv.points.back().first)) cv.points.emplace_back(x, f);
    }
    return cv;
}

std::string section(const std::string& id, const std::string& title, const std::string& content) {
    return "<section id=\"" + id + "\">\n<h2>" + html_escape(title) + "</h2>\n" + content + "</section>\n";
}

std::string caption(const std::string& s) {
    return "<p class=\"caption\">" + html_escape(s) + "</p>\n";
}

constexpr const char* k_style = R"(body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{margin-bottom:4px}h2{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
thead th{background:#f4f4f4}tbody th{text-align:left;font-weight:600}
svg{display:block;margin:8px 0;font-size:12px}svg text{fill:#333}
.axis{stroke:#555;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}
svg text.value{font-size:10px}svg text.inbar{fill:#fff;font-size:11px}svg text.nodata{fill:#999;font-size:16px}
svg text.unit{fill:#666}.scroll{overflow-x:auto}.caption{color:#555;font-size:13px;margin:2px 0 12px}
details pre{background:#f8f8f8;padding:8px;overflow:auto;max-height:400px;font-size:12px}
)";

}  // namespace

std::string html_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char ch : s) {
        switch (ch) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&#39;"; break;
            default: out += ch;
        }
    }
    return out;
}

std::string html_report_path(const std::string& json_path) {
    const std::string ext = ".json";
    if (json_path.size() > ext.size() && json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
        return json_path.substr(0, json_path.size() - ext.size()) + ".html";
    return json_path + ".html";
}

std::string html_report(const json& report) {
    // steward run's report wraps the registry's JSON in "metrics"; the registry's alone has "buckets".
    const json* mp = at(report, {"metrics"});
    const json& metrics = mp && mp->is_object() ? *mp : report;
    const auto rows = rows_of(metrics);

    std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                    "<title>Steward run report</title>\n<style>\n";
    h += k_style;
    h += "</style>\n</head>\n<body>\n<h1>Steward run report</h1>\n";

    // Summary.
    {
        static const json k_none;
        const json* all = at(metrics, {"all"});
        const json& a = all ? *all : k_none;
        std::vector<std::vector<std::string>> s = {
            {"config", text_of(at(report, {"config"}))},
            {"requests (workload)", text_of(at(report, {"requests"}))},
            {"requests finished / ok", fmt_count(number(a, {"requests", "total"})) + " / " +
                                           fmt_count(number(a, {"requests", "ok"}))},
            {"wall time", fmt(number(report, {"wall_s"}), "%.2f") + " s"},
            {"measured window", fmt(number(metrics, {"window_s"}), "%.2f") + " s"},
            {"tokens prompt / cached / output", fmt_count(number(a, {"tokens", "prompt"})) + " / " +
                                                    fmt_count(number(a, {"tokens", "cached_prompt"})) + " / " +
                                                    fmt_count(number(a, {"tokens", "output"}))},
            {"throughput", fmt(number(a, {"throughput_tok_s"})) + " tok/s"},
            {"peak RSS", fmt(number(report, {"memory", "peak_rss_bytes"}) / (1024.0 * 1024.0)) + " MiB"},
            {"config generation / reloads ok / failed",
             fmt_count(number(metrics, {"config", "generation"})) + " / " +
                 fmt_count(number(metrics, {"config", "reloads_ok"})) + " / " +
                 fmt_count(number(metrics, {"config", "reloads_failed"}))},
            {"buckets", std::to_string(rows.empty() ? 0 : rows.size() - (at(metrics, {"all"}) ? 1 : 0))},
        };
        h += section("summary", "Run", table({"", "value"}, s));
    }

    // The acceptance table: every per-bucket figure below in one place.
    {
        std::vector<std::vector<std::string>> t;
        for (const auto& [name, r] : rows) {
            const json& j = *r;
            t.push_back({name,
                         fmt_count(number(j, {"requests", "total"})),
                         fmt_count(number(j, {"requests", "ok"})),
                         fmt(number(j, {"ttft_ms", "p50"})),
                         fmt(number(j, {"ttft_ms", "p95"})),
                         fmt(number(j, {"ttft_ms", "p99"})),
                         fmt(number(j, {"tpot_ms", "p50"}), "%.2f"),
                         fmt(number(j, {"tpot_ms", "p99"}), "%.2f"),
                         fmt(number(j, {"e2e_ms", "p50"})),
                         fmt(number(j, {"e2e_ms", "p99"})),
                         fmt(number(j, {"throughput_tok_s"})),
                         fmt_pct(number(j, {"prefix_cache", "hit_rate"})),
                         fmt_count(number(j, {"prefix_cache", "saved_prefill_tokens"})),
                         fmt(number(j, {"kv", "gib_in_use_peak"}), "%.3f"),
                         fmt_count(number(j, {"kv", "evictions"})),
                         fmt_count(number(j, {"kv", "preemptions"})),
                         fmt_pct(number(j, {"routing", "upgrade_rate"})),
                         fmt_pct(number(j, {"routing", "fallback_rate"})),
                         fmt(number(j, {"speculation", "mean_accepted_length"}), "%.2f"),
                         fmt(number(j, {"speculation", "gain"}), "%.2f"),
                         fmt_count(number(j, {"structured", "requests"})),
                         fmt_pct(number(j, {"structured", "forced_rate"}))});
        }
        h += section("acceptance", "Acceptance table per bucket",
                     table({"bucket", "requests", "ok", "TTFT p50 ms", "TTFT p95 ms", "TTFT p99 ms", "TPOT p50 ms",
                            "TPOT p99 ms", "e2e p50 ms", "e2e p99 ms", "tok/s", "prefix hit", "saved prefill tok",
                            "KV peak GiB", "evictions", "preemptions", "upgrade", "fallback", "spec accepted len",
                            "spec gain", "structured req", "forced"},
                           t) +
                         caption("\"-\": no sample for that figure in this bucket."));
    }

    // Latency: P50/P95/P99 bars, then CDFs.
    {
        std::string content;
        const std::pair<const char*, const char*> dists[] = {
            {"ttft_ms", "TTFT"}, {"tpot_ms", "TPOT"}, {"e2e_ms", "End to end"}};
        for (const auto& [key, label] : dists) {
            std::vector<std::pair<std::string, std::vector<double>>> groups;
            for (const auto& [name, r] : rows)
                groups.push_back({name, {number(*r, {key, "p50"}), number(*r, {key, "p95"}), number(*r, {key, "p99"})}});
            content += "<h3>" + html_escape(std::string(label)) + " P50 / P95 / P99</h3>\n" +
                       svg_bars(std::string(label) + " quantiles per bucket", {"P50", "P95", "P99"}, groups, "ms");
        }
        bool approximate = false;
        for (const auto& [key, label] : {std::pair{"ttft_ms", "TTFT"}, std::pair{"tpot_ms", "TPOT"}}) {
            std::vector<Curve> curves;
            for (const auto& [name, r] : rows) {
                curves.push_back(curve_of(name, at(*r, {key})));
                if (!curves.back().steps && !curves.back().points.empty()) approximate = true;
            }
            content += "<h3>" + html_escape(std::string(label)) + " CDF</h3>\n" +
                       svg_cdf(std::string(label) + " CDF per bucket", curves, "ms");
        }
        content += caption(approximate ? "Dashed curves: the report holds only quantiles for that distribution, so "
                                         "the curve is drawn through P50, P95, P99 and max."
                                       : "CDFs from the latency histograms (log-spaced buckets, each ~9% wide).");
        h += section("latency", "Latency", content);
    }

    // Prefix cache.
    {
        std::vector<std::pair<std::string, std::vector<double>>> groups;
        std::vector<std::vector<std::string>> t;
        for (const auto& [name, r] : rows) {
            groups.push_back({name, {number(*r, {"prefix_cache", "hit_rate"})}});
            t.push_back({name, fmt_count(number(*r, {"prefix_cache", "queries_tokens"})),
                         fmt_count(number(*r, {"prefix_cache", "hits_tokens"})),
                         fmt_pct(number(*r, {"prefix_cache", "hit_rate"})),
                         fmt_count(number(*r, {"prefix_cache", "saved_prefill_tokens"})),
                         fmt(number(*r, {"prefix_cache", "miss_penalty_ms"})),
                         fmt_count(number(*r, {"prefix_cache", "cross_tenant_hits_tokens"})),
                         fmt_count(number(*r, {"prefix_cache", "public_hits_tokens"}))});
        }
        std::vector<std::pair<std::string, std::vector<double>>> saved;
        for (const auto& [name, r] : rows) saved.push_back({name, {number(*r, {"prefix_cache", "saved_prefill_tokens"})}});
        h += section("prefix", "Prefix cache",
                     svg_bars("Prefix hit rate per bucket", {"hit rate"}, groups, "hit rate", 1.0, true) +
                         svg_bars("Saved prefill tokens per bucket", {"saved tokens"}, saved, "tokens") +
                         table({"bucket", "prompt tokens", "cached tokens", "hit rate", "saved prefill tokens",
                                "miss penalty ms", "cross-tenant hit tokens", "public hit tokens"},
                               t));
    }

    // Prefix misses (steward run's diagnosis): where prompts leave the shared prefix, volatile spans.
    if (const json* pd = at(report, {"prefix_diagnosis"}); pd && pd->is_array() && !pd->empty()) {
        const std::vector<std::string>& ranges = prefix_position_ranges();
        std::vector<std::pair<std::string, std::vector<double>>> shares;
        std::vector<std::vector<std::string>> t;
        std::string advice;
        for (const json& b : *pd) {
            if (!b.is_object()) continue;
            const std::string name = text_of(at(b, {"bucket"}));
            const json* hist = at(b, {"departure_positions"});
            std::vector<double> vs;
            for (const std::string& r : ranges) vs.push_back(hist ? number(*hist, {r.c_str()}) : k_nan);
            shares.push_back({name, vs});
            t.push_back({name, fmt_count(number(b, {"prompts"})), fmt_count(number(b, {"first_in_scope"})),
                         fmt(number(b, {"mean_shared_tokens"}), "%.0f"), fmt_count(number(b, {"volatile_prompts"})),
                         fmt_count(number(b, {"volatile_tokens_lost"}))});
            if (const json* spots = at(b, {"spots"}); spots && spots->is_array())
                for (const json& v : *spots) advice += "<li>" + html_escape(text_of(at(v, {"advice"}))) + "</li>\n";
        }
        h += section("prefix-misses", "Prefix misses",
                     caption("Where each prompt leaves the longest prefix an earlier prompt of its pool and tenant "
                             "shares (token positions), and the volatile spans: short text after which the prompts "
                             "agree again (an id, a timestamp), which costs the cached tokens that follow it.") +
                         svg_shares("Where prompts leave the shared prefix (token positions)", ranges, shares) +
                         table({"bucket", "prompts", "first in scope", "mean shared tokens", "volatile departures",
                                "tokens lost to them"},
                               t) +
                         (advice.empty() ? std::string("<p>No volatile span in enough prompts to report.</p>\n")
                                         : "<ul class=\"advice\">\n" + advice + "</ul>\n"));
    }

    // Routing.
    {
        std::vector<std::string> pools;
        for (const auto& [name, r] : rows)
            for (const std::string& p : keys_of(at(*r, {"routing", "requests_by_pool"})))
                if (std::find(pools.begin(), pools.end(), p) == pools.end()) pools.push_back(p);
        std::vector<std::pair<std::string, std::vector<double>>> shares;
        std::vector<std::vector<std::string>> t;
        for (const auto& [name, r] : rows) {
            std::vector<double> vs;
            const json* by_pool = at(*r, {"routing", "requests_by_pool"});
            for (const std::string& p : pools) vs.push_back(by_pool ? number(*by_pool, {p.c_str()}) : k_nan);
            shares.push_back({name, vs});
            t.push_back({name, fmt_count(number(*r, {"routing", "upgraded"})),
                         fmt_pct(number(*r, {"routing", "upgrade_rate"})),
                         fmt_count(number(*r, {"routing", "fallback"})),
                         fmt_pct(number(*r, {"routing", "fallback_rate"})),
                         fmt(number(*r, {"routing", "quality"}), "%.3f")});
        }
        h += section("routing", "Routing",
                     svg_shares("Requests by pool per bucket", pools, shares) +
                         table({"bucket", "upgraded", "upgrade rate", "fallback", "fallback rate", "route quality"}, t));
    }

    // Speculation.
    {
        int n_pos = 0;
        std::vector<std::string> spec_rows;
        for (const auto& [name, r] : rows) {
            const json* a = at(*r, {"speculation", "acceptance_per_position"});
            if (a && a->is_array() && !a->empty()) {
                n_pos = std::max(n_pos, (int)a->size());
                spec_rows.push_back(name);
            }
        }
        std::vector<std::pair<std::string, std::vector<double>>> groups;
        for (int i = 0; i < n_pos; ++i) {
            std::vector<double> vs;
            for (const auto& [name, r] : rows) {
                if (std::find(spec_rows.begin(), spec_rows.end(), name) == spec_rows.end()) continue;
                const json* a = at(*r, {"speculation", "acceptance_per_position"});
                vs.push_back((size_t)i < a->size() ? number(&(*a)[(size_t)i]) : k_nan);
            }
            groups.push_back({"position " + std::to_string(i + 1), vs});
        }
        // Accepted length per draft: a token at position i+1 is accepted only after the one at i was,
        // so accepted_tokens_per_position[i] counts the drafts that got at least i+1 tokens accepted.
        std::vector<std::pair<std::string, std::vector<double>>> lengths;
        for (int len = 0; len <= n_pos; ++len) {
            std::vector<double> vs;
            for (const auto& [name, r] : rows) {
                if (std::find(spec_rows.begin(), spec_rows.end(), name) == spec_rows.end()) continue;
                const json* acc = at(*r, {"speculation", "accepted_tokens_per_position"});
                const double drafts = number(*r, {"speculation", "drafts"});
                auto at_least = [&](int j) {  // drafts with >= j tokens accepted
                    if (j == 0) return drafts;
                    return acc && acc->is_array() && (size_t)j <= acc->size() ? number(&(*acc)[(size_t)j - 1]) : 0.0;
                };
                vs.push_back(drafts > 0 ? std::max(0.0, at_least(len) - at_least(len + 1)) / drafts : k_nan);
            }
            lengths.push_back({std::to_string(len), vs});
        }
        std::vector<std::vector<std::string>> t;
        std::vector<std::pair<std::string, std::vector<double>>> gains;
        for (const auto& [name, r] : rows) {
            t.push_back({name, fmt_count(number(*r, {"speculation", "drafts"})),
                         fmt_count(number(*r, {"speculation", "draft_tokens"})),
                         fmt_count(number(*r, {"speculation", "accepted_tokens"})),
                         fmt_pct(number(*r, {"speculation", "acceptance_rate"})),
                         fmt(number(*r, {"speculation", "mean_accepted_length"}), "%.2f"),
                         fmt(number(*r, {"speculation", "tpot_spec_ms", "p50"}), "%.2f"),
                         fmt(number(*r, {"speculation", "gain_tpot_without_ms"}), "%.2f"),
                         fmt(number(*r, {"speculation", "gain"}), "%.2f"),
                         text_of(at(*r, {"speculation", "gain_source"}))});
            gains.push_back({name, {number(*r, {"speculation", "gain"})}});
        }
        h += section("speculation", "Speculative decoding",
                     svg_bars("Draft acceptance per position", spec_rows, groups, "accepted", 1.0, true) +
                         (spec_rows.empty() ? caption("No bucket speculated in this run.") : "") +
                         svg_bars("Accepted tokens per draft (share of drafts)", spec_rows, lengths, "drafts", 1.0,
                                  true) +
                         caption("Accepted tokens per draft, from the accepted tokens per position (a position's "
                                 "token is accepted only after the previous one's)."
                                 ) +
                         svg_bars("Speculation gain per bucket (TPOT without / with)", {"gain"}, gains, "x") +
                         table({"bucket", "drafts", "draft tokens", "accepted tokens", "acceptance", "mean accepted length",
                                "TPOT spec p50 ms", "TPOT without ms", "gain", "gain source"},
                               t));
    }

    // Structured output and KV.
    {
        std::vector<std::vector<std::string>> t;
        for (const auto& [name, r] : rows)
            t.push_back({name, fmt_count(number(*r, {"structured", "requests"})),
                         fmt_count(number(*r, {"structured", "masked_tokens"})),
                         fmt_count(number(*r, {"structured", "forced_tokens"})),
                         fmt_pct(number(*r, {"structured", "forced_rate"})),
                         fmt(number(*r, {"structured", "mask_us_per_token_mean"}), "%.2f"),
                         fmt(number(*r, {"structured", "mask_us_per_token_p99_of_requests"}), "%.2f")});
        h += section("structured", "Structured output",
                     table({"bucket", "constrained requests", "masked tokens", "forced tokens", "forced rate",
                            "mask us/token mean", "mask us/token p99"},
                           t) +
                         caption("Grammar cache: " + fmt_count(number(metrics, {"grammar_cache", "compiles"})) +
                                 " compiles, " + fmt_count(number(metrics, {"grammar_cache", "hits"})) + " hits."));
    }
    {
        std::vector<std::vector<std::string>> t;
        std::vector<std::pair<std::string, std::vector<double>>> pages;
        for (const auto& [name, r] : rows) {
            t.push_back({name, fmt(number(*r, {"kv", "gib_formula"}), "%.3f"),
                         fmt(number(*r, {"kv", "gib_in_use_peak"}), "%.3f"),
                         fmt(number(*r, {"kv", "gib_in_use_mean"}), "%.3f"),
                         fmt(number(*r, {"kv", "page_usage_peak_pct"})),
                         fmt(number(*r, {"kv", "page_usage_mean_pct"})),
                         fmt(number(*r, {"kv", "fragmentation_pct"})),
                         fmt_count(number(*r, {"kv", "evictions"})),
                         fmt_count(number(*r, {"kv", "preemptions"})),
                         fmt_count(number(*r, {"kv", "recomputed_tokens"}))});
            pages.push_back({name, {number(*r, {"kv", "page_usage_mean_pct"}) / 100.0,
                                    number(*r, {"kv", "page_usage_peak_pct"}) / 100.0}});
        }
        // Over time, from the metrics' kv_series: each pool's share of its blocks in use, and the
        // evictions counted so far.
        std::vector<Curve> usage, evictions(1);
        evictions[0].name = "evictions (all pools)";
        if (const json* ks = at(metrics, {"kv_series"}); ks && ks->is_array())
            for (const json& p : *ks) {
                if (!p.is_object()) continue;
                const std::string pool = text_of(at(p, {"pool"}));
                const double t = number(p, {"t_s"}), total = number(p, {"blocks_total"});
                auto it = std::find_if(usage.begin(), usage.end(), [&](const Curve& cv) { return cv.name == pool; });
                if (it == usage.end()) {
                    usage.push_back({pool, {}});
                    it = usage.end() - 1;
                }
                if (total > 0) it->points.push_back({t, number(p, {"blocks_used"}) / total});
                evictions[0].points.push_back({t, number(p, {"evictions"})});
            }
        h += section("kv", "KV cache",
                     svg_lines("KV blocks in use over time, per pool", usage, "seconds from the first sample", "in use",
                               1.0, true) +
                         svg_lines("Evictions over time", evictions, "seconds from the first sample", "evictions", 0, false) +
                         svg_bars("KV page usage per bucket", {"mean", "peak"}, pages, "pages in use", 1.0, true) +
                         table({"bucket", "GiB (formula)", "GiB peak", "GiB mean", "pages peak %", "pages mean %",
                                "fragmentation %", "evictions", "preemptions", "recomputed tokens"},
                               t));
    }
    // KV tiers (pools with [pool.kv_tiers]): per pool and tier what it holds and did, then per bucket
    // the prompt tokens each tier gave back and the promotions' time.
    if (const json* kt = at(metrics, {"kv_tiers"}); kt && kt->is_object() && !kt->empty()) {
        std::vector<std::vector<std::string>> pools, buckets;
        for (const auto& [pool, pj] : kt->items())
            for (const char* tier : {"host", "disk"})
                pools.push_back({pool, tier, fmt_count(number(pj, {tier, "blocks"})), fmt(number(pj, {tier, "gib"}), "%.4f"),
                                 fmt_count(number(pj, {tier, "demotions"})), fmt_count(number(pj, {tier, "evictions"})),
                                 fmt_count(number(pj, {tier, "lookups"})), fmt_count(number(pj, {tier, "hits"})),
                                 std::string(tier) == "disk" ? fmt_count(number(pj, {"disk_reads"})) : "-",
                                 std::string(tier) == "disk" ? fmt_count(number(pj, {"disk_writes"})) : "-",
                                 std::string(tier) == "disk" ? fmt_count(number(pj, {"dropped_files"})) : "-"});
        std::vector<std::pair<std::string, std::vector<double>>> bars;
        for (const auto& [name, r] : rows) {
            const double pool = number(*r, {"prefix_cache", "tier_hits_tokens", "pool"}),
                         host = number(*r, {"prefix_cache", "tier_hits_tokens", "host"}),
                         disk = number(*r, {"prefix_cache", "tier_hits_tokens", "disk"});
            buckets.push_back({name, fmt_count(pool), fmt_count(host), fmt_count(disk),
                               fmt_count(number(*r, {"prefix_cache", "promotions"})),
                               fmt(number(*r, {"prefix_cache", "promotion_ms_p50"}), "%.3f"),
                               fmt(number(*r, {"prefix_cache", "promotion_ms_p99"}), "%.3f")});
            bars.push_back({name, {pool, host, disk}});
        }
        h += section("kv_tiers", "KV tiers",
                     table({"pool", "tier", "blocks", "GiB", "demoted", "evicted", "lookups", "hits", "disk reads",
                            "disk writes", "dropped files"},
                           pools) +
                         svg_bars("Cached prompt tokens per tier, per bucket", {"pool", "host", "disk"}, bars, "tokens") +
                         table({"bucket", "pool tokens", "host tokens", "disk tokens", "promotions", "promotion ms p50",
                                "promotion ms p99"},
                               buckets));
    }

    // Reuse beyond the prefix (documents, tool results): per bucket, when any request reused one.
    {
        std::vector<std::vector<std::string>> t;
        bool any = false;
        for (const auto& [name, r] : rows) {
            const double dh = number(*r, {"reuse", "documents", "hits"}), th = number(*r, {"reuse", "tools", "hits"}),
                         d403 = number(*r, {"reuse", "documents", "refused_permission"}),
                         dexp = number(*r, {"reuse", "documents", "expired"}),
                         stale = number(*r, {"reuse", "tools", "stale_refused"});
            any = any || dh > 0 || th > 0 || d403 > 0 || dexp > 0 || stale > 0;
            t.push_back({name, fmt_count(dh), fmt_count(number(*r, {"reuse", "documents", "saved_prefill_tokens"})),
                         fmt_count(d403), fmt_count(dexp), fmt_count(th),
                         fmt_count(number(*r, {"reuse", "tools", "round_trips_saved"})),
                         fmt_count(number(*r, {"reuse", "tools", "resolved_tokens_saved"})),
                         fmt(number(*r, {"reuse", "tools", "age_at_use_p50_s"}), "%.1f"), fmt_count(stale)});
        }
        if (any)
            h += section("reuse", "Reuse: documents and tool results",
                         table({"bucket", "document hits", "document tokens saved", "refused (403)", "expired",
                                "tool hits", "round trips saved", "continuation tokens cached", "age p50 s", "stale refused"},
                               t));
    }

    // The JSON behind the page. '<' (and so "</script>" and "<!--") only occurs inside JSON strings,
    // where \u003c means the same character.
    std::string js = report.dump(-1, ' ', false, json::error_handler_t::replace), safe;
    safe.reserve(js.size());
    for (char ch : js) {
        if (ch == '<') safe += "\\u003c";
        else if (ch == '>') safe += "\\u003e";
        else if (ch == '&') safe += "\\u0026";
        else safe += ch;
    }
    h += section("json", "Report JSON",
                 "<details><summary>the JSON this page was drawn from</summary><pre>" +
                     html_escape(report.dump(2, ' ', false, json::error_handler_t::replace)) + "</pre></details>\n" +
                     "<script type=\"application/json\" id=\"report-json\">" + safe + "</script>\n");
    h += "</body>\n</html>\n";
    return h;
}

}  // namespace steward
