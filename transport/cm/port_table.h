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
// A port is exclusive within its port space whatever the IP address it is bound to (the
// kernel allows the same port on two different specific addresses; uroce does not yet).
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

    // Claims `port` (1..65535). nullptr with `err`: EADDRINUSE when held (by this process or
    // another), EINVAL for port 0, or the errno of opening the file.
    std::unique_ptr<PortClaim> claim(uint16_t port, int& err) const;
    // Claims a free ephemeral port, tried in random order. EADDRNOTAVAIL when none is free.
    std::unique_ptr<PortClaim> claim_ephemeral(int& err) const;

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
    PortClaim(int fd, uint16_t port) : fd_(fd), port_(port) {}
    int fd_;
    uint16_t port_;
};

}  // namespace uroce::transport::cm
