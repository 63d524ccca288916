// Deliberate faults for tests and protocol experiments, configured by UROCE_FAULTS.
//
//   UROCE_FAULTS="drop=0.05,seed=7,until=1000"
//   UROCE_FAULTS="burst=0.01:0.25,corrupt=0.001,duplicate=0.01,seed=3"
//
// For each transmitted packet the injector decides one fault (or none): `drop` loses it,
// `burst=ENTER:LEAVE` loses it while a two-state Gilbert-Elliott channel is in its bad state
// (entered with probability ENTER per packet, left with probability LEAVE: mean burst length
// 1/LEAVE), `corrupt` flips one bit of it on the way out (the receiver's ICRC check must catch
// it), `duplicate` sends it twice. Decisions come from a counter-based generator seeded by
// `seed`, so the same program with the same seed gets the same faults at the same positions
// of its transmission sequence. With `until=N` only the first N packets are candidates: the
// rest of the run is fault-free, so a program's teardown (which no transport can make
// loss-proof) is not part of the experiment.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace uroce::transport {

struct FaultConfig {
    double drop = 0.0;
    uint64_t seed = 1;
    uint64_t until = 0;  // packets 0..until-1 may be faulted; 0 = no limit
    double corrupt = 0.0;
    double duplicate = 0.0;
    double burst_enter = 0.0;  // Gilbert-Elliott: good -> bad, per packet
    double burst_leave = 1.0;  // bad -> good, per packet (every packet is lost while bad)
};

enum class Fault : uint8_t { None, Drop, Corrupt, Duplicate };

struct FaultDecision {
    Fault fault = Fault::None;
    uint64_t draw = 0;  // random bits for the fault's details (which bit to flip)
};

// Parses a UROCE_FAULTS value. Returns nullopt and sets `error` on bad input.
std::optional<FaultConfig> parse_fault_config(std::string_view spec, std::string& error);

class FaultInjector {
  public:
    explicit FaultInjector(const FaultConfig& config);
    bool enabled() const {
        return drop_ != 0 || corrupt_ != 0 || duplicate_ != 0 || burst_enter_ != 0;
    }
    // The fault for the next transmitted packet. A burst loss and a drop both come back as
    // Drop (a burst takes precedence, then drop, corrupt, duplicate).
    FaultDecision next();
    bool drop_next() { return next().fault == Fault::Drop; }

    // Flips one bit of a UDP payload (BTH .. ICRC) chosen by `draw`, never in the BTH's
    // reserved byte 4, which the ICRC does not cover.
    static void corrupt(std::span<uint8_t> udp_payload, uint64_t draw);

  private:
    // Thresholds: the fault happens when its 64-bit draw is below.
    uint64_t drop_ = 0, corrupt_ = 0, duplicate_ = 0, burst_enter_ = 0, burst_leave_ = 0;
    uint64_t seed_;
    uint64_t until_;
    std::atomic<uint64_t> counter_{0};
    // The burst channel's state follows the packets in order: kept under a lock.
    std::mutex burst_mutex_;
    uint64_t burst_next_ = 0;  // the packet number the state is for
    bool burst_bad_ = false;
};

}  // namespace uroce::transport
