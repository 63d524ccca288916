#include "transport/spurious_resend.h"

#include <algorithm>

#include "transport/psn.h"

namespace uroce::transport {

namespace {

// An episode whose resent PSNs are this far behind the oldest unacknowledged one is over:
// its duplicates' ACKs came long ago, and a PSN that far back may soon be a new one again
// (24-bit PSNs).
constexpr int32_t kHorizonPackets = 1 << 22;

}  // namespace

void SpuriousResendCheck::on_timer_resend(uint32_t to, uint32_t una, uint64_t waited_us,
                                          Clock::time_point now) {
    if (armed_ && psn_before(una, to_)) {
        // The same stall: what was resent before is not all acknowledged yet.
        if (psn_after(to, to_)) to_ = to;
        return;
    }
    armed_ = true;
    to_ = to;
    // Clamped at 71 minutes: only a local ACK timeout of `timeout` 30 or 31 waits longer.
    waited_us_ = static_cast<uint32_t>(std::min<uint64_t>(waited_us, UINT32_MAX));
    resent_at_ = now;
    acked_ = false;
    window_before_ = 0;
}

void SpuriousResendCheck::on_window_cut(uint32_t window_before) {
    if (armed_ && window_before_ == 0) window_before_ = window_before;
}

void SpuriousResendCheck::on_progress(uint32_t una, Clock::time_point now) {
    if (!armed_) return;
    if (!acked_) {
        acked_ = true;
        acked_at_ = now;
    }
    if (psn_diff(una, to_) > kHorizonPackets) armed_ = false;
}

std::optional<SpuriousResendCheck::Verdict> SpuriousResendCheck::on_stale_ack(uint32_t psn,
                                                                              uint32_t una) {
    // Only the newest PSN resent: a responder takes packets in order, so one that had it
    // had every packet before it. A duplicate of an older one proves a part of the resend
    // needless, not the cut (the rest may have been lost).
    if (!armed_ || !acked_ || psn_add(psn, 1) != to_ || !psn_before(psn, una)) return {};
    armed_ = false;
    const auto late = std::chrono::duration_cast<std::chrono::microseconds>(acked_at_ - resent_at_);
    Verdict v;
    v.late_rtt_us = waited_us_ + static_cast<uint64_t>(late.count() > 0 ? late.count() : 0);
    v.window_before = window_before_;
    return v;
}

}  // namespace uroce::transport
