// RC completer: ACKs, NAKs and READ responses retire send work requests, in order.
#include <algorithm>
#include <cstring>

#include "transport/app_memory_guard.h"
#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

namespace {

// IBA table 45: RNR NAK timer codes in microseconds (code 0 means 655.36 ms).
constexpr uint32_t kRnrTimerUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                      160,    240,   320,   480,    640,    960,    1280,   1920,
                                      2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                      40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

WcOpcode wc_opcode_for(SendOpcode op) {
    switch (op) {
        case SendOpcode::Send:
        case SendOpcode::SendWithImm:
        case SendOpcode::SendWithInv:
            return WcOpcode::Send;
        case SendOpcode::BindMw:
            return WcOpcode::BindMw;
        case SendOpcode::LocalInv:
            return WcOpcode::LocalInv;
        case SendOpcode::RdmaWrite:
        case SendOpcode::RdmaWriteWithImm:
            return WcOpcode::RdmaWrite;
        case SendOpcode::RdmaRead:
            return WcOpcode::RdmaRead;
        case SendOpcode::AtomicCmpSwap:
            return WcOpcode::CompSwap;
        case SendOpcode::AtomicFetchAdd:
            return WcOpcode::FetchAdd;
    }
    return WcOpcode::Send;
}

WcStatus status_for_nak(uint8_t code) {
    switch (static_cast<wire::NakCode>(code)) {
        case wire::NakCode::InvalidRequest:
            return WcStatus::RemInvReqErr;
        case wire::NakCode::RemoteAccessError:
            return WcStatus::RemAccessErr;
        case wire::NakCode::RemoteOperationalError:
            return WcStatus::RemOpErr;
        case wire::NakCode::InvalidRdRequest:
            return WcStatus::RemInvReqErr;
        default:
            return WcStatus::BadResp;
    }
}

}  // namespace

bool RcQp::send_completion(const SqEntry& e, WcStatus status, Completion& c) const {
    // Unsignaled requests complete silently unless they fail.
    if (status == WcStatus::Success && !e.wqe.signaled) return false;
    c.wr_id = e.wqe.wr_id;
    c.status = status;
    c.opcode = wc_opcode_for(e.wqe.opcode);
    // READs and atomics report the bytes that came back (8 for an atomic, as rxe does).
    c.byte_len = takes_responder_resource(e.wqe.opcode) ? e.wqe.length : 0;
    c.qp_num = qpn_;
    return true;
}

void RcQp::complete_send(const SqEntry& e, WcStatus status) {
    Completion c;
    if (send_completion(e, status, c)) push_completion(*send_cq_, c);
}

void RcQp::retire_front(WcStatus status) {
    // Off the queue before its completion: a full CQ moves the QP to ERR, which flushes sq_.
    const SqEntry& e = sq_.front();
    Completion c;
    const bool reported = send_completion(e, status, c);
    if (e.assigned && takes_responder_resource(e.wqe.opcode) && reads_outstanding_ > 0)
        --reads_outstanding_;
    sq_.pop_front();
    if (send_index_ > 0)
        --send_index_;
    else
        send_pkt_ = 0;
    if (reported) push_completion(*send_cq_, c);
}

bool RcQp::has_outstanding() const {
    return !sq_.empty() && sq_.front().assigned;
}

uint32_t RcQp::oldest_unacked() const {
    const SqEntry& e = sq_.front();
    if (takes_responder_resource(e.wqe.opcode)) return psn_add(e.psn, e.read_pkts);
    return psn_diff(una_psn_, e.psn) > 0 ? una_psn_ : e.psn;
}

// Everything up to and including `psn` has been executed by the responder.
void RcQp::ack_through(uint32_t psn) {
    bool progress = false;
    while (has_outstanding()) {
        SqEntry& e = sq_.front();
        if (is_local_op(e.wqe.opcode)) {
            // Executed when the requester reached it; it completes in queue order.
            if (e.failed != WcStatus::Success) {
                enter_error();
                return;
            }
            retire_front(WcStatus::Success);
            progress = true;
            continue;
        }
        const uint32_t last = psn_add(e.psn, e.npkts - 1);
        if (takes_responder_resource(e.wqe.opcode)) {
            if (e.read_done) {
                retire_front(WcStatus::Success);
                progress = true;
                continue;
            }
            // An ACK beyond a READ whose responses have not all come (or an atomic whose
            // acknowledgement has not) means they were lost: ask again for the rest (once
            // until the timer runs out). An atomic asked again is answered from the
            // responder's replay cache, not executed again.
            if (!psn_before(psn, last) && !e.read_gap_retried) {
                e.read_gap_retried = true;
                rtt_timing_ = false;  // a resent request times nothing
                const WcStatus status =
                    is_atomic(e.wqe.opcode) ? send_atomic_request(e) : send_read_request(e);
                if (status != WcStatus::Success) {
                    e.failed = status;
                    enter_error();
                    return;
                }
                count_request_resent();
            }
            break;
        }
        if (psn_before(psn, e.psn)) break;
        if (!psn_before(psn, last)) {
            una_psn_ = psn_add(last, 1);
            retire_front(WcStatus::Success);
            progress = true;
            continue;
        }
        if (psn_after(psn_add(psn, 1), una_psn_)) {
            una_psn_ = psn_add(psn, 1);
            progress = true;
        }
        break;
    }
    if (!has_outstanding()) una_psn_ = sq_.empty() || !sq_.front().assigned ? next_psn_ : una_psn_;
    if (progress) {
        if (spurious_.armed()) spurious_.on_progress(una_psn_, std::chrono::steady_clock::now());
        rnr_retries_left_ = attrs_.rnr_retry;
        note_progress();
        restart_timer();
        if (state_ == QpState::Sqd && !has_outstanding() && attrs_.sqd_notify)
            post_async(AsyncEventType::SqDrained);
    }
}

bool RcQp::response_in_window(uint32_t psn) const {
    // Only PSNs this QP has sent and not yet seen acknowledged can be answered: anything else
    // is stale (a late duplicate) or forged, and believing it could retire work the peer
    // never executed.
    return has_outstanding() && !psn_before(psn, oldest_unacked()) && psn_before(psn, sent_high_);
}

RcQp::SqEntry* RcQp::entry_for_psn(uint32_t psn) {
    for (size_t i = 0; i < sq_.size(); ++i) {
        SqEntry& e = sq_[i];
        if (!e.assigned) break;
        const int32_t d = psn_diff(psn, e.psn);
        if (d >= 0 && d < static_cast<int32_t>(e.npkts)) return &e;
    }
    return nullptr;
}

bool RcQp::fails_front_read(const wire::ParsedPacket& pkt) const {
    const uint16_t flags = pkt.info->flags;
    if (!has_outstanding() || !(flags & wire::kAck) || (flags & wire::kAtomic) ||
        pkt.h.aeth.type() != wire::AckType::Nak ||
        pkt.h.aeth.value() == static_cast<uint8_t>(wire::NakCode::PsnSequenceError))
        return false;
    const SqEntry& e = sq_.front();
    return takes_responder_resource(e.wqe.opcode) && pkt.h.bth.psn == e.psn;
}

void RcQp::on_response(const wire::ParsedPacket& pkt) {
    const uint16_t flags = pkt.info->flags;
    if (!response_in_window(pkt.h.bth.psn) && !fails_front_read(pkt)) {
        if ((flags & wire::kAck) && !(flags & wire::kAtomic) &&
            pkt.h.aeth.type() == wire::AckType::Ack)
            on_stale_ack(pkt.h.bth.psn);
        bump(engine_.counters().rx_response_out_of_window);
        return;
    }
    if (flags & wire::kRead) {
        take_rtt_sample(pkt.h.bth.psn);
        on_read_response(pkt);
        pump();
        return;
    }
    if (flags & wire::kAtomic) {
        take_rtt_sample(pkt.h.bth.psn);
        on_atomic_ack(pkt);
        pump();
        return;
    }
    if (!(flags & wire::kAck)) {
        bump(engine_.counters().rx_unsupported);
        return;
    }
    const uint32_t psn = pkt.h.bth.psn;
    const wire::Aeth& aeth = pkt.h.aeth;
    switch (aeth.type()) {
        case wire::AckType::Ack:
            take_rtt_sample(psn);
            if (selective_open_) judge_selective(psn);
            ack_through(psn);
            break;
        case wire::AckType::RnrNak: {
            bump(engine_.counters().rx_naks);
            bump(qp_counters_.rx_naks);
            bump(qp_counters_.rx_rnr_naks);
            ack_through(psn_add(psn, kPsnMask));  // psn - 1
            if (!has_outstanding()) break;
            if (attrs_.rnr_retry != 7 && rnr_retries_left_-- <= 0) {
                sq_.front().failed = WcStatus::RnrRetryExcErr;
                enter_error();
                return;
            }
            cancel_timer();
            rnr_wait_ = true;
            rnr_psn_ = psn;
            start_timer(kRnrTimerUs[aeth.value() & 31], std::chrono::steady_clock::now());
            return;
        }
        case wire::AckType::Nak: {
            bump(engine_.counters().rx_naks);
            bump(qp_counters_.rx_naks);
            const bool sequence_error =
                aeth.value() == static_cast<uint8_t>(wire::NakCode::PsnSequenceError);
            bump(sequence_error ? qp_counters_.rx_seq_naks : qp_counters_.rx_other_naks);
            if (sequence_error)
                // A packet after `psn` made the responder send it, and every packet after a
                // PSN left after that PSN's first transmission: timed from a packet at or
                // before `psn`, the NAK overstates the round trip, never understates it
                // (under loss, it is often the only sample there is).
                take_rtt_sample(psn);
            ack_through(psn_add(psn, kPsnMask));
            if (sequence_error) {
                on_sequence_nak(psn);
                break;
            }
            // The request whose PSN the NAK names failed; requests before it that are not
            // complete (a READ still missing responses) are flushed with the rest, never
            // reported as successful.
            SqEntry* failed = entry_for_psn(psn);
            if (!failed) break;
            failed->failed = status_for_nak(aeth.value());
            enter_error();
            return;
        }
        case wire::AckType::Reserved:
            bump(engine_.counters().rx_malformed);
            return;
    }
    pump();
}

void RcQp::on_read_response(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    // A READ response must answer a READ: one carrying the PSN of a SEND or WRITE is bogus.
    const SqEntry* answered = entry_for_psn(psn);
    if (!answered || answered->wqe.opcode != SendOpcode::RdmaRead) {
        bump(engine_.counters().rx_response_out_of_window);
        return;
    }
    // Responses imply the ACK of every request before the READ they answer.
    ack_through(psn_add(psn, kPsnMask));
    if (!has_outstanding()) return;
    SqEntry& e = sq_.front();
    if (e.wqe.opcode != SendOpcode::RdmaRead || e.read_done) return;
    const uint32_t expected = psn_add(e.psn, e.read_pkts);
    const int32_t d = psn_diff(psn, expected);
    if (d < 0) return;  // a duplicate of a response we already have
    if (d > 0) {
        // A response went missing: ask for the rest right away, but only once until the
        // timer runs out. Responses of the earlier request are still arriving and each one
        // would look like a new gap; answering every one with a new request makes the
        // responder replay the READ again and again.
        // Only this READ is asked for again: the requests after it were not lost.
        if (!e.read_gap_retried) {
            e.read_gap_retried = true;
            rtt_timing_ = false;
            if (const WcStatus status = send_read_request(e); status != WcStatus::Success) {
                e.failed = status;
                enter_error();
            } else {
                count_request_resent();
            }
        }
        return;
    }
    const uint16_t flags = pkt.info->flags;
    const bool first_expected = e.read_pkts == 0;
    const bool is_first = flags & (wire::kFirst | wire::kOnly);
    const bool is_last = flags & (wire::kLast | wire::kOnly);
    const uint32_t remaining = e.wqe.length - e.read_bytes;
    const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
    // A retried READ starts with a First/Only response even in mid-message.
    const bool sequence_ok = first_expected ? is_first : true;
    const bool length_ok = is_last ? len == remaining : (len == attrs_.mtu && len < remaining);
    if (!sequence_ok || !length_ok) {
        e.failed = WcStatus::BadResp;
        enter_error();
        return;
    }
    {
        auto guard = engine_.memory().lock_shared();
        uint32_t skip = e.read_bytes;
        uint32_t done = 0;
        for (uint32_t i = 0; i < e.wqe.sgl.count && done < len; ++i) {
            const Sge& s = e.wqe.sgl.sge[i];
            if (skip >= s.length) {
                skip -= s.length;
                continue;
            }
            const uint32_t take = std::min(len - done, s.length - skip);
            if (engine_.memory().check_local(s.lkey, pd_, s.addr + skip, take, kLocalWrite) !=
                KeyCheck::Ok) {
                e.failed = WcStatus::LocProtErr;
                enter_error();
                return;
            }
            if (!guarded_copy(reinterpret_cast<void*>(s.addr + skip), pkt.payload.data() + done,
                              take)) {
                engine_.memory().note_fault();
                e.failed = WcStatus::LocProtErr;
                enter_error();
                return;
            }
            done += take;
            skip = 0;
        }
    }
    e.read_bytes += len;
    e.read_pkts = is_last ? e.npkts : e.read_pkts + 1;
    note_progress();
    if (is_last) {
        e.read_done = true;
        una_psn_ = psn_add(e.psn, e.npkts);
        ack_through(psn_add(e.psn, e.npkts - 1));
    } else {
        restart_timer();
    }
}

void RcQp::timer_trampoline(void* arg) {
    auto* qp = static_cast<RcQp*>(arg);
    const auto pass = qp->engine_.fork_gate().pass();
    qp->engine_.run_timer_hook(qp->qpn_);
    qp->on_timer();
}

void RcQp::on_timer() {
    std::lock_guard lock(mutex_);
    fire_timer(std::chrono::steady_clock::now());
}

std::chrono::steady_clock::time_point RcQp::run_due_timer(
    std::chrono::steady_clock::time_point now) {
    std::lock_guard lock(mutex_);
    if (closed_ || !timer_armed_) return std::chrono::steady_clock::time_point::max();
    if (now >= timer_deadline_) {
        fire_timer(now);
        // Not re-armed: the engine thread's event has nothing left to do.
        if (!timer_armed_) timer_->cancel();
    }
    return timer_armed_ ? timer_deadline_ : std::chrono::steady_clock::time_point::max();
}

void RcQp::fire_timer(std::chrono::steady_clock::time_point now) {
    // The timer may have been cancelled or pushed back while this callback waited for
    // the lock (cancelling never waits for a running callback, to avoid a deadlock), or the
    // QP closed meanwhile (close() waits for this callback to return), or a polling thread
    // ran it already (run_due_timer).
    if (closed_ || !timer_armed_) return;
    // The timer event may be older than the deadline (a poller's run_due_timer already
    // ran it and the QP armed again since): wait out the rest.
    if (now < timer_deadline_) {
        add_timer_event(timer_deadline_);
        return;
    }
    timer_armed_ = false;
    const bool probe = probe_armed_;
    probe_armed_ = false;
    if (state_ != QpState::Rts && state_ != QpState::Sqd) {
        ack_deadline_set_ = false;
        return;
    }
    if (rnr_wait_) {
        rnr_wait_ = false;
        if (has_outstanding()) rewind_to(rnr_psn_);
        pump();
        return;
    }
    if (!has_outstanding()) {
        ack_deadline_set_ = false;
        return;
    }
    if (probe) {
        if (!engine_.resend_budget().take(now)) {
            ++probes_sent_;  // skipped: the next wait is the second probe's, or the resend's
            bump(engine_.counters().resends_held_back);
        } else if (probes_sent_ == 0 && !nak_resent_) {
            note_timer_resend(now);
            send_tail_probe();
        } else {
            // After a sequence NAK's rewind the loss was real: nothing to prove needless.
            if (!nak_resent_) note_timer_resend(now);
            resend_unacknowledged();
        }
        arm_timer();
        return;
    }
    const bool ack_timeout = !ack_deadline_set_ || now >= ack_deadline_;
    if (ack_timeout) {
        // The local ACK timeout: a retry, counted against retry_cnt.
        bump(engine_.counters().retransmit_timeouts);
        bump(qp_counters_.retransmit_timeouts);
        if (retries_left_-- <= 0) {
            sq_.front().failed = WcStatus::RetryExcErr;
            enter_error();
            return;
        }
        ack_deadline_set_ = false;  // the resend starts a new one
    } else if (!engine_.resend_budget().take(now)) {
        // The adaptive timeout, with the engine's speculative resends used up (many QPs
        // timing out together): back off as if resent, and leave it to the next timeout.
        bump(engine_.counters().resends_held_back);
        ++rto_backoff_;
        arm_timer();
        return;
    } else if (!rtt_.measured() && probes_sent_ == 0 && !nak_resent_ && tail_probe_possible()) {
        // No round trip measured yet: the wait was a guess, and a peer that has not run
        // since (a process still starting up, busy on a small host) is likelier than a loss.
        // The last packet goes alone first, as a tail probe, and the peer's ACK of the
        // duplicate proves the wait needless (spurious_resend.h) and teaches the estimate;
        // the next expiry, as long again, goes back N. Going back N at once resent a whole
        // window of 256 packets 1-3 times per lossless ib_write_bw -n 2000 whose server was
        // still busy starting up (docs/performance-log.md, 2026-12-02).
        note_timer_resend(now);
        send_tail_probe();
        arm_timer();
        return;
    } else {
        // The adaptive timeout: resend early, keep the local ACK timeout running.
        bump(engine_.counters().early_retransmits);
        bump(qp_counters_.early_retransmits);
    }
    ++rto_backoff_;
    last_rewind_psn_ = 0xffffffff;
    sq_.front().read_gap_retried = false;
    note_timer_resend(now);
    const uint32_t window_before = window_.packets();
    // An early resend before any round trip was measured proves no loss (its wait was a
    // guess, and such resends came with a peer still starting up, not with loss): the window
    // stays whole. A sequence NAK, the local ACK timeout, or an early resend once the
    // estimate exists cuts it. Those first resends halved it for the rest of a lossless
    // ib_write_bw -n 2000, 1-3 times, where the needless-resend check rarely undoes it: the
    // duplicate's ACK names a new packet sent after the resend.
    if ((ack_timeout || rtt_.measured()) && note_window_loss(oldest_unacked()))
        spurious_.on_window_cut(window_before);
    rewind_to(oldest_unacked());
    pump();
    arm_timer();
}

void RcQp::arm_timer() {
    if (timer_armed_ || attrs_.timeout == 0 || !has_outstanding()) return;
    const uint64_t ack_timeout_us = local_ack_timeout_us();
    const auto now = std::chrono::steady_clock::now();
    if (!ack_deadline_set_) {
        ack_deadline_ = now + std::chrono::microseconds(ack_timeout_us);
        ack_deadline_set_ = true;
    }
    // Rounded up: the timer must not fire before the local ACK timeout it stands for.
    uint64_t us = 0;
    if (ack_deadline_ > now)
        us = static_cast<uint64_t>(
            std::chrono::ceil<std::chrono::microseconds>(ack_deadline_ - now).count());
    probe_armed_ = false;
    if (engine_.config().adaptive_retransmit) {
        us = RttEstimator::wait_us(rtt_.timeout_us(rto_backoff_, ack_timeout_us), us);
        // A second probe (a go-back-N, rc_qp.h) waits twice as long as the first, or until
        // the adaptive timeout if that is sooner.
        const uint64_t probe_us =
            probes_sent_ == 0 ? rtt_.probe_us() : std::min(rtt_.probe_us() << probes_sent_, us);
        if (probes_sent_ < kMaxTailProbes && rtt_.measured() && probe_us <= us &&
            (nak_resent_ || tail_probe_possible())) {
            us = probe_us;
            probe_armed_ = true;
        }
    }
    start_timer(us, now);
}

bool RcQp::note_window_loss(uint32_t lost_psn) {
    if (!window_.on_loss(lost_psn, next_psn_)) return false;
    bump(engine_.counters().send_window_cuts);
    bump(qp_counters_.send_window_cuts);
    return true;
}

void RcQp::note_timer_resend(std::chrono::steady_clock::time_point now) {
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - timer_started_);
    spurious_.on_timer_resend(sent_high_, una_psn_,
                              static_cast<uint64_t>(std::max<int64_t>(0, waited.count())), now);
}

void RcQp::on_stale_ack(uint32_t psn) {
    const auto verdict = spurious_.on_stale_ack(psn, una_psn_);
    if (!verdict) return;
    bump(engine_.counters().spurious_retransmits);
    bump(qp_counters_.spurious_retransmits);
    if (verdict->window_before != 0) window_.undo_cut(verdict->window_before);
    // The ACK for the first transmission took this long: a sample Karn's rule would refuse
    // (the packet was resent), but the duplicate's ACK says which transmission it answered.
    rtt_.sample(verdict->late_rtt_us);
}

void RcQp::note_progress() {
    retries_left_ = attrs_.retry_cnt;
    last_rewind_psn_ = 0xffffffff;
    rto_backoff_ = 0;
    probes_sent_ = 0;
    nak_resent_ = false;
}

bool RcQp::resending() const {
    if (send_index_ >= sq_.size()) return false;
    const SqEntry& next = sq_[send_index_];
    return next.assigned && psn_before(psn_add(next.psn, send_pkt_), sent_high_);
}

bool RcQp::tail_probe_possible() const {
    // Only a SEND or WRITE packet: a READ or atomic request sent again is executed again
    // (a READ's responses all come back), which is the retransmission timeout's business.
    // And only when the requester is not already resending.
    if (resending()) return false;
    // The last packet sent belongs to one of the last requests sent: search from there (this
    // runs at every ACK, and a deep queue holds hundreds of outstanding requests).
    const uint32_t last = psn_add(sent_high_, kPsnMask);
    for (size_t i = std::min(send_index_ + 1, sq_.size()); i-- > 0;) {
        const SqEntry& e = sq_[i];
        if (!e.assigned || e.npkts == 0) continue;
        const int32_t d = psn_diff(last, e.psn);
        if (d < 0) continue;
        return d < static_cast<int32_t>(e.npkts) && !takes_responder_resource(e.wqe.opcode);
    }
    return false;
}

void RcQp::send_tail_probe() {
    ++probes_sent_;
    probe_psn_ = psn_add(sent_high_, kPsnMask);
    bump(engine_.counters().tail_probes);
    bump(qp_counters_.tail_probes);
    rewind_to(probe_psn_, Resend::Probe);
    pump();
}

void RcQp::resend_unacknowledged() {
    ++probes_sent_;
    bump(engine_.counters().tail_probes);
    bump(qp_counters_.tail_probes);
    if (!nak_resent_ || !probe_selected()) rewind_to(oldest_unacked(), Resend::Probe);
    pump();
}

void RcQp::start_rtt_timing(uint32_t psn) {
    if (rtt_timing_) return;
    rtt_timing_ = true;
    rtt_psn_ = psn;
    rtt_sent_ = std::chrono::steady_clock::now();
}

void RcQp::take_rtt_sample(uint32_t psn) {
    if (!rtt_timing_ || psn_before(psn, rtt_psn_)) return;
    rtt_timing_ = false;
    const auto took = std::chrono::steady_clock::now() - rtt_sent_;
    rtt_.sample(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()));
}

void RcQp::start_timer(uint64_t us, std::chrono::steady_clock::time_point now) {
    timer_started_ = now;
    timer_deadline_ = now + std::chrono::microseconds(us);
    engine_.note_timer_deadline(timer_deadline_);
    timer_armed_ = true;
    // A polling thread's timer stays off the engine thread's loop until the hand-back (the
    // pollers run it when due): adding it here would wake that thread (Engine::defer_timers).
    if (engine_.defer_timers()) {
        if (!timer_deferred_) {
            timer_deferred_ = true;
            engine_.note_deferred_timer(qpn());
        }
        // The socket may have come back between the two questions: nobody would add it then.
        if (engine_.defer_timers()) {
            bump(engine_.counters().deferred_timers);
            return;
        }
    }
    add_timer_event(timer_deadline_);
}

void RcQp::add_timer_event(std::chrono::steady_clock::time_point deadline) {
    timer_->arm_at(
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count());
}

void RcQp::arm_deferred_timer() {
    std::lock_guard lock(mutex_);
    timer_deferred_ = false;
    if (closed_ || !timer_armed_) return;
    add_timer_event(timer_deadline_);
}

void RcQp::restart_timer() {
    if (rnr_wait_) return;
    cancel_timer();
    arm_timer();
}

void RcQp::cancel_timer() {
    if (timer_armed_) {
        timer_->cancel();
        timer_armed_ = false;
    }
    probe_armed_ = false;
    ack_deadline_set_ = false;
    rnr_wait_ = false;
}

}  // namespace uroce::transport
