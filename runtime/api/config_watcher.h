// Watches a config file for changes (inotify on its directory, so editors that write a new file
// and rename it over the old one are seen) and SIGHUP, and calls back after a debounce. Plain C++.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace steward {

class ConfigWatcher {
public:
    // Starts a thread that calls on_change (from that thread) debounce_ms after the last change to
    // `path` (watch_file) or after a SIGHUP (when install_sighup_handler was called). Errors
    // (inotify unavailable) are logged; the watcher then only answers SIGHUP.
    ConfigWatcher(std::string path, bool watch_file, int debounce_ms, std::function<void()> on_change);
    ~ConfigWatcher();  // stops and joins the thread
    ConfigWatcher(const ConfigWatcher&) = delete;
    ConfigWatcher& operator=(const ConfigWatcher&) = delete;

    // Routes SIGHUP to every ConfigWatcher of the process (async-signal-safe: a byte on a pipe).
    // Call once, from the main thread, before other threads block signals.
    static void install_sighup_handler();

private:
    void run();
    std::string path_;
    bool watch_file_;
    int debounce_ms_;
    std::function<void()> on_change_;
    int stop_pipe_[2] = {-1, -1};
    int hup_[2] = {-1, -1};  // SIGHUP's byte arrives here
    int hup_slot_ = -1;
    int ino_ = -1;           // inotify on the file's directory
    std::thread thread_;
};

}  // namespace steward
