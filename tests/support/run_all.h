// Submits every request at once through a Runtime and waits for all results (in submission order).
#pragma once
#include <mutex>
#include <vector>

#include <steward/runtime.h>

namespace steward_test {

inline std::vector<steward::GenerationResult> run_all(steward::Runtime& r,
                                                      const std::vector<steward::GenerationRequest>& reqs) {
    std::vector<steward::GenerationResult> out(reqs.size());
    std::mutex mu;
    for (size_t i = 0; i < reqs.size(); i++) {
        steward::RequestCallbacks cb;
        cb.on_finish = [&, i](const steward::GenerationResult& res) {
            std::lock_guard<std::mutex> lk(mu);
            out[i] = res;
        };
        r.submit(reqs[i], std::move(cb));
    }
    r.drain();
    return out;
}

}  // namespace steward_test
