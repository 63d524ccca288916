#include "transport/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/udp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace uroce::transport {

namespace {
constexpr int kSocketBuffer = 4 << 20;
}

UdpSocket::UdpSocket(uint32_t ip, uint16_t port, bool reuseport) : ip_(ip), port_(port) {
    if (!open()) return;
    const int one = 1;
    if (reuseport && ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        fail(errno);
        return;
    }
    // Multicast sends leave from the device's interface (not the default route's) and come
    // back to members on this host, such as other contexts of this device. Best effort: a
    // socket that cannot have them still serves unicast.
    in_addr ifa{htonl(ip)};
    ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof ifa);
    ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof one);
    bind_or_close();
}

UdpSocket::UdpSocket(const JoinGroup& join, uint16_t port) : ip_(join.group), port_(port) {
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
    mreq.imr_multiaddr.s_addr = htonl(join.group);
    mreq.imr_interface.s_addr = htonl(join.if_ip);
    if (::setsockopt(fd_, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) != 0) fail(errno);
}

bool UdpSocket::open() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
        error_ = errno;
        return false;
    }
    int pmtu = IP_PMTUDISC_DO;
    ::setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    // Best effort: larger buffers absorb bursts of a full send window.
    int buf = kSocketBuffer;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    return true;
}

bool UdpSocket::bind_or_close() {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(ip_);
    sa.sin_port = htons(port_);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return true;
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

int UdpSocket::send(uint32_t dst_ip, uint16_t dst_port, std::span<const iovec> iov, uint8_t ttl,
                    uint16_t segment_size) const {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(dst_ip);
    sa.sin_port = htons(dst_port);
    msghdr msg{};
    msg.msg_name = &sa;
    msg.msg_namelen = sizeof sa;
    msg.msg_iov = const_cast<iovec*>(iov.data());
    msg.msg_iovlen = iov.size();
    // The TTL per packet (IP_TTL as ancillary data, which Linux honours for multicast too):
    // QPs with different hop limits share a socket.
    alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t))] = {};
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
        add(IPPROTO_IP, IP_TTL, &value, sizeof value);
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

bool UdpSocket::enable_gro() {
    const int one = 1;
    return fd_ >= 0 && ::setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &one, sizeof one) == 0;
}

size_t UdpSocket::receive(std::span<Datagram> batch) const {
    constexpr size_t kMax = 64;
    const size_t n = batch.size() < kMax ? batch.size() : kMax;
    mmsghdr msgs[kMax];
    iovec iovs[kMax];
    sockaddr_in addrs[kMax];
    // The UDP_GRO segment size, when the kernel sends one.
    struct alignas(cmsghdr) Control {
        uint8_t bytes[CMSG_SPACE(sizeof(int))];
    };
    Control controls[kMax];
    for (size_t i = 0; i < n; ++i) {
        iovs[i] = {batch[i].data, batch[i].capacity};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_name = &addrs[i];
        msgs[i].msg_hdr.msg_namelen = sizeof addrs[i];
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_control = controls[i].bytes;
        msgs[i].msg_hdr.msg_controllen = sizeof controls[i].bytes;
    }
    int got;
    do {
        got = ::recvmmsg(fd_, msgs, static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
    } while (got < 0 && errno == EINTR);
    if (got <= 0) return 0;
    for (int i = 0; i < got; ++i) {
        batch[i].length = msgs[i].msg_len;
        if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) batch[i].length = 0;  // too big: drop
        batch[i].src_ip = ntohl(addrs[i].sin_addr.s_addr);
        batch[i].src_port = ntohs(addrs[i].sin_port);
        batch[i].segment_size = 0;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c;
             c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
            if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO &&
                c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int size = 0;
                std::memcpy(&size, CMSG_DATA(c), sizeof size);
                if (size > 0 && size <= 0xffff) batch[i].segment_size = static_cast<uint16_t>(size);
            }
        }
    }
    return static_cast<size_t>(got);
}

}  // namespace uroce::transport
