// dlopen of policy plugins: private copies, entry point and version checks (older ABIs and tables
// accepted, newer functions gated on the table size), name resolution.
#include "plugin/plugin_loader.h"

#include "config/config.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
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
std::mutex g_copy_mu;  // the copies' directory is shared by the process's loads

// A private directory for the copies; each copy is unlinked right after dlopen (the mapping stays).
Expected<std::string> private_copy(const std::string& path, uint64_t serial) {
    std::lock_guard<std::mutex> lk(g_copy_mu);
    std::error_code ec;
    const fs::path dir = fs::temp_directory_path(ec) / ("steward-plugins-" + std::to_string(::getpid()));
    fs::create_directories(dir, ec);
    if (ec) return make_error("cannot create '", dir.string(), "' for plugin copies: ", ec.message(), "; check TMPDIR is writable");
    const fs::path dst = dir / (std::to_string(serial) + "-" + fs::path(path).filename().string());
    fs::copy_file(path, dst, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error("cannot copy plugin '", path, "' to '", dst.string(), "': ", ec.message());
    return dst.string();
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

PluginLibrary::~PluginLibrary() {
    if (handle_) ::dlclose(handle_);
}

Expected<std::shared_ptr<PluginLibrary>> PluginLibrary::open(const std::string& path, PolicyKind kind) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
        return make_error("plugin file '", path, "' does not exist; build it, or fix the path / [plugins] dirs in the config");
    const uint64_t serial = ++g_serial;
    auto copy = private_copy(path, serial);
    if (!copy) return copy.error();
    void* h = nullptr;
    std::string dl_err;
    {
        std::lock_guard<std::mutex> lk(g_copy_mu);
        ::dlerror();
        h = ::dlopen(copy->c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char* e = ::dlerror();
            dl_err = e ? e : "dlopen failed";
        }
        fs::remove(*copy, ec);
        fs::remove(fs::path(*copy).parent_path(), ec);  // only when empty
    }
    if (!h) {
        return make_error("cannot load plugin '", path, "': ", dl_err,
                          "; it must be a shared library built for this machine (see the README's plugin how-to)");
    }
    std::shared_ptr<PluginLibrary> lib(new PluginLibrary());
    lib->handle_ = h;  // closed by the destructor on every error path below
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
