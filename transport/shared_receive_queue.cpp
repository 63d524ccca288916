#include "transport/shared_receive_queue.h"

#include <cerrno>
#include <utility>

namespace uroce::transport {

SharedReceiveQueue::SharedReceiveQueue(uint32_t pd, uint32_t capacity, uint32_t max_sge,
                                       std::function<void()> on_limit, XrcSrqBinding xrc)
    : pd_(pd),
      xrc_(std::move(xrc)),
      capacity_(capacity),
      max_sge_(max_sge),
      on_limit_(std::move(on_limit)) {}

int SharedReceiveQueue::post(const RecvWqe& wqe) {
    if (wqe.sgl.count > max_sge_) return EINVAL;
    std::lock_guard lock(mutex_);
    if (queue_.size() >= capacity_) return ENOMEM;
    queue_.push_back(wqe);
    return 0;
}

std::optional<RecvWqe> SharedReceiveQueue::take() {
    bool fire = false;
    std::optional<RecvWqe> out;
    {
        std::lock_guard lock(mutex_);
        if (closed_ || queue_.empty()) return std::nullopt;
        out = queue_.front();
        queue_.pop_front();
        // One shot: the application arms it again after the event (ibv_modify_srq).
        if (limit_ != 0 && queue_.size() < limit_) {
            limit_ = 0;
            fire = true;
        }
    }
    if (fire && on_limit_) {
        std::lock_guard lock(callback_mutex_);
        if (!callbacks_off_) on_limit_();
    }
    return out;
}

void SharedReceiveQueue::close() {
    {
        std::lock_guard lock(mutex_);
        closed_ = true;
    }
    // Waits for a limit callback under way.
    std::lock_guard lock(callback_mutex_);
    callbacks_off_ = true;
}

int SharedReceiveQueue::arm_limit(uint32_t limit) {
    return modify(std::nullopt, limit);
}

uint32_t SharedReceiveQueue::capacity() const {
    std::lock_guard lock(mutex_);
    return capacity_;
}

int SharedReceiveQueue::resize(uint32_t capacity) {
    return modify(capacity, std::nullopt);
}

int SharedReceiveQueue::modify(std::optional<uint32_t> capacity, std::optional<uint32_t> limit) {
    std::lock_guard lock(mutex_);
    const uint32_t new_capacity = capacity.value_or(capacity_);
    const uint32_t new_limit = limit.value_or(limit_);
    if (capacity && (new_capacity == 0 || new_capacity < queue_.size())) return EINVAL;
    if (new_limit > new_capacity) return EINVAL;
    capacity_ = new_capacity;
    limit_ = new_limit;
    return 0;
}

uint32_t SharedReceiveQueue::limit() const {
    std::lock_guard lock(mutex_);
    return limit_;
}

size_t SharedReceiveQueue::depth() const {
    std::lock_guard lock(mutex_);
    return queue_.size();
}

}  // namespace uroce::transport
