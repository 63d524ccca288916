#include "transport/cm/gsi_qp.h"

#include <sys/uio.h>

#include "transport/engine.h"
#include "transport/psn.h"

namespace uroce::transport::cm {

GsiQp::GsiQp(Engine& engine, Receiver receiver)
    : Qp(kGsiQpn),
      engine_(engine),
      sender_(engine.sender_for_qpn(kGsiQpn)),
      receiver_(std::move(receiver)) {}

void GsiQp::on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) {
    std::shared_lock lock(receiving_);
    if (closed_.load(std::memory_order_acquire)) return;
    counters_.rx_mads.fetch_add(1, std::memory_order_relaxed);
    // The CM speaks IPv4 only so far (docs/rdma-cm.md): a MAD from an IPv6 peer is dropped.
    if (!src_ip.is_v4() || pkt.h.bth.opcode != static_cast<uint8_t>(wire::Opcode::UdSendOnly) ||
        pkt.h.deth.qkey != kGsiQkey || pkt.payload.size() < kMadBytes) {
        counters_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    receiver_(src_ip.v4(), pkt.payload.first(kMadBytes));
}

void GsiQp::close() {
    std::unique_lock lock(receiving_);
    closed_.store(true, std::memory_order_release);
}

void GsiQp::send_mad(uint32_t dst_ip, std::span<const uint8_t, kMadBytes> mad) {
    if (closed_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(send_mutex_);
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::UdSendOnly);
    h.bth.migreq = false;
    h.bth.ack_req = true;
    h.bth.dest_qp = kGsiQpn;
    h.bth.psn = next_psn_;
    next_psn_ = psn_add(next_psn_, 1);
    h.deth.qkey = kGsiQkey;
    h.deth.src_qp = kGsiQpn;
    iovec iov{const_cast<uint8_t*>(mad.data()), mad.size()};
    const auto r = engine_.transmit(h, std::span(&iov, 1), static_cast<uint32_t>(mad.size()),
                                    IpAddress::v4(dst_ip), sender_);
    if (r == Engine::TransmitResult::Sent) {
        counters_.tx_mads.fetch_add(1, std::memory_order_relaxed);
    } else {
        counters_.tx_lost.fetch_add(1, std::memory_order_relaxed);
    }
}

}  // namespace uroce::transport::cm
