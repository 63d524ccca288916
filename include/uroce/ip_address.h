// An IPv4 or IPv6 address, held the way a RoCEv2 GID holds it.
//
// A RoCEv2 GID is the port's IP address: an IPv6 address as is, an IPv4 address in its
// IPv4-mapped form ::ffff:a.b.c.d. IpAddress stores those 16 bytes, so converting between a
// GID and an address is a copy, and one type carries both families through the transport.
// A device has one address and thus one family: its sockets are AF_INET or AF_INET6
// accordingly, and its packets carry IPv4 or IPv6 headers (the ICRC covers either).
//
// The default value is the unspecified address "::" (what an unset address was before:
// is_unspecified() is also true of 0.0.0.0).
#pragma once

#include <sys/socket.h>

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace uroce {

class IpAddress {
  public:
    using Bytes = std::array<uint8_t, 16>;

    constexpr IpAddress() = default;
    // The IPv4 address `host_order` (a.b.c.d is 0xaabbccdd).
    static constexpr IpAddress v4(uint32_t host_order) {
        IpAddress a;
        a.bytes_[10] = a.bytes_[11] = 0xff;
        a.bytes_[12] = static_cast<uint8_t>(host_order >> 24);
        a.bytes_[13] = static_cast<uint8_t>(host_order >> 16);
        a.bytes_[14] = static_cast<uint8_t>(host_order >> 8);
        a.bytes_[15] = static_cast<uint8_t>(host_order);
        return a;
    }
    // The address a GID (or any 16 network-order bytes) holds: IPv4 if IPv4-mapped.
    static IpAddress from_bytes(const uint8_t* sixteen);
    // "a.b.c.d" or an IPv6 address in any form inet_pton takes; nullopt otherwise.
    static std::optional<IpAddress> parse(std::string_view text);
    // The address of an AF_INET or AF_INET6 socket address; nullopt for other families.
    static std::optional<IpAddress> from_sockaddr(const sockaddr* sa, socklen_t len);

    // IPv4-mapped (::ffff:0:0/96). An 8-byte and a 4-byte compare, not a loop over the
    // bytes: the send path asks several times per packet (the ICRC's pseudo-header), where
    // the loop took a third of the ICRC code's own time (docs/performance-log.md).
    constexpr bool is_v4() const {
        if (std::is_constant_evaluated()) {
            for (size_t i = 0; i < 10; ++i)
                if (bytes_[i] != 0) return false;
            return bytes_[10] == 0xff && bytes_[11] == 0xff;
        }
        constexpr uint8_t kMappedTail[4] = {0, 0, 0xff, 0xff};  // bytes 8-11 of the prefix
        uint64_t head;
        uint32_t tail;
        uint32_t mapped_tail;
        std::memcpy(&head, bytes_.data(), sizeof head);
        std::memcpy(&tail, bytes_.data() + 8, sizeof tail);
        std::memcpy(&mapped_tail, kMappedTail, sizeof mapped_tail);
        return head == 0 && tail == mapped_tail;
    }
    // The IPv4 address in host order; 0 for an IPv6 address.
    constexpr uint32_t v4() const {
        if (!is_v4()) return 0;
        return uint32_t{bytes_[12]} << 24 | uint32_t{bytes_[13]} << 16 | uint32_t{bytes_[14]} << 8 |
               bytes_[15];
    }
    int family() const { return is_v4() ? AF_INET : AF_INET6; }
    // "::" or 0.0.0.0: no address.
    bool is_unspecified() const;
    // 224.0.0.0/4 or ff00::/8.
    bool is_multicast() const;
    bool is_loopback() const;

    // The 16 bytes, network order: the address's RoCEv2 GID.
    const Bytes& bytes() const { return bytes_; }
    // "127.0.0.1", "::1", "fe80::1".
    std::string to_string() const;
    // Fills `out` with this address and `port` (host order) as sockaddr_in or sockaddr_in6;
    // returns its length.
    socklen_t to_sockaddr(uint16_t port, sockaddr_storage& out) const;

    constexpr auto operator<=>(const IpAddress&) const = default;
    // Two 8-byte compares, not a call to memcmp: every received packet's source is compared
    // with its QP's peer.
    constexpr bool operator==(const IpAddress& other) const {
        if (std::is_constant_evaluated()) return bytes_ == other.bytes_;
        uint64_t a[2];
        uint64_t b[2];
        std::memcpy(a, bytes_.data(), sizeof a);
        std::memcpy(b, other.bytes_.data(), sizeof b);
        return ((a[0] ^ b[0]) | (a[1] ^ b[1])) == 0;
    }

  private:
    Bytes bytes_{};
};

struct IpAddressHash {
    size_t operator()(const IpAddress& a) const noexcept;
};

}  // namespace uroce
