// Counters of a whole device, kept by every context that uses it, in any process.
//
// A device's counters file (one per device, beside the slot table) holds one block of
// counters per slot (device_slots.h), mapped shared by every context: a context counts into
// its slot's block directly, so the data path pays nothing beyond its own increments, and
// reading the device's counters is summing the blocks. Blocks outlive their contexts: what a
// process counted stays in the device's totals after it exits, even by kill -9, as a NIC's
// counters do; a context that takes a slot later counts on from there (its own figures are
// the block minus what it found at start).
//
// The layout is fixed by the counter list (counters.h): a file written by a build with
// another list is not misread. A context that opens it while no other context uses the
// device starts it afresh (an upgraded uroce counts again at once, its totals from zero);
// while another does (perhaps an older build, still counting into it), it is left alone and
// the context counts privately.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/counters.h"

namespace uroce::transport {

// Plain values of every counter, e.g. a snapshot or a sum.
struct CounterValues {
#define UROCE_COUNTER_VALUE(name) uint64_t name = 0;
    UROCE_COUNTERS(UROCE_COUNTER_VALUE)
#undef UROCE_COUNTER_VALUE
};

CounterValues snapshot(const EngineCounters& c);

class DeviceCounters {
  public:
    // Maps the counters file at `path` (created if absent, mode 0666 like the slot table)
    // and returns the block of `slot`. `alone`: no other context uses the device
    // (DeviceSlot::alone), so a file of another layout may start afresh. nullptr with `error`
    // set if the file cannot be used.
    static std::unique_ptr<DeviceCounters> open(const std::string& path, uint16_t slot, bool alone,
                                                std::string& error);
    ~DeviceCounters();
    DeviceCounters(const DeviceCounters&) = delete;
    DeviceCounters& operator=(const DeviceCounters&) = delete;

    EngineCounters& block() { return *block_; }

    // The device's totals: the sum of every slot's block in the file at `path`. False with
    // `error` set if there is no usable file (no context ever opened the device: all zero).
    static bool read_totals(const std::string& path, CounterValues& out, std::string& error);

  private:
    DeviceCounters(void* map, size_t length, EngineCounters* block)
        : map_(map), length_(length), block_(block) {}
    void* map_;
    size_t length_;
    EngineCounters* block_;
};

}  // namespace uroce::transport
