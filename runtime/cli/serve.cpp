// `steward serve [-c FILE] [--host H] [--port P]`: the OpenAI-compatible HTTP server over a Runtime
// until SIGINT or SIGTERM (then /health answers 503, running requests are cancelled, the server
// stops). It listens first (503 "loading" while the models load); SIGHUP reloads the config.
// Prints the address it listens on (port 0: the one it got).
#include <csignal>
#include <cstdio>
#include <pthread.h>

#include "cli/commands.h"
#include "api/runtime.h"
#include "config/config.h"
#include "serve/http_server.h"

namespace steward {

int cmd_serve(const ServeOptions& o) {
    auto cfg = load_config(o.config_path);
    if (!cfg) return cli_fail(cfg.error().message);
    ServerConfig sc = cfg->server;
    if (!o.host.empty()) sc.host = o.host;
    if (o.port >= 0) sc.port = o.port;
    // SIGINT / SIGTERM are taken by sigwait below: blocked before any thread starts, so that none
    // of the runtime's or server's threads receives them.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // Listening before the models load: /health answers 503 "loading" until the runtime is up.
    auto server = serve::HttpServer::start(nullptr, sc);
    if (!server) return cli_fail(server.error().message);
    std::printf("steward serve: listening on http://%s:%u (OpenAI base_url http://%s:%u/v1)\n", sc.host.c_str(),
                (unsigned)(*server)->port(), sc.host.c_str(), (unsigned)(*server)->port());
    std::fflush(stdout);
    RuntimeOptions ro;
    ro.trace_capacity = (size_t)sc.trace_requests;
    auto rt = Runtime::start(o.config_path, ro);
    if (!rt) {
        (*server)->stop();
        return cli_fail(rt.error().message);
    }
    Runtime::route_sighup_to_reload();
    (*server)->attach(**rt);
    std::fprintf(stderr, "steward serve: ready\n");
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "steward serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    (*server)->set_draining(true);
    (*server)->stop();  // before the runtime goes: nothing of the server calls into it after this
    return 0;
}

}  // namespace steward
