// The session -> pool table and what it tells a routing question.
#include "plugin/route.h"

#include <algorithm>

namespace steward {

void SessionPools::record(const std::string& key, const std::string& pool, int32_t n_tokens) {
    if (key.empty()) return;
    std::lock_guard<std::mutex> lk(mu_);
    by_key_[key] = {Place{pool, n_tokens}, ++serial_};
    if (by_key_.size() <= max_entries_) return;
    // Forget the older half: O(n) once per max_entries / 2 writes.
    const uint64_t cut = serial_ - max_entries_ / 2;
    for (auto it = by_key_.begin(); it != by_key_.end();) it = it->second.second <= cut ? by_key_.erase(it) : std::next(it);
}

std::optional<SessionPools::Place> SessionPools::find(const std::string& key) const {
    if (key.empty()) return std::nullopt;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return std::nullopt;
    return it->second.first;
}

size_t SessionPools::size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return by_key_.size();
}

void apply_session_place(RouteInput& in, const std::optional<SessionPools::Place>& place,
                         const std::vector<std::string>& pool_names) {
    in.session_pool = -1;
    if (!place) return;
    auto it = std::find(pool_names.begin(), pool_names.end(), place->pool);
    if (it == pool_names.end()) return;  // the pool left the config
    in.session_pool = (int32_t)(it - pool_names.begin());
    if (in.n_cached_prompt_tokens.size() < pool_names.size()) in.n_cached_prompt_tokens.resize(pool_names.size(), -1);
    int32_t& n = in.n_cached_prompt_tokens[in.session_pool];
    n = std::max(n, std::max(0, std::min(place->n_tokens, in.n_prompt_tokens - 1)));
}

}  // namespace steward
