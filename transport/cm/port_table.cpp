#include "transport/cm/port_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <numeric>

#include "transport/random_source.h"

namespace uroce::transport::cm {

std::unique_ptr<PortClaim> PortTable::claim(uint16_t port, int& err) const {
    if (port == 0) {
        err = EINVAL;
        return nullptr;
    }
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        err = errno;
        return nullptr;
    }
    // Whatever the umask, every user's processes must be able to lock it.
    ::fchmod(fd, 0666);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = port;
    fl.l_len = 1;
    int rc;
    do rc = ::fcntl(fd, F_OFD_SETLK, &fl);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        err = (errno == EAGAIN || errno == EACCES) ? EADDRINUSE : errno;
        ::close(fd);
        return nullptr;
    }
    return std::unique_ptr<PortClaim>(new PortClaim(fd, port));
}

std::unique_ptr<PortClaim> PortTable::claim_ephemeral(int& err) const {
    constexpr uint32_t kRange = kEphemeralLast - kEphemeralFirst + 1;
    // A random start and a stride prime to the range's size visit every port of it once.
    const uint64_t r = random_u64();
    const uint32_t start = static_cast<uint32_t>(r % kRange);
    uint32_t stride = static_cast<uint32_t>((r >> 32) % kRange) | 1u;
    while (std::gcd(stride, kRange) != 1) stride += 2;
    for (uint32_t i = 0; i < kRange; ++i) {
        const auto port = static_cast<uint16_t>(kEphemeralFirst + (start + i * stride) % kRange);
        auto c = claim(port, err);
        if (c) return c;
        if (err != EADDRINUSE) return nullptr;
    }
    err = EADDRNOTAVAIL;
    return nullptr;
}

PortClaim::~PortClaim() {
    ::close(fd_);  // drops the lock
}

}  // namespace uroce::transport::cm
