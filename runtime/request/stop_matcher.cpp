// StopMatcher: search the held-back text for whole stop strings; otherwise keep back its longest
// suffix that is a prefix of some stop string.
#include "request/stop_matcher.h"

#include <algorithm>

namespace steward {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (auto& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Out StopMatcher::push(std::string_view piece) {
    Out out;
    if (stopped_) return out;
    pending_.append(piece);
    if (stops_.empty()) {
        out.emit = std::move(pending_);
        pending_.clear();
        return out;
    }
    size_t best = std::string::npos;
    for (const std::string& s : stops_) best = std::min(best, pending_.find(s));
    if (best != std::string::npos) {
        out.emit = pending_.substr(0, best);
        out.stopped = stopped_ = true;
        pending_.clear();
        return out;
    }
    // Held back: the longest suffix of pending_ that a stop string begins with (shorter than it:
    // a whole one would have matched above).
    size_t keep = 0;
    for (const std::string& s : stops_) {
        for (size_t n = std::min(s.size() - 1, pending_.size()); n > keep; n--)
            if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
                keep = n;
                break;
            }
    }
    out.emit = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
}

std::string StopMatcher::flush() {
    if (stopped_) return "";
    std::string rest = std::move(pending_);
    pending_.clear();
    return rest;
}

}  // namespace steward
