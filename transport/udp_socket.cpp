#include "transport/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace uroce::transport {

namespace {
constexpr int kSocketBuffer = 4 << 20;
}

UdpSocket::UdpSocket(uint32_t ip, uint16_t port, bool reuseport) : ip_(ip), port_(port) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
        error_ = errno;
        return;
    }
    int pmtu = IP_PMTUDISC_DO;
    ::setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    // Best effort: larger buffers absorb bursts of a full send window.
    int buf = kSocketBuffer;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    const int one = 1;
    if (reuseport && ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        error_ = errno;
        ::close(fd_);
        fd_ = -1;
        return;
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(ip);
    sa.sin_port = htons(port);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
        error_ = errno;
        ::close(fd_);
        fd_ = -1;
    }
}

UdpSocket::~UdpSocket() {
    close_fd();
}

void UdpSocket::close_fd() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

int UdpSocket::send(uint32_t dst_ip, uint16_t dst_port, std::span<const iovec> iov) const {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(dst_ip);
    sa.sin_port = htons(dst_port);
    msghdr msg{};
    msg.msg_name = &sa;
    msg.msg_namelen = sizeof sa;
    msg.msg_iov = const_cast<iovec*>(iov.data());
    msg.msg_iovlen = iov.size();
    // Never waits: the caller holds a QP's mutex. A full socket buffer (EAGAIN, ENOBUFS)
    // is reported at once and the transport treats the packet as lost on the wire.
    for (int attempt = 0; attempt < 16; ++attempt) {
        if (::sendmsg(fd_, &msg, MSG_NOSIGNAL) >= 0) return 0;
        if (errno != EINTR) return errno;
    }
    return EINTR;
}

size_t UdpSocket::receive(std::span<Datagram> batch) const {
    constexpr size_t kMax = 64;
    const size_t n = batch.size() < kMax ? batch.size() : kMax;
    mmsghdr msgs[kMax];
    iovec iovs[kMax];
    sockaddr_in addrs[kMax];
    for (size_t i = 0; i < n; ++i) {
        iovs[i] = {batch[i].data, batch[i].capacity};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_name = &addrs[i];
        msgs[i].msg_hdr.msg_namelen = sizeof addrs[i];
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
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
    }
    return static_cast<size_t>(got);
}

}  // namespace uroce::transport
