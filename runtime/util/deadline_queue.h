// Deadlines by owner: entries (a time and a payload) that fire in time order, and that their owner
// can take back all at once. The timer actor keeps one for every request, so that a request that
// finished before its deadline is forgotten at once: a timer message delayed to the request itself
// would hold the finished actor alive until the deadline (two minutes by default), and memory would
// grow with the request rate times the timeout.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace steward {

template <class Payload>
class DeadlineQueue {
public:
    void add(uint64_t owner, double at_s, Payload p) {
        const Key k{at_s, next_seq_++};
        entries_.emplace(k, Entry{owner, std::move(p)});
        by_owner_[owner].push_back(k);
    }

    // Every entry of `owner` that has not fired yet; returns how many.
    size_t cancel_owner(uint64_t owner) {
        auto it = by_owner_.find(owner);
        if (it == by_owner_.end()) return 0;
        size_t n = 0;
        for (const Key& k : it->second) n += entries_.erase(k);
        by_owner_.erase(it);
        return n;
    }

    // The entries due at `now_s`, earliest first, removed from the queue.
    std::vector<std::pair<uint64_t, Payload>> pop_due(double now_s) {
        std::vector<std::pair<uint64_t, Payload>> out;
        while (!entries_.empty() && entries_.begin()->first.at_s <= now_s) {
            auto it = entries_.begin();
            const Key k = it->first;
            const uint64_t owner = it->second.owner;
            out.emplace_back(owner, std::move(it->second.payload));
            entries_.erase(it);
            auto o = by_owner_.find(owner);
            auto& keys = o->second;
            for (size_t i = 0; i < keys.size(); i++)
                if (keys[i].seq == k.seq) {
                    keys[i] = keys.back();
                    keys.pop_back();
                    break;
                }
            if (keys.empty()) by_owner_.erase(o);
        }
        return out;
    }

    std::optional<double> next_s() const {
        if (entries_.empty()) return std::nullopt;
        return entries_.begin()->first.at_s;
    }
    size_t size() const { return entries_.size(); }
    size_t n_owners() const { return by_owner_.size(); }

private:
    struct Key {
        double at_s;
        uint64_t seq;  // insertion order among equal times
        bool operator<(const Key& o) const { return at_s != o.at_s ? at_s < o.at_s : seq < o.seq; }
    };
    struct Entry {
        uint64_t owner;
        Payload payload;
    };
    std::map<Key, Entry> entries_;
    std::unordered_map<uint64_t, std::vector<Key>> by_owner_;
    uint64_t next_seq_ = 0;
};

}  // namespace steward
