// See uroce/ip_address.h.
#include "uroce/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace uroce {

IpAddress IpAddress::from_bytes(const uint8_t* sixteen) {
    IpAddress a;
    std::memcpy(a.bytes_.data(), sixteen, a.bytes_.size());
    return a;
}

std::optional<IpAddress> IpAddress::parse(std::string_view text) {
    // inet_pton wants a terminated string; an address is at most 45 characters.
    char buf[64];
    if (text.empty() || text.size() >= sizeof buf) return std::nullopt;
    std::memcpy(buf, text.data(), text.size());
    buf[text.size()] = '\0';
    in_addr a4{};
    if (::inet_pton(AF_INET, buf, &a4) == 1) return v4(ntohl(a4.s_addr));
    in6_addr a6{};
    if (::inet_pton(AF_INET6, buf, &a6) == 1) return from_bytes(a6.s6_addr);
    return std::nullopt;
}

std::optional<IpAddress> IpAddress::from_sockaddr(const sockaddr* sa, socklen_t len) {
    if (!sa) return std::nullopt;
    if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
        sockaddr_in in{};
        std::memcpy(&in, sa, sizeof in);
        return v4(ntohl(in.sin_addr.s_addr));
    }
    if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
        sockaddr_in6 in6{};
        std::memcpy(&in6, sa, sizeof in6);
        return from_bytes(in6.sin6_addr.s6_addr);
    }
    return std::nullopt;
}

bool IpAddress::is_unspecified() const {
    return *this == IpAddress{} || *this == v4(0);
}

bool IpAddress::is_multicast() const {
    return is_v4() ? (v4() >> 28) == 0xe : bytes_[0] == 0xff;
}

bool IpAddress::is_loopback() const {
    if (is_v4()) return (v4() >> 24) == 127;
    IpAddress one;
    one.bytes_[15] = 1;
    return *this == one;
}

std::string IpAddress::to_string() const {
    char buf[INET6_ADDRSTRLEN] = {};
    if (is_v4()) {
        ::inet_ntop(AF_INET, bytes_.data() + 12, buf, sizeof buf);
    } else {
        ::inet_ntop(AF_INET6, bytes_.data(), buf, sizeof buf);
    }
    return buf;
}

socklen_t IpAddress::to_sockaddr(uint16_t port, sockaddr_storage& out) const {
    out = {};
    if (is_v4()) {
        auto* in = reinterpret_cast<sockaddr_in*>(&out);
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        std::memcpy(&in->sin_addr, bytes_.data() + 12, 4);
        return sizeof(sockaddr_in);
    }
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    std::memcpy(&in6->sin6_addr, bytes_.data(), 16);
    return sizeof(sockaddr_in6);
}

size_t IpAddressHash::operator()(const IpAddress& a) const noexcept {
    // FNV-1a over the 16 bytes: addresses are few, and this keeps IPv4 keys apart.
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint8_t b : a.bytes()) h = (h ^ b) * 0x100000001b3ull;
    return static_cast<size_t>(h);
}

}  // namespace uroce
