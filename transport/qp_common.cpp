// See qp_common.h.
#include "transport/qp_common.h"

#include <utility>

#include "transport/engine.h"

namespace uroce::transport {

QpCommon::QpCommon(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
                   std::shared_ptr<CompletionQueue> send_cq,
                   std::shared_ptr<CompletionQueue> recv_cq, void* user_handle,
                   std::shared_ptr<SharedReceiveQueue> srq)
    : Qp(qpn),
      engine_(engine),
      sender_(engine.sender_for_qpn(qpn)),
      qp_counters_(engine.qp_counters(qpn)),
      pd_(pd),
      caps_(caps),
      send_cq_(std::move(send_cq)),
      recv_cq_(std::move(recv_cq)),
      user_handle_(user_handle),
      srq_(std::move(srq)) {
    qp_counters_.claim(qpn);
}

QpState QpCommon::state() const {
    std::lock_guard lock(mutex_);
    return state_;
}

void QpCommon::close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
}

bool QpCommon::count_received(const wire::ParsedPacket& pkt) {
    if (closed_) {
        bump(engine_.counters().rx_unknown_qp);
        return false;
    }
    bump(qp_counters_.rx_packets);
    bump(qp_counters_.rx_payload_bytes, pkt.payload.size());
    return true;
}

void QpCommon::post_async(AsyncEventType type) {
    engine_.post_async(AsyncEvent{type, user_handle_});
}

void QpCommon::answer_ce_mark(const IpAddress& src_ip, const IpAddress& peer_ip,
                              uint32_t peer_qpn) {
    if (closed_ || src_ip != peer_ip) return;
    if (state_ != QpState::Rtr && state_ != QpState::Rts && state_ != QpState::Sqd) return;
    if (!cnp_pacer_.take(CnpPacer::Clock::now())) {
        bump(engine_.counters().cnps_paced);
        return;
    }
    static const uint8_t kReserved[wire::kCnpReservedBytes] = {};
    const iovec reserved{const_cast<uint8_t*>(kReserved), sizeof kReserved};
    // Alone, not in a train: it answers no request and must not wait for one.
    const Engine::TransmitResult sent =
        engine_.transmit(cnp_headers(peer_qpn), std::span(&reserved, 1), sizeof kReserved, peer_ip,
                         sender_, 0, nullptr, &qp_counters_);
    if (sent == Engine::TransmitResult::Sent) bump(engine_.counters().tx_cnps);
}

}  // namespace uroce::transport
