// The engine thread's spin after a batch (spin_period.h): long once a wake-up finds a
// stream's datagrams waiting, halved by each wake-up that finds one or two, never below the
// short period nor above the long one, and left alone by the wake-ups in between.
#include <catch2/catch.hpp>

#include "transport/spin_period.h"

using namespace uroce::transport;

TEST_CASE("SpinPeriod: short until a wake-up finds a stream's datagrams waiting", "[spin_period]") {
    SpinPeriod s;
    CHECK(s.nanos() == SpinPeriod::kShortNanos);
    s.on_wake(SpinPeriod::kStreamDatagrams - 1);
    CHECK(s.nanos() == SpinPeriod::kShortNanos);
    s.on_wake(SpinPeriod::kStreamDatagrams);
    CHECK(s.nanos() == SpinPeriod::kLongNanos);
    s.on_wake(500);  // never above the long period
    CHECK(s.nanos() == SpinPeriod::kLongNanos);
}

TEST_CASE("SpinPeriod: each sparse wake-up halves it, down to the short period", "[spin_period]") {
    SpinPeriod s;
    s.on_wake(64);
    REQUIRE(s.nanos() == SpinPeriod::kLongNanos);
    // Between sparse and stream: no verdict, the period stays.
    s.on_wake(SpinPeriod::kSparseDatagrams + 1);
    CHECK(s.nanos() == SpinPeriod::kLongNanos);
    s.on_wake(SpinPeriod::kSparseDatagrams);
    CHECK(s.nanos() == SpinPeriod::kLongNanos / 2);
    s.on_wake(0);  // woken for nothing (a poller read it first): sparse too
    CHECK(s.nanos() == SpinPeriod::kLongNanos / 4);
    for (int i = 0; i < 10; ++i) s.on_wake(1);
    CHECK(s.nanos() == SpinPeriod::kShortNanos);
    // A stream again: long at once, not step by step (each step would be a wake-up).
    s.on_wake(SpinPeriod::kStreamDatagrams);
    CHECK(s.nanos() == SpinPeriod::kLongNanos);
}

TEST_CASE("SpinPeriod: a long spin that mostly waits halves, one that mostly reads stays long",
          "[spin_period]") {
    SpinPeriod s;
    s.on_wake(SpinPeriod::kStreamDatagrams);
    REQUIRE(s.nanos() == SpinPeriod::kLongNanos);
    // A stream that keeps the thread reading 80% of each 200 us turn: long throughout, and a
    // pause of a turn or two (idle the whole turn) does not undo it.
    for (int i = 0; i < 50; ++i) s.on_turn(40'000, 200'000);
    CHECK(s.nanos() == SpinPeriod::kLongNanos);
    s.on_turn(200'000, 200'000);
    s.on_turn(200'000, 200'000);
    CHECK(s.nanos() == SpinPeriod::kLongNanos);
    // A paced stream: 10% reading. The running average falls below the floor within a few
    // turns, and each turn then halves the spin, down to the short period.
    int turns = 0;
    while (s.nanos() == SpinPeriod::kLongNanos && turns < 50) {
        s.on_turn(180'000, 200'000);
        ++turns;
    }
    CHECK(turns > 1);  // an average, not one turn's verdict
    CHECK(turns < 20);
    for (int i = 0; i < 20; ++i) s.on_turn(180'000, 200'000);
    CHECK(s.nanos() == SpinPeriod::kShortNanos);
    // A turn of no length says nothing; the short spin has nothing to halve.
    s.on_turn(0, 0);
    CHECK(s.nanos() == SpinPeriod::kShortNanos);
}
