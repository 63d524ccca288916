// What a uroce device advertises, in one place so that the query answers and the checks
// on create and post agree.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "transport/multicast_groups.h"
#include "transport/qpn_space.h"
#include "transport/work_request.h"

namespace uroce::provider {

// The vendor id the kernel's rxe reports (no IEEE OUI: no NIC that perftest and others
// special-case), and a part id of our own ("UR"), so that tools see a non-zero pair.
inline constexpr uint32_t kVendorId = 0xffffff;
inline constexpr uint32_t kVendorPartId = 0x5552;
// Objects of each kind one context may hold at once; creating one more fails with EINVAL,
// as rxe's object pools do.
// QPs: sixteen device slots' worth of numbers, QpnSpace::kMaxNumbers (transport/qpn_space.h).
inline constexpr int kMaxQp = static_cast<int>(transport::QpnSpace::kMaxNumbers);
inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = static_cast<int>(transport::kMaxSge);
inline constexpr uint32_t kMaxInline = transport::kMaxInlineData;
inline constexpr int kMaxCq = 4096;
inline constexpr int kMaxCqe = 65536;
inline constexpr int kMaxMr = 1 << 20;
inline constexpr int kMaxPd = 1 << 16;
inline constexpr int kMaxSrq = 4096;
inline constexpr int kMaxAh = 1 << 16;
inline constexpr int kMaxMw = 1 << 16;
inline constexpr int kMaxXrcd = 1 << 16;
// Multicast groups per context and QPs per group (transport/multicast_groups.h).
inline constexpr int kMaxMcastGroups = static_cast<int>(transport::MulticastGroups::kMaxGroups);
inline constexpr int kMaxMcastQpAttach =
    static_cast<int>(transport::MulticastGroups::kMaxQpsPerGroup);
// WQEs per SRQ: UCX asks for 4095 and more; rxe allows 16384 too.
inline constexpr int kMaxSrqWr = 16384;
// What rxe advertises for max_qp_rd_atom and max_qp_init_rd_atom: perftest sets the value
// the peer advertised, so anything smaller makes ib_read_bw against rxe fail.
inline constexpr int kMaxRdAtomic = 128;
// Largest region ibv_reg_mr accepts: 1 TiB, far above any real buffer, far below lengths
// whose arithmetic could wrap (a user address space is 2^47 bytes on x86-64).
inline constexpr uint64_t kMaxMrSize = 1ull << 40;
inline constexpr int kNumCompVectors = 1;
// 1 GiB: even at a 256-byte MTU one message spans less than half the PSN space.
inline constexpr uint32_t kMaxMessage = 1u << 30;

ibv_mtu mtu_enum(uint32_t bytes);
uint32_t mtu_bytes(ibv_mtu mtu);

}  // namespace uroce::provider
