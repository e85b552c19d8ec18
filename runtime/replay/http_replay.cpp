// The workload replay client over HTTP (http_replay.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it under C++20
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "replay/http_replay.h"
#include "workload/workload.h"

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using clk = std::chrono::steady_clock;
using json = nlohmann::json;

namespace steward {

namespace {

// One request as the client saw it.
struct ReplayRecord {
    size_t line = 0;
    std::string bucket, tenant;
    double arrival_ms = 0, sent_ms = 0;  // scheduled and actual send (from the run's start)
    int status = 0;
    std::string error;                   // transport or HTTP error; empty when served
    double ttft_ms = -1, e2e_ms = -1, tpot_ms = -1;
    int n_prompt = -1, n_output = 0, n_cached = -1;
    std::string text;                    // the output (agent turns feed it to the next turn)
};

double ms_since(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// The figures one server event (an SSE data line's JSON) carries: text, usage, llama-server timings.
void read_event(const json& j, ReplayRecord& r, bool& has_text) {
    if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
        const json& ch = (*c)[0];
        std::string piece;
        if (auto t = ch.find("text"); t != ch.end() && t->is_string()) piece = t->get<std::string>();
        if (auto d = ch.find("delta"); d != ch.end() && d->is_object())
            if (auto t = d->find("content"); t != d->end() && t->is_string()) piece = t->get<std::string>();
        if (!piece.empty()) {
            has_text = true;
            r.text += piece;
        }
    }
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        if (auto v = u->find("completion_tokens"); v != u->end() && v->is_number()) r.n_output = v->get<int>();
        if (auto v = u->find("prompt_tokens"); v != u->end() && v->is_number()) r.n_prompt = v->get<int>();
        if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
            if (auto v = d->find("cached_tokens"); v != d->end() && v->is_number()) r.n_cached = v->get<int>();
    }
    // llama-server: "timings" {prompt_n (computed), cache_n (reused), predicted_n} on the last chunk.
    if (auto t = j.find("timings"); t != j.end() && t->is_object()) {
        if (auto v = t->find("cache_n"); v != t->end() && v->is_number() && r.n_cached < 0) r.n_cached = v->get<int>();
        if (auto v = t->find("predicted_n"); v != t->end() && v->is_number() && r.n_output == 0) r.n_output = v->get<int>();
    }
}

// Sends one streamed /v1/completions request and reads it to the end, timing the chunks.
void run_request(const ReplayOptions& o, const json& body, clk::time_point t_run, ReplayRecord& r) {
    const clk::time_point t0 = clk::now();
    r.sent_ms = ms_since(t_run, t0);
    net::io_context io;
    tcp::socket s(io);
    beast::error_code ec;
    tcp::resolver resolver(io);
    const auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
    if (!ec) net::connect(s, endpoints, ec);
    if (ec) {
        r.error = "connect: " + ec.message();
        return;
    }
    s.set_option(tcp::no_delay(true));
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, o.host);
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
    req.prepare_payload();
    http::write(s, req, ec);
    if (ec) {
        r.error = "write: " + ec.message();
        return;
    }
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(256 << 20);
    std::string pending;  // SSE bytes not yet split into events
    int n_text_events = 0;
    clk::time_point t_first{}, t_last{};
    auto on_chunk = [&](uint64_t, beast::string_view piece, beast::error_code&) {
        pending.append(piece.data(), piece.size());
        for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
            std::string ev = pending.substr(0, end);
            pending.erase(0, end + 2);
            const size_t d = ev.find("data: ");
            if (d == std::string::npos) continue;
            const std::string data = ev.substr(d + 6);
            if (data == "[DONE]") continue;
            const json j = json::parse(data, nullptr, false);
            if (j.is_discarded()) continue;
            bool has_text = false;
            read_event(j, r, has_text);
            if (has_text) {
                const clk::time_point now = clk::now();
                if (n_text_events++ == 0) t_first = now;
                t_last = now;
            }
        }
        return piece.size();
    };
    p.on_chunk_body(on_chunk);
    http::read_header(s, buf, p, ec);
    if (ec) {
        r.error = "read: " + ec.message();
        return;
    }
    r.status = p.get().result_int();
    if (r.status != 200) {
        http::read(s, buf, p, ec);
        r.error = "HTTP " + std::to_string(r.status) + ": " + p.get().body().substr(0, 300);
        return;
    }
    while (!p.is_done() && !ec) http::read_some(s, buf, p, ec);
    const clk::time_point t_end = clk::now();
    if (ec && ec != http::error::end_of_stream) {
        r.error = "read: " + ec.message();
        return;
    }
    if (r.n_output == 0) r.n_output = n_text_events;  // no usage: a chunk per token
    r.e2e_ms = ms_since(t0, t_end);
    if (n_text_events > 0) {
        r.ttft_ms = ms_since(t0, t_first);
        // vLLM's definition: the time after the first token over the tokens after it.
        if (r.n_output > 1) r.tpot_ms = ms_since(t_first, t_last) / (double)(r.n_output - 1);
    }
}

json request_body(const ReplayOptions& o, const WorkloadRequest& w, const std::string& prompt) {
    json b = {{"model", o.model},
              {"prompt", prompt},
              {"max_tokens", w.max_tokens},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"temperature", o.greedy ? 0.0 : w.temperature},
              {"top_p", o.greedy ? 1.0 : w.top_p},
              {"cache_prompt", true}};  // llama-server's prompt cache (its default; said for older builds)
    if (w.seed) b["seed"] = *w.seed;
    if (o.steward_fields) {
        if (!w.bucket.empty()) b["model"] = w.bucket;
        if (w.response_json) b["response_format"] = {{"type", "json_object"}};
    }
    if (o.ignore_eos) b["ignore_eos"] = true;
    if (o.session_field && !w.session.empty()) b["session"] = w.tenant + "/" + w.session;  // one server tenant
    b["user"] = w.tenant;
    return b;
}

double pct(std::vector<double> v, double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (double)(v.size() - 1) + 0.5))];
}

struct Row {
    int n = 0, n_failed = 0;
    double ttft_p50 = -1, ttft_p95 = -1, ttft_p99 = -1, tpot_mean = -1, e2e_p99 = -1, tok_s = 0;
    int64_t n_output = 0, n_prompt = 0, n_cached = 0;
};

// Rows per bucket (file order of first appearance) and "all"; tok/s over the run's wall time.
std::vector<std::pair<std::string, Row>> table_rows(const std::vector<ReplayRecord>& recs, double wall_s) {
    std::vector<std::string> order;
    for (const ReplayRecord& r : recs)
        if (std::find(order.begin(), order.end(), r.bucket) == order.end()) order.push_back(r.bucket);
    order.push_back("all");
    std::vector<std::pair<std::string, Row>> rows;
    for (const std::string& b : order) {
        Row row;
        std::vector<double> ttft, tpot, e2e;
        for (const ReplayRecord& r : recs) {
            if (b != "all" && r.bucket != b) continue;
            row.n++;
            if (!r.error.empty() || r.ttft_ms < 0) {
                row.n_failed++;
                continue;
            }
            ttft.push_back(r.ttft_ms);
            e2e.push_back(r.e2e_ms);
            if (r.tpot_ms >= 0) tpot.push_back(r.tpot_ms);
            row.n_output += r.n_output;
            if (r.n_prompt > 0) row.n_prompt += r.n_prompt;
            if (r.n_cached > 0) row.n_cached += r.n_cached;
        }
        row.ttft_p50 = pct(ttft, 0.5);
        row.ttft_p95 = pct(ttft, 0.95);
        row.ttft_p99 = pct(ttft, 0.99);
        row.e2e_p99 = pct(e2e, 0.99);
        if (!tpot.empty()) {
            double s = 0;
            for (double x : tpot) s += x;
            row.tpot_mean = s / (double)tpot.size();
        }
        row.tok_s = wall_s > 0 ? (double)row.n_output / wall_s : 0;
        rows.push_back({b, row});
    }
    return rows;
}

void print_table(const std::string& name, const std::vector<std::pair<std::string, Row>>& rows, double wall_s) {
    std::printf("%s (wall %.1f s)\n", name.c_str(), wall_s);
    std::printf("%-12s %5s %5s %9s %9s %9s %9s %9s %8s %8s %7s\n", "bucket", "n", "fail", "ttft_p50", "ttft_p95", "ttft_p99",
                "tpot_avg", "e2e_p99", "out_tok", "tok/s", "cached");
    for (const auto& [b, r] : rows) {
        const std::string cached = r.n_prompt > 0 ? std::to_string((int)(100.0 * (double)r.n_cached / (double)r.n_prompt + 0.5)) + "%" : "-";
        std::printf("%-12s %5d %5d %7.0fms %7.0fms %7.0fms %7.1fms %7.0fms %8lld %8.1f %7s\n", b.c_str(), r.n, r.n_failed,
                    r.ttft_p50, r.ttft_p95, r.ttft_p99, r.tpot_mean, r.e2e_p99, (long long)r.n_output, r.tok_s, cached.c_str());
    }
}

// A run's records as JSON (with the output text) and back, field for field.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ReplayRecord, line, bucket, tenant, arrival_ms, sent_ms, status, error, ttft_ms, tpot_ms,
                                   e2e_ms, n_prompt, n_output, n_cached, text)

json run_json(const std::string& name, const std::vector<ReplayRecord>& recs, double wall_s) {
    return {{"name", name}, {"wall_s", wall_s}, {"requests", recs}};
}

std::vector<ReplayRecord> records_of(const json& j) { return j.at("requests").get<std::vector<ReplayRecord>>(); }

}  // namespace

int http_replay(const ReplayOptions& o) {
    auto wl = read_workload_file(o.workload);
    if (!wl) {
        std::fprintf(stderr, "replay: %s\n", wl.error().message.c_str());
        return 1;
    }
    std::vector<ReplayRecord> recs(wl->requests.size());
    // Agent sessions run their turns in order on one thread (a turn goes at its arrival, after the
    // previous turn finished and its tool pause); every other request has its own thread.
    std::map<std::pair<std::string, std::string>, std::vector<size_t>> chains;
    std::vector<std::vector<size_t>> work;
    for (size_t i = 0; i < wl->requests.size(); i++) {
        const WorkloadRequest& w = wl->requests[i];
        if (w.prompt_kind == PromptKind::IDS) {
            std::fprintf(stderr, "replay: workload line %zu has prompt_ids; this client sends text prompts\n", i + 1);
            return 1;
        }
        if (o.sequential) {  // one chain of every line, in file order
            if (work.empty()) work.emplace_back();
            work[0].push_back(i);
        } else if (w.session.empty()) {
            work.push_back({i});
        } else {
            chains[{w.tenant, w.session}].push_back(i);
        }
    }
    for (auto& [_, c] : chains) work.push_back(c);
    SessionConversations conversations;
    std::mutex conv_mu;
    const clk::time_point t_run = clk::now() + std::chrono::milliseconds(50);
    std::atomic<int> n_done{0};
    std::vector<std::thread> threads;
    for (const std::vector<size_t>& chain : work)
        threads.emplace_back([&, chain] {
            clk::time_point ready = t_run;
            for (size_t i : chain) {
                const WorkloadRequest& w = wl->requests[i];
                ReplayRecord& r = recs[i];
                r.line = i + 1;
                r.bucket = w.bucket.empty() ? "-" : w.bucket;
                r.tenant = w.tenant;
                r.arrival_ms = w.arrival_ms;
                if (!o.sequential)
                    std::this_thread::sleep_until(std::max(ready, t_run + std::chrono::microseconds((int64_t)(w.arrival_ms * 1e3))));
                std::string prompt = wl->prompt_text(w);
                if (!w.session.empty()) {
                    std::lock_guard<std::mutex> lk(conv_mu);
                    prompt = conversations.open_turn(w.tenant, w.session, prompt);
                }
                run_request(o, request_body(o, w, prompt), t_run, r);
                if (o.progress) {
                    const int d = ++n_done;
                    const int total = (int)wl->requests.size();
                    if (d == total || d * 10 / total != (d - 1) * 10 / total)
                        std::fprintf(stderr, "progress: %d/%d requests, %.0f s\n", d, total, ms_since(t_run, clk::now()) / 1e3);
                }
                if (!w.session.empty()) {
                    std::lock_guard<std::mutex> lk(conv_mu);
                    conversations.close_turn(w.tenant, w.session, r.text);
                }
                ready = clk::now() + std::chrono::microseconds((int64_t)(w.tool_pause_ms * 1e3));
            }
        });
    for (auto& t : threads) t.join();
    const double wall_s = ms_since(t_run, clk::now()) / 1e3;
    int n_failed = 0;
    for (const ReplayRecord& r : recs)
        if (!r.error.empty()) {
            if (n_failed++ < 5) std::fprintf(stderr, "replay: line %zu (%s): %s\n", r.line, r.bucket.c_str(), r.error.c_str());
        }
    double max_lag = 0;
    for (size_t i = 0; i < recs.size(); i++)  // later agent turns go when their previous turn allows
        if (wl->requests[i].turn <= 1) max_lag = std::max(max_lag, recs[i].sent_ms - recs[i].arrival_ms);
    print_table(o.name, table_rows(recs, wall_s), wall_s);
    std::printf("(%d failed; sends at most %.1f ms after their arrival times; later agent turns wait for the previous one)\n", n_failed, max_lag);
    if (!o.out.empty()) {
        std::error_code dir_ec;
        if (std::filesystem::path(o.out).has_parent_path())
            std::filesystem::create_directories(std::filesystem::path(o.out).parent_path(), dir_ec);
        std::ofstream f(o.out);
        f << run_json(o.name, recs, wall_s).dump(1) << "\n";
        if (!f) {
            std::fprintf(stderr, "replay: cannot write %s\n", o.out.c_str());
            return 1;
        }
    }
    return n_failed ? 2 : 0;
}

// Two saved runs side by side: per bucket, each figure of A, of B, and A / B.
int http_replay_compare(const std::string& a_path, const std::string& b_path) {
    auto load = [](const std::string& p) {
        std::error_code ec;  // a FIFO or a device would block the read: regular files only
        if (!std::filesystem::is_regular_file(p, ec))
            throw std::runtime_error("'" + p + "' is not a regular file; give the JSON a replay wrote with -o / --out");
        std::ifstream f(p);
        if (!f) throw std::runtime_error("cannot read '" + p + "'; give the JSON a replay wrote with -o / --out");
        std::stringstream ss;
        ss << f.rdbuf();
        try {
            return json::parse(ss.str());
        } catch (const std::exception& e) {
            throw std::runtime_error("'" + p + "' is not a replay's JSON (" + e.what() + ")");
        }
    };
    json ja, jb;
    double wa = 0, wb = 0;
    std::vector<std::pair<std::string, Row>> ra, rb;
    std::string na, nb;
    try {
        ja = load(a_path);
        jb = load(b_path);
        wa = ja.at("wall_s");
        wb = jb.at("wall_s");
        ra = table_rows(records_of(ja), wa);
        rb = table_rows(records_of(jb), wb);
        na = ja.at("name");
        nb = jb.at("name");
    } catch (const std::exception& e) {  // unreadable, not JSON, or JSON of another shape
        std::fprintf(stderr, "replay --compare: %s\n", e.what());
        return 1;
    }
    std::printf("side by side: A = %s, B = %s; ratio A/B (latency: < 1 means A is faster; tok/s: > 1)\n", na.c_str(), nb.c_str());
    std::printf("%-12s %-9s %10s %10s %7s\n", "bucket", "figure", "A", "B", "A/B");
    for (const auto& row_a : ra) {
        const std::string& bucket = row_a.first;  // not a structured binding: the lambdas capture it (Clang 14)
        const Row& a = row_a.second;
        auto it = std::find_if(rb.begin(), rb.end(), [&](const auto& x) { return x.first == bucket; });
        if (it == rb.end()) continue;
        const Row& b = it->second;
        auto line = [&](const char* fig, double x, double y, const char* unit) {
            const std::string ratio = y > 0 && x >= 0 ? (std::ostringstream() << std::fixed << std::setprecision(2) << x / y).str() : "-";
            std::printf("%-12s %-9s %8.1f%-2s %8.1f%-2s %7s\n", bucket.c_str(), fig, x, unit, y, unit, ratio.c_str());
        };
        line("ttft_p50", a.ttft_p50, b.ttft_p50, "ms");
        line("ttft_p95", a.ttft_p95, b.ttft_p95, "ms");
        line("ttft_p99", a.ttft_p99, b.ttft_p99, "ms");
        line("tpot_avg", a.tpot_mean, b.tpot_mean, "ms");
        line("e2e_p99", a.e2e_p99, b.e2e_p99, "ms");
        line("tok/s", a.tok_s, b.tok_s, "");
        line("cached", a.n_prompt > 0 ? 100.0 * (double)a.n_cached / (double)a.n_prompt : -1,
             b.n_prompt > 0 ? 100.0 * (double)b.n_cached / (double)b.n_prompt : -1, "%");
        if (a.n_failed || b.n_failed) std::printf("%-12s failed    %8d   %8d\n", bucket.c_str(), a.n_failed, b.n_failed);
    }
    return 0;
}

Expected<bool> parse_replay_url(const std::string& url, ReplayOptions& o) {
    std::string rest = url;
    if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
    else if (rest.find("://") != std::string::npos)
        return make_error("--url '", url, "': only http:// is supported; give http://HOST:PORT");
    if (const size_t slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size())
        return make_error("--url '", url, "' has no host and port; give http://HOST:PORT");
    const std::string port = rest.substr(colon + 1);
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
        std::stoi(port) > 65535)
        return make_error("--url '", url, "': port '", port, "' is not in 1-65535");
    o.host = rest.substr(0, colon);
    if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']') o.host = o.host.substr(1, o.host.size() - 2);
    o.port = (uint16_t)std::stoi(port);
    return true;
}

}  // namespace steward
