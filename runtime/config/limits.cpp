// Machine limits and the regular-file reader of config/limits.h.
#include "config/limits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace steward {

int n_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

int max_threads() { return 4 * n_cores(); }

Expected<bool> check_threads(int64_t n, const std::string& what) {
    if (n < 0 || n > max_threads())
        return make_error(what, " is ", std::to_string(n), "; it must be 0 (all ", std::to_string(n_cores()),
                          " cores) or 1..", std::to_string(max_threads()), " (4 x the cores of this machine)");
    return true;
}

int64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 0;
    return (int64_t)pages * (int64_t)page;
}

Expected<bool> check_memory(double bytes, const std::string& what, const std::string& fix) {
    const int64_t phys = physical_memory_bytes();
    if (phys > 0 && !(bytes <= (double)phys)) {
        char b[128];
        std::snprintf(b, sizeof b, "%.3g GiB but this machine has %.3g GiB of physical memory", bytes / (1ull << 30),
                      (double)phys / (1ull << 30));
        return make_error(what, " needs ", b, "; ", fix);
    }
    return true;
}

Expected<std::string> read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return make_error("cannot open ", what, " '", path, "': ", std::strerror(errno), "; check the path");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error(what, " '", path, "' is not a regular file (a FIFO, device or directory); give the path of a file");
    }
    if (st.st_size > max_bytes) {
        ::close(fd);
        return make_error(what, " '", path, "' is ", std::to_string((int64_t)st.st_size), " bytes, over the limit of ",
                          std::to_string(max_bytes), " bytes; is it the right file?");
    }
    std::string out;
    out.resize((size_t)st.st_size);
    size_t got = 0;
    // A file that grows while it is read is cut at the size fstat saw (plus a check for more).
    while (got < out.size()) {
        const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int e = errno;
            ::close(fd);
            return make_error("cannot read ", what, " '", path, "': ", std::strerror(e));
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    out.resize(got);
    char extra;
    const ssize_t more = ::read(fd, &extra, 1);
    ::close(fd);
    if (more > 0)
        return make_error(what, " '", path, "' grew while it was read; write it to a temp file and rename it into place");
    return out;
}

}  // namespace steward
