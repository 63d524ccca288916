#include "transport/ud_qp.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "transport/engine.h"
#include "transport/multicast_groups.h"
#include "transport/psn.h"
#include "transport/scatter.h"

namespace uroce::transport {

namespace {

constexpr uint32_t kIcrcBytes = 4;
constexpr uint32_t kUdpHeaderBytes = 8;
constexpr uint32_t kIpv4HeaderBytes = 20;

// The GRH area of a UD receive for a RoCEv2 packet over IPv4, as the kernel's rxe fills it:
// 20 zero bytes, then the IPv4 header of the packet. The socket does not hand uroce the
// header it received, so it is rebuilt from what the packet was: its addresses, protocol
// UDP, its length, DF, a TTL of 64 (what Linux sends with), and a valid checksum, which
// ibv_init_ah_from_wc uses to tell an IPv4 header from an IPv6 GRH.
void build_ipv4_grh(uint8_t* grh, const IpAddress& src_ip, const IpAddress& dst_ip,
                    uint32_t udp_payload_bytes) {
    std::memset(grh, 0, kGrhBytes);
    uint8_t* ip = grh + kGrhBytes - kIpv4HeaderBytes;
    const uint16_t total =
        static_cast<uint16_t>(kIpv4HeaderBytes + kUdpHeaderBytes + udp_payload_bytes);
    ip[0] = 0x45;  // version 4, 5 words
    ip[2] = static_cast<uint8_t>(total >> 8);
    ip[3] = static_cast<uint8_t>(total);
    ip[6] = 0x40;  // DF
    ip[8] = 64;    // TTL
    ip[9] = 17;    // UDP
    std::memcpy(ip + 12, src_ip.bytes().data() + 12, 4);
    std::memcpy(ip + 16, dst_ip.bytes().data() + 12, 4);
    uint32_t sum = 0;
    for (uint32_t i = 0; i < kIpv4HeaderBytes; i += 2) sum += (uint32_t{ip[i]} << 8) | ip[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    const uint16_t check = static_cast<uint16_t>(~sum);
    ip[10] = static_cast<uint8_t>(check >> 8);
    ip[11] = static_cast<uint8_t>(check);
}

// Over IPv6 the GRH area holds the packet's IPv6 header, which has the GRH's layout: version
// 6, traffic class and flow label 0, the payload (UDP) length, next header UDP, hop limit 64,
// the source and destination addresses (the GIDs).
void build_ipv6_grh(uint8_t* grh, const IpAddress& src_ip, const IpAddress& dst_ip,
                    uint32_t udp_payload_bytes) {
    std::memset(grh, 0, kGrhBytes);
    const uint16_t payload = static_cast<uint16_t>(kUdpHeaderBytes + udp_payload_bytes);
    grh[0] = 0x60;
    grh[4] = static_cast<uint8_t>(payload >> 8);
    grh[5] = static_cast<uint8_t>(payload);
    grh[6] = 17;
    grh[7] = 64;
    std::memcpy(grh + 8, src_ip.bytes().data(), 16);
    std::memcpy(grh + 24, dst_ip.bytes().data(), 16);
}

void build_grh(uint8_t* grh, const IpAddress& src_ip, const IpAddress& dst_ip,
               uint32_t udp_payload_bytes) {
    if (dst_ip.is_v4()) {
        build_ipv4_grh(grh, src_ip, dst_ip, udp_payload_bytes);
    } else {
        build_ipv6_grh(grh, src_ip, dst_ip, udp_payload_bytes);
    }
}

}  // namespace

UdQp::UdQp(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
           std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
           void* user_handle, std::shared_ptr<SharedReceiveQueue> srq)
    : QpCommon(engine, qpn, pd, caps, std::move(send_cq), std::move(recv_cq), user_handle,
               std::move(srq)) {}

UdAttributes UdQp::attributes() const {
    std::lock_guard lock(mutex_);
    return attrs_;
}

int UdQp::modify(const UdAttributes& attrs, QpState expected, QpState next) {
    std::lock_guard lock(mutex_);
    // Queued posts leave under the attributes they were posted under, and before SQD (whose
    // send queue is drained); a local error there moves the QP to ERR first.
    if (state_ == QpState::Rts && next != QpState::Reset && next != QpState::Err) send_queued();
    const QpState prev = state_;
    if (prev != expected && next != QpState::Reset && next != QpState::Err) return EINVAL;
    attrs_ = attrs;
    if (next == prev && next != QpState::Sqd) return 0;
    switch (next) {
        case QpState::Reset:
            rq_.clear();  // discarded, as the IBA discards a reset QP's work queues
            queued_.clear();
            send_psn_live_ = false;
            break;
        case QpState::Rts:
            if (prev == QpState::Rtr) {
                next_psn_ = attrs_.sq_psn & kPsnMask;
                send_psn_live_ = true;
            }
            break;
        case QpState::Err:
            enter_error();
            return 0;
        default:
            break;
    }
    state_ = next;
    // What was posted in SQD leaves now (a local error moves the QP on to ERR).
    if (next == QpState::Rts) send_queued();
    // Sends complete as they leave: entering SQD, nothing is in flight.
    if (next == QpState::Sqd && attrs_.sqd_notify) post_async(AsyncEventType::SqDrained);
    return 0;
}

void UdQp::complete_send(uint64_t wr_id, bool signaled, WcStatus status) {
    if (status == WcStatus::Success && !signaled) return;
    Completion c;
    c.wr_id = wr_id;
    c.status = status;
    c.opcode = WcOpcode::Send;
    c.qp_num = qpn();
    if (!send_cq_->push(c)) {
        bump(engine_.counters().cq_overruns);
        if (state_ != QpState::Err) {
            post_async(AsyncEventType::QpFatal);
            enter_error();
        }
    }
}

void UdQp::complete_front(WcStatus status) {
    const uint64_t wr_id = queued_.front().wqe.wr_id;
    const bool signaled = queued_.front().wqe.signaled;
    queued_.pop_front();
    complete_send(wr_id, signaled, status);
}

WcStatus UdQp::build(const SendWqe& wqe, const UdDestination& dest, TransmitBatch& batch) {
    if (dest.pd && *dest.pd != pd_) return WcStatus::LocQpOpErr;  // nothing leaves
    if (wqe.length > attrs_.mtu) return WcStatus::LocLenErr;
    batch.set_alone(!batched(wqe));
    const bool with_imm = wqe.opcode == SendOpcode::SendWithImm;
    wire::Headers h;
    h.bth.opcode =
        static_cast<uint8_t>(with_imm ? wire::Opcode::UdSendOnlyImm : wire::Opcode::UdSendOnly);
    const bool multicast = dest.ip.is_multicast();
    // A multicast packet names no QP: every QP attached to the group takes it.
    h.bth.dest_qp = multicast ? kMulticastQpn : dest.qpn & kPsnMask;
    h.bth.psn = next_psn_;
    h.bth.solicited = wqe.solicited;
    next_psn_ = psn_add(next_psn_, 1);
    h.deth.qkey = (dest.qkey & kPrivilegedQkeyBit) ? attrs_.qkey : dest.qkey;
    h.deth.src_qp = qpn();
    if (with_imm) h.imm = wqe.imm;
    iovec iov[kMaxSge];
    size_t niov = 0;
    if (wqe.is_inline) {
        if (wqe.length) iov[niov++] = {const_cast<uint8_t*>(wqe.inline_data.data()), wqe.length};
    } else {
        for (uint32_t i = 0; i < wqe.sgl.count; ++i) {
            const Sge& s = wqe.sgl.sge[i];
            if (s.length == 0) continue;
            if (engine_.memory().check_local(s.lkey, pd_, s.addr, s.length, 0) != KeyCheck::Ok)
                return WcStatus::LocProtErr;
            iov[niov++] = {reinterpret_cast<void*>(s.addr), s.length};
        }
    }
    // A hop limit of 0 still reaches the link, as it does from a NIC (Linux keeps a TTL 0
    // multicast packet on the host).
    const uint8_t ttl = multicast ? std::max<uint8_t>(dest.hop_limit, 1) : 0;
    const auto result = engine_.transmit(h, std::span(iov, niov), wqe.length, dest.ip, sender_, ttl,
                                         &batch, &qp_counters_);
    if (result == Engine::TransmitResult::Failed) return WcStatus::LocQpOpErr;
    if (result == Engine::TransmitResult::Sent) {  // alone (the batch counts its own)
        bump(qp_counters_.tx_packets);
        bump(qp_counters_.tx_payload_bytes, wqe.length);
    }
    return WcStatus::Success;  // a loss on the way is the datagram service's to have
}

void UdQp::send_queued() {
    if (queued_.empty()) return;
    const BatchOutcome out = send_batched(queued_.size(), [this](size_t i, TransmitBatch& batch) {
        return build(queued_[i].wqe, queued_[i].dest, batch);
    });
    for (size_t i = 0; i < out.sent && !queued_.empty(); ++i) complete_front(WcStatus::Success);
    if (out.failed == WcStatus::Success || queued_.empty()) return;
    // The IBA puts a QP whose send failed locally into ERR, as for RC; the rest is flushed.
    complete_front(out.failed);
    if (state_ != QpState::Err) enter_error();
}

bool UdQp::may_wait(const SendWqe& wqe, bool more) {
    if (!batched(wqe)) return false;  // no flow control: see kUnreliableBatchedBytes
    // A batch's worth (or the whole send queue) leaves at once.
    const size_t full =
        std::min<size_t>(TransmitBatch::kMaxPackets, std::max<uint32_t>(caps_.max_send_wr, 1));
    if (queued_.size() >= full) return false;
    if (more) return true;
    return hold_for_poll();
}

int UdQp::post_send(const SendWqe& wqe, const UdDestination& dest, bool more) {
    std::lock_guard lock(mutex_);
    if (wqe.opcode != SendOpcode::Send && wqe.opcode != SendOpcode::SendWithImm) return EINVAL;
    switch (state_) {
        case QpState::Rts:
        case QpState::Sqd:
        case QpState::Err:
            break;
        default:
            return EINVAL;
    }
    if (wqe.length > attrs_.mtu) return EINVAL;
    if (state_ == QpState::Err) {
        complete_send(wqe.wr_id, wqe.signaled, WcStatus::WrFlushErr);
        return 0;
    }
    if (state_ == QpState::Sqd) {
        // SQD starts no new work: the post waits for the move back to RTS (or ERR's flush),
        // as an RC post does.
        if (queued_.size() >= std::max<uint32_t>(caps_.max_send_wr, 1)) return ENOMEM;
        queued_.push_back(QueuedSend{wqe, dest});
        return 0;
    }
    queued_.push_back(QueuedSend{wqe, dest});
    if (!may_wait(wqe, more)) send_queued();
    return 0;
}

QpCommon::Psns UdQp::psns() const {
    std::lock_guard lock(mutex_);
    Psns p;
    if (send_psn_live_) p.send = next_psn_;  // a datagram expects no PSN
    return p;
}

size_t UdQp::send_room() const {
    std::lock_guard lock(mutex_);
    if (state_ != QpState::Sqd) return SIZE_MAX;
    const size_t cap = std::max<uint32_t>(caps_.max_send_wr, 1);
    return queued_.size() >= cap ? 0 : cap - queued_.size();
}

int UdQp::post_recv(const RecvWqe& wqe) {
    std::lock_guard lock(mutex_);
    if (state_ == QpState::Reset || srq_) return EINVAL;
    if (rq_.size() >= caps_.max_recv_wr) return ENOMEM;
    if (state_ == QpState::Err) {
        Completion c;
        c.wr_id = wqe.wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn();
        if (!recv_cq_->push(c)) bump(engine_.counters().cq_overruns);
        return 0;
    }
    rq_.push_back(wqe);
    return 0;
}

void UdQp::on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) {
    receive(pkt, src_ip, engine_.config().ip);
}

void UdQp::on_multicast(const wire::ParsedPacket& pkt, const IpAddress& src_ip,
                        const IpAddress& group) {
    receive(pkt, src_ip, group);
}

void UdQp::receive(const wire::ParsedPacket& pkt, const IpAddress& src_ip,
                   const IpAddress& dst_ip) {
    std::lock_guard lock(mutex_);
    if (!count_received(pkt)) return;
    if (state_ != QpState::Rtr && state_ != QpState::Rts && state_ != QpState::Sqd) {
        bump(engine_.counters().rx_wrong_state);
        return;
    }
    if (pkt.h.deth.qkey != attrs_.qkey) {
        bump(engine_.counters().rx_bad_qkey);
        return;
    }
    // A datagram is taken up to the largest IBA MTU whatever this port's: its sender's port
    // may have a larger MTU than ours (another device, an rxe peer), and the receive buffer's
    // size is what decides, as rxe decides (IBA C9-92 checks only RC/UC against the PMTU).
    if (pkt.payload.size() > kLargestMtu) {
        bump(engine_.counters().rx_malformed);
        return;
    }
    std::optional<RecvWqe> wqe;
    if (srq_) {
        wqe = srq_->take();
    } else if (!rq_.empty()) {
        wqe = rq_.front();
        rq_.pop_front();
    }
    if (!wqe) {
        bump(engine_.counters().rx_no_recv_wqe);
        return;
    }
    const bool with_imm = pkt.info->headers & wire::kHasImm;
    Completion c;
    c.wr_id = wqe->wr_id;
    c.opcode = WcOpcode::Recv;
    c.qp_num = qpn();
    c.src_qp = pkt.h.deth.src_qp;
    c.with_imm = with_imm;
    c.imm = pkt.h.imm;
    c.solicited = pkt.h.bth.solicited;
    c.with_grh = true;
    const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
    if (uint64_t{kGrhBytes} + len > wqe->sgl.total_length()) {
        // Too long for the buffer: this WQE completes in error, the QP goes on (a peer must
        // not be able to stop it with one packet).
        c.status = WcStatus::LocLenErr;
    } else {
        uint8_t grh[kGrhBytes];
        build_grh(grh, src_ip, dst_ip, pkt.info->header_bytes + len + pkt.h.bth.pad + kIcrcBytes);
        const std::span<const uint8_t> pieces[] = {{grh, kGrhBytes}, pkt.payload};
        const uint32_t pd = srq_ ? srq_->pd() : pd_;
        c.status = scatter_checked(engine_.memory(), wqe->sgl, pd, 0, pieces) == KeyCheck::Ok
                       ? WcStatus::Success
                       : WcStatus::LocProtErr;
        c.byte_len = kGrhBytes + len;
    }
    if (!recv_cq_->push(c)) {
        bump(engine_.counters().cq_overruns);
        post_async(AsyncEventType::QpFatal);
        enter_error();
        return;
    }
    if (c.status == WcStatus::LocProtErr) {
        // Our own receive buffer is bad: the QP cannot go on (as for RC).
        post_async(AsyncEventType::QpFatal);
        enter_error();
    }
}

void UdQp::enter_error() {
    state_ = QpState::Err;
    while (!queued_.empty()) complete_front(WcStatus::WrFlushErr);
    while (!rq_.empty()) {
        Completion c;
        c.wr_id = rq_.front().wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn();
        rq_.pop_front();
        if (!recv_cq_->push(c)) bump(engine_.counters().cq_overruns);
    }
    if (srq_) post_async(AsyncEventType::LastWqeReached);
}

}  // namespace uroce::transport
