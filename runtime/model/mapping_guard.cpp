// The SIGBUS side of MappedFileGuard: a fixed table of protected ranges read by the handler without
// locks, and a handler that maps anonymous zero pages over the rest of a faulting mapping (the access
// retries and reads zeros) and flags it; faults anywhere else go to the previous handler.
#include "model/mapping_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace steward {

namespace {

struct Slot {
    std::atomic<uintptr_t> base{0};  // 0: free
    std::atomic<size_t> size{0};
    std::atomic<int> faulted{0};
    std::atomic<bool> taken{false};
};

constexpr int kSlots = 256;  // models mapped at once (pools x reload generations still loaded)
Slot g_slots[kSlots];
struct sigaction g_old_action {};
uintptr_t g_page_mask = ~(uintptr_t)4095;
std::once_flag g_install_once;

void chain_to_previous(int sig, siginfo_t* info, void* uctx) {
    if ((g_old_action.sa_flags & SA_SIGINFO) && g_old_action.sa_sigaction) {
        g_old_action.sa_sigaction(sig, info, uctx);
        return;
    }
    if (g_old_action.sa_handler == SIG_DFL || g_old_action.sa_handler == SIG_IGN) {
        // Not ours: restore the default action; returning re-runs the access, which then kills the
        // process with SIGBUS as it would have without us (ignoring a fault would loop forever).
        signal(sig, SIG_DFL);
        return;
    }
    g_old_action.sa_handler(sig);
}

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
    const uintptr_t a = (uintptr_t)info->si_addr;
    for (Slot& s : g_slots) {
        const uintptr_t b = s.base.load(std::memory_order_acquire);
        const size_t n = s.size.load(std::memory_order_acquire);
        if (!b || a < b || a >= b + n) continue;
        // Zero pages from the faulting page to the end: everything after it lies past the new end
        // of the file too, so one remap answers every later access without another fault. mmap is a
        // plain system call on Linux (not on POSIX's async-signal-safe list, but it takes no user lock).
        const uintptr_t page = a & g_page_mask;
        const int saved_errno = errno;
        void* r = mmap((void*)page, b + n - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        errno = saved_errno;
        if (r == MAP_FAILED) break;
        s.faulted.store(1, std::memory_order_release);
        return;
    }
    chain_to_previous(sig, info, uctx);
}

void install_handler() {
    g_page_mask = ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_old_action);
}

int register_range(const void* base, size_t size) {
    std::call_once(g_install_once, install_handler);
    for (int i = 0; i < kSlots; i++) {
        bool expected = false;
        if (!g_slots[i].taken.compare_exchange_strong(expected, true)) continue;
        g_slots[i].faulted.store(0);
        g_slots[i].size.store(size, std::memory_order_release);
        g_slots[i].base.store((uintptr_t)base, std::memory_order_release);
        return i;
    }
    return -1;
}

void unregister_range(int i) {
    if (i < 0) return;
    g_slots[i].base.store(0, std::memory_order_release);
    g_slots[i].size.store(0, std::memory_order_release);
    g_slots[i].taken.store(false);
}

int64_t mtime_ns_of(const struct stat& st) { return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec; }

}  // namespace

bool mapping_guard_active() {
    std::call_once(g_install_once, install_handler);
    struct sigaction cur {};
    if (sigaction(SIGBUS, nullptr, &cur) != 0) return false;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus;
}

MappedFileGuard::MappedFileGuard(std::string path, int fd, const void* base, size_t size)
    : path_(std::move(path)), fd_(fd) {
    struct stat st {};
    if (fd_ >= 0 && fstat(fd_, &st) == 0) {
        size_ = (int64_t)st.st_size;
        mtime_ns_ = mtime_ns_of(st);
    }
    if (base && size) slot_ = register_range(base, size);
}

MappedFileGuard::~MappedFileGuard() {
    unregister_range(slot_);
    if (fd_ >= 0) ::close(fd_);
}

bool MappedFileGuard::faulted() const {
    return slot_ >= 0 && g_slots[slot_].faulted.load(std::memory_order_acquire) != 0;
}

Expected<bool> MappedFileGuard::check() const {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.empty()) return make_error(broken_);
    struct stat st {};
    const bool have = fd_ >= 0 && fstat(fd_, &st) == 0;
    const bool was_truncated = faulted() || (have && (int64_t)st.st_size < size_);
    if (was_truncated) {
        broken_ = "the model file '" + path_ + "' changed while it was served (truncated" +
                  (have ? " to " + std::to_string((int64_t)st.st_size) + " bytes from " + std::to_string(size_) : "") +
                  "); reload the config to load it again";
    } else if (have && ((int64_t)st.st_size != size_ || mtime_ns_of(st) != mtime_ns_)) {
        broken_ = "the model file '" + path_ + "' changed while it was served (rewritten in place: its size or " +
                  "mtime changed); reload the config to load it again (replace model files by rename)";
    } else {
        return true;
    }
    return make_error(broken_);
}

}  // namespace steward
