// The UDP socket a device sends and receives RoCEv2 packets on.
//
// Unconnected and bound to the device's address and port. Don't-fragment is set, which
// also makes Linux send IPv4 identification 0 on an unconnected socket: the ICRC covers
// that field, so it has to be predictable (see docs/wire-format.md).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>

namespace uroce::transport {

class UdpSocket {
  public:
    // Binds ip:port (host order), as one member of a SO_REUSEPORT group if `reuseport` (the
    // group's steering decides which member gets a datagram). On failure fd() is -1 and
    // error() says why.
    UdpSocket(uint32_t ip, uint16_t port, bool reuseport = false);
    ~UdpSocket();
    UdpSocket(const UdpSocket&) = delete;
    UdpSocket& operator=(const UdpSocket&) = delete;

    int fd() const { return fd_; }

    // Closes this process's descriptor (fd() becomes -1). For a child of fork(): the socket
    // itself stays open in the parent, which keeps receiving on it.
    void close_fd() noexcept;
    int error() const { return error_; }
    uint32_t ip() const { return ip_; }
    uint16_t port() const { return port_; }

    // Sends one datagram gathered from `iov` to ip:port without waiting. Returns 0 or an
    // errno: EAGAIN/ENOBUFS when the socket buffer is full, EMSGSIZE when the datagram
    // exceeds the path MTU (don't-fragment is set).
    int send(uint32_t dst_ip, uint16_t dst_port, std::span<const iovec> iov) const;

    struct Datagram {
        uint8_t* data;
        size_t capacity;
        size_t length;
        uint32_t src_ip;
        uint16_t src_port;
    };
    // Reads up to batch.size() datagrams without blocking; returns how many (0 if none).
    size_t receive(std::span<Datagram> batch) const;

  private:
    int fd_ = -1;
    int error_ = 0;
    uint32_t ip_;
    uint16_t port_;
};

}  // namespace uroce::transport
