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

// The payload bytes all the QPs of an engine may keep together.
class EarlyRequestBudget {
  public:
    explicit EarlyRequestBudget(size_t limit) : limit_(limit) {}
    // False (and nothing taken) if `bytes` more would exceed the limit.
    bool take(size_t bytes);
    void give(size_t bytes);
    size_t in_use() const { return used_.load(std::memory_order_relaxed); }
    size_t limit() const { return limit_; }

  private:
    const size_t limit_;
    std::atomic<size_t> used_{0};
};

class EarlyRequests {
  public:
    // PSNs the responder looks ahead: the requester's send window is at most 256 packets
    // (rc_requester.cpp), so a packet further ahead is not one it sent since the gap.
    static constexpr uint32_t kSpan = 256;
    // Bytes a kept packet counts against the budget besides its payload (its headers).
    static constexpr size_t kOverhead = 64;

    explicit EarlyRequests(EarlyRequestBudget& budget) : budget_(budget) {}
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
    bool take(uint32_t psn, StoredRequest& out);
    // Forgets every packet whose PSN lies before `expected` (a READ accepted in sequence
    // moved the expected PSN past PSNs the requester cannot have used for a SEND or WRITE).
    void forget_before(uint32_t expected);
    // Forgets everything and frees the store (an RNR NAK, an error, a reset).
    void clear();
    bool empty() const { return count_ == 0; }
    size_t size() const { return count_; }

  private:
    struct Slot {
        bool used = false;
        uint32_t psn = 0;
        size_t bytes = 0;  // what it counts against the budget
        StoredRequest req;
    };
    void release(Slot& s);

    EarlyRequestBudget& budget_;
    // kSpan slots, indexed by PSN modulo kSpan; allocated at the first keep, freed when the
    // last kept packet is taken, so that a QP without loss costs nothing.
    std::unique_ptr<Slot[]> slots_;
    size_t count_ = 0;
};

}  // namespace uroce::transport
