// Every fault rule of a UROCE_FAULTS value, applied to the packets of one engine.
//
//   UROCE_FAULTS="drop=0.01,seed=3;dir=rx,op=ack,delay=300:100;qp=0x12ab34,corrupt=0.05"
//
// Rules are separated by ';' (one rule: fault_injector.h). Each packet is shown to every
// rule that sees it (its direction, destination QP and opcode class), in order; each of
// those rules draws for it, so a rule's schedule depends only on the packets it sees, never
// on the other rules. The first rule that loses, corrupts or duplicates the packet decides
// that; the delays of all of them add up, and any of them may mark it CE.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/fault_injector.h"

namespace uroce::transport {

// Parses a UROCE_FAULTS value: rules separated by ';'. An empty value is no rule. Returns
// nullopt and sets `error` (naming the rule when there are several) on bad input.
std::optional<std::vector<FaultConfig>> parse_fault_plan(std::string_view spec, std::string& error);

class FaultPlan {
  public:
    explicit FaultPlan(const std::vector<FaultConfig>& rules);
    // Some rule may fault packets travelling `direction`.
    bool enabled(FaultDirection direction) const {
        return direction == FaultDirection::Tx ? tx_ : rx_;
    }
    // Some rule may send a packet travelling `direction` alone (FaultInjector::singles_out).
    bool singles_out(FaultDirection direction) const {
        return direction == FaultDirection::Tx ? tx_alone_ : rx_alone_;
    }
    // The fault for a packet travelling `direction` with this BTH opcode and destination QP.
    FaultDecision next(FaultDirection direction, uint8_t opcode, uint32_t dest_qp);

  private:
    std::vector<std::unique_ptr<FaultInjector>> rules_;  // the mutex inside does not move
    bool tx_ = false, rx_ = false;
    bool tx_alone_ = false, rx_alone_ = false;
};

}  // namespace uroce::transport
