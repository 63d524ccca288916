// The clock of the engine's deadlines and intervals: std::chrono::steady_clock, which is
// CLOCK_MONOTONIC under libstdc++ on Linux, the clock the timer queue's timerfd runs on, so
// that deadlines computed here and the timerfd agree. Never 0 on a running system (it counts
// from boot), which some callers use as "not set".
#pragma once

#include <chrono>
#include <cstdint>

namespace uroce::transport {

// Now, in nanoseconds of the steady clock.
inline int64_t steady_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace uroce::transport
