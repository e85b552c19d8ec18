// A policy instance in a supervised plugin host process ([plugins] isolation = "process"): the
// server's side. The host (steward-plugin-host, runtime/plugin_host/) is exec'd over a socketpair, is
// handed the server's checked copy of the library, creates the instance from the bucket's parameters
// and answers decision calls (plugin/plugin_call.h). A call waits at most its budget; a crash, an
// early exit, a garbled answer or an overrun kills and reaps the host, the decision gets the safe
// default, and the host is restarted with backoff (100 ms doubling to 10 s) by a supervisor thread
// while decisions take the safe default at once.
#pragma once
#include <steward/config.h>
#include <steward/expected.h>

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugin/plugin_call.h"
#include "plugin/plugin_loader.h"

namespace steward {

struct PolicyCounters;

// Where the plugin host executable is: $STEWARD_PLUGIN_HOST, else steward-plugin-host next to the
// running executable (the build tree), else <exe dir>/../libexec/steward/, <libsteward.so's dir>/
// ../libexec/steward/ and the install prefix's libexec/steward/ (an install). An error names every
// place looked at.
Expected<std::string> plugin_host_path();

class PluginProcess {
public:
    struct Setup {
        std::shared_ptr<PluginLibrary> lib;  // the server's checked copy; its descriptor goes to the host
        PolicySpec spec;
        std::string bucket;
        std::vector<std::string> pools;
        std::shared_ptr<PolicyCounters> counters;
        double create_timeout_ms = 5000;  // create() in the host, at start and at each restart
    };

    // Starts the host and creates the instance. Errors: the plugin's own (create() refused its
    // parameters, an unknown parameter: the same message as in-process), create() crashing or hanging
    // in the host (named, with the signal), or no host executable.
    static Expected<std::unique_ptr<PluginProcess>> start(Setup setup);
    // Stops the supervisor (waiting for a restart in progress), closes the socket (the host destroys
    // the instance and exits); a detached thread reaps the host, killing it if it has not exited
    // within 200 ms.
    ~PluginProcess();
    PluginProcess(const PluginProcess&) = delete;
    PluginProcess& operator=(const PluginProcess&) = delete;

    enum class Result {
        DONE,       // the host answered: the call's outputs are in the slots
        TIMED_OUT,  // no answer within the budget: the host was killed (counted in n_crashed, restarted)
        FAILED,     // the host died, or answered garbage, during this call (counted in n_crashed)
        DOWN,       // the host is down, waiting for its restart: nothing was asked (counted in n_unavailable)
    };
    // Sends op with the inputs in `c` and waits up to budget_ms (<= 0: as long as it takes) for the
    // answer, decoded into `c`. Callers serialise calls (the instance's lock does).
    Result call(PluginOp op, PluginCall& c, double budget_ms);
    pid_t pid() const;  // the live host's, -1 while down (tests)

private:
    struct Child {
        pid_t pid = -1;
        int fd = -1;
    };
    explicit PluginProcess(Setup setup) : setup_(std::move(setup)) {}
    std::string who() const;
    // Spawns a host and creates the instance in it; the error says what happened (the plugin's message
    // or how the host ended).
    Expected<Child> spawn();
    // Kills (SIGKILL) and reaps `c`; the wait status, or -1.
    static int end_child(Child& c);
    // After a failed call: ends the host, logs the incident, counts it, schedules the restart.
    void fail(const std::string& what, bool killed);
    void supervise();

    Setup setup_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    Child child_;
    bool stop_ = false;
    std::chrono::steady_clock::time_point restart_at_;
    double backoff_ms_ = 100;
    std::thread thread_;  // started at the first failure
};

}  // namespace steward
