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
        case KeyCheck::Unmapped:
            return "pages of the region no longer mapped";
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
    const uint32_t index = next_free_index();
    const MemoryKeys keys{(index << 8) | lbyte, (index << 8) | rbyte};
    by_index_.emplace(index, Region{pd, addr, length, iova, access, keys});
    return keys;
}

uint32_t MemoryTable::next_free_index() {
    // Keys carry a 24-bit index; after 2^24 registrations it wraps, skipping indices whose
    // region is still registered, so a live key is never handed out twice.
    if (by_index_.size() >= kIndexMask) throw std::bad_alloc();
    uint32_t index;
    do {
        index = next_index_;
        next_index_ = (next_index_ & kIndexMask) == kIndexMask ? 1 : next_index_ + 1;
    } while (by_index_.contains(index));
    return index;
}

uint32_t MemoryTable::add_window(uint32_t pd, bool type2) {
    const auto kbyte = static_cast<uint8_t>(random_u64());
    std::unique_lock lock(mutex_);
    const uint32_t index = next_free_index();
    Region w{pd, 0, 0, 0, 0, MemoryKeys{0, (index << 8) | kbyte}};
    w.window = true;
    w.type2 = type2;
    by_index_.emplace(index, w);
    return w.keys.rkey;
}

bool MemoryTable::remove_window(uint32_t rkey) {
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(rkey >> 8);
    if (it == by_index_.end() || !it->second.window) return false;
    if (it->second.bound) release_region(it->second);
    if (it->second.type2 && it->second.bound) --bound_type2_;
    by_index_.erase(it);
    return true;
}

void MemoryTable::release_region(const Region& w) {
    auto mit = by_index_.find(w.mr_lkey >> 8);
    if (mit == by_index_.end() || mit->second.window || mit->second.keys.lkey != w.mr_lkey) return;
    if (mit->second.bound_windows > 0) --mit->second.bound_windows;
}

KeyCheck MemoryTable::bind_window(uint32_t rkey, uint32_t new_rkey, uint32_t pd,
                                  const WindowBind& bind) {
    std::unique_lock lock(mutex_);
    auto wit = by_index_.find(rkey >> 8);
    if (wit == by_index_.end() || !wit->second.window || (new_rkey >> 8) != (rkey >> 8))
        return KeyCheck::BadKey;
    Region& w = wit->second;
    if (w.keys.rkey != rkey) return KeyCheck::BadKey;
    if (w.pd != pd) return KeyCheck::WrongPd;
    // A type 2 window is bound only from the free state (IBA o10-37.2.30), and only to a
    // range: it is invalidated by LOCAL_INV or SEND with Invalidate, never by a bind of length
    // 0 (o10-37.2.40).
    if (w.type2 && (w.bound || bind.length == 0)) return KeyCheck::NoAccess;
    Region* target = nullptr;  // the region bound to
    if (bind.length > 0) {
        auto mit = by_index_.find(bind.mr_lkey >> 8);
        if (mit == by_index_.end() || mit->second.window || mit->second.keys.lkey != bind.mr_lkey)
            return KeyCheck::BadKey;
        const Region& mr = mit->second;
        target = &mit->second;
        if (mr.pd != pd) return KeyCheck::WrongPd;
        if (bind.addr < mr.iova || bind.length > mr.length ||
            bind.addr - mr.iova > mr.length - bind.length)
            return KeyCheck::OutOfBounds;
        // The IBA: remote write or atomic rights need the region's local write right.
        if (!(mr.access & kMwBind) ||
            ((bind.access & (kRemoteWrite | kRemoteAtomic)) && !(mr.access & kLocalWrite)))
            return KeyCheck::NoAccess;
    }
    w.keys.rkey = new_rkey;
    if (w.bound) release_region(w);  // a type 1 window bound again
    if (w.type2 && w.bound) --bound_type2_;
    w.bound = bind.length > 0;
    if (w.type2 && w.bound) ++bound_type2_;
    if (target) ++target->bound_windows;
    w.mr_lkey = bind.mr_lkey;
    w.addr = bind.addr;
    w.length = bind.length;
    w.access = bind.access & (kRemoteWrite | kRemoteRead | kRemoteAtomic);
    w.qpn = w.type2 ? bind.qpn : 0;
    return KeyCheck::Ok;
}

KeyCheck MemoryTable::invalidate_window(uint32_t rkey, uint32_t pd, uint32_t qpn) {
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(rkey >> 8);
    if (it == by_index_.end() || !it->second.window || it->second.keys.rkey != rkey ||
        !it->second.type2 || !it->second.bound)
        return KeyCheck::BadKey;
    Region& w = it->second;
    if (w.pd != pd) return KeyCheck::WrongPd;
    if (qpn != 0 && w.qpn != qpn) return KeyCheck::NoAccess;
    release_region(w);
    w.bound = false;
    --bound_type2_;
    return KeyCheck::Ok;
}

void MemoryTable::invalidate_windows_of(uint32_t qpn) {
    std::unique_lock lock(mutex_);
    // Most applications bind no type 2 window: no walk over every region for them.
    for (auto it = by_index_.begin(); bound_type2_ > 0 && it != by_index_.end(); ++it) {
        Region& w = it->second;
        if (w.window && w.type2 && w.bound && w.qpn == qpn) {
            release_region(w);
            w.bound = false;
            --bound_type2_;
        }
    }
}

bool MemoryTable::remove(uint32_t lkey) {
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(lkey >> 8);
    if (it == by_index_.end() || it->second.keys.lkey != lkey) return false;
    by_index_.erase(it);
    return true;
}

MemoryTable::Removal MemoryTable::deregister(uint32_t lkey) {
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(lkey >> 8);
    if (it == by_index_.end() || it->second.window || it->second.keys.lkey != lkey)
        return Removal::NoRegion;
    if (it->second.bound_windows > 0) return Removal::WindowsBound;
    by_index_.erase(it);
    return Removal::Removed;
}

MemoryTable::Modification MemoryTable::modify(uint32_t lkey, const Change& change) {
    if (change.translation &&
        (wraps(change.addr, change.length) || wraps(change.iova, change.length)))
        throw std::invalid_argument("memory range wraps around 2^64");
    std::unique_lock lock(mutex_);
    auto it = by_index_.find(lkey >> 8);
    if (it == by_index_.end() || it->second.window || it->second.keys.lkey != lkey)
        return Modification::NoRegion;
    Region& r = it->second;
    if (r.bound_windows > 0) return Modification::WindowsBound;
    if (change.pd) r.pd = *change.pd;
    if (change.access) r.access = *change.access;
    if (change.translation) {
        r.addr = change.addr;
        r.length = change.length;
        r.iova = change.iova;
    }
    return Modification::Modified;
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
    if (it == by_index_.end() || it->second.window || it->second.keys.lkey != lkey)
        return KeyCheck::BadKey;
    return check(&it->second, pd, it->second.addr, addr, length, access);
}

KeyCheck MemoryTable::check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t length,
                                   uint32_t access, uint64_t& local, uint32_t qpn) const {
    auto it = by_index_.find(rkey >> 8);
    if (it == by_index_.end() || it->second.keys.rkey != rkey) return KeyCheck::BadKey;
    if (it->second.window) {
        const Region& w = it->second;
        if (!w.bound) return KeyCheck::BadKey;
        if (w.type2 && w.qpn != qpn) return KeyCheck::NoAccess;
        // The window's own range and rights first, then the region it lies in.
        const KeyCheck c = check(&w, pd, w.addr, va, length, access);
        if (c != KeyCheck::Ok) return c;
        auto mit = by_index_.find(w.mr_lkey >> 8);
        if (mit == by_index_.end() || mit->second.window || mit->second.keys.lkey != w.mr_lkey)
            return KeyCheck::BadKey;  // its region was deregistered
        const Region& mr = mit->second;
        if (va < mr.iova || length > mr.length || va - mr.iova > mr.length - length)
            return KeyCheck::OutOfBounds;  // the region shrank under it (rereg)
        local = mr.addr + (va - mr.iova);
        return KeyCheck::Ok;
    }
    const Region& r = it->second;
    const KeyCheck c = check(&r, pd, r.iova, va, length, access);
    if (c == KeyCheck::Ok) local = r.addr + (va - r.iova);
    return c;
}

}  // namespace uroce::transport
