// `steward serve [-c FILE] [--host H] [--port P]`: the OpenAI-compatible HTTP server over a Runtime
// until SIGINT or SIGTERM (then /health answers 503, running requests are cancelled, the server
// stops). It listens first (503 "loading" while the models load); SIGHUP reloads the config.
// Prints the address it listens on (port 0: the one it got).
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <thread>

#include <steward/runtime.h>

#include "cli/commands.h"
#include "util/strings.h"
#include "config/config.h"
#include "serve/http_server.h"

namespace {

int g_stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
    const char c = (char)sig;
    (void)!::write(g_stop_pipe[1], &c, 1);  // async-signal-safe; a full pipe already holds a stop
}

// SIGINT / SIGTERM: a handler writes the signal to a pipe that the main thread reads once all is
// up. A handler, not sigwait with the signals blocked: threads that libraries start on their own
// (BLAS, OpenMP) need not have them blocked, and the default action would end the process.
bool catch_stop_signals() {
    if (::pipe(g_stop_pipe) != 0) return false;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    return true;
}

// Blocks until one of them arrives; returns which.
char wait_for_stop_signal() {
    char sig = 0;
    while (::read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    return sig;
}

}  // namespace

namespace steward {

int cmd_serve(const ServeOptions& o) {
    auto cfg = load_config(o.config_path);
    if (!cfg) return cli_fail(cfg.error().message);
    ServerConfig sc = cfg->server;
    if (!o.host.empty()) sc.host = o.host;
    if (o.port >= 0) sc.port = o.port;
    if (!catch_stop_signals()) return cli_fail("serve: cannot create the stop pipe");

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
    const char sig = wait_for_stop_signal();
    std::fprintf(stderr, "steward serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    (*server)->set_draining(true);
    (*server)->stop();  // before the runtime goes: nothing of the server calls into it after this
    return 0;
}

int cmd_worker(const WorkerOptions& o) {
    std::string host;
    int port = 0;
    if (!split_host_port(o.listen, host, port, 0))
        return cli_fail("worker: --listen '" + o.listen + "' is not HOST:PORT (port 0..65535, 0: an ephemeral one)");
    if (!catch_stop_signals()) return cli_fail("worker: cannot create the stop pipe");
    auto rt = Runtime::start(o.config_path);
    if (!rt) return cli_fail(rt.error().message);
    Runtime::route_sighup_to_reload();
    auto bound = (*rt)->listen_for_fronts(host, port, o.wire_version);
    if (!bound) return cli_fail("worker: " + bound.error().message);
    std::string pools;
    for (const PoolInfo& p : (*rt)->pools()) pools += (pools.empty() ? "" : ", ") + p.name;
    std::printf("steward worker: listening on %s:%d for fronts (pools: %s)\n", host.c_str(), *bound, pools.c_str());
    std::fflush(stdout);
    const char sig = wait_for_stop_signal();
    std::fprintf(stderr, "steward worker: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    // Fronts retry what ran here. The runtime stops within milliseconds (on this thread: CAF's actor
    // system must end where it began; ~Runtime waits for its executors before the middleman stops,
    // which once hung 1 shutdown in 4). The watchdog is a last resort only: the cluster test fails
    // if it ever fires.
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::fprintf(stderr, "steward worker: the runtime did not stop within 10 s; exiting\n");
        std::fflush(stderr);
        std::_Exit(0);
    }).detach();
    rt->reset();
    return 0;
}

}  // namespace steward
