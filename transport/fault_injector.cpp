#include "transport/fault_injector.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "uroce/wire.h"

namespace uroce::transport {

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// An independent stream of draws per kind of fault, all from one seed.
enum Stream : uint64_t {
    kCorruptStream = 1,
    kBitStream,
    kDuplicateStream,
    kBurstStream,
    kJitterStream,
    kReorderStream,
    kCeStream,
    kOutageStream,
};

// An outage models a link that is down for a while: at most ten seconds.
constexpr uint64_t kMaxOutageUs = 10'000'000;

// Delays are for experiments on a host, not for storing packets: at most a second.
constexpr uint32_t kMaxDelayUs = 1'000'000;

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

// Decimal, or with `hex_ok` also 0x hex (QPNs, as perftest prints them).
bool parse_unsigned(std::string_view key, std::string_view value, uint64_t& out, std::string& error,
                    uint64_t max = UINT64_MAX, bool hex_ok = false) {
    int base = 10;
    std::string_view digits = value;
    if (hex_ok && digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
        base = 16;
        digits.remove_prefix(2);
    }
    uint64_t n = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n, base);
    if (ec != std::errc{} || ptr != digits.data() + digits.size() || digits.empty() || n > max) {
        error = std::string(key) + " must be an unsigned integer" +
                (max != UINT64_MAX ? " up to " + std::to_string(max) : std::string()) + ", got '" +
                std::string(value) + "'";
        return false;
    }
    out = n;
    return true;
}

// "A" or "A:B", each part a number of microseconds up to kMaxDelayUs.
bool parse_delay(std::string_view key, const std::string& value, uint32_t& first, uint32_t* second,
                 std::string& error) {
    const size_t colon = value.find(':');
    uint64_t a = 0, b = 0;
    if (!parse_unsigned(key, std::string_view(value).substr(0, colon), a, error, kMaxDelayUs))
        return false;
    if (colon != std::string::npos) {
        if (!second) {
            error = std::string(key) + " takes one value, got '" + value + "'";
            return false;
        }
        if (!parse_unsigned(key, std::string_view(value).substr(colon + 1), b, error, kMaxDelayUs))
            return false;
        *second = static_cast<uint32_t>(b);
    }
    first = static_cast<uint32_t>(a);
    return true;
}

struct OpClassName {
    std::string_view name;
    uint32_t bits;
};
constexpr OpClassName kOpClassNames[] = {
    {"send", kOpSend},       {"write", kOpWrite},
    {"read", kOpRead},       {"read-response", kOpReadResponse},
    {"atomic", kOpAtomic},   {"atomic-response", kOpAtomicResponse},
    {"ack", kOpAck},         {"cnp", kOpCnp},
    {"request", kOpRequest}, {"response", kOpResponse},
};

bool parse_op_classes(const std::string& value, uint32_t& out, std::string& error) {
    uint32_t bits = 0;
    std::string_view rest = value;
    for (bool more = true; more;) {
        const size_t plus = rest.find('+');
        const std::string_view name = rest.substr(0, plus);
        more = plus != std::string_view::npos;
        rest = more ? rest.substr(plus + 1) : std::string_view{};
        const auto* it = std::find_if(std::begin(kOpClassNames), std::end(kOpClassNames),
                                      [&](const OpClassName& c) { return c.name == name; });
        if (it == std::end(kOpClassNames)) {
            error = "unknown opcode class '" + std::string(name) +
                    "' in op= (known: send, write, read, read-response, atomic, "
                    "atomic-response, ack, cnp, request, response; join them with +)";
            return false;
        }
        bits |= it->bits;
    }
    out = bits;
    return true;
}

}  // namespace

uint32_t fault_op_class(uint8_t opcode) {
    const wire::OpcodeInfo* info = wire::opcode_info(opcode);
    if (!info) return 0;
    const uint16_t f = info->flags;
    if (f & wire::kCnp) return kOpCnp;
    if (f & wire::kSend) return kOpSend;
    if (f & wire::kWrite) return kOpWrite;
    if (f & wire::kRead) return f & wire::kRequest ? kOpRead : kOpReadResponse;
    if (f & wire::kAtomic) return f & wire::kRequest ? kOpAtomic : kOpAtomicResponse;
    if (f & wire::kAtomicWrite) return kOpAtomic;
    if (f & wire::kAck) return kOpAck;
    return 0;
}

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
        if (key == "drop" || key == "corrupt" || key == "duplicate" || key == "ce") {
            double& p = key == "drop"      ? cfg.drop
                        : key == "corrupt" ? cfg.corrupt
                        : key == "ce"      ? cfg.ce
                                           : cfg.duplicate;
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
        } else if (key == "outage") {
            const size_t colon = value.find(':');
            uint64_t us = 0;
            if (colon == std::string::npos) {
                error =
                    "outage must be ENTER:US (a probability and microseconds), got '" + value + "'";
                return std::nullopt;
            }
            if (!parse_probability("outage ENTER", value.substr(0, colon), cfg.outage_enter,
                                   error) ||
                !parse_unsigned("outage US", std::string_view(value).substr(colon + 1), us, error,
                                kMaxOutageUs))
                return std::nullopt;
            if (us == 0) {
                error = "outage US must be at least 1 microsecond, got '" + value + "'";
                return std::nullopt;
            }
            cfg.outage_us = static_cast<uint32_t>(us);
        } else if (key == "seed" || key == "until") {
            if (!parse_unsigned(key, value, key == "seed" ? cfg.seed : cfg.until, error))
                return std::nullopt;
        } else if (key == "delay") {
            if (!parse_delay(key, value, cfg.delay_us, &cfg.jitter_us, error)) return std::nullopt;
        } else if (key == "reorder") {
            const size_t colon = value.find(':');
            if (!parse_probability(key, value.substr(0, colon), cfg.reorder, error))
                return std::nullopt;
            if (colon != std::string::npos &&
                !parse_delay("reorder's hold time", value.substr(colon + 1), cfg.reorder_us,
                             nullptr, error))
                return std::nullopt;
        } else if (key == "dir") {
            if (value != "tx" && value != "rx") {
                error = "dir must be tx or rx, got '" + value + "'";
                return std::nullopt;
            }
            cfg.direction = value == "tx" ? FaultDirection::Tx : FaultDirection::Rx;
        } else if (key == "qp") {
            uint64_t n = 0;
            if (!parse_unsigned(key, value, n, error, wire::kQpnMask, /*hex_ok=*/true))
                return std::nullopt;
            cfg.qpn = static_cast<uint32_t>(n);
        } else if (key == "op") {
            if (!parse_op_classes(value, cfg.op_classes, error)) return std::nullopt;
        } else {
            error = "unknown fault '" + std::string(key) +
                    "' (known: drop, burst, outage, corrupt, duplicate, delay, reorder, ce, dir, "
                    "qp, op, seed, until)";
            return std::nullopt;
        }
    }
    return cfg;
}

FaultInjector::FaultInjector(const FaultConfig& config, Clock clock)
    : drop_(threshold(config.drop)),
      corrupt_(threshold(config.corrupt)),
      duplicate_(threshold(config.duplicate)),
      burst_enter_(threshold(config.burst_enter)),
      burst_leave_(threshold(config.burst_leave)),
      reorder_(threshold(config.reorder)),
      ce_(threshold(config.ce)),
      outage_enter_(config.outage_us != 0 ? threshold(config.outage_enter) : 0),
      outage_ns_(int64_t{config.outage_us} * 1000),
      clock_(clock),
      delay_us_(config.delay_us),
      jitter_us_(config.jitter_us),
      reorder_us_(config.reorder_us),
      direction_(config.direction),
      qpn_(config.qpn),
      op_classes_(config.op_classes),
      seed_(config.seed),
      until_(config.until) {}

bool FaultInjector::matches(FaultDirection direction, uint8_t opcode, uint32_t dest_qp) const {
    return direction == direction_ && (!qpn_ || *qpn_ == dest_qp) &&
           (op_classes_ == 0 || (fault_op_class(opcode) & op_classes_) != 0);
}

FaultDecision FaultInjector::next() {
    if (!enabled()) return {};
    auto draw = [this](uint64_t n, uint64_t stream) {
        return splitmix64((seed_ + stream * 0x9e3779b97f4a7c15ull) ^ splitmix64(n));
    };
    uint64_t n = 0;
    bool channel_lost = false;  // to a burst or an outage
    if (burst_enter_ != 0 || outage_enter_ != 0) {
        // Packet numbers are handed out under the lock, so the channel steps through them in
        // order even when several threads send.
        std::lock_guard lock(channel_mutex_);
        n = counter_.fetch_add(1, std::memory_order_relaxed);
        if (until_ == 0 || n < until_) {
            if (burst_enter_ != 0) {
                const uint64_t d = draw(n, kBurstStream);
                burst_bad_ = burst_bad_ ? d >= burst_leave_ : d < burst_enter_;
                channel_lost = burst_bad_;
            }
            if (outage_enter_ != 0) {
                const int64_t now = clock_();
                if (now < down_until_ns_) {
                    channel_lost = true;
                } else if (draw(n, kOutageStream) < outage_enter_) {
                    down_until_ns_ = now + outage_ns_;
                    channel_lost = true;
                }
            }
        }
    } else {
        n = counter_.fetch_add(1, std::memory_order_relaxed);
    }
    if (until_ != 0 && n >= until_) return {};
    FaultDecision d;
    if (channel_lost) {
        d.fault = Fault::Drop;
    } else if (drop_ != 0 && splitmix64(seed_ ^ splitmix64(n)) < drop_) {
        // drop's stream is the one before the other faults existed: seeds keep their meaning.
        d.fault = Fault::Drop;
    } else if (corrupt_ != 0 && draw(n, kCorruptStream) < corrupt_) {
        d = {Fault::Corrupt, draw(n, kBitStream)};
    } else if (duplicate_ != 0 && draw(n, kDuplicateStream) < duplicate_) {
        d.fault = Fault::Duplicate;
    }
    if (d.fault == Fault::Drop) return d;  // nothing left to hold back
    if (delay_us_ != 0 || jitter_us_ != 0) {
        int64_t us = delay_us_;
        if (jitter_us_ != 0) {
            const uint64_t span = 2 * uint64_t{jitter_us_} + 1;
            us += static_cast<int64_t>(draw(n, kJitterStream) % span) - jitter_us_;
        }
        d.delay_us = static_cast<uint32_t>(std::max<int64_t>(us, 0));
        d.delayed = d.delay_us != 0;
    }
    if (reorder_ != 0 && draw(n, kReorderStream) < reorder_) {
        d.delay_us += reorder_us_;
        d.reordered = true;
    }
    d.ce = ce_ != 0 && draw(n, kCeStream) < ce_;
    return d;
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
