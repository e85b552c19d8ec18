// dlopen of policy plugins: private copies, entry point and version checks (older ABIs and tables
// accepted, newer functions gated on the table size), name resolution.
#include "plugin/plugin_loader.h"

#include "config/config.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

namespace steward {

namespace fs = std::filesystem;

namespace {

// The kind a plugin declares (any value a plugin may return).
const char* kind_name_u32(uint32_t k) {
    switch (k) {
        case STEWARD_POLICY_ROUTING: return "routing";
        case STEWARD_POLICY_EVICTION: return "eviction";
        case STEWARD_POLICY_SPECULATION: return "speculation";
    }
    return "unknown";
}

std::atomic<uint64_t> g_serial{0};
std::mutex g_copy_mu;  // the copies' directory is created once per process

std::string g_copy_dir;  // "" until made; removed at exit (it is empty by then: each copy is unlinked)
void remove_copy_dir() {
    if (!g_copy_dir.empty()) ::rmdir(g_copy_dir.c_str());
}

// The process's private directory for plugin copies: mkdtemp (a fresh, unpredictable name, created
// 0700 by us, never an existing path, so nobody else can plant a file or a symlink in it) under
// $XDG_RUNTIME_DIR when set (a per-user 0700 directory already), else $TMPDIR, else /tmp.
Expected<std::string> copy_dir() {
    if (!g_copy_dir.empty()) return g_copy_dir;
    std::vector<std::string> bases;
    for (const char* env : {"XDG_RUNTIME_DIR", "TMPDIR"})
        if (const char* v = std::getenv(env); v && *v) bases.push_back(v);
    bases.push_back("/tmp");
    std::string errors;
    for (const auto& base : bases) {
        std::string tmpl = base + "/steward-plugins-XXXXXX";
        if (::mkdtemp(tmpl.data())) {  // mode 0700
            struct stat st {};
            if (::lstat(tmpl.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077)) {
                ::rmdir(tmpl.c_str());
                errors += "; " + tmpl + ": not a private directory after mkdtemp";
                continue;
            }
            g_copy_dir = tmpl;
            std::atexit(remove_copy_dir);
            return g_copy_dir;
        }
        errors += "; " + base + ": " + std::strerror(errno);
    }
    return make_error("cannot create a private directory for plugin copies", errors,
                      "; set XDG_RUNTIME_DIR or TMPDIR to a directory this user can write");
}

// A copy of the plugin held open: the descriptor the host checked and dlopens through
// /proc/self/fd/<fd>, so nothing can swap the file between the check and the load.
struct HeldCopy {
    int fd = -1;
    std::string path;
    ~HeldCopy() {
        if (fd >= 0) ::close(fd);
        if (!path.empty()) ::unlink(path.c_str());
    }
};

// Copies `path` (a symlink to it is fine: the file it names is what the config means) into the private
// directory. The source is opened once and checked as a regular file through that descriptor (a FIFO
// or a directory is refused at once, nothing blocks on it); the copy is created with O_EXCL|O_NOFOLLOW
// (never an existing file, never through a symlink) and checked before it is loaded: a regular file,
// ours, not writable by group or others, of the size written.
Expected<bool> private_copy(const std::string& path, uint64_t serial, HeldCopy* out) {
    const int src = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (src < 0) {
        const int e = errno;
        if (e == ENOENT) return make_error("plugin file '", path, "' does not exist; build it, or fix the path / [plugins] dirs in the config");
        return make_error("cannot open plugin file '", path, "': ", std::strerror(e), "; check its permissions");
    }
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } src_closer{src};
    struct stat sst {};
    if (::fstat(src, &sst) != 0 || !S_ISREG(sst.st_mode))
        return make_error("plugin file '", path, "' is not a regular file (", S_ISDIR(sst.st_mode) ? "a directory" : S_ISFIFO(sst.st_mode) ? "a FIFO" : "a special file",
                          "); point the config at the plugin's .so");
    std::lock_guard<std::mutex> lk(g_copy_mu);
    auto dir = copy_dir();
    if (!dir) return dir.error();
    std::string base = fs::path(path).filename().string();
    for (char& c : base)
        if (c == '/' || (unsigned char)c < 32) c = '_';
    out->path = *dir + "/" + std::to_string(serial) + "-" + base;
    out->fd = ::open(out->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
    if (out->fd < 0) {
        const int e = errno;
        const std::string p = out->path;
        out->path.clear();  // not ours: never unlink it
        return make_error("cannot create the private copy '", p, "' of plugin '", path, "': ", std::strerror(e),
                          "; something else writes into Steward's private plugin directory");
    }
    char buf[1 << 16];
    int64_t n_written = 0;
    for (;;) {
        const ssize_t n = ::read(src, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return make_error("cannot read plugin file '", path, "': ", std::strerror(errno));
        if (n == 0) break;
        for (ssize_t off = 0; off < n;) {
            const ssize_t w = ::write(out->fd, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) return make_error("cannot write the private copy of plugin '", path, "' to '", out->path, "': ", std::strerror(errno));
            off += w;
        }
        n_written += n;
    }
    ::fchmod(out->fd, 0500);
    struct stat cst {};
    if (::fstat(out->fd, &cst) != 0 || !S_ISREG(cst.st_mode) || cst.st_uid != ::geteuid() || (cst.st_mode & 022) ||
        cst.st_size != n_written || cst.st_nlink != 1)
        return make_error("the private copy '", out->path, "' of plugin '", path,
                          "' changed after it was written (not a regular file of ours, of ", std::to_string(n_written),
                          " bytes); refusing to load it");
    return true;
}

// Checks a table's version and size and copies it into `out` (zero-filled first): the functions a
// plugin's table does not reach (an older header: its size ends before them) stay NULL for the host.
template <typename Table>
Expected<bool> adopt_table(const std::string& path, const void* t, uint32_t host_version, size_t size_v1, const char* kind,
                           Table* out) {
    if (!t) return make_error("plugin '", path, "' declares kind ", kind, " but its table is NULL; point steward_plugin.table at a static steward_", kind, "_table");
    const Table* tab = static_cast<const Table*>(t);
    if (tab->version < 1 || tab->version > host_version)
        return make_error("plugin '", path, "' has a ", kind, " table of version ", std::to_string(tab->version), ", this runtime reads versions 1 to ",
                          std::to_string(host_version), "; rebuild the plugin against this runtime's steward/policy.h");
    if (tab->size < size_v1)
        return make_error("plugin '", path, "' has a ", kind, " table of ", std::to_string(tab->size), " bytes, less than the ",
                          std::to_string(size_v1), " of a version 1 table; set its size field to sizeof(steward_", kind, "_table)");
    *out = Table{};
    std::memcpy(static_cast<void*>(out), tab, std::min<size_t>(tab->size, sizeof(Table)));
    out->size = (uint32_t)std::min<size_t>(tab->size, sizeof(Table));
    if (!out->create || !out->destroy)
        return make_error("plugin '", path, "': the ", kind, " table needs create and destroy functions");
    return true;
}

}  // namespace

const char* policy_kind_name(PolicyKind k) { return kind_name_u32((uint32_t)k); }

std::string plugin_copy_dir() {
    std::lock_guard<std::mutex> lk(g_copy_mu);
    return g_copy_dir;
}

PluginLibrary::~PluginLibrary() {
    if (handle_) ::dlclose(handle_);
    if (copy_fd_ >= 0) ::close(copy_fd_);
}

Expected<std::shared_ptr<PluginLibrary>> PluginLibrary::open(const std::string& path, PolicyKind kind) {
    const uint64_t serial = ++g_serial;
    void* h = nullptr;
    std::string dl_err;
    int copy_fd = -1;
    {
        HeldCopy copy;
        auto ok = private_copy(path, serial, &copy);
        if (!ok) return ok.error();
        // Loaded through the descriptor we checked: the name in the directory no longer matters.
        const std::string via_fd = "/proc/self/fd/" + std::to_string(copy.fd);
        std::lock_guard<std::mutex> lk(g_copy_mu);  // dlerror is per thread, but keep loads ordered
        ::dlerror();
        h = ::dlopen(via_fd.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char* e = ::dlerror();
            dl_err = e ? e : "dlopen failed";
        }
        // The descriptor stays open while the library is loaded: glibc matches dlopen names against
        // loaded objects, so a reused fd number must never name a live library.
        if (h) std::swap(copy_fd, copy.fd);
    }  // the copy is unlinked here: the mapping stays
    if (!h) {
        return make_error("cannot load plugin '", path, "': ", dl_err,
                          "; it must be a shared library built for this machine (see docs/plugin-abi.md)");
    }
    return adopt(h, copy_fd, path, kind, serial);
}

Expected<std::shared_ptr<PluginLibrary>> PluginLibrary::open_fd(int fd, const std::string& path, PolicyKind kind) {
    ::dlerror();
    void* h = ::dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char* e = ::dlerror();
        ::close(fd);
        return make_error("cannot load plugin '", path, "' in the plugin host: ", e ? e : "dlopen failed");
    }
    return adopt(h, fd, path, kind, ++g_serial);
}

Expected<std::shared_ptr<PluginLibrary>> PluginLibrary::adopt(void* h, int copy_fd, const std::string& path, PolicyKind kind,
                                                              uint64_t serial) {
    std::shared_ptr<PluginLibrary> lib(new PluginLibrary());
    lib->handle_ = h;  // closed by the destructor on every error path below
    lib->copy_fd_ = copy_fd;
    lib->path_ = path;
    lib->kind_ = kind;
    lib->serial_ = serial;
    auto entry = reinterpret_cast<steward_plugin_entry_fn>(::dlsym(h, STEWARD_PLUGIN_ENTRY_NAME));
    if (!entry)
        return make_error("plugin '", path, "' has no entry point '", STEWARD_PLUGIN_ENTRY_NAME,
                          "'; export it with STEWARD_PLUGIN_EXPORT and C linkage (extern \"C\" in C++)");
    // Our version first, then each older one we still speak: a plugin answers only versions it knows.
    const steward_plugin* info = nullptr;
    for (uint32_t v = STEWARD_POLICY_ABI_VERSION; !info && v >= STEWARD_POLICY_ABI_VERSION_MIN; v--) info = entry(v);
    if (!info)
        return make_error("plugin '", path, "' refused to load (its entry point returned NULL for ABI versions ",
                          std::to_string(STEWARD_POLICY_ABI_VERSION_MIN), " to ", std::to_string(STEWARD_POLICY_ABI_VERSION),
                          "); rebuild it against this runtime's steward/policy.h");
    if (info->abi_version < STEWARD_POLICY_ABI_VERSION_MIN || info->abi_version > STEWARD_POLICY_ABI_VERSION)
        return make_error("plugin '", path, "' was built for plugin ABI version ", std::to_string(info->abi_version),
                          ", this runtime loads versions ", std::to_string(STEWARD_POLICY_ABI_VERSION_MIN), " to ",
                          std::to_string(STEWARD_POLICY_ABI_VERSION), "; rebuild the plugin against this runtime's steward/policy.h");
    if (info->kind != (uint32_t)kind)
        return make_error("plugin '", path, "' is of kind '", kind_name_u32(info->kind), "', but the config uses it as a ",
                          policy_kind_name(kind), " policy; name it under [bucket.", kind_name_u32(info->kind),
                          "] or pick a ", policy_kind_name(kind), " plugin");
    Expected<bool> ok = true;
    switch (kind) {
        case PolicyKind::ROUTING:
            ok = adopt_table(path, info->table, STEWARD_ROUTING_TABLE_VERSION, STEWARD_ROUTING_TABLE_SIZE_V1, "routing", &lib->routing_);
            if (ok && !lib->routing_.route && !lib->routing_.route_v2)
                ok = make_error("plugin '", path, "': the routing table needs a route (or route_v2) function");
            break;
        case PolicyKind::EVICTION:
            ok = adopt_table(path, info->table, STEWARD_EVICTION_TABLE_VERSION, STEWARD_EVICTION_TABLE_SIZE_V1, "eviction", &lib->eviction_);
            if (ok && !lib->eviction_.choose_victim && !lib->eviction_.choose_victim_v2)
                ok = make_error("plugin '", path, "': the eviction table needs a choose_victim (or choose_victim_v2) function");
            break;
        case PolicyKind::SPECULATION:
            ok = adopt_table(path, info->table, STEWARD_SPECULATION_TABLE_VERSION, STEWARD_SPECULATION_TABLE_SIZE_V1, "speculation",
                             &lib->speculation_);
            if (ok && !lib->speculation_.draft_budget && !lib->speculation_.draft_budget_seq)
                ok = make_error("plugin '", path, "': the speculation table needs a draft_budget (or draft_budget_seq) function");
            break;
    }
    if (!ok) return ok.error();
    lib->info_ = info;
    return lib;
}

std::vector<std::string> PluginLoader::default_dirs() {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("STEWARD_PLUGIN_PATH")) {
        std::string s = env;
        size_t start = 0;
        while (start <= s.size()) {
            const size_t end = s.find(':', start);
            const std::string d = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
            if (!d.empty()) dirs.push_back(d);
            if (end == std::string::npos) break;
            start = end + 1;
        }
    }
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        dirs.push_back((exe.parent_path() / "plugins").string());
        dirs.push_back((exe.parent_path().parent_path() / "lib" / "steward" / "plugins").string());
    }
    // A program embedding libsteward.so: the plugins installed next to the library itself (the
    // install tree may have moved since it was built). In a static build this names the program.
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&PluginLoader::default_dirs), &info) && info.dli_fname) {
        const fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec);
        if (!ec && lib != exe) dirs.push_back((lib.parent_path() / "steward" / "plugins").string());
    }
#ifdef STEWARD_INSTALL_PLUGIN_DIR
    dirs.push_back(STEWARD_INSTALL_PLUGIN_DIR);
#endif
    return dirs;
}

Expected<std::string> PluginLoader::resolve(const std::string& plugin, PolicyKind kind, const std::vector<std::string>& dirs) const {
    if (plugin_is_path(plugin)) return plugin;
    std::vector<std::string> all = dirs;
    for (auto& d : default_dirs()) all.push_back(d);
    const std::string kn = policy_kind_name(kind);
    std::error_code ec;
    for (const auto& d : all)
        for (const std::string& f : {"steward_" + kn + "_" + plugin + ".so", plugin + ".so", "lib" + plugin + ".so"})
            if (fs::is_regular_file(fs::path(d) / f, ec)) return (fs::path(d) / f).string();
    std::string searched;
    for (const auto& d : all) searched += (searched.empty() ? "" : ", ") + d;
    // A built-in of another kind by this name is the likely mix-up: say so.
    std::string other;
    for (PolicyKind k : {PolicyKind::ROUTING, PolicyKind::EVICTION, PolicyKind::SPECULATION})
        for (const auto& d : all)
            if (k != kind && other.empty() &&
                fs::is_regular_file(fs::path(d) / ("steward_" + std::string(policy_kind_name(k)) + "_" + plugin + ".so"), ec))
                other = std::string(" ('") + plugin + "' is a plugin of kind " + policy_kind_name(k) + ": use it under [bucket." +
                        policy_kind_name(k) + "])";
    return make_error("no ", kn, " plugin named '", plugin, "'", other, " (looked for steward_", kn, "_", plugin, ".so, ", plugin,
                      ".so, lib", plugin, ".so in: ", searched, "); check the name, add its directory to [plugins] dirs, or give a path");
}

Expected<std::shared_ptr<PluginLibrary>> PluginLoader::load(const std::string& plugin, PolicyKind kind,
                                                            const std::vector<std::string>& dirs) {
    auto path = resolve(plugin, kind, dirs);
    if (!path) return path.error();
    struct stat st {};
    if (::stat(path->c_str(), &st) != 0)
        return make_error("plugin file '", *path, "' does not exist; build it, or fix the path / [plugins] dirs in the config");
    const int64_t mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    std::lock_guard<std::mutex> lk(mu_);
    auto key = std::make_pair(fs::absolute(*path).lexically_normal().string(), (int)kind);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
        const Entry& e = it->second;
        if (auto lib = e.lib.lock(); lib && e.size == (int64_t)st.st_size && e.mtime_ns == mtime_ns && e.inode == (uint64_t)st.st_ino)
            return lib;
    }
    auto lib = PluginLibrary::open(*path, kind);
    if (!lib) return lib.error();
    cache_[key] = Entry{*lib, (int64_t)st.st_size, mtime_ns, (uint64_t)st.st_ino};
    return lib;
}

}  // namespace steward
