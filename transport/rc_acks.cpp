// RC responder's ACKs: which PSN an ACK names (never a READ's or an atomic's, never beyond
// the resends a kept request waits for: docs/selective-recovery.md), and when it leaves: at
// the end of the receive batch, held for the application's answer (engine_held_acks.cpp),
// or as the last one when the QP stops.
#include <algorithm>
#include <chrono>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

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
    last_ack_sent_ = std::chrono::steady_clock::now();
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
    // The ACK that named the peer's last request (just now, or shortly before) may be lost,
    // and no resend of that request will be answered any more: the peer would retry until it
    // failed a request that ran here; the kernel's rxe, with retry_cnt 7 (ibv_rc_pingpong's,
    // perftest's), retries for ever. So it goes once more, naming everything executed. Only
    // soon after an ACK: a peer that retries does so within its ACK timeout, and much later
    // its QP number may belong to another connection.
    if (closed_ || state_ == QpState::Err || state_ == QpState::Reset ||
        last_ack_sent_ == std::chrono::steady_clock::time_point::min())
        return;
    const auto within = std::chrono::microseconds(
        std::max<uint64_t>(engine_.config().last_ack_repeat_micros, local_ack_timeout_us()));
    if (std::chrono::steady_clock::now() - last_ack_sent_ >= within) return;
    ack_pending_ = true;  // a cap still set hides nothing now (above)
    bump(engine_.counters().tx_last_ack_repeats);
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
    restart_timer_if_progressed();
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
    restart_timer_if_progressed();
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

}  // namespace uroce::transport
