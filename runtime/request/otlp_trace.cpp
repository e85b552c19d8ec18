// OTLP/JSON spans of a finished request's decision trace (otlp_trace.h): the stages' times come
// from the request's record, their attributes from the trace the request path filled.
#include "request/otlp_trace.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>

namespace steward {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: distinct inputs give distinct, non-sequential ids
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

std::string hex64(uint64_t v) {
    static const char* d = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[(size_t)i] = d[v & 15];
    return s;
}

// OTLP/JSON encodes 64-bit integers (times, intValue) as decimal strings.
std::string unix_nanos(double t_clock_s, double unix_minus_clock_s) {
    return std::to_string((int64_t)std::llround((t_clock_s + unix_minus_clock_s) * 1e9));
}

// An attribute from a JSON value (strings, booleans, integers, doubles; others as their JSON text).
nlohmann::json attribute(const std::string& key, const nlohmann::ordered_json& v) {
    nlohmann::json value;
    if (v.is_string())
        value = {{"stringValue", v.get<std::string>()}};
    else if (v.is_boolean())
        value = {{"boolValue", v.get<bool>()}};
    else if (v.is_number_integer())
        value = {{"intValue", std::to_string(v.get<int64_t>())}};
    else if (v.is_number_float())
        value = {{"doubleValue", v.get<double>()}};
    else
        value = {{"stringValue", v.dump()}};
    return {{"key", key}, {"value", std::move(value)}};
}

// Every scalar field of `obj` (nested objects and arrays as JSON text) as attributes, prefixed.
void add_fields(nlohmann::json& attrs, const std::string& prefix, const nlohmann::ordered_json& obj) {
    if (!obj.is_object()) return;
    for (const auto& [k, v] : obj.items())
        if (!v.is_null()) attrs.push_back(attribute(prefix + k, v));
}

}  // namespace

nlohmann::json otlp_resource_spans(const nlohmann::ordered_json& trace, const RequestRecord& r,
                                   double unix_minus_clock_s, uint64_t trace_id_hi) {
    using nlohmann::json;
    const uint64_t id = trace.value("id", (uint64_t)0);
    const std::string trace_id = hex64(trace_id_hi) + hex64(id);
    json spans = json::array();
    int n_spans = 0;
    const std::string root_id = hex64(mix(trace_id_hi ^ mix(id)));
    auto span = [&](const std::string& name, double t0, double t1, json attrs, bool error = false) {
        json s = {{"traceId", trace_id},
                  {"spanId", n_spans == 0 ? root_id : hex64(mix(trace_id_hi ^ mix(id) ^ (uint64_t)n_spans))},
                  {"name", name},
                  {"kind", 1},  // SPAN_KIND_INTERNAL
                  {"startTimeUnixNano", unix_nanos(t0, unix_minus_clock_s)},
                  {"endTimeUnixNano", unix_nanos(std::max(t0, t1), unix_minus_clock_s)},
                  {"attributes", std::move(attrs)},
                  {"status", {{"code", error ? 2 : 1}}}};  // STATUS_CODE_ERROR / STATUS_CODE_OK
        if (n_spans > 0) s["parentSpanId"] = root_id;
        ++n_spans;
        spans.push_back(std::move(s));
    };
    const bool ok = finish_reason_ok(r.finish);
    json root = json::array({attribute("steward.request.id", (int64_t)id), attribute("steward.tenant", r.tenant),
                             attribute("steward.bucket", r.bucket), attribute("steward.pool", r.pool)});
    add_fields(root, "steward.request.", trace.value("request", nlohmann::ordered_json::object()));
    span("request", r.t_arrival_s, r.t_finish_s, std::move(root), !ok);

    if (trace.contains("route")) {
        json a = json::array();
        add_fields(a, "steward.route.", trace["route"]);
        span("route", r.t_arrival_s, r.t_arrival_s, std::move(a));
    }
    const double t_sched = r.t_scheduled_s.value_or(r.t_finish_s);
    if (trace.contains("admission") || r.t_scheduled_s) {
        json a = json::array();
        if (trace.contains("admission"))
            for (size_t i = 0; i < trace["admission"].size(); ++i)
                add_fields(a, "steward.admission." + std::to_string(i) + ".", trace["admission"][i]);
        span("allocate", r.t_arrival_s, t_sched, std::move(a));
    }
    if (r.t_scheduled_s) {
        span("reuse", *r.t_scheduled_s, *r.t_scheduled_s,
             json::array({attribute("steward.prompt_tokens", r.n_prompt_tokens),
                          attribute("steward.cached_prompt_tokens", r.n_cached_prompt_tokens),
                          attribute("steward.cached_public_tokens", r.n_cached_public)}));
        span("prefill", *r.t_scheduled_s, r.t_first_token_s.value_or(r.t_finish_s),
             json::array({attribute("steward.computed_prompt_tokens",
                                    std::max<int64_t>(0, r.n_prompt_tokens - r.n_cached_prompt_tokens))}));
    }
    if (r.t_first_token_s) {
        span("decode", *r.t_first_token_s, r.t_finish_s,
             json::array({attribute("steward.output_tokens", r.n_output_tokens),
                          attribute("steward.preemptions", r.n_preemptions),
                          attribute("steward.recomputed_tokens", r.n_recomputed_tokens)}));
        if (r.n_drafts > 0)
            span("speculate", *r.t_first_token_s, r.t_finish_s,
                 json::array({attribute("steward.drafts", r.n_drafts),
                              attribute("steward.draft_tokens", r.n_draft_tokens),
                              attribute("steward.accepted_tokens", r.n_accepted_tokens),
                              attribute("steward.draft_s", r.draft_s), attribute("steward.verify_s", r.verify_s)}));
    }
    json fin = json::array({attribute("steward.finish_reason", finish_reason_name(r.finish))});
    add_fields(fin, "steward.finish.", trace.value("finish", nlohmann::ordered_json::object()));
    span("finish", r.t_finish_s, r.t_finish_s, std::move(fin), !ok);

    return {{"resource", {{"attributes", json::array({attribute("service.name", "steward")})}}},
            {"scopeSpans", json::array({{{"scope", {{"name", "steward"}}}, {"spans", std::move(spans)}}})}};
}

Expected<std::unique_ptr<OtlpFile>> OtlpFile::open(const std::string& path) {
    auto f = std::make_unique<OtlpFile>();
    f->out_.open(path, std::ios::app);
    if (!f->out_)
        return make_error("[tracing] otlp_file '", path, "' cannot be opened for appending (", std::strerror(errno),
                          "); give a writable path");
    f->trace_id_hi_ = mix(std::random_device{}() ^ ((uint64_t)std::random_device{}() << 32));
    return f;
}

void OtlpFile::write(const nlohmann::json& resource_spans) {
    const std::string line = nlohmann::json{{"resourceSpans", nlohmann::json::array({resource_spans})}}.dump() + "\n";
    std::lock_guard<std::mutex> lk(mu_);
    out_ << line;
    out_.flush();  // a reader (or a crash) sees every finished request's line
}

}  // namespace steward
