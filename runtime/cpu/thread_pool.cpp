// Chunked fork-join: publish a job, take chunks from an atomic counter, wait only for chunks in
// progress. Workers spin briefly for the next job (decode issues ~100 jobs per token), then sleep
// on a condition variable.
#include "cpu/thread_pool.h"

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define STEWARD_PAUSE() _mm_pause()
#else
#define STEWARD_PAUSE() std::this_thread::yield()
#endif

namespace steward {

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < n_threads; i++) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    publish();
    for (auto& t : workers_) t.join();
}

void ThreadPool::publish() {
    seq_.fetch_add(1);
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lk(mu_);
        cv_.notify_all();
    }
}

void ThreadPool::run_chunks(Job& j) {
    for (;;) {
        const int64_t c = j.next.fetch_add(1);
        if (c >= j.n_chunks) return;
        (*j.fn)(c);
        j.done.fetch_add(1);
    }
}

void ThreadPool::worker_loop() {
    // Start from 0, not from the current value: a worker that starts late (after jobs or even
    // after shutdown were published) must still see them.
    uint64_t seen = 0;
    for (;;) {
        // Spin a little (the next job usually follows within microseconds), then sleep.
        const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
        uint64_t s;
        int n = 0;
        while ((s = seq_.load()) == seen && !stop_.load()) {
            STEWARD_PAUSE();
            if ((++n & 255) == 0 && std::chrono::steady_clock::now() > spin_until) {
                // Announce the sleep, then re-check under the lock: publish() bumps seq_ before it
                // reads sleepers_, so either we see the new seq_ or it sees us and notifies.
                std::unique_lock<std::mutex> lk(mu_);
                sleepers_.fetch_add(1);
                cv_.wait(lk, [&] { return seq_.load() != seen || stop_.load(); });
                sleepers_.fetch_sub(1);
            }
        }
        seen = s;
        if (stop_.load()) return;
        active_.fetch_add(1);
        // Loaded after announcing ourselves: the caller clears job_ before waiting for active_ == 0,
        // so either we see nullptr or the caller waits for us.
        Job* j = job_.load();
        if (j) run_chunks(*j);
        active_.fetch_sub(1);
    }
}

void ThreadPool::parallel_for(int64_t n_chunks, const std::function<void(int64_t)>& fn) {
    if (n_chunks <= 0) return;
    if (workers_.empty() || n_chunks == 1) {
        for (int64_t c = 0; c < n_chunks; c++) fn(c);
        return;
    }
    Job j;
    j.fn = &fn;
    j.n_chunks = n_chunks;
    job_.store(&j);
    publish();
    run_chunks(j);
    int n = 0;
    while (j.done.load() < n_chunks) {  // only chunks already taken remain
        STEWARD_PAUSE();
        if ((++n & 1023) == 0) std::this_thread::yield();
    }
    job_.store(nullptr);
    while (active_.load() != 0) {  // a late worker may still hold &j for an instant
        STEWARD_PAUSE();
        if ((++n & 1023) == 0) std::this_thread::yield();
    }
}

}  // namespace steward
