#include "transport/early_requests.h"

#include <algorithm>

#include "transport/psn.h"

namespace uroce::transport {

wire::ParsedPacket StoredRequest::view() const {
    wire::ParsedPacket p;
    p.h = h;
    p.info = info;
    p.payload = payload;
    return p;
}

bool EarlyRequestBudget::take(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
        if (bytes > limit_ || used > limit_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
}

void EarlyRequestBudget::give(size_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
}

namespace {

// The same request: what the responder would execute alike. AckReq may differ (a resend
// asks for an ACK where the first transmission did not), and so may the BTH's ECN bits.
bool same_request(const StoredRequest& kept, const wire::ParsedPacket& pkt) {
    const wire::Headers& a = kept.h;
    const wire::Headers& b = pkt.h;
    return kept.info == pkt.info && a.bth.opcode == b.bth.opcode && a.bth.psn == b.bth.psn &&
           a.bth.solicited == b.bth.solicited && a.bth.pad == b.bth.pad &&
           a.bth.dest_qp == b.bth.dest_qp && a.reth.va == b.reth.va && a.reth.rkey == b.reth.rkey &&
           a.reth.dma_len == b.reth.dma_len && a.imm == b.imm && a.ieth == b.ieth &&
           a.xrc_srqn == b.xrc_srqn &&
           std::equal(kept.payload.begin(), kept.payload.end(), pkt.payload.begin(),
                      pkt.payload.end());
}

}  // namespace

EarlyRequests::Kept EarlyRequests::keep(const wire::ParsedPacket& pkt, uint32_t ahead) {
    const uint16_t flags = pkt.info->flags;
    const uint32_t psn = pkt.h.bth.psn;
    if (!(flags & (wire::kSend | wire::kWrite)) || (flags & (wire::kRead | wire::kAtomic))) {
        // Not kept; but where a SEND or WRITE is kept for its PSN one of the two is not the
        // requester's, as with two different copies: both go, the resend decides.
        if (slots_ && ahead > 0 && ahead < kSpan) {
            Slot& s = slots_[psn % kSpan];
            if (s.used && s.psn == psn) {
                release(s);
                return Kept::Conflict;
            }
        }
        return Kept::NotKind;
    }
    if (ahead == 0 || ahead >= kSpan) return Kept::TooFar;
    if (slots_) {
        Slot& s = slots_[psn % kSpan];
        if (s.used && s.psn == psn) {
            if (same_request(s.req, pkt)) {
                s.req.h.bth.ack_req = s.req.h.bth.ack_req || pkt.h.bth.ack_req;
                return Kept::Already;
            }
            release(s);
            return Kept::Conflict;
        }
        if (s.used) release(s);  // a PSN the expected one has passed
    }
    const size_t bytes = pkt.payload.size() + kOverhead;
    if (!budget_.take(bytes)) return Kept::NoBudget;
    if (!slots_) slots_ = std::make_unique<Slot[]>(kSpan);
    Slot& s = slots_[psn % kSpan];
    s.used = true;
    s.psn = psn;
    s.bytes = bytes;
    s.req.h = pkt.h;
    s.req.info = pkt.info;
    s.req.payload.assign(pkt.payload.begin(), pkt.payload.end());
    ++count_;
    return Kept::Yes;
}

bool EarlyRequests::take(uint32_t psn, StoredRequest& out) {
    if (!slots_) return false;
    Slot& s = slots_[psn % kSpan];
    if (!s.used || s.psn != psn) return false;
    out = std::move(s.req);
    s.req = StoredRequest{};
    release(s);
    return true;
}

void EarlyRequests::forget_before(uint32_t expected) {
    if (!slots_) return;
    for (uint32_t i = 0; i < kSpan && count_ > 0; ++i) {
        Slot& s = slots_[i];
        if (s.used && psn_before(s.psn, expected)) release(s);
    }
}

void EarlyRequests::clear() {
    if (!slots_) return;
    for (uint32_t i = 0; i < kSpan && count_ > 0; ++i)
        if (slots_[i].used) release(slots_[i]);
    slots_.reset();
    count_ = 0;
}

void EarlyRequests::release(Slot& s) {
    budget_.give(s.bytes);
    s.used = false;
    --count_;
    if (count_ == 0) slots_.reset();  // `s` is gone with it
}

}  // namespace uroce::transport
