// A finished request's decision trace as OpenTelemetry spans (OTLP/JSON, one resourceSpans object),
// and the file ([tracing] otlp_file) that receives one such object per line.
#pragma once
#include <steward/expected.h>

#include <cstdint>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "metrics/bucket_metrics.h"

namespace steward {

// One resourceSpans object (service.name "steward") holding one trace: a root span "request"
// (arrival -> finish) and a child per lifecycle stage, each with the decision trace's figures as
// attributes: route (the routing decision; an instant at arrival: routing is not timed apart from
// the wait), allocate (arrival -> first scheduled: KV admission and the engine's queue), reuse (an
// instant at first scheduled: prompt tokens found in the prefix cache), prefill (first scheduled ->
// first token), decode (first token -> finish), speculate (over decode, when the request drafted)
// and finish (an instant: the reason). Stages the request never reached are left out. `record`'s
// times are on the runtime's clock; `unix_minus_clock_s` maps them to Unix time. trace_id_hi makes
// trace ids unique across processes (the request id is the low half). Pure.
nlohmann::json otlp_resource_spans(const nlohmann::ordered_json& trace, const RequestRecord& record,
                                   double unix_minus_clock_s, uint64_t trace_id_hi);

// Appends one JSON object per line to a file. Thread-safe: each line is written whole under a
// mutex. Errors: open() names the file and the system's reason.
class OtlpFile {
public:
    static Expected<std::unique_ptr<OtlpFile>> open(const std::string& path);
    void write(const nlohmann::json& resource_spans);
    uint64_t trace_id_hi() const { return trace_id_hi_; }

private:
    std::mutex mu_;
    std::ofstream out_;
    uint64_t trace_id_hi_ = 0;
};

}  // namespace steward
