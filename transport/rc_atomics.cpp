// RC atomics (IBA 9.4.5, 9.7.5.1.x): Compare & Swap and Fetch & Add on 8 bytes of the
// responder's memory, on all three sides of the QP.
//
// - Requester: one request packet with an AtomicETH; like a READ it takes one of the
//   max_rd_atomic slots, waits for a response of its own (the Atomic Acknowledge), and is
//   asked for again when a later ACK shows that response was lost.
// - Responder: executes the operation with a CPU atomic on the registered memory, so it is
//   atomic with respect to every other atomic on that memory, whichever QP, context or
//   process runs it. The original value is kept in the request's responder resource, the
//   replay cache: a duplicate of the request (its acknowledgement was lost) gets the same
//   answer again and is never executed twice.
// - Completer: writes the original value into the local buffer and completes the request.
//
// ATOMIC WRITE (IBA 1.5, opcode 0x1d) stores 8 bytes at once: a RETH and an 8-byte payload.
// It takes a responder resource as an atomic does (rxe's rule: the requester's max_rd_atomic,
// the responder's max_dest_rd_atomic), needs remote write access to the QP and the region,
// an 8-byte aligned target, and is answered by a plain ACK, which completes it at the
// requester. A duplicate is acknowledged as a WRITE's is, never stored twice.
#include <atomic>
#include <cstring>

#include "transport/app_memory_guard.h"
#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport {

namespace {

constexpr uint32_t kAtomicBytes = 8;

}  // namespace

// --- requester ---

bool RcQp::local_buffer_writable(const SqEntry& e) const {
    auto guard = lock_memory();
    uint32_t left = e.wqe.length;
    for (uint32_t i = 0; i < e.wqe.sgl.count && left > 0; ++i) {
        const Sge& s = e.wqe.sgl.sge[i];
        const uint32_t take = std::min(left, s.length);
        if (engine_.memory().check_local(s.lkey, pd_, s.addr, take, kLocalWrite) != KeyCheck::Ok)
            return false;
        left -= take;
    }
    return left == 0;
}

WcStatus RcQp::send_atomic_request(SqEntry& e) {
    // The original value lands in the local buffer: it must be writable before we ask.
    if (!local_buffer_writable(e)) return WcStatus::LocProtErr;
    const bool cmp_swap = e.wqe.opcode == SendOpcode::AtomicCmpSwap;
    wire::Headers h;
    h.bth.opcode = opcode(cmp_swap ? wire::Opcode::RcCompareSwap : wire::Opcode::RcFetchAdd);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.xrc_srqn = e.wqe.remote_srqn;
    h.bth.psn = e.psn;
    h.bth.ack_req = true;
    h.atomic.va = e.wqe.remote_addr;
    h.atomic.rkey = e.wqe.rkey;
    h.atomic.swap_add = cmp_swap ? e.wqe.swap : e.wqe.compare_add;
    h.atomic.compare = cmp_swap ? e.wqe.compare_add : 0;
    return transmit(h, {}, 0) ? WcStatus::Success : WcStatus::LocQpOpErr;
}

WcStatus RcQp::send_atomic_write_request(SqEntry& e) {
    wire::Headers h;
    h.bth.opcode = opcode(wire::Opcode::RcAtomicWrite);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.xrc_srqn = e.wqe.remote_srqn;
    h.bth.psn = e.psn;
    h.bth.ack_req = true;
    h.reth = {e.wqe.remote_addr, e.wqe.rkey, kAtomicBytes};
    auto guard = lock_memory();
    iovec iov[kMaxSge];
    size_t niov = 0;
    if (!gather(e, 0, kAtomicBytes, iov, niov)) return WcStatus::LocProtErr;
    return transmit(h, std::span(iov, niov), kAtomicBytes) ? WcStatus::Success
                                                           : WcStatus::LocQpOpErr;
}

// --- completer ---

void RcQp::on_atomic_ack(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    // An Atomic Acknowledge must answer an atomic, and carry an ACK (NAKs come as plain
    // Acknowledge packets).
    const SqEntry* answered = entry_for_psn(psn);
    if (!answered || !is_atomic(answered->wqe.opcode)) {
        bump(engine_.counters().rx_response_out_of_window);
        return;
    }
    if (pkt.h.aeth.type() != wire::AckType::Ack) {
        bump(engine_.counters().rx_malformed);
        return;
    }
    // It acknowledges every request before the atomic, too.
    ack_through(psn_add(psn, kPsnMask));
    if (!has_outstanding()) return;
    SqEntry& e = sq_.front();
    if (!is_atomic(e.wqe.opcode) || e.read_done || e.psn != psn) return;
    uint8_t original[kAtomicBytes];
    std::memcpy(original, &pkt.h.atomic_ack, kAtomicBytes);  // as the application reads it
    {
        auto guard = engine_.memory().lock_shared();
        uint32_t done = 0;
        for (uint32_t i = 0; i < e.wqe.sgl.count && done < kAtomicBytes; ++i) {
            const Sge& s = e.wqe.sgl.sge[i];
            const uint32_t take = std::min(kAtomicBytes - done, s.length);
            if (engine_.memory().check_local(s.lkey, pd_, s.addr, take, kLocalWrite) !=
                KeyCheck::Ok) {
                e.failed = WcStatus::LocProtErr;
                enter_error();
                return;
            }
            if (!guarded_copy(reinterpret_cast<void*>(s.addr), original + done, take)) {
                engine_.memory().note_fault();
                e.failed = WcStatus::LocProtErr;
                enter_error();
                return;
            }
            done += take;
        }
    }
    e.read_done = true;
    e.read_pkts = 1;
    retries_left_ = attrs_.retry_cnt;
    last_rewind_psn_ = 0xffffffff;
    una_psn_ = psn_add(e.psn, 1);
    ack_through(e.psn);
}

// --- responder ---

void RcQp::send_atomic_ack(const ReadResource& r) {
    wire::Headers h;
    h.bth.opcode = opcode(wire::Opcode::RcAtomicAcknowledge);
    h.bth.dest_qp = attrs_.dest_qpn;
    h.bth.psn = r.psn;
    h.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits);
    h.aeth.msn = r.msn & kPsnMask;
    h.atomic_ack = r.original;
    transmit(h, {}, 0);
}

void RcQp::execute_atomic(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    const wire::AtomicEth& a = pkt.h.atomic;
    // (An atomic request with a payload never gets here: the parser drops it as malformed.)
    if (!(attrs_.access & kRemoteAtomic)) {
        responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
        return;
    }
    // The target must be naturally aligned (IBA 9.4.5): a misaligned one is an invalid
    // request, as rxe answers it.
    if (a.va % kAtomicBytes != 0) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    ReadResource r;
    r.psn = psn;
    r.npkts = 1;
    r.va = a.va;
    r.rkey = a.rkey;
    r.mtu = attrs_.mtu;
    r.msn = psn_add(msn_, 1);
    r.next = 1;  // nothing to pace: the answer goes out now
    r.sent_once = 1;
    r.atomic = true;
    r.swap_add = a.swap_add;
    r.compare = a.compare;
    r.cmp_swap =
        wire::operation_of(pkt.h.bth.opcode) == static_cast<uint8_t>(wire::Opcode::RcCompareSwap);
    r.pd = responder_pd();
    // The resource first: without one the atomic must not run (more atomics and READs
    // outstanding than the max_dest_rd_atomic we gave).
    ReadResource* res = reads_.admit(r);
    if (res == nullptr) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    {
        auto guard = engine_.memory().lock_shared();
        uint64_t local = 0;
        if (engine_.memory().check_remote(a.rkey, res->pd, a.va, kAtomicBytes, kRemoteAtomic, local,
                                          qpn_) != KeyCheck::Ok ||
            local % kAtomicBytes != 0) {
            // (A region registered at an address of another alignment than its iova can
            // map an aligned va to an unaligned byte: no CPU atomic can work there.)
            guard.unlock();
            responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
            return;
        }
        auto execute = [res, local, &a] {
            std::atomic_ref<uint64_t> target(*reinterpret_cast<uint64_t*>(local));
            if (res->cmp_swap) {
                uint64_t expected = a.compare;
                target.compare_exchange_strong(expected, a.swap_add, std::memory_order_acq_rel);
                res->original = expected;  // the value found, whether or not it was swapped
            } else {
                res->original = target.fetch_add(a.swap_add, std::memory_order_acq_rel);
            }
        };
        if (!guarded(execute)) {
            // The region's pages are gone (app_memory_guard.h): refused as a bad key is.
            engine_.memory().note_fault();
            guard.unlock();
            responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
            return;
        }
    }
    ++msn_;
    send_atomic_ack(*res);
}

void RcQp::on_duplicate_atomic(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    const wire::AtomicEth& a = pkt.h.atomic;
    const bool cmp_swap =
        wire::operation_of(pkt.h.bth.opcode) == static_cast<uint8_t>(wire::Opcode::RcCompareSwap);
    // Answered again only if it is the very request executed at that PSN: anything else is
    // a replay or a forgery, and running it (or answering it) would be wrong.
    ReadResource* r = reads_.find(psn);
    if (r == nullptr || !r->atomic || r->psn != psn || r->rkey != a.rkey || r->va != a.va ||
        r->swap_add != a.swap_add || r->compare != a.compare || r->cmp_swap != cmp_swap ||
        !(attrs_.access & kRemoteAtomic)) {
        bump(engine_.counters().rx_duplicate_dropped);
        return;
    }
    send_atomic_ack(*r);
}

void RcQp::execute_atomic_write(const wire::ParsedPacket& pkt) {
    const uint32_t psn = pkt.h.bth.psn;
    const wire::Reth& reth = pkt.h.reth;
    if (!(attrs_.access & kRemoteWrite)) {
        responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
        return;
    }
    // Exactly 8 bytes, said and carried, to a naturally aligned target.
    if (reth.dma_len != kAtomicBytes || pkt.payload.size() != kAtomicBytes || pkt.h.bth.pad != 0 ||
        reth.va % kAtomicBytes != 0) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    ReadResource r;
    r.psn = psn;
    r.npkts = 1;
    r.va = reth.va;
    r.rkey = reth.rkey;
    r.length = kAtomicBytes;
    r.mtu = attrs_.mtu;
    r.msn = psn_add(msn_, 1);
    r.next = 1;  // nothing to send from it: the ACK answers
    r.sent_once = 1;
    r.atomic_write = true;
    r.pd = responder_pd();
    if (reads_.admit(r) == nullptr) {
        responder_error(wire::NakCode::InvalidRequest, psn, AsyncEventType::QpRequestError);
        return;
    }
    uint64_t value = 0;
    std::memcpy(&value, pkt.payload.data(), kAtomicBytes);  // the bytes as they came
    {
        auto guard = engine_.memory().lock_shared();
        uint64_t local = 0;
        if (engine_.memory().check_remote(reth.rkey, r.pd, reth.va, kAtomicBytes, kRemoteWrite,
                                          local, qpn_) != KeyCheck::Ok ||
            local % kAtomicBytes != 0) {
            guard.unlock();
            responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
            return;
        }
        // One store of all 8 bytes, after everything executed before it (release).
        auto store = [local, value] {
            std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(local))
                .store(value, std::memory_order_release);
        };
        if (!guarded(store)) {
            engine_.memory().note_fault();
            guard.unlock();
            responder_error(wire::NakCode::RemoteAccessError, psn, AsyncEventType::QpAccessError);
            return;
        }
    }
    ++msn_;
    ack_psn_ = psn;
    ack_msn_ = msn_;
    resent_high_ = kNoResentPsn;
    ack_pending_ = true;
}

}  // namespace uroce::transport
