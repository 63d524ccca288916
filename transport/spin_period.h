// How long the engine thread reads on after a batch before it sleeps (Engine::
// spin_after_batch): short by default, long while a peer streams and the thread's wake-ups
// come late.
//
// Each sleep costs a wake-up, and on a small host the wake-up can cost milliseconds: the
// kernel wakes the engine thread on the CPU of the thread whose send woke it, often an
// application thread that spins there (perftest's client), and may leave it queued behind
// that thread while the other CPU idles (docs/performance-log.md, 2026-12-07). A stream's
// sender pauses now and then for longer than the short spin (its own timers, a moment off
// the CPU), and each pause put the receiver to sleep. So the first batch read after a
// wake-up says which kind of wake-up it was, in datagrams (a GSO train that came whole is
// one): many waiting means the peer went on sending while the thread slept or waited for a
// CPU, and the spin grows to kLongNanos at once; a datagram or two is a request, an answer
// or one train of a paced stream, and each such wake-up halves the spin, down to
// kShortNanos. A long spin that mostly waits (a stream paced a few hundred microseconds
// apart, which it would spin through without a wake-up to tell) halves too: spinning
// through such gaps tripled the passive side's CPU for nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace uroce::transport {

class SpinPeriod {
  public:
    static constexpr int64_t kShortNanos = 30'000;    // request and answer
    static constexpr int64_t kLongNanos = 1'000'000;  // a stream, woken late
    // Datagrams a wake-up's first batch must find to count as late in a stream: more than
    // the trains one send carries (ib_write_bw sends about 7 per sendmmsg), or as many
    // single-packet requests (ib_read_bw -s 2 keeps 128 outstanding).
    static constexpr size_t kStreamDatagrams = 8;
    // At most this many: request and answer, or one train of a paced stream.
    static constexpr size_t kSparseDatagrams = 2;

    // Below this share of its time reading packets (in thousandths, a running average over
    // the spin's turns), a long spin halves.
    static constexpr int64_t kBusyFloorPermille = 200;

    // The spin now: how long the thread reads on after the last packet before it sleeps.
    int64_t nanos() const { return nanos_; }

    // The thread slept, was woken, and its first batch read `datagrams`.
    void on_wake(size_t datagrams) {
        if (datagrams >= kStreamDatagrams) {
            nanos_ = kLongNanos;
            busy_permille_ = 1000;
        } else if (datagrams <= kSparseDatagrams) {
            halve();
        }
    }

    // A turn of the spin ended (at the loop's cap, or idle): of its `total_ns`, `idle_ns`
    // went in reads that found nothing.
    void on_turn(int64_t idle_ns, int64_t total_ns) {
        if (nanos_ == kShortNanos || total_ns <= 0) return;
        const int64_t busy = std::clamp(total_ns - idle_ns, int64_t{0}, total_ns);
        busy_permille_ = (3 * busy_permille_ + busy * 1000 / total_ns) / 4;
        if (busy_permille_ < kBusyFloorPermille) halve();
    }

  private:
    void halve() { nanos_ = std::max(nanos_ / 2, kShortNanos); }

    int64_t nanos_ = kShortNanos;
    int64_t busy_permille_ = 1000;
};

}  // namespace uroce::transport
