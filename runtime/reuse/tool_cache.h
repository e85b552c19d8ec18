// Tool results as cached objects (docs/reuse.md): a tool declared cacheable (TTL, scope, key
// fields) has its results stored under (scope key, tool, canonical arguments) -> result, learned
// from the conversations Steward serves (a `tool` message answering a call) or put by a client
// (PUT /v1/tool_results). A lookup returns a fresh result with its age, never one of another scope.
// Plain C++, no actors; thread-safe (one mutex); time is passed in (seconds, any monotonic clock).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace steward::reuse {

// Who may see an entry. SESSION: the same tenant and session id; TENANT: the same tenant and the
// same caller labels (their canonical form); PUBLIC: every tenant (only where a tool is declared so).
enum class ToolScope { SESSION, TENANT, PUBLIC };
const char* tool_scope_name(ToolScope s);
std::optional<ToolScope> parse_tool_scope(const std::string& s);

// How one tool caches: declared per tool in a request's `tools` ({"type": "function", "function":
// {...}, "cache": {"ttl_s", "scope", "key"}}) or per tenant in the config.
struct ToolCachePolicy {
    std::string tool;                 // the function's name
    double ttl_s = 300;               // > 0: a result older than this is stale (never served)
    ToolScope scope = ToolScope::SESSION;
    std::vector<std::string> key;     // argument fields forming the key (top-level names); empty: all of them
};

// Who asks: the tenant (and its salt: keys of two tenants never meet even if their names were
// reused with another salt), the session id (SESSION scope; empty: none, nothing session-scoped is
// stored or found) and the caller's labels (TENANT scope).
struct ToolCaller {
    std::string tenant;
    uint64_t salt = 0;
    std::string session;
    std::vector<std::string> labels;
};

// The arguments' canonical JSON: `args` restricted to the policy's key fields (all when empty),
// object keys sorted at every depth, no whitespace. nullopt when args is not an object or a key
// field is missing (such a call is neither stored nor looked up).
std::optional<std::string> canonical_arguments(const nlohmann::json& args, const std::vector<std::string>& key);
// The entry's full key (scope, its owner, tool, canonical arguments) as one string; nullopt when
// the scope cannot be keyed (SESSION without a session id) or canonical_arguments refuses.
std::optional<std::string> tool_cache_key(const ToolCachePolicy& policy, const ToolCaller& caller, const nlohmann::json& args);

struct ToolCacheLimits {
    size_t max_entries = 65536;            // all scopes together; past it the least recently used goes
    size_t max_entries_per_tenant = 8192;  // a tenant's own (SESSION and TENANT) entries
    size_t max_result_bytes = 256u << 10;  // a larger result is not stored
};

struct ToolHit {
    std::string result;
    double age_s = 0;          // now - when it was stored
    ToolScope scope = ToolScope::SESSION;
};

class ToolResultCache {
public:
    explicit ToolResultCache(ToolCacheLimits limits = {}) : limits_(limits) {}

    // Stores `result` for the call (from a conversation or a PUT). An entry already holding the
    // same result keeps its first time (a client resending its history does not make an old result
    // look fresh); another result replaces it with `now`. False when not stored (unkeyable, too
    // large); a PUBLIC policy stores under the public scope, whoever calls.
    bool store(const ToolCachePolicy& policy, const ToolCaller& caller, const nlohmann::json& args,
               const std::string& result, double now);
    // A fresh result for the call, nullopt when none. A stored result older than the policy's
    // ttl_s is stale: removed, counted in stats().stale_refused, and not returned.
    // `stale` (optional): set to whether a stale result was refused by this lookup.
    std::optional<ToolHit> lookup(const ToolCachePolicy& policy, const ToolCaller& caller, const nlohmann::json& args,
                                  double now, bool* stale = nullptr);
    // Drops every entry of the session (end of a conversation).
    void end_session(const std::string& tenant, const std::string& session);

    struct Stats {
        uint64_t entries = 0, stores = 0, hits = 0, misses = 0, stale_refused = 0, evicted = 0;
    };
    Stats stats() const;

private:
    struct Entry {
        std::string key, tenant, session;  // tenant "" for PUBLIC
        std::string result;
        double stored_at = 0;
        ToolScope scope = ToolScope::SESSION;
    };
    void erase_locked(std::list<Entry>::iterator it);
    ToolCacheLimits limits_;
    mutable std::mutex mu_;
    std::list<Entry> lru_;  // most recently used first
    std::map<std::string, std::list<Entry>::iterator> by_key_;
    std::map<std::string, size_t> per_tenant_;
    Stats stats_;
};

}  // namespace steward::reuse
