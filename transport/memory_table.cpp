#include "transport/memory_table.h"

#include <new>

namespace uroce::transport {

const char* to_string(KeyCheck c) {
    switch (c) {
        case KeyCheck::Ok:
            return "ok";
        case KeyCheck::BadKey:
            return "no such key";
        case KeyCheck::WrongPd:
            return "key of another protection domain";
        case KeyCheck::OutOfBounds:
            return "range outside the region";
        case KeyCheck::NoAccess:
            return "access not granted";
    }
    return "?";
}

MemoryKeys MemoryTable::add(uint32_t pd, uint64_t addr, uint64_t length, uint64_t iova,
                            uint32_t access) {
    std::unique_lock lock(mutex_);
    // Keys carry a 24-bit index; after 2^24 registrations it wraps, skipping indices whose
    // region is still registered, so a live key is never handed out twice.
    constexpr uint32_t kIndexMask = 0xffffff;
    if (by_lkey_.size() >= kIndexMask) throw std::bad_alloc();
    uint32_t index;
    do {
        index = next_index_;
        next_index_ = (next_index_ & kIndexMask) == kIndexMask ? 1 : next_index_ + 1;
    } while (by_lkey_.contains((index << 8) | 0x11));
    // The low byte differs between lkey and rkey so that using one for the other fails.
    MemoryKeys keys{(index << 8) | 0x11, (index << 8) | 0x77};
    by_lkey_.emplace(keys.lkey, Region{pd, addr, length, iova, access, keys.rkey});
    rkey_to_lkey_.emplace(keys.rkey, keys.lkey);
    return keys;
}

bool MemoryTable::remove(uint32_t lkey) {
    std::unique_lock lock(mutex_);
    auto it = by_lkey_.find(lkey);
    if (it == by_lkey_.end()) return false;
    rkey_to_lkey_.erase(it->second.rkey);
    by_lkey_.erase(it);
    return true;
}

size_t MemoryTable::size() const {
    std::shared_lock lock(mutex_);
    return by_lkey_.size();
}

KeyCheck MemoryTable::check(const Region* r, uint32_t pd, uint64_t base, uint64_t addr,
                            uint64_t length, uint32_t access) {
    if (!r) return KeyCheck::BadKey;
    if (r->pd != pd) return KeyCheck::WrongPd;
    if (addr < base || length > r->length || addr - base > r->length - length)
        return KeyCheck::OutOfBounds;
    if ((r->access & access) != access) return KeyCheck::NoAccess;
    return KeyCheck::Ok;
}

KeyCheck MemoryTable::check_local(uint32_t lkey, uint32_t pd, uint64_t addr, uint64_t length,
                                  uint32_t access) const {
    auto it = by_lkey_.find(lkey);
    if (it == by_lkey_.end()) return KeyCheck::BadKey;
    return check(&it->second, pd, it->second.addr, addr, length, access);
}

KeyCheck MemoryTable::check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t length,
                                   uint32_t access, uint64_t& local) const {
    auto k = rkey_to_lkey_.find(rkey);
    if (k == rkey_to_lkey_.end()) return KeyCheck::BadKey;
    auto it = by_lkey_.find(k->second);
    if (it == by_lkey_.end()) return KeyCheck::BadKey;
    const Region& r = it->second;
    const KeyCheck c = check(&r, pd, r.iova, va, length, access);
    if (c == KeyCheck::Ok) local = r.addr + (va - r.iova);
    return c;
}

}  // namespace uroce::transport
