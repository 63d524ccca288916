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
    return count_received(std::span(&pkt, 1));
}

bool QpCommon::count_received(std::span<const wire::ParsedPacket> pkts) {
    if (closed_) {
        bump(engine_.counters().rx_unknown_qp, pkts.size());
        return false;
    }
    uint64_t bytes = 0;
    for (const wire::ParsedPacket& pkt : pkts) bytes += pkt.payload.size();
    bump(qp_counters_.rx_packets, pkts.size());
    bump(qp_counters_.rx_payload_bytes, bytes);
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

bool QpCommon::hold_for_poll() {
    if (!engine_.hold_posts()) return false;
    bump(engine_.counters().tx_held_posts);
    if (held_noted_) return true;
    held_noted_ = true;
    engine_.note_held_post(qpn());
    // The pollers may have left between the two questions: then nobody would send.
    return engine_.hold_posts();
}

QpCommon::BatchOutcome QpCommon::send_batched(
    size_t n, const std::function<WcStatus(size_t i, TransmitBatch& batch)>& build) {
    BatchOutcome out;
    TransmitBatch batch(engine_, &qp_counters_);
    batch.pin(engine_.memory());  // payloads are gathered from registered memory
    for (; out.sent < n; ++out.sent) {
        batch.set_tag(static_cast<uint32_t>(out.sent));
        out.failed = build(out.sent, batch);
        if (out.failed != WcStatus::Success) break;
    }
    engine_.flush(batch);
    // A packet the kernel refuses for good fails its post; those after it were not sent.
    if (batch.failed_tag() != TransmitBatch::kNoTag && batch.failed_tag() < out.sent) {
        out.sent = batch.failed_tag();
        out.failed = WcStatus::LocQpOpErr;
    }
    return out;
}

void QpCommon::ring() {
    std::lock_guard lock(mutex_);
    if (state_ != QpState::Rts) return;
    if (engine_.hold_posts() && held_noted_) return;
    send_queued();
}

void QpCommon::send_held() {
    std::lock_guard lock(mutex_);
    held_noted_ = false;
    if (closed_ || state_ != QpState::Rts) return;
    send_queued();
}

}  // namespace uroce::transport
