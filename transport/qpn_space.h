// The numbers one context hands out to its QPs and XRC SRQs, and where each QP counts.
//
// A context's numbers come from its device slots (device_slots.h): QPN = slot << 12 | index,
// 4096 numbers per slot. The context claims one slot when it opens; when every number of its
// slots is taken it claims one more, so one context can hold kMaxNumbers (16 × 4096) QPs
// (more than 4096 is what MPI and UCX at scale, and the 10,000-QP benchmark, ask for). Slot
// 4095 has one number less (its last is the multicast QPN): a context that drew it among its
// sixteen claims a seventeenth for the last number, so the device's max_qp holds whichever
// slots the context got.
// Each further slot is routed to the context's socket (QpnSteering::route) before any number
// of it is handed out, and gets its own QP counter table, so `uroce stats` finds every QP's
// counters by its QPN alone. Slots are held until the context ends: a slot given back while
// its numbers may still be on the wire would hand them to the next context.
//
// Without a slot table (an engine alone, as in unit tests) numbers are drawn from the whole
// 24-bit space and counters are kept privately.
//
// Numbers are drawn at random within a slot, so that a blind attacker cannot guess them: a
// slot's numbers go out in a shuffled order. A number given back goes behind every other free
// number of the context, and the one given back longest ago goes first (IBA: no stale packet
// for a dead QP may reach a new one; NICs and rxe also hand numbers out round-robin): a
// context that creates and destroys QPs gets a number back only after all its other free
// ones (thousands) went out, not at once, while a context with every number taken still gets
// the last one free.
// Callers serialise allocate() and release() (the engine's table lock); counters() may be
// called concurrently with them.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "transport/device_slots.h"
#include "transport/qp_counters.h"

namespace uroce::transport {

class QpnSpace {
  public:
    static constexpr uint32_t kPerSlot = 1u << DeviceSlots::kQpnBits;
    // The most QPs (or XRC SRQs) one context may hold: sixteen slots' worth.
    static constexpr uint32_t kMaxNumbers = 16 * kPerSlot;
    // The most slots a context holds: one more than kMaxNumbers takes when one of them is the
    // short slot 4095.
    static constexpr unsigned kMaxSlots = kMaxNumbers / kPerSlot + 1;

    enum class Kind { Qp, XrcSrq };  // two separate number spaces over the same slots

    struct Hooks {
        // Claims one more device slot; nullptr with `error` and `err` set when none can be
        // had.
        std::function<std::unique_ptr<DeviceSlot>(std::string& error, int& err)> claim_slot;
        // Makes packets for the QPNs of slot `number` reach this context. 0 or an errno.
        std::function<int(uint16_t number)> route_slot;
        // The counter table for the QPs of slot `number` (0: the engine has no slot).
        std::function<std::unique_ptr<QpCounterTable>(uint16_t number)> counter_table;
    };

    // `primary` (may be null: no slot table) is the slot the context opened with; it is
    // already routed.
    QpnSpace(std::unique_ptr<DeviceSlot> primary, Hooks hooks);
    ~QpnSpace();
    QpnSpace(const QpnSpace&) = delete;
    QpnSpace& operator=(const QpnSpace&) = delete;

    // A free number of `kind`, none for which `taken` is true (and never 0, 1 or the
    // multicast QPN 0xFFFFFF). Claims and routes a further slot when the held ones are full.
    // Throws std::bad_alloc when no number can be had: kMaxNumbers of `kind` are out, or no
    // further slot can be claimed or routed.
    uint32_t allocate(Kind kind, const std::function<bool(uint32_t)>& taken);
    // `number` of `kind` (handed out by allocate()) is free again.
    void release(Kind kind, uint32_t number);

    // The counters of QP `qpn`: its slot's table (the first table for numbers of no slot).
    QpCounters& counters(uint32_t qpn);

    // The slot the context opened with (CM comm IDs and the device counters' block are its);
    // 0 without a slot table.
    uint16_t primary_number() const { return slots_[0].number; }
    // The slot the context opened with; null without a slot table.
    const DeviceSlot* primary_slot() const { return slots_[0].slot.get(); }
    // Whether `number` is one of the context's slots.
    bool holds(uint16_t number) const { return index_of(number) >= 0; }
    // How many slots the context holds now.
    unsigned slots_held() const { return slot_count_.load(std::memory_order_acquire); }

  private:
    // The free numbers (low 12 bits) of one slot and Kind in the order they go out: those
    // never handed out first, shuffled, then those given back, in the order they came back.
    struct FreeOrder {
        std::unique_ptr<uint16_t[]> low;    // a ring of kPerSlot entries
        std::unique_ptr<uint64_t[]> stamp;  // when each came back: 0 never handed out
        uint32_t head = 0;
        uint32_t count = 0;
        // Every number of `slot` but the multicast QPN, in a random order.
        void fill(uint16_t slot);
        uint16_t pop();
        void push(uint16_t number, uint64_t when);
        uint64_t front_stamp() const { return stamp[head]; }
    };
    struct Held {
        std::unique_ptr<DeviceSlot> slot;  // null for the no-slot engine's single entry
        std::unique_ptr<QpCounterTable> counters;
        uint16_t number = 0;
        uint32_t used[2] = {0, 0};  // numbers handed out, per Kind
        FreeOrder free[2];          // per Kind, filled at its first allocation from the slot
    };
    // Index into slots_ of slot `number`, or -1.
    int index_of(uint16_t number) const;
    // Claims, routes and adds one more slot; false with nothing changed if it cannot.
    bool add_slot();
    uint32_t draw_unslotted(const std::function<bool(uint32_t)>& taken);

    Hooks hooks_;
    const bool slotted_;
    std::array<Held, kMaxSlots> slots_;
    // Entries [0, slot_count_) are complete: counters() reads them without the callers' lock.
    std::atomic<unsigned> slot_count_{0};
    uint32_t used_[2] = {0, 0};  // numbers handed out, per Kind, over every slot
    uint64_t released_ = 0;      // numbers given back so far: the stamp of the next
};

}  // namespace uroce::transport
