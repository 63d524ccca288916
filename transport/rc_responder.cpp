// RC responder: executes incoming requests, strictly in PSN order, after the checks the
// IBA asks for (9.7.5.1: PSN, opcode sequence, resources, length, keys); no byte reaches
// memory before its key, range and access rights pass.
//
// READ responses are not sent in one go: the READ becomes a responder resource
// (responder_resources.h) and its responses go out kResponseBurst packets at a time, the
// first burst at the end of the receive batch that brought the request (send_due_responses:
// the READs of one batch share transmit batches, so one READ's LAST, which carries an AETH
// as its FIRST does, rides in the GSO train of the next READ's FIRST) and the rest from the
// engine thread (on_responder_event). Requests that arrive meanwhile are accepted (the PSN
// advances) but held and executed after the responses have gone out, in PSN order; duplicate READ
// requests only move the cursor of the resource they match.
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

// Held requests executed per step on the engine thread.
constexpr uint32_t kHeldBurst = 64;
// Requests held per QP at most: more are not accepted (not even their PSN), so the
// requester's go-back-N sends them again.
constexpr size_t kMaxHeld = 1024;
// The IBA limits a message (the RETH DMA length) to 2^31 bytes.
constexpr uint64_t kMaxMessageBytes = 1ull << 31;

uint32_t read_packets(uint32_t dma_len, uint32_t mtu) {
    return static_cast<uint32_t>(std::max<uint64_t>(1, (uint64_t{dma_len} + mtu - 1) / mtu));
}

}  // namespace

void RcQp::send_ack(uint32_t psn, uint8_t syndrome) {
    wire::Headers h;
    h.bth.opcode = opcode(wire::Opcode::RcAcknowledge);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.bth.psn = psn & kPsnMask;
    h.aeth.syndrome = syndrome;
    h.aeth.msn = msn_ & kPsnMask;
    transmit(h, {}, 0);
}

void RcQp::forget_pending_ack() {
    ack_pending_ = false;
    ack_now_ = false;
    probe_absorbed_ = false;
    resent_high_ = kNoResentPsn;
    ack_held_since_ = std::chrono::steady_clock::time_point::min();
}

void RcQp::send_pending_ack(bool by_hold_timer) {
    if (closed_ || !ack_pending_ || state_ == QpState::Err || state_ == QpState::Reset) return;
    if (by_hold_timer && ack_held_since_ != std::chrono::steady_clock::time_point::min())
        bump(engine_.counters().held_ack_timeouts);
    // The ACK names the newest executed SEND/WRITE packet, never a PSN of a READ's
    // responses (IBA ch. 9.7): to the requester that would say the response with that
    // PSN arrived. READ responses acknowledge what came before them themselves.
    // An ACK for resent requests alone names the newest of them, not ack_psn_: see
    // resent_high_.
    uint32_t psn = resent_high_ != kNoResentPsn ? resent_high_ : ack_psn_;
    if (early_ack_cap_ != kNoResentPsn) {
        if (psn_after(psn, early_ack_cap_))
            psn = early_ack_cap_;
        else if (held_.empty())
            early_ack_cap_ = kNoResentPsn;  // caught up, and no kept request waits to run
    }
    forget_pending_ack();
    bump(engine_.counters().tx_acks);
    wire::Headers h;
    h.bth.opcode = opcode(wire::Opcode::RcAcknowledge);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.bth.psn = psn;
    h.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits);
    h.aeth.msn = ack_msn_ & kPsnMask;
    transmit(h, {}, 0);
}

void RcQp::send_last_ack() {
    // A cap (resent_high_, early_ack_cap_) waits for resends that this QP will no longer
    // answer: the requester would retry until it failed requests that ran and completed here.
    // Against rxe, a receiver that exits on the completion of rxe's last SEND, kept packets
    // and all, left rxe's sender retrying for ever (docs/selective-recovery.md). Whatever a
    // requester does on an ACK beyond its resends, nothing of this QP can follow it.
    if (early_ack_cap_ != kNoResentPsn && psn_after(ack_psn_, early_ack_cap_)) ack_pending_ = true;
    if (ack_pending_) {
        early_ack_cap_ = kNoResentPsn;
        resent_high_ = kNoResentPsn;
    }
    send_pending_ack();
}

void RcQp::flush_ack() {
    std::lock_guard lock(mutex_);
    flush_ack_locked(false);
}

std::chrono::steady_clock::time_point RcQp::flush_ack_held_before(
    std::chrono::steady_clock::time_point cutoff) {
    std::lock_guard lock(mutex_);
    if (ack_pending_ && !closed_ && ack_held_since_ > cutoff) return ack_held_since_;
    flush_ack_locked(true);
    return std::chrono::steady_clock::time_point::max();
}

void RcQp::flush_ack_locked(bool by_hold_timer) {
    send_due_responses();
    ack_held_noted_ = false;
    send_pending_ack(by_hold_timer);
}

bool RcQp::answering(std::chrono::steady_clock::time_point now) const {
    // A deeper queue is a stream, whose peer's ACKs must not wait (both ways, ib_write_bw -b
    // lost a quarter of its bandwidth).
    if (sq_.size() > 1) return false;
    // The peer may give up on an ACK after its local ACK timeout, which is most likely this
    // QP's own (applications set both sides alike): hold only well within it.
    if (attrs_.timeout != 0 && local_ack_timeout_us() < 4ull * engine_.config().ack_hold_micros)
        return false;
    const auto since_post = now - last_post_;
    return since_post < std::chrono::microseconds(engine_.config().answer_window_micros);
}

void RcQp::finish_batch(bool may_hold_ack) {
    std::lock_guard lock(mutex_);
    send_due_responses();
    if (may_hold_ack && ack_pending_ && !ack_now_ && !closed_ && state_ == QpState::Rts) {
        const auto now = std::chrono::steady_clock::now();  // one clock read for both uses
        if (answering(now)) {
            if (ack_held_since_ == std::chrono::steady_clock::time_point::min())
                ack_held_since_ = now;
            engine_.spare_held_acks();
            if (!ack_held_noted_) {
                ack_held_noted_ = true;
                engine_.note_held_ack(qpn());
            }
            return;
        }
    }
    send_pending_ack();
}

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

void RcQp::responder_trampoline(evutil_socket_t, short, void* arg) {
    auto* qp = static_cast<RcQp*>(arg);
    const auto pass = qp->engine_.fork_gate().pass();
    qp->on_responder_event();
}

void RcQp::schedule_responder() {
    if (closed_) return;
    // Activating an event that is already active does nothing: one step per loop turn.
    event_active(responder_event_, 0, 0);
}

void RcQp::on_responder_event() {
    std::lock_guard lock(mutex_);
    if (closed_ || state_ == QpState::Reset || state_ == QpState::Init || state_ == QpState::Err)
        return;
    send_responses(kResponseBurst);
    run_held(kHeldBurst);
    send_pending_ack();
    if (state_ != QpState::Err && (reads_.busy() || !held_.empty())) schedule_responder();
}

void RcQp::send_due_responses() {
    if (responses_due_ == 0) return;
    const uint32_t budget = responses_due_ * kResponseBurst;
    responses_due_ = 0;
    if (closed_ || state_ == QpState::Reset || state_ == QpState::Init || state_ == QpState::Err)
        return;
    send_responses(budget);
    run_held(kHeldBurst);
    if (state_ != QpState::Err && (reads_.busy() || !held_.empty())) schedule_responder();
}

void RcQp::send_responses(uint32_t budget) {
    if (!tx_batch_) {
        TransmitBatch batch(engine_, &qp_counters_);
        tx_batch_ = &batch;
        send_responses(budget);
        flush_tx_batch();  // responses carry no tag: a failure there is a loss, as before
        tx_batch_ = nullptr;
        return;
    }
    for (; budget > 0; --budget) {
        if (state_ == QpState::Reset || state_ == QpState::Init || state_ == QpState::Err) return;
        ReadResource* r = reads_.next_to_send();
        if (r == nullptr) return;
        const uint32_t i = r->next;
        const uint32_t len = r->length_of(i);
        const bool first = i == r->run_start;
        const bool last = i + 1 == r->npkts;
        wire::Opcode op = wire::Opcode::RcReadResponseMiddle;
        if (first && last)
            op = wire::Opcode::RcReadResponseOnly;
        else if (first)
            op = wire::Opcode::RcReadResponseFirst;
        else if (last)
            op = wire::Opcode::RcReadResponseLast;
        wire::Headers h;
        h.bth.opcode = opcode(op);
        h.bth.dest_qp = attrs_.dest_qpn;
        h.bth.psn = psn_add(r->psn, i);
        h.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits);
        h.aeth.msn = r->msn & kPsnMask;
        {
            auto guard = lock_memory();
            uint64_t local = 0;
            // Checked again for each packet: a region deregistered (or a right withdrawn)
            // in the middle of a READ stops it at once.
            bool refused = !(attrs_.access & kRemoteRead) ||
                           (len > 0 && engine_.memory().check_remote(
                                           r->rkey, r->pd, r->va + r->offset_of(i), len,
                                           kRemoteRead, local, qpn_) != KeyCheck::Ok);
            if (!refused && len > 0 && !guarded_probe(reinterpret_cast<const void*>(local), len)) {
                // The region's pages are gone (app_memory_guard.h): refused as a bad key is.
                engine_.memory().note_fault();
                refused = true;
            }
            if (refused) {
                if (guard.owns_lock()) guard.unlock();
                flush_tx_batch();  // the responses before this one, and the pin with them
                if (i < r->sent_once) {
                    // A replay for a duplicate READ: response i went out once, from a region
                    // that was valid then. Most often the requester has the READ complete
                    // already (its resent request crossed the responses) and its application
                    // deregistered the region, as it may: the QP stays as it is. The NAK for
                    // the PSN the replay has reached still fails the READ of a requester
                    // waiting for it; one that completed it drops the NAK (outside its window).
                    send_error_nak(wire::NakCode::RemoteAccessError, psn_add(r->psn, i));
                    r->next = r->sent_once;  // the rest of the replay; first sends go on
                    continue;
                }
                // Like rxe, whose failing copy ends the READ with a remote access error NAK
                // for the READ request's PSN and the QP in ERR, however many responses
                // already went out; the requester completes the READ with
                // IBV_WC_REM_ACCESS_ERR.
                responder_error(wire::NakCode::RemoteAccessError, r->psn,
                                AsyncEventType::QpAccessError);
                return;
            }
            iovec iov{reinterpret_cast<void*>(local), len};
            transmit(h, std::span(&iov, len ? 1 : 0), len);
        }
        r->next = i + 1;
        r->sent_once = std::max(r->sent_once, r->next);
    }
}

void RcQp::run_held(uint32_t budget) {
    for (; budget > 0 && !held_.empty() && !reads_.busy(); --budget) {
        if (state_ == QpState::Reset || state_ == QpState::Init || state_ == QpState::Err) return;
        HeldRequest req = std::move(held_.front());
        held_.pop_front();
        // Kept and not sent again since (the cap has not reached it): it runs as run_early()
        // runs kept requests.
        draining_early_ =
            req.kept && early_ack_cap_ != kNoResentPsn && psn_after(req.h.bth.psn, early_ack_cap_);
        execute_request(req.view());
        draining_early_ = false;
    }
}

void RcQp::execute_read(const wire::ParsedPacket& pkt) {
    const wire::Reth& reth = pkt.h.reth;
    const uint32_t psn = pkt.h.bth.psn;
    if (reth.dma_len > kMaxMessageBytes) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    if (!(attrs_.access & kRemoteRead)) {
        responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
        return;
    }
    if (reth.dma_len > 0) {
        // The whole range before any response: a READ running off the end of its region
        // returns nothing, not its first packets.
        auto guard = engine_.memory().lock_shared();
        uint64_t local = 0;
        if (engine_.memory().check_remote(reth.rkey, responder_pd(), reth.va, reth.dma_len,
                                          kRemoteRead, local, qpn_) != KeyCheck::Ok) {
            guard.unlock();
            responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
            return;
        }
    }
    ReadResource r;
    r.psn = psn;
    r.npkts = read_packets(reth.dma_len, attrs_.mtu);
    r.va = reth.va;
    r.rkey = reth.rkey;
    r.length = reth.dma_len;
    r.mtu = attrs_.mtu;
    r.pd = responder_pd();
    r.msn = psn_add(msn_, 1);
    if (reads_.admit(r) == nullptr) {
        // More READs outstanding than the max_dest_rd_atomic we gave.
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    ++msn_;
    ++responses_due_;  // at the end of this receive batch
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
    // exactly the part asked for: from the requested PSN to the end.
    // Anything else is a replay or a forgery, and sending it would multiply traffic.
    const wire::Reth& reth = pkt.h.reth;
    ReadResource* r = reads_.find(psn);
    const int64_t i = r ? r->index_of(psn) : -1;
    // Never from beyond what went out once: the requester cannot ask for responses it was
    // never sent, and skipping them would leave them unsent.
    if (r == nullptr || r->atomic || !(attrs_.access & kRemoteRead) || reth.rkey != r->rkey ||
        i > static_cast<int64_t>(r->sent_once) ||
        reth.va != r->va + r->offset_of(static_cast<uint32_t>(i)) ||
        uint64_t{reth.dma_len} != r->length - std::min<uint64_t>(r->length, r->offset_of(i))) {
        bump(engine_.counters().rx_duplicate_dropped);
        return;
    }
    // Start again from there (not a second copy): the responses carry the MSN of the
    // original, and the first of them is a First (or Only).
    r->next = static_cast<uint32_t>(i);
    r->run_start = static_cast<uint32_t>(i);
    send_responses(kResponseBurst);
    if (reads_.busy()) schedule_responder();
}

void RcQp::on_request(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    const int32_t d = psn_diff(psn, epsn_);
    // The requester has sent this far since the kept requests ran: the ACK may name it (a
    // PSN further ahead than it can send is a forgery, and proves nothing). Not a READ or
    // an atomic: an ACK never names one (early_ack_cap_).
    if (early_ack_cap_ != kNoResentPsn && psn_after(psn, early_ack_cap_) &&
        d < static_cast<int32_t>(EarlyRequests::kSpan) &&
        (pkt.info->flags & (wire::kSend | wire::kWrite)))
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
            bump(engine_.counters().tx_seq_naks);
            bump(qp_counters_.tx_naks);
            bump(qp_counters_.tx_seq_naks);
            send_ack(epsn_,
                     wire::Aeth::make(wire::AckType::Nak,
                                      static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
        }
        return;
    }
    if (!accept_in_sequence(pkt)) return;
    if (!early_.empty()) run_early(pkt);
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
    const uint32_t cap =
        (filled.info->flags & (wire::kSend | wire::kWrite)) ? filled.h.bth.psn : ack_psn_;
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
    epsn_ =
        psn_add(epsn_, (flags & wire::kRead) ? read_packets(pkt.h.reth.dma_len, attrs_.mtu) : 1);
    if (wait) {
        held_.push_back(HeldRequest{{pkt.h, pkt.info, {pkt.payload.begin(), pkt.payload.end()}},
                                    draining_early_});
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
