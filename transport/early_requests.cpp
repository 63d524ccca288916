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

bool EarlyRequestPool::take(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
        if (bytes > limit_ || used > limit_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
}

void EarlyRequestPool::give(size_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
}

std::vector<uint8_t> EarlyRequestPool::buffer() {
    std::lock_guard lock(mutex_);
    if (buffers_.empty()) return {};
    std::vector<uint8_t> b = std::move(buffers_.back());
    buffers_.pop_back();
    buffer_bytes_ -= b.capacity();
    return b;
}

void EarlyRequestPool::recycle(std::vector<uint8_t> buffer) {
    const size_t capacity = buffer.capacity();
    if (capacity == 0) return;
    buffer.clear();
    std::lock_guard lock(mutex_);
    if (capacity > kSpareBytes - buffer_bytes_ || buffers_.size() >= kSpareBuffers)
        return;  // freed on return
    buffer_bytes_ += capacity;
    buffers_.push_back(std::move(buffer));
}

std::unique_ptr<KeptSlot[]> EarlyRequestPool::table() {
    {
        std::lock_guard lock(mutex_);
        if (!tables_.empty()) {
            std::unique_ptr<KeptSlot[]> t = std::move(tables_.back());
            tables_.pop_back();
            return t;
        }
    }
    return std::make_unique<KeptSlot[]>(EarlyRequests::kSpan);
}

void EarlyRequestPool::recycle(std::unique_ptr<KeptSlot[]> table) {
    if (!table) return;
    std::lock_guard lock(mutex_);
    if (tables_.size() < kSpareTables) tables_.push_back(std::move(table));
}

size_t EarlyRequestPool::spare_buffers() const {
    std::lock_guard lock(mutex_);
    return buffers_.size();
}

size_t EarlyRequestPool::spare_bytes() const {
    std::lock_guard lock(mutex_);
    return buffer_bytes_;
}

size_t EarlyRequestPool::spare_tables() const {
    std::lock_guard lock(mutex_);
    return tables_.size();
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
            KeptSlot& s = slots_[psn % kSpan];
            if (s.used && s.psn == psn) {
                release(s);
                return Kept::Conflict;
            }
        }
        return Kept::NotKind;
    }
    if (ahead == 0 || ahead >= kSpan) return Kept::TooFar;
    if (slots_) {
        KeptSlot& s = slots_[psn % kSpan];
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
    if (!pool_.take(bytes)) return Kept::NoBudget;
    if (!slots_) slots_ = pool_.table();
    KeptSlot& s = slots_[psn % kSpan];
    s.used = true;
    s.psn = psn;
    s.bytes = bytes;
    s.req.h = pkt.h;
    s.req.info = pkt.info;
    s.req.payload = pool_.buffer();
    s.req.payload.assign(pkt.payload.begin(), pkt.payload.end());
    ++count_;
    return Kept::Yes;
}

bool EarlyRequests::take(uint32_t psn, StoredRequest& out) {
    if (!slots_) return false;
    KeptSlot& s = slots_[psn % kSpan];
    if (!s.used || s.psn != psn) return false;
    out.h = s.req.h;
    out.info = s.req.info;
    std::swap(out.payload, s.req.payload);  // out's old buffer goes back with the slot
    release(s);
    return true;
}

void EarlyRequests::give_back(StoredRequest& taken) {
    pool_.recycle(std::move(taken.payload));
    taken.payload = {};
}

void EarlyRequests::forget_before(uint32_t expected) {
    if (!slots_) return;
    for (uint32_t i = 0; i < kSpan && count_ > 0; ++i) {
        KeptSlot& s = slots_[i];
        if (s.used && psn_before(s.psn, expected)) release(s);
    }
}

void EarlyRequests::clear() {
    if (!slots_) return;
    for (uint32_t i = 0; i < kSpan && count_ > 0; ++i)
        if (slots_[i].used) release(slots_[i]);
    pool_.recycle(std::move(slots_));  // empty: release() gave it back with the last slot
    count_ = 0;
}

void EarlyRequests::release(KeptSlot& s) {
    pool_.give(s.bytes);
    pool_.recycle(std::move(s.req.payload));
    s.req.payload = {};
    s.used = false;
    --count_;
    if (count_ == 0) pool_.recycle(std::move(slots_));  // `s` is gone with it
}

}  // namespace uroce::transport
