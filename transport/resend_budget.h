// How many speculative resends (adaptive early resends, tail-loss probes) one engine may send,
// across all its QPs.
//
// Each QP's adaptive timer assumes its path is idle. When thousands of QPs send at once, the
// peer's socket overflows, every QP times out together, and their early resends (1 ms after
// a first send, then 2, 4, ...; 4, 8, 16 when this was written) arrive as another burst that
// overflows it again: the fabric carries mostly duplicates and QPs run out of retries (20,000 QPs
// in one process did). A token bucket bounds the speculative traffic: a QP whose timer fires when
// the bucket is empty skips its early resend (it backs off as if it had sent one) and is left to
// the next timeout, ultimately to the IBA's local ACK timeout, which is never held back. One QP, or
// a few, recovering from loss never meets the limit.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace uroce::transport {

class ResendBudget {
  public:
    // Resends allowed at once (by default), and the rate at which the allowance comes back.
    static constexpr uint32_t kBurst = 64;
    static constexpr std::chrono::microseconds kRefillEvery{100};  // 10 per millisecond

    explicit ResendBudget(uint32_t burst = kBurst) : burst_(burst), tokens_(burst) {}

    // Takes one resend from the budget: false (nothing taken) when it is used up.
    bool take(std::chrono::steady_clock::time_point now);

  private:
    std::mutex mutex_;  // timers fire on the engine thread and on polling threads
    const uint32_t burst_;
    uint32_t tokens_;
    std::chrono::steady_clock::time_point refilled_{};
};

}  // namespace uroce::transport
