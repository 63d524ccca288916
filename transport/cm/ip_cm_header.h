// The RDMA IP CM service (IBA Annex A11) as the Linux kernel's RDMA CM uses it: how an IP
// address and port become an IB service ID, and the header RDMA CM puts in front of the
// consumer's private data in a REQ (and SIDR REQ) so the passive side learns the active
// side's IP addresses and port.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace uroce::transport::cm {

// RDMA CM port spaces (librdmacm's enum rdma_port_space): the low byte is the IP protocol
// number the service ID carries.
enum class PortSpace : uint16_t {
    Ipoib = 0x0002,
    Ib = 0x013f,
    Tcp = 0x0106,
    Udp = 0x0111,
};

// The service ID of (port space, port): 0x0000000001 | protocol | port (Annex A11.2.1).
inline constexpr uint64_t service_id_of(PortSpace ps, uint16_t port) {
    return (static_cast<uint64_t>(ps) << 16) | port;
}
// The port space and port of an RDMA IP CM service ID; nullopt if it is not one.
struct IpService {
    PortSpace port_space;
    uint16_t port;
};
std::optional<IpService> ip_service_of(uint64_t service_id);

inline constexpr size_t kIpCmHeaderBytes = 36;

// 16 bytes: an IPv6 address, or an IPv4 address in the last four bytes with twelve zero bytes
// before it (not the ::ffff: mapped form: that is how the kernel writes it).
using IpCmAddress = std::array<uint8_t, 16>;
IpCmAddress ip_cm_address_v4(uint32_t addr_be);

struct IpCmHeader {
    uint8_t major_version = 0;  // 4 bits
    uint8_t minor_version = 0;  // 4 bits
    uint8_t ip_version = 4;     // 4 or 6
    uint16_t source_port = 0;   // the active side's port, host order
    IpCmAddress source{};
    IpCmAddress destination{};

    bool operator==(const IpCmHeader&) const = default;
};

// Writes the header into the first kIpCmHeaderBytes of `private_data`.
void write_ip_cm_header(const IpCmHeader& h, std::span<uint8_t> private_data);

enum class IpCmHeaderError { None = 0, TooShort, BadVersion, BadIpVersion };
// Reads the header at the front of a REQ's private data; the consumer's data follows it.
IpCmHeaderError read_ip_cm_header(std::span<const uint8_t> private_data, IpCmHeader& out);

// The flow label the kernel's RDMA CM puts in a RoCE v2 path when the application gave none:
// derived from the two ports, so the connections of one host pair spread over UDP source
// ports (rxe turns the flow label into the UDP source port).
inline constexpr uint32_t roce_flow_label(uint16_t source_port, uint16_t destination_port) {
    return (static_cast<uint32_t>(source_port) * 31u + destination_port) & 0xfffffu;
}

}  // namespace uroce::transport::cm
