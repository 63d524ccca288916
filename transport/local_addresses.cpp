#include "transport/local_addresses.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace uroce::transport {

namespace {

constexpr uint16_t kAnyPort = 9;  // discard: connect() needs one, nothing is sent

}  // namespace

bool is_local_address(const IpAddress& ip) {
    if (ip.is_unspecified() || ip.is_multicast() || ip == IpAddress::v4(INADDR_BROADCAST))
        return false;
    const int fd = ::socket(ip.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return true;
    sockaddr_storage sa;
    const socklen_t len = ip.to_sockaddr(0, sa);
    const bool local =
        ::bind(fd, reinterpret_cast<const sockaddr*>(&sa), len) == 0 || errno != EADDRNOTAVAIL;
    ::close(fd);
    return local;
}

std::optional<IpAddress> route_source(const IpAddress& dst) {
    const int fd = ::socket(dst.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return std::nullopt;
    sockaddr_storage to;
    const socklen_t len = dst.to_sockaddr(kAnyPort, to);
    std::optional<IpAddress> from;
    // connect() on a UDP socket only looks the route up and binds the source address.
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), len) == 0) {
        sockaddr_storage bound{};
        socklen_t blen = sizeof bound;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen) == 0)
            from = IpAddress::from_sockaddr(reinterpret_cast<const sockaddr*>(&bound), blen);
    }
    ::close(fd);
    return from;
}

}  // namespace uroce::transport
