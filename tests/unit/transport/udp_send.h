// Sends test datagrams the way a peer's kernel would receive them: one sendmsg, optionally
// a GSO train (UDP_SEGMENT) that the receiving socket reads whole through GRO.
#pragma once

#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <span>

namespace uroce::transport::test {

// `bytes` from socket `fd` to `dst` (of length `dst_len`) in one sendmsg; a non-zero
// `segment` makes it a GSO train of datagrams that long (the last may be shorter).
inline void send_udp(int fd, const sockaddr_storage& dst, socklen_t dst_len,
                     std::span<const uint8_t> bytes, uint16_t segment = 0) {
    iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    msghdr m{};
    m.msg_name = const_cast<sockaddr_storage*>(&dst);
    m.msg_namelen = dst_len;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(uint16_t))] = {};
    if (segment != 0) {
        m.msg_control = control;
        m.msg_controllen = sizeof control;
        cmsghdr* c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = IPPROTO_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        std::memcpy(CMSG_DATA(c), &segment, sizeof segment);
    }
    REQUIRE(::sendmsg(fd, &m, 0) == static_cast<ssize_t>(bytes.size()));
}

}  // namespace uroce::transport::test
