// RC responder: executes incoming requests, strictly in PSN order, after the checks the
// IBA asks for (9.7.5.1: PSN, opcode sequence, resources, length, keys); no byte reaches
// memory before its key, range and access rights pass. READs and the requests held behind
// their responses: rc_read_responses.cpp; the ACKs: rc_acks.cpp.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "transport/app_memory_guard.h"
#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"
#include "transport/scatter.h"

namespace uroce::transport {

namespace {

// Requests held per QP at most: more are not accepted (not even their PSN), so the
// requester's go-back-N sends them again.
constexpr size_t kMaxHeld = 1024;

// The requests an ACK may name: those it answers (never a READ's or an atomic's PSN, whose
// answers are their responses).
constexpr uint16_t kAckNamed = wire::kSend | wire::kWrite | wire::kAtomicWrite;

}  // namespace

void RcQp::complete_recv(WcStatus status, uint32_t byte_len, bool with_imm, uint32_t imm,
                         bool solicited, WcOpcode opcode, bool with_inv) {
    if (!recv_) return;
    Completion c;
    c.wr_id = recv_->wr_id;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = byte_len;
    c.qp_num = qpn_;
    c.src_qp = attrs_.dest_qpn;
    c.with_imm = with_imm;
    c.imm = imm;
    c.solicited = solicited;
    c.with_inv = with_inv;
    recv_.reset();
    if (CompletionQueue* cq = recv_cq()) push_completion(*cq, c);
}

void RcQp::send_error_nak(wire::NakCode code, uint32_t psn) {
    switch (code) {
        case wire::NakCode::RemoteAccessError:
            bump(engine_.counters().tx_access_naks);
            break;
        default:
            bump(engine_.counters().tx_invalid_naks);
            break;
    }
    bump(qp_counters_.tx_naks);
    bump(qp_counters_.tx_other_naks);
    send_ack(psn, wire::Aeth::make(wire::AckType::Nak, static_cast<uint8_t>(code)));
}

void RcQp::responder_error(wire::NakCode code, uint32_t psn, AsyncEventType event) {
    // The NAK acknowledges everything before `psn`: an ACK still pending is not sent (after
    // the NAK it would say nothing, and it must never name `psn` itself), nor the one a cap
    // held back (enter_error).
    forget_pending_ack();
    early_ack_cap_ = kNoResentPsn;
    send_error_nak(code, psn);
    post_async(event);
    enter_error();
}

bool RcQp::acquire_recv() {
    if (recv_) return true;
    if (SharedReceiveQueue* srq = recv_srq()) {
        recv_ = srq->take();
        return recv_.has_value();
    }
    if (rq_.empty()) return false;
    recv_ = rq_.front();
    rq_.pop_front();
    return true;
}

bool RcQp::select_xrc_srq(const wire::ParsedPacket& pkt) {
    if (xrc_role_ != XrcRole::Target) return true;
    // A message's later packets go where its first went.
    if (in_message_ != InMessage::None) return xrc_srq_ && pkt.h.xrc_srqn == xrc_srq_->xrc().srqn;
    std::shared_ptr<SharedReceiveQueue> srq = engine_.xrc_srq(pkt.h.xrc_srqn);
    if (!srq || srq->xrc().xrcd != xrcd_) return false;
    xrc_srq_ = std::move(srq);
    return true;
}

WcStatus RcQp::scatter_to_recv(std::span<const uint8_t> data) {
    const RecvWqe& r = *recv_;
    // An SRQ's WQEs name buffers of the SRQ's protection domain.
    const SharedReceiveQueue* srq = recv_srq();
    const uint32_t pd = srq ? srq->pd() : pd_;
    if (recv_offset_ + data.size() > r.sgl.total_length()) {
        complete_recv(WcStatus::LocLenErr, recv_offset_, false, 0, false, WcOpcode::Recv);
        return WcStatus::LocLenErr;
    }
    // Every piece this packet lands in is checked before any is written, so a refused
    // packet leaves the buffer as it was.
    const std::span<const uint8_t> pieces[] = {data};
    if (scatter_checked(engine_.memory(), r.sgl, pd, recv_offset_, pieces) != KeyCheck::Ok) {
        complete_recv(WcStatus::LocProtErr, recv_offset_, false, 0, false, WcOpcode::Recv);
        return WcStatus::LocProtErr;
    }
    recv_offset_ += static_cast<uint32_t>(data.size());
    return WcStatus::Success;
}

void RcQp::on_duplicate(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    // Its original is still held, not executed yet: that one will be answered.
    if (!held_.empty() && !psn_before(psn, held_.front().h.bth.psn)) return;
    if (pkt.info->flags & wire::kAtomic) {
        on_duplicate_atomic(pkt);
        return;
    }
    if (!(pkt.info->flags & wire::kRead)) {
        // Executed already: only the acknowledgement may have been lost. The peer is waiting
        // for it: it goes at the end of the batch, never held for an answer. Unless the ACK
        // that covers it has not gone out yet (this batch executed the original, or the ACK
        // is held for the answer): then nothing was lost, the peer probed (its probe comes
        // after two round trips, and an answer may take longer), and that ACK goes as it
        // would have. Sent alone, it would reach the peer before the answer, whose
        // application would then watch its memory with the answer left to its engine thread
        // (engine_held_acks.cpp). Once: a second probe says the answer is not coming soon
        // (an application that stopped answering holds the peer no longer than that).
        if (ack_pending_ && !probe_absorbed_) {
            probe_absorbed_ = true;
            bump(engine_.counters().rx_duplicate_ack_pending);
            return;
        }
        // Acknowledged up to the newest resent packet, not beyond (resent_high_).
        if (!ack_pending_ || resent_high_ != kNoResentPsn) {
            if (resent_high_ == kNoResentPsn || psn_after(psn, resent_high_)) resent_high_ = psn;
        }
        ack_pending_ = true;
        ack_now_ = true;
        return;
    }
    // A READ is answered again only from the resource of the READ that was executed, for
    // the part asked for: from the requested PSN, at the VA of that response, to the end or
    // to a response's end before it (a requester that kept the responses after a gap asks
    // for the gap alone; rxe's responder answers such a part too). Anything else is a
    // replay or a forgery, and sending it would multiply traffic.
    const wire::Reth& reth = pkt.h.reth;
    ReadResource* r = reads_.find(psn);
    const int64_t i = r ? r->index_of(psn) : -1;
    const uint64_t offset = i >= 0 ? r->offset_of(static_cast<uint32_t>(i)) : 0;
    const uint64_t rest = r ? r->length - std::min<uint64_t>(r->length, offset) : 0;
    const uint64_t asked = reth.dma_len;
    const bool whole_packets = asked > 0 && r && r->mtu > 0 && asked % r->mtu == 0;
    // Never from beyond what went out once: the requester cannot ask for responses it was
    // never sent, and skipping them would leave them unsent.
    if (r == nullptr || r->atomic || r->atomic_write || !(attrs_.access & kRemoteRead) ||
        reth.rkey != r->rkey || i > static_cast<int64_t>(r->sent_once) ||
        reth.va != r->va + offset || asked > rest || (asked != rest && !whole_packets)) {
        bump(engine_.counters().rx_duplicate_dropped);
        return;
    }
    // Start again from there (not a second copy): the responses carry the MSN of the
    // original, and the first of them is a First (or Only), the last a Last. A READ whose
    // responses have not all gone out once goes on to its end whatever was asked.
    r->next = static_cast<uint32_t>(i);
    r->run_start = static_cast<uint32_t>(i);
    r->run_end = asked == rest || !r->finished_once()
                     ? ReadResource::kToTheEnd
                     : static_cast<uint32_t>(i + static_cast<int64_t>(asked / r->mtu));
    send_responses(kResponseBurst);
    if (reads_.busy()) schedule_responder();
}

void RcQp::on_request(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    const int32_t d = psn_diff(psn, epsn_);
    // The requester has sent this far since the kept requests ran: the ACK may name it (a
    // PSN further ahead than it can send is a forgery, and proves nothing). Not a READ or
    // an atomic: an ACK never names one (early_ack_cap_). An ATOMIC WRITE it does: the ACK
    // is its answer (a resent one that never lifted the cap was refused its ACK for good).
    if (early_ack_cap_ != kNoResentPsn && psn_after(psn, early_ack_cap_) &&
        d < static_cast<int32_t>(EarlyRequests::kSpan) && (pkt.info->flags & kAckNamed))
        early_ack_cap_ = psn;
    if (d < 0) {
        bump(engine_.counters().rx_duplicate);
        bump(qp_counters_.rx_duplicate);
        on_duplicate(pkt);
        return;
    }
    if (d > 0) {
        bump(engine_.counters().rx_out_of_sequence);
        keep_early(pkt, static_cast<uint32_t>(d));
        if (!nak_sent_) {
            nak_sent_ = true;
            newest_ahead_ = psn;
            newest_ahead_live_ = true;
            send_sequence_nak();
        } else if (newest_ahead_live_ && d < static_cast<int32_t>(EarlyRequests::kSpan)) {
            if (psn == newest_ahead_ && engine_.config().selective_recovery) {
                // The newest packet again: a requester that keeps track of what the peer
                // keeps probes with it when its NAK never came (lost) or its resend of the
                // missing packet was lost. Silence would leave it guessing where the gap
                // is, and it would go back N (docs/selective-recovery.md).
                bump(engine_.counters().tx_seq_nak_repeats);
                send_sequence_nak();
            } else if (psn_after(psn, newest_ahead_)) {
                newest_ahead_ = psn;
            }
        }
        return;
    }
    if (!accept_in_sequence(pkt)) return;
    if (!early_.empty()) run_early(pkt);
}

void RcQp::send_sequence_nak() {
    bump(engine_.counters().tx_seq_naks);
    bump(qp_counters_.tx_naks);
    bump(qp_counters_.tx_seq_naks);
    send_ack(epsn_, wire::Aeth::make(wire::AckType::Nak,
                                     static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
}

void RcQp::keep_early(const wire::ParsedPacket& pkt, uint32_t ahead) {
    if (!engine_.config().selective_recovery) return;
    switch (early_.keep(pkt, ahead)) {
        case EarlyRequests::Kept::Yes:
            bump(engine_.counters().rx_early_kept);
            break;
        case EarlyRequests::Kept::Conflict:
        case EarlyRequests::Kept::NoBudget:
            bump(engine_.counters().rx_early_dropped);
            break;
        case EarlyRequests::Kept::Already:
        case EarlyRequests::Kept::NotKind:
        case EarlyRequests::Kept::TooFar:
            break;
    }
}

void RcQp::run_early(const wire::ParsedPacket& filled) {
    // The kept requests that now follow in sequence run as if they had just arrived. The
    // requester may not have sent them again yet: the ACK names none of them until it has
    // (early_ack_cap_): it names the packet that filled the gap, or, if that was a READ or
    // an atomic, the newest SEND/WRITE executed before it (an ACK older than the requester
    // has, which it ignores).
    const uint32_t cap = (filled.info->flags & kAckNamed) ? filled.h.bth.psn : ack_psn_;
    StoredRequest req;
    bool ran = false;
    bool stopped = false;
    draining_early_ = true;
    while (state_ != QpState::Err && early_.take(epsn_, req)) {
        const uint32_t before = epsn_;
        bump(engine_.counters().rx_early_run);
        ran = true;
        if (!accept_in_sequence(req.view()) || epsn_ == before) {
            stopped = true;
            break;
        }
    }
    draining_early_ = false;
    early_.give_back(req);
    if (stopped || state_ == QpState::Err) {
        early_.clear();  // refused, or receiver not ready: the requester sends them again
    } else {
        early_.forget_before(epsn_);
    }
    if (ran && early_ack_cap_ == kNoResentPsn) early_ack_cap_ = cap;
}

bool RcQp::accept_in_sequence(const wire::ParsedPacket& pkt) {
    const uint16_t flags = pkt.info->flags;
    // Requests execute in PSN order: while READ responses are still going out, a later
    // SEND or WRITE (and everything after it) waits. Later READs queue as resources.
    const bool wait = !held_.empty() || (!(flags & wire::kRead) && reads_.busy());
    if (wait && held_.size() >= kMaxHeld) {
        bump(engine_.counters().rx_held_overflow);
        return false;
    }
    nak_sent_ = false;
    epsn_ = psn_add(
        epsn_, (flags & wire::kRead) ? read_response_packets(pkt.h.reth.dma_len, attrs_.mtu) : 1);
    if (wait) {
        // Its copy in a buffer of the engine's pool, given back once it ran (run_held): a
        // stream of WRITEs behind READ responses allocates nothing per packet.
        std::vector<uint8_t> payload = engine_.early_request_pool().buffer();
        payload.assign(pkt.payload.begin(), pkt.payload.end());
        held_.push_back(HeldRequest{{pkt.h, pkt.info, std::move(payload)}, draining_early_});
        schedule_responder();
        return true;
    }
    execute_request(pkt);
    return true;
}

bool RcQp::length_ok(const wire::ParsedPacket& pkt, bool starts, bool ends) const {
    const size_t len = pkt.payload.size();
    // PadCnt must bring the payload to a 4-byte boundary, no more and no less.
    if ((len + pkt.h.bth.pad) % 4 != 0) return false;
    const uint32_t mtu = attrs_.mtu;
    if (!ends) return len == mtu;  // First, Middle: exactly one path MTU
    if (len > mtu) return false;   // Last, Only: at most one
    return starts || len > 0;      // a Last carries at least one byte; an Only may be empty
}

void RcQp::execute_request(const wire::ParsedPacket& pkt) {
    execute_one(pkt);
    // An XRC target holds the SRQ a request named only while its message is open: once the
    // application destroys the SRQ, no completion of a later message can reach its CQ (READs
    // and atomics keep the PD they need in their responder resource).
    if (in_message_ == InMessage::None && !recv_) xrc_srq_.reset();
}

void RcQp::execute_one(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    executing_psn_ = psn;
    const uint16_t flags = pkt.info->flags;
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
    // XRC: a request for an SRQ outside the target's domain executes nothing.
    if (!select_xrc_srq(pkt)) {
        bump(engine_.counters().rx_bad_xrc_srq);
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    if (flags & wire::kRead) {
        execute_read(pkt);
        return;
    }
    if (flags & wire::kAtomic) {
        execute_atomic(pkt);
        return;
    }
    if (flags & wire::kAtomicWrite) {
        execute_atomic_write(pkt);
        return;
    }
    if (!(flags & (wire::kSend | wire::kWrite))) {
        // Nothing else is a request this QP can execute: say so instead of ignoring it.
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    const bool with_imm = pkt.info->headers & wire::kHasImm;
    const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
    const bool needs_recv = (flags & wire::kSend) ? starts : (ends && with_imm);
    if (needs_recv && !acquire_recv()) {
        if (draining_early_) {
            // A kept request: the requester may not have sent it again yet, and an RNR NAK
            // would acknowledge what came before it. It goes, with the kept ones after it;
            // the requester's resend draws the RNR NAK in sequence.
            epsn_ = psn;
            held_.clear();
            return;
        }
        // Receiver not ready: the requester waits and sends this packet again, and
        // everything after it, which is why what was held behind it goes too.
        bump(engine_.counters().tx_rnr_naks);
        bump(qp_counters_.tx_naks);
        bump(qp_counters_.tx_rnr_naks);
        nak_sent_ = true;
        newest_ahead_live_ = false;  // an RNR NAK: the requester waits, whatever comes again
        epsn_ = psn;
        held_.clear();
        early_.clear();
        // The NAK acknowledges everything before `psn`: a pending ACK would only follow it
        // with less, and nothing kept is left for a cap to protect.
        forget_pending_ack();
        early_ack_cap_ = kNoResentPsn;
        send_ack(psn, wire::Aeth::make(wire::AckType::RnrNak, attrs_.min_rnr_timer));
        return;
    }
    if (!length_ok(pkt, starts, ends)) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }

    if (flags & wire::kSend) {
        if (starts) recv_offset_ = 0;
        const bool with_inv = pkt.info->headers & wire::kHasIeth;
        // SEND with Invalidate: the window goes before the message completes; one that is
        // not a type 2 window of this QP (bound here, same PD) fails the request.
        if (with_inv &&
            engine_.memory().invalidate_window(pkt.h.ieth, responder_pd(), qpn_) != KeyCheck::Ok) {
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
        if (ends) {
            ++msn_;
            in_message_ = InMessage::None;
            complete_recv(WcStatus::Success, recv_offset_, with_imm,
                          with_inv ? pkt.h.ieth : pkt.h.imm, pkt.h.bth.solicited, WcOpcode::Recv,
                          with_inv);
        } else {
            in_message_ = InMessage::Send;
        }
    } else {
        if (starts) {
            const wire::Reth& reth = pkt.h.reth;
            if (reth.dma_len > kMaxMessageBytes) {
                responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
                return;
            }
            if (!(attrs_.access & kRemoteWrite)) {
                responder_error(wire::NakCode::RemoteAccessError, psn,
                                AsyncEventType::QpAccessError);
                return;
            }
            if (reth.dma_len > 0) {
                // The whole range on the first packet: a WRITE running off the end of its
                // region changes no byte, not even those of its first packets.
                auto guard = engine_.memory().lock_shared();
                uint64_t local = 0;
                if (engine_.memory().check_remote(reth.rkey, responder_pd(), reth.va, reth.dma_len,
                                                  kRemoteWrite, local, qpn_) != KeyCheck::Ok) {
                    guard.unlock();
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
        // The packets must add up to the RETH length exactly.
        if (len > write_left_ || (ends && len != write_left_)) {
            responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
            return;
        }
        if (len > 0) {
            auto guard = engine_.memory().lock_shared();
            // Checked again per packet: a region deregistered mid-message stops at once.
            uint64_t local = 0;
            if (engine_.memory().check_remote(write_rkey_, responder_pd(), write_va_, len,
                                              kRemoteWrite, local, qpn_) != KeyCheck::Ok) {
                guard.unlock();
                responder_error(wire::NakCode::RemoteAccessError, psn,
                                AsyncEventType::QpAccessError);
                return;
            }
            if (!copy_last_byte_last(reinterpret_cast<uint8_t*>(local), pkt.payload.data(), len)) {
                // The region's pages are gone (app_memory_guard.h): refused as a bad key is.
                engine_.memory().note_fault();
                guard.unlock();
                responder_error(wire::NakCode::RemoteAccessError, psn,
                                AsyncEventType::QpAccessError);
                return;
            }
        }
        write_va_ += len;
        write_left_ -= len;
        if (ends) {
            ++msn_;
            in_message_ = InMessage::None;
            if (with_imm)
                complete_recv(WcStatus::Success, write_total_, true, pkt.h.imm, pkt.h.bth.solicited,
                              WcOpcode::RecvRdmaWithImm);
        } else {
            in_message_ = InMessage::Write;
        }
    }
    ack_psn_ = psn;
    ack_msn_ = msn_;
    // A new packet: the requester has sent past everything it resent.
    resent_high_ = kNoResentPsn;
    if (pkt.h.bth.ack_req) ack_pending_ = true;
}

}  // namespace uroce::transport
