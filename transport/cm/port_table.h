// RDMA CM ports: which (port space, port) pairs the processes of this host have bound.
//
// RDMA CM identifiers bind ports as sockets do, from per-host port spaces (TCP, UDP, IB),
// and two identifiers must not listen on the same one. Without a kernel, the processes using
// uroce share a small file per port space (under the device registry's root) and hold a
// lock on the byte at offset `port` for as long as they hold the port: an open file
// description lock (OFD), which the kernel drops when the holder closes the file or dies,
// even by kill -9, so a dead process's ports are free again without anyone cleaning up. Each
// claim opens the file anew, so two claims in one process conflict as two processes' do.
//
// As with the kernel's port spaces, one port can be bound on two different addresses, but
// not on an address and on the any address (0.0.0.0) at once. A claim for one address locks
// the port's byte in the space's file shared and in a file of that address exclusively; an
// any-address claim locks the space's byte exclusively.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace uroce::transport::cm {

class PortClaim;

class PortTable {
  public:
    // Ephemeral ports come from here, as Linux's default ip_local_port_range.
    static constexpr uint16_t kEphemeralFirst = 32768;
    static constexpr uint16_t kEphemeralLast = 60999;

    // The table in file `path` (created, mode 0666, if it does not exist).
    explicit PortTable(std::string path) : path_(std::move(path)) {}

    // Claims `port` (1..65535) on IPv4 address `ip` (host order; 0 = any). nullptr with
    // `err`: EADDRINUSE when held (by this process or another), EINVAL for port 0, or the
    // errno of opening a file.
    std::unique_ptr<PortClaim> claim(uint32_t ip, uint16_t port, int& err) const;
    // Claims a free ephemeral port on `ip`, tried in random order. EADDRNOTAVAIL when none
    // is free.
    std::unique_ptr<PortClaim> claim_ephemeral(uint32_t ip, int& err) const;

  private:
    std::string path_;
};

// A held port, released when destroyed (or when the process dies).
class PortClaim {
  public:
    ~PortClaim();
    PortClaim(const PortClaim&) = delete;
    PortClaim& operator=(const PortClaim&) = delete;
    uint16_t port() const { return port_; }

  private:
    friend class PortTable;
    PortClaim(int fd, int addr_fd, uint16_t port) : fd_(fd), addr_fd_(addr_fd), port_(port) {}
    int fd_;
    int addr_fd_;
    uint16_t port_;
};

}  // namespace uroce::transport::cm
