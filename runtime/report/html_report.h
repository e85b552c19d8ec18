// The run report as one self-contained HTML page (inline SVG and CSS, no script to run, nothing
// fetched): per-bucket latency bars and CDFs, prefix cache, routing, speculation, structured output,
// KV, the acceptance table, and the JSON it was drawn from.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace steward {

// The page for `steward run`'s JSON report ({"config", "requests", "wall_s", "metrics", "memory"}),
// or for MetricsRegistry::to_json() alone (an object with "buckets" and no "metrics"). Missing or
// null figures render as "-"; a chart with nothing to draw says so in the chart. Every text that
// came from the report (bucket, pool and policy names come from user configs) is escaped, and the
// embedded JSON cannot close its <script> element. Pure; never throws on any JSON value.
std::string html_report(const nlohmann::json& report);

// `s` with & < > " ' as character references: safe as element text and as a quoted attribute.
std::string html_escape(std::string_view s);

// Where the HTML goes for a JSON report path: "out/report.json" -> "out/report.html"; a path not
// ending in ".json" gets ".html" appended.
std::string html_report_path(const std::string& json_path);

}  // namespace steward
