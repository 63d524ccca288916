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

// An independent stream of draws per kind of fault, all from one seed.
enum Stream : uint64_t { kCorruptStream = 1, kBitStream, kDuplicateStream, kBurstStream };

// A probability as a threshold for a 64-bit draw.
uint64_t threshold(double p) {
    if (p >= 1.0) return UINT64_MAX;
    if (p > 0.0) return static_cast<uint64_t>(std::ldexp(p, 64));
    return 0;
}

bool parse_probability(std::string_view key, const std::string& value, double& out,
                       std::string& error, bool zero_ok = true) {
    char* end = nullptr;
    const double p = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !std::isfinite(p) || p < 0.0 || p > 1.0 ||
        (!zero_ok && p == 0.0)) {
        error = std::string(key) + " must be a probability in " + (zero_ok ? "[0,1]" : "(0,1]") +
                ", got '" + value + "'";
        return false;
    }
    out = p;
    return true;
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
        if (key == "drop" || key == "corrupt" || key == "duplicate") {
            double& p = key == "drop" ? cfg.drop : key == "corrupt" ? cfg.corrupt : cfg.duplicate;
            if (!parse_probability(key, value, p, error)) return std::nullopt;
        } else if (key == "burst") {
            const size_t colon = value.find(':');
            if (colon == std::string::npos) {
                error = "burst must be ENTER:LEAVE (two probabilities), got '" + value + "'";
                return std::nullopt;
            }
            if (!parse_probability("burst ENTER", value.substr(0, colon), cfg.burst_enter, error) ||
                !parse_probability("burst LEAVE", value.substr(colon + 1), cfg.burst_leave, error,
                                   /*zero_ok=*/false))
                return std::nullopt;
        } else if (key == "seed" || key == "until") {
            uint64_t n = 0;
            auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
            if (ec != std::errc{} || ptr != value.data() + value.size() || value.empty()) {
                error = std::string(key) + " must be an unsigned integer, got '" + value + "'";
                return std::nullopt;
            }
            (key == "seed" ? cfg.seed : cfg.until) = n;
        } else {
            error = "unknown fault '" + std::string(key) +
                    "' (known: drop, burst, corrupt, duplicate, seed, until)";
            return std::nullopt;
        }
    }
    return cfg;
}

FaultInjector::FaultInjector(const FaultConfig& config)
    : drop_(threshold(config.drop)),
      corrupt_(threshold(config.corrupt)),
      duplicate_(threshold(config.duplicate)),
      burst_enter_(threshold(config.burst_enter)),
      burst_leave_(threshold(config.burst_leave)),
      seed_(config.seed),
      until_(config.until) {}

FaultDecision FaultInjector::next() {
    if (!enabled()) return {};
    auto draw = [this](uint64_t n, uint64_t stream) {
        return splitmix64((seed_ + stream * 0x9e3779b97f4a7c15ull) ^ splitmix64(n));
    };
    uint64_t n = 0;
    bool burst_lost = false;
    if (burst_enter_ != 0) {
        // Packet numbers are handed out under the lock, so the channel steps through them in
        // order even when several threads send.
        std::lock_guard lock(burst_mutex_);
        n = counter_.fetch_add(1, std::memory_order_relaxed);
        if (until_ == 0 || n < until_) {
            const uint64_t d = draw(n, kBurstStream);
            burst_bad_ = burst_bad_ ? d >= burst_leave_ : d < burst_enter_;
            burst_lost = burst_bad_;
        }
    } else {
        n = counter_.fetch_add(1, std::memory_order_relaxed);
    }
    if (until_ != 0 && n >= until_) return {};
    if (burst_lost) return {Fault::Drop, 0};
    // drop's stream is the one before the other faults existed: seeds keep their meaning.
    if (drop_ != 0 && splitmix64(seed_ ^ splitmix64(n)) < drop_) return {Fault::Drop, 0};
    if (corrupt_ != 0 && draw(n, kCorruptStream) < corrupt_)
        return {Fault::Corrupt, draw(n, kBitStream)};
    if (duplicate_ != 0 && draw(n, kDuplicateStream) < duplicate_) return {Fault::Duplicate, 0};
    return {};
}

void FaultInjector::corrupt(std::span<uint8_t> udp_payload, uint64_t draw) {
    constexpr size_t kMasked = 4;  // the BTH's reserved byte: outside the ICRC
    if (udp_payload.size() <= kMasked) return;
    const uint64_t bits = (udp_payload.size() - 1) * 8;
    const uint64_t k = draw % bits;
    size_t byte = static_cast<size_t>(k / 8);
    if (byte >= kMasked) ++byte;
    udp_payload[byte] ^= static_cast<uint8_t>(1u << (k % 8));
}

}  // namespace uroce::transport
