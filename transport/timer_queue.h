// The engine's timers (RC retransmission and probes, the poll handoff's watch, held ACKs,
// fault delays, RDMA CM retries) on one timerfd of their own, read by the engine's event loop.
//
// libevent's own timers cost the engine on every loop turn. With sub-millisecond timers
// (EVENT_BASE_FLAG_PRECISE_TIMER) its epoll loop sets its timerfd before every epoll_wait,
// whether the earliest deadline moved or not; in a guest that traps on timer programming that
// call takes 10-60 us (median 12 us, p90 24 us under ib_write_lat on the 2-vCPU PVM machine).
// And a timer added from another thread that becomes the earliest wakes the loop's thread (an
// eventfd write) so that it can set that timerfd again: a post that arms a QP's
// retransmission timer could wake the engine thread for nothing else.
//
// Here the timerfd is set by whichever thread arms a timer (no thread is woken for it), and
// only when the earliest deadline moves earlier, by more than a quarter of its delay (at most
// kMaxSlackNs: a timer may fire that late). A deadline moved later, or cancelled, leaves the
// timerfd as it is: its expiry finds nothing due (early_wakes) and sets it for what is left,
// or for nothing. Under ib_write_lat (each post arms a QP's timer, its ACK cancels it) that
// was 2.2-2.5 sets and 0.25 early wakes per iteration on each side, against 2.5-3.2 sets when
// every change of the earliest deadline set the timerfd and the last cancellation disarmed it.
#pragma once

#include <event2/event.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/counters.h"
#include "transport/steady_clock.h"

namespace uroce::transport {

class TimerQueue {
  public:
    using Callback = void (*)(void* arg);

    // One timer: armed for one deadline at a time, its callback run on the loop's thread.
    class Timer {
      public:
        Timer(TimerQueue& queue, Callback callback, void* arg)
            : queue_(queue), callback_(callback), arg_(arg) {}
        // Cancels, and waits for a callback running on another thread.
        ~Timer() { cancel_and_wait(); }
        Timer(const Timer&) = delete;
        Timer& operator=(const Timer&) = delete;

        // Fires at `deadline_ns` (TimerQueue::now_ns's clock), replacing any earlier deadline.
        void arm_at(int64_t deadline_ns) { queue_.arm(*this, deadline_ns); }
        void arm_in(int64_t delay_ns) { queue_.arm(*this, now_ns() + delay_ns); }
        // Never waits: a callback already running goes on (it must check its own state).
        void cancel() { queue_.cancel(*this, false); }
        // Also waits for a callback running on another thread to return.
        void cancel_and_wait() { queue_.cancel(*this, true); }
        bool pending() const;

      private:
        friend class TimerQueue;
        static constexpr std::size_t kNotQueued = static_cast<std::size_t>(-1);
        TimerQueue& queue_;
        const Callback callback_;
        void* const arg_;
        // Guarded by the queue's mutex.
        int64_t deadline_ns_ = 0;
        std::size_t index_ = kNotQueued;  // position in the queue's heap
    };

    // Registers the timerfd's read event with `base` (ok() says whether that worked).
    // `counters` (optional, the engine's) count timerfd_sets and timer_early_wakes too.
    explicit TimerQueue(event_base* base, EngineCounters* counters = nullptr);
    ~TimerQueue();
    TimerQueue(const TimerQueue&) = delete;
    TimerQueue& operator=(const TimerQueue&) = delete;

    bool ok() const { return event_ != nullptr; }
    // How late a timer may fire, at most, to spare a timerfd_settime.
    static constexpr int64_t kMaxSlackNs = 250'000;
    // The clock of every deadline (steady_clock.h), nanoseconds.
    static int64_t now_ns() { return steady_now_ns(); }
    // Times the timerfd was set or disarmed (each is one timerfd_settime).
    uint64_t timerfd_sets() const { return sets_.load(std::memory_order_relaxed); }
    // Expiries of the timerfd that found no timer due (a deadline had moved later).
    uint64_t early_wakes() const { return early_.load(std::memory_order_relaxed); }

  private:
    void arm(Timer& t, int64_t deadline_ns);
    void cancel(Timer& t, bool wait);
    static void on_readable(evutil_socket_t, short, void* arg);
    void run_due();
    // Sets the timerfd for `deadline_ns` (0: disarms it). Called with mutex_ held.
    void set_timerfd(int64_t deadline_ns);
    // The binary heap of queued timers, earliest first. Called with mutex_ held.
    void heap_remove(Timer& t);
    void heap_place(std::size_t i);  // restores the order around heap_[i]
    void heap_swap(std::size_t i, std::size_t j);

    int fd_ = -1;
    event* event_ = nullptr;
    mutable std::mutex mutex_;
    std::condition_variable callback_done_;
    std::vector<Timer*> heap_;
    int64_t timerfd_deadline_ns_ = 0;  // what the timerfd is set for (0: disarmed)
    Timer* running_ = nullptr;         // the timer whose callback runs now, if any
    std::thread::id running_thread_;
    EngineCounters* const counters_;
    std::atomic<uint64_t> sets_{0};
    std::atomic<uint64_t> early_{0};
};

}  // namespace uroce::transport
