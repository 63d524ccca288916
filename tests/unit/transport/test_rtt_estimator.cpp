// The round-trip estimate behind adaptive retransmission (transport/rtt_estimator.h).
#include <catch2/catch.hpp>

#include "transport/rtt_estimator.h"

using uroce::transport::RttEstimator;

TEST_CASE("RttEstimator: the first sample sets the mean and half of it as deviation", "[rtt]") {
    RttEstimator e;
    CHECK_FALSE(e.measured());
    e.sample(400);
    CHECK(e.measured());
    CHECK(e.smoothed_us() == 400);
    CHECK(e.deviation_us() == 200);
    // 400 + 4 * 200 = 1200 us.
    CHECK(e.timeout_us(0, 67000) == 1200);
}

TEST_CASE("RttEstimator: later samples move the mean by 1/8 and the deviation by 1/4", "[rtt]") {
    RttEstimator e;
    e.sample(800);  // srtt 800, rttvar 400
    e.sample(0);    // err 800: rttvar (3 * 400 + 800) / 4 = 500; srtt 7 * 800 / 8 = 700
    CHECK(e.smoothed_us() == 700);
    CHECK(e.deviation_us() == 500);
    for (int i = 0; i < 200; ++i) e.sample(100);
    CHECK(e.smoothed_us() <= 101);
    CHECK(e.smoothed_us() >= 100);
    CHECK(e.deviation_us() <= 1);
}

TEST_CASE("RttEstimator: the timeout has a floor, doubles per backoff and stops at the cap",
          "[rtt]") {
    RttEstimator e;
    for (int i = 0; i < 50; ++i) e.sample(50);  // a fast path: srtt + 4 rttvar is ~50 us
    CHECK(e.timeout_us(0, 67000) == RttEstimator::kMinRtoUs);
    CHECK(e.timeout_us(1, 67000) == 2 * RttEstimator::kMinRtoUs);
    CHECK(e.timeout_us(3, 67000) == 8 * RttEstimator::kMinRtoUs);
    CHECK(e.timeout_us(40, 67000) == 67000);  // no overflow, never past the cap
    CHECK(e.timeout_us(0, 500) == 500);       // a local ACK timeout below the floor wins
    RttEstimator slow;
    slow.sample(30000);  // 30 ms + 4 * 15 ms = 90 ms: the local ACK timeout is shorter
    CHECK(slow.timeout_us(0, 67000) == 67000);
}

TEST_CASE("RttEstimator: before any sample the timeout is the initial guess", "[rtt]") {
    RttEstimator e;
    CHECK(e.timeout_us(0, 67000) == RttEstimator::kInitialRtoUs);
    CHECK(e.timeout_us(1, 67000) == 2 * RttEstimator::kInitialRtoUs);
    CHECK(e.timeout_us(0, 500) == 500);  // a shorter local ACK timeout still wins
    // Well below the common local ACK timeout (67 ms), which it stands in for.
    CHECK(RttEstimator::kInitialRtoUs * 4 < 67000);
}

TEST_CASE("RttEstimator: a tail-loss probe waits two round trips, at least its floor", "[rtt]") {
    RttEstimator fast;
    fast.sample(20);
    CHECK(fast.probe_us() == RttEstimator::kMinProbeUs);
    RttEstimator slow;
    slow.sample(700);
    CHECK(slow.probe_us() == 1400);
    // Sooner than the retransmission timeout it comes before.
    CHECK(RttEstimator::kMinProbeUs < RttEstimator::kMinRtoUs);
    CHECK(slow.probe_us() < slow.timeout_us(0, 67000));
}

TEST_CASE("RttEstimator: an early resend waits only in the first half of the ACK timeout's wait",
          "[rtt]") {
    CHECK(RttEstimator::wait_us(1000, 67000) == 1000);
    CHECK(RttEstimator::wait_us(2000, 4000) == 2000);  // exactly half: still early
    CHECK(RttEstimator::wait_us(2000, 3999) == 3999);
    CHECK(RttEstimator::wait_us(1000, 1048) == 1048);  // `timeout` 8: the timeout's own resend
    CHECK(RttEstimator::wait_us(5000, 1000) == 1000);
    CHECK(RttEstimator::wait_us(1000, 0) == 0);  // the local ACK timeout is due now
}
