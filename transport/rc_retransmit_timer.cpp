// RC requester's retransmission timer (IBA's local ACK timeout, adaptive: rtt_estimator.h)
// and the tail-loss probe armed sooner than it, with the RNR wait that shares it; the round
// trip samples it is set from; and a timer kept off the engine thread's loop while polling
// threads have the socket (Engine::defer_timers).
#include <algorithm>
#include <chrono>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

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
    // Progress whose batch has not ended yet (a poller's run_due_timer between two reads):
    // the wait starts again, as it would have at that response. (Otherwise the expiry goes
    // on below, which disarms the timer.)
    if (restart_timer_if_progressed()) return;
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
        } else if (read_probe_possible()) {
            probe_front_read();
        } else if (probes_sent_ == 0 && !nak_resent_) {
            note_timer_resend(now);
            send_tail_probe();
        } else if (!nak_resent_ && peer_keeps_ != PeerKeeps::No &&
                   engine_.config().selective_recovery && tail_probe_possible()) {
            // The second probe, no NAK in hand: the newest packet alone again, unless the
            // peer is known to keep nothing. A peer that keeps what follows a gap answers a
            // probe with its NAK again, so a lost NAK showed at the first probe; silence means
            // the probe or its answer was lost, or the peer has not run (a thread off the CPU
            // for milliseconds, common on a small host): going back N then resent a window of
            // 256 packets for nothing in 4 of 12 lossless ib_write_bw -n 10000 runs
            // (2026-12-05). A peer that NAKs once and then drops what follows (the kernel's
            // rxe) and lost that NAK waits for the early resend, which goes back N.
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
    } else if ((!rtt_.measured() && engine_.flight_budget().waiting() != 0) ||
               !engine_.resend_budget().take(now)) {
        // The adaptive timeout, with the engine's speculative resends used up (many QPs
        // timing out together): back off as if resent, and leave it to the next timeout.
        // Likewise the first guess (no round trip measured) while QPs wait for the engine's
        // flight budget: its own traffic fills the path, and the peer drains up to 3 MiB
        // ahead of this packet, milliseconds on a small host. 10,000 QPs with a 4 KiB WRITE
        // each drew 1,100-1,300 needless probes per side and took 0.08-0.33 s instead of
        // 0.06-0.09 (2026-12-07, docs/performance-log.md).
        bump(engine_.counters().resends_held_back);
        ++rto_backoff_;
        arm_timer();
        return;
    } else if (!rtt_.measured() && probes_sent_ == 0 && !nak_resent_ &&
               (read_probe_possible() || tail_probe_possible())) {
        // No round trip measured yet: the wait was a guess, and a peer that has not run
        // since (a process still starting up, busy on a small host) is likelier than a loss.
        // The last packet goes alone first, as a tail probe, and the peer's ACK of the
        // duplicate proves the wait needless (spurious_resend.h) and teaches the estimate;
        // behind a READ, the front READ alone is asked for again. The next expiry, as long
        // again, goes back N. Going back N at once resent a whole window of 256 packets 1-3
        // times per lossless ib_write_bw -n 2000 whose server was still busy starting up
        // (docs/performance-log.md, 2026-12-02), and asked for 128 READs again at the start
        // of some ib_read_bw -s 2 runs whose responder got no CPU for a millisecond
        // (2026-12-07). Two probes (1 ms, then 2 ms) before the go-back-N resent even less
        // (2026-12-05), but the ASan run of tests/integration/test_scale.cpp then failed 2
        // times in 4 under parallel load (all 3,000 SENDs of one side out of retries, the
        // other side having taken them all), against none in 2 runs, and none in earlier CI
        // runs, with this rule: reverted until that is understood.
        if (read_probe_possible()) {
            probe_front_read();
        } else {
            note_timer_resend(now);
            send_tail_probe();
        }
        arm_timer();
        return;
    } else {
        // The adaptive timeout: resend early, keep the local ACK timeout running.
        bump(engine_.counters().early_retransmits);
        bump(qp_counters_.early_retransmits);
        if (resend_selected_again()) {
            ++rto_backoff_;
            arm_timer();
            return;
        }
    }
    ++rto_backoff_;
    last_rewind_psn_ = 0xffffffff;
    // Every READ goes again from its first missing response: each may be asked for again
    // once more when a gap shows. To its end, the responses kept after a gap forgotten: a
    // responder that answers only the rest of a READ (not a part) still completes it.
    for (size_t i = 0; i < sq_.size() && sq_[i].assigned; ++i) {
        sq_[i].read_gap_retried = false;
        sq_[i].read_kept = 0;
    }
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
    forget_flight();
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
    // No first guess while QPs wait for the engine's flight budget (fire_timer): the local
    // ACK timeout alone, until a round trip is measured.
    if (engine_.config().adaptive_retransmit &&
        (rtt_.measured() || engine_.flight_budget().waiting() == 0)) {
        us = RttEstimator::wait_us(rtt_.timeout_us(rto_backoff_, ack_timeout_us), us);
        // A second probe (a go-back-N, rc_qp.h) waits twice as long as the first, or until
        // the adaptive timeout if that is sooner.
        const uint64_t probe_us =
            probes_sent_ == 0 ? rtt_.probe_us() : std::min(rtt_.probe_us() << probes_sent_, us);
        if (probes_sent_ < kMaxTailProbes && rtt_.measured() && probe_us <= us &&
            (nak_resent_ || tail_probe_possible() || read_probe_possible())) {
            us = probe_us;
            probe_armed_ = true;
        }
    }
    start_timer(us, now);
}

bool RcQp::note_window_loss(uint32_t lost_psn) {
    if (!window_.on_loss(lost_psn, sent_high_)) return false;
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

bool RcQp::read_probe_possible() const {
    if (!has_outstanding() || resending()) return false;
    const SqEntry& e = sq_.front();
    return e.wqe.opcode == SendOpcode::RdmaRead && !e.read_done;
}

void RcQp::probe_front_read() {
    ++probes_sent_;
    bump(engine_.counters().tail_probes);
    bump(qp_counters_.tail_probes);
    SqEntry& e = sq_.front();
    e.read_gap_retried = false;  // whatever was asked before went unanswered
    ask_again_for_read(e);
}

void RcQp::send_tail_probe() {
    ++probes_sent_;
    probe_psn_ = psn_add(sent_high_, kPsnMask);
    bump(engine_.counters().tail_probes);
    bump(qp_counters_.tail_probes);
    rewind_to(probe_psn_);
    probe_in_pump_ = true;
    pump();
    probe_in_pump_ = false;
}

void RcQp::resend_unacknowledged() {
    ++probes_sent_;
    bump(engine_.counters().tail_probes);
    bump(qp_counters_.tail_probes);
    if (!resend_selected_again()) rewind_to(oldest_unacked());
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

bool RcQp::restart_timer_if_progressed() {
    if (!progress_restart_due_) return false;
    progress_restart_due_ = false;
    // An RNR wait is not restarted by progress (restart_timer); nor is a QP that stopped.
    if (rnr_wait_ || (state_ != QpState::Rts && state_ != QpState::Sqd)) return false;
    restart_timer();
    return true;
}

void RcQp::cancel_timer() {
    if (timer_armed_) {
        timer_->cancel();
        timer_armed_ = false;
    }
    probe_armed_ = false;
    ack_deadline_set_ = false;
    rnr_wait_ = false;
    progress_restart_due_ = false;  // a restart, or nothing left to wait for
}

}  // namespace uroce::transport
