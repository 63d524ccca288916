#include "transport/responder_resources.h"

#include <algorithm>

#include "transport/psn.h"

namespace uroce::transport {

int64_t ReadResource::index_of(uint32_t p) const {
    const int64_t d = psn_diff(p, psn);
    return d >= 0 && d < static_cast<int64_t>(npkts) ? d : -1;
}

uint32_t ReadResource::length_of(uint32_t i) const {
    const uint64_t offset = offset_of(i);
    if (offset >= length) return 0;
    return static_cast<uint32_t>(std::min<uint64_t>(mtu, length - offset));
}

void ReadResources::set_capacity(uint32_t n) {
    capacity_ = std::min(n, kMaxDestRdAtomic);
}

ReadResource* ReadResources::admit(const ReadResource& r) {
    // One whose PSNs the new request's overlap is from an earlier lap of the 24-bit PSN
    // space (a requester never has two requests at one PSN): left in place, it would answer
    // the new one's duplicates (find() looks from the oldest).
    if (std::erase_if(entries_, [&r](const ReadResource& e) {
            return e.index_of(r.psn) >= 0 || r.index_of(e.psn) >= 0;
        }) != 0)
        sending_from_ = 0;
    while (entries_.size() >= capacity_) {
        // A READ whose responses have not all gone out is one the requester cannot have
        // finished, so it still counts against its max_rd_atomic. One that has may be
        // recycled, even while a duplicate makes it send again.
        auto it = std::find_if(entries_.begin(), entries_.end(),
                               [](const ReadResource& e) { return e.finished_once(); });
        if (it == entries_.end()) return nullptr;
        entries_.erase(it);
        sending_from_ = 0;
    }
    entries_.push_back(r);
    return &entries_.back();
}

ReadResource* ReadResources::find(uint32_t psn) {
    for (size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].index_of(psn) < 0) continue;
        sending_from_ = std::min(sending_from_, i);
        return &entries_[i];
    }
    return nullptr;
}

ReadResource* ReadResources::next_to_send() {
    for (; sending_from_ < entries_.size(); ++sending_from_)
        if (entries_[sending_from_].sending()) return &entries_[sending_from_];
    return nullptr;
}

}  // namespace uroce::transport
