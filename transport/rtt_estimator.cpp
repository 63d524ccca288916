#include "transport/rtt_estimator.h"

#include <algorithm>

namespace uroce::transport {

void RttEstimator::sample(uint64_t rtt_us) {
    if (!measured_) {
        measured_ = true;
        srtt_us_ = rtt_us;
        rttvar_us_ = rtt_us / 2;
        return;
    }
    // RFC 6298 2.3 with alpha = 1/8, beta = 1/4.
    const uint64_t err = srtt_us_ > rtt_us ? srtt_us_ - rtt_us : rtt_us - srtt_us_;
    rttvar_us_ = (3 * rttvar_us_ + err) / 4;
    srtt_us_ = (7 * srtt_us_ + rtt_us) / 8;
}

uint64_t RttEstimator::timeout_us(unsigned backoff, uint64_t cap_us) const {
    uint64_t rto = measured_ ? std::max(kMinRtoUs, srtt_us_ + 4 * rttvar_us_) : kInitialRtoUs;
    for (unsigned i = 0; i < backoff && rto < cap_us; ++i) rto *= 2;
    return std::min(rto, cap_us);
}

uint64_t RttEstimator::probe_us() const {
    return std::max(kMinProbeUs, 2 * srtt_us_);
}

uint64_t RttEstimator::wait_us(uint64_t rto_us, uint64_t deadline_us) {
    return rto_us <= deadline_us / 2 ? rto_us : deadline_us;
}

}  // namespace uroce::transport
