// The engine's timer queue (timer_queue.h): timers fire in deadline order on the loop's
// thread, the timerfd is set only when the earliest deadline moves earlier (beyond the
// slack), a cancelled timer never fires, and cancel_and_wait() waits for a callback running
// elsewhere (but not for its own thread's).
#include <event2/thread.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/timer_queue.h"

using namespace uroce::transport;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kMs = 1'000'000;

// An event loop on a thread of its own, with a timer queue, as an engine has.
class Loop {
  public:
    Loop() {
        static std::once_flag once;
        std::call_once(once, [] { evthread_use_pthreads(); });
        base_ = event_base_new();
        timers_ = std::make_unique<TimerQueue>(base_);
        // Keeps the loop running with nothing else registered.
        keep_ = event_new(
            base_, -1, EV_PERSIST, [](evutil_socket_t, short, void*) {}, nullptr);
        const timeval hour{3600, 0};
        event_add(keep_, &hour);
        thread_ = std::thread([this] {
            loop_thread_.store(std::this_thread::get_id());
            event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY);
        });
        while (loop_thread_.load() == std::thread::id{}) std::this_thread::sleep_for(1ms);
    }
    ~Loop() {
        event_base_loopbreak(base_);
        thread_.join();
        event_free(keep_);
        timers_.reset();
        event_base_free(base_);
    }
    TimerQueue& timers() { return *timers_; }
    std::thread::id loop_thread() const { return loop_thread_.load(); }

  private:
    event_base* base_ = nullptr;
    event* keep_ = nullptr;
    std::unique_ptr<TimerQueue> timers_;
    std::thread thread_;
    std::atomic<std::thread::id> loop_thread_{};
};

// Records the order and thread of the callbacks it is given as argument.
struct Record {
    std::mutex mutex;
    std::vector<int> fired;
    std::vector<std::thread::id> threads;
    std::atomic<int> count{0};
};

struct Tagged {
    Record* record;
    int tag;
    static void fire(void* arg) {
        auto* t = static_cast<Tagged*>(arg);
        {
            std::lock_guard lock(t->record->mutex);
            t->record->fired.push_back(t->tag);
            t->record->threads.push_back(std::this_thread::get_id());
        }
        t->record->count.fetch_add(1);
    }
};

// Waits (at most 2 s) until `count` reaches `n`.
bool wait_count(const std::atomic<int>& count, int n) {
    const auto end = std::chrono::steady_clock::now() + 2s;
    while (count.load() < n && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(200us);
    return count.load() >= n;
}

// Two timers of one loop, recording into `r`; `sets0` is the timerfd sets before any arm.
struct TwoTimers {
    Loop loop;
    Record r;
    Tagged a{&r, 1}, b{&r, 2};
    TimerQueue::Timer ta{loop.timers(), &Tagged::fire, &a};
    TimerQueue::Timer tb{loop.timers(), &Tagged::fire, &b};
    const int64_t now = TimerQueue::now_ns();
    const uint64_t sets0 = loop.timers().timerfd_sets();
    uint64_t sets() { return loop.timers().timerfd_sets() - sets0; }
};

// Waits (at most 2 s) until the queue counted an expiry with nothing due.
bool wait_early_wake(Loop& loop) {
    const auto end = std::chrono::steady_clock::now() + 2s;
    while (loop.timers().early_wakes() == 0 && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(1ms);
    return loop.timers().early_wakes() > 0;
}

}  // namespace

TEST_CASE("Timers fire once each, in deadline order, on the loop's thread", "[timer_queue]") {
    Loop loop;
    Record r;
    Tagged a{&r, 1}, b{&r, 2}, c{&r, 3};
    TimerQueue::Timer ta(loop.timers(), &Tagged::fire, &a);
    TimerQueue::Timer tb(loop.timers(), &Tagged::fire, &b);
    TimerQueue::Timer tc(loop.timers(), &Tagged::fire, &c);
    const int64_t now = TimerQueue::now_ns();
    tb.arm_at(now + 30 * kMs);
    ta.arm_at(now + 10 * kMs);
    tc.arm_at(now + 20 * kMs);
    CHECK(ta.pending());
    REQUIRE(wait_count(r.count, 3));
    std::this_thread::sleep_for(20ms);  // none fires twice
    std::lock_guard lock(r.mutex);
    CHECK(r.fired == std::vector<int>{1, 3, 2});
    for (auto id : r.threads) CHECK(id == loop.loop_thread());
    CHECK_FALSE(ta.pending());
    CHECK(TimerQueue::now_ns() >= now + 30 * kMs);
}

TEST_CASE("The timerfd is set when the earliest deadline moves earlier, not later",
          "[timer_queue]") {
    TwoTimers t;
    t.ta.arm_at(t.now + 40 * kMs);
    CHECK(t.sets() == 1);  // the first deadline
    t.tb.arm_at(t.now + 60 * kMs);
    CHECK(t.sets() == 1);  // later than the earliest
    t.ta.arm_at(t.now + 50 * kMs);
    CHECK(t.sets() == 1);  // the earliest moved later
    t.tb.arm_at(t.now + 30 * kMs);
    CHECK(t.sets() == 2);  // a new earliest
    t.tb.cancel();
    t.ta.cancel();
    CHECK(t.sets() == 2);  // left to expire
    REQUIRE(wait_early_wake(t.loop));
    CHECK(TimerQueue::now_ns() >= t.now + 30 * kMs);  // at +30 ms, nothing due
    std::this_thread::sleep_for(40ms);
    CHECK(t.r.count.load() == 0);
    CHECK(t.loop.timers().early_wakes() == 1);
    CHECK(t.sets() == 2);  // nothing left: not set again
}

TEST_CASE("A deadline a little earlier than the timerfd's waits for it", "[timer_queue]") {
    TwoTimers t;
    t.ta.arm_at(t.now + 20 * kMs);
    t.tb.arm_at(t.now + 20 * kMs - TimerQueue::kMaxSlackNs / 2);  // within the slack
    CHECK(t.sets() == 1);
    REQUIRE(wait_count(t.r.count, 2));
    CHECK(TimerQueue::now_ns() >= t.now + 20 * kMs);
    std::lock_guard lock(t.r.mutex);
    CHECK(t.r.fired == std::vector<int>{2, 1});  // in deadline order still
    CHECK(t.sets() == 1);
}

TEST_CASE("A deadline moved later fires then, after one early expiry", "[timer_queue]") {
    Loop loop;
    Record r;
    Tagged a{&r, 1};
    TimerQueue::Timer ta(loop.timers(), &Tagged::fire, &a);
    const int64_t now = TimerQueue::now_ns();
    // 50 ms apart and from now: a test thread held off the CPU for 10 ms between the two
    // arms (a busy CI machine) saw the first deadline fire.
    ta.arm_at(now + 50 * kMs);
    ta.arm_at(now + 100 * kMs);
    REQUIRE(wait_count(r.count, 1));
    CHECK(TimerQueue::now_ns() >= now + 100 * kMs);
    // At +50 ms, nothing was due (unless the loop's thread was held off for 50 ms).
    CHECK(loop.timers().early_wakes() <= 1);
    std::this_thread::sleep_for(20ms);
    CHECK(r.count.load() == 1);
}

TEST_CASE("A timer cancelled and armed again fires only when due", "[timer_queue]") {
    Loop loop;
    Record r;
    Tagged a{&r, 1};
    TimerQueue::Timer ta(loop.timers(), &Tagged::fire, &a);
    const uint64_t sets0 = loop.timers().timerfd_sets();
    for (int i = 0; i < 20; ++i) {
        ta.arm_in(50 * kMs);  // not due while the loop runs, even on a busy machine
        ta.cancel();
    }
    CHECK(loop.timers().timerfd_sets() == sets0 + 1);  // the first arm only
    REQUIRE(wait_early_wake(loop));
    CHECK(r.count.load() == 0);
    CHECK(loop.timers().early_wakes() == 1);  // the first deadline, with nothing due
    CHECK_FALSE(ta.pending());
    const int64_t at = TimerQueue::now_ns() + 5 * kMs;
    ta.arm_at(at);
    REQUIRE(wait_count(r.count, 1));
    CHECK(TimerQueue::now_ns() >= at);
}

TEST_CASE("Timers armed from several threads at once all fire", "[timer_queue]") {
    Loop loop;
    Record r;
    constexpr int kThreads = 4, kEach = 50;
    std::vector<Tagged> tags;
    tags.reserve(kThreads * kEach);
    for (int i = 0; i < kThreads * kEach; ++i) tags.push_back({&r, i});
    std::vector<std::unique_ptr<TimerQueue::Timer>> timers;
    for (auto& t : tags)
        timers.push_back(std::make_unique<TimerQueue::Timer>(loop.timers(), &Tagged::fire, &t));
    std::vector<std::thread> threads;
    for (int k = 0; k < kThreads; ++k) {
        threads.emplace_back([&, k] {
            for (int i = 0; i < kEach; ++i) {
                auto& t = *timers[static_cast<size_t>(k * kEach + i)];
                // Some first far off, then moved earlier (a second arm after a first one
                // fired would make the timer fire twice).
                if (i % 5 == 0) t.arm_in(10'000 * kMs);
                t.arm_in((i % 7) * kMs);
            }
        });
    }
    for (auto& t : threads) t.join();
    REQUIRE(wait_count(r.count, kThreads * kEach));
    std::this_thread::sleep_for(20ms);
    CHECK(r.count.load() == kThreads * kEach);
    std::lock_guard lock(r.mutex);
    std::vector<int> seen = r.fired;
    std::sort(seen.begin(), seen.end());
    CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

namespace {
struct Slow {
    std::atomic<bool> started{false};
    std::atomic<bool> finished{false};
    static void fire(void* arg) {
        auto* s = static_cast<Slow*>(arg);
        s->started.store(true);
        std::this_thread::sleep_for(100ms);
        s->finished.store(true);
    }
};

struct SelfCancel {
    TimerQueue::Timer* timer = nullptr;
    std::atomic<int> count{0};
    static void fire(void* arg) {
        auto* s = static_cast<SelfCancel*>(arg);
        s->timer->arm_in(kMs);        // re-armed, then
        s->timer->cancel_and_wait();  // cancelled from its own callback: must not wait
        s->count.fetch_add(1);
    }
};
}  // namespace

TEST_CASE("cancel_and_wait waits for a running callback, but not from inside it", "[timer_queue]") {
    Loop loop;
    SECTION("from another thread") {
        Slow s;
        TimerQueue::Timer t(loop.timers(), &Slow::fire, &s);
        t.arm_in(0);
        const auto end = std::chrono::steady_clock::now() + 2s;
        while (!s.started.load() && std::chrono::steady_clock::now() < end)
            std::this_thread::sleep_for(100us);
        REQUIRE(s.started.load());
        t.cancel_and_wait();
        CHECK(s.finished.load());
    }
    SECTION("from its own callback") {
        SelfCancel s;
        TimerQueue::Timer t(loop.timers(), &SelfCancel::fire, &s);
        s.timer = &t;
        t.arm_in(0);
        REQUIRE(wait_count(s.count, 1));
        std::this_thread::sleep_for(20ms);
        CHECK(s.count.load() == 1);
        CHECK_FALSE(t.pending());
    }
}
