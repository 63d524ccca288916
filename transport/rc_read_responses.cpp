// RC responder's READs: a READ becomes a responder resource (responder_resources.h) and its
// responses go out kResponseBurst packets at a time, the first burst at the end of the
// receive batch that brought the request (send_due_responses: the READs of one batch share
// transmit batches, so one READ's LAST, which carries an AETH as its FIRST does, rides in the
// GSO train of the next READ's FIRST) and the rest from the engine thread
// (on_responder_event). Requests that arrive meanwhile are accepted (the PSN advances) but
// held and executed after the responses have gone out, in PSN order (run_held); duplicate READ
// requests only move the cursor of the resource they match (rc_responder.cpp).
#include <algorithm>

#include "transport/app_memory_guard.h"
#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

namespace {

// Held requests executed per step on the engine thread.
constexpr uint32_t kHeldBurst = 64;

}  // namespace

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
        const bool last = i + 1 == r->run_stop();
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
        engine_.early_request_pool().recycle(std::move(req.payload));
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
    r.npkts = read_response_packets(reth.dma_len, attrs_.mtu);
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

}  // namespace uroce::transport
