// RC completer: ACKs, NAKs and READ responses retire send work requests, in order. The
// retransmission timer and its tail-loss probes: rc_retransmit_timer.cpp.
#include <algorithm>
#include <cstring>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"
#include "transport/scatter.h"

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
        case SendOpcode::AtomicWrite:
            return WcOpcode::AtomicWrite;
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
        if (completed_by_ack(e.wqe.opcode)) {
            // ATOMIC WRITE: the ACK is its whole answer (a duplicate is acknowledged, never
            // executed twice, at the responder).
            if (psn_before(psn, e.psn)) break;
            una_psn_ = psn_add(e.psn, 1);
            retire_front(WcStatus::Success);
            progress = true;
            continue;
        }
        if (takes_responder_resource(e.wqe.opcode)) {
            if (e.read_done) {
                // Complete, perhaps while an earlier READ still lacked responses.
                una_psn_ = psn_add(e.psn, e.npkts);
                retire_front(WcStatus::Success);
                progress = true;
                continue;
            }
            // An ACK beyond a READ whose responses have not all come (or an atomic whose
            // acknowledgement has not) means they were lost: ask again for the rest (a READ
            // as ask_again_for_read allows, an atomic once until the timer runs out). An
            // atomic asked again is answered from the responder's replay cache, not
            // executed again.
            if (psn_before(psn, last)) break;
            if (e.wqe.opcode == SendOpcode::RdmaRead) {
                ask_again_for_read(e);
                if (state_ == QpState::Err) return;
                break;
            }
            if (!e.read_gap_retried) {
                e.read_gap_retried = true;
                rtt_timing_ = false;  // a resent request times nothing
                const WcStatus status = send_atomic_request(e);
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
    // Acknowledged now, the hint says nothing more (and would look new again after a wrap).
    if (read_implied_valid_ && psn_before(read_implied_ack_, una_psn_)) read_implied_valid_ = false;
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
            forget_flight();
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
    // Responses imply the ACK of every request before the READ they answer. The front may
    // be a READ still missing responses, which stops ack_through there: what lies behind it
    // is acknowledged once it completes (read_implied_ack_).
    const uint32_t implied = psn_add(psn, kPsnMask);
    if (!read_implied_valid_ || psn_after(implied, read_implied_ack_)) {
        read_implied_ack_ = implied;
        read_implied_valid_ = true;
    }
    ack_through(implied);
    if (!has_outstanding()) return;
    // The responder answers READs in PSN order: a response to this one means that every
    // earlier READ has had all of its responses sent, and those missing were lost.
    ask_again_for_reads_before(psn);
    if (state_ == QpState::Err) return;
    SqEntry* found = entry_for_psn(psn);
    if (!found || found->wqe.opcode != SendOpcode::RdmaRead || found->read_done) return;
    SqEntry& e = *found;
    // Responses to a READ behind one still missing some are taken (placed in its buffer):
    // a loss then costs the rest of one READ, not every READ in flight after it, each asked
    // for again once that one completes. Within a READ, those that follow a missing one are
    // kept too (read_kept, up to 63 beyond it), and only the gap is asked for again.
    const bool front = &e == &sq_.front();
    const uint32_t expected = psn_add(e.psn, e.read_pkts);
    const int32_t d = psn_diff(psn, expected);
    if (d < 0) return;  // a duplicate of a response we already have
    const uint32_t index = e.read_pkts + static_cast<uint32_t>(d);
    const uint16_t flags = pkt.info->flags;
    const bool is_first = flags & (wire::kFirst | wire::kOnly);
    const bool is_last = flags & (wire::kLast | wire::kOnly);
    const auto len = static_cast<uint32_t>(pkt.payload.size());
    // Every response but the READ's last carries one MTU; the last the rest. The READ's
    // first and last responses are a First/Only and a Last/Only; in between any opcode,
    // since a response asked for again starts a run of its own (a First, or rxe's Middle)
    // and one that asked for a part ends it (a Last).
    const uint32_t want = index + 1 < e.npkts ? attrs_.mtu : e.wqe.length - index * attrs_.mtu;
    const bool sequence_ok = (index != 0 || is_first) && (index + 1 != e.npkts || is_last);
    if (d > 0) {
        // A response went missing. Kept if it is in reach, well formed, and new; the gap is
        // asked for right away, but only once until the timer runs out: responses of the
        // earlier request are still arriving and each one would look like a new gap, and
        // answering every one with a new request makes the responder replay again and again.
        // Only this READ is asked for again: the requests after it were not lost.
        if (d < 64 && !((e.read_kept >> d) & 1) && sequence_ok && len == want) {
            if (!place_read_response(e, index, pkt.payload)) return;
            e.read_kept |= uint64_t{1} << d;
            bump(engine_.counters().rx_read_kept);
        }
        ask_again_for_read(e);
        return;
    }
    if (!sequence_ok || len != want) {
        e.failed = WcStatus::BadResp;
        enter_error();
        return;
    }
    if (!place_read_response(e, index, pkt.payload)) return;
    // This one, and those kept after it up to the next missing one.
    do {
        ++e.read_pkts;
        e.read_kept >>= 1;
    } while (e.read_kept & 1);
    e.read_bytes = std::min(e.wqe.length, e.read_pkts * attrs_.mtu);
    const bool done = e.read_pkts == e.npkts;
    if (done) e.read_done = true;
    // Once the part the last request asked for has come: kept responses beyond a new gap
    // mean that gap is lost already (the responder sends in PSN order), and so is what
    // follows a Last that ended the answer to that part (the responder answered it after
    // every response it had sent before). Asked for now, not on the next response or the
    // timer.
    if (!done && e.read_pkts >= e.read_asked_end && (e.read_kept != 0 || is_last)) {
        ask_again_for_read(e);
        if (state_ == QpState::Err) return;
    }
    // Only the front's progress restarts the timer: the timer waits for the front.
    if (!front) return;
    note_progress();
    if (done) {
        una_psn_ = psn_add(e.psn, e.npkts);
        // The READs already complete behind it, and the requests between them that their
        // responses acknowledged, complete with it.
        uint32_t through = psn_add(e.psn, e.npkts - 1);
        if (read_implied_valid_ && psn_after(read_implied_ack_, through))
            through = read_implied_ack_;
        ack_through(through);
    } else {
        progress_restart_due_ = true;
    }
}

bool RcQp::place_read_response(SqEntry& e, uint32_t index, std::span<const uint8_t> payload) {
    // Checked lengths keep it inside the READ's buffer, whose SGEs are each checked for local
    // write before any byte lands.
    const std::span<const uint8_t> pieces[] = {payload};
    if (scatter_checked(engine_.memory(), e.wqe.sgl, pd_, index * attrs_.mtu, pieces) ==
        KeyCheck::Ok)
        return true;
    e.failed = WcStatus::LocProtErr;
    enter_error();
    return false;
}

void RcQp::ask_again_for_read(SqEntry& e) {
    // Responses the responder sent before the last request for them still arrive after it,
    // each showing the same gap; once responses to that request have come (progress since),
    // a gap is a loss among them.
    if (e.read_gap_retried && e.read_pkts <= e.read_retried_at) return;
    e.read_gap_retried = true;
    e.read_retried_at = e.read_pkts;
    rtt_timing_ = false;  // a resent request times nothing
    if (const WcStatus status = send_read_request(e); status != WcStatus::Success) {
        e.failed = status;
        enter_error();
        return;
    }
    count_request_resent();
}

void RcQp::ask_again_for_reads_before(uint32_t psn) {
    for (size_t i = 0; i < sq_.size() && state_ != QpState::Err; ++i) {
        SqEntry& e = sq_[i];
        if (!e.assigned || !psn_before(e.psn, psn)) return;
        const bool holds = psn_diff(psn, e.psn) < static_cast<int32_t>(e.npkts);
        if (holds) return;
        if (e.wqe.opcode == SendOpcode::RdmaRead && !e.read_done) ask_again_for_read(e);
    }
}

}  // namespace uroce::transport
