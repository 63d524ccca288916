// A shared receive queue (IBA 10.2.9): receive WQEs that any QP attached to it may take, in
// the order they were posted, and the one-shot limit event.
//
// A QP on an SRQ (RcQp's `srq`) takes its receive WQE here instead of from its own queue when
// a message needs one (take()), under the SRQ's own mutex, so QPs of different engine threads
// can share it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "transport/ring_queue.h"
#include "transport/work_request.h"

namespace uroce::transport {

class CompletionQueue;

// What makes an SRQ an XRC SRQ (IBA 10.2.9.2): its number, which requests name in their
// XRCETH, its XRC domain, which the target QP must share, and its own CQ, where the
// completions of its WQEs go whichever target QP received the message.
struct XrcSrqBinding {
    uint32_t srqn = 0;  // 0: an ordinary SRQ
    uint32_t xrcd = 0;
    std::shared_ptr<CompletionQueue> cq;
    // Released with the queue: the provider keeps its CQ from being destroyed through it
    // while any QP may still complete a WQE of this SRQ there.
    std::shared_ptr<void> cq_hold;
};

class SharedReceiveQueue {
  public:
    // `on_limit` runs (without the queue's lock) once when the armed limit is crossed:
    // the number of WQEs drops below the limit (IBV_EVENT_SRQ_LIMIT_REACHED).
    SharedReceiveQueue(uint32_t pd, uint32_t capacity, uint32_t max_sge,
                       std::function<void()> on_limit, XrcSrqBinding xrc = {});

    uint32_t pd() const { return pd_; }
    bool is_xrc() const { return xrc_.srqn != 0; }
    const XrcSrqBinding& xrc() const { return xrc_; }
    uint32_t capacity() const;
    uint32_t max_sge() const { return max_sge_; }

    // 0, EINVAL (too many SGEs), or ENOMEM (queue full).
    int post(const RecvWqe& wqe);
    // The oldest WQE, or nothing when the queue is empty (the responder sends an RNR NAK).
    std::optional<RecvWqe> take();
    // Arms the limit event: it fires once when fewer than `limit` WQEs remain. 0 disarms.
    // EINVAL if `limit` exceeds the capacity.
    int arm_limit(uint32_t limit);
    uint32_t limit() const;
    // ibv_modify_srq(IBV_SRQ_MAX_WR): EINVAL if fewer than the WQEs queued now, or below the
    // armed limit.
    int resize(uint32_t capacity);
    // ibv_modify_srq with both: each given value is checked against the other's new value,
    // and either both change or neither does (EINVAL).
    int modify(std::optional<uint32_t> capacity, std::optional<uint32_t> limit);
    size_t depth() const;
    // The SRQ is being destroyed: take() gives nothing more and, once this returns, no limit
    // callback runs or will run (a QP may still hold the queue for a moment).
    void close();

  private:
    const uint32_t pd_;
    const XrcSrqBinding xrc_;
    uint32_t capacity_;  // guarded by mutex_
    const uint32_t max_sge_;
    std::function<void()> on_limit_;
    mutable std::mutex mutex_;
    RingQueue<RecvWqe> queue_;
    uint32_t limit_ = 0;  // 0: not armed
    bool closed_ = false;
    std::mutex callback_mutex_;   // held while on_limit_ runs
    bool callbacks_off_ = false;  // guarded by callback_mutex_
};

}  // namespace uroce::transport
