#include "transport/uc_qp.h"

#include <algorithm>
#include <cstdint>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/scatter.h"

namespace uroce::transport {

namespace {

// The IBA limits a message (the RETH DMA length) to 2^31 bytes.
constexpr uint64_t kMaxMessageBytes = 1ull << 31;
// UC opcodes are the RC SEND/WRITE ones with the transport bits 001.
constexpr uint8_t kUcTransportBits = 0x20;

struct OpcodeSet {
    wire::Opcode first, middle, last, only, last_imm, only_imm;
};
constexpr OpcodeSet kSendOps{wire::Opcode::RcSendFirst,   wire::Opcode::RcSendMiddle,
                             wire::Opcode::RcSendLast,    wire::Opcode::RcSendOnly,
                             wire::Opcode::RcSendLastImm, wire::Opcode::RcSendOnlyImm};
constexpr OpcodeSet kWriteOps{wire::Opcode::RcWriteFirst,   wire::Opcode::RcWriteMiddle,
                              wire::Opcode::RcWriteLast,    wire::Opcode::RcWriteOnly,
                              wire::Opcode::RcWriteLastImm, wire::Opcode::RcWriteOnlyImm};

bool is_send(SendOpcode op) {
    return op == SendOpcode::Send || op == SendOpcode::SendWithImm;
}

}  // namespace

UcQp::UcQp(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
           std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
           void* user_handle, std::shared_ptr<SharedReceiveQueue> srq)
    : QpCommon(engine, qpn, pd, caps, std::move(send_cq), std::move(recv_cq), user_handle,
               std::move(srq)) {}

int UcQp::modify(const QpAttributes& attrs, QpState expected, QpState next) {
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
            rq_.clear();
            queued_.clear();  // discarded, as the IBA discards a reset QP's work queues
            unsent_packets_ = 0;
            recv_.reset();
            in_message_ = InMessage::None;
            got_first_packet_ = false;
            send_psn_live_ = expected_psn_live_ = false;
            break;
        case QpState::Rtr:
            epsn_ = attrs_.rq_psn & kPsnMask;
            expected_psn_live_ = true;
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
    // What was queued left above: in SQD nothing is left to drain.
    if (next == QpState::Sqd && attrs_.sqd_notify) post_async(AsyncEventType::SqDrained);
    return 0;
}

bool UcQp::push(CompletionQueue& cq, const Completion& c) {
    if (cq.push(c)) return true;
    bump(engine_.counters().cq_overruns);
    if (state_ != QpState::Err) {
        post_async(AsyncEventType::QpFatal);
        enter_error();
    }
    return false;
}

Completion UcQp::send_completion(const SendWqe& wqe, WcStatus status) const {
    Completion c;
    c.wr_id = wqe.wr_id;
    c.status = status;
    c.opcode = is_send(wqe.opcode) ? WcOpcode::Send : WcOpcode::RdmaWrite;
    c.qp_num = qpn();
    return c;
}

void UcQp::complete_send(const SendWqe& wqe, WcStatus status) {
    if (status == WcStatus::Success && !wqe.signaled) return;
    push(*send_cq_, send_completion(wqe, status));
}

WcStatus UcQp::send_message(const SendWqe& wqe, TransmitBatch& batch) {
    const bool send = is_send(wqe.opcode);
    const bool with_imm =
        wqe.opcode == SendOpcode::SendWithImm || wqe.opcode == SendOpcode::RdmaWriteWithImm;
    const OpcodeSet& ops = send ? kSendOps : kWriteOps;
    const uint32_t mtu = attrs_.mtu;
    const uint32_t npkts = std::max<uint32_t>(1, (wqe.length + mtu - 1) / mtu);
    batch.set_alone(!batched(wqe));
    for (uint32_t i = 0; i < npkts; ++i) {
        const bool first = i == 0;
        const bool last = i + 1 == npkts;
        const uint32_t offset = i * mtu;
        const uint32_t len = std::min(mtu, wqe.length - std::min(wqe.length, offset));
        wire::Opcode op;
        if (first && last)
            op = with_imm ? ops.only_imm : ops.only;
        else if (first)
            op = ops.first;
        else if (last)
            op = with_imm ? ops.last_imm : ops.last;
        else
            op = ops.middle;
        wire::Headers h;
        h.bth.opcode = static_cast<uint8_t>(op) | kUcTransportBits;
        h.bth.dest_qp = attrs_.dest_qpn;
        h.bth.psn = next_psn_;
        h.bth.solicited = last && wqe.solicited;
        next_psn_ = psn_add(next_psn_, 1);
        if (first && !send) h.reth = {wqe.remote_addr, wqe.rkey, wqe.length};
        if (last && with_imm) h.imm = wqe.imm;
        iovec iov[kMaxSge];
        size_t niov = 0;
        if (!gather_checked(engine_.memory(), wqe, pd_, offset, len, iov, niov))
            return WcStatus::LocProtErr;
        const auto result = engine_.transmit(h, std::span(iov, niov), len, attrs_.dst_ip, sender_,
                                             0, &batch, &qp_counters_);
        if (result == Engine::TransmitResult::Failed) return WcStatus::LocQpOpErr;
        if (result == Engine::TransmitResult::Sent) {  // alone (the batch counts its own)
            bump(qp_counters_.tx_packets);
            bump(qp_counters_.tx_payload_bytes, len);
        }
    }
    return WcStatus::Success;  // a lost packet is the unreliable service's to have
}

int UcQp::post_send(const SendWqe& wqe, bool more) {
    std::lock_guard lock(mutex_);
    switch (wqe.opcode) {
        case SendOpcode::Send:
        case SendOpcode::SendWithImm:
        case SendOpcode::RdmaWrite:
        case SendOpcode::RdmaWriteWithImm:
            break;
        default:
            return EINVAL;  // UC has no READ and no atomics
    }
    switch (state_) {
        case QpState::Rts:
            break;
        case QpState::Sqd:
            // SQD starts no new work: the post waits for the move back to RTS (or ERR's
            // flush), as an RC post does.
            if (queued_.size() >= std::max<uint32_t>(caps_.max_send_wr, 1)) return ENOMEM;
            queued_.push_back(wqe);
            return 0;
        case QpState::Err:
            complete_send(wqe, WcStatus::WrFlushErr);
            return 0;
        default:
            return EINVAL;
    }
    queued_.push_back(wqe);
    if (!may_wait(wqe, more)) send_queued();
    return 0;
}

bool UcQp::may_wait(const SendWqe& wqe, bool more) {
    if (!batched(wqe)) return false;  // no flow control: see kUnreliableBatchedBytes
    const uint32_t mtu = std::max<uint32_t>(attrs_.mtu, 1);
    unsent_packets_ += std::max<uint32_t>(1, (wqe.length + mtu - 1) / mtu);
    // A batch's worth of packets (or the whole send queue) leaves at once.
    if (unsent_packets_ >= TransmitBatch::kMaxPackets ||
        queued_.size() >= std::max<uint32_t>(caps_.max_send_wr, 1))
        return false;
    if (more) return true;
    return hold_for_poll();
}

void UcQp::send_queued() {
    unsent_packets_ = 0;
    if (queued_.empty()) return;
    const BatchOutcome out = send_batched(queued_.size(), [this](size_t i, TransmitBatch& batch) {
        return send_message(queued_[i], batch);
    });
    for (size_t i = 0; i < out.sent && !queued_.empty(); ++i) complete_front(WcStatus::Success);
    if (out.failed == WcStatus::Success || queued_.empty()) return;
    // A send that failed locally stops the QP, as the IBA has it for RC too; the rest is
    // flushed.
    complete_front(out.failed);
    if (state_ != QpState::Err) enter_error();
}

void UcQp::complete_front(WcStatus status) {
    const bool report = status != WcStatus::Success || queued_.front().signaled;
    const Completion c = send_completion(queued_.front(), status);
    // Forgotten before the push: an overrun moves the QP to ERR, which flushes the queue.
    queued_.pop_front();
    if (report) push(*send_cq_, c);
}

QpCommon::Psns UcQp::psns() const {
    std::lock_guard lock(mutex_);
    Psns p;
    if (send_psn_live_) p.send = next_psn_;
    if (expected_psn_live_) p.expected = epsn_;
    return p;
}

size_t UcQp::send_room() const {
    std::lock_guard lock(mutex_);
    if (state_ != QpState::Sqd) return SIZE_MAX;
    const size_t cap = std::max<uint32_t>(caps_.max_send_wr, 1);
    return queued_.size() >= cap ? 0 : cap - queued_.size();
}

int UcQp::post_recv(const RecvWqe& wqe) {
    std::lock_guard lock(mutex_);
    if (state_ == QpState::Reset || srq_) return EINVAL;
    if (rq_.size() >= caps_.max_recv_wr) return ENOMEM;
    if (state_ == QpState::Err) {
        Completion c;
        c.wr_id = wqe.wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn();
        push(*recv_cq_, c);
        return 0;
    }
    rq_.push_back(wqe);
    return 0;
}

void UcQp::on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) {
    std::lock_guard lock(mutex_);
    if (!count_received(pkt)) return;
    if (src_ip != attrs_.dst_ip) {
        bump(engine_.counters().rx_wrong_peer);
        bump(qp_counters_.rx_wrong_peer);
        return;
    }
    if (state_ != QpState::Rtr && state_ != QpState::Rts && state_ != QpState::Sqd) {
        bump(engine_.counters().rx_wrong_state);
        return;
    }
    if (!got_first_packet_) {
        got_first_packet_ = true;
        if (state_ == QpState::Rtr) post_async(AsyncEventType::CommEstablished);
    }
    on_request(pkt);
}

void UcQp::drop_message() {
    if (in_message_ != InMessage::None) bump(engine_.counters().rx_uc_dropped);
    in_message_ = InMessage::None;
    recv_offset_ = 0;
}

void UcQp::on_request(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    if (psn != epsn_) {
        // Packets went missing (UC never sends one again): whatever was in progress is gone.
        bump(engine_.counters().rx_out_of_sequence);
        drop_message();
    }
    epsn_ = psn_add(psn, 1);
    const uint16_t flags = pkt.info->flags;
    const bool starts = flags & (wire::kFirst | wire::kOnly);
    const bool ends = flags & (wire::kLast | wire::kOnly);
    const InMessage kind = (flags & wire::kSend) ? InMessage::Send : InMessage::Write;
    if (in_message_ == InMessage::None && !starts) {
        // The rest of a message already given up.
        bump(engine_.counters().rx_uc_dropped);
        return;
    }
    if (in_message_ != InMessage::None && (starts || kind != in_message_)) {
        drop_message();  // the sender started over: the old message cannot be finished
        if (!starts) return;
    }
    const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
    const uint32_t mtu = attrs_.mtu;
    // PadCnt to a 4-byte boundary; First/Middle exactly one MTU; Last/Only at most one.
    const bool length_ok =
        (len + pkt.h.bth.pad) % 4 == 0 && (ends ? len <= mtu && (starts || len > 0) : len == mtu);
    if (!length_ok) {
        in_message_ = kind;
        drop_message();
        return;
    }
    const bool with_imm = pkt.info->headers & wire::kHasImm;
    auto take_wqe = [this]() -> bool {
        if (recv_) return true;
        if (srq_) {
            recv_ = srq_->take();
        } else if (!rq_.empty()) {
            recv_ = rq_.front();
            rq_.pop_front();
        }
        if (!recv_) bump(engine_.counters().rx_no_recv_wqe);
        return recv_.has_value();
    };
    auto complete_recv = [this](WcStatus status, uint32_t byte_len, bool imm_present, uint32_t imm,
                                bool solicited, WcOpcode opcode) {
        Completion c;
        c.wr_id = recv_->wr_id;
        c.status = status;
        c.opcode = opcode;
        c.byte_len = byte_len;
        c.qp_num = qpn();
        c.src_qp = attrs_.dest_qpn;
        c.with_imm = imm_present;
        c.imm = imm;
        c.solicited = solicited;
        recv_.reset();
        push(*recv_cq_, c);
    };

    if (kind == InMessage::Send) {
        if (starts) {
            if (!take_wqe()) return;  // no receiver ready: UC drops the message
            recv_offset_ = 0;
        }
        const uint32_t pd = srq_ ? srq_->pd() : pd_;
        if (uint64_t{recv_offset_} + len > recv_->sgl.total_length()) {
            // Longer than the buffer: that WQE completes with a length error, the rest of
            // the message is dropped.
            complete_recv(WcStatus::LocLenErr, recv_offset_, false, 0, false, WcOpcode::Recv);
            in_message_ = InMessage::Send;
            drop_message();
            return;
        }
        const std::span<const uint8_t> pieces[] = {pkt.payload};
        if (scatter_checked(engine_.memory(), recv_->sgl, pd, recv_offset_, pieces) !=
            KeyCheck::Ok) {
            complete_recv(WcStatus::LocProtErr, recv_offset_, false, 0, false, WcOpcode::Recv);
            post_async(AsyncEventType::QpFatal);
            enter_error();
            return;
        }
        recv_offset_ += len;
        if (ends) {
            in_message_ = InMessage::None;
            complete_recv(WcStatus::Success, recv_offset_, with_imm, pkt.h.imm, pkt.h.bth.solicited,
                          WcOpcode::Recv);
            recv_offset_ = 0;
        } else {
            in_message_ = InMessage::Send;
        }
        return;
    }

    // RDMA WRITE
    in_message_ = InMessage::Write;
    if (starts) {
        const wire::Reth& reth = pkt.h.reth;
        uint64_t local = 0;
        auto guard = engine_.memory().lock_shared();
        // The whole range on the first packet: a WRITE running off its region, or one the
        // QP does not allow, changes no byte.
        if (reth.dma_len > kMaxMessageBytes || !(attrs_.access & kRemoteWrite) ||
            (reth.dma_len > 0 &&
             engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len, kRemoteWrite,
                                           local, qpn()) != KeyCheck::Ok)) {
            guard.unlock();
            drop_message();
            return;
        }
        write_va_ = reth.va;
        write_rkey_ = reth.rkey;
        write_left_ = reth.dma_len;
        write_total_ = reth.dma_len;
    }
    if (len > write_left_ || (ends && len != write_left_)) {
        drop_message();
        return;
    }
    if (len > 0) {
        auto guard = engine_.memory().lock_shared();
        uint64_t local = 0;
        // Checked again per packet: a region deregistered mid-message stops it at once.
        if (engine_.memory().check_remote(write_rkey_, pd_, write_va_, len, kRemoteWrite, local,
                                          qpn()) != KeyCheck::Ok) {
            guard.unlock();
            drop_message();
            return;
        }
        if (!copy_last_byte_last(reinterpret_cast<uint8_t*>(local), pkt.payload.data(), len)) {
            engine_.memory().note_fault();
            guard.unlock();
            drop_message();
            return;
        }
    }
    write_va_ += len;
    write_left_ -= len;
    if (!ends) return;
    in_message_ = InMessage::None;
    if (with_imm) {
        // The data is in place; without a receive WQE the immediate cannot be reported.
        if (!take_wqe()) return;
        complete_recv(WcStatus::Success, write_total_, true, pkt.h.imm, pkt.h.bth.solicited,
                      WcOpcode::RecvRdmaWithImm);
    }
}

void UcQp::enter_error() {
    if (state_ == QpState::Err && rq_.empty() && !recv_ && queued_.empty()) return;
    state_ = QpState::Err;
    in_message_ = InMessage::None;
    unsent_packets_ = 0;
    while (!queued_.empty()) complete_front(WcStatus::WrFlushErr);
    auto flush = [this](uint64_t wr_id) {
        Completion c;
        c.wr_id = wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn();
        if (!recv_cq_->push(c)) bump(engine_.counters().cq_overruns);
    };
    if (recv_) {
        const uint64_t id = recv_->wr_id;
        recv_.reset();
        flush(id);
    }
    while (!rq_.empty()) {
        const uint64_t id = rq_.front().wr_id;
        rq_.pop_front();
        flush(id);
    }
    if (srq_) post_async(AsyncEventType::LastWqeReached);
}

void UcQp::on_ce_marked(const IpAddress& src_ip) {
    std::lock_guard lock(mutex_);
    answer_ce_mark(src_ip, attrs_.dst_ip, attrs_.dest_qpn);
}

}  // namespace uroce::transport
