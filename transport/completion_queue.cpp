#include "transport/completion_queue.h"

#include <time.h>

#include <cerrno>

#include <algorithm>

namespace uroce::transport {

CompletionQueue::CompletionQueue(uint32_t capacity, std::function<void()> on_event,
                                 std::function<void()> on_overflow)
    : capacity_(capacity), on_event_(std::move(on_event)), on_overflow_(std::move(on_overflow)) {}

bool CompletionQueue::push(const Completion& c) {
    bool fire = false;
    bool overflow = false;
    bool queued = false;
    {
        std::lock_guard lock(mutex_);
        if (queue_.size() >= capacity_) {
            // Report once per overrun, as hardware raises one CQ error event.
            overflow = !overflowed_;
            overflowed_ = true;
        } else {
            queue_.push_back(c);
            size_.store(queue_.size(), std::memory_order_release);
            // The completion timestamp (ibv_wc_read_completion_ts): when it entered the CQ.
            timespec ts{};
            clock_gettime(CLOCK_MONOTONIC, &ts);
            queue_.back().timestamp_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                                         static_cast<uint64_t>(ts.tv_nsec);
            queued = true;
            if (arm_ == Arm::Next ||
                (arm_ == Arm::Solicited && (c.solicited || c.status != WcStatus::Success))) {
                if (holders_ > 0) {
                    held_event_ = true;  // decided when the poller lets go
                } else {
                    arm_ = Arm::None;
                    fire = true;
                }
            }
        }
    }
    if (overflow && on_overflow_) on_overflow_();
    if (fire && on_event_) on_event_();
    return queued;
}

size_t CompletionQueue::poll(std::span<Completion> out) {
    if (size_.load(std::memory_order_acquire) == 0) return 0;
    std::lock_guard lock(mutex_);
    const size_t n = std::min(out.size(), queue_.size());
    for (size_t i = 0; i < n; ++i) {
        out[i] = queue_.front();
        queue_.pop_front();
    }
    size_.store(queue_.size(), std::memory_order_release);
    if (n > 0) overflowed_ = false;
    return n;
}

void CompletionQueue::arm(bool solicited_only) {
    std::lock_guard lock(mutex_);
    // A stronger arming is not weakened by a later solicited-only request.
    if (arm_ == Arm::Next) return;
    arm_ = solicited_only ? Arm::Solicited : Arm::Next;
}

void CompletionQueue::hold_events() {
    std::lock_guard lock(mutex_);
    ++holders_;
}

void CompletionQueue::release_events() {
    bool fire = false;
    {
        std::lock_guard lock(mutex_);
        if (holders_ > 0) --holders_;
        if (holders_ == 0 && held_event_) {
            held_event_ = false;
            if (!queue_.empty() && arm_ != Arm::None) {
                arm_ = Arm::None;
                fire = true;
            }
        }
    }
    if (fire && on_event_) on_event_();
}

size_t CompletionQueue::depth() const {
    return size_.load(std::memory_order_acquire);
}

}  // namespace uroce::transport

namespace uroce::transport {

const char* to_string(WcStatus s) {
    switch (s) {
        case WcStatus::Success:
            return "success";
        case WcStatus::LocLenErr:
            return "local length error";
        case WcStatus::LocQpOpErr:
            return "local QP operation error";
        case WcStatus::LocProtErr:
            return "local protection error";
        case WcStatus::WrFlushErr:
            return "flushed";
        case WcStatus::BadResp:
            return "bad response";
        case WcStatus::RemInvReqErr:
            return "remote invalid request";
        case WcStatus::RemAccessErr:
            return "remote access error";
        case WcStatus::RemOpErr:
            return "remote operation error";
        case WcStatus::RetryExcErr:
            return "retry count exceeded";
        case WcStatus::RnrRetryExcErr:
            return "RNR retry count exceeded";
        case WcStatus::MwBindErr:
            return "memory window bind error";
        case WcStatus::GeneralErr:
            return "general error";
    }
    return "?";
}

uint32_t CompletionQueue::capacity() const {
    std::lock_guard lock(mutex_);
    return capacity_;
}

size_t CompletionQueue::remove_qp(uint32_t qpn, bool keep_receives) {
    std::lock_guard lock(mutex_);
    const size_t before = queue_.size();
    size_t kept = 0;  // the others move up, in order
    for (size_t i = 0; i < before; ++i) {
        const Completion c = queue_[i];
        const bool receive = c.opcode == WcOpcode::Recv || c.opcode == WcOpcode::RecvRdmaWithImm;
        if (c.qp_num == qpn && !(keep_receives && receive)) continue;
        queue_[kept++] = c;
    }
    queue_.truncate(kept);
    size_.store(queue_.size(), std::memory_order_release);
    return before - queue_.size();
}

int CompletionQueue::resize(uint32_t capacity) {
    std::lock_guard lock(mutex_);
    if (capacity == 0 || capacity < queue_.size()) return EINVAL;
    capacity_ = capacity;
    return 0;
}

}  // namespace uroce::transport
