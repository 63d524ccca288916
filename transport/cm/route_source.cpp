#include "transport/cm/route_source.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "uroce/wire.h"

namespace uroce::transport::cm {

namespace {

sockaddr_in ipv4(uint32_t ip, uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(ip);
    return a;
}

}  // namespace

bool is_local_address(uint32_t ip) {
    // bind() takes these too, but none is an address a host has.
    if (ip == INADDR_ANY || ip == INADDR_BROADCAST || IN_MULTICAST(ip)) return false;
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const sockaddr_in at = ipv4(ip, 0);
    const bool local = ::bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0;
    ::close(fd);
    return local;
}

std::optional<uint32_t> route_source(uint32_t dst) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return std::nullopt;
    const sockaddr_in to = ipv4(dst, wire::kRoceV2Port);
    std::optional<uint32_t> from;
    // connect() on a UDP socket only looks the route up and binds the source address.
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) {
        sockaddr_in bound{};
        socklen_t len = sizeof bound;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0 &&
            bound.sin_family == AF_INET)
            from = ntohl(bound.sin_addr.s_addr);
    }
    ::close(fd);
    return from;
}

}  // namespace uroce::transport::cm
