// The engine's budget of speculative resends: see resend_budget.h.
#include "transport/resend_budget.h"

#include <algorithm>

namespace uroce::transport {

bool ResendBudget::take(std::chrono::steady_clock::time_point now) {
    std::lock_guard lock(mutex_);
    if (now > refilled_) {
        const auto periods = (now - refilled_) / kRefillEvery;
        if (periods >= burst_ || refilled_ == std::chrono::steady_clock::time_point{}) {
            tokens_ = burst_;
            refilled_ = now;
        } else if (periods > 0) {
            tokens_ = std::min<uint32_t>(burst_, tokens_ + static_cast<uint32_t>(periods));
            refilled_ += periods * kRefillEvery;
        }
    }
    if (tokens_ == 0) return false;
    --tokens_;
    return true;
}

}  // namespace uroce::transport
