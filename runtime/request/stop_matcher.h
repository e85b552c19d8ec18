// Stop strings over streamed text: what may be handed to the caller now, and where the output ends.
// Text that could be the beginning of a stop string is held back until the next piece decides it,
// so a stop string split across tokens is never streamed; the stop string itself never is.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace steward {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops);

    struct Out {
        std::string emit;      // text the caller may have now
        bool stopped = false;  // a stop string matched: the output ends after `emit`
    };
    // After a stop, push gives nothing. The match: among stop strings wholly in the text so far, the
    // one that starts first (the longest at equal starts); the output ends where it starts.
    Out push(std::string_view piece);
    // The end of the output without a stop: whatever was held back.
    std::string flush();
    bool stopped() const { return stopped_; }
    bool active() const { return !stops_.empty(); }

private:
    std::vector<std::string> stops_;
    std::string pending_;  // received, not yet emitted
    bool stopped_ = false;
};

}  // namespace steward
