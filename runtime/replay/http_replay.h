// The workload replay client over HTTP: plays a workload file (runtime/workload's JSONL) with its
// arrival times and agent turns against any OpenAI-compatible server (steward serve, llama-server),
// streaming /v1/completions, one connection per in-flight request, and prints per bucket TTFT
// p50/p95/p99, TPOT mean, e2e p99, output tok/s and cached prompt tokens. bench_serve and
// `steward bench replay --url` are its front ends.
#pragma once
#include <cstdint>
#include <string>

#include <steward/expected.h>

namespace steward {

// What to replay where, and how.
struct ReplayOptions {
    std::string host = "127.0.0.1";  // a name (localhost) or an address
    uint16_t port = 8080;
    bool progress = false;  // a progress line on stderr as requests finish
    std::string workload, out, name = "server", model = "steward";
    bool greedy = false, ignore_eos = true, session_field = false;
    // --steward-fields: what the workload says, the Steward way: the bucket hint as the model (a
    // bucket name there picks that bucket) and response_format json_object for "json" requests.
    bool steward_fields = false;
    bool sequential = false;  // one request at a time in file order, arrival times ignored
};

// "http://HOST:PORT" (or "HOST:PORT"; the path, if any, is ignored: the client posts to
// /v1/completions) into o.host and o.port. The error names the URL and the expected form.
Expected<bool> parse_replay_url(const std::string& url, ReplayOptions& o);

// Replays o.workload; prints the table; writes o.out (the records, output text included) when set.
// 0: every request served; 1: the workload or the output could not be read or written; 2: some failed.
int http_replay(const ReplayOptions& o);
// Two saved runs (o.out files) side by side per bucket with ratios.
int http_replay_compare(const std::string& a_path, const std::string& b_path);

}  // namespace steward
