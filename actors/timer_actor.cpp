// timer_actor: one per runtime. Keeps every request's deadlines in a DeadlineQueue and one delayed
// tick to itself for the earliest; a request that finishes takes its deadlines back, so the actor
// holds a request's handle only while the request runs.
#include <limits>

#include "actors/actors.hpp"
#include "sim/sim_clock.h"
#include "util/deadline_queue.h"

namespace steward {

namespace {

struct TimerEntry {
    RequestActor target;
    TimerKind kind;
    uint64_t arg;
};

struct timer_state {
    DeadlineQueue<TimerEntry> queue;
    double tick_s = std::numeric_limits<double>::infinity();  // the earliest tick outstanding
    static inline const char* name = "timers";
};

using timer_ptr = TimerActor::stateful_pointer<timer_state>;

void schedule(timer_ptr self) {
    auto next = self->state.queue.next_s();
    if (!next || *next >= self->state.tick_s) return;
    self->state.tick_s = *next;
    const double wait_s = std::max(0.0, *next - now_s()) / time_dilation();  // real seconds (sim/sim_clock.h)
    self->delayed_send(self, std::chrono::microseconds((int64_t)(wait_s * 1e6) + 1), timer_tick_atom::value);
}

// `name`: see cache_actor (CAF 0.17 and function actors without arguments).
TimerActor::behavior_type timer_actor(timer_ptr self, std::string name) {
    (void)name;
    return {
        [=](timer_add_atom, uint64_t owner, double at_s, const RequestActor& target, int32_t kind, uint64_t arg) {
            self->state.queue.add(owner, at_s, TimerEntry{target, (TimerKind)kind, arg});
            schedule(self);
        },
        [=](timer_cancel_atom, uint64_t owner) { self->state.queue.cancel_owner(owner); },
        [=](timer_tick_atom) {
            const double now = now_s();
            if (now >= self->state.tick_s) self->state.tick_s = std::numeric_limits<double>::infinity();
            for (auto& [owner, e] : self->state.queue.pop_due(now)) {
                if (e.kind == TimerKind::request)
                    self->send(e.target, req_deadline_atom::value);
                else
                    self->send(e.target, deadline_atom::value, e.arg);
            }
            schedule(self);
        },
    };
}

}  // namespace

TimerActor spawn_timer(caf::actor_system& sys) { return sys.spawn(timer_actor, std::string("timers")); }

}  // namespace steward
