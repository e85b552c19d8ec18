// TraceStore: a map by request id and the insertion order, trimmed to the capacity.
#include "request/trace_store.h"

namespace steward {

void TraceStore::set_capacity(size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    capacity_ = n;
    while (order_.size() > capacity_) {
        by_id_.erase(order_.front());
        order_.pop_front();
    }
}

void TraceStore::put(uint64_t id, const std::string& tenant, nlohmann::ordered_json trace) {
    std::lock_guard<std::mutex> lk(mu_);
    if (capacity_ == 0) return;
    auto it = by_id_.find(id);
    if (it != by_id_.end()) {
        it->second.trace = std::move(trace);
        return;
    }
    by_id_.emplace(id, Entry{tenant, std::move(trace)});
    order_.push_back(id);
    while (order_.size() > capacity_) {
        by_id_.erase(order_.front());
        order_.pop_front();
    }
}

std::string TraceStore::json(uint64_t id, const std::string& tenant) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end() || it->second.tenant != tenant) return "";
    return it->second.trace.dump();
}

size_t TraceStore::size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return by_id_.size();
}

}  // namespace steward
