#include "transport/cm/port_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <numeric>

#include "transport/random_source.h"

namespace uroce::transport::cm {

namespace {

// Locks byte `port` of the file at `path` (opened anew: a lock of its own), exclusively or
// shared. The fd holding the lock, or -1 with `err` (EADDRINUSE when it is held).
int lock_port(const std::string& path, uint16_t port, bool exclusive, int& err) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        err = errno;
        return -1;
    }
    // Whatever the umask, every user's processes must be able to lock it.
    ::fchmod(fd, 0666);
    struct flock fl {};
    fl.l_type = exclusive ? F_WRLCK : F_RDLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = port;
    fl.l_len = 1;
    int rc;
    do rc = ::fcntl(fd, F_OFD_SETLK, &fl);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        err = (errno == EAGAIN || errno == EACCES) ? EADDRINUSE : errno;
        ::close(fd);
        return -1;
    }
    return fd;
}

}  // namespace

std::unique_ptr<PortClaim> PortTable::claim(uint32_t ip, uint16_t port, int& err) const {
    if (port == 0) {
        err = EINVAL;
        return nullptr;
    }
    // The any-address claim takes the port's byte in the space's file exclusively; a claim
    // for one address takes it shared (so it conflicts with an any-address claim, not with
    // other addresses) and the byte in that address's own file exclusively.
    const int any_fd = lock_port(path_, port, ip == 0, err);
    if (any_fd < 0) return nullptr;
    int addr_fd = -1;
    if (ip != 0) {
        char suffix[24];
        std::snprintf(suffix, sizeof suffix, ".%u.%u.%u.%u", ip >> 24, (ip >> 16) & 0xff,
                      (ip >> 8) & 0xff, ip & 0xff);
        addr_fd = lock_port(path_ + suffix, port, true, err);
        if (addr_fd < 0) {
            ::close(any_fd);
            return nullptr;
        }
    }
    return std::unique_ptr<PortClaim>(new PortClaim(any_fd, addr_fd, port));
}

std::unique_ptr<PortClaim> PortTable::claim_ephemeral(uint32_t ip, int& err) const {
    constexpr uint32_t kRange = kEphemeralLast - kEphemeralFirst + 1;
    // A random start and a stride prime to the range's size visit every port of it once.
    const uint64_t r = random_u64();
    const uint32_t start = static_cast<uint32_t>(r % kRange);
    uint32_t stride = static_cast<uint32_t>((r >> 32) % kRange) | 1u;
    while (std::gcd(stride, kRange) != 1) stride += 2;
    for (uint32_t i = 0; i < kRange; ++i) {
        const auto port = static_cast<uint16_t>(kEphemeralFirst + (start + i * stride) % kRange);
        auto c = claim(ip, port, err);
        if (c) return c;
        if (err != EADDRINUSE) return nullptr;
    }
    err = EADDRNOTAVAIL;
    return nullptr;
}

PortClaim::~PortClaim() {
    // Closing drops the locks.
    if (addr_fd_ >= 0) ::close(addr_fd_);
    ::close(fd_);
}

}  // namespace uroce::transport::cm
