// Deliberate packet loss for tests and protocol experiments, configured by UROCE_FAULTS.
//
//   UROCE_FAULTS="drop=0.05,seed=7,until=1000"
//
// Each transmitted packet is dropped with probability `drop`. Decisions come from a
// counter-based generator seeded by `seed`, so the same program with the same seed drops
// the same packets (in the order it sends them). With `until=N` only the first N packets
// are candidates: the rest of the run is loss-free, so a program's teardown (which no
// transport can make loss-proof) is not part of the experiment.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace uroce::transport {

struct FaultConfig {
    double drop = 0.0;
    uint64_t seed = 1;
    uint64_t until = 0;  // packets 0..until-1 may be dropped; 0 = no limit
};

// Parses a UROCE_FAULTS value. Returns nullopt and sets `error` on bad input.
std::optional<FaultConfig> parse_fault_config(std::string_view spec, std::string& error);

class FaultInjector {
  public:
    explicit FaultInjector(const FaultConfig& config);
    bool enabled() const { return threshold_ != 0; }
    // True if the next transmitted packet is to be dropped.
    bool drop_next();

  private:
    uint64_t threshold_ = 0;  // drop when the 64-bit draw is below this
    uint64_t seed_;
    uint64_t until_;
    std::atomic<uint64_t> counter_{0};
};

}  // namespace uroce::transport
