// Tests for runtime/report/html_report: the page is well formed enough to open (every SVG draws
// something), figures missing from the report show as "-" (never NaN), text from configs is
// escaped, and the embedded JSON reads back as the report.
#include <catch2/catch.hpp>
#include <cctype>
#include <regex>
#include <string>
#include <vector>

#include "metrics/bucket_metrics.h"
#include "report/html_report.h"

using namespace steward;
using nlohmann::json;

namespace {

RequestRecord rec(std::string bucket, std::string pool, double arrival, std::optional<double> first, double finish,
                  std::vector<double> itl, int64_t n_prompt, int64_t n_cached, int64_t n_out, FinishReason f) {
    RequestRecord r;
    r.bucket = std::move(bucket);
    r.tenant = "t";
    r.pool = std::move(pool);
    r.t_arrival_s = arrival;
    r.t_scheduled_s = arrival;
    r.t_first_token_s = first;
    r.t_finish_s = finish;
    r.itl_s = std::move(itl);
    r.n_prompt_tokens = n_prompt;
    r.n_cached_prompt_tokens = n_cached;
    r.n_output_tokens = n_out;
    r.finish = f;
    return r;
}

// A run report as `steward run` writes it, over a registry with two buckets that have data and one
// ("idle") whose only request was refused: it has no latency, no tokens, no rates.
json run_report(const std::string& third_bucket = "idle") {
    MetricsRegistry m;
    m.record(rec("short_qa", "small", 0.0, 0.1, 0.5, {0.1, 0.1, 0.2}, 100, 64, 4, FinishReason::STOP));
    m.record(rec("short_qa", "large", 1.0, 1.3, 1.5, {0.1, 0.1}, 120, 0, 3, FinishReason::LENGTH));
    m.record(rec("long_doc", "large", 0.5, 1.5, 2.5, {0.5, 0.5}, 700, 512, 3, FinishReason::STOP));
    m.record(rec(third_bucket, "small", 3.0, std::nullopt, 3.0, {}, 0, 0, 0, FinishReason::OVERLOADED));
    return {{"config", "configs/test.toml"}, {"requests", 4}, {"wall_s", 3.0}, {"metrics", m.to_json()},
            {"memory", {{"peak_rss_bytes", 1 << 20}}}};
}

std::vector<std::string> svgs_of(const std::string& page) {
    std::vector<std::string> out;
    for (size_t p = page.find("<svg"); p != std::string::npos; p = page.find("<svg", p + 1)) {
        const size_t e = page.find("</svg>", p);
        REQUIRE(e != std::string::npos);
        out.push_back(page.substr(p, e - p));
    }
    return out;
}

bool draws_something(const std::string& svg) {
    for (const char* shape : {"<rect", "<line", "<polyline", "<circle", "<path", "<polygon"})
        if (svg.find(shape) != std::string::npos) return true;
    return false;
}

// Every word of the page, lower-cased: "nan" or "inf" would be a figure printed without its guard.
bool prints_non_finite(const std::string& page) {
    std::string word;
    for (size_t i = 0; i <= page.size(); ++i) {
        const char ch = i < page.size() ? page[i] : ' ';
        if (std::isalnum((unsigned char)ch)) {
            word += (char)std::tolower((unsigned char)ch);
            continue;
        }
        if (word == "nan" || word == "inf" || word == "infinity") return true;
        word.clear();
    }
    return false;
}

size_t count(const std::string& s, const std::string& needle) {
    size_t n = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
}

json embedded_json(const std::string& page) {
    const std::string open = "<script type=\"application/json\" id=\"report-json\">";
    const size_t b = page.find(open);
    REQUIRE(b != std::string::npos);
    const size_t e = page.find("</script>", b);
    REQUIRE(e != std::string::npos);
    return json::parse(page.substr(b + open.size(), e - b - open.size()));
}

}  // namespace

TEST_CASE("the report page has every section and every SVG in it draws something", "[report]") {
    const std::string page = html_report(run_report());
    CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
    CHECK(page.find("</html>") != std::string::npos);
    for (const char* id : {"summary", "acceptance", "latency", "prefix", "routing", "speculation", "structured", "kv",
                           "json"})
        CHECK(page.find(std::string("<section id=\"") + id + "\">") != std::string::npos);
    const auto svgs = svgs_of(page);
    CHECK(svgs.size() >= 10);  // 3 quantile bars, 2 CDFs, hit rate, saved tokens, routes, 2 speculation, KV
    CHECK(count(page, "</svg>") == svgs.size());
    for (const std::string& s : svgs) CHECK(draws_something(s));
    // The CDFs come from the histograms' "cdf" points: step curves, not the dashed quantile fallback.
    CHECK(page.find("CDFs from the latency histograms") != std::string::npos);
    CHECK(count(page, "<polyline") >= 4);
    // Nothing external: no fetched script, stylesheet, image or font.
    CHECK(page.find("src=") == std::string::npos);
    CHECK(page.find("<link") == std::string::npos);
    CHECK(page.find("@import") == std::string::npos);
    CHECK(embedded_json(page) == run_report());
}

TEST_CASE("a bucket with no data renders dashes, never NaN", "[report]") {
    const std::string page = html_report(run_report());
    CHECK_FALSE(prints_non_finite(page));
    // The acceptance table's row for "idle": its one request (refused) counted, everything else "-".
    const size_t row = page.find("<tr><th>idle</th>");
    REQUIRE(row != std::string::npos);
    const std::string tr = page.substr(row, page.find("</tr>", row) - row);
    CHECK(tr.find("<td>1</td><td>0</td><td>-</td><td>-</td><td>-</td>") != std::string::npos);
    // A report whose rows hold nothing at all (and one whose figures are null) still draws every chart.
    json empty = {{"buckets", {{"nothing", json::object()}}},
                  {"all", {{"ttft_ms", {{"count", 0}, {"p50", nullptr}, {"cdf", json::array()}}}}}};
    const std::string p2 = html_report(empty);
    CHECK_FALSE(prints_non_finite(p2));
    CHECK(p2.find("no data") != std::string::npos);
    for (const std::string& s : svgs_of(p2)) CHECK(draws_something(s));
}

TEST_CASE("a report with only quantiles draws dashed CDFs through them and says so", "[report]") {
    json r = run_report();
    for (auto& [_, row] : r["metrics"]["buckets"].items())
        for (const char* k : {"ttft_ms", "tpot_ms"}) row[k].erase("cdf");
    const std::string page = html_report(r);
    CHECK(page.find("stroke-dasharray") != std::string::npos);
    CHECK(page.find("drawn through P50, P95, P99 and max") != std::string::npos);
}

TEST_CASE("speculation figures draw acceptance per position and the accepted-length histogram", "[report]") {
    // 10 drafts of 3 tokens: 8 got position 1 accepted, 5 position 2, 2 position 3, so 2 drafts accepted
    // 0 tokens, 3 one, 3 two and 2 three.
    json r = run_report();
    json& spec = r["metrics"]["buckets"]["short_qa"]["speculation"];
    spec["drafts"] = 10;
    spec["acceptance_per_position"] = {0.8, 0.5, 0.2};
    spec["draft_tokens_per_position"] = {10, 10, 10};
    spec["accepted_tokens_per_position"] = {8, 5, 2};
    spec["gain"] = 1.4;
    const std::string page = html_report(r);
    CHECK(page.find("No bucket speculated") == std::string::npos);
    for (const char* bar : {"position 1 short_qa: 80.0%", "position 3 short_qa: 20.0%", "0 short_qa: 20.0%",
                            "1 short_qa: 30.0%", "2 short_qa: 30.0%", "3 short_qa: 20.0%", "short_qa gain: 1.4"})
        CHECK(page.find(std::string("<title>") + bar + "</title>") != std::string::npos);
    CHECK_FALSE(prints_non_finite(page));
}

TEST_CASE("bucket names from configs are escaped in text, attributes and the embedded JSON", "[report]") {
    const std::string evil = "<script>alert(\"x\")</script>'&<!--";
    const json report = run_report(evil);
    const std::string page = html_report(report);
    CHECK(page.find("<script>") == std::string::npos);
    CHECK(page.find("alert(\"x\")") == std::string::npos);
    CHECK(page.find("<!--") == std::string::npos);
    CHECK(page.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#39;&amp;&lt;!--") != std::string::npos);
    // The one script element is the JSON, and the name cannot close it early.
    CHECK(count(page, "<script") == 1);
    CHECK(count(page, "</script>") == 1);
    CHECK(embedded_json(page) == report);
    CHECK(html_escape("a<b>&\"'") == "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST_CASE("any JSON value gives a page, and invalid UTF-8 in names does not throw", "[report]") {
    for (const json& j : {json(), json::array({1, 2}), json(3.5), json("x"), json{{"buckets", 7}}}) {
        const std::string page = html_report(j);
        CHECK(page.find("</html>") != std::string::npos);
        for (const std::string& s : svgs_of(page)) CHECK(draws_something(s));
    }
    json bad = {{"buckets", {{std::string("b\xff\xfe"), json::object()}}}};
    CHECK_NOTHROW(html_report(bad));
}

TEST_CASE("the HTML report sits next to the JSON report", "[report]") {
    CHECK(html_report_path("out/report.json") == "out/report.html");
    CHECK(html_report_path("/tmp/r.json") == "/tmp/r.html");
    CHECK(html_report_path("report") == "report.html");
    CHECK(html_report_path("a.json.bak") == "a.json.bak.html");
}

TEST_CASE("the acceptance chart's labels never overlap, even with 16 positions and several buckets", "[report]") {
    json r = run_report();
    std::vector<double> acc, drafted, accepted;
    for (int i = 0; i < 16; i++) acc.push_back(1.0 - i / 20.0), drafted.push_back(100), accepted.push_back(100 - 5 * i);
    for (auto& [name, row] : r["metrics"]["buckets"].items()) {
        row["speculation"]["drafts"] = 100;
        row["speculation"]["acceptance_per_position"] = acc;
        row["speculation"]["draft_tokens_per_position"] = drafted;
        row["speculation"]["accepted_tokens_per_position"] = accepted;
    }
    REQUIRE(r["metrics"]["buckets"].size() >= 2);
    const std::string page = html_report(r);
    const size_t at = page.find("Draft acceptance per position");
    REQUIRE(at != std::string::npos);
    const std::string svg = page.substr(page.rfind("<svg", at), page.find("</svg>", at) - page.rfind("<svg", at));
    // Every centred label as a box: its estimated width (6.5 px a character, as the chart assumes
    // is generous for 11 px text), 11 px tall above its baseline. No two boxes may intersect.
    struct Box {
        double x0, x1, y0, y1;
        std::string text;
    };
    std::vector<Box> boxes;
    const std::regex text_re("<text x=\"([-0-9.]+)\" y=\"([-0-9.]+)\" text-anchor=\"middle\"[^>]*>([^<]*)</text>");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text_re); it != std::sregex_iterator(); ++it) {
        const double x = std::stod((*it)[1]), y = std::stod((*it)[2]);
        const std::string t = (*it)[3];
        const double w = (double)t.size() * 6.0;  // a little under the chart's own estimate
        boxes.push_back({x - w / 2, x + w / 2, y - 11, y, t});
    }
    REQUIRE(boxes.size() >= 16);  // the group labels at least
    for (size_t i = 0; i < boxes.size(); i++)
        for (size_t j = i + 1; j < boxes.size(); j++) {
            const Box &a = boxes[i], &b = boxes[j];
            const bool overlap = a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
            INFO("'" << a.text << "' and '" << b.text << "'");
            CHECK_FALSE(overlap);
        }
    // The values are still there, in the bars' tooltips.
    CHECK(page.find("position 16 ") != std::string::npos);
}
