#include "transport/transmit_batch.h"

#include "transport/engine.h"

namespace uroce::transport {

TransmitBatch::~TransmitBatch() {
    engine_.flush(*this);
}

void TransmitBatch::pin(const MemoryTable& memory) {
    if (!pin_.owns_lock()) pin_ = memory.lock_shared();
}

bool TransmitBatch::fits(const UdpSocket& from, const IpAddress& dst_ip, uint32_t bytes,
                         size_t niov) const {
    if (count_ == 0) return niov <= kMaxIov && bytes <= kMaxBytes;
    return &from == from_ && dst_ip == dst_ip_ && !closed_ && bytes <= segment_bytes_ &&
           count_ < kMaxPackets && bytes_ + bytes <= kMaxBytes && niov_ + niov <= kMaxIov;
}

void TransmitBatch::clear() noexcept {
    count_ = 0;
    niov_ = 0;
    bytes_ = 0;
    closed_ = false;
    from_ = nullptr;
}

void TransmitBatch::unpin() noexcept {
    if (pin_.owns_lock()) pin_.unlock();
}

}  // namespace uroce::transport
