// DecisionWorker: one thread, one call at a time, a budgeted wait for its end.
#include "plugin/decision_worker.h"

#include <chrono>

namespace steward {

void DecisionWorker::loop(std::shared_ptr<State> st) {
    std::unique_lock<std::mutex> lk(st->mu);
    for (;;) {
        st->cv.wait(lk, [&] { return st->has_job || st->stop; });
        if (!st->has_job) return;  // stopped while idle
        std::function<void()> job = std::move(st->job);
        lk.unlock();
        job();
        job = nullptr;  // what the call captured goes now (perhaps the plugin instance: destroy())
        lk.lock();
        st->has_job = false;
        st->cv.notify_all();
        if (st->stop) return;
    }
}

DecisionWorker::~DecisionWorker() {
    if (!thread_.joinable()) return;
    bool running;
    {
        std::lock_guard<std::mutex> lk(st_->mu);
        st_->stop = true;
        running = st_->has_job;
    }
    st_->cv.notify_all();
    if (running)
        thread_.detach();  // it holds st_ and the call's captures until the plugin returns
    else
        thread_.join();
}

bool DecisionWorker::busy() const {
    std::lock_guard<std::mutex> lk(st_->mu);
    return st_->has_job;
}

DecisionWorker::Result DecisionWorker::run(std::function<void()> call, double budget_ms) {
    std::unique_lock<std::mutex> lk(st_->mu);
    if (st_->has_job) return Result::BUSY;
    if (!thread_.joinable()) thread_ = std::thread(loop, st_);
    st_->job = std::move(call);
    st_->has_job = true;
    st_->cv.notify_all();
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(budget_ms);
    if (st_->cv.wait_until(lk, until, [&] { return !st_->has_job; })) return Result::DONE;
    return Result::TIMED_OUT;
}

}  // namespace steward
