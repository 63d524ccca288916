#include "transport/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/udp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace uroce::transport {

namespace {
constexpr int kSocketBuffer = 4 << 20;
}  // namespace

UdpSocket::UdpSocket(const IpAddress& ip, uint16_t port, bool reuseport) : ip_(ip), port_(port) {
    if (!open()) return;
    const int one = 1;
    if (reuseport && ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        fail(errno);
        return;
    }
    // Multicast sends leave from the device's interface (not the default route's) and come
    // back to members on this host, such as other contexts of this device. Best effort: a
    // socket that cannot have them still serves unicast.
    if (ip.is_v4()) {
        in_addr ifa{htonl(ip.v4())};
        ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof ifa);
        ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof one);
    }
    bind_or_close();
}

UdpSocket::UdpSocket(const JoinGroup& join, uint16_t port) : ip_(join.group), port_(port) {
    if (!join.group.is_v4() || !join.if_ip.is_v4()) {
        error_ = EAFNOSUPPORT;  // IPv6 multicast groups: not yet (docs/ud.md)
        return;
    }
    if (!open()) return;
    const int one = 1, zero = 0;
    // Linux hands a multicast datagram to every socket bound to the group. SO_REUSEADDR,
    // the usual option of multicast receivers, lets contexts of any user and other programs
    // bind it beside us; SO_REUSEPORT would need it on every socket, all of one user.
    if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        // Only the group joined here, on the interface joined on: without this Linux also
        // delivers a group that another socket joined, on any interface.
        ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero) != 0) {
        fail(errno);
        return;
    }
    if (!bind_or_close()) return;
    ip_mreq mreq{};
    mreq.imr_multiaddr.s_addr = htonl(join.group.v4());
    mreq.imr_interface.s_addr = htonl(join.if_ip.v4());
    if (::setsockopt(fd_, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) != 0) fail(errno);
}

bool UdpSocket::open() {
    fd_ = ::socket(ip_.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
        error_ = errno;
        return false;
    }
    if (ip_.is_v4()) {
        int pmtu = IP_PMTUDISC_DO;
        ::setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    } else {
        // IPv6 only: an IPv6 device neither sends nor receives IPv4-mapped traffic.
        const int one = 1;
        int pmtu = IPV6_PMTUDISC_DO;
        ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        ::setsockopt(fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
        // The kernel's rxe sends RoCEv2 over IPv6 with UDP checksum 0 (RFC 6935 allows it for
        // tunnels; the ICRC covers the packet), which Linux drops unless the socket accepts it.
        ::setsockopt(fd_, IPPROTO_UDP, UDP_NO_CHECK6_RX, &one, sizeof one);
    }
    // Best effort: larger buffers absorb bursts of a full send window.
    int buf = kSocketBuffer;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    return true;
}

bool UdpSocket::bind_or_close() {
    sockaddr_storage sa;
    const socklen_t len = ip_.to_sockaddr(port_, sa);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), len) == 0) return true;
    fail(errno);
    return false;
}

void UdpSocket::fail(int err) noexcept {
    error_ = err;
    close_fd();
}

UdpSocket::~UdpSocket() {
    close_fd();
}

void UdpSocket::close_fd() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

int UdpSocket::send(const IpAddress& dst_ip, uint16_t dst_port, std::span<const iovec> iov,
                    uint8_t ttl, uint16_t segment_size, uint8_t ecn) const {
    if (dst_ip.is_v4() != ip_.is_v4()) return EAFNOSUPPORT;
    sockaddr_storage sa;
    msghdr msg{};
    msg.msg_name = &sa;
    msg.msg_namelen = dst_ip.to_sockaddr(dst_port, sa);
    msg.msg_iov = const_cast<iovec*>(iov.data());
    msg.msg_iovlen = iov.size();
    // The TTL per packet (IP_TTL or IPV6_HOPLIMIT as ancillary data, which Linux honours for
    // multicast too): QPs with different hop limits share a socket.
    alignas(cmsghdr)
        uint8_t control[2 * CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t))] = {};
    size_t used = 0;
    const auto add = [&](int level, int type, const void* data, size_t len) {
        auto* c = reinterpret_cast<cmsghdr*>(control + used);
        c->cmsg_level = level;
        c->cmsg_type = type;
        c->cmsg_len = CMSG_LEN(len);
        std::memcpy(CMSG_DATA(c), data, len);
        used += CMSG_SPACE(len);
    };
    if (ttl != 0) {
        const int value = ttl;
        if (ip_.is_v4()) {
            add(IPPROTO_IP, IP_TTL, &value, sizeof value);
        } else {
            add(IPPROTO_IPV6, IPV6_HOPLIMIT, &value, sizeof value);
        }
    }
    if (ecn != 0) {
        // DSCP 0, as every uroce packet; only the ECN bits differ.
        const int value = ecn & 3;
        if (ip_.is_v4()) {
            add(IPPROTO_IP, IP_TOS, &value, sizeof value);
        } else {
            add(IPPROTO_IPV6, IPV6_TCLASS, &value, sizeof value);
        }
    }
    if (segment_size != 0) add(IPPROTO_UDP, UDP_SEGMENT, &segment_size, sizeof segment_size);
    if (used != 0) {
        msg.msg_control = control;
        msg.msg_controllen = used;
    }
    // Never waits: the caller holds a QP's mutex. A full socket buffer (EAGAIN, ENOBUFS)
    // is reported at once and the transport treats the packet as lost on the wire.
    for (int attempt = 0; attempt < 16; ++attempt) {
        if (::sendmsg(fd_, &msg, MSG_NOSIGNAL) >= 0) return 0;
        if (errno != EINTR) return errno;
    }
    return EINTR;
}

size_t UdpSocket::send_many(const IpAddress& dst_ip, uint16_t dst_port,
                            std::span<const Datagram> datagrams) const {
    constexpr size_t kMax = 16;
    if (dst_ip.is_v4() != ip_.is_v4() || datagrams.empty() || datagrams.size() > kMax) return 0;
    sockaddr_storage sa;
    const socklen_t salen = dst_ip.to_sockaddr(dst_port, sa);
    mmsghdr msgs[kMax] = {};
    alignas(cmsghdr) uint8_t control[kMax][CMSG_SPACE(sizeof(uint16_t))] = {};
    for (size_t i = 0; i < datagrams.size(); ++i) {
        msghdr& msg = msgs[i].msg_hdr;
        msg.msg_name = &sa;
        msg.msg_namelen = salen;
        msg.msg_iov = const_cast<iovec*>(datagrams[i].iov.data());
        msg.msg_iovlen = datagrams[i].iov.size();
        if (datagrams[i].segment_size != 0) {
            auto* c = reinterpret_cast<cmsghdr*>(control[i]);
            c->cmsg_level = IPPROTO_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            std::memcpy(CMSG_DATA(c), &datagrams[i].segment_size, sizeof(uint16_t));
            msg.msg_control = control[i];
            msg.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
        }
    }
    // Never waits, as send(). Interrupted before the first datagram went: tried again.
    for (int attempt = 0; attempt < 16; ++attempt) {
        const int n = ::sendmmsg(fd_, msgs, static_cast<unsigned>(datagrams.size()), MSG_NOSIGNAL);
        if (n >= 0) return static_cast<size_t>(n);
        if (errno != EINTR) return 0;
    }
    return 0;
}

bool UdpSocket::enable_gro() {
    const int one = 1;
    return fd_ >= 0 && ::setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &one, sizeof one) == 0;
}

bool UdpSocket::enable_ecn_reports() {
    const int one = 1;
    if (fd_ < 0) return false;
    if (ip_.is_v4()) return ::setsockopt(fd_, IPPROTO_IP, IP_RECVTOS, &one, sizeof one) == 0;
    return ::setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof one) == 0;
}

bool UdpSocket::set_ecn(uint8_t ecn) {
    const int value = ecn & 3;
    if (fd_ < 0) return false;
    if (ip_.is_v4()) return ::setsockopt(fd_, IPPROTO_IP, IP_TOS, &value, sizeof value) == 0;
    return ::setsockopt(fd_, IPPROTO_IPV6, IPV6_TCLASS, &value, sizeof value) == 0;
}

void UdpSocket::receive_nothing() {
    const int zero = 0;
    if (fd_ >= 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &zero, sizeof zero);
}

}  // namespace uroce::transport
