// Load run of the HTTP server (scripts/load_http.sh starts `steward serve` and runs this): N
// concurrent streaming clients for a duration, each sending /v1/completions with stream:true in a
// loop, models taken in turn from --models (bucket names: a bucket's figures). Prints per model
// (bucket) the client-side TTFT and TPOT (p50 / p99), the statuses seen (429s are intended
// overload answers), and the server's own TTFT / TPOT per bucket from GET /metrics.
//   bench_http --port 8080 --clients 64 --seconds 20 --max-tokens 32 --models short_qa,default
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
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

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace {

struct Figures {
    std::vector<double> ttft_ms, tpot_ms;
    std::map<int, int> statuses;
    int errors = 0;  // transport errors (connection refused, reset)
};

double pct(std::vector<double> v, double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (double)(v.size() - 1) + 0.5))];
}

// One streamed request: TTFT and TPOT as the client sees them (first and later chunks with text).
void one_request(uint16_t port, const std::string& model, int max_tokens, int prompt_words, int seq, Figures& f, std::mutex& mu) {
    net::io_context io;
    tcp::socket s(io);
    beast::error_code ec;
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
    if (ec) {
        std::lock_guard<std::mutex> lk(mu);
        f.errors++;
        return;
    }
    std::string prompt = "request " + std::to_string(seq) + ":";
    for (int i = 0; i < prompt_words; i++) prompt += " word" + std::to_string(i % 50);
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = nlohmann::json{{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", true}, {"temperature", 0}}.dump();
    req.prepare_payload();
    const auto t0 = clock_type::now();
    http::write(s, req, ec);
    if (ec) {
        std::lock_guard<std::mutex> lk(mu);
        f.errors++;
        return;
    }
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(64 << 20);
    std::vector<clock_type::time_point> token_times;
    std::string partial;
    auto on_chunk = [&](uint64_t remain, beast::string_view body, beast::error_code&) {
        partial.append(body.data(), body.size());
        if (remain == body.size()) {
            if (partial.find("\"text\":\"\"") == std::string::npos && partial.find("data: {") != std::string::npos &&
                partial.find("\"usage\"") == std::string::npos)
                token_times.push_back(clock_type::now());
            partial.clear();
        }
        return body.size();
    };
    p.on_chunk_body(on_chunk);
    http::read_header(s, buf, p, ec);
    if (!ec && p.get().result_int() == 200)
        while (!p.is_done() && !ec) http::read_some(s, buf, p, ec);
    else if (!ec)
        http::read(s, buf, p, ec);
    std::lock_guard<std::mutex> lk(mu);
    if (ec && !p.is_header_done()) {
        f.errors++;
        return;
    }
    f.statuses[p.get().result_int()]++;
    if (!token_times.empty()) {
        f.ttft_ms.push_back(std::chrono::duration<double, std::milli>(token_times.front() - t0).count());
        if (token_times.size() > 1)
            f.tpot_ms.push_back(std::chrono::duration<double, std::milli>(token_times.back() - token_times.front()).count() /
                                (double)(token_times.size() - 1));
    }
}

std::string get(uint16_t port, const std::string& target) {
    net::io_context io;
    tcp::socket s(io);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::empty_body> req(http::verb::get, target, 11);
    req.set(http::field::host, "127.0.0.1");
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(256 << 20);
    http::read(s, buf, p);
    return p.get().body();
}

// Mean of a Prometheus histogram per bucket label: sum / count of the family whose name ends so.
std::map<std::string, double> histogram_means(const std::string& text, const std::string& family) {
    std::map<std::string, double> sum, count, out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        // By suffix: the names' prefix (steward: / steward_) may change; the base unit stays.
        const std::string name = line.substr(0, line.find('{'));
        auto ends = [&](const std::string& suffix) {
            return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
        };
        const bool is_sum = ends(family + "_sum"), is_count = ends(family + "_count");
        if (!is_sum && !is_count) continue;
        const size_t b = line.find("bucket=\"");
        if (b == std::string::npos) continue;
        const std::string bucket = line.substr(b + 8, line.find('"', b + 8) - b - 8);
        const double v = std::stod(line.substr(line.rfind(' ') + 1));
        (is_sum ? sum : count)[bucket] += v;
    }
    for (const auto& [b, n] : count)
        if (n > 0) out[b] = sum[b] / n;
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    uint16_t port = 8080;
    int clients = 64, max_tokens = 32, prompt_words = 24;
    double seconds = 20;
    std::vector<std::string> models = {"steward"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--port") port = (uint16_t)std::stoi(v);
        else if (k == "--clients") clients = std::stoi(v);
        else if (k == "--seconds") seconds = std::stod(v);
        else if (k == "--max-tokens") max_tokens = std::stoi(v);
        else if (k == "--prompt-words") prompt_words = std::stoi(v);
        else if (k == "--models") {
            models.clear();
            std::stringstream ss(v);
            for (std::string m; std::getline(ss, m, ',');) models.push_back(m);
        } else {
            std::fprintf(stderr, "bench_http: unknown option %s (see the file's header)\n", k.c_str());
            return 1;
        }
    }
    std::map<std::string, Figures> by_model;
    for (const auto& m : models) by_model[m];
    std::mutex mu;
    std::atomic<int> seq{0};
    const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; c++)
        threads.emplace_back([&, c] {
            for (int k = 0; clock_type::now() < end; k++) {
                const std::string& m = models[(size_t)(c + k) % models.size()];
                one_request(port, m, max_tokens, prompt_words, seq++, by_model[m], mu);
            }
        });
    for (auto& t : threads) t.join();

    std::printf("%-12s %8s %10s %10s %10s %10s  %s\n", "model", "requests", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "statuses");
    int bad = 0;
    for (const auto& [m, f] : by_model) {
        std::string st;
        int n = 0;
        for (const auto& [code, k] : f.statuses) {
            st += std::to_string(code) + ":" + std::to_string(k) + " ";
            n += k;
            if (code != 200 && code != 429) bad += k;
        }
        bad += f.errors;
        if (f.errors) st += "transport_errors:" + std::to_string(f.errors);
        std::printf("%-12s %8d %8.1fms %8.1fms %8.2fms %8.2fms  %s\n", m.c_str(), n, pct(f.ttft_ms, 0.5), pct(f.ttft_ms, 0.99),
                    pct(f.tpot_ms, 0.5), pct(f.tpot_ms, 0.99), st.c_str());
    }
    try {
        const std::string metrics = get(port, "/metrics");
        const auto ttft = histogram_means(metrics, "time_to_first_token_seconds");
        const auto tpot = histogram_means(metrics, "time_per_output_token_seconds");
        std::printf("server (/metrics, means per bucket since the server started):\n");
        for (const auto& [b, v] : ttft)
            std::printf("  %-12s ttft %.1f ms  tpot %s\n", b.c_str(), v * 1e3,
                        tpot.count(b) ? (std::to_string(tpot.at(b) * 1e3) + " ms").c_str() : "-");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_http: GET /metrics failed: %s\n", e.what());
    }
    std::printf("unintended failures (not 200 or 429): %d\n", bad);
    return bad ? 2 : 0;
}
