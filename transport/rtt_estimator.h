// The round-trip estimate behind an RC requester's adaptive retransmission timeout.
//
// The IBA's local ACK timeout (4.096 us * 2^timeout, 67 ms for the common `timeout` 14) is
// the longest a requester may wait for an acknowledgement before it counts a retry. NICs
// retransmit much sooner when they can measure the path ("adaptive retransmission"), and so
// does uroce: a loss that no NAK reveals (a lost last packet, a lost ACK) costs about one
// round trip plus margin instead of the whole timeout. The estimate is RFC 6298's smoothed
// mean and mean deviation; the timeout it gives is bounded below (timer granularity and the
// cross-core wake-ups of a busy host would otherwise fire it spuriously) and, by the caller,
// above by the QP's local ACK timeout.
#pragma once

#include <cstdint>

namespace uroce::transport {

class RttEstimator {
  public:
    // The shortest retransmission timeout the estimate gives: a wake-up across cores costs
    // ~60 us here with millisecond tails, and libevent's timers have millisecond resolution.
    static constexpr uint64_t kMinRtoUs = 1000;

    // A round trip measured on a packet sent once (Karn: never on a retransmitted one).
    void sample(uint64_t rtt_us);

    // The timeout before any round trip has been measured: the floor that holds after one.
    // RFC 6298's one second suits the Internet, not a RoCE fabric whose QP gives up after
    // 4.096 us * 2^timeout (67 ms for `timeout` 14). A guess that is too short costs a
    // spurious resend, never a retry (it backs off, and the first sample replaces it); one
    // that is too long is paid by every connection that loses its first packet or first ACK
    // (a 4 KiB ibv_rc_pingpong -n 200 under 5% loss whose first SEND and first ACK were
    // both lost: 4 + 8 ms of waiting, 111-236 us per iteration; with 1 + 2 ms, 66-72).
    static constexpr uint64_t kInitialRtoUs = kMinRtoUs;

    // The shortest wait before a tail-loss probe (probe_us()). A spurious probe costs one
    // packet, not a window, so it may come much sooner than the retransmission timeout.
    // 100 us made a 5%-loss 4 KiB ibv_rc_pingpong run 68-74 us per iteration against 92-99
    // with 200 us (2026-11-28), when 50 us drew up to 215 spurious probes in 5,000 iterations
    // of ib_send_lat. 50 us since 2026-12-07: that ping-pong 24.8-29.1 us per iteration
    // against 28.7-35.2 (6 alternating pairs), 2-9 probes in 5,000 iterations of
    // ib_send_lat against 0-5 with its latency unchanged, ib_write_bw under 1% loss unchanged;
    // ib_send_bw -q 4 -s 64 150-180 per 400,000 messages against 16-33, at the same rate.
    static constexpr uint64_t kMinProbeUs = 50;

    // Whether any round trip has been measured.
    bool measured() const { return measured_; }
    uint64_t smoothed_us() const { return srtt_us_; }
    uint64_t deviation_us() const { return rttvar_us_; }

    // srtt + 4 * rttvar, at least kMinRtoUs (kInitialRtoUs before any sample), shifted left
    // by `backoff` (each early timeout without progress doubles it), saturating at `cap_us`.
    uint64_t timeout_us(unsigned backoff, uint64_t cap_us) const;

    // When a requester that has heard nothing since it sent should resend its last packet
    // alone (a tail-loss probe): two smoothed round trips, at least kMinProbeUs. Only
    // meaningful once measured().
    uint64_t probe_us() const;

    // How long a requester's timer waits when the local ACK timeout is `deadline_us` away
    // and the adaptive timeout is `rto_us`: the adaptive one only if it falls in the first
    // half of that wait. Later, it would come just before the local ACK timeout's own resend
    // of the same packets (a `timeout` of 8, 1.05 ms, against the 1 ms floor) and only
    // double it.
    static uint64_t wait_us(uint64_t rto_us, uint64_t deadline_us);

  private:
    bool measured_ = false;
    uint64_t srtt_us_ = 0;
    uint64_t rttvar_us_ = 0;
};

}  // namespace uroce::transport
