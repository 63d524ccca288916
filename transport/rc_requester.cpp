// RC requester: send work requests become request packets.
#include <algorithm>
#include <bit>

#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"
#include "transport/scatter.h"

namespace uroce::transport {

namespace {

// Bytes in flight before the requester waits for ACKs, at most: the ceiling of the send
// window (send_window.h), which halves under loss, since each loss costs a resend of what
// followed it (go-back-N). 1 MiB keeps a loopback path busy with an ACK per half window
// (ib_write_bw -s 65536 gained a fifth to a quarter over 256 KiB with an ACK per message).
constexpr uint32_t kSendWindowBytes = 1024 * 1024;
// And at most this many packets (256 KiB at an MTU of 1024, as before the window adapted).
constexpr uint32_t kSendWindowPackets = 256;
// Bytes in flight from all the QPs of an engine together: they all land in the peer's one
// receive socket, and more than it holds are dropped, each drop costing a go-back-N resend
// that drops more (16 QPs of 256 KiB each both ways lost a third of their packets and
// failed with RETRY_EXC_ERR). Each QP gets its share, never less than 16 packets; the
// engine's flight budget (flight_budget.h) holds them all to a little more.
constexpr uint32_t kEngineWindowBytes = 2 * 1024 * 1024;

struct OpcodeSet {
    wire::Opcode first, middle, last, only, last_imm, only_imm;
};
constexpr OpcodeSet kSendOps{wire::Opcode::RcSendFirst,   wire::Opcode::RcSendMiddle,
                             wire::Opcode::RcSendLast,    wire::Opcode::RcSendOnly,
                             wire::Opcode::RcSendLastImm, wire::Opcode::RcSendOnlyImm};
constexpr OpcodeSet kWriteOps{wire::Opcode::RcWriteFirst,   wire::Opcode::RcWriteMiddle,
                              wire::Opcode::RcWriteLast,    wire::Opcode::RcWriteOnly,
                              wire::Opcode::RcWriteLastImm, wire::Opcode::RcWriteOnlyImm};

}  // namespace

bool RcQp::goes_on_after_current() const {
    // What pump_window() would do with the entries after sq_[send_index_].
    for (size_t i = send_index_ + 1; i < sq_.size(); ++i) {
        const SqEntry& n = sq_[i];
        if (n.assigned) return true;  // sent before: a resend goes on with it
        if (state_ == QpState::Sqd) return false;
        if (n.wqe.fence && reads_outstanding_ > 0) return false;
        if (is_local_op(n.wqe.opcode)) continue;  // runs at once
        return !(takes_responder_resource(n.wqe.opcode) &&
                 reads_outstanding_ >= attrs_.max_rd_atomic);
    }
    return false;
}

uint32_t RcQp::packets_for(const SendWqe& wqe) const {
    if (is_atomic(wqe.opcode) || wqe.opcode == SendOpcode::AtomicWrite) return 1;
    const uint32_t mtu = std::max<uint32_t>(attrs_.mtu, 1);
    return std::max<uint32_t>(1, (wqe.length + mtu - 1) / mtu);
}

bool RcQp::gather(const SqEntry& e, uint32_t offset, uint32_t len, std::span<iovec> iov,
                  size_t& niov) const {
    return gather_checked(engine_.memory(), e.wqe, pd_, offset, len, iov, niov);
}

WcStatus RcQp::send_request_packet(SqEntry& e, uint32_t pkt_index, bool ask_ack) {
    const bool is_send = e.wqe.opcode == SendOpcode::Send ||
                         e.wqe.opcode == SendOpcode::SendWithImm ||
                         e.wqe.opcode == SendOpcode::SendWithInv;
    const bool with_inv = e.wqe.opcode == SendOpcode::SendWithInv;
    const bool with_imm =
        e.wqe.opcode == SendOpcode::SendWithImm || e.wqe.opcode == SendOpcode::RdmaWriteWithImm;
    const OpcodeSet& ops = is_send ? kSendOps : kWriteOps;
    const uint32_t mtu = attrs_.mtu;
    const bool first = pkt_index == 0;
    const bool last = pkt_index + 1 == e.npkts;
    const uint32_t offset = pkt_index * mtu;
    const uint32_t len = std::min(mtu, e.wqe.length - std::min(e.wqe.length, offset));

    wire::Headers h;
    wire::Opcode op;
    if (first && last)
        op = with_imm ? ops.only_imm : ops.only;
    else if (first)
        op = ops.first;
    else if (last)
        op = with_imm ? ops.last_imm : ops.last;
    else
        op = ops.middle;
    if (with_inv && last) {
        // The invalidate variants exist for Last and Only (IBA 9.2, opcodes 0x16 and 0x17).
        op = first ? wire::Opcode::RcSendOnlyInv : wire::Opcode::RcSendLastInv;
        h.ieth = e.wqe.rkey;
    }
    h.bth.opcode = opcode(op);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.bth.psn = psn_add(e.psn, pkt_index);
    h.xrc_srqn = e.wqe.remote_srqn;
    h.bth.solicited = last && e.wqe.solicited;
    // An ACK is asked for wherever the requester stops sending: when this packet fills the
    // window, or ends a message after which nothing can go now (the queue ends, or the next
    // request waits for a fence, the READ limit or SQD); and at least twice per window, so
    // the window moves on while its second half is in flight. Not at every message's end:
    // in a stream the ACK for a later packet completes the earlier messages too, and every
    // ACK costs both sides a system call. So the last packet of every burst asks, and a
    // tail probe, which repeats it, asks too.
    const bool fills_window =
        psn_diff(psn_add(h.bth.psn, 1), una_psn_) >= static_cast<int32_t>(window_.packets());
    h.bth.ack_req = ask_ack || (last && !goes_on_after_current()) || fills_window ||
                    flight_fills() || ++unrequested_ >= window_.ack_interval();
    if (h.bth.ack_req) unrequested_ = 0;
    if (first && !is_send) h.reth = {e.wqe.remote_addr, e.wqe.rkey, e.wqe.length};
    if (last && with_imm) h.imm = e.wqe.imm;

    auto guard = lock_memory();
    iovec iov[kMaxSge];
    size_t niov = 0;
    if (!gather(e, offset, len, iov, niov)) return WcStatus::LocProtErr;
    return transmit(h, std::span(iov, niov), len) ? WcStatus::Success : WcStatus::LocQpOpErr;
}

void RcQp::count_request_resent() {
    bump(engine_.counters().retransmitted_packets);
    bump(qp_counters_.retransmitted_packets);
}

WcStatus RcQp::send_read_request(SqEntry& e) {
    wire::Headers h;
    h.bth.opcode = opcode(wire::Opcode::RcReadRequest);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.xrc_srqn = e.wqe.remote_srqn;
    // A retried READ asks only for what has not arrived yet (IBA 9.7.4.1.6): from the first
    // missing response to the first one kept after it (every response between is a full
    // MTU), or to the end. Each retry starts at or after the one before: rxe's responder
    // refuses one that starts before the last part it answered.
    h.bth.psn = psn_add(e.psn, e.read_pkts);
    h.bth.ack_req = true;
    const uint32_t gap =
        e.read_kept != 0 ? static_cast<uint32_t>(std::countr_zero(e.read_kept)) : 0;
    const uint32_t len = gap != 0 ? gap * attrs_.mtu : e.wqe.length - e.read_bytes;
    h.reth = {e.wqe.remote_addr + e.read_bytes, e.wqe.rkey, len};
    e.read_asked_end = gap != 0 ? e.read_pkts + gap : e.npkts;
    // The local buffer must be writable before we ask for data to land in it.
    if (!local_buffer_writable(e)) return WcStatus::LocProtErr;
    return transmit(h, {}, 0) ? WcStatus::Success : WcStatus::LocQpOpErr;
}

void RcQp::pump() {
    unpumped_packets_ = 0;
    if (tx_batch_) {  // inside a batch already: join it
        pump_window();
        settle_flight();
        return;
    }
    TransmitBatch batch(engine_, &qp_counters_);
    tx_batch_ = &batch;
    pump_window();
    if (!flush_tx_batch()) enter_error();  // a packet this host can never send
    tx_batch_ = nullptr;
    settle_flight();
}

// Sends what the window allows, starting at send_index_/send_pkt_.
void RcQp::pump_window() {
    // SQD finishes (and retransmits) what was started but starts nothing new.
    if ((state_ != QpState::Rts && state_ != QpState::Sqd) || rnr_wait_) return;
    const uint32_t share = kEngineWindowBytes / std::max<uint32_t>(1, engine_.qp_count());
    window_.set_ceiling(
        std::min(kSendWindowPackets, std::min(kSendWindowBytes, share) / attrs_.mtu));
    if (psn_after(una_psn_, window_una_)) {
        window_.on_acknowledged(static_cast<uint32_t>(psn_diff(una_psn_, window_una_)), una_psn_);
    }
    window_una_ = una_psn_;
    const auto window = static_cast<int32_t>(window_.packets());
    bool sent = false;
    while (send_index_ < sq_.size()) {
        SqEntry& e = sq_[send_index_];
        if (is_local_op(e.wqe.opcode)) {
            // A bind or local invalidate runs when the requester reaches it, after what was
            // posted before it went out (a fence also waits for READs and atomics), and
            // completes in order once everything before it has.
            if (!e.assigned) {
                if (state_ == QpState::Sqd) break;
                if (e.wqe.fence && reads_outstanding_ > 0) break;
                // What went before leaves first, and the memory table is free to change.
                if (!flush_tx_batch()) {
                    enter_error();
                    return;
                }
                e.assigned = true;
                e.psn = next_psn_;
                e.npkts = 0;
                e.failed = run_local_op(e.wqe);
            }
            // One that failed stops the QP when it completes (at the front, with its error):
            // nothing posted after it may reach the peer meanwhile, only to be flushed.
            if (e.failed != WcStatus::Success) break;
            ++send_index_;
            send_pkt_ = 0;
            continue;
        }
        if (!e.assigned) {
            if (state_ == QpState::Sqd) break;
            // A new request: fences and the READ limit apply only before it first goes out.
            if (e.wqe.fence && reads_outstanding_ > 0) break;
            if (takes_responder_resource(e.wqe.opcode) &&
                reads_outstanding_ >= attrs_.max_rd_atomic)
                break;
            if (psn_diff(next_psn_, una_psn_) >= window) break;
            e.assigned = true;
            e.psn = next_psn_;
            e.npkts = packets_for(e.wqe);
            next_psn_ = psn_add(next_psn_, e.npkts);
            if (takes_responder_resource(e.wqe.opcode)) ++reads_outstanding_;
            send_pkt_ = 0;
        }
        if (e.wqe.opcode == SendOpcode::RdmaRead && e.read_done) {
            // Going back N over a READ whose responses all came (behind one that lacked
            // some): nothing to ask for.
            ++send_index_;
            send_pkt_ = 0;
            continue;
        }
        const uint32_t psn = psn_add(e.psn, send_pkt_);
        // A READ sent before is asked for again (a go-back-N) whatever the window: the window
        // admitted its responses when it first went, and counted in PSNs a window cut to its
        // floor holds one 64 KiB READ, so the READs behind the front one waited for it to
        // complete, and no probe could go meanwhile (a go-back-N under way).
        const bool read_again =
            e.wqe.opcode == SendOpcode::RdmaRead && e.assigned && psn_before(e.psn, sent_high_);
        const bool probe = probe_in_pump_ && psn == probe_psn_;
        if (!read_again && !probe && psn_diff(psn, una_psn_) >= window) break;
        // A packet that goes for the first time needs room in the engine's flight budget; a
        // resend or a probe stands for one in flight.
        if (!read_again && !probe && !psn_before(psn, sent_high_) && !flight_admits(e)) break;
        if (ack_in_pump_ == AckInPump::BeforeCompletion && send_pkt_ + 1 >= e.npkts &&
            may_complete_at_peer(e.wqe.opcode)) {
            ack_in_pump_ = AckInPump::No;
            send_pending_ack();
        }
        WcStatus status;
        if (tx_batch_) tx_batch_->set_tag(static_cast<uint32_t>(send_index_));
        if (e.wqe.opcode == SendOpcode::RdmaRead) {
            status = send_read_request(e);
            send_pkt_ = e.npkts;
        } else if (is_atomic(e.wqe.opcode)) {
            status = send_atomic_request(e);
            send_pkt_ = e.npkts;
        } else if (e.wqe.opcode == SendOpcode::AtomicWrite) {
            status = send_atomic_write_request(e);
            send_pkt_ = e.npkts;
        } else {
            status = send_request_packet(e, send_pkt_);
            ++send_pkt_;
        }
        if (status != WcStatus::Success) {
            // A local key check failed, or the packet can never leave this host: this
            // request completes with that error and the QP stops, flushing the rest, as the
            // IBA prescribes (and as rxe does when a send fails for good).
            // What went before this request still leaves, as before; if a packet of an
            // earlier request is the one that cannot, that request is the one failing.
            if (flush_tx_batch()) e.failed = status;
            enter_error();
            return;
        }
        sent = true;
        if (psn_before(psn, sent_high_)) {
            count_request_resent();
            goback_high_ = psn_add(psn, 1);
        } else {
            start_rtt_timing(psn);
        }
        // A READ request claims every PSN of its responses: they are what the peer may send.
        const uint32_t end =
            e.wqe.opcode == SendOpcode::RdmaRead ? psn_add(e.psn, e.npkts) : psn_add(psn, 1);
        if (psn_after(end, sent_high_)) sent_high_ = end;
        if (send_pkt_ >= e.npkts) {
            ++send_index_;
            send_pkt_ = 0;
        }
    }
    if (sent) arm_timer();
    if (ack_in_pump_ != AckInPump::No) {
        ack_in_pump_ = AckInPump::No;
        send_pending_ack();
    }
    // The batch leaves before anything is retired: its tags are sq_ indices.
    if (!flush_tx_batch()) {
        enter_error();
        return;
    }
    // Local operations at the front have nothing to wait for.
    while (!sq_.empty() && sq_.front().assigned && is_local_op(sq_.front().wqe.opcode)) {
        if (sq_.front().failed != WcStatus::Success) {
            enter_error();
            return;
        }
        retire_front(WcStatus::Success);
    }
}

WcStatus RcQp::run_local_op(const SendWqe& wqe) {
    MemoryTable& mem = engine_.memory();
    if (wqe.opcode == SendOpcode::BindMw) {
        MemoryTable::WindowBind b;
        b.mr_lkey = wqe.bind.mr_lkey;
        b.addr = wqe.bind.addr;
        b.length = wqe.bind.length;
        b.access = wqe.bind.access;
        b.qpn = qpn_;
        return mem.bind_window(wqe.bind.mw_rkey, wqe.bind.new_rkey, pd_, b) == KeyCheck::Ok
                   ? WcStatus::Success
                   : WcStatus::MwBindErr;
    }
    return mem.invalidate_window(wqe.rkey, pd_, 0) == KeyCheck::Ok ? WcStatus::Success
                                                                   : WcStatus::LocQpOpErr;
}

// Go back N: send everything again from `psn`, the oldest PSN the responder lacks.
void RcQp::rewind_to(uint32_t psn) {
    // Its answer would now acknowledge resent packets too: no verdict on the peer from it.
    selective_open_ = false;
    // What is resent times nothing (Karn); a timed packet before `psn` is not resent.
    if (rtt_timing_ && !psn_before(rtt_psn_, psn)) rtt_timing_ = false;
    for (size_t i = 0; i < sq_.size(); ++i) {
        SqEntry& e = sq_[i];
        if (!e.assigned) break;
        const int32_t d = psn_diff(psn, e.psn);
        if (d < 0 || d >= static_cast<int32_t>(e.npkts)) continue;
        if (i < send_index_ || (i == send_index_ && send_pkt_ > static_cast<uint32_t>(d))) {
            send_index_ = i;
            send_pkt_ = e.wqe.opcode == SendOpcode::RdmaRead ? 0 : static_cast<uint32_t>(d);
        }
        return;
    }
}

}  // namespace uroce::transport
