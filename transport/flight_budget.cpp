// The engine's budget of request bytes in flight (flight_budget.h).
#include "transport/flight_budget.h"

namespace uroce::transport {

bool FlightBudget::change(int64_t delta) {
    // Sequentially consistent, as wait()'s fence: a QP joining the line meanwhile sees the
    // room, or this sees it waiting.
    const int64_t now = in_flight_.fetch_add(delta, std::memory_order_seq_cst) + delta;
    return delta < 0 && now < bytes_ && waiting_count_.load(std::memory_order_seq_cst) != 0;
}

bool FlightBudget::wait(uint32_t qpn) {
    {
        std::lock_guard lock(mutex_);
        waiting_.push_back(qpn);
        waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
    }
    // Checked after joining the line: a charge released between the caller's refusal and
    // here saw nobody waiting, and woke nobody.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return in_flight() < bytes_;
}

bool FlightBudget::next_turn(uint32_t& qpn) {
    if (in_flight() >= bytes_) return false;
    std::lock_guard lock(mutex_);
    if (waiting_.empty()) return false;
    qpn = waiting_.front();
    waiting_.pop_front();
    waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
    return true;
}

}  // namespace uroce::transport
