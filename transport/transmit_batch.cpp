#include "transport/transmit_batch.h"

#include <memory>
#include <new>

#include "transport/device_slots.h"
#include "transport/engine.h"
#include "transport/page_aligned_buffer.h"

namespace uroce::transport {

namespace {

// One staging area per thread that sends, taken by one batch at a time. Page-aligned, so that
// an offset's place in a cache line is the address's (Slot).
struct StagingArea {
    std::unique_ptr<PageAlignedBuffer> buffer;
    bool taken = false;
};
// Initial-exec, as poll_handoff.cpp's t_posts: taken for every batch sent.
__attribute__((tls_model("initial-exec"))) thread_local StagingArea t_staging;

}  // namespace

TransmitBatch::TransmitBatch(Engine& engine, QpCounters* qp_counters) noexcept
    : engine_(engine), qp_counters_(qp_counters) {
    StagingArea& area = t_staging;
    if (area.taken) return;
    if (!area.buffer) {
        try {
            area.buffer = std::make_unique<PageAlignedBuffer>(kStageBytes);
        } catch (const std::bad_alloc&) {
            return;  // packets go alone
        }
    }
    area.taken = true;
    stage_ = area.buffer->data();
}

TransmitBatch::~TransmitBatch() {
    engine_.flush(*this);
    if (stage_) t_staging.taken = false;
}

void TransmitBatch::pin(const MemoryTable& memory) {
    if (!pin_.owns_lock()) pin_ = memory.lock_shared();
}

bool TransmitBatch::place(const UdpSocket& from, const IpAddress& dst_ip, uint32_t dst_qpn,
                          uint32_t bytes, uint32_t header_bytes, Slot& slot) const {
    if (bytes > kMaxBytes) return false;
    if (count_ == 0) {
        slot = {true, 0, train_offset(stage_used_, header_bytes)};
        return slot.offset + bytes <= kStageBytes;
    }
    if (&from != from_ || dst_ip != dst_ip_ || count_ >= kMaxPackets) return false;
    const Train& t = trains_[ntrains_ - 1];
    if (!t.closed && bytes <= t.segment_bytes && t.whole.iov_len + bytes <= kMaxBytes &&
        t.qpn_slot == DeviceSlots::slot_of(dst_qpn)) {
        slot = {false, t.count, static_cast<uint32_t>(stage_used_)};
        return slot.offset + bytes <= kStageBytes;
    }
    if (ntrains_ == kMaxTrains) return false;
    slot = {true, 0, train_offset(stage_used_, header_bytes)};
    return slot.offset + bytes <= kStageBytes;
}

void TransmitBatch::add(const UdpSocket& from, const IpAddress& dst_ip, uint32_t dst_qpn,
                        const Slot& slot, uint32_t bytes, uint32_t payload_len) {
    if (count_ == 0) {
        from_ = &from;
        dst_ip_ = dst_ip;
    }
    if (slot.new_train)
        trains_[ntrains_++] = Train{static_cast<uint16_t>(count_), 0,     bytes,
                                    DeviceSlots::slot_of(dst_qpn), false, {at(slot), 0}};
    Train& t = trains_[ntrains_ - 1];
    if (bytes < t.segment_bytes) t.closed = true;
    ++t.count;
    t.whole.iov_len += bytes;
    packets_[count_++] = {slot.offset, bytes, payload_len, tag_};
    stage_used_ = slot.offset + bytes;
}

void TransmitBatch::clear() noexcept {
    count_ = 0;
    ntrains_ = 0;
    stage_used_ = 0;
    from_ = nullptr;
}

void TransmitBatch::unpin() noexcept {
    if (pin_.owns_lock()) pin_.unlock();
}

}  // namespace uroce::transport
