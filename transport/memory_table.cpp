#include "transport/memory_table.h"

#include <cstdint>
#include <new>
#include <stdexcept>

#include "transport/random_source.h"

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

namespace {

constexpr uint32_t kIndexMask = 0xffffff;

// True if [start, start+length) runs past 2^64 (it may end exactly there).
bool wraps(uint64_t start, uint64_t length) {
    return length > 0 && length - 1 > UINT64_MAX - start;
}

}  // namespace

MemoryKeys MemoryTable::add(uint32_t pd, uint64_t addr, uint64_t length, uint64_t iova,
                            uint32_t access) {
    // Every later check computes addr + (va - iova) with va - iova < length: neither range
    // may wrap, or a remote access could land anywhere in the process.
    if (wraps(addr, length) || wraps(iova, length))
        throw std::invalid_argument("memory range wraps around 2^64");
    // Random key bytes, so that a blind attacker cannot derive a key from the order of
    // registration; lkey and rkey differ so that one cannot stand in for the other.
    const uint64_t r = random_u64();
    const auto lbyte = static_cast<uint8_t>(r);
    auto rbyte = static_cast<uint8_t>(r >> 8);
    if (rbyte == lbyte) rbyte = static_cast<uint8_t>(lbyte ^ (1u + ((r >> 16) % 255)));
    std::unique_lock lock(mutex_);
    // Keys carry a 24-bit index; after 2^24 registrations it wraps, skipping indices whose
    // region is still registered, so a live key is never handed out twice.
    if (by_index_.size() >= kIndexMask) throw std::bad_alloc();
    uint32_t index;
    do {
        index = next_index_;
        next_index_ = (next_index_ & kIndexMask) == kIndexMask ? 1 : next_index_ + 1;
    } while (by_index_.contains(index));
    const MemoryKeys keys{(index << 8) | lbyte, (index << 8) | rbyte};
    by_index_.emplace(index, Region{pd, addr, length, iova, access, keys});
    return keys;
}

bool MemoryTable::remove(uint32_t lkey) {
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(lkey >> 8);
    if (it == by_index_.end() || it->second.keys.lkey != lkey) return false;
    by_index_.erase(it);
    return true;
}

bool MemoryTable::modify(uint32_t lkey, const Change& change) {
    if (change.translation &&
        (wraps(change.addr, change.length) || wraps(change.iova, change.length)))
        throw std::invalid_argument("memory range wraps around 2^64");
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(lkey >> 8);
    if (it == by_index_.end() || it->second.keys.lkey != lkey) return false;
    Region& r = it->second;
    if (change.pd) r.pd = *change.pd;
    if (change.access) r.access = *change.access;
    if (change.translation) {
        r.addr = change.addr;
        r.length = change.length;
        r.iova = change.iova;
    }
    return true;
}

size_t MemoryTable::size() const {
    std::shared_lock lock(mutex_);
    return by_index_.size();
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
    auto it = by_index_.find(lkey >> 8);
    if (it == by_index_.end() || it->second.keys.lkey != lkey) return KeyCheck::BadKey;
    return check(&it->second, pd, it->second.addr, addr, length, access);
}

KeyCheck MemoryTable::check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t length,
                                   uint32_t access, uint64_t& local) const {
    auto it = by_index_.find(rkey >> 8);
    if (it == by_index_.end() || it->second.keys.rkey != rkey) return KeyCheck::BadKey;
    const Region& r = it->second;
    const KeyCheck c = check(&r, pd, r.iova, va, length, access);
    if (c == KeyCheck::Ok) local = r.addr + (va - r.iova);
    return c;
}

}  // namespace uroce::transport
