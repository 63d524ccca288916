// The buffers and message headers one recvmmsg fills, built once and reused by every read.
//
// A busy-polling application reads the socket at every poll of an empty CQ, and nearly
// every such read finds nothing: what the read costs before the system call is then the
// whole cost of a poll beyond the call itself. Filling in a fresh set of message headers
// and datagram records for every read took about a quarter of an empty poll (950 ns
// before, 690 after, against 590 for the system call alone on this VM: uroce-empty-poll,
// docs/performance-log.md). Here the headers point at their buffers from the start, and a read
// resets only the lengths the kernel wrote in the previous one.
//
// How many datagrams a read asks for (read_width()). Asking for N, recvmmsg tries to read
// a datagram again after each one it got until it has N: a read that finds one datagram
// waiting also pays for a second, empty attempt. A ping-pong of short messages finds one
// short datagram per read (a request, or an answer with its ACK in one GRO train), so a
// read that found exactly one, of at most kNarrowBytes, makes the next read ask for one; a
// read that found several, or a long one, or found data right after another read did (a
// backlog: a stream), makes it ask for capacity() again. A narrow read never loses anything:
// what it leaves waits for the next. ib_send_lat -s 8: 4.51 -> 4.40 us (8 alternating pairs,
// 2026-12-02). Long datagrams keep reads wide: a 64 KiB message comes as two trains, often
// read together, and a narrow read split them into two receive batches (ibv_rc_pingpong -s
// 65536: 48.8 -> 51.4 us an iteration).
//
// Not thread-safe: one reader at a time (the engine's rx_mutex_).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/page_aligned_buffer.h"
#include "uroce/ip_address.h"

namespace uroce::transport {

class ReceiveBatch {
  public:
    struct Datagram {
        uint8_t* data;
        // 0 for a datagram larger than its buffer (the kernel cut it: dropped).
        size_t length;
        IpAddress src_ip;
        uint16_t src_port;
        // With GRO: `length` holds datagrams of this many bytes each, the last one possibly
        // shorter. 0: one datagram.
        uint16_t segment_size;
        // The ECN field of its IP header (3: Congestion Experienced), when the socket reports
        // it (UdpSocket::enable_ecn_reports); else 0. GRO never merges datagrams whose
        // fields differ.
        uint8_t ecn;
    };

    // `count` buffers of `buffer_bytes` (a multiple of 64) each, the first on a page, every
    // one on a cache line (page_aligned_buffer.h says why). Throws std::bad_alloc.
    ReceiveBatch(size_t count, size_t buffer_bytes);
    ~ReceiveBatch();
    ReceiveBatch(const ReceiveBatch&) = delete;
    ReceiveBatch& operator=(const ReceiveBatch&) = delete;

    size_t capacity() const { return count_; }
    // The longest datagram that, found alone, makes the next read narrow.
    static constexpr size_t kNarrowBytes = 1024;
    const uint8_t* buffer(size_t i) const { return buffers_.data() + i * buffer_bytes_; }

    // Reads up to read_width() datagrams from `fd` without blocking: returns how many
    // (0 if none, or on an error), each then at operator[] until the next read.
    size_t read(int fd);
    // What the next read of `fd` asks for: 1 or capacity(). A socket other than the one
    // read last starts at capacity().
    size_t read_width(int fd) const { return fd == width_fd_ && narrow_ ? 1 : count_; }
    const Datagram& operator[](size_t i) const { return got_[i]; }

  private:
    struct alignas(cmsghdr) Control {
        // The UDP_GRO segment size and the IP TOS or traffic class, when the kernel sends
        // them.
        uint8_t bytes[2 * CMSG_SPACE(sizeof(int))];
    };

    const size_t count_;
    const size_t buffer_bytes_;
    PageAlignedBuffer buffers_;
    std::unique_ptr<mmsghdr[]> msgs_;
    std::unique_ptr<iovec[]> iovs_;
    std::unique_ptr<sockaddr_storage[]> addrs_;
    std::unique_ptr<Control[]> controls_;
    std::unique_ptr<Datagram[]> got_;
    size_t last_got_ = 0;  // headers the last read let the kernel write into
    // The read width's state, for socket width_fd_: narrow_, and whether the last read of it
    // found anything.
    int width_fd_ = -1;
    bool narrow_ = false;
    bool last_found_ = false;
};

}  // namespace uroce::transport
