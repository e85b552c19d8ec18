// The server's side of a plugin host process: spawn (posix_spawn of steward-plugin-host, never a bare
// fork of the multi-threaded server), the create handshake, calls under a budget, kill/reap, restart
// with backoff.
#include "plugin/plugin_process.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "plugin/policies.h"

extern char** environ;

namespace steward {

namespace {

constexpr uint32_t k_host_magic = 0x48505453;  // "STPH"
constexpr double k_backoff_min_ms = 100, k_backoff_max_ms = 10000;
constexpr uint32_t k_max_reply_bytes = 64 * 1024;  // an answer, or create()'s message

std::string describe_status(int status) {
    if (status < 0) return "its exit status is unknown";
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* name = ::strsignal(sig);
        return "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
    }
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    return "ended";
}

bool executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

}  // namespace

Expected<std::string> plugin_host_path() {
    if (const char* env = std::getenv("STEWARD_PLUGIN_HOST"); env && *env) {
        if (executable(env)) return std::string(env);
        return make_error("STEWARD_PLUGIN_HOST is '", env, "', which is not an executable file; point it at steward-plugin-host or unset it");
    }
    std::vector<std::string> tried;
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        tried.push_back((exe.parent_path() / "steward-plugin-host").string());
        tried.push_back((exe.parent_path() / ".." / "libexec" / "steward" / "steward-plugin-host").lexically_normal().string());
    }
    // A program embedding libsteward.so: the host installed beside the library (<prefix>/lib ->
    // <prefix>/libexec/steward), wherever the install tree has moved since it was built.
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&plugin_host_path), &info) && info.dli_fname) {
        const std::filesystem::path lib = std::filesystem::weakly_canonical(std::filesystem::path(info.dli_fname), ec);
        if (!ec && lib != exe)
            tried.push_back((lib.parent_path().parent_path() / "libexec" / "steward" / "steward-plugin-host").string());
    }
#ifdef STEWARD_INSTALL_PLUGIN_HOST
    tried.push_back(STEWARD_INSTALL_PLUGIN_HOST);
#endif
    std::string list;
    for (const auto& p : tried) {
        if (executable(p)) return p;
        list += (list.empty() ? "" : ", ") + p;
    }
    return make_error("isolation = \"process\" needs the plugin host executable steward-plugin-host, not found at ", list,
                      "; build or install it (it is built with steward), or set STEWARD_PLUGIN_HOST to its path");
}

std::string PluginProcess::who() const {
    return std::string(policy_kind_name(setup_.lib->kind())) + " plugin '" + setup_.spec.plugin + "' (bucket " + setup_.bucket + ")";
}

Expected<std::unique_ptr<PluginProcess>> PluginProcess::start(Setup setup) {
    std::unique_ptr<PluginProcess> p(new PluginProcess(std::move(setup)));
    auto c = p->spawn();
    if (!c) return c.error();
    p->child_ = *c;
    return p;
}

Expected<PluginProcess::Child> PluginProcess::spawn() {
    const std::string ctx = setup_.spec.where + ": bucket '" + setup_.bucket + "' " + policy_kind_name(setup_.lib->kind()) +
                            " plugin '" + setup_.spec.plugin + "'";
    auto host = plugin_host_path();
    if (!host) return make_error(ctx, ": ", host.error().message);
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return make_error(ctx, ": socketpair for its plugin host failed: ", std::strerror(errno));
    // Above the fds the host gets (3: the socket, 4: the library), so that dup2 in the spawn always
    // moves them (and so clears CLOEXEC on the host's copies only).
    const int sock_tmp = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    const int lib_tmp = ::fcntl(setup_.lib->copy_fd(), F_DUPFD_CLOEXEC, 10);
    ::close(sv[1]);
    Child c;
    c.fd = sv[0];
    int rc = -1;
    if (sock_tmp >= 0 && lib_tmp >= 0) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, sock_tmp, 3);
        posix_spawn_file_actions_adddup2(&fa, lib_tmp, 4);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        // Its own process group (a terminal's ^C is the server's to handle; the host ends at EOF when
        // the server goes) and no signal blocked that the spawning thread happened to block.
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        sigset_t none;
        sigemptyset(&none);
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setpgroup(&attr, 0);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
        std::string arg0 = *host, arg1 = "3", arg2 = "4";
        char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
        rc = ::posix_spawn(&c.pid, host->c_str(), &fa, &attr, argv, environ);
        posix_spawnattr_destroy(&attr);
        posix_spawn_file_actions_destroy(&fa);
    }
    if (sock_tmp >= 0) ::close(sock_tmp);
    if (lib_tmp >= 0) ::close(lib_tmp);
    if (rc != 0) {
        ::close(c.fd);
        return make_error(ctx, ": cannot start its plugin host '", *host, "': ", std::strerror(rc > 0 ? rc : errno));
    }

    WireWriter w;
    w.pod(PluginOp::CREATE);
    w.pod(k_host_magic);
    w.pod(plugin_wire_layout());
    w.pod((uint32_t)setup_.lib->kind());
    w.pod((int32_t)spdlog::get_level());
    w.str(setup_.lib->path());
    w.str(setup_.bucket);
    w.str(setup_.spec.plugin);
    w.str(setup_.spec.where);
    w.pod((uint32_t)setup_.spec.params.size());
    for (const auto& [key, value] : setup_.spec.params) {
        w.str(key);
        auto at = setup_.spec.param_where.find(key);
        w.str(at == setup_.spec.param_where.end() ? std::string() : at->second);
        w.pod((uint8_t)value.index());
        if (auto i = std::get_if<int64_t>(&value)) w.pod(*i);
        else if (auto d = std::get_if<double>(&value)) w.pod(*d);
        else if (auto b = std::get_if<bool>(&value)) w.pod((uint8_t)(*b ? 1 : 0));
        else w.str(std::get<std::string>(value));
    }
    w.pod((uint32_t)setup_.pools.size());
    for (const auto& name : setup_.pools) w.str(name);

    std::string reply;
    FrameRead fr = write_frame(c.fd, w.buf) ? read_frame(c.fd, reply, k_max_reply_bytes, setup_.create_timeout_ms > 0 ? setup_.create_timeout_ms : -1)
                                            : FrameRead::CLOSED;
    WireReader r(reply);
    uint8_t ok = 0;
    std::string message;
    if (fr == FrameRead::OK && r.pod(ok) && r.str(message) && r.left() == 0) {
        if (ok) return c;
        end_child(c);
        return make_error(message);  // the plugin's own error, as PolicyInstance words it in-process
    }
    const int status = end_child(c);
    if (fr == FrameRead::TIMED_OUT)
        return make_error(ctx, ": create() did not return within ", std::to_string((int)setup_.create_timeout_ms),
                          " ms in its plugin host process (killed); fix the plugin, or raise [plugins] check_timeout_ms");
    return make_error(ctx, ": create() crashed in its plugin host process (", describe_status(status),
                      "); the plugin was not loaded, and the server was not affected (isolation = \"process\")");
}

int PluginProcess::end_child(Child& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    int status = -1;
    if (c.pid > 0) {
        ::kill(c.pid, SIGKILL);
        while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    c.pid = -1;
    return status;
}

pid_t PluginProcess::pid() const {
    std::lock_guard<std::mutex> lk(mu_);
    return child_.pid;
}

void PluginProcess::fail(const std::string& what, bool killed) {
    const int status = end_child(child_);
    setup_.counters->n_crashed++;
    restart_at_ = std::chrono::steady_clock::now() + std::chrono::microseconds((int64_t)(backoff_ms_ * 1000));
    spdlog::warn("{}: its plugin host process {} ({}); this decision and every one until it is restarted in {} ms get the "
                 "safe default (counted in steward_plugin_crashes_total)",
                 who(), what, killed ? "killed" : describe_status(status), (int)backoff_ms_);
    backoff_ms_ = std::min(backoff_ms_ * 2, k_backoff_max_ms);
    if (!thread_.joinable()) thread_ = std::thread([this] { supervise(); });
    cv_.notify_all();
}

PluginProcess::Result PluginProcess::call(PluginOp op, PluginCall& c, double budget_ms) {
    std::lock_guard<std::mutex> lk(mu_);
    if (child_.fd < 0) {
        setup_.counters->n_unavailable++;
        return Result::DOWN;
    }
    WireWriter w;
    c.encode_inputs(op, w);
    const char* fn = plugin_op_name(op);
    if (!write_frame(child_.fd, w.buf)) {
        setup_.counters->n_unavailable++;
        fail(std::string("was gone before ") + fn, false);
        return Result::FAILED;
    }
    std::string reply;
    const FrameRead fr = read_frame(child_.fd, reply, k_max_reply_bytes, budget_ms > 0 ? budget_ms : -1);
    if (fr == FrameRead::TIMED_OUT) {
        fail(std::string("did not answer ") + fn + " within its budget of " + std::to_string((int)budget_ms) + " ms", true);
        return Result::TIMED_OUT;
    }
    WireReader r(reply);
    if (fr != FrameRead::OK || !c.decode_result(op, r)) {
        setup_.counters->n_unavailable++;
        fail(fr == FrameRead::OK || fr == FrameRead::BAD ? std::string("answered ") + fn + " with a garbled frame"
                                                         : std::string("died during ") + fn,
             false);
        return Result::FAILED;
    }
    backoff_ms_ = k_backoff_min_ms;  // healthy again: the next incident restarts it quickly
    return Result::DONE;
}

void PluginProcess::supervise() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
        if (child_.fd >= 0) {
            cv_.wait(lk);
            continue;
        }
        if (cv_.wait_until(lk, restart_at_, [this] { return stop_; })) break;
        lk.unlock();
        auto c = spawn();  // outside the lock: decisions meanwhile get the safe default at once
        lk.lock();
        if (stop_) {
            if (c) end_child(*c);
            break;
        }
        if (c) {
            child_ = *c;
            setup_.counters->n_restarts++;
            spdlog::info("{}: plugin host process restarted (pid {})", who(), child_.pid);
        } else {
            restart_at_ = std::chrono::steady_clock::now() + std::chrono::microseconds((int64_t)(backoff_ms_ * 1000));
            spdlog::warn("{}: restarting its plugin host process failed: {}; next try in {} ms", who(), c.error().message,
                         (int)backoff_ms_);
            backoff_ms_ = std::min(backoff_ms_ * 2, k_backoff_max_ms);
        }
    }
}

PluginProcess::~PluginProcess() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (child_.pid <= 0) return;
    // EOF tells the host to destroy the instance and exit; it gets 200 ms, waited for off this thread
    // (the last request of a generation may let go of it on an actor's thread).
    ::close(child_.fd);
    std::thread([pid = child_.pid] {
        for (int i = 0; i < 40; i++) {
            int status = 0;
            const pid_t r = ::waitpid(pid, &status, WNOHANG);
            if (r == pid || (r < 0 && errno != EINTR)) return;
            ::usleep(5000);
        }
        Child c{pid, -1};
        end_child(c);
    }).detach();
}

}  // namespace steward
