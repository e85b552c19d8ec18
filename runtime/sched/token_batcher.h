// TokenBatcher: holds back the token events of runs whose requester reads the tokens only at the
// end (EngineRequest::batch_tokens: no streaming callback, no stop strings, no cascade check), so
// that such a run costs its requester one message every max_tokens tokens instead of one a step.
// A run's first tokens and its end go at once; the tokens in between are merged into one event,
// each keeping the time of the step that made it (EngineEvent::token_t_s), and go when max_tokens
// have gathered or the oldest is max_age_s old. Plain C++: the executor actor applies it to each
// step's events (docs/architecture.md, "One request").
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "sched/engine.h"

namespace steward {

class TokenBatcher {
public:
    struct Limits {
        int max_tokens = 16;     // a held run's tokens go once this many have gathered
        double max_age_s = 0.05; // or once the oldest held token is this old
    };
    TokenBatcher() = default;
    explicit TokenBatcher(Limits l) : limits_(l) {}

    // A run whose events may be held; runs never added pass through unchanged.
    void add(uint64_t id);
    bool tracks(uint64_t id) const { return runs_.count(id) != 0; }
    size_t n_tracked() const { return runs_.size(); }

    // One step's events, ended at t: every event of a tracked run gets token_t_s (t per token);
    // its first tokens and its end pass (the end with everything held before it, in order), other
    // tokens are held, and a run's held tokens come out as one event when the limits say so.
    // Events of untracked runs pass as they are, in their order; an end forgets its run.
    void apply(std::vector<EngineEvent>& events, double t);

private:
    struct Held {
        bool first_sent = false;
        EngineEvent ev;  // the held tokens (none: nothing held), with the latest event's other fields
    };
    // `next` with `held`'s tokens before its own; `held` is left empty.
    static void prepend(EngineEvent& held, EngineEvent& next);
    Limits limits_;
    std::unordered_map<uint64_t, Held> runs_;
};

}  // namespace steward
