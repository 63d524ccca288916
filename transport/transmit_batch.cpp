#include "transport/transmit_batch.h"

#include "transport/engine.h"

namespace uroce::transport {

TransmitBatch::~TransmitBatch() {
    engine_.flush(*this);
}

void TransmitBatch::pin(const MemoryTable& memory) {
    if (!pin_.owns_lock()) pin_ = memory.lock_shared();
}

bool TransmitBatch::place(const UdpSocket& from, const IpAddress& dst_ip, uint32_t bytes,
                          size_t niov, Slot& slot) const {
    if (bytes > kMaxBytes) return false;
    if (count_ == 0) {
        slot = {true, 0};
        return niov <= kMaxIov;
    }
    if (&from != from_ || dst_ip != dst_ip_ || count_ >= kMaxPackets || niov_ + niov > kMaxIov)
        return false;
    const Train& t = trains_[ntrains_ - 1];
    if (!t.closed && bytes <= t.segment_bytes && t.bytes + bytes <= kMaxBytes) {
        slot = {false, t.count};
        return true;
    }
    if (ntrains_ == kMaxTrains) return false;
    slot = {true, 0};
    return true;
}

void TransmitBatch::add(const UdpSocket& from, const IpAddress& dst_ip, const Slot& slot,
                        uint32_t bytes, uint16_t niov, uint32_t payload_len) {
    if (count_ == 0) {
        from_ = &from;
        dst_ip_ = dst_ip;
    }
    if (slot.new_train) {
        trains_[ntrains_++] = Train{static_cast<uint16_t>(count_), 0, bytes, 0, false};
    }
    Train& t = trains_[ntrains_ - 1];
    if (bytes < t.segment_bytes) t.closed = true;
    ++t.count;
    t.bytes += bytes;
    packets_[count_++] = {static_cast<uint16_t>(niov_), niov, bytes, payload_len, tag_};
    niov_ += niov;
}

std::span<const iovec> TransmitBatch::train_iov(size_t t) const {
    const Train& train = trains_[t];
    const Packet& first = packets_[train.first];
    const Packet& last = packets_[train.first + train.count - 1];
    return {&iov_[first.first_iov],
            static_cast<size_t>(last.first_iov + last.niov - first.first_iov)};
}

void TransmitBatch::clear() noexcept {
    count_ = 0;
    niov_ = 0;
    ntrains_ = 0;
    from_ = nullptr;
}

void TransmitBatch::unpin() noexcept {
    if (pin_.owns_lock()) pin_.unlock();
}

}  // namespace uroce::transport
