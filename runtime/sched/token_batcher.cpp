#include "sched/token_batcher.h"

#include <utility>

namespace steward {

void TokenBatcher::add(uint64_t id) { runs_.try_emplace(id); }

// Each per-token list kept aligned with the tokens: a list one event lacks is filled with its
// "none" (logprob 0, no top alternatives); `next`'s other fields are the merged event's.
void TokenBatcher::prepend(EngineEvent& held, EngineEvent& next) {
    const size_t n0 = held.tokens.size(), n1 = next.tokens.size();
    auto join = [&](auto& a, auto& b, auto none) {
        if (a.empty() && b.empty()) return;
        a.resize(n0, none);
        b.resize(n1, none);
        b.insert(b.begin(), std::make_move_iterator(a.begin()), std::make_move_iterator(a.end()));
    };
    join(held.logprobs, next.logprobs, 0.0f);
    join(held.top_logprobs, next.top_logprobs, std::vector<TokenLogprob>{});
    join(held.token_t_s, next.token_t_s, 0.0);
    next.tokens.insert(next.tokens.begin(), held.tokens.begin(), held.tokens.end());
    held = EngineEvent{};
}

void TokenBatcher::apply(std::vector<EngineEvent>& events, double t) {
    if (runs_.empty()) return;
    std::vector<EngineEvent> out;
    out.reserve(events.size());
    for (EngineEvent& ev : events) {
        auto it = runs_.find(ev.id);
        if (it == runs_.end()) {
            out.push_back(std::move(ev));
            continue;
        }
        Held& h = it->second;
        ev.token_t_s.assign(ev.tokens.size(), t);
        if (ev.finished) {
            prepend(h.ev, ev);
            out.push_back(std::move(ev));
            runs_.erase(it);
            continue;
        }
        if (ev.tokens.empty()) continue;  // nothing to say yet (the executor drops these too)
        if (!h.first_sent) {              // the first tokens at once: the requester's TTFT
            h.first_sent = true;
            out.push_back(std::move(ev));
            continue;
        }
        prepend(h.ev, ev);
        h.ev = std::move(ev);
    }
    // Held runs that reached a limit (including those this step did not touch).
    for (auto& [id, h] : runs_) {
        if (h.ev.tokens.empty()) continue;
        const bool full = (int)h.ev.tokens.size() >= limits_.max_tokens;
        const bool old = t - h.ev.token_t_s.front() >= limits_.max_age_s;
        if (full || old) {
            out.push_back(std::move(h.ev));
            h.ev = EngineEvent{};
        }
    }
    events.swap(out);
}

}  // namespace steward
