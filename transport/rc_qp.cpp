#include "transport/rc_qp.h"

#include "transport/engine.h"
#include "transport/psn.h"

namespace uroce::transport {

RcQp::RcQp(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
           std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
           void* user_handle, std::shared_ptr<SharedReceiveQueue> srq, XrcRole xrc_role,
           uint32_t xrcd)
    : QpCommon(engine, qpn, pd, caps, std::move(send_cq), std::move(recv_cq), user_handle,
               std::move(srq)),
      qpn_(qpn),
      xrc_role_(xrc_role),
      xrcd_(xrcd),
      opcode_base_(xrc_role == XrcRole::None ? 0 : wire::kXrcOpcodeBase),
      early_(engine.early_request_pool()) {
    timer_ = std::make_unique<TimerQueue::Timer>(engine_.timers(), &RcQp::timer_trampoline, this);
    responder_event_ = event_new(engine_.base(), -1, 0, &RcQp::responder_trampoline, this);
}

RcQp::~RcQp() {
    close();
    if (responder_event_) event_free(responder_event_);
}

void RcQp::close() {
    {
        std::lock_guard lock(mutex_);
        if (closed_) return;
        // The receive batch that completed a request may not have sent its ACK yet, while the
        // application, having seen the completion, already destroys the QP: the request was
        // executed and reported, so the requester must hear of it, or it retries until it
        // fails a transfer that succeeded.
        send_last_ack();
        closed_ = true;
        cancel_timer();
        settle_flight();
    }
    // A timer callback may be running on the engine thread, waiting for the mutex; it will
    // see closed_ and return without re-arming. Wait for that (without the mutex, or it
    // could not finish), so that nothing runs on this QP once close() returns.
    timer_->cancel_and_wait();
    if (responder_event_) event_del_block(responder_event_);
}

QpAttributes RcQp::attributes() const {
    std::lock_guard lock(mutex_);
    return attrs_;
}

uint64_t RcQp::smoothed_rtt_us() const {
    std::lock_guard lock(mutex_);
    return rtt_.measured() ? rtt_.smoothed_us() : 0;
}

bool RcQp::peer_keeps_nothing() const {
    std::lock_guard lock(mutex_);
    return peer_keeps_ == PeerKeeps::No;
}

int RcQp::modify(const QpAttributes& attrs, QpState expected, QpState next) {
    std::lock_guard lock(mutex_);
    const QpState prev = state_;
    if (prev != expected && next != QpState::Reset && next != QpState::Err) return EINVAL;
    // Requests executed and completed before the application stops the QP are acknowledged
    // first (see close()).
    if (next == QpState::Reset || next == QpState::Err) send_last_ack();
    attrs_ = attrs;
    reads_.set_capacity(attrs_.max_dest_rd_atomic);
    if (next == prev && next != QpState::Sqd) return 0;
    switch (next) {
        case QpState::Reset:
            cancel_timer();
            sq_.clear();
            // Discarded, as the IBA discards a reset QP's receive queue. A WQE taken from an
            // SRQ for a message in progress goes the same way.
            rq_.clear();
            recv_.reset();
            xrc_srq_.reset();
            send_index_ = 0;
            send_pkt_ = 0;
            reads_outstanding_ = 0;
            window_.reset();
            spurious_.reset();
            unrequested_ = 0;
            in_message_ = InMessage::None;
            forget_pending_ack();
            nak_sent_ = false;
            newest_ahead_live_ = false;
            got_first_packet_ = false;
            msn_ = 0;
            reads_.clear();
            held_.clear();
            early_.clear();
            early_ack_cap_ = kNoResentPsn;
            peer_keeps_ = PeerKeeps::Unknown;
            keep_strikes_ = 0;
            selective_chain_ = 0;
            selective_open_ = false;
            selective_retries_ = 0;
            goback_high_ = 0;
            send_psn_live_ = expected_psn_live_ = false;
            break;
        case QpState::Rtr:
            answer_leads_ack_ = engine_.answer_may_lead_ack(attrs_.dst_ip);
            epsn_ = attrs_.rq_psn & kPsnMask;
            ack_psn_ = psn_add(epsn_, kPsnMask);  // nothing executed yet
            last_ack_sent_ = std::chrono::steady_clock::time_point::min();
            ack_msn_ = msn_;
            expected_psn_live_ = true;
            break;
        case QpState::Rts:
            if (prev == QpState::Rtr) {
                next_psn_ = attrs_.sq_psn & kPsnMask;
                una_psn_ = next_psn_;
                sent_high_ = next_psn_;
                window_una_ = next_psn_;
                goback_high_ = next_psn_;  // nothing resent: none after the first PSN
                read_implied_valid_ = false;
                send_psn_live_ = true;
            }
            retries_left_ = attrs_.retry_cnt;
            rnr_retries_left_ = attrs_.rnr_retry;
            break;
        case QpState::Err:
            state_ = QpState::Err;
            flush_all();
            settle_flight();
            return 0;
        default:
            break;
    }
    state_ = next;
    if (next == QpState::Rts) pump();
    if (next == QpState::Sqd && !has_outstanding() && attrs_.sqd_notify)
        post_async(AsyncEventType::SqDrained);
    settle_flight();  // RESET (and its reuse) charges nothing
    return 0;
}

int RcQp::post_send(const SendWqe& wqe, bool more) {
    std::lock_guard lock(mutex_);
    if (xrc_role_ == XrcRole::Target) return EINVAL;  // it only receives
    switch (state_) {
        case QpState::Reset:
        case QpState::Init:
        case QpState::Rtr:
            return EINVAL;
        default:
            break;
    }
    if (sq_.size() >= caps_.max_send_wr) return ENOMEM;
    if (state_ == QpState::Err) {
        SqEntry e;
        e.wqe = wqe;
        complete_send(e, WcStatus::WrFlushErr);
        return 0;
    }
    last_post_ = std::chrono::steady_clock::now();
    sq_.emplace_back(wqe);  // built in place: one copy of the WQE
    // This may answer a message whose ACK still waits (for the end of the receive batch, or
    // held for this answer: engine_held_acks.cpp). A post held for the next poll keeps it:
    // both leave from send_held(). Otherwise both leave now, in one system call, in the
    // order send_with_ack() explains.
    const bool go = state_ == QpState::Rts && !may_wait(wqe, more);
    if (!go && held_noted_ && ack_pending_) return 0;
    if (go || ack_pending_) send_with_ack(go, go && leads_ack(wqe));
    return 0;
}

QpCommon::Psns RcQp::psns() const {
    std::lock_guard lock(mutex_);
    Psns p;
    if (send_psn_live_) p.send = next_psn_;
    if (expected_psn_live_) p.expected = epsn_;
    return p;
}

size_t RcQp::send_room() const {
    std::lock_guard lock(mutex_);
    return sq_.size() >= caps_.max_send_wr ? 0 : caps_.max_send_wr - sq_.size();
}

bool RcQp::sq_draining() const {
    std::lock_guard lock(mutex_);
    return state_ == QpState::Sqd && has_outstanding();
}

bool RcQp::leads_ack(const SendWqe& wqe) const {
    // Never while a fault may single a packet out: it leaves alone, and the ACK would follow
    // the answer in a datagram of its own. Losses alone change no order: a lost answer or
    // ACK is missing from the train, the rest of it goes as before.
    if (!answer_leads_ack_ || !engine_.gso_enabled() ||
        engine_.faults_single_out(FaultDirection::Tx))
        return false;
    // The answer alone in the batch (nothing else to send or send again: a packet that
    // completes something at the peer in an earlier train would be taken before the ACK),
    // all of it, with the ACK, in one system call.
    const uint32_t npkts = packets_for(wqe);
    if (send_index_ + 1 != sq_.size() || npkts >= TransmitBatch::kMaxPackets) return false;
    // The ACK must close the train of the answer's last packet, the one that completes a
    // receive at the peer: that packet must be no shorter than the ACK (a SEND of no bytes
    // is shorter) and, after full ones, full itself, or it closes their train (a last packet
    // with an immediate or an invalidated key is then longer than they: it starts a train).
    // The batch's limits always leave the ACK room behind fewer than kMaxPackets packets.
    if (npkts == 1) return wqe.length > 0 || wqe.opcode != SendOpcode::Send;
    return wqe.length % std::max<uint32_t>(attrs_.mtu, 1) == 0;
}

void RcQp::send_with_ack(bool pump_too, bool answer_leads) {
    TransmitBatch batch(engine_, &qp_counters_);
    tx_batch_ = &batch;
    if (pump_too) {
        // Without a staging area the packets leave one by one: no train could carry the ACK
        // behind a leading answer.
        ack_in_pump_ =
            answer_leads && batch.usable() ? AckInPump::AtEnd : AckInPump::BeforeCompletion;
        pump();  // joins the batch, and so does the ACK, where ack_in_pump_ says
        ack_in_pump_ = AckInPump::No;
    }
    // The ACK, if the pump did not send it (or did not run).
    send_pending_ack();
    if (!flush_tx_batch()) enter_error();  // a packet this host can never send
    tx_batch_ = nullptr;
}

bool RcQp::may_wait(const SendWqe& wqe, bool more) {
    unpumped_packets_ += packets_for(wqe);
    if (unpumped_packets_ >= TransmitBatch::kMaxPackets) return false;  // a train: go now
    if (more) return true;
    // An answer goes now: a QP that owes its peer an ACK and has nothing of its own in
    // flight answers a request the peer waits on (a ping-pong). The next poll would send
    // this post alone with that ACK; holding it only adds the time until then (ib_send_lat,
    // ib_write_lat: 0.1-0.2 us a leg). A QP streaming both ways has requests in flight.
    if (ack_pending_ && !has_outstanding()) return false;
    return hold_for_poll();
}

void RcQp::ring() {
    std::lock_guard lock(mutex_);
    if (unpumped_packets_ == 0 || state_ != QpState::Rts) return;
    if (engine_.hold_posts() && held_noted_) return;
    pump();
}

void RcQp::send_held() {
    std::lock_guard lock(mutex_);
    held_noted_ = false;
    if (closed_ || state_ != QpState::Rts || unpumped_packets_ == 0) return;
    // With the ACK the post kept (post_send), in one system call.
    send_with_ack(true, send_index_ < sq_.size() && leads_ack(sq_[send_index_].wqe));
}

int RcQp::post_recv(const RecvWqe& wqe) {
    std::lock_guard lock(mutex_);
    if (state_ == QpState::Reset || srq_ || xrc_role_ != XrcRole::None) return EINVAL;
    if (rq_.size() >= caps_.max_recv_wr) return ENOMEM;
    if (state_ == QpState::Err) {
        Completion c;
        c.wr_id = wqe.wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn_;
        push_completion(*recv_cq_, c);
        return 0;
    }
    rq_.push_back(wqe);
    return 0;
}

void RcQp::on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) {
    on_packets(std::span(&pkt, 1), src_ip);
}

void RcQp::on_packets(std::span<const wire::ParsedPacket> pkts, const IpAddress& src_ip) {
    // One lock and one update of each counter for a train's packets (docs/performance-log.md).
    std::lock_guard lock(mutex_);
    if (!count_received(pkts)) return;
    for (const wire::ParsedPacket& pkt : pkts) take_packet(pkt, src_ip);
    settle_flight();  // an RNR NAK changes the charge without a pump
}

void RcQp::take_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) {
    if (src_ip != attrs_.dst_ip) {
        bump(engine_.counters().rx_wrong_peer);
        bump(qp_counters_.rx_wrong_peer);
        return;
    }
    const uint16_t flags = pkt.info->flags;
    // Each half of an XRC connection takes one direction only.
    if (xrc_role_ == (flags & wire::kRequest ? XrcRole::Initiator : XrcRole::Target)) {
        bump(engine_.counters().rx_unsupported);
        return;
    }
    if (flags & wire::kRequest) {
        if (state_ == QpState::Reset || state_ == QpState::Init || state_ == QpState::Err) {
            bump(engine_.counters().rx_wrong_state);
            return;
        }
        if (!got_first_packet_) {
            got_first_packet_ = true;
            if (state_ == QpState::Rtr) post_async(AsyncEventType::CommEstablished);
        }
        on_request(pkt);
    } else {
        if (state_ != QpState::Rts && state_ != QpState::Sqd) {
            bump(engine_.counters().rx_wrong_state);
            return;
        }
        on_response(pkt);
    }
}

bool RcQp::push_completion(CompletionQueue& cq, const Completion& c) {
    if (cq.push(c)) return true;
    bump(engine_.counters().cq_overruns);
    // Flushing into a full CQ loses flush completions only: the QP is already in ERR.
    if (state_ == QpState::Err) return false;
    const bool executed_request =
        c.status == WcStatus::Success &&
        (c.opcode == WcOpcode::Recv || c.opcode == WcOpcode::RecvRdmaWithImm);
    if (executed_request) {
        // The request that consumed the receive ended with the packet executing now (not at
        // epsn_ - 1: requests held behind READ responses were accepted after it). The NAK
        // acknowledges everything before it and fails it at the requester.
        responder_error(wire::NakCode::RemoteOperationalError, executing_psn_,
                        AsyncEventType::QpFatal);
    } else {
        post_async(AsyncEventType::QpFatal);
        enter_error();
    }
    return false;
}

void RcQp::enter_error() {
    if (state_ == QpState::Err) return;
    // An ACK held for the application's answer (engine_held_acks.cpp) acknowledges requests
    // this QP executed and completed before its own failure: the peer must hear of them (as
    // it would have without the hold), or it fails work that succeeded; the part a cap held
    // back too, as when the application moves the QP to ERR (send_last_ack).
    send_last_ack();
    state_ = QpState::Err;
    flush_all();
    settle_flight();
}

void RcQp::flush_all() {
    cancel_timer();
    // Every outstanding work request completes, signaled or not, as the IBA requires of
    // a QP in the error state.
    while (!sq_.empty()) {
        const WcStatus failed = sq_.front().failed;
        complete_send(sq_.front(), failed != WcStatus::Success ? failed : WcStatus::WrFlushErr);
        sq_.pop_front();
    }
    send_index_ = 0;
    send_pkt_ = 0;
    reads_outstanding_ = 0;
    // The WQE of the message in progress first: it was the oldest.
    if (recv_) {
        Completion c;
        c.wr_id = recv_->wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn_;
        recv_.reset();
        if (CompletionQueue* cq = recv_cq()) push_completion(*cq, c);
    }
    // An XRC target holds the SRQ of an open message only (execute_request): none is open
    // now, and a destroyed SRQ's CQ must not stay busy while this QP lives on in ERR.
    xrc_srq_.reset();
    while (!rq_.empty()) {
        Completion c;
        c.wr_id = rq_.front().wr_id;
        c.status = WcStatus::WrFlushErr;
        c.opcode = WcOpcode::Recv;
        c.qp_num = qpn_;
        rq_.pop_front();
        push_completion(*recv_cq_, c);
    }
    in_message_ = InMessage::None;
    forget_pending_ack();
    // No response goes out in ERR: the READs and held requests are dropped.
    reads_.clear();
    held_.clear();
    early_.clear();
    // In ERR the QP takes nothing more from its SRQ: the application may now destroy it
    // without losing a WQE (IBA 10.3.1 / 11.6.3, Last WQE Reached).
    if (srq_) post_async(AsyncEventType::LastWqeReached);
}

bool RcQp::transmit(const wire::Headers& h, std::span<const iovec> payload, uint32_t payload_len) {
    const auto result = engine_.transmit(h, payload, payload_len, attrs_.dst_ip, sender_, 0,
                                         tx_batch_, &qp_counters_);
    if (result == Engine::TransmitResult::Sent) {
        bump(qp_counters_.tx_packets);
        bump(qp_counters_.tx_payload_bytes, payload_len);
    }
    return result != Engine::TransmitResult::Failed;
}

bool RcQp::flush_tx_batch() {
    if (!tx_batch_) return true;
    engine_.flush(*tx_batch_);
    // A flush inside Engine::transmit (a packet that could not join) may have failed too.
    const uint32_t tag = tx_batch_->failed_tag();
    if (tag == TransmitBatch::kNoTag) return true;
    tx_batch_->clear_failure();
    if (tag < sq_.size()) sq_[tag].failed = WcStatus::LocQpOpErr;
    return false;
}

MemoryTable::ReadLock RcQp::lock_memory() const {
    if (tx_batch_) {
        tx_batch_->pin(engine_.memory());
        return {};
    }
    return engine_.memory().lock_shared();
}

}  // namespace uroce::transport
