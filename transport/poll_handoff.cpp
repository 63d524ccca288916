#include "transport/poll_handoff.h"

#include <chrono>

namespace uroce::transport {

PollHandoff::PollHandoff(event_base* base, event* rx_event, ForkGate& gate, bool enabled)
    : base_(base), rx_event_(rx_event), gate_(gate), enabled_(enabled) {
    if (enabled_) watch_ = evtimer_new(base_, &PollHandoff::on_watch, this);
}

PollHandoff::~PollHandoff() {
    if (watch_) event_free(watch_);
}

void PollHandoff::on_poll() {
    if (!enabled_ || !watch_) return;
    polls_.fetch_add(1, std::memory_order_relaxed);
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    const int64_t before = last_poll_ns_.exchange(now, std::memory_order_relaxed);
    if (now - before > kSpinGapNanos) {
        streak_.store(0, std::memory_order_relaxed);
        return;
    }
    if (streak_.fetch_add(1, std::memory_order_relaxed) + 1 < kSpinStreak) return;
    if (parked_.load(std::memory_order_relaxed)) return;
    bool expected = false;
    if (!parked_.compare_exchange_strong(expected, true, std::memory_order_relaxed)) return;
    // Not waiting for a read callback that is running: it finishes its batch, and the next
    // read is this thread's.
    event_del_noblock(rx_event_);
    arm_watch();
}

void PollHandoff::arm_watch() {
    const timeval tv{0, kWatchMicros};
    event_add(watch_, &tv);
}

void PollHandoff::on_watch(evutil_socket_t, short, void* arg) {
    auto* h = static_cast<PollHandoff*>(arg);
    const auto pass = h->gate_.pass();
    const uint64_t polls = h->polls_.load(std::memory_order_relaxed);
    const bool polling = polls != h->polls_at_watch_;
    h->polls_at_watch_ = polls;
    if (polling && h->parked_.load(std::memory_order_relaxed)) {
        // Still polled: the socket stays out of the loop (an unpark racing with a new park
        // may have put it back).
        event_del(h->rx_event_);
        h->arm_watch();
        return;
    }
    // Nobody polled for a whole period: the engine thread reads again. A datagram that came
    // meanwhile makes the (level-triggered) event fire at once.
    h->streak_.store(0, std::memory_order_relaxed);
    h->parked_.store(false, std::memory_order_relaxed);
    h->handbacks_.fetch_add(1, std::memory_order_relaxed);
    event_add(h->rx_event_, nullptr);
}

}  // namespace uroce::transport
