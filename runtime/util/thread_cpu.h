// The calling thread's CPU time: what it ran, not the wall time it waited or was not scheduled.
#pragma once
#include <ctime>

namespace steward {

// Seconds of CPU time the calling thread has used; 0 where the clock is missing.
inline double thread_cpu_seconds() {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

}  // namespace steward
