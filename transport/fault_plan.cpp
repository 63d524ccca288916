#include "transport/fault_plan.h"

#include <memory>

namespace uroce::transport {

std::optional<std::vector<FaultConfig>> parse_fault_plan(std::string_view spec,
                                                         std::string& error) {
    std::vector<FaultConfig> rules;
    size_t number = 0;
    const bool several = spec.find(';') != std::string_view::npos;
    while (!spec.empty()) {
        const size_t semicolon = spec.find(';');
        const std::string_view rule = spec.substr(0, semicolon);
        spec =
            semicolon == std::string_view::npos ? std::string_view{} : spec.substr(semicolon + 1);
        ++number;
        if (rule.find_first_not_of(", ") == std::string_view::npos) continue;
        auto cfg = parse_fault_config(rule, error);
        if (!cfg) {
            if (several) error = "rule " + std::to_string(number) + ": " + error;
            return std::nullopt;
        }
        rules.push_back(*cfg);
    }
    return rules;
}

FaultPlan::FaultPlan(const std::vector<FaultConfig>& rules) {
    for (const FaultConfig& cfg : rules) {
        auto rule = std::make_unique<FaultInjector>(cfg);
        if (!rule->enabled()) continue;  // draws nothing: seeds of the others unchanged
        const bool tx = cfg.direction == FaultDirection::Tx;
        (tx ? tx_ : rx_) = true;
        if (rule->singles_out()) (tx ? tx_alone_ : rx_alone_) = true;
        rules_.push_back(std::move(rule));
    }
}

FaultDecision FaultPlan::next(FaultDirection direction, uint8_t opcode, uint32_t dest_qp) {
    FaultDecision out;
    for (const auto& rule : rules_) {
        if (!rule->matches(direction, opcode, dest_qp)) continue;
        const FaultDecision d = rule->next();
        if (out.fault == Fault::None && d.fault != Fault::None) {
            out.fault = d.fault;
            out.draw = d.draw;
        }
        out.delay_us += d.delay_us;
        out.delayed |= d.delayed;
        out.reordered |= d.reordered;
        out.ce |= d.ce;
    }
    if (out.fault == Fault::Drop) {
        out.delay_us = 0;
        out.delayed = out.reordered = out.ce = false;
    }
    return out;
}

}  // namespace uroce::transport
