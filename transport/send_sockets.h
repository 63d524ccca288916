// The sockets an engine sends from, one per UDP source port.
//
// RoCEv2 NICs (and the kernel's rxe) give each QP its own UDP source port, derived from its
// QPN, so that switches hashing the 5-tuple spread a host's flows over ECMP paths. A socket
// sends only from the port it is bound to, so each source port needs a socket bound to
// ip:port. They are created on first use and live as long as the engine; only
// kSourcePorts ports exist, which bounds the descriptors an engine takes from the
// application's process. Receiving stays on the engine's main socket (the RoCEv2 port).
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

#include "transport/udp_socket.h"

namespace uroce::transport {

// Source ports are 49152 + a 6-bit hash of the QPN: the top of the range RoCEv2 reserves
// for source ports (IBA A17.9.2: 0xC000..0xFFFF), 64 different ports per device.
inline constexpr uint16_t kSourcePortBase = 0xc000;
inline constexpr uint32_t kSourcePorts = 64;

// Fibonacci hashing of the QPN: neighbouring QPNs get unrelated ports.
constexpr uint16_t source_port_for_qpn(uint32_t qpn) {
    const uint32_t h = (qpn & 0xffffff) * 0x9e3779b1u;
    return static_cast<uint16_t>(kSourcePortBase + (h >> 26));
}
static_assert(kSourcePorts == 1u << (32 - 26));

class SendSockets {
  public:
    // `fallback` (the engine's main socket) sends when a port cannot be bound. Every socket
    // gives its packets ECN field `ecn` (congestion.h).
    SendSockets(const IpAddress& ip, const UdpSocket& fallback, uint8_t ecn = 0)
        : ip_(ip), fallback_(fallback), ecn_(ecn) {}

    // The socket bound to ip:port, made on first use. If the port cannot be bound (another
    // program holds it), the fallback socket: the caller learns the port actually used
    // from the socket's port().
    const UdpSocket& for_port(uint16_t port);

    // Closes this process's descriptors of every socket, without the lock: only for a child
    // of fork(), which has one thread and must not wait for a lock a parent thread held.
    void close_fds_after_fork() noexcept;

  private:
    const IpAddress ip_;
    const UdpSocket& fallback_;
    const uint8_t ecn_;
    std::shared_mutex mutex_;
    std::unordered_map<uint16_t, std::unique_ptr<UdpSocket>> sockets_;  // null: bind failed
};

}  // namespace uroce::transport
