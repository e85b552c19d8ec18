// The runtime's one clock, dilated for simulated pools: sim_now_s() runs `dilation` simulated
// seconds per real second (1 without [sim]), so latencies, deadlines and `steward run`'s arrival
// times all read simulated time, and a simulated step sleeps its cost / dilation in real time.
// Changing the dilation rebases the clock: it stays monotonic. Thread-safe.
#pragma once

namespace steward {

// Seconds on the dilated clock (steady_clock based; only differences mean anything).
double sim_now_s();
double time_dilation();
void set_time_dilation(double dilation);  // > 0

}  // namespace steward
