#include "transport/cm/ip_cm_header.h"

#include <cstring>

#include "transport/cm/bit_field.h"

namespace uroce::transport::cm {

namespace {
// Annex A11: MajV(4) MinV(4) IPV(4) reserved(4) SrcPort(16) SrcIP(128) DstIP(128).
constexpr BitField kMajorVersion{0, 4};
constexpr BitField kMinorVersion{4, 4};
constexpr BitField kIpVersion{8, 4};
constexpr BitField kSourcePort{16, 16};
constexpr size_t kSourceByte = 4;
constexpr size_t kDestinationByte = 20;
constexpr uint64_t kIpServicePrefix = 0x0000000001ull;  // the top 40 bits
}  // namespace

std::optional<IpService> ip_service_of(uint64_t service_id) {
    if ((service_id >> 24) != kIpServicePrefix) return std::nullopt;
    const auto ps = static_cast<PortSpace>((service_id >> 16) & 0xffff);
    switch (ps) {
        case PortSpace::Ib:
        case PortSpace::Tcp:
        case PortSpace::Udp:
            return IpService{ps, static_cast<uint16_t>(service_id & 0xffff)};
        case PortSpace::Ipoib:
            break;
    }
    return std::nullopt;
}

IpCmAddress ip_cm_address_v4(uint32_t addr_be) {
    IpCmAddress a{};
    std::memcpy(a.data() + 12, &addr_be, 4);
    return a;
}

void write_ip_cm_header(const IpCmHeader& h, std::span<uint8_t> private_data) {
    auto out = private_data.first(kIpCmHeaderBytes);
    std::memset(out.data(), 0, out.size());
    set_field(out, kMajorVersion, h.major_version);
    set_field(out, kMinorVersion, h.minor_version);
    set_field(out, kIpVersion, h.ip_version);
    set_field(out, kSourcePort, h.source_port);
    std::memcpy(out.data() + kSourceByte, h.source.data(), 16);
    std::memcpy(out.data() + kDestinationByte, h.destination.data(), 16);
}

IpCmHeaderError read_ip_cm_header(std::span<const uint8_t> private_data, IpCmHeader& out) {
    if (private_data.size() < kIpCmHeaderBytes) return IpCmHeaderError::TooShort;
    IpCmHeader h;
    h.major_version = static_cast<uint8_t>(get_field(private_data, kMajorVersion));
    h.minor_version = static_cast<uint8_t>(get_field(private_data, kMinorVersion));
    h.ip_version = static_cast<uint8_t>(get_field(private_data, kIpVersion));
    h.source_port = static_cast<uint16_t>(get_field(private_data, kSourcePort));
    std::memcpy(h.source.data(), private_data.data() + kSourceByte, 16);
    std::memcpy(h.destination.data(), private_data.data() + kDestinationByte, 16);
    // The kernel writes version 0.0 and refuses a REQ whose major version it does not know.
    if (h.major_version != 0) return IpCmHeaderError::BadVersion;
    if (h.ip_version != 4 && h.ip_version != 6) return IpCmHeaderError::BadIpVersion;
    out = h;
    return IpCmHeaderError::None;
}

}  // namespace uroce::transport::cm
