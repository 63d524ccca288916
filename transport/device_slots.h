// Context slots of one device, shared by every process that opens it.
//
// Several contexts, in one process or many, use a device at once. Each holds a slot number
// (1..4095) for as long as it lives; the slot is the top 12 bits of every QPN the context
// allocates (the low 12 bits number its QPs, up to the 4096 a context may have), so QPNs are
// unique per device across processes, and the slot alone tells which context's socket a
// packet is for (see qpn_steering.h). Slot 0 is never handed out: QPNs 0 and 1 are the
// IBA's special QPs.
//
// The table is a small file (one per device, the path comes from the caller). Every holder
// keeps an open file description locked (an OFD byte-range lock) on its slot's byte: the
// kernel drops that lock when the holder closes the file or dies, even by kill -9, so a
// slot whose lock is gone is free again without anyone having to clean up, across PID
// namespaces and whatever became of the PID. Claims and releases take a lock on the table
// for a moment; nothing on the data path touches the file.
//
// A released slot rests (a quarantine) before it is handed out again, and the free slot
// released longest ago goes first: packets still in flight for the QPs of a context that
// went away reach no one rather than a newcomer that took its QPNs. With 4095 slots a slot
// comes back only after thousands of other contexts. A dead holder's slot is taken back only
// when no rested slot is left (it rests until then). When every free slot is still resting,
// the one released longest ago is taken all the same: opening a context never fails because
// of the quarantine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace uroce::transport {

class DeviceSlot;

class DeviceSlots {
  public:
    static constexpr unsigned kSlots = 4096;  // slot 0 is reserved
    static constexpr unsigned kQpnBits = 12;  // QPN = slot << kQpnBits | the context's own bits
    static constexpr uint32_t slot_of(uint32_t qpn) { return qpn >> kQpnBits; }
    static constexpr std::chrono::milliseconds kDefaultQuarantine{2000};

    // Claims a free slot in the table at `path` (created if absent, mode 0666 so that
    // every user's processes can share the device). Returns nullptr with `error` and `err`
    // set when the file cannot be used (errno) or every slot is taken (EBUSY).
    static std::unique_ptr<DeviceSlot> claim(
        const std::string& path, std::string& error, int& err,
        std::chrono::milliseconds quarantine = kDefaultQuarantine);
};

// Reads the shared values (DeviceSlot::update_shared_value) of a device's table without
// holding a slot there: another device's (Engine::answer_may_lead_ack asks at every RTR).
// The file is opened at the first read that finds it and kept open, so each later read is
// one pread. Not thread-safe.
class SharedValueReader {
  public:
    explicit SharedValueReader(std::string path) : path_(std::move(path)) {}
    ~SharedValueReader();
    SharedValueReader(SharedValueReader&& other) noexcept
        : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}
    SharedValueReader(const SharedValueReader&) = delete;
    SharedValueReader& operator=(const SharedValueReader&) = delete;
    SharedValueReader& operator=(SharedValueReader&&) = delete;

    // Value `index` now (a moment's answer); nullopt if the table cannot be read (no context
    // opened the device yet) or `index` is out of range.
    std::optional<uint32_t> read(unsigned index);

  private:
    std::string path_;
    int fd_ = -1;
};

// A claimed slot: held until destroyed.
class DeviceSlot {
  public:
    ~DeviceSlot();
    DeviceSlot(const DeviceSlot&) = delete;
    DeviceSlot& operator=(const DeviceSlot&) = delete;

    uint16_t number() const { return number_; }

    // True if no other context (in any process) holds a slot of this device now. A moment's
    // answer: another may claim one right after.
    bool alone() const;

    // Device-wide numbers kept beside the table (0-2: QPN steering's BPF map ids; 3: the
    // contexts reading without GRO, Engine::kSplitReadersValue), kSharedValues of them: `update`
    // gets value `index` (0 if none yet) with the table locked, and what it returns is stored.
    // Returns 0 or an errno (EINVAL for an index out of range).
    static constexpr unsigned kSharedValues = 8;
    int update_shared_value(unsigned index, const std::function<uint32_t(uint32_t)>& update) const;

  private:
    friend class DeviceSlots;
    DeviceSlot(int fd, uint16_t number, int owner_pid)
        : fd_(fd), number_(number), owner_pid_(owner_pid) {}
    int fd_;
    uint16_t number_;
    int owner_pid_;  // a child of fork() shares the lock but must not release the slot
};

}  // namespace uroce::transport
