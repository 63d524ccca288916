// Request packets that reached an RC responder ahead of the PSN it expects, kept until the
// gap before them is filled.
//
// IBA's responder drops every request after a missing one and NAKs the first (go-back-N):
// one lost packet costs everything that followed it in flight, which the requester must
// send again. A NIC that places out-of-order data does better, and so does this: the
// responder still answers the first early packet with the sequence NAK, and still executes
// requests strictly in PSN order, but keeps the early ones here. When the missing packet
// arrives, the kept packets that follow it run at once, through every check a packet that
// arrives in order passes (opcode sequence, length, key, range, receive WQE), and the ACK
// names the newest of them. On the wire nothing changes but that ACK: it may acknowledge
// PSNs the requester has not resent since the NAK, as a late ACK after a needless resend
// would. A requester that resends only the missing packet (rc_selective_resend.cpp) loses one
// packet's worth, not a window's.
//
// Only SENDs and WRITEs are kept (a READ or atomic is cheap to ask again, and its answer
// would have to wait anyway), at most kSpan - 1 PSNs ahead, and at most the engine's budget of
// bytes across all its QPs. A second, different packet for a kept PSN (a spoofed one, or
// the genuine one after a spoof) throws both away: the requester's resend decides.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "uroce/wire.h"

namespace uroce::transport {

// A request packet kept after its receive buffer was reused: its headers and a copy of its
// payload.
struct StoredRequest {
    wire::Headers h;
    const wire::OpcodeInfo* info = nullptr;
    std::vector<uint8_t> payload;

    // A parsed view, valid while this StoredRequest lives and is not changed.
    wire::ParsedPacket view() const;
};

class EarlyRequestPool;

// One PSN's place in an EarlyRequests store.
struct KeptSlot {
    bool used = false;
    uint32_t psn = 0;
    size_t bytes = 0;  // what it counts against the pool's budget
    StoredRequest req;
};

class EarlyRequests {
  public:
    // PSNs the responder looks ahead: the requester's send window is at most 256 packets
    // (rc_requester.cpp), so a packet further ahead is not one it sent since the gap.
    static constexpr uint32_t kSpan = 256;
    // Bytes a kept packet counts against the budget besides its payload (its headers).
    static constexpr size_t kOverhead = 64;

    explicit EarlyRequests(EarlyRequestPool& pool) : pool_(pool) {}
    ~EarlyRequests() { clear(); }
    EarlyRequests(const EarlyRequests&) = delete;
    EarlyRequests& operator=(const EarlyRequests&) = delete;

    enum class Kept : uint8_t {
        Yes,
        Already,   // the same packet was kept before: nothing changes
        Conflict,  // a different packet was kept for that PSN: both are gone (also when
                   // the new one is a READ or an atomic, which is never kept)
        NotKind,   // not a SEND or WRITE packet
        TooFar,    // `ahead` outside [1, kSpan)
        NoBudget,  // the engine's budget is spent
    };
    // Keeps `pkt`, whose PSN is `ahead` PSNs after the expected one.
    Kept keep(const wire::ParsedPacket& pkt, uint32_t ahead);
    // Moves the packet kept for `psn` into `out` and forgets it; false if there is none.
    // The buffer `out` held before goes back to the pool.
    bool take(uint32_t psn, StoredRequest& out);
    // Gives the buffer of a request take() filled back to the pool, once it has run.
    void give_back(StoredRequest& taken);
    // Forgets every packet whose PSN lies before `expected` (a READ accepted in sequence
    // moved the expected PSN past PSNs the requester cannot have used for a SEND or WRITE).
    void forget_before(uint32_t expected);
    // Forgets everything and gives the store back (an RNR NAK, an error, a reset).
    void clear();
    bool empty() const { return count_ == 0; }
    size_t size() const { return count_; }

  private:
    void release(KeptSlot& s);

    EarlyRequestPool& pool_;
    // kSpan slots, indexed by PSN modulo kSpan; taken from the pool at the first keep and
    // given back when the last kept packet is taken, so that a QP without loss holds nothing.
    std::unique_ptr<KeptSlot[]> slots_;
    size_t count_ = 0;
};

// What the QPs of an engine share to keep early requests: a budget of payload bytes, and
// spare memory to keep them in.
//
// A loss makes a QP keep what follows it in flight, and the packet that fills the gap frees
// all of it. Allocated for each kept packet and freed after each loss, that memory went back
// to the kernel at the free (glibc trims the top of the engine thread's heap with madvise)
// and was faulted in again, page by page, at the next loss: a quarter of a receiver's CPU
// under 1% loss (docs/performance-log.md). So what a QP frees waits here for the next loss
// of any QP of the engine: payload buffers up to kSpareBytes of capacity (and kSpareBuffers
// of them), slot tables up to kSpareTables; beyond that it is freed. An engine's memory for early
// requests is bounded by the budget plus those spares. Thread-safe (QPs keep and run under their
// own locks); used only when packets are kept, held or run. Requests a responder holds
// behind READ responses (RcQp::held_) take their buffers from here too.
class EarlyRequestPool {
  public:
    // A window of one QP is 1 MiB at most (256 packets of 4 KiB); several QPs lose at once.
    static constexpr size_t kSpareBytes = size_t{4} << 20;
    static constexpr size_t kSpareBuffers = 1024;
    static constexpr size_t kSpareTables = 16;

    explicit EarlyRequestPool(size_t limit) : limit_(limit) {}
    EarlyRequestPool(const EarlyRequestPool&) = delete;
    EarlyRequestPool& operator=(const EarlyRequestPool&) = delete;

    // The budget: false (and nothing taken) if `bytes` more would exceed the limit.
    bool take(size_t bytes);
    void give(size_t bytes);
    size_t in_use() const { return used_.load(std::memory_order_relaxed); }
    size_t limit() const { return limit_; }

    // An empty buffer for a kept payload: a spare one (with the capacity it had) if any.
    std::vector<uint8_t> buffer();
    // Keeps `buffer` for a later buffer() if the spares have room; frees it otherwise.
    void recycle(std::vector<uint8_t> buffer);
    // EarlyRequests::kSpan unused slots: a spare table if any.
    std::unique_ptr<KeptSlot[]> table();
    // Keeps `table` (every slot unused, holding no buffer) for a later table(), or frees it.
    void recycle(std::unique_ptr<KeptSlot[]> table);

    size_t spare_buffers() const;
    size_t spare_bytes() const;
    size_t spare_tables() const;

  private:
    const size_t limit_;
    std::atomic<size_t> used_{0};
    mutable std::mutex mutex_;
    std::vector<std::vector<uint8_t>> buffers_;        // guarded by mutex_
    size_t buffer_bytes_ = 0;                          // their capacities; guarded by mutex_
    std::vector<std::unique_ptr<KeptSlot[]>> tables_;  // guarded by mutex_
};

}  // namespace uroce::transport
