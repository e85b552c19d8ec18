// Tool results as cached objects: (scope owner, tool, canonical arguments) -> result, with a TTL
// checked at lookup and LRU bounds (docs/reuse.md). See tool_cache.h for the contract.
#include "reuse/tool_cache.h"

#include <cstdio>

#include "reuse/document_store.h"  // canonical_labels

namespace steward::reuse {

namespace {

constexpr char k_sep = '\x1f';  // between the key's parts

// A free-form part of a key (tenant, session, tool, labels) with the separator (and the escape
// itself) escaped, so that no two different part lists make one key.
std::string part(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '\\')
            out += "\\\\";
        else if (c == k_sep)
            out += "\\x1f";
        else
            out += c;
    }
    return out;
}

std::string hex(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
    return buf;
}

}  // namespace

const char* tool_scope_name(ToolScope s) {
    switch (s) {
        case ToolScope::SESSION: return "session";
        case ToolScope::TENANT: return "tenant";
        case ToolScope::PUBLIC: return "public";
    }
    return "session";
}

std::optional<ToolScope> parse_tool_scope(const std::string& s) {
    if (s == "session") return ToolScope::SESSION;
    if (s == "tenant") return ToolScope::TENANT;
    if (s == "public") return ToolScope::PUBLIC;
    return std::nullopt;
}

std::optional<std::string> canonical_arguments(const nlohmann::json& args, const std::vector<std::string>& key) {
    if (!args.is_object()) return std::nullopt;
    nlohmann::json picked = nlohmann::json::object();
    if (key.empty()) {
        picked = args;
    } else {
        for (const auto& k : key) {
            auto it = args.find(k);
            if (it == args.end()) return std::nullopt;
            picked[k] = *it;
        }
    }
    // nlohmann::json keeps objects in a std::map: keys come out sorted at every depth. No indent: no
    // whitespace. Invalid UTF-8 in a string is replaced rather than thrown.
    return picked.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<std::string> tool_cache_key(const ToolCachePolicy& policy, const ToolCaller& caller,
                                          const nlohmann::json& args) {
    std::string owner;
    switch (policy.scope) {
        case ToolScope::SESSION:
            if (caller.session.empty()) return std::nullopt;
            owner = part(caller.tenant) + k_sep + hex(caller.salt) + k_sep + part(caller.session);
            break;
        case ToolScope::TENANT:
            owner = part(caller.tenant) + k_sep + hex(caller.salt) + k_sep + part(canonical_labels(caller.labels));
            break;
        case ToolScope::PUBLIC: break;  // everyone's
    }
    auto canon = canonical_arguments(args, policy.key);
    if (!canon) return std::nullopt;
    return std::string(tool_scope_name(policy.scope)) + k_sep + owner + k_sep + part(policy.tool) + k_sep + *canon;
}

void ToolResultCache::erase_locked(std::list<Entry>::iterator it) {
    if (it->scope != ToolScope::PUBLIC) {
        auto t = per_tenant_.find(it->tenant);
        if (t != per_tenant_.end() && --t->second == 0) per_tenant_.erase(t);
    }
    by_key_.erase(it->key);
    lru_.erase(it);
}

bool ToolResultCache::store(const ToolCachePolicy& policy, const ToolCaller& caller, const nlohmann::json& args,
                            const std::string& result, double now) {
    if (result.size() > limits_.max_result_bytes) return false;
    auto key = tool_cache_key(policy, caller, args);
    if (!key) return false;
    const bool is_public = policy.scope == ToolScope::PUBLIC;
    if (!is_public && limits_.max_entries_per_tenant == 0) return false;
    if (limits_.max_entries == 0) return false;

    std::lock_guard<std::mutex> lock(mu_);
    stats_.stores++;
    if (auto found = by_key_.find(*key); found != by_key_.end()) {
        auto it = found->second;
        // The same result keeps its first time (a resent history does not refresh it); another one
        // replaces it as of now.
        if (it->result != result) {
            it->result = result;
            it->stored_at = now;
        }
        lru_.splice(lru_.begin(), lru_, it);
        return true;
    }
    Entry e;
    e.key = *key;
    e.tenant = is_public ? "" : caller.tenant;
    e.session = policy.scope == ToolScope::SESSION ? caller.session : "";
    e.result = result;
    e.stored_at = now;
    e.scope = policy.scope;
    lru_.push_front(std::move(e));
    by_key_[*key] = lru_.begin();
    if (!is_public) {
        // The tenant's own bound: its least recently used entries go first (never the new one).
        size_t& n = per_tenant_[caller.tenant];
        n++;
        for (auto it = std::prev(lru_.end()); n > limits_.max_entries_per_tenant && it != lru_.begin();) {
            auto prev = std::prev(it);
            if (it->scope != ToolScope::PUBLIC && it->tenant == caller.tenant) {
                erase_locked(it);  // n is a reference into per_tenant_, which keeps the entry while n > 0
                stats_.evicted++;
            }
            it = prev;
        }
    }
    // The global bound: the least recently used of all.
    while (lru_.size() > limits_.max_entries) {
        erase_locked(std::prev(lru_.end()));
        stats_.evicted++;
    }
    return true;
}

std::optional<ToolHit> ToolResultCache::lookup(const ToolCachePolicy& policy, const ToolCaller& caller,
                                               const nlohmann::json& args, double now, bool* stale) {
    if (stale) *stale = false;
    auto key = tool_cache_key(policy, caller, args);
    if (!key) return std::nullopt;  // an unkeyable call is not a lookup (nor a miss)
    std::lock_guard<std::mutex> lock(mu_);
    auto found = by_key_.find(*key);
    if (found == by_key_.end()) {
        stats_.misses++;
        return std::nullopt;
    }
    auto it = found->second;
    const double age = now - it->stored_at;
    if (policy.ttl_s <= 0 || age >= policy.ttl_s) {
        erase_locked(it);
        stats_.stale_refused++;
        if (stale) *stale = true;
        return std::nullopt;
    }
    stats_.hits++;
    lru_.splice(lru_.begin(), lru_, it);
    return ToolHit{it->result, age, it->scope};
}

void ToolResultCache::end_session(const std::string& tenant, const std::string& session) {
    if (session.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end();) {
        auto next = std::next(it);
        if (it->scope == ToolScope::SESSION && it->tenant == tenant && it->session == session) erase_locked(it);
        it = next;
    }
}

ToolResultCache::Stats ToolResultCache::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s = stats_;
    s.entries = lru_.size();
    return s;
}

}  // namespace steward::reuse
