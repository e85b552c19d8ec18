// A small fork-join pool for the forward pass. Work is split into chunks that participants take
// from a shared counter, so the caller never waits for a worker that has not been scheduled: on a
// busy machine (other processes, actor threads) the caller simply does more chunks itself. A
// classic OpenMP barrier instead waits for every team thread, which can cost a scheduler time
// slice per parallel region when cores are oversubscribed.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace steward {

class ThreadPool {
public:
    // n_threads participants including the caller (so n_threads - 1 workers); <= 1: no workers.
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int n_threads() const { return (int)workers_.size() + 1; }
    // Calls fn(chunk) for every chunk in [0, n_chunks), on the caller and the workers; returns
    // when all are done. One parallel_for at a time per pool (the owner's thread).
    void parallel_for(int64_t n_chunks, const std::function<void(int64_t)>& fn);

private:
    struct Job {
        const std::function<void(int64_t)>* fn;
        int64_t n_chunks;
        std::atomic<int64_t> next{0};
        std::atomic<int64_t> done{0};
    };
    void worker_loop();
    void publish();  // bumps seq_ and wakes sleeping workers
    static void run_chunks(Job& j);

    std::vector<std::thread> workers_;
    std::atomic<Job*> job_{nullptr};
    std::atomic<uint64_t> seq_{0};     // bumped per job (and at shutdown); workers wait on it
    std::atomic<int> sleepers_{0};     // workers blocked on cv_ (so publishing skips the lock otherwise)
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<int> active_{0};       // workers currently looking at a job
    std::atomic<bool> stop_{false};
};

}  // namespace steward
