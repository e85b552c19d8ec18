// Model files stay mapped while they are served; this guards them against a change underneath:
// a SIGBUS inside a registered mapping (the file was truncated) becomes zero pages and a flag, and
// a per-step check (the flag, the file's size and mtime) turns either into a clean error.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <steward/expected.h>

namespace steward {

// Watches one mapped model file from load to unload. Owned by the Model, destroyed before the
// mapping is unmapped. Thread-safe: check() may be called from every engine serving the model.
class MappedFileGuard {
public:
    // fd: the file as opened before it was mapped (the guard keeps and closes it); [base, base+size):
    // the mapping. Registration fails (the guard then only watches size and mtime) when the table
    // of protected mappings is full.
    MappedFileGuard(std::string path, int fd, const void* base, size_t size);
    ~MappedFileGuard();
    MappedFileGuard(const MappedFileGuard&) = delete;
    MappedFileGuard& operator=(const MappedFileGuard&) = delete;

    // An error once the file was truncated (a fault in the mapping) or its size or mtime changed
    // since it was loaded; sticky: once broken, always broken (the weights in memory may be zeros
    // or a mix of old and new). The message names the file and the fix (reload).
    Expected<bool> check() const;
    bool faulted() const;

private:
    std::string path_;
    int fd_ = -1;
    int slot_ = -1;
    int64_t size_ = 0, mtime_ns_ = 0;
    mutable std::mutex mu_;
    mutable std::string broken_;  // non-empty: the sticky error message
};

// True when the SIGBUS handler that protects mappings is the process's current one (installed at the
// first registration). A sanitizer runtime may refuse user handlers for SIGBUS; then a truncated
// model still kills the process, and the truncation tests say so and skip.
bool mapping_guard_active();

}  // namespace steward
