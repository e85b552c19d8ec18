// inotify + a SIGHUP self-pipe, polled by one thread per watcher.
#include "api/config_watcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <vector>

namespace steward {

namespace {

// SIGHUP fan-out: the handler writes one byte to every registered pipe.
std::mutex g_hup_mu;
int g_hup_fds[16];
std::atomic<int> g_n_hup{0};
std::atomic<bool> g_hup_installed{false};

void on_sighup(int) {
    const int n = g_n_hup.load();
    for (int i = 0; i < n; i++) {
        const char c = 'h';
        if (g_hup_fds[i] >= 0) (void)!::write(g_hup_fds[i], &c, 1);
    }
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void drain(int fd) {
    char buf[4096];
    while (::read(fd, buf, sizeof buf) > 0) {
    }
}

}  // namespace

void ConfigWatcher::install_sighup_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_sighup;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGHUP, &sa, nullptr);
    g_hup_installed = true;
}

ConfigWatcher::ConfigWatcher(std::string path, bool watch_file, int debounce_ms, std::function<void()> on_change)
    : path_(std::move(path)), watch_file_(watch_file), debounce_ms_(debounce_ms), on_change_(std::move(on_change)) {
    if (::pipe(stop_pipe_) != 0) {
        spdlog::error("config watcher: pipe() failed; reload only through the API");
        return;
    }
    set_nonblocking(stop_pipe_[0]);
    // The watches are in place before the constructor returns: a save right after start is seen.
    if (::pipe(hup_) == 0) {
        set_nonblocking(hup_[0]);
        set_nonblocking(hup_[1]);
        std::lock_guard<std::mutex> lk(g_hup_mu);
        for (int i = 0; i < g_n_hup.load(); i++)
            if (g_hup_fds[i] < 0) hup_slot_ = i;
        if (hup_slot_ < 0 && g_n_hup.load() < 16) {
            hup_slot_ = g_n_hup.load();
            g_hup_fds[hup_slot_] = -1;
            g_n_hup.store(hup_slot_ + 1);
        }
        if (hup_slot_ >= 0) g_hup_fds[hup_slot_] = hup_[1];
    }
    if (watch_file_) {
        const std::filesystem::path p(path_);
        std::string dir = p.parent_path().string();
        if (dir.empty()) dir = ".";
        ino_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (ino_ < 0 || ::inotify_add_watch(ino_, dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_MODIFY) < 0) {
            spdlog::warn("config watcher: cannot watch '{}' (inotify); reload with SIGHUP or the API", dir);
            if (ino_ >= 0) ::close(ino_);
            ino_ = -1;
        }
    }
    thread_ = std::thread([this] { run(); });
}

ConfigWatcher::~ConfigWatcher() {
    if (stop_pipe_[1] >= 0) {
        const char c = 's';
        (void)!::write(stop_pipe_[1], &c, 1);
    }
    if (thread_.joinable()) thread_.join();
    for (int fd : stop_pipe_)
        if (fd >= 0) ::close(fd);
    if (hup_slot_ >= 0) {
        std::lock_guard<std::mutex> lk(g_hup_mu);
        g_hup_fds[hup_slot_] = -1;
    }
    if (hup_[0] >= 0) ::close(hup_[0]);
    // With the handler installed, a registered write end stays open: a handler running now may
    // still write to it (one small leak per watcher, only in processes that route SIGHUP).
    if ((hup_slot_ < 0 || !g_hup_installed) && hup_[1] >= 0) ::close(hup_[1]);
    if (ino_ >= 0) ::close(ino_);
}

void ConfigWatcher::run() {
    const int* hup = hup_;
    const int ino = ino_;
    const std::string name = std::filesystem::path(path_).filename().string();
    using clock = std::chrono::steady_clock;
    bool pending = false;
    clock::time_point due{};
    for (;;) {
        std::vector<pollfd> fds = {{stop_pipe_[0], POLLIN, 0}};
        if (hup[0] >= 0) fds.push_back({hup[0], POLLIN, 0});
        if (ino >= 0) fds.push_back({ino, POLLIN, 0});
        int timeout = -1;
        if (pending) timeout = (int)std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(due - clock::now()).count());
        const int rc = ::poll(fds.data(), fds.size(), timeout);
        if (rc < 0 && errno != EINTR) break;
        if (fds[0].revents & POLLIN) break;
        for (size_t i = 1; i < fds.size(); i++) {
            if (!(fds[i].revents & POLLIN)) continue;
            if (fds[i].fd == hup[0]) {
                drain(hup[0]);
                pending = true;
                due = clock::now();  // a signal is a deliberate request: no debounce
            } else {
                alignas(inotify_event) char buf[8192];
                ssize_t n;
                while ((n = ::read(ino, buf, sizeof buf)) > 0) {
                    for (char* q = buf; q < buf + n;) {
                        auto* ev = reinterpret_cast<inotify_event*>(q);
                        if (ev->len && name == ev->name) {
                            pending = true;
                            due = clock::now() + std::chrono::milliseconds(debounce_ms_);
                        }
                        q += sizeof(inotify_event) + ev->len;
                    }
                }
            }
        }
        if (pending && clock::now() >= due) {
            pending = false;
            on_change_();
        }
    }
}

}  // namespace steward
