// Received packets for one QP, handed to it in one call (Qp::on_packets).
//
// A GRO train brings up to 64 packets for one QP in one datagram. Handed over one by one,
// each took the QP's mutex, a reference on the QP and a virtual call: about 30 ns of the
// ~400 ns a 4 KiB packet costs to receive (docs/performance-log.md). The engine gathers
// consecutive packets for one QP from one source here instead and hands them over together.
// It hands them over before any other QP (or the same QP from another source) gets a
// packet, before a CNP, a multicast datagram or an ECN mark is delivered, and before the
// socket is read again, whose buffers the packets' payloads point into
// (Engine::finish_run): every QP sees what arrived in the order it arrived, as before.
#pragma once

#include <array>
#include <cstddef>
#include <span>

#include "transport/qp.h"
#include "uroce/ip_address.h"
#include "uroce/wire.h"

namespace uroce::transport {

class PacketRun {
  public:
    static constexpr size_t kMaxPackets = 64;  // a GRO train's most (TransmitBatch)

    bool empty() const { return count_ == 0; }
    size_t size() const { return count_; }
    // Whether a packet for `qp` from `src_ip` may be added without handing over first.
    bool joins(const Qp* qp, const IpAddress& src_ip) const {
        return count_ == 0 || (qp == qp_ && count_ < kMaxPackets && src_ip == src_ip_);
    }
    // Requires joins(&qp, src_ip). The packet's payload must stay where it is until
    // hand_over().
    void add(Qp& qp, const IpAddress& src_ip, const wire::ParsedPacket& pkt) {
        if (count_ == 0) {
            qp_ = &qp;
            src_ip_ = src_ip;
        }
        packets_[count_++] = pkt;
    }
    // Gives the packets to their QP, and empties the run.
    void hand_over() {
        if (count_ == 0) return;
        const size_t n = count_;
        count_ = 0;
        qp_->on_packets(std::span(packets_.data(), n), src_ip_);
        qp_ = nullptr;
    }

  private:
    Qp* qp_ = nullptr;  // kept alive by the engine's touched_ list until the batch ends
    IpAddress src_ip_;
    size_t count_ = 0;
    std::array<wire::ParsedPacket, kMaxPackets> packets_{};
};

}  // namespace uroce::transport
