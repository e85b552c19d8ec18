// Holds the engines' forwards from a given call on until release(), through the process-wide
// set_forward_fault_hook: a test that needs a request mid-generation, admitted before another, or
// still running at some event gets it by construction, on any machine and under any load, instead
// of racing the executor. On destruction the gate opens and the hook is removed.
#pragma once
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <span>

#include "sched/engine.h"  // set_forward_fault_hook

namespace steward_test {

class ForwardGate {
public:
    // Calls 0 .. n_free - 1 run; every later one waits until release().
    explicit ForwardGate(int n_free) {
        steward::set_forward_fault_hook([s = s_, n_free](std::span<const uint64_t>) {
            if (s->n_calls++ < n_free) return;
            std::call_once(s->held_once, [&] { s->held.set_value(); });
            s->opened.wait();
        });
    }
    ~ForwardGate() {
        release();
        steward::set_forward_fault_hook({});
    }
    ForwardGate(const ForwardGate&) = delete;
    ForwardGate& operator=(const ForwardGate&) = delete;

    // Lets every held and later forward run. Idempotent.
    void release() {
        std::call_once(s_->open_once, [&] { s_->open.set_value(); });
    }
    // Waits (at most 60 s) until a forward is held at the gate; false if none came.
    bool wait_held() { return held_.wait_for(std::chrono::seconds(60)) == std::future_status::ready; }

private:
    struct State {
        std::atomic<int> n_calls{0};
        std::promise<void> open;
        std::shared_future<void> opened = open.get_future().share();
        std::once_flag open_once, held_once;
        std::promise<void> held;
    };
    std::shared_ptr<State> s_ = std::make_shared<State>();
    std::future<void> held_ = s_->held.get_future();
};

}  // namespace steward_test
