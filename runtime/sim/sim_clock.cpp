#include "sim/sim_clock.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

namespace steward {

namespace {
struct ClockState {
    double base_real = 0, base_sim = 0, dilation = 1;
};
double real_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// Each change publishes a new state; old ones are kept for good (a reader may hold one; changes
// are a handful per process), reachable from g_kept so leak checkers see no leak.
std::atomic<const ClockState*> g_state{new ClockState{}};
std::mutex g_set_mu;
std::vector<const ClockState*>* g_kept = new std::vector<const ClockState*>;
}  // namespace

double sim_now_s() {
    const ClockState* s = g_state.load(std::memory_order_acquire);
    return s->base_sim + (real_s() - s->base_real) * s->dilation;
}

double time_dilation() { return g_state.load(std::memory_order_acquire)->dilation; }

void set_time_dilation(double dilation) {
    if (!(dilation > 0)) return;
    std::lock_guard<std::mutex> lk(g_set_mu);
    if (g_state.load()->dilation == dilation) return;
    auto* s = new ClockState;
    s->base_real = real_s();
    s->base_sim = sim_now_s();
    s->dilation = dilation;
    g_kept->push_back(g_state.load());
    g_state.store(s, std::memory_order_release);
}

}  // namespace steward
