// The UDP socket a device sends and receives RoCEv2 packets on.
//
// Unconnected and bound to the device's address and port: AF_INET for an IPv4 address,
// AF_INET6 (IPv6 only) for an IPv6 one. Don't-fragment is set, which also makes Linux send
// IPv4 identification 0 on an unconnected socket: the ICRC covers that field, so it has to
// be predictable (see docs/wire-format.md). IPv6 never fragments on the way and has no such
// field. Multicast goes out of
// the interface holding the device's address and loops back to members on this host.
//
// A group member socket (JoinGroup) is bound to an IPv4 multicast group and joined on the
// device's interface: the device's own sockets, bound to its unicast address, never see
// datagrams sent to a group.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>

#include "transport/receive_batch.h"
#include "uroce/ip_address.h"

namespace uroce::transport {

// A multicast group to receive on, and the device address naming the interface to join on.
struct JoinGroup {
    IpAddress group;
    IpAddress if_ip;
};

class UdpSocket {
  public:
    // Binds ip:port (port in host order), as one member of a SO_REUSEPORT group if `reuseport` (the
    // group's steering decides which member gets a datagram). On failure fd() is -1 and
    // error() says why.
    UdpSocket(const IpAddress& ip, uint16_t port, bool reuseport = false);
    // Binds group:port with SO_REUSEADDR (beside any other member socket on the host; each
    // gets its own copy of a datagram) and joins the group on the interface.
    UdpSocket(const JoinGroup& join, uint16_t port);
    ~UdpSocket();
    UdpSocket(const UdpSocket&) = delete;
    UdpSocket& operator=(const UdpSocket&) = delete;

    int fd() const { return fd_; }

    // Closes this process's descriptor (fd() becomes -1). For a child of fork(): the socket
    // itself stays open in the parent, which keeps receiving on it.
    void close_fd() noexcept;
    int error() const { return error_; }
    const IpAddress& ip() const { return ip_; }
    uint16_t port() const { return port_; }

    // Sends one datagram gathered from `iov` to ip:port without waiting. Returns 0 or an
    // errno: EAGAIN/ENOBUFS when the socket buffer is full, EMSGSIZE when the datagram
    // exceeds the path MTU (don't-fragment is set), EAFNOSUPPORT when `dst_ip` is of the
    // other family. A non-zero `ttl` is the packet's IPv4 TTL or IPv6 hop limit (multicast:
    // the AH's hop limit); 0 keeps the socket's.
    //
    // A non-zero `segment_size` makes it a UDP GSO send (UDP_SEGMENT): the kernel cuts `iov`
    // into datagrams of that many bytes (the last may be shorter), one trip through the
    // stack for all of them. Linux gives them IPv4 identifications 0, 1, 2, ... when it cuts
    // them (see docs/wire-format.md). EINVAL, EIO or EOPNOTSUPP: GSO is not possible on this
    // path (larger than its MTU, no checksum offload, an old kernel).
    //
    // A non-zero `ecn` is the packet's ECN field (3: Congestion Experienced, as a congested
    // switch marks it: UROCE_FAULTS' ce); 0 sends it Not-ECT, as the socket does.
    int send(const IpAddress& dst_ip, uint16_t dst_port, std::span<const iovec> iov,
             uint8_t ttl = 0, uint16_t segment_size = 0, uint8_t ecn = 0) const;

    // One datagram (or GSO train, with a non-zero `segment_size`) for send_many().
    struct Datagram {
        std::span<const iovec> iov;
        uint16_t segment_size = 0;
    };
    // Sends each of `datagrams` as send() would (TTL 0), all in one sendmmsg, in order.
    // Returns how many the kernel took: all, or those before the first it refused (its
    // error is lost: sending that one alone tells it).
    size_t send_many(const IpAddress& dst_ip, uint16_t dst_port,
                     std::span<const Datagram> datagrams) const;

    // Asks the kernel to hand over datagrams it received as one GSO train, or coalesced on
    // the way (UDP_GRO), as one buffer of equal-sized segments: receive() then reports their
    // size. False if the kernel cannot (the socket then receives them one by one).
    bool enable_gro();

    // Asks the kernel to report each datagram's ECN field (IP_RECVTOS, IPV6_RECVTCLASS):
    // receive() then gives it (congestion.h). False if the kernel cannot.
    bool enable_ecn_reports();
    // Gives every packet this socket sends ECN field `ecn` (IP_TOS, IPV6_TCLASS; DSCP 0).
    bool set_ecn(uint8_t ecn);

    // For a socket that only sends: the smallest receive buffer Linux allows (SO_RCVBUF 0),
    // so datagrams that anyone sends to its port, which nothing reads, pin at most a few
    // kilobytes of kernel memory instead of the socket's full receive buffer.
    void receive_nothing();

    // Reads up to batch.capacity() datagrams without blocking; returns how many (0 if none).
    // A datagram larger than its buffer is reported with length 0 (dropped).
    size_t receive(ReceiveBatch& batch) const { return batch.read(fd_); }

  private:
    // Opens the socket with the options every uroce socket has; false (error_ set) on failure.
    bool open();
    // Binds ip_:port_; false (socket closed, error_ set) on failure.
    bool bind_or_close();
    void fail(int err) noexcept;

    int fd_ = -1;
    int error_ = 0;
    IpAddress ip_;
    uint16_t port_;
};

}  // namespace uroce::transport
