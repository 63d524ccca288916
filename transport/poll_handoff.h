// Who reads the device socket: the engine thread, or the application threads that poll.
//
// An application that polls its CQs in a loop (perftest, UCX, MPI) calls Engine::progress()
// on every empty poll and receives the waiting packets on its own thread. While it does, the
// engine thread's wake-ups for the same socket only cost: on a machine with few cores the
// woken engine thread takes a CPU from a polling thread, tens of microseconds per packet, and
// a whole scheduler slice when every core spins. So when the polls come fast enough to be a
// busy poll, the socket leaves the engine thread's event loop ("parked"), and the polling
// threads alone read it. A timer on the engine thread checks that the polls go on, and gives
// the socket back to the loop once none came for a watch period: an application that turns
// to waiting on a completion channel, or to spinning on memory (ib_write_lat waits for the
// peer's WRITE that way between its CQ polls), waits about that long for its next packet.
//
// The period trades that wait against the engine thread's wake-ups while parked, so it
// adapts. A hand-back that finds a datagram already waiting, after a last poll that returned
// completions (the application took what it polled for, then waited for the next packet
// some other way), halves it, down to kMinWatchMicros; a hand-back after a last poll that
// returned nothing (the polls only paused) and each check that finds the polls still going
// double it, up to kWatchMicros (more in a long park, below).
// ib_write_lat's median: 1.6 ms with a fixed 1 ms period, 172 us with 100 us, 47 us
// adaptive. A 5 us floor was worse (the engine thread's wake-ups took the CPUs from the
// spinning application), and so were checks aimed at a full period after the last poll
// (ib_send_lat, whose pollers pause only when the scheduler holds them off, lost 1-2 us on
// average to the extra wake-ups).
// Timers (retransmission, RNR) belong to the engine thread's loop; while parked the pollers
// run those that are due, and the ones they arm reach the loop at the hand-back
// (Engine::defer_timers). The hand-back also sends the posts held for the pollers
// (held_posts.h).
#pragma once

#include <event2/event.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "transport/counters.h"
#include "transport/fork_gate.h"
#include "transport/timer_queue.h"

namespace uroce::transport {

class PollHandoff {
  public:
    // Polls (and posts) less than kSpinGapNanos apart, kSpinStreak in a row, are a busy poll.
    static constexpr int64_t kSpinGapNanos = 50'000;
    static constexpr uint32_t kSpinStreak = 64;
    // The watch period: from kWatchMicros, it halves at each hand-back that finds a datagram
    // waiting and doubles at each check that finds the polls going on.
    static constexpr int64_t kWatchMicros = 100;
    static constexpr int64_t kMinWatchMicros = 20;
    // A park that has lasted kLongParkMicros is a poller that does nothing else (perftest,
    // ibv_rc_pingpong): its period may grow on to kLongWatchMicros, and from there with the
    // park's age, to a sixteenth of it (kParkAgeShare), up to kMaxLongWatchMicros. The
    // hand-back that ends such a park comes up to that late, once (not after on_arm: a
    // poller turning to a completion event), at most a sixteenth more than it polled; the
    // next park starts from kWatchMicros. Each wake-up of the watch takes a CPU from a
    // spinning thread on a small machine: ib_read_lat's p99 58-73 us with the growth,
    // 67-96 us without (1000 wake-ups a second; 4 pairs, 2 vCPUs). A loss leaves the park's
    // age alone: the pollers go on polling through it and run its timers. Made young at
    // each resend (until 2026-12-08), a lossy stream's park kept the watch at kWatchMicros,
    // each wake-up (and its timerfd set) taken from the peer's engine thread on a 2-vCPU
    // host: ib_write_bw 20-24% and ib_read_bw 25-31% slower under 1% and 5% loss.
    static constexpr int64_t kLongParkMicros = 2000;
    static constexpr int64_t kLongWatchMicros = 1000;
    static constexpr int64_t kParkAgeShare = 16;
    static constexpr int64_t kMaxLongWatchMicros = 8000;

    // `rx_event` is the engine loop's read event of the device socket (added), `timers` the
    // engine's (the watch is one of them); `gate` is the engine's, taken by the watch's
    // callback. With `enabled` false, on_poll() never
    // parks it. `handed_back` runs on the engine thread each time the socket comes back to
    // it (what was left for the pollers goes out then: held_posts.h). `counters` (the
    // engine's) count parks, hand-backs and the watch's wake-ups.
    PollHandoff(TimerQueue& timers, event* rx_event, ForkGate& gate, EngineCounters& counters,
                bool enabled, std::function<void()> handed_back = {});
    ~PollHandoff();
    PollHandoff(const PollHandoff&) = delete;
    PollHandoff& operator=(const PollHandoff&) = delete;

    // An application thread found its CQ empty and is about to read the socket itself.
    // Must be called without the engine's receive lock: parking removes the socket's event,
    // which the engine thread may be handling under that lock. Returns the time it read
    // (now_ns()), or 0 if it read none (the handoff off).
    int64_t on_poll();
    // On the engine thread: the socket became readable while an application thread holds
    // the receive lock, so a poller reads it right now. Parks the socket (as a streak of
    // polls would) rather than wait for the lock; the watch gives it back once the polls
    // stop. False if the handoff is off: then wait for the lock.
    bool park_from_loop();
    // The poll that just ended returned completions: if the polls stop now, the thread got
    // what it waited for and went elsewhere, rather than being held off by the scheduler.
    void on_completions();
    // An application thread posted work: the time it spent posting (a long send, a wait for
    // a QP's lock) does not count as a gap between its polls, and its posts count towards
    // the streak at its next poll, if that comes without a gap (a post never parks).
    void on_post();
    // An application thread reads the socket for as long as it holds a ReadingScope
    // (Engine::progress, under the receive lock): it is polling all that time, and the watch
    // leaves the socket parked however long the read takes. A poll whose batch of ACKs let
    // eight QPs send their next trains outlasted the watch period: the socket went back to
    // the engine thread, which could not read it (the poller held the lock) and parked it
    // again, about 110 times in a 30 ms `ib_write_bw -q 8` (docs/performance-log.md). One
    // reader at a time (the lock's holder): a plain flag, no locked instruction per poll.
    class ReadingScope {
      public:
        explicit ReadingScope(PollHandoff& handoff) : handoff_(handoff) {
            handoff_.reading_.store(true, std::memory_order_relaxed);
        }
        ~ReadingScope() { handoff_.reading_.store(false, std::memory_order_relaxed); }
        ReadingScope(const ReadingScope&) = delete;
        ReadingScope& operator=(const ReadingScope&) = delete;

      private:
        PollHandoff& handoff_;
    };
    // An application thread asked for a completion event (ibv_req_notify_cq): it is about
    // to sleep until the engine thread wakes it, and needs a CPU then.
    void on_arm();
    // The clock of these times: the steady clock (steady_clock.h), in nanoseconds.
    static int64_t now_ns() { return steady_now_ns(); }
    // Whether no application thread polled, posted or armed a CQ for `quiet_ns` before
    // `now` (now_ns()): nobody of this process waits on a CPU for the engine's work
    // (see Engine::spin_after_batch).
    bool quiet(int64_t now, int64_t quiet_ns) const;
    bool parked() const { return parked_.load(std::memory_order_relaxed); }
    // Times the engine thread took the socket back because the polls had stopped.
    uint64_t handbacks() const { return handbacks_.load(std::memory_order_relaxed); }
    // The watch period now, in microseconds.
    int64_t watch_micros() const { return watch_ns_.load(std::memory_order_relaxed) / 1000; }

  private:
    static void on_watch(void* arg);
    void arm_watch();
    void arm_watch(int64_t delay_ns);
    // Whether the device socket holds a datagram (engine thread, at a hand-back).
    bool datagram_waiting() const;

    event* const rx_event_;
    ForkGate& gate_;
    EngineCounters& counters_;
    const bool enabled_;
    const std::function<void()> handed_back_;
    std::unique_ptr<TimerQueue::Timer> watch_;  // null when the handoff is off
    std::atomic<int64_t> last_poll_ns_{0};
    std::atomic<int64_t> last_arm_ns_{0};
    std::atomic<uint32_t> streak_{0};
    std::atomic<bool> parked_{false};
    std::atomic<bool> reading_{false};      // an application thread reads (ReadingScope)
    std::atomic<int64_t> parked_at_ns_{0};  // when the current park began
    std::atomic<bool> last_poll_found_{false};
    std::atomic<uint64_t> handbacks_{0};  // this handoff's own (the counters may be shared)
    std::atomic<int64_t> watch_ns_{kWatchMicros * 1000};  // changed by the engine thread
};

}  // namespace uroce::transport
