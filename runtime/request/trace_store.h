// The decision traces of the last N requests (GET /admin/requests/{id}): each a JSON object the
// request path fills as it goes (route, admission, runs, finish). Bounded: the oldest is dropped
// past the capacity. Thread-safe.
#pragma once
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

namespace steward {

class TraceStore {
public:
    explicit TraceStore(size_t capacity = 1024) : capacity_(capacity) {}
    void set_capacity(size_t n);
    // Replaces request id's trace (a newer state of it), or adds it (dropping the oldest past capacity).
    void put(uint64_t id, const std::string& tenant, nlohmann::ordered_json trace);
    // The trace as JSON text; "" when unknown (or dropped) or when `tenant` is not the request's.
    std::string json(uint64_t id, const std::string& tenant) const;
    size_t size() const;

private:
    struct Entry {
        std::string tenant;
        nlohmann::ordered_json trace;
    };
    size_t capacity_;
    mutable std::mutex mu_;
    std::deque<uint64_t> order_;  // insertion order, oldest first
    std::unordered_map<uint64_t, Entry> by_id_;
};

}  // namespace steward
