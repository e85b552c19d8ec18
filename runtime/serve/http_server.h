// The HTTP server of `steward serve`: OpenAI's API, tokenize, metrics and admin endpoints over a
// Runtime, on its own I/O threads (Boost.Beast; Boost stays inside http_server.cpp). Runtime
// callbacks only post to a connection's strand: nothing here blocks the runtime, and no I/O thread
// waits on the runtime.
#pragma once
#include <cstdint>
#include <memory>

#include <steward/config.h>
#include <steward/expected.h>
#include <steward/runtime.h>

namespace steward::serve {

class HttpServer {
public:
    // Binds cfg.host:cfg.port (0: an ephemeral port, see port()) and starts cfg.io_threads threads.
    // The runtime must outlive the server. Errors name the address and the reason.
    static Expected<std::unique_ptr<HttpServer>> start(Runtime& runtime, const ServerConfig& cfg);
    // The same before the runtime exists (its models still loading): every endpoint answers 503
    // (/health {"status": "loading"}) until attach(). The attached runtime must outlive the server
    // (or stop() must come first).
    static Expected<std::unique_ptr<HttpServer>> start(Runtime* runtime, const ServerConfig& cfg);
    void attach(Runtime& runtime);
    // Stops accepting, closes every connection, cancels the requests still running and waits for
    // their last callback, then joins the I/O threads. Idempotent; ~HttpServer calls it.
    ~HttpServer();
    void stop();
    // GET /health answers 503 from now on (a drain before stop).
    void set_draining(bool draining);
    uint16_t port() const;

    struct Impl;

private:
    explicit HttpServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace steward::serve
