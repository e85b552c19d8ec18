// Serving bench: replays a workload file (runtime/workload: the JSONL `steward run --save-workload`
// writes) with its arrival times over HTTP against any OpenAI-compatible server (steward serve,
// llama-server), streaming, one connection per in-flight request, and prints per bucket TTFT
// p50/p95/p99, TPOT mean, e2e p99, output tok/s and cached prompt tokens. scripts/bench_serve.sh
// runs it against both servers; --compare prints two saved runs side by side with ratios.
//   bench_serve --port 8080 --workload wl.jsonl [--greedy] [--stop-at-eos] [--session-field] [--out run.json] [--name N]
//               [--steward-fields] [--sequential]
// --steward-fields sends each request's bucket hint as the model (Steward: a bucket name picks that
// bucket) and response_format json_object for the workload's "json" requests; --sequential sends
// one request at a time in file order, ignoring arrival times (the same batches as `steward run
// --sequential`, for comparing outputs); --out's JSON carries each request's output text.
// Every request asks ignore_eos (both servers then produce max_tokens tokens) unless --stop-at-eos;
// --greedy sends temperature 0; --session-field sends agent turns' session (Steward's extension).
//   bench_serve --compare steward.json llama.json
//   bench_serve --requests 40 [--rate 2 --seed 0 --scale 1] --save-workload wl.jsonl   (writes the
//     standard workload exactly as `steward run --requests 40 --save-workload wl.jsonl` does, without the run)
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it under C++20
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "workload/workload.h"

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using clk = std::chrono::steady_clock;
using json = nlohmann::json;
using namespace steward;

namespace {

struct Options {
    uint16_t port = 8080;
    std::string workload, out, name = "server", model = "steward";
    bool greedy = false, ignore_eos = true, session_field = false;
    // --steward-fields: what the workload says, the Steward way: the bucket hint as the model (a
    // bucket name there picks that bucket) and response_format json_object for "json" requests.
    bool steward_fields = false;
    bool sequential = false;  // one request at a time in file order, arrival times ignored
};

// One request as the client saw it.
struct Record {
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
void read_event(const json& j, Record& r, bool& has_text) {
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
void run_request(const Options& o, const json& body, clk::time_point t_run, Record& r) {
    const clk::time_point t0 = clk::now();
    r.sent_ms = ms_since(t_run, t0);
    net::io_context io;
    tcp::socket s(io);
    beast::error_code ec;
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), o.port), ec);
    if (ec) {
        r.error = "connect: " + ec.message();
        return;
    }
    s.set_option(tcp::no_delay(true));
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "127.0.0.1");
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

json request_body(const Options& o, const WorkloadRequest& w, const std::string& prompt) {
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
std::vector<std::pair<std::string, Row>> table_rows(const std::vector<Record>& recs, double wall_s) {
    std::vector<std::string> order;
    for (const Record& r : recs)
        if (std::find(order.begin(), order.end(), r.bucket) == order.end()) order.push_back(r.bucket);
    order.push_back("all");
    std::vector<std::pair<std::string, Row>> rows;
    for (const std::string& b : order) {
        Row row;
        std::vector<double> ttft, tpot, e2e;
        for (const Record& r : recs) {
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

// A run's records as JSON (the output text is left out) and back, field for field.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Record, line, bucket, tenant, arrival_ms, sent_ms, status, error, ttft_ms, tpot_ms,
                                   e2e_ms, n_prompt, n_output, n_cached, text)

json run_json(const std::string& name, const std::vector<Record>& recs, double wall_s) {
    return {{"name", name}, {"wall_s", wall_s}, {"requests", recs}};
}

std::vector<Record> records_of(const json& j) { return j.at("requests").get<std::vector<Record>>(); }

int replay(const Options& o) {
    auto wl = read_workload_file(o.workload);
    if (!wl) {
        std::fprintf(stderr, "bench_serve: %s\n", wl.error().message.c_str());
        return 1;
    }
    std::vector<Record> recs(wl->requests.size());
    // Agent sessions run their turns in order on one thread (a turn goes at its arrival, after the
    // previous turn finished and its tool pause); every other request has its own thread.
    std::map<std::pair<std::string, std::string>, std::vector<size_t>> chains;
    std::vector<std::vector<size_t>> work;
    for (size_t i = 0; i < wl->requests.size(); i++) {
        const WorkloadRequest& w = wl->requests[i];
        if (w.prompt_kind == PromptKind::IDS) {
            std::fprintf(stderr, "bench_serve: workload line %zu has prompt_ids; this client sends text prompts\n", i + 1);
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
    std::vector<std::thread> threads;
    for (const std::vector<size_t>& chain : work)
        threads.emplace_back([&, chain] {
            clk::time_point ready = t_run;
            for (size_t i : chain) {
                const WorkloadRequest& w = wl->requests[i];
                Record& r = recs[i];
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
    for (const Record& r : recs)
        if (!r.error.empty()) {
            if (n_failed++ < 5) std::fprintf(stderr, "bench_serve: line %zu (%s): %s\n", r.line, r.bucket.c_str(), r.error.c_str());
        }
    double max_lag = 0;
    for (size_t i = 0; i < recs.size(); i++)  // later agent turns go when their previous turn allows
        if (wl->requests[i].turn <= 1) max_lag = std::max(max_lag, recs[i].sent_ms - recs[i].arrival_ms);
    print_table(o.name, table_rows(recs, wall_s), wall_s);
    std::printf("(%d failed; sends at most %.1f ms after their arrival times; later agent turns wait for the previous one)\n", n_failed, max_lag);
    if (!o.out.empty()) {
        std::ofstream f(o.out);
        f << run_json(o.name, recs, wall_s).dump(1) << "\n";
        if (!f) {
            std::fprintf(stderr, "bench_serve: cannot write %s\n", o.out.c_str());
            return 1;
        }
    }
    return n_failed ? 2 : 0;
}

// Two saved runs side by side: per bucket, each figure of A, of B, and A / B.
int compare(const std::string& a_path, const std::string& b_path) {
    auto load = [](const std::string& p) {
        std::ifstream f(p);
        std::stringstream ss;
        ss << f.rdbuf();
        return json::parse(ss.str());
    };
    json ja, jb;
    try {
        ja = load(a_path);
        jb = load(b_path);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_serve --compare: %s\n", e.what());
        return 1;
    }
    const double wa = ja.at("wall_s"), wb = jb.at("wall_s");
    const auto ra = table_rows(records_of(ja), wa), rb = table_rows(records_of(jb), wb);
    const std::string na = ja.at("name"), nb = jb.at("name");
    std::printf("side by side: A = %s, B = %s; ratio A/B (latency: < 1 means A is faster; tok/s: > 1)\n", na.c_str(), nb.c_str());
    std::printf("%-12s %-9s %10s %10s %7s\n", "bucket", "figure", "A", "B", "A/B");
    for (const auto& [bucket, a] : ra) {
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

}  // namespace

int main(int argc, char** argv) {
    Options o;
    WorkloadGenParams gen;  // steward run's defaults (its --requests default: 120)
    gen.n_requests = 120;
    gen.seed = 1;
    std::string save_workload;
    for (int i = 1; i < argc; i++) {
        const std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_serve: %s needs a value (see the file's header)\n", k.c_str());
                std::exit(1);
            }
            return argv[++i];
        };
        if (k == "--compare") {
            const std::string a = val(), b = val();
            return compare(a, b);
        }
        if (k == "--port") o.port = (uint16_t)std::stoi(val());
        else if (k == "--workload") o.workload = val();
        else if (k == "--out") o.out = val();
        else if (k == "--name") o.name = val();
        else if (k == "--model") o.model = val();
        else if (k == "--greedy") o.greedy = true;
        else if (k == "--stop-at-eos") o.ignore_eos = false;
        else if (k == "--session-field") o.session_field = true;
        else if (k == "--steward-fields") o.steward_fields = true;
        else if (k == "--sequential") o.sequential = true;
        else if (k == "--requests") gen.n_requests = std::stoi(val());
        else if (k == "--rate") gen.rate = std::stod(val());
        else if (k == "--seed") gen.seed = std::stoull(val());
        else if (k == "--scale") gen.scale = std::stod(val());
        else if (k == "--save-workload") save_workload = val();
        else {
            std::fprintf(stderr, "bench_serve: unknown option %s (see the file's header)\n", k.c_str());
            return 1;
        }
    }
    if (!save_workload.empty()) {
        if (auto ok = check_workload_gen(gen); !ok) {
            std::fprintf(stderr, "bench_serve: %s\n", ok.error().message.c_str());
            return 1;
        }
        if (auto e = write_workload_file(generate_workload(gen), save_workload)) {
            std::fprintf(stderr, "bench_serve: %s\n", e->message.c_str());
            return 1;
        }
        return 0;
    }
    if (o.workload.empty()) {
        std::fprintf(stderr, "bench_serve: --workload FILE is required (steward run --save-workload FILE writes one)\n");
        return 1;
    }
    return replay(o);
}
