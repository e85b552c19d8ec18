// The thread a policy instance's decisions run on, so that a caller waits at most a time budget for a
// plugin: past it the caller takes the safe default and the call is abandoned (it keeps running, and
// keeps what it captured alive, until the plugin returns). Plain C++, no CAF.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace steward {

class DecisionWorker {
public:
    enum class Result {
        DONE,       // the call returned within the budget: its outputs may be read
        TIMED_OUT,  // the budget ran out: the call is abandoned, its outputs must not be read
        BUSY,       // an abandoned call is still running: nothing was called (one call at a time)
    };
    DecisionWorker() = default;
    // Joins the thread when it is idle; when an abandoned call is still running the thread is left to
    // finish it (it owns copies of everything the call uses) and exits after it.
    ~DecisionWorker();
    DecisionWorker(const DecisionWorker&) = delete;
    DecisionWorker& operator=(const DecisionWorker&) = delete;

    // Runs `call` on the worker thread (started on first use) and waits up to budget_ms for it.
    // `call` must own (capture by value) everything it touches: after TIMED_OUT the caller's stack is
    // gone while it runs. Callers must serialise run() (the policy instance's lock does).
    Result run(std::function<void()> call, double budget_ms);
    bool busy() const;  // an abandoned call is still running

private:
    struct State {
        mutable std::mutex mu;
        std::condition_variable cv;
        std::function<void()> job;  // set by run(), cleared by the thread once the call returned
        bool has_job = false, stop = false;
    };
    static void loop(std::shared_ptr<State> st);
    std::shared_ptr<State> st_ = std::make_shared<State>();
    std::thread thread_;
};

}  // namespace steward
