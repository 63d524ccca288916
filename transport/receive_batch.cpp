#include "transport/receive_batch.h"

#include <arpa/inet.h>
#include <linux/udp.h>
#include <netinet/in.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace uroce::transport {

namespace {

IpAddress source_address(const sockaddr_storage& sa, socklen_t len) {
    return IpAddress::from_sockaddr(reinterpret_cast<const sockaddr*>(&sa), len)
        .value_or(IpAddress{});
}

uint16_t source_port(const sockaddr_storage& sa) {
    // sin_port and sin6_port sit at the same offset.
    return ntohs(reinterpret_cast<const sockaddr_in&>(sa).sin_port);
}
static_assert(offsetof(sockaddr_in, sin_port) == offsetof(sockaddr_in6, sin6_port));

// The UDP_GRO segment size (0: none) and the ECN field the control data report.
void read_control(msghdr& h, uint16_t& segment_size, uint8_t& ecn) {
    segment_size = 0;
    ecn = 0;
    if (h.msg_controllen == 0) return;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int size = 0;
            std::memcpy(&size, CMSG_DATA(c), sizeof size);
            if (size > 0 && size <= 0xffff) segment_size = static_cast<uint16_t>(size);
        } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS &&
                   c->cmsg_len >= CMSG_LEN(1)) {
            ecn = *CMSG_DATA(c) & 3;  // IPv4 reports the TOS byte alone
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS &&
                   c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int tclass = 0;
            std::memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
            ecn = static_cast<uint8_t>(tclass & 3);
        }
    }
}

}  // namespace

ReceiveBatch::ReceiveBatch(size_t count, size_t buffer_bytes)
    : count_(count),
      buffer_bytes_(buffer_bytes),
      buffers_(count * buffer_bytes),
      msgs_(new mmsghdr[count]()),
      iovs_(new iovec[count]()),
      addrs_(new sockaddr_storage[count]()),
      controls_(new Control[count]()),
      got_(new Datagram[count]()) {
    for (size_t i = 0; i < count_; ++i) {
        iovs_[i] = {buffers_.data() + i * buffer_bytes_, buffer_bytes_};
        msghdr& h = msgs_[i].msg_hdr;
        h.msg_name = &addrs_[i];
        h.msg_namelen = sizeof addrs_[i];
        h.msg_iov = &iovs_[i];
        h.msg_iovlen = 1;
        h.msg_control = controls_[i].bytes;
        h.msg_controllen = sizeof controls_[i].bytes;
    }
    // Every page written now, when the device opens, not by the first reads: each page's
    // first write faults, and on a VM whose hypervisor shadows the guest's page tables a
    // fault costs ~14 us (perf, the AMD VM of docs/performance-log.md, 2026-12-05): 256 of
    // them in a GRO batch's 1 MiB made the first receive batch of a stream take 2-10 ms
    // (median 6.4, 2.0 after), and its sender's first timeouts fire meanwhile.
    std::memset(buffers_.data(), 0, count_ * buffer_bytes_);
}

ReceiveBatch::~ReceiveBatch() = default;

size_t ReceiveBatch::read(int fd) {
    // The kernel wrote the lengths of the name and control data of what it returned.
    for (size_t i = 0; i < last_got_; ++i) {
        msgs_[i].msg_hdr.msg_namelen = sizeof addrs_[i];
        msgs_[i].msg_hdr.msg_controllen = sizeof controls_[i].bytes;
    }
    last_got_ = 0;
    const size_t width = read_width(fd);
    if (fd != width_fd_) {
        width_fd_ = fd;
        narrow_ = false;
        last_found_ = false;
    }
    int got;
    do {
        got = ::recvmmsg(fd, msgs_.get(), static_cast<unsigned>(width), MSG_DONTWAIT, nullptr);
    } while (got < 0 && errno == EINTR);
    if (got <= 0) {
        last_found_ = false;
        return 0;
    }
    last_got_ = static_cast<size_t>(got);
    // One short datagram alone: ask for one next time. Several, or data again at once: a
    // backlog. A long one (a train of full packets) is a stream's, or a long message's whose
    // next train may already be on its way.
    narrow_ = last_got_ == 1 && msgs_[0].msg_len <= kNarrowBytes && !(narrow_ && last_found_);
    last_found_ = true;
    for (size_t i = 0; i < last_got_; ++i) {
        msghdr& h = msgs_[i].msg_hdr;
        Datagram& d = got_[i];
        d.data = buffers_.data() + i * buffer_bytes_;
        d.length = (h.msg_flags & MSG_TRUNC) ? 0 : msgs_[i].msg_len;  // too big: drop
        d.src_ip = source_address(addrs_[i], h.msg_namelen);
        d.src_port = source_port(addrs_[i]);
        read_control(h, d.segment_size, d.ecn);
    }
    return last_got_;
}

}  // namespace uroce::transport
