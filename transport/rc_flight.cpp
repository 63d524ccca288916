// RC requester: its share of the engine's flight budget (flight_budget.h).
#include <algorithm>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

int64_t RcQp::flight_bytes() const {
    if (closed_ || (state_ != QpState::Rts && state_ != QpState::Sqd)) return 0;
    uint32_t from = una_psn_;
    if (psn_after(flight_from_, una_psn_) && !psn_after(flight_from_, sent_high_))
        from = flight_from_;
    const int32_t n = psn_diff(sent_high_, from);
    if (n <= 0) return 0;
    return int64_t{std::min<uint32_t>(static_cast<uint32_t>(n), window_.ceiling())} * attrs_.mtu;
}

int64_t RcQp::flight_bytes_of(const SqEntry& e) const {
    const uint32_t packets =
        e.wqe.opcode == SendOpcode::RdmaRead ? std::min(e.npkts, window_.ceiling()) : 1;
    return int64_t{packets} * attrs_.mtu;
}

bool RcQp::flight_admits(const SqEntry& e) {
    FlightBudget& budget = engine_.flight_budget();
    if (budget.admits(flight_pending_, flight_turn_)) {
        flight_pending_ += flight_bytes_of(e);
        return true;
    }
    if (!flight_waiting_) {
        flight_waiting_ = true;
        bump(engine_.counters().flight_waits);
        // Room already (others waited before it): no ACK may come to give the turns.
        if (budget.wait(qpn_)) engine_.schedule_flight_turns();
    }
    return false;
}

bool RcQp::flight_fills() const {
    const FlightBudget& budget = engine_.flight_budget();
    return budget.in_flight() + flight_pending_ >= budget.bytes();
}

void RcQp::settle_flight() {
    flight_pending_ = 0;
    const int64_t now = flight_bytes();
    if (now == flight_charge_) return;
    const int64_t delta = now - flight_charge_;
    flight_charge_ = now;
    if (engine_.flight_budget().change(delta)) engine_.schedule_flight_turns();
}

void RcQp::take_flight_turn() {
    std::lock_guard lock(mutex_);
    flight_waiting_ = false;
    if (closed_) return;
    flight_turn_ = true;
    pump();
    flight_turn_ = false;
}

}  // namespace uroce::transport
