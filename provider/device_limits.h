// What a uroce device advertises, in one place so that the query answers and the checks
// on create and post agree.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "transport/work_request.h"

namespace uroce::provider {

// No vendor id: perftest and others must not mistake uroce for a NIC they special-case.
inline constexpr uint32_t kVendorId = 0;
inline constexpr uint32_t kVendorPartId = 0;
inline constexpr int kMaxQp = 4096;
inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = static_cast<int>(transport::kMaxSge);
inline constexpr uint32_t kMaxInline = transport::kMaxInlineData;
inline constexpr int kMaxCq = 4096;
inline constexpr int kMaxCqe = 65536;
inline constexpr int kMaxMr = 1 << 20;
inline constexpr int kMaxPd = 1 << 16;
inline constexpr int kMaxRdAtomic = 16;
// 1 GiB: even at a 256-byte MTU one message spans less than half the PSN space.
inline constexpr uint32_t kMaxMessage = 1u << 30;

ibv_mtu mtu_enum(uint32_t bytes);
uint32_t mtu_bytes(ibv_mtu mtu);

}  // namespace uroce::provider
