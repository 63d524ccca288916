// RcQp's part in congestion notification (congestion.h): a CNP for each CE-marked packet
// from the peer (paced), and a send window halved for each CNP from it (once per flight).
#include "transport/engine.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

void RcQp::on_ce_marked(const IpAddress& src_ip) {
    std::lock_guard lock(mutex_);
    answer_ce_mark(src_ip, attrs_.dst_ip, attrs_.dest_qpn);
}

void RcQp::on_cnp(const IpAddress& src_ip) {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    if (src_ip != attrs_.dst_ip) {
        // Only the peer's path can have congested this QP's packets.
        bump(engine_.counters().rx_wrong_peer);
        bump(qp_counters_.rx_wrong_peer);
        return;
    }
    // Nothing in flight: no flight to slow (a late CNP for one that is all acknowledged).
    if ((state_ != QpState::Rts && state_ != QpState::Sqd) || una_psn_ == sent_high_) return;
    // As a loss of the oldest packet in flight: once per flight, however many CNPs it
    // brings (a cut's own flight brings more while the queue drains).
    if (!window_.on_congestion(una_psn_, sent_high_)) return;
    bump(engine_.counters().cnp_window_cuts);
}

}  // namespace uroce::transport
