// RC responder: executes incoming requests, strictly in PSN order, after the checks the
// IBA asks for; no byte reaches memory before its key, range and access rights pass.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

namespace {

// Copies so that the last byte becomes visible last: applications (ib_write_lat among
// them) poll the final byte of an RDMA WRITE to learn that the whole message is there.
void copy_last_byte_last(uint8_t* dst, const uint8_t* src, size_t len) {
    if (len == 0) return;
    std::memcpy(dst, src, len - 1);
    std::atomic_ref<uint8_t>(dst[len - 1]).store(src[len - 1], std::memory_order_release);
}

}  // namespace

void RcQp::send_ack(uint32_t psn, uint8_t syndrome) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcAcknowledge);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.bth.psn = psn & kPsnMask;
    h.aeth.syndrome = syndrome;
    h.aeth.msn = msn_ & kPsnMask;
    transmit(h, {}, 0);
}

void RcQp::flush_ack() {
    std::lock_guard lock(mutex_);
    if (!ack_pending_ || state_ == QpState::Err || state_ == QpState::Reset) return;
    ack_pending_ = false;
    bump(engine_.counters().tx_acks);
    send_ack(psn_add(epsn_, kPsnMask),
             wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits));
}

void RcQp::complete_recv(WcStatus status, uint32_t byte_len, bool with_imm, uint32_t imm,
                         bool solicited, WcOpcode opcode) {
    if (rq_.empty()) return;
    Completion c;
    c.wr_id = rq_.front().wr_id;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = byte_len;
    c.qp_num = qpn_;
    c.src_qp = attrs_.dest_qpn;
    c.with_imm = with_imm;
    c.imm = imm;
    c.solicited = solicited;
    rq_.pop_front();
    recv_taken_ = false;
    push_completion(*recv_cq_, c);
}

void RcQp::responder_error(wire::NakCode code, uint32_t psn, AsyncEventType event) {
    switch (code) {
        case wire::NakCode::RemoteAccessError:
            bump(engine_.counters().tx_access_naks);
            break;
        default:
            bump(engine_.counters().tx_invalid_naks);
            break;
    }
    send_ack(psn, wire::Aeth::make(wire::AckType::Nak, static_cast<uint8_t>(code)));
    post_async(event);
    enter_error();
}

WcStatus RcQp::scatter_to_recv(std::span<const uint8_t> data) {
    const RecvWqe& r = rq_.front();
    if (recv_offset_ + data.size() > r.sgl.total_length()) {
        complete_recv(WcStatus::LocLenErr, recv_offset_, false, 0, false, WcOpcode::Recv);
        return WcStatus::LocLenErr;
    }
    auto guard = engine_.memory().lock_shared();
    uint32_t skip = recv_offset_;
    size_t done = 0;
    for (uint32_t i = 0; i < r.sgl.count && done < data.size(); ++i) {
        const Sge& s = r.sgl.sge[i];
        if (skip >= s.length) {
            skip -= s.length;
            continue;
        }
        const uint32_t take =
            static_cast<uint32_t>(std::min<size_t>(data.size() - done, s.length - skip));
        if (engine_.memory().check_local(s.lkey, pd_, s.addr + skip, take, kLocalWrite) !=
            KeyCheck::Ok) {
            complete_recv(WcStatus::LocProtErr, recv_offset_, false, 0, false, WcOpcode::Recv);
            return WcStatus::LocProtErr;
        }
        std::memcpy(reinterpret_cast<void*>(s.addr + skip), data.data() + done, take);
        done += take;
        skip = 0;
    }
    recv_offset_ += static_cast<uint32_t>(data.size());
    return WcStatus::Success;
}

void RcQp::execute_read(const wire::ParsedPacket& pkt, bool duplicate) {
    const wire::Reth& reth = pkt.h.reth;
    const uint32_t mtu = attrs_.mtu;
    const uint32_t npkts = std::max<uint32_t>(1, (reth.dma_len + mtu - 1) / mtu);
    for (uint32_t i = 0; i < npkts; ++i) {
        const uint32_t offset = i * mtu;
        const uint32_t len = std::min(mtu, reth.dma_len - offset);
        wire::Headers h;
        wire::Opcode op = wire::Opcode::RcReadResponseMiddle;
        if (npkts == 1)
            op = wire::Opcode::RcReadResponseOnly;
        else if (i == 0)
            op = wire::Opcode::RcReadResponseFirst;
        else if (i + 1 == npkts)
            op = wire::Opcode::RcReadResponseLast;
        h.bth.opcode = static_cast<uint8_t>(op);
        h.bth.dest_qp = attrs_.dest_qpn;
        h.bth.psn = psn_add(pkt.h.bth.psn, i);
        h.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits);
        h.aeth.msn = msn_ & kPsnMask;
        auto guard = engine_.memory().lock_shared();
        uint64_t local = 0;
        if (len > 0 && engine_.memory().check_remote(reth.rkey, pd_, reth.va + offset, len,
                                                     kRemoteRead, local) != KeyCheck::Ok) {
            // The region went away (or a forged duplicate): stop; a fresh request was
            // already checked as a whole, so only deregistration can get us here.
            if (!duplicate)
                responder_error(wire::NakCode::RemoteAccessError, h.bth.psn,
                                AsyncEventType::QpAccessError);
            return;
        }
        iovec iov{reinterpret_cast<void*>(local), len};
        transmit(h, std::span(&iov, len ? 1 : 0), len);
    }
}

void RcQp::on_request(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    const uint16_t flags = pkt.info->flags;
    const int32_t d = psn_diff(psn, epsn_);
    if (d < 0) {
        // Already executed: answer again without executing again, except a READ, which
        // is read anew (its responses may be what got lost).
        bump(engine_.counters().rx_duplicate);
        if (flags & wire::kRead) {
            if (attrs_.access & kRemoteRead) execute_read(pkt, true);
        } else
            ack_pending_ = true;
        return;
    }
    if (d > 0) {
        bump(engine_.counters().rx_out_of_sequence);
        if (!nak_sent_) {
            nak_sent_ = true;
            bump(engine_.counters().tx_seq_naks);
            send_ack(epsn_,
                     wire::Aeth::make(wire::AckType::Nak,
                                      static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
        }
        return;
    }
    nak_sent_ = false;

    const bool starts = flags & (wire::kFirst | wire::kOnly);
    const bool ends = flags & (wire::kLast | wire::kOnly);
    const InMessage kind = (flags & wire::kSend)    ? InMessage::Send
                           : (flags & wire::kWrite) ? InMessage::Write
                                                    : InMessage::None;
    // Opcode sequence (IBA 9.7.5.1.1): a message starts only when none is open, and
    // continues only with middle/last packets of the same kind.
    if ((in_message_ == InMessage::None) != starts ||
        (in_message_ != InMessage::None && in_message_ != kind)) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    if (pkt.info->headers & wire::kHasIeth) {
        // SEND with Invalidate needs memory windows / invalidation, which come later.
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    const bool with_imm = pkt.info->headers & wire::kHasImm;
    const uint32_t len = static_cast<uint32_t>(pkt.payload.size());

    if (flags & wire::kSend) {
        if (starts && rq_.empty()) {
            // Receiver not ready: the requester waits and sends this packet again.
            bump(engine_.counters().tx_rnr_naks);
            nak_sent_ = true;
            send_ack(psn, wire::Aeth::make(wire::AckType::RnrNak, attrs_.min_rnr_timer));
            return;
        }
        if (starts) {
            recv_taken_ = true;
            recv_offset_ = 0;
        }
        if (!ends && len != attrs_.mtu) {
            responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
            return;
        }
        if (const WcStatus s = scatter_to_recv(pkt.payload); s != WcStatus::Success) {
            // Too long for the receive buffer is the requester's error; a bad receive
            // buffer is ours.
            if (s == WcStatus::LocLenErr)
                responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
            else
                responder_error(wire::NakCode::RemoteOperationalError, psn,
                                AsyncEventType::QpFatal);
            return;
        }
        epsn_ = psn_add(epsn_, 1);
        if (ends) {
            ++msn_;
            in_message_ = InMessage::None;
            complete_recv(WcStatus::Success, recv_offset_, with_imm, pkt.h.imm, pkt.h.bth.solicited,
                          WcOpcode::Recv);
        } else {
            in_message_ = InMessage::Send;
        }
    } else if (flags & wire::kWrite) {
        if (starts) {
            const wire::Reth& reth = pkt.h.reth;
            if (!(attrs_.access & kRemoteWrite)) {
                responder_error(wire::NakCode::RemoteAccessError, psn,
                                AsyncEventType::QpAccessError);
                return;
            }
            if (reth.dma_len > 0) {
                auto guard = engine_.memory().lock_shared();
                uint64_t local = 0;
                if (engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len,
                                                  kRemoteWrite, local) != KeyCheck::Ok) {
                    responder_error(wire::NakCode::RemoteAccessError, psn,
                                    AsyncEventType::QpAccessError);
                    return;
                }
            }
            write_va_ = reth.va;
            write_rkey_ = reth.rkey;
            write_left_ = reth.dma_len;
            write_total_ = reth.dma_len;
        }
        if (len > write_left_ || (!ends && len != attrs_.mtu) || (ends && len != write_left_)) {
            responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
            return;
        }
        if (ends && with_imm && rq_.empty()) {
            bump(engine_.counters().tx_rnr_naks);
            nak_sent_ = true;
            send_ack(psn, wire::Aeth::make(wire::AckType::RnrNak, attrs_.min_rnr_timer));
            return;
        }
        if (len > 0) {
            auto guard = engine_.memory().lock_shared();
            // Checked again per packet: a region deregistered mid-message stops at once.
            uint64_t local = 0;
            if (engine_.memory().check_remote(write_rkey_, pd_, write_va_, len, kRemoteWrite,
                                              local) != KeyCheck::Ok) {
                responder_error(wire::NakCode::RemoteAccessError, psn,
                                AsyncEventType::QpAccessError);
                return;
            }
            copy_last_byte_last(reinterpret_cast<uint8_t*>(local), pkt.payload.data(), len);
        }
        write_va_ += len;
        write_left_ -= len;
        epsn_ = psn_add(epsn_, 1);
        if (ends) {
            ++msn_;
            in_message_ = InMessage::None;
            if (with_imm)
                complete_recv(WcStatus::Success, write_total_, true, pkt.h.imm, pkt.h.bth.solicited,
                              WcOpcode::RecvRdmaWithImm);
        } else {
            in_message_ = InMessage::Write;
        }
    } else if (flags & wire::kRead) {
        const wire::Reth& reth = pkt.h.reth;
        if (!(attrs_.access & kRemoteRead)) {
            responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
            return;
        }
        if (reth.dma_len > 0) {
            auto guard = engine_.memory().lock_shared();
            uint64_t local = 0;
            if (engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len, kRemoteRead,
                                              local) != KeyCheck::Ok) {
                responder_error(wire::NakCode::RemoteAccessError, psn,
                                AsyncEventType::QpAccessError);
                return;
            }
        }
        const uint32_t npkts = std::max<uint32_t>(1, (reth.dma_len + attrs_.mtu - 1) / attrs_.mtu);
        epsn_ = psn_add(epsn_, npkts);
        ++msn_;
        execute_read(pkt, false);
        return;
    } else {
        // Atomics and the rest are not implemented yet: say so instead of ignoring them.
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    if (pkt.h.bth.ack_req) ack_pending_ = true;
}

}  // namespace uroce::transport
