#include "transport/timer_queue.h"

#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace uroce::transport {

bool TimerQueue::Timer::pending() const {
    std::lock_guard lock(queue_.mutex_);
    return index_ != kNotQueued;
}

TimerQueue::TimerQueue(event_base* base, EngineCounters* counters) : counters_(counters) {
    fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd_ < 0) return;
    event_ = event_new(base, fd_, EV_READ | EV_PERSIST, &TimerQueue::on_readable, this);
    if (event_ && event_add(event_, nullptr) != 0) {
        event_free(event_);
        event_ = nullptr;
    }
}

TimerQueue::~TimerQueue() {
    if (event_) event_free(event_);  // waits for a running callback (pthreads mode)
    if (fd_ >= 0) ::close(fd_);
}

void TimerQueue::arm(Timer& t, int64_t deadline_ns) {
    std::lock_guard lock(mutex_);
    if (!event_) return;
    t.deadline_ns_ = deadline_ns > 0 ? deadline_ns : 1;  // 0 means disarmed to the timerfd
    if (t.index_ == Timer::kNotQueued) {
        t.index_ = heap_.size();
        heap_.push_back(&t);
    }
    heap_place(t.index_);
    // Only an earlier deadline is worth a timerfd_settime now; a later one is found by the
    // expiry that comes first.
    const int64_t earliest = heap_.front()->deadline_ns_;
    if (timerfd_deadline_ns_ == 0) {
        set_timerfd(earliest);
        return;
    }
    // A timer may fire up to a quarter of its delay late (at most kMaxSlackNs): one set
    // less each time a QP arms its timer a moment after another QP (or itself) did.
    const int64_t slack = std::clamp<int64_t>((earliest - now_ns()) / 4, 0, kMaxSlackNs);
    if (earliest < timerfd_deadline_ns_ - slack) set_timerfd(earliest);
}

void TimerQueue::cancel(Timer& t, bool wait) {
    std::unique_lock lock(mutex_);
    if (t.index_ != Timer::kNotQueued) heap_remove(t);
    if (!wait) return;
    callback_done_.wait(
        lock, [&] { return running_ != &t || running_thread_ == std::this_thread::get_id(); });
}

void TimerQueue::on_readable(evutil_socket_t fd, short, void* arg) {
    uint64_t expirations = 0;
    // Clears the readiness; EAGAIN when a set after the expiry re-armed it meanwhile.
    [[maybe_unused]] const ssize_t n = ::read(fd, &expirations, sizeof expirations);
    static_cast<TimerQueue*>(arg)->run_due();
}

void TimerQueue::run_due() {
    std::unique_lock lock(mutex_);
    timerfd_deadline_ns_ = 0;  // expired (or about to be set again below)
    bool ran = false;
    // Bounded: a callback that re-arms its timer for now runs again on the next loop turn.
    for (std::size_t budget = heap_.size(); budget > 0 && !heap_.empty(); --budget) {
        Timer* t = heap_.front();
        if (t->deadline_ns_ > now_ns()) break;
        heap_remove(*t);
        running_ = t;
        running_thread_ = std::this_thread::get_id();
        lock.unlock();
        t->callback_(t->arg_);
        lock.lock();
        running_ = nullptr;
        ran = true;
        callback_done_.notify_all();
    }
    if (!ran) {
        early_.fetch_add(1, std::memory_order_relaxed);
        if (counters_) bump(counters_->timer_early_wakes);
    }
    if (!heap_.empty() && timerfd_deadline_ns_ == 0) set_timerfd(heap_.front()->deadline_ns_);
}

void TimerQueue::set_timerfd(int64_t deadline_ns) {
    itimerspec spec{};  // all 0: disarms; a deadline already past fires at once
    spec.it_value.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000);
    if (timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr) == 0) {
        timerfd_deadline_ns_ = deadline_ns;
    } else {
        timerfd_deadline_ns_ = 0;  // not set: the next arm tries again
    }
    sets_.fetch_add(1, std::memory_order_relaxed);
    if (counters_) bump(counters_->timerfd_sets);
}

void TimerQueue::heap_remove(Timer& t) {
    const std::size_t i = t.index_;
    const std::size_t last = heap_.size() - 1;
    if (i != last) heap_swap(i, last);
    heap_.pop_back();
    t.index_ = Timer::kNotQueued;
    if (i < heap_.size()) heap_place(i);
}

void TimerQueue::heap_place(std::size_t i) {
    while (i > 0) {
        const std::size_t parent = (i - 1) / 2;
        if (heap_[parent]->deadline_ns_ <= heap_[i]->deadline_ns_) break;
        heap_swap(i, parent);
        i = parent;
    }
    for (;;) {
        const std::size_t l = 2 * i + 1;
        const std::size_t r = l + 1;
        std::size_t least = i;
        if (l < heap_.size() && heap_[l]->deadline_ns_ < heap_[least]->deadline_ns_) least = l;
        if (r < heap_.size() && heap_[r]->deadline_ns_ < heap_[least]->deadline_ns_) least = r;
        if (least == i) break;
        heap_swap(i, least);
        i = least;
    }
}

void TimerQueue::heap_swap(std::size_t i, std::size_t j) {
    std::swap(heap_[i], heap_[j]);
    heap_[i]->index_ = i;
    heap_[j]->index_ = j;
}

}  // namespace uroce::transport
