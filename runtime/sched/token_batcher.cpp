#include "sched/token_batcher.h"

#include <utility>

namespace steward {

void TokenBatcher::add(uint64_t id) { runs_.try_emplace(id); }

// `from`'s tokens after `into`'s, each per-token list kept aligned with the tokens (a list one
// event lacks is filled with its "none": logprob 0, no top alternatives); `from`'s other fields win.
void TokenBatcher::append(EngineEvent& into, EngineEvent&& from) {
    const size_t n0 = into.tokens.size(), n1 = n0 + from.tokens.size();
    auto join = [&](auto& a, auto& b, auto none) {
        if (a.empty() && b.empty()) return;
        a.resize(n0, none);
        a.insert(a.end(), std::make_move_iterator(b.begin()), std::make_move_iterator(b.end()));
        a.resize(n1, none);
    };
    join(into.logprobs, from.logprobs, 0.0f);
    join(into.top_logprobs, from.top_logprobs, std::vector<TokenLogprob>{});
    join(into.token_t_s, from.token_t_s, 0.0);
    into.tokens.insert(into.tokens.end(), from.tokens.begin(), from.tokens.end());
    std::vector<int32_t> tokens = std::move(into.tokens);
    std::vector<float> logprobs = std::move(into.logprobs);
    std::vector<std::vector<TokenLogprob>> top = std::move(into.top_logprobs);
    std::vector<double> times = std::move(into.token_t_s);
    into = std::move(from);
    into.tokens = std::move(tokens);
    into.logprobs = std::move(logprobs);
    into.top_logprobs = std::move(top);
    into.token_t_s = std::move(times);
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
            if (h.holding) {
                append(h.ev, std::move(ev));
                out.push_back(std::move(h.ev));
            } else {
                out.push_back(std::move(ev));
            }
            runs_.erase(it);
            continue;
        }
        if (ev.tokens.empty()) continue;  // nothing to say yet (the executor drops these too)
        if (!h.first_sent) {              // the first tokens at once: the requester's TTFT
            h.first_sent = true;
            out.push_back(std::move(ev));
            continue;
        }
        if (h.holding) {
            append(h.ev, std::move(ev));
        } else {
            h.ev = std::move(ev);
            h.holding = true;
        }
    }
    // Held runs that reached a limit (including those this step did not touch).
    for (auto& [id, h] : runs_) {
        if (!h.holding) continue;
        const bool full = (int)h.ev.tokens.size() >= limits_.max_tokens;
        const bool old = !h.ev.token_t_s.empty() && t - h.ev.token_t_s.front() >= limits_.max_age_s;
        if (full || old) {
            out.push_back(std::move(h.ev));
            h.ev = EngineEvent{};
            h.holding = false;
        }
    }
    events.swap(out);
}

}  // namespace steward
