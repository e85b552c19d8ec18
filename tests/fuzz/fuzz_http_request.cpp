// Fuzzes HTTP request parsing as the server reads a request: Beast's parser with the server's
// header and body limits, fed in pieces of the sizes the first byte gives, then what the server
// reads from a parsed request (method, target, request id, bearer key). Invariants: nothing throws
// or crashes; a parsed request's headers and body are within the limits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it under C++20

#include <boost/beast/http.hpp>

#include "serve/openai_api.h"

namespace http = boost::beast::http;

namespace {

constexpr uint32_t k_header_limit = 4096;
constexpr uint64_t k_body_limit = 8192;

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_http_request invariant broken: %s: %s\n", what, detail.c_str());
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size > 32768) return 0;
    const size_t piece = 1 + data[0] % 64;
    const char* p = reinterpret_cast<const char*>(data + 1);
    size_t left = size - 1;
    http::request_parser<http::string_body> parser;
    parser.header_limit(k_header_limit);
    parser.body_limit(k_body_limit);
    boost::beast::error_code ec;
    std::string pending;
    try {
        while (left > 0 && !parser.is_done()) {
            const size_t n = std::min(piece, left);
            pending.append(p, n);
            p += n;
            left -= n;
            const size_t used = parser.put(boost::asio::buffer(pending), ec);
            pending.erase(0, used);
            if (ec == http::error::need_more) {
                ec = {};
                continue;
            }
            if (ec) return 0;  // refused: 400, 413 or 431 in the server
        }
        if (!parser.is_done()) return 0;
        const auto& req = parser.get();
        // What the server lets through has a known body length: a request whose framing the rule
        // accepts is chunked, has a Content-Length, or has no body.
        std::vector<std::string> te;
        for (const auto& f : req)
            if (f.name() == http::field::transfer_encoding) te.emplace_back(f.value());
        const bool accepted = !steward::serve::transfer_coding_refusal(te);
        if (accepted && !te.empty() && !parser.chunked()) fail("accepted a transfer coding the parser did not frame", te.front());
        if (!accepted && te.empty()) fail("refused a request without Transfer-Encoding", "");
        if (req.body().size() > k_body_limit) fail("body over the limit", std::to_string(req.body().size()));
        const std::string target(req.target());
        (void)steward::serve::parse_request_id(target.substr(target.rfind('/') == std::string::npos ? 0 : target.rfind('/') + 1));
        (void)std::string(req[http::field::authorization]);
        (void)req.keep_alive();
    } catch (const std::exception& e) {
        fail("exception", e.what());
    }
    return 0;
}
