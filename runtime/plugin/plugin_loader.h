// The plugin loader: finds a policy plugin by name in the configured directories (or takes a path),
// dlopens a private copy of the file, checks the entry point, ABI version, kind and table, and keeps
// each loaded library alive for as long as an instance uses it.
#pragma once
#include <steward/expected.h>
#include <steward/policy.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace steward {

enum class PolicyKind { ROUTING = STEWARD_POLICY_ROUTING, EVICTION = STEWARD_POLICY_EVICTION, SPECULATION = STEWARD_POLICY_SPECULATION };
const char* policy_kind_name(PolicyKind k);  // "routing", "eviction", "speculation"

// One loaded plugin library. The file is copied into the process's private directory (mkdtemp, 0700)
// with O_EXCL|O_NOFOLLOW, checked through its descriptor and dlopened as /proc/self/fd/<fd>, so the
// dynamic loader never hands back an older mapping of the same path, rebuilding the file on disk never
// changes code that is running, and no other user can plant or swap what is loaded. dlclose on
// destruction (after the last instance).
class PluginLibrary {
public:
    ~PluginLibrary();
    PluginLibrary(const PluginLibrary&) = delete;
    PluginLibrary& operator=(const PluginLibrary&) = delete;

    // Loads `path` as a plugin of `kind`. Errors name the file, the problem and the fix: not found, not a
    // regular file (a FIFO or directory is refused without blocking), the private copy unsafe,
    // not a shared library, no steward_plugin_entry, entry returned NULL, an ABI version outside
    // [STEWARD_POLICY_ABI_VERSION_MIN, STEWARD_POLICY_ABI_VERSION], kind mismatch, table missing / of a
    // newer version / smaller than a version 1 table / missing a required function.
    static Expected<std::shared_ptr<PluginLibrary>> open(const std::string& path, PolicyKind kind);
    // Loads the already checked copy open at `fd` (a plugin host gets the server's copy this way), with
    // the checks of open() after dlopen; takes `fd` over (closed with the library, or on error). `path`
    // names the plugin in messages.
    static Expected<std::shared_ptr<PluginLibrary>> open_fd(int fd, const std::string& path, PolicyKind kind);

    const std::string& path() const { return path_; }
    PolicyKind kind() const { return kind_; }
    const steward_plugin& info() const { return *info_; }
    std::string name() const { return info_->name ? info_->name : ""; }
    uint32_t abi_version() const { return info_->abi_version; }
    // The plugin's table as this host reads it: a copy in which every function past the plugin's
    // table size (an older header) is NULL. Only the one of the library's kind is filled.
    const steward_routing_table* routing() const { return &routing_; }
    const steward_eviction_table* eviction() const { return &eviction_; }
    const steward_speculation_table* speculation() const { return &speculation_; }
    uint64_t load_serial() const { return serial_; }  // distinct per load: tells a reloaded copy apart
    int copy_fd() const { return copy_fd_; }  // the checked private copy (O_CLOEXEC), for a plugin host

private:
    PluginLibrary() = default;
    // The checks after dlopen (entry point, versions, kind, table); owns h and copy_fd from here.
    static Expected<std::shared_ptr<PluginLibrary>> adopt(void* h, int copy_fd, const std::string& path, PolicyKind kind,
                                                          uint64_t serial);
    std::string path_;
    PolicyKind kind_ = PolicyKind::ROUTING;
    void* handle_ = nullptr;
    int copy_fd_ = -1;  // the checked private copy, loaded as /proc/self/fd/<copy_fd_>
    const steward_plugin* info_ = nullptr;
    uint64_t serial_ = 0;
    steward_routing_table routing_{};
    steward_eviction_table eviction_{};
    steward_speculation_table speculation_{};
};

// Resolves plugin names and caches loaded libraries by resolved path. A file whose size, mtime or
// inode changed since it was loaded is loaded afresh (the old copy stays loaded while instances hold
// it). Thread-safe.
class PluginLoader {
public:
    // Built-in search directories after the configured ones: $STEWARD_PLUGIN_PATH (colon separated),
    // <dir of the running executable>/plugins, <dir of the executable>/../lib/steward/plugins and the
    // install prefix's lib/steward/plugins.
    static std::vector<std::string> default_dirs();

    // `plugin` is a path when it contains '/' or ends in ".so"; otherwise a name searched in `dirs`
    // then default_dirs() as steward_<kind>_<name>.so, <name>.so, lib<name>.so.
    Expected<std::string> resolve(const std::string& plugin, PolicyKind kind, const std::vector<std::string>& dirs) const;
    Expected<std::shared_ptr<PluginLibrary>> load(const std::string& plugin, PolicyKind kind,
                                                  const std::vector<std::string>& dirs);

private:
    struct Entry {
        std::weak_ptr<PluginLibrary> lib;
        int64_t size = -1, mtime_ns = -1;
        uint64_t inode = 0;
    };
    std::mutex mu_;
    std::map<std::pair<std::string, int>, Entry> cache_;
};

}  // namespace steward

namespace steward {
// The private directory plugin copies go to ("" before the first load). For tests and diagnostics.
std::string plugin_copy_dir();
}  // namespace steward
