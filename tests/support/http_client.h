// The HTTP tests' client and server fixture: steward serve's server on a runtime started from a
// Config (an ephemeral port), and one blocking request over a fresh connection (Boost.Beast), its
// status, body and headers; check_error holds an answer to OpenAI's error object.
#pragma once
#include <utility>  // before Boost 1.74's asio, which uses std::exchange without it under C++20
#include <sys/socket.h>
#include <sys/time.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <steward/config.h>
#include <steward/runtime.h>

#include "serve/http_server.h"

namespace steward_test {

namespace http_client {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
}  // namespace http_client

struct Served {
    std::unique_ptr<steward::Runtime> rt;
    std::unique_ptr<steward::serve::HttpServer> server;
    uint16_t port = 0;
};

// The runtime and its HTTP server from config c (its [server] table); fails the test on an error.
inline Served serve_config(const steward::Config& c) {
    Served out;
    auto rt = steward::Runtime::start(c);
    if (!rt) FAIL(rt.error().message);
    out.rt = std::move(*rt);
    auto srv = steward::serve::HttpServer::start(*out.rt, c.server);
    if (!srv) FAIL(srv.error().message);
    out.server = std::move(*srv);
    out.port = out.server->port();
    return out;
}

// A connected socket whose reads give up after timeout_s (a broken server fails the test, not hangs it).
inline http_client::tcp::socket connect(http_client::net::io_context& io, uint16_t port, int timeout_s = 10) {
    using namespace http_client;
    tcp::socket s(io);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    timeval tv{timeout_s, 0};
    setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return s;
}

struct Reply {
    int status = 0;
    std::string body;
    http_client::http::fields headers;
    http_client::json j() const { return http_client::json::parse(body); }
};

inline Reply request(uint16_t port, http_client::http::verb method, const std::string& target, const std::string& body = "",
                     const std::vector<std::pair<std::string, std::string>>& headers = {}, int timeout_s = 10) {
    using namespace http_client;
    net::io_context io;
    tcp::socket s = connect(io, port, timeout_s);
    http::request<http::string_body> req(method, target, 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(64 << 20);
    http::read(s, buf, p);
    Reply r;
    r.status = p.get().result_int();
    r.body = p.get().body();
    for (const auto& f : p.get()) r.headers.set(f.name_string(), f.value());
    return r;
}

inline Reply post(uint16_t port, const std::string& target, const http_client::json& body,
                  const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    return request(port, http_client::http::verb::post, target, body.dump(), headers);
}

// r is OpenAI's error object with this status, param (empty: null) and code, its message holding
// in_message.
inline void check_error(const Reply& r, int status, const std::string& param, const std::string& code,
                        const std::string& in_message = "") {
    INFO(r.body);
    CHECK(r.status == status);
    const http_client::json j = r.j();
    REQUIRE(j.contains("error"));
    const http_client::json& e = j["error"];
    CHECK(e["message"].is_string());
    CHECK(e["type"].is_string());
    if (param.empty()) CHECK(e["param"].is_null());
    else CHECK(e["param"] == param);
    CHECK(e["code"] == code);
    if (!in_message.empty()) CHECK_THAT(e["message"].get<std::string>(), Catch::Contains(in_message));
}

}  // namespace steward_test
