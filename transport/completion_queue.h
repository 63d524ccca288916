// A completion queue: a bounded FIFO of completions that the transport fills and the
// application drains, with the IBA's one-shot arming for completion events.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>

#include "transport/ring_queue.h"
#include "transport/work_request.h"

namespace uroce::transport {

class CompletionQueue {
  public:
    // `on_event` runs (without the queue's lock) when an armed queue receives a completion
    // that satisfies the arming; `on_overflow` when a completion finds the queue full.
    CompletionQueue(uint32_t capacity, std::function<void()> on_event,
                    std::function<void()> on_overflow);

    // Adds a completion. Returns false (and reports an overflow) if the queue is full.
    bool push(const Completion& c);

    // Moves up to out.size() completions into out; returns how many.
    size_t poll(std::span<Completion> out);

    // Arms the queue for one event: on the next completion, or with `solicited_only`
    // on the next solicited or unsuccessful one.
    void arm(bool solicited_only);

    // A poller that is about to receive on its own thread (Engine::progress) and then take
    // completions holds events back meanwhile: a completion it takes itself needs no event,
    // and an event for it would be stale by the time the application reads it (it would
    // find the CQ empty: ibv_start_poll returns ENOENT after an event). release_events()
    // fires the held-back event if a completion that earned one is still queued; if the
    // poller took them all, no event goes out and the queue stays armed for the next one.
    void hold_events();
    void release_events();

    uint32_t capacity() const;
    size_t depth() const;
    // Takes out every completion of QP `qpn` (a QP moved to RESET: its work requests are
    // gone, and so are their completions, as NICs clean their CQs then). Returns how many.
    // With `keep_receives` its receive completions stay: those of a QP on an SRQ hand the
    // SRQ's buffers back to the application, which has no other way to learn they are free.
    size_t remove_qp(uint32_t qpn, bool keep_receives = false);
    // ibv_resize_cq: EINVAL if fewer entries than the completions waiting now.
    int resize(uint32_t capacity);

  private:
    uint32_t capacity_;  // guarded by mutex_
    std::function<void()> on_event_;
    std::function<void()> on_overflow_;
    mutable std::mutex mutex_;
    // A ring, not a std::deque: the deque took a block for every ten completions the engine
    // thread added and freed one for every ten the application took, a free across threads.
    // The ring grows to the most completions ever waiting at once (never past capacity_).
    RingQueue<Completion> queue_;
    // queue_.size(), also readable without the lock: a thread that spins on an empty CQ
    // never takes the mutex, so the engine thread adding a completion never finds it held by
    // a poller the scheduler preempted (it would sleep on the futex, then wait for that
    // poller's CPU: up to a scheduler slice when every core spins).
    std::atomic<size_t> size_{0};
    enum class Arm { None, Next, Solicited } arm_ = Arm::None;
    bool overflowed_ = false;
    int holders_ = 0;          // pollers holding events back
    bool held_event_ = false;  // a completion earned an event while they did
};

}  // namespace uroce::transport
