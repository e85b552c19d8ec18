// check_plugin_in_child: fork, create and decide in the child, report by pipe and exit status.
#include "plugin/plugin_check.h"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "plugin/policies.h"
#include "plugin/policy_set.h"

namespace steward {

namespace {

void say(int fd, const std::string& s) {
    const std::string line = s + "\n";
    for (size_t off = 0; off < line.size();) {
        const ssize_t n = ::write(fd, line.data() + off, line.size() - off);
        if (n <= 0) return;
        off += (size_t)n;
    }
}

size_t heap_in_use() {
    const struct mallinfo2 mi = ::mallinfo2();
    return mi.uordblks + mi.hblkhd;  // arena bytes in use + mmapped chunks
}

// The child's work: "stage <name>" lines before each step, "error <msg>" or "ok" at the end.
[[noreturn]] void child(int fd, const std::shared_ptr<PluginLibrary>& lib, const PolicySpec& spec, const std::string& bucket,
                        const std::vector<std::string>& pools) {
    auto counters = std::make_shared<PolicyCounters>();
    auto decide = [&](auto& policy, auto&& one) {
        say(fd, "stage a decision");
        one(*policy);  // warm-up: first-call allocations are not leaks
        const size_t before = heap_in_use();
        for (int i = 0; i < k_check_decisions; i++) one(*policy);
        const size_t after = heap_in_use();
        const double per = after > before ? (double)(after - before) / k_check_decisions : 0.0;
        if (per > k_check_leak_bytes_per_decision) {
            say(fd, "error its decisions leak: the heap grew by " + std::to_string((long long)(after - before)) + " bytes over " +
                        std::to_string(k_check_decisions) + " decisions (" + std::to_string((long long)per) +
                        " per decision, more than " + std::to_string((long long)k_check_leak_bytes_per_decision) + ")");
            ::_exit(0);
        }
        say(fd, "stage destroy()");
        policy.reset();
    };
    say(fd, "stage create()");
    std::vector<steward_pool_view> views(std::max<size_t>(pools.size(), 1));
    for (size_t i = 0; i < views.size(); i++) {
        views[i] = steward_pool_view{};
        views[i].name = i < pools.size() ? pools[i].c_str() : "pool";
        views[i].available = 1;
        views[i].n_layers = 4;
        views[i].n_params = 1e6;
        views[i].quality = 0.5;
    }
    switch (lib->kind()) {
        case PolicyKind::ROUTING: {
            auto p = RoutingPolicy::create(lib, spec, bucket, counters, pools);
            if (!p) say(fd, "error " + p.error().message), ::_exit(0);
            RouteInput in;
            in.request_id = 1;
            in.bucket = bucket;
            in.tenant = "check";
            in.n_prompt_tokens = 16;
            in.max_tokens = 16;
            std::vector<int32_t> toks(8, 1);
            std::vector<float> lps(8, -0.5f);
            const steward_token_view tv{toks.data(), lps.data(), 8, 0};
            auto policy = std::move(*p);
            decide(policy, [&](RoutingPolicy& r) {
                bool fb = false;
                r.route(in, views, 0, &fb);
                r.check_upgrade(in, tv, &fb);
                r.on_outcome(in, RouteOutcome{0, FinishReason::STOP, false, 16, 0, 8, 10, 1, 20, 0.001});
            });
            break;
        }
        case PolicyKind::EVICTION: {
            auto p = PluginEvictionPolicy::create(lib, spec, bucket, counters, pools);
            if (!p) say(fd, "error " + p.error().message), ::_exit(0);
            std::vector<EvictionCandidate> cands(4);
            for (size_t i = 0; i < cands.size(); i++) {
                cands[i].block = (int32_t)i;
                cands[i].tenant = 0;
                cands[i].last_access_tick = (int64_t)i;
            }
            EvictionContext ctx;
            ctx.n_blocks_total = 16;
            ctx.block_size = 16;
            auto policy = std::move(*p);
            decide(policy, [&](PluginEvictionPolicy& e) { e.choose_victim(ctx, cands); });
            break;
        }
        case PolicyKind::SPECULATION: {
            auto p = SpeculationPolicy::create(lib, spec, bucket, counters, pools);
            if (!p) say(fd, "error " + p.error().message), ::_exit(0);
            auto policy = std::move(*p);
            decide(policy, [&](SpeculationPolicy& s) {
                bool fb = false;
                steward_spec_stats st{};
                st.max_budget = 4;
                s.draft_budget(st, &fb);
                SpecSeqStats q;
                q.bucket = bucket.c_str();
                q.max_budget = 4;
                s.draft_budget_seq(q, &fb);
            });
            break;
        }
    }
    say(fd, "ok");
    ::_exit(0);
}

}  // namespace

Expected<bool> check_plugin_in_child(const std::shared_ptr<PluginLibrary>& lib, const PolicySpec& spec,
                                     const std::string& bucket, const std::vector<std::string>& pools, double timeout_ms) {
    const std::string who = spec.where + ": bucket '" + bucket + "' " + policy_kind_name(lib->kind()) + " plugin '" + spec.plugin +
                            "' (" + lib->path() + ")";
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return make_error(who, ": cannot check it in a child (pipe: ", std::strerror(errno), ")");
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]), ::close(fds[1]);
        return make_error(who, ": cannot check it in a child (fork: ", std::strerror(errno), "); set [plugins] check_in_child = false");
    }
    if (pid == 0) {
        // The parent's crash handlers (a test framework's, a crash reporter's) must not run here: a
        // fault in the plugin is to end the child by its signal, which the parent reports.
        for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, SIGINT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
        ::close(fds[0]);
        child(fds[1], lib, spec, bucket, pools);
    }
    ::close(fds[1]);
    std::string out;
    bool hung = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(timeout_ms);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
            hung = true;
            break;
        }
        pollfd p{fds[0], POLLIN, 0};
        const int r = ::poll(&p, 1, (int)std::min<long long>(left, 1000));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char buf[4096];
        const ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: the child exited (or died)
        out.append(buf, (size_t)n);
    }
    ::close(fds[0]);
    if (hung) ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    // The last line says how far the child got.
    std::string stage = "loading", last;
    size_t start = 0;
    while (start < out.size()) {
        const size_t end = out.find('\n', start);
        const std::string line = out.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (line.rfind("stage ", 0) == 0) stage = line.substr(6);
        if (!line.empty()) last = line;
        if (end == std::string::npos) break;
        start = end + 1;
    }
    if (hung)
        return make_error(who, " hung in ", stage, " (no answer within [plugins] check_timeout_ms = ", std::to_string((long long)timeout_ms),
                          " ms in the isolation check); the config was not adopted: fix the plugin or raise check_timeout_ms");
    if (WIFSIGNALED(status))
        return make_error(who, " crashed in ", stage, " with signal ", std::to_string(WTERMSIG(status)), " (", strsignal(WTERMSIG(status)),
                          ") in the isolation check; the config was not adopted: fix the plugin");
    if (last.rfind("error ", 0) == 0) {
        const std::string msg = last.substr(6);
        if (msg.find("leak") != std::string::npos)
            return make_error(who, ": ", msg, " in the isolation check; the config was not adopted: fix the plugin");
        return make_error(msg);  // create()'s own refusal, already naming the plugin
    }
    if (last != "ok" || !WIFEXITED(status))
        return make_error(who, " ended the isolation check in ", stage, " without finishing (exit status ", std::to_string(status),
                          "); the config was not adopted");
    return true;
}

}  // namespace steward
