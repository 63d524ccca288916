// Datagrams put back into the kernel's steering: see kernel_resteer.h.
#include "transport/kernel_resteer.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

namespace uroce::transport {

namespace {

constexpr size_t kIpv4Header = 20;
constexpr size_t kIpv6Header = 40;
constexpr size_t kUdpHeader = 8;
constexpr uint8_t kHopLimit = 64;  // the ICRC masks it; the copy never leaves the host

void put16(uint8_t* at, uint16_t v) {
    at[0] = static_cast<uint8_t>(v >> 8);
    at[1] = static_cast<uint8_t>(v);
}

// The Internet checksum's running sum over `bytes` (big-endian 16-bit words).
uint32_t sum16(uint32_t sum, std::span<const uint8_t> bytes) {
    size_t i = 0;
    for (; i + 1 < bytes.size(); i += 2) sum += uint32_t{bytes[i]} << 8 | bytes[i + 1];
    if (i < bytes.size()) sum += uint32_t{bytes[i]} << 8;
    return sum;
}

uint16_t fold(uint32_t sum) {
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return static_cast<uint16_t>(~sum);
}

}  // namespace

KernelResteer::KernelResteer(const IpAddress& local) : local_(local) {
    // IPPROTO_RAW: the caller writes the IP header (IP_HDRINCL, implied for both families).
    fd_ = ::socket(local.family(), SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
}

KernelResteer::~KernelResteer() {
    if (fd_ >= 0) ::close(fd_);
}

bool KernelResteer::send(const IpAddress& src, uint16_t src_port, uint16_t dst_port,
                         std::span<const uint8_t> udp_payload, uint16_t identification,
                         uint8_t ecn) const {
    if (fd_ < 0 || src.is_v4() != local_.is_v4()) return false;
    const bool v4 = local_.is_v4();
    const size_t udp_len = kUdpHeader + udp_payload.size();
    if (udp_len > 0xffff - kIpv4Header) return false;
    uint8_t hdr[kIpv6Header + kUdpHeader] = {};
    uint8_t* udp = hdr + (v4 ? kIpv4Header : kIpv6Header);
    put16(udp, src_port);
    put16(udp + 2, dst_port);
    put16(udp + 4, static_cast<uint16_t>(udp_len));
    if (v4) {
        hdr[0] = 0x45;
        hdr[1] = ecn & 3;
        put16(hdr + 2, static_cast<uint16_t>(kIpv4Header + udp_len));
        put16(hdr + 4, identification);
        put16(hdr + 6, 0x4000);  // DF, as RoCEv2 packets are sent
        hdr[8] = kHopLimit;
        hdr[9] = IPPROTO_UDP;
        // The header checksum the kernel fills in; a UDP checksum of 0 is "none" over IPv4.
        std::memcpy(hdr + 12, src.bytes().data() + 12, 4);
        std::memcpy(hdr + 16, local_.bytes().data() + 12, 4);
    } else {
        hdr[0] = 0x60;
        hdr[1] = static_cast<uint8_t>((ecn & 3) << 4);
        put16(hdr + 4, static_cast<uint16_t>(udp_len));
        hdr[6] = IPPROTO_UDP;
        hdr[7] = kHopLimit;
        std::memcpy(hdr + 8, src.bytes().data(), 16);
        std::memcpy(hdr + 24, local_.bytes().data(), 16);
        // IPv6 requires the UDP checksum: pseudo-header (addresses, length, next header),
        // UDP header, payload.
        uint32_t sum = sum16(0, std::span<const uint8_t>(hdr + 8, 32));
        sum += static_cast<uint32_t>(udp_len) + IPPROTO_UDP;
        sum = sum16(sum, std::span<const uint8_t>(udp, kUdpHeader));
        sum = sum16(sum, udp_payload);
        uint16_t check = fold(sum);
        put16(udp + 6, check == 0 ? 0xffff : check);
    }
    iovec iov[2] = {{hdr, static_cast<size_t>(udp + kUdpHeader - hdr)},
                    {const_cast<uint8_t*>(udp_payload.data()), udp_payload.size()}};
    sockaddr_storage to{};
    const socklen_t to_len = local_.to_sockaddr(0, to);
    msghdr msg{};
    msg.msg_name = &to;
    msg.msg_namelen = to_len;
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    return ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) ==
           static_cast<ssize_t>(iov[0].iov_len + iov[1].iov_len);
}

}  // namespace uroce::transport
