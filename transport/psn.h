// 24-bit packet sequence number arithmetic (IBA 9.7.1): PSNs wrap at 2^24 and two PSNs
// are compared by their signed distance, which is valid while they are less than 2^23 apart.
#pragma once

#include <cstdint>

namespace uroce::transport {

inline constexpr uint32_t kPsnModulus = 1u << 24;
inline constexpr uint32_t kPsnMask = kPsnModulus - 1;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) {
    return (psn + n) & kPsnMask;
}

// a - b as a signed distance in [-2^23, 2^23).
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
    return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}

constexpr bool psn_before(uint32_t a, uint32_t b) {
    return psn_diff(a, b) < 0;
}
constexpr bool psn_after(uint32_t a, uint32_t b) {
    return psn_diff(a, b) > 0;
}

static_assert(psn_diff(0, kPsnMask) == 1);
static_assert(psn_diff(kPsnMask, 0) == -1);
static_assert(psn_add(kPsnMask, 2) == 1);

}  // namespace uroce::transport
