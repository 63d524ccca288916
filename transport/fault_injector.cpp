#include "transport/fault_injector.h"

#include <charconv>
#include <cmath>

namespace uroce::transport {

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace

std::optional<FaultConfig> parse_fault_config(std::string_view spec, std::string& error) {
    FaultConfig cfg;
    while (!spec.empty()) {
        const size_t comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            error = "expected key=value, got '" + std::string(item) + "'";
            return std::nullopt;
        }
        const std::string_view key = item.substr(0, eq);
        const std::string value(item.substr(eq + 1));
        if (key == "drop") {
            char* end = nullptr;
            const double p = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !std::isfinite(p) || p < 0.0 || p > 1.0) {
                error = "drop must be a probability in [0,1], got '" + value + "'";
                return std::nullopt;
            }
            cfg.drop = p;
        } else if (key == "seed" || key == "until") {
            uint64_t n = 0;
            auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
            if (ec != std::errc{} || ptr != value.data() + value.size() || value.empty()) {
                error = std::string(key) + " must be an unsigned integer, got '" + value + "'";
                return std::nullopt;
            }
            (key == "seed" ? cfg.seed : cfg.until) = n;
        } else {
            error = "unknown fault '" + std::string(key) + "' (known: drop, seed, until)";
            return std::nullopt;
        }
    }
    return cfg;
}

FaultInjector::FaultInjector(const FaultConfig& config) : seed_(config.seed), until_(config.until) {
    if (config.drop >= 1.0)
        threshold_ = UINT64_MAX;
    else if (config.drop > 0.0)
        threshold_ = static_cast<uint64_t>(std::ldexp(config.drop, 64));
}

bool FaultInjector::drop_next() {
    if (threshold_ == 0) return false;
    const uint64_t n = counter_.fetch_add(1, std::memory_order_relaxed);
    if (until_ != 0 && n >= until_) return false;
    return splitmix64(seed_ ^ splitmix64(n)) < threshold_;
}

}  // namespace uroce::transport
