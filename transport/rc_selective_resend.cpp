// RC requester: after a sequence NAK, the missing packet alone, when the peer keeps what
// followed it.
//
// IBA's requester goes back N: a NAK for PSN X sends X and everything after it again, since
// the responder dropped everything after X. A responder that keeps those packets
// (early_requests.h: uroce's own) needs only X. So the requester sends X and its newest
// packet T again, both asking for an ACK, and nothing else. X lets the responder run what it
// kept; T lets it name in its ACK what it ran (it names nothing the requester has not sent
// since the NAK, for the sake of requesters that go back N). The answer tells which peer
// this is:
//   - it acknowledges a packet between X and T, which was not sent again: the peer keeps
//     (PeerKeeps::Yes), and a resend of one packet repaired a loss that cost a window;
//   - a NAK for X + 1 (the peer took X, then found T out of sequence): it dropped what
//     followed X, or lost X + 1 too. The requester goes back N from X + 1, as it would have
//     from X, one round trip later; after kKeepStrikes such answers before any proof of
//     keeping, it goes back N at once for the rest of the connection (the kernel's rxe and
//     NICs without out-of-order placement cost three round trips, once).
// Once the peer is known to keep, a NAK for X + 1 (X + 1 lost too) is answered by another
// selective resend, up to kSelectiveChain in a row; then the requester goes back N, in case
// the peer stopped keeping (its budget spent) and would otherwise be repaired one packet per
// round trip.
// When a selective resend draws no answer in time (X or the answer lost, or a peer slow to
// run), the probe or the adaptive timeout sends X and T again instead of everything from X
// on: up to kSelectiveRetriesKeeping times to a peer known to keep, and
// kSelectiveRetriesUnknown times to one not known yet while the first resend's verdict is
// open (going back N would resend X + 1 and spoil the verdict; a late answer on a busy host
// is the likelier cause). The same NAK coming again does the same at once: a keeping
// responder sends it again when the newest packet comes again ahead of its gap
// (rc_responder.cpp), here T without X. Under 5% loss that took ib_write_bw -n 2000 from
// about 6,000 packets resent to 4,700 (docs/selective-recovery.md).
// A peer known to keep nothing gets go-back-N for every loss, and for its second probe
// without a NAK. A NAK while a go-back-N is still under way goes back N for any peer, and so
// do the adaptive and the local ACK timeouts without a NAK (the packet the peer waits for is
// unknown: rc_qp.h; a keeping peer answers a probe of its newest packet with the NAK again).
#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

namespace {

// Answers showing nothing kept, before any showed something kept, after which the requester
// only goes back N. A keeping peer that lost X + 1 too answers as one that keeps nothing, and
// the first verdicts of a connection are often void (a go-back-N at its start resent what
// they judge): with 2, one run in 6-20 of ib_write_bw under 5% loss (drops on send and on
// receive: about 10% per packet) took its keeping peer for one that keeps nothing and resent
// 15,000 packets instead of 4,500 (4 of 25 runs, none of 25 with 3: 2026-12-05). The
// kernel's rxe pays one round trip more, once per connection.
constexpr uint8_t kKeepStrikes = 3;

// Selective resends in a row that a keeping peer may answer with a NAK for the packet after
// the one resent, before the requester goes back N: under 5% random loss, three packets
// lost in a row are about one loss in 400.
constexpr uint8_t kSelectiveChain = 3;

// Repeats of a NAK's selective resend that got no answer in time (probes, adaptive
// timeouts) before the requester goes back N: to a peer known to keep, and to one not known
// yet while the first resend's verdict is open.
constexpr uint8_t kSelectiveRetriesKeeping = 4;
constexpr uint8_t kSelectiveRetriesUnknown = 2;

}  // namespace

void RcQp::on_sequence_nak(uint32_t psn) {
    // Resend from the PSN the responder expects, once per PSN: the NAKs for a burst of
    // out-of-order packets all name the same one.
    spurious_.on_loss();
    if (!has_outstanding()) return;
    if (psn == last_rewind_psn_) {
        // The same NAK again: a keeping peer saw the newest packet come again without the
        // one it asked for (it NAKs again only then), so this requester's resend of that
        // one was lost. Once more, selectively, as a probe would after waiting (to a peer
        // not known to keep, only while the first selective resend awaits its verdict).
        if (resend_selected_again()) restart_timer();
        return;
    }
    last_rewind_psn_ = psn;
    bool go_back = peer_keeps_ == PeerKeeps::No || !engine_.config().selective_recovery;
    if (selective_open_) {
        const uint32_t acked = psn_add(psn, kPsnMask);
        if (acked == selective_psn_) {
            // Only the resent packet was taken: nothing after it was kept, or the next one
            // was lost too. A peer known to keep has lost the next one, a few times in a
            // row at most; anyone else goes back N from there. If the next one is a READ or
            // an atomic, which no peer keeps, the answer says nothing of keeping: back N
            // from it (it cannot be resent alone), no strike.
            selective_open_ = false;
            if (keepable_request_at(psn) < 0) {
                go_back = true;
            } else {
                if (peer_keeps_ != PeerKeeps::Yes || ++selective_chain_ >= kSelectiveChain) {
                    go_back = true;
                    selective_chain_ = 0;
                }
                if (peer_keeps_ == PeerKeeps::Unknown && ++keep_strikes_ >= kKeepStrikes)
                    peer_keeps_ = PeerKeeps::No;
            }
        } else {
            judge_selective(acked);
        }
    }
    note_window_loss(psn);
    if (go_back || !resend_selected(psn)) rewind_to(psn);
    // The peer is alive and waiting for the resent packets: give them a whole timeout from
    // now, and a probe if they do not come (rc_qp.h).
    nak_resent_ = true;
    selective_retries_ = 0;
    restart_timer();
}

void RcQp::judge_selective(uint32_t acked) {
    // Nothing after the resent packet acknowledged yet: no verdict (an ACK for X alone may
    // come before the one for T).
    if (!psn_after(acked, selective_psn_)) return;
    selective_open_ = false;
    selective_chain_ = 0;
    // X + 1 was not sent again (it lies before T, and no go-back-N sent it before the
    // selective resend: one after it would have closed the verdict): the peer had kept it.
    // goback_high_ may be as old as the connection: only one inside what was outstanding
    // then (after X + 1, at most T + 1) says anything.
    const uint32_t next = psn_add(selective_psn_, 1);
    const bool resent_by_goback =
        psn_after(goback_high_, next) && !psn_after(goback_high_, psn_add(selective_tail_, 1));
    if (!resent_by_goback && psn_before(next, selective_tail_)) {
        peer_keeps_ = PeerKeeps::Yes;
        keep_strikes_ = 0;
        window_.set_peer_keeps();
    }
}

bool RcQp::resend_selected_again() {
    if (!nak_resent_ || !engine_.config().selective_recovery) return false;
    // A peer known to keep loses only time to a late answer. One not known yet (the answer
    // is the verdict) gets the same, a bounded number of times: a peer that keeps nothing
    // and whose NAK for X + 1 was lost answers the repeat with nothing (it NAKs once), and
    // only going back N repairs it.
    uint8_t bound = 0;
    if (peer_keeps_ == PeerKeeps::Yes)
        bound = kSelectiveRetriesKeeping;
    else if (peer_keeps_ == PeerKeeps::Unknown && selective_open_)
        bound = kSelectiveRetriesUnknown;
    if (selective_retries_ >= bound) return false;
    if (!resend_selected(oldest_unacked(), Resend::Probe)) return false;
    ++selective_retries_;
    return true;
}

int64_t RcQp::keepable_request_at(uint32_t psn) const {
    for (size_t i = 0; i < sq_.size(); ++i) {
        const SqEntry& e = sq_[i];
        if (!e.assigned) break;
        const int32_t d = psn_diff(psn, e.psn);
        if (d < 0 || d >= static_cast<int32_t>(e.npkts)) continue;
        if (is_local_op(e.wqe.opcode) || takes_responder_resource(e.wqe.opcode)) return -1;
        return static_cast<int64_t>(i);
    }
    return -1;
}

bool RcQp::resend_selected(uint32_t psn, Resend why) {
    // In the middle of a go-back-N (the window let only part of it out) the packets after
    // `psn` go again anyway, in order: an answer acknowledging them would pass for proof of
    // keeping. Go back N.
    if (resending()) return false;
    const int64_t x = keepable_request_at(psn);
    if (x < 0) return false;
    // Without its newest packet the answer would say nothing kept, and a peer that keeps
    // nothing would wait for the timer: then go back N.
    const uint32_t tail = psn_add(sent_high_, kPsnMask);
    const int64_t t = psn_after(tail, psn) ? keepable_request_at(tail) : -1;
    if (t < 0 && tail != psn) return false;

    // What is resent times nothing (Karn).
    if (rtt_timing_ && !psn_before(rtt_psn_, psn)) rtt_timing_ = false;
    TransmitBatch* const outer = tx_batch_;
    TransmitBatch batch(engine_, &qp_counters_);
    if (!outer) tx_batch_ = &batch;
    const auto resend = [this](int64_t i, uint32_t p) {
        SqEntry& e = sq_[static_cast<size_t>(i)];
        tx_batch_->set_tag(static_cast<uint32_t>(i));
        const WcStatus status =
            send_request_packet(e, static_cast<uint32_t>(psn_diff(p, e.psn)), true);
        if (status == WcStatus::Success) count_request_resent();
        return status == WcStatus::Success;
    };
    bool ok = resend(x, psn);
    if (ok && t >= 0) ok = resend(t, tail);
    if (!outer) {
        ok = flush_tx_batch() && ok;
        tx_batch_ = nullptr;
    }
    // A packet that could not go: going back N meets the same failure and ends the request
    // with it, as pump_window does.
    if (!ok) return false;
    // A probe counts as a probe (tail_probes) only.
    if (why == Resend::Loss) {
        bump(engine_.counters().selective_resends);
        bump(qp_counters_.selective_resends);
    }
    selective_open_ = t >= 0;
    selective_psn_ = psn;
    selective_tail_ = tail;
    return true;
}

}  // namespace uroce::transport
