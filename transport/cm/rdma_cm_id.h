// What RdmaCm keeps per identifier (private to rdma_cm*.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/cm/port_table.h"
#include "transport/cm/rdma_cm.h"

namespace uroce::transport::cm {

// The path values the kernel's RDMA CM uses for RoCE: hop limit 64, packet life time 18
// (4.096 us * 2^18), and a local ACK timeout one above it.
inline constexpr uint8_t kHopLimit = 64;
inline constexpr uint8_t kPacketLifeTime = 18;
inline constexpr uint8_t kLocalAckTimeout = kPacketLifeTime + 1;
// The kernel's CMA_CM_RESPONSE_TIMEOUT, written into REQs, and the REP's target ACK delay.
inline constexpr uint8_t kCmResponseTimeout = 20;
inline constexpr uint8_t kTargetAckDelay = 15;

// ::ffff:a.b.c.d, the RoCE v2 GID of an IPv4 address.
Gid roce_gid_of(uint32_t ip);
// IBV_MTU_* of a byte count (256..4096; anything else counts as 1024).
uint8_t mtu_enum_of(uint32_t bytes);

enum class RdmaCm::State : uint8_t {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,       // active: REQ sent
    ConnectResponse,  // active: REP received, RTU not yet sent
    ConnectRequest,   // passive: REQ received, not yet accepted
    Accepting,        // passive: REP sent, waiting for the RTU
    Established,
    Disconnected,  // DREQ sent or received, or the connection failed
};

struct RdmaCm::Id {
    uint32_t handle = 0;
    PortSpace ps = PortSpace::Tcp;
    bool ud = false;    // a UD identifier: SIDR instead of a connection
    uint32_t qkey = 0;  // UD: its own QP's Q_Key
    State state = State::Idle;
    CmAddress src;
    CmAddress dst;
    std::optional<CmDeviceInfo> device;
    std::unique_ptr<PortClaim> port;  // the bound port, held until destroyed
    // Listening: the same port claimed in the space's ".listening" table, so that anyone on
    // the host can tell a listener from a mere bind (tests wait for it).
    std::unique_ptr<PortClaim> listening;
    std::vector<std::string> listening_on;  // devices whose CM takes this listener's REQs
    bool silent = false;                    // destroyed: report nothing more
    uint32_t listen_parent = 0;             // passive: the listener the REQ came to
    int backlog = 0;                        // listening: requests that may wait (listen())
    bool reported = false;                  // passive: its ConnectRequest was handed over
    // It has had a connection (connected, or came from a REQ): like the kernel's IB CM
    // identifier, which outlives the connection, it lets DISCONNECT succeed from then on.
    bool had_connection = false;

    // The connection, once there is one.
    bool active = false;
    uint32_t comm_id = 0;
    std::string comm_device;
    uint32_t local_qpn = 0;
    uint32_t remote_qpn = 0;
    // The Starting PSN of a REQ or REP is, as the Linux kernel's CM uses it, the PSN its
    // sender expects to receive from: each side draws its own rq_psn and sends from the
    // PSN the other drew (checked against the kernel's rxe).
    uint32_t sq_psn = 0;              // the PSN this side sends from (the peer's Starting PSN)
    uint32_t rq_psn = 0;              // the PSN the peer sends from (our Starting PSN)
    uint8_t responder_resources = 0;  // RDMA READs this side answers at once (max_dest_rd_atomic)
    uint8_t initiator_depth = 0;      // RDMA READs this side issues at once (max_rd_atomic)
    uint8_t retry_count = 7;
    uint8_t rnr_retry_count = 7;
    uint8_t path_mtu = 3;
    bool disconnect_reported = false;
};

}  // namespace uroce::transport::cm
