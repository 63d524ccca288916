// Registered memory regions and the key checks that guard every access to them.
//
// A region is named by two 32-bit keys (lkey for local work requests, rkey for remote
// access). Each check verifies that the key names a live region of the right protection
// domain, that the whole byte range lies inside it and that it grants the access asked for.
// Deregistration takes effect at once: a check that starts after deregister() returns
// fails, and deregister() waits for accesses that already passed a check to finish.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>

namespace uroce::transport {

// Access rights, with the meaning of the IBA (and of the verbs IBV_ACCESS_* flags).
enum Access : uint32_t {
    kLocalWrite = 1u << 0,
    kRemoteWrite = 1u << 1,
    kRemoteRead = 1u << 2,
    kRemoteAtomic = 1u << 3,
    kMwBind = 1u << 4,  // memory windows may be bound to the region
};

struct MemoryKeys {
    uint32_t lkey = 0;
    uint32_t rkey = 0;
};

// Unmapped: the key allowed the access, but the pages under it were gone (app_memory_guard.h).
enum class KeyCheck { Ok, BadKey, WrongPd, OutOfBounds, NoAccess, Unmapped };
const char* to_string(KeyCheck c);

class MemoryTable {
  public:
    // Registers [addr, addr+length) of protection domain `pd`, which remote requests
    // address as [iova, iova+length). A key is a 24-bit index and a random low byte (drawn
    // anew at each registration, different for lkey and rkey); an index is not handed out
    // again before 2^24 further registrations, and never while its region is registered.
    // Throws std::invalid_argument if either range runs past 2^64, std::bad_alloc when
    // 2^24 - 1 regions are registered.
    MemoryKeys add(uint32_t pd, uint64_t addr, uint64_t length, uint64_t iova, uint32_t access);
    // Removes the region whatever is bound to it (a closing context frees everything).
    bool remove(uint32_t lkey);
    // ibv_dereg_mr: a region memory windows are bound to stays (IBA 10.6.7.2.6; rxe refuses
    // it too) until they are invalidated, unbound or freed.
    enum class Removal { Removed, NoRegion, WindowsBound };
    Removal deregister(uint32_t lkey);

    // ibv_rereg_mr: what changes in the region of `lkey`; its keys stay. Takes effect as
    // remove() does: checks that start afterwards see the new region, and this waits for
    // accesses that passed a check on the old one.
    struct Change {
        std::optional<uint32_t> pd;
        std::optional<uint32_t> access;
        // New translation: [addr, addr+length), addressed remotely from iova.
        bool translation = false;
        uint64_t addr = 0;
        uint64_t length = 0;
        uint64_t iova = 0;
    };
    // Like deregister(), refused while memory windows are bound to the region: they would
    // keep granting what it may no longer allow (another PD, no local write). Throws
    // std::invalid_argument for a wrapping range.
    enum class Modification { Modified, NoRegion, WindowsBound };
    Modification modify(uint32_t lkey, const Change& change);

    // A guard that keeps the table from changing while the caller touches the memory.
    using ReadLock = std::shared_lock<std::shared_mutex>;
    ReadLock lock_shared() const { return ReadLock(mutex_); }

    // Callers hold lock_shared() across the check and the memory access it allows.
    KeyCheck check_local(uint32_t lkey, uint32_t pd, uint64_t addr, uint64_t length,
                         uint32_t access) const;
    // `va` is in the region's iova space; on success `local` is the address in this process.
    // The rkey may name a memory window: then its range and rights apply, and a type 2
    // window answers only requests arriving on the QP it was bound on (`qpn`).
    KeyCheck check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t length, uint32_t access,
                          uint64_t& local, uint32_t qpn = 0) const;

    // Memory windows (IBA 10.6.7). A window has an rkey from the same key space as regions;
    // it grants nothing until bound.
    uint32_t add_window(uint32_t pd, bool type2);
    bool remove_window(uint32_t rkey);
    struct WindowBind {
        uint32_t mr_lkey = 0;
        uint64_t addr = 0;  // in the region's iova space
        uint64_t length = 0;
        uint32_t access = 0;  // remote rights the window grants
        uint32_t qpn = 0;     // type 2: the QP that bound it
    };
    // Binds the window `rkey` names (its current key) under `new_rkey` (same index, a new
    // key byte): the region must be of `pd`, allow kMwBind, cover the range and allow local
    // write if remote write or atomics are granted. A zero length leaves the window bound to
    // nothing (type 1 invalidation). A type 2 window must be free (not bound) and the length
    // not 0.
    KeyCheck bind_window(uint32_t rkey, uint32_t new_rkey, uint32_t pd, const WindowBind& bind);
    // Local or remote invalidation of a type 2 window: `qpn` must be the QP it was bound on
    // when given (remote invalidation), and it must belong to `pd`.
    KeyCheck invalidate_window(uint32_t rkey, uint32_t pd, uint32_t qpn);
    // QP `qpn` is gone: the type 2 windows bound on it are invalidated (free to be bound
    // again), so that no later QP given the same number reaches them.
    void invalidate_windows_of(uint32_t qpn);

    size_t size() const;

    // Accesses the key checks allowed found the pages gone (app_memory_guard.h): each is
    // counted in `counter` (the engine's app_memory_faults), if set.
    void count_faults_in(std::atomic<uint64_t>* counter) { fault_counter_ = counter; }
    void note_fault() const {
        if (fault_counter_) fault_counter_->fetch_add(1, std::memory_order_relaxed);
    }

  private:
    struct Region {
        uint32_t pd;
        uint64_t addr;
        uint64_t length;
        uint64_t iova;
        uint32_t access;
        MemoryKeys keys;
        // Memory windows: addr/length/access are the bound range (in the region's iova
        // space) and rights; the region is found again through its lkey.
        bool window = false;
        bool type2 = false;
        bool bound = false;
        uint32_t mr_lkey = 0;
        uint32_t qpn = 0;
        // A region: how many windows are bound to it now.
        uint32_t bound_windows = 0;
    };
    // Window `w` (bound) lets go of its region, if that is still registered. Caller holds
    // mutex_ exclusively.
    void release_region(const Region& w);
    uint32_t next_free_index();
    static KeyCheck check(const Region* r, uint32_t pd, uint64_t base, uint64_t addr,
                          uint64_t length, uint32_t access);

    mutable std::shared_mutex mutex_;
    std::unordered_map<uint32_t, Region> by_index_;  // key >> 8 -> region
    size_t bound_type2_ = 0;                         // type 2 windows bound now
    uint32_t next_index_ = 1;
    std::atomic<uint64_t>* fault_counter_ = nullptr;
};

}  // namespace uroce::transport
