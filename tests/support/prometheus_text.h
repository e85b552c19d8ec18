// A strict checker of the Prometheus text exposition format (0.0.4) and of Prometheus's naming
// conventions, written from the format's specification, independently of the runtime's writer.
// check_prometheus_text() returns every problem it finds (line number and what is wrong) and the
// parsed families and series, so tests can also assert on values.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace steward_test {

struct PrometheusSeries {
    std::string name;                          // the sample's metric name (family + _bucket / _sum / _count)
    std::map<std::string, std::string> labels; // unescaped values
    double value = 0;
};

struct PrometheusExposition {
    std::vector<std::string> errors;
    std::map<std::string, std::string> types;  // family -> counter | gauge | histogram
    std::vector<PrometheusSeries> series;      // in order
    // "name{a=\"x\",b=\"y\"}" (labels sorted, values as written) -> value
    std::map<std::string, double> values;
};

namespace prom_detail {

inline bool is_name_start(char c, bool colon_ok) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
}
inline bool is_name_char(char c, bool colon_ok) { return is_name_start(c, colon_ok) || (c >= '0' && c <= '9'); }
inline bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Go's strconv.ParseFloat forms Prometheus accepts, plus +Inf / -Inf / NaN.
inline bool parse_value(const std::string& s, double& v) {
    if (s == "+Inf" || s == "Inf") { v = INFINITY; return true; }
    if (s == "-Inf") { v = -INFINITY; return true; }
    if (s == "NaN") { v = NAN; return true; }
    if (s.empty()) return false;
    for (char c : s)
        if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return false;
    char* end = nullptr;
    v = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size();
}

}  // namespace prom_detail

// Checks, besides the line grammar: every sample belongs to the family its # TYPE line (which comes
// first, once) declares, and a family's lines are contiguous; names are steward_* without colons
// (reserved for recording rules) and without non-base units (_ms, _perc, _percent, _kib ...), or
// vLLM's vllm:* names as vLLM spells them;
// counters end in _total and are >= 0; gauges do not end in _total; histograms have, per label set,
// _bucket series with strictly increasing le, non-decreasing cumulative counts, le="+Inf" equal to
// _count, and _sum; no series appears twice; label values use only the \\ \" \n escapes.
inline PrometheusExposition check_prometheus_text(const std::string& text, const std::string& prefix = "steward_") {
    using namespace prom_detail;
    PrometheusExposition out;
    auto error = [&](int line_no, const std::string& what) {
        out.errors.push_back("line " + std::to_string(line_no) + ": " + what);
    };
    if (!text.empty() && text.back() != '\n') error(0, "the exposition does not end with a newline");
    std::set<std::string> help_seen, families_done, series_seen;
    std::string current;  // the family whose lines are being read
    struct HistogramSet {
        std::vector<std::pair<double, double>> buckets;  // (le, cumulative count) in order
        bool has_sum = false, has_count = false;
        double count = -1;
        int line_no = 0;
    };
    std::map<std::string, std::map<std::string, HistogramSet>> hist;  // family -> label set -> figures

    auto start_family = [&](int n, const std::string& family) {
        if (family == current) return;
        if (families_done.count(family)) error(n, "family " + family + " is not contiguous");
        if (!current.empty()) families_done.insert(current);
        current = family;
    };
    auto check_family_name = [&](int n, const std::string& family, const std::string& type) {
        // vLLM's own names ([metrics] vllm_names), exported as vLLM writes them so that its
        // dashboards read them: a colon and _perc included. The type rules below still hold.
        const bool vllm = family.rfind("vllm:", 0) == 0;
        if (!vllm && family.find(':') != std::string::npos) error(n, family + ": colons are for recording rules");
        if (!vllm && family.rfind(prefix, 0) != 0) error(n, family + ": does not start with " + prefix);
        for (const char* bad : {"_ms", "_milliseconds", "_microseconds", "_perc", "_percent", "_kib", "_mib", "_gib",
                                "_kb", "_mb", "_gb", "_minutes", "_hours"}) {
            const std::string b = bad;
            if (vllm) break;
            if (ends_with(family, b) || family.find(b + "_") != std::string::npos)
                error(n, family + ": " + b.substr(1) + " is not a base unit");
        }
        if (type == "counter" && !ends_with(family, "_total")) error(n, family + ": a counter's name must end in _total");
        if (type != "counter" && ends_with(family, "_total")) error(n, family + ": only counters end in _total");
    };

    std::istringstream in(text);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        if (line.empty()) { error(n, "empty line"); continue; }
        if (line[0] == '#') {
            std::istringstream c(line);
            std::string hash, kind, name;
            c >> hash >> kind >> name;
            if (hash != "#" || (kind != "HELP" && kind != "TYPE")) { error(n, "a comment other than # HELP / # TYPE"); continue; }
            bool ok_name = !name.empty() && is_name_start(name[0], true);
            for (char ch : name) ok_name = ok_name && is_name_char(ch, true);
            if (!ok_name) { error(n, "bad metric name '" + name + "'"); continue; }
            std::string rest;
            std::getline(c, rest);
            if (rest.size() < 2 || rest[0] != ' ') { error(n, kind + " of " + name + " has no text"); continue; }
            rest = rest.substr(1);
            start_family(n, name);
            if (kind == "HELP") {
                if (!help_seen.insert(name).second) error(n, "second # HELP for " + name);
                for (size_t i = 0; i < rest.size(); ++i)
                    if (rest[i] == '\\' && (i + 1 >= rest.size() || (rest[i + 1] != '\\' && rest[i + 1] != 'n')))
                        error(n, "bad escape in # HELP of " + name);
                    else if (rest[i] == '\\') ++i;
            } else {
                if (rest != "counter" && rest != "gauge" && rest != "histogram") error(n, "unknown type '" + rest + "'");
                if (out.types.count(name)) error(n, "second # TYPE for " + name);
                out.types[name] = rest;
                check_family_name(n, name, rest);
            }
            continue;
        }
        // name{labels} value
        PrometheusSeries s;
        size_t i = 0;
        if (!is_name_start(line[0], true)) { error(n, "a sample line must start with a name"); continue; }
        while (i < line.size() && is_name_char(line[i], true)) ++i;
        s.name = line.substr(0, i);
        std::vector<std::string> label_texts;
        bool ok = true;
        if (i < line.size() && line[i] == '{') {
            ++i;
            while (ok && i < line.size() && line[i] != '}') {
                size_t k = i;
                if (!is_name_start(line[k], false)) { ok = false; break; }
                while (k < line.size() && is_name_char(line[k], false)) ++k;
                std::string lname = line.substr(i, k - i);
                if (lname.rfind("__", 0) == 0) { error(n, "label " + lname + " is reserved"); }
                if (k + 1 >= line.size() || line[k] != '=' || line[k + 1] != '"') { ok = false; break; }
                k += 2;
                std::string value, raw;
                for (; k < line.size() && line[k] != '"'; ++k) {
                    if (line[k] == '\\') {
                        if (k + 1 >= line.size()) { ok = false; break; }
                        char e = line[++k];
                        if (e == '\\') value += '\\';
                        else if (e == '"') value += '"';
                        else if (e == 'n') value += '\n';
                        else { error(n, "bad escape \\" + std::string(1, e) + " in a label value"); ok = false; break; }
                        raw += '\\';
                        raw += e;
                    } else {
                        value += line[k];
                        raw += line[k];
                    }
                }
                if (!ok || k >= line.size()) { ok = false; break; }
                ++k;  // closing quote
                if (s.labels.count(lname)) error(n, "label " + lname + " twice");
                s.labels[lname] = value;
                label_texts.push_back(lname + "=\"" + raw + "\"");
                if (k < line.size() && line[k] == ',') ++k;
                else if (k < line.size() && line[k] != '}') { ok = false; break; }
                i = k;
            }
            if (!ok || i >= line.size()) { error(n, "malformed labels: " + line); continue; }
            ++i;  // '}'
        }
        if (i >= line.size() || line[i] != ' ') { error(n, "no value: " + line); continue; }
        std::string rest = line.substr(i + 1);
        std::istringstream vs(rest);
        std::string value_text, timestamp, extra;
        vs >> value_text >> timestamp >> extra;
        if (!extra.empty() || rest.find("  ") != std::string::npos) { error(n, "trailing text: " + line); continue; }
        if (!timestamp.empty()) error(n, "a timestamp on a computed figure: " + line);
        if (!parse_value(value_text, s.value)) { error(n, "bad value '" + value_text + "'"); continue; }

        // Which family, and does the sample fit its type?
        std::string family = s.name, suffix;
        if (!out.types.count(family))
            for (const char* x : {"_bucket", "_sum", "_count"})
                if (ends_with(s.name, x) && out.types.count(s.name.substr(0, s.name.size() - strlen(x)))) {
                    family = s.name.substr(0, s.name.size() - strlen(x));
                    suffix = x;
                }
        if (!out.types.count(family)) { error(n, s.name + " has no # TYPE before it"); continue; }
        if (family != current) error(n, s.name + " is outside its family's lines");
        const std::string& type = out.types[family];
        std::vector<std::string> sorted = label_texts;
        std::sort(sorted.begin(), sorted.end());
        std::string key = s.name + "{";
        for (size_t j = 0; j < sorted.size(); ++j) key += (j ? "," : "") + sorted[j];
        key += "}";
        if (!series_seen.insert(key).second) error(n, "duplicate series " + key);
        out.values[sorted.empty() ? s.name : key] = s.value;
        if (type == "histogram") {
            if (suffix.empty()) { error(n, s.name + ": a histogram sample is _bucket, _sum or _count"); continue; }
            std::map<std::string, std::string> rest_labels = s.labels;
            rest_labels.erase("le");
            std::string set_key;
            for (const auto& [k2, v2] : rest_labels) set_key += k2 + "=" + v2 + ";";
            HistogramSet& h = hist[family][set_key];
            if (!h.line_no) h.line_no = n;
            if (suffix == "_bucket") {
                double le = 0;
                auto it = s.labels.find("le");
                if (it == s.labels.end() || !parse_value(it->second, le)) { error(n, s.name + " without a valid le"); continue; }
                if (!h.buckets.empty() && !(le > h.buckets.back().first)) error(n, s.name + ": le not increasing");
                if (!h.buckets.empty() && s.value < h.buckets.back().second) error(n, s.name + ": buckets not cumulative");
                if (s.value < 0 || s.value != std::floor(s.value)) error(n, s.name + ": a bucket count is a whole number >= 0");
                if (h.has_count || h.has_sum) error(n, s.name + ": a bucket after _sum / _count");
                h.buckets.emplace_back(le, s.value);
            } else {
                if (s.labels.count("le")) error(n, s.name + " carries le");
                if (suffix == "_sum") h.has_sum = true;
                else { h.has_count = true; h.count = s.value; }
            }
        } else {
            if (!suffix.empty() || s.name != family) error(n, s.name + " in " + type + " family " + family);
            if (s.labels.count("le") || s.labels.count("quantile")) error(n, s.name + ": le / quantile outside a histogram / summary");
            if (type == "counter" && !(s.value >= 0)) error(n, s.name + ": a counter is >= 0");
        }
        out.series.push_back(std::move(s));
    }
    for (const auto& [family, sets] : hist)
        for (const auto& [set_key, h] : sets) {
            const std::string where = family + " {" + set_key + "}";
            if (h.buckets.empty() || !std::isinf(h.buckets.back().first)) error(h.line_no, where + ": no le=\"+Inf\" bucket");
            if (!h.has_sum || !h.has_count) error(h.line_no, where + ": no _sum or no _count");
            if (!h.buckets.empty() && h.has_count && h.buckets.back().second != h.count)
                error(h.line_no, where + ": le=\"+Inf\" differs from _count");
        }
    for (const auto& [family, type] : out.types)
        if (!help_seen.count(family)) error(0, family + " has no # HELP");
    return out;
}

}  // namespace steward_test
