// One rule of deliberate faults for tests and protocol experiments (UROCE_FAULTS; a list of
// rules is a FaultPlan, fault_plan.h).
//
//   UROCE_FAULTS="drop=0.05,seed=7,until=1000"
//   UROCE_FAULTS="burst=0.01:0.25,corrupt=0.001,duplicate=0.01,seed=3"
//   UROCE_FAULTS="dir=rx,op=ack,delay=200:50,reorder=0.1:300"
//
// A rule sees the packets of its direction (`dir=tx`, the default, or `rx`), optionally only
// those whose BTH names destination QP `qp=QPN` or whose opcode is of a class in
// `op=CLASS[+CLASS...]`. For each packet it sees the rule decides one fault (or none): `drop` loses
// it, `burst=ENTER:LEAVE` loses it while a two-state Gilbert-Elliott channel is in its bad state
// (entered with probability ENTER per packet, left with probability LEAVE: mean burst length
// 1/LEAVE), `outage=ENTER:US` takes the link down for US microseconds (entered with probability
// ENTER per packet while it is up: every packet the rule sees until then is lost, however few
// are sent meanwhile, as in a link's outage), `corrupt` flips one bit of it on the way out (the
// receiver's ICRC check must catch it), `duplicate` sends it twice; independently of that,
// `delay=US[:JITTER]` holds every packet back US microseconds (give or take up to JITTER,
// uniformly: jitter reorders) and `reorder=P[:US]` holds a packet back with probability P for US
// microseconds (200 by default), so that the packets after it overtake it; `ce=P` marks a packet
// Congestion Experienced in its IP header's ECN field, as a congested switch would (on the way out
// it leaves marked; on the way in it is taken as having arrived marked: congestion.h). Decisions
// come from a counter-based generator seeded by `seed`, so the same program with the same seed gets
// the same faults at the same positions of its transmission sequence (an outage starts at the same
// position; which packets it takes depends on when they are sent). With `until=N` only the first N
// packets are candidates: the rest of the run is fault-free, so a program's teardown (which no
// transport can make loss-proof) is not part of the experiment.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/steady_clock.h"

namespace uroce::transport {

// Which way the packets a rule sees travel.
enum class FaultDirection : uint8_t { Tx, Rx };

// Classes of opcodes a rule can be limited to (`op=`), as bits.
enum FaultOpClass : uint32_t {
    kOpSend = 1u << 0,            // SEND First/Middle/Last/Only, with immediate or invalidate
    kOpWrite = 1u << 1,           // RDMA WRITE, all of them
    kOpRead = 1u << 2,            // RDMA READ requests
    kOpReadResponse = 1u << 3,    // RDMA READ responses
    kOpAtomic = 1u << 4,          // compare-and-swap and fetch-and-add requests
    kOpAtomicResponse = 1u << 5,  // atomic acknowledges
    kOpAck = 1u << 6,             // acknowledges (ACKs and NAKs)
    kOpCnp = 1u << 7,             // congestion notification packets
    kOpRequest = kOpSend | kOpWrite | kOpRead | kOpAtomic,
    kOpResponse = kOpReadResponse | kOpAtomicResponse | kOpAck,
};

// The class bit of a BTH opcode (0 for an opcode uroce does not know).
uint32_t fault_op_class(uint8_t opcode);

struct FaultConfig {
    double drop = 0.0;
    uint64_t seed = 1;
    uint64_t until = 0;  // packets 0..until-1 may be faulted; 0 = no limit
    double corrupt = 0.0;
    double duplicate = 0.0;
    double burst_enter = 0.0;   // Gilbert-Elliott: good -> bad, per packet
    double burst_leave = 1.0;   // bad -> good, per packet (every packet is lost while bad)
    double outage_enter = 0.0;  // the link goes down, per packet while it is up
    uint32_t outage_us = 0;     // ... for this long
    uint32_t delay_us = 0;      // every packet held back this long
    uint32_t jitter_us = 0;     // ... give or take up to this much
    double reorder = 0.0;       // probability that a packet is held back reorder_us
    uint32_t reorder_us = 200;
    double ce = 0.0;  // probability that a packet is marked ECN Congestion Experienced
    FaultDirection direction = FaultDirection::Tx;
    std::optional<uint32_t> qpn = std::nullopt;  // only packets for this destination QP
    uint32_t op_classes = 0;  // only packets of these classes (FaultOpClass); 0: all
};

enum class Fault : uint8_t { None, Drop, Corrupt, Duplicate };

struct FaultDecision {
    Fault fault = Fault::None;
    uint64_t draw = 0;       // random bits for the fault's details (which bit to flip)
    uint32_t delay_us = 0;   // hold the packet back this long (delay, jitter and reorder)
    bool delayed = false;    // by `delay`
    bool reordered = false;  // by `reorder`
    bool ce = false;         // marked ECN Congestion Experienced (`ce`)
};

// Parses one rule (no ';'). Returns nullopt and sets `error` on bad input.
std::optional<FaultConfig> parse_fault_config(std::string_view spec, std::string& error);

class FaultInjector {
  public:
    // The clock an outage is timed by, in nanoseconds (tests pass their own; by default the
    // steady clock, steady_clock.h).
    using Clock = int64_t (*)();

    explicit FaultInjector(const FaultConfig& config, Clock clock = &steady_now_ns);
    bool enabled() const {
        return drop_ != 0 || corrupt_ != 0 || duplicate_ != 0 || burst_enter_ != 0 ||
               outage_enter_ != 0 || delay_us_ != 0 || jitter_us_ != 0 || reorder_ != 0 || ce_ != 0;
    }
    // Whether some packet may leave altered or at another time (corrupted, twice, held back
    // or marked CE): such a packet travels alone, outside any GSO train. A rule that only
    // loses packets (`drop`, `burst`, `outage`) never does.
    bool singles_out() const {
        return corrupt_ != 0 || duplicate_ != 0 || delay_us_ != 0 || jitter_us_ != 0 ||
               reorder_ != 0 || ce_ != 0;
    }
    // Whether the rule sees a packet travelling `direction` with this BTH opcode and
    // destination QP.
    bool matches(FaultDirection direction, uint8_t opcode, uint32_t dest_qp) const;
    // The fault for the next packet the rule sees. A burst or outage loss and a drop all come
    // back as Drop (a burst or outage takes precedence, then drop, corrupt, duplicate); the delay
    // comes on top of any of them.
    FaultDecision next();
    bool drop_next() { return next().fault == Fault::Drop; }

    // Flips one bit of a UDP payload (BTH .. ICRC) chosen by `draw`, never in the BTH's
    // reserved byte 4, which the ICRC does not cover.
    static void corrupt(std::span<uint8_t> udp_payload, uint64_t draw);

  private:
    // Thresholds: the fault happens when its 64-bit draw is below.
    uint64_t drop_ = 0, corrupt_ = 0, duplicate_ = 0, burst_enter_ = 0, burst_leave_ = 0;
    uint64_t reorder_ = 0, ce_ = 0, outage_enter_ = 0;
    int64_t outage_ns_ = 0;
    Clock clock_;
    uint32_t delay_us_, jitter_us_, reorder_us_;
    FaultDirection direction_;
    std::optional<uint32_t> qpn_;
    uint32_t op_classes_;
    uint64_t seed_;
    uint64_t until_;
    std::atomic<uint64_t> counter_{0};
    // The burst channel's and the link's state follow the packets in order: kept under a lock.
    std::mutex channel_mutex_;
    uint64_t burst_next_ = 0;  // the packet number the state is for
    bool burst_bad_ = false;
    int64_t down_until_ns_ = 0;  // the outage's end (clock_): up once it has passed
};

}  // namespace uroce::transport
