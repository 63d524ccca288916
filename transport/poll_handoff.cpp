#include "transport/poll_handoff.h"

#include <sys/socket.h>

#include <algorithm>
#include <utility>

namespace uroce::transport {

namespace {

// The calling thread's posts since its last poll of `handoff`, each within kSpinGapNanos of
// the one before (`last_ns`: the last post or poll).
struct ThreadPosts {
    const PollHandoff* handoff = nullptr;
    int64_t last_ns = 0;
    uint32_t count = 0;
};
// Initial-exec: read at every poll and post, it must not cost a __tls_get_addr call (the
// provider is loaded with dlopen); it takes 24 of the bytes glibc keeps for such libraries.
__attribute__((tls_model("initial-exec"))) thread_local ThreadPosts t_posts;

}  // namespace

PollHandoff::PollHandoff(TimerQueue& timers, event* rx_event, ForkGate& gate,
                         EngineCounters& counters, bool enabled, std::function<void()> handed_back)
    : rx_event_(rx_event),
      gate_(gate),
      counters_(counters),
      enabled_(enabled),
      handed_back_(std::move(handed_back)) {
    if (enabled_)
        watch_ = std::make_unique<TimerQueue::Timer>(timers, &PollHandoff::on_watch, this);
}

PollHandoff::~PollHandoff() = default;

int64_t PollHandoff::on_poll() {
    if (!enabled_ || !watch_) return 0;
    const int64_t now = now_ns();
    // The posts this thread made since its last poll count too, if this poll follows them
    // without a gap: a stream posts in bursts and polls between them (perftest's bandwidth
    // tests: up to 128 posts, then a few polls that find their completions), and with polls
    // alone it would park only after dozens of bursts, each post meanwhile its own system
    // call. A thread that posts and never polls never has its posts counted: it gives no
    // sign it will come back to send what a park would hold, and another thread's poll now
    // and then must not park the socket on its behalf.
    ThreadPosts& mine = t_posts;
    const uint32_t posts =
        mine.handoff == this && now - mine.last_ns <= kSpinGapNanos ? mine.count : 0;
    mine = {this, now, 0};
    // Plain loads and stores where they do (no locked instruction): a busy poller makes
    // millions of these calls a second. Two pollers racing here at worst miscount a poll.
    if (last_poll_found_.load(std::memory_order_relaxed))
        last_poll_found_.store(false, std::memory_order_relaxed);
    const int64_t before = last_poll_ns_.load(std::memory_order_relaxed);
    last_poll_ns_.store(now, std::memory_order_relaxed);
    if (now - before > kSpinGapNanos) {
        streak_.store(0, std::memory_order_relaxed);
        return now;
    }
    // Parked already: the streak has done its work (a gap resets it for the next park).
    if (parked_.load(std::memory_order_relaxed)) return now;
    if (streak_.fetch_add(1 + posts, std::memory_order_relaxed) + 1 + posts < kSpinStreak)
        return now;
    bool expected = false;
    if (!parked_.compare_exchange_strong(expected, true, std::memory_order_relaxed)) return now;
    bump(counters_.socket_parks);
    parked_at_ns_.store(now, std::memory_order_relaxed);
    // Not waiting for a read callback that is running: it finishes its batch, and the next
    // read is this thread's.
    event_del_noblock(rx_event_);
    arm_watch();
    return now;
}

bool PollHandoff::park_from_loop() {
    if (!enabled_ || !watch_) return false;
    // Even for what may be a single poll (after a completion event, say): if it ends
    // without reading the packet that woke this thread, the packet waits for the watch. That
    // window is a few microseconds; waiting for the lock instead, or parking only after a
    // few polls in a row, kept the engine thread reading beside a busy poller (perftest's
    // message rate: 0.10-0.17 Mpps in 4 runs of 5, against 0.44-0.57 in every run so).
    bool expected = false;
    if (!parked_.compare_exchange_strong(expected, true, std::memory_order_relaxed)) return true;
    bump(counters_.socket_parks);
    // The poll that holds the lock counts: the watch measures the gap from now.
    const int64_t now = now_ns();
    last_poll_ns_.store(now, std::memory_order_relaxed);
    parked_at_ns_.store(now, std::memory_order_relaxed);
    event_del(rx_event_);
    arm_watch();
    return true;
}

void PollHandoff::on_completions() {
    if (!enabled_ || !watch_) return;
    last_poll_found_.store(true, std::memory_order_relaxed);
}

void PollHandoff::on_post() {
    if (!enabled_ || !watch_) return;
    const int64_t now = now_ns();
    last_poll_ns_.store(now, std::memory_order_relaxed);
    // Counted at this thread's next poll (on_poll), if it comes without a gap.
    ThreadPosts& mine = t_posts;
    if (mine.handoff != this || now - mine.last_ns > kSpinGapNanos) mine = {this, now, 0};
    mine.last_ns = now;
    ++mine.count;
}

void PollHandoff::on_arm() {
    if (!enabled_) return;
    last_arm_ns_.store(now_ns(), std::memory_order_relaxed);
    // A thread that turns from a long busy poll to waiting for an event must not wait a long
    // period for the hand-back: the watch comes back within kWatchMicros (adding it from
    // this thread wakes the engine thread once, as it is about to sleep anyway).
    if (watch_ && parked_.load(std::memory_order_relaxed) &&
        watch_ns_.load(std::memory_order_relaxed) > kWatchMicros * 1000) {
        watch_ns_.store(kWatchMicros * 1000, std::memory_order_relaxed);
        arm_watch();
    }
}

bool PollHandoff::quiet(int64_t now, int64_t quiet_ns) const {
    return now - last_poll_ns_.load(std::memory_order_relaxed) >= quiet_ns &&
           now - last_arm_ns_.load(std::memory_order_relaxed) >= quiet_ns;
}

void PollHandoff::arm_watch() {
    arm_watch(watch_ns_.load(std::memory_order_relaxed));
}

void PollHandoff::arm_watch(int64_t delay_ns) {
    watch_->arm_in(delay_ns);
}

bool PollHandoff::datagram_waiting() const {
    uint8_t byte;
    return ::recv(event_get_fd(rx_event_), &byte, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
}

void PollHandoff::on_watch(void* arg) {
    auto* h = static_cast<PollHandoff*>(arg);
    const auto pass = h->gate_.pass();
    bump(h->counters_.watch_wakeups);
    const int64_t period = h->watch_ns_.load(std::memory_order_relaxed);
    const int64_t now = now_ns();
    const int64_t gap = now - h->last_poll_ns_.load(std::memory_order_relaxed);
    const bool reading = h->reading_.load(std::memory_order_relaxed);
    if ((gap < period || reading) && h->parked_.load(std::memory_order_relaxed)) {
        // Still polled: the socket stays out of the loop (an unpark racing with a new park
        // may have put it back). A poller that keeps polling costs this thread a wake-up
        // per period: the period grows back towards kWatchMicros, and once the park has
        // lasted kLongParkMicros on to kLongWatchMicros and beyond, with the park's age. A
        // short period is aimed at its end (a period after the last poll); the full one is
        // not: a check that comes sooner is one wake-up more beside the pollers.
        event_del(h->rx_event_);
        const int64_t age = now - h->parked_at_ns_.load(std::memory_order_relaxed);
        const int64_t ceiling = age < kLongParkMicros * 1000
                                    ? kWatchMicros * 1000
                                    : std::clamp(age / kParkAgeShare, kLongWatchMicros * 1000,
                                                 kMaxLongWatchMicros * 1000);
        const int64_t next = std::min(period * 2, ceiling);
        h->watch_ns_.store(next, std::memory_order_relaxed);
        h->arm_watch(period < kWatchMicros * 1000 ? std::max(next - gap, kMinWatchMicros * 1000)
                                                  : next);
        return;
    }
    // Nobody polled for a whole period: the engine thread reads again. A datagram that came
    // meanwhile makes the (level-triggered) event fire at once. If the last poll returned
    // completions and a datagram waited for this hand-back, the application waits for the
    // engine thread between bursts of polls (ib_write_lat polls for its ACK, then spins on
    // memory for the peer's WRITE): the next hand-back comes sooner. Not when the polls just
    // paused (a poller the scheduler held off, in ib_send_lat): a short period there only
    // wakes the engine thread beside the pollers, on CPUs they need, so such a hand-back
    // doubles it back towards kWatchMicros (and ends a long park's). The checks that find
    // the polls going on cannot be left to do that: a period shorter than the poller's
    // pauses ends each park before its first check. A 4 KiB ibv_rc_pingpong under 1% loss,
    // its period halved to the floor by a few late answers, was handed back 240 times in
    // 1,000 iterations, at 61-64 us per iteration instead of 30-38. A last poll that
    // returned completions with nothing waiting yet says neither: the period stays.
    const bool found = h->last_poll_found_.load(std::memory_order_relaxed);
    if (found && h->datagram_waiting())
        h->watch_ns_.store(
            std::max(std::min(period, kWatchMicros * 1000) / 2, kMinWatchMicros * 1000),
            std::memory_order_relaxed);
    else if (!found)
        h->watch_ns_.store(std::min(period * 2, kWatchMicros * 1000), std::memory_order_relaxed);
    else if (period > kWatchMicros * 1000)
        h->watch_ns_.store(kWatchMicros * 1000, std::memory_order_relaxed);
    h->streak_.store(0, std::memory_order_relaxed);
    h->parked_.store(false, std::memory_order_relaxed);
    h->handbacks_.fetch_add(1, std::memory_order_relaxed);
    bump(h->counters_.socket_handbacks);
    event_add(h->rx_event_, nullptr);
    // A post that saw the socket parked either noted itself before this fence (and goes out
    // now) or sees it handed back and sends at once (Engine::note_held_post).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (h->handed_back_) h->handed_back_();
}

}  // namespace uroce::transport
