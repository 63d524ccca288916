// A completion channel: an in-memory event queue plus a socketpair that carries readiness.
// See comp_channel.h for why it is built this way.
#include "provider/comp_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <new>

namespace uroce::provider {
namespace {

class Lock {
  public:
    explicit Lock(pthread_mutex_t* mutex) noexcept : mutex_(mutex) { pthread_mutex_lock(mutex_); }
    ~Lock() { pthread_mutex_unlock(mutex_); }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

  private:
    pthread_mutex_t* mutex_;
};

void close_quietly(int fd) noexcept {
    if (fd >= 0) {
        const int saved = errno;
        close(fd);
        errno = saved;
    }
}

// Reads and discards up to `count` bytes that are already in the socket; never blocks.
void discard_available(int fd, size_t count) noexcept {
    char sink[64];
    // Each pass removes at least one byte or stops; the bound only guards against surprises.
    for (size_t pass = 0; count > 0 && pass < 1024; ++pass) {
        const ssize_t got = recv(fd, sink, std::min(count, sizeof sink), MSG_DONTWAIT);
        if (got <= 0) break;
        count -= static_cast<size_t>(got);
    }
}

}  // namespace

std::shared_ptr<CompChannel> CompChannel::create() noexcept {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return nullptr;
    struct stat st {};
    const int reader = fcntl(pair[0], F_DUPFD_CLOEXEC, 0);
    if (reader < 0 || fstat(pair[0], &st) != 0) {
        close_quietly(reader);
        close_quietly(pair[0]);
        close_quietly(pair[1]);
        return nullptr;
    }
    auto* channel = new (std::nothrow) CompChannel();
    if (channel == nullptr) {
        close_quietly(reader);
        close_quietly(pair[0]);
        close_quietly(pair[1]);
        errno = ENOMEM;
        return nullptr;
    }
    channel->app_fd_ = pair[0];
    channel->writer_fd_ = pair[1];
    channel->reader_fd_ = reader;
    channel->dev_ = st.st_dev;
    channel->ino_ = st.st_ino;
    try {
        return std::shared_ptr<CompChannel>(channel);
    } catch (...) {
        // The shared_ptr constructor deleted the channel, which closed its fds.
        errno = ENOMEM;
        return nullptr;
    }
}

CompChannel::~CompChannel() {
    // The app's end belongs to libibverbs once the channel was handed out; close it here only
    // if nobody closed it (a channel that never reached the app, or one still open at exit),
    // and only if the number still is our socket.
    if (!closed_ && is_open_as(app_fd_)) close_quietly(app_fd_);
    close_quietly(reader_fd_);
    close_quietly(writer_fd_);
    pthread_mutex_destroy(&mutex_);
}

void CompChannel::notify(uint64_t cq_handle) noexcept {
    const int saved = errno;
    Lock lock(&mutex_);
    if (closed_) return;
    try {
        events_.push_back(cq_handle);
    } catch (...) {
        return;  // out of memory: the event is lost, as the kernel loses it
    }
    // One byte per event gives edge-triggered pollers an edge per event. When the socket
    // buffer is full the fd is readable anyway; only a fd that cannot be made readable at all
    // loses the event, so that a queued event always means a readable fd.
    static const char kByte = 0;
    if (send(writer_fd_, &kByte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) {
        ++bytes_;
    } else if (bytes_ == 0) {
        events_.pop_back();
    }
    errno = saved;
}

size_t CompChannel::purge(uint64_t cq_handle) noexcept {
    const int saved = errno;
    Lock lock(&mutex_);
    const size_t before = events_.size();
    events_.erase(std::remove(events_.begin(), events_.end(), cq_handle), events_.end());
    const size_t removed = before - events_.size();
    trim_bytes();
    errno = saved;
    return removed;
}

ssize_t CompChannel::read_event(void* buf, size_t len) noexcept {
    if (len < sizeof(uint64_t)) {
        errno = EINVAL;
        return -1;
    }
    // Every pass either returns or waits in recv() until a byte arrives; a byte arrives only
    // with an event, so the bound is never reached in practice.
    for (int pass = 0; pass < 1000000; ++pass) {
        {
            Lock lock(&mutex_);
            if (!events_.empty()) {
                const uint64_t handle = events_.front();
                events_.pop_front();
                trim_bytes();
                memcpy(buf, &handle, sizeof handle);
                return static_cast<ssize_t>(sizeof handle);
            }
            // Nothing queued means no byte should be in the socket; drop any stray one
            // (the app read the fd itself) so the wait below cannot spin.
            if (pass > 0) discard_available(reader_fd_, SIZE_MAX);
            bytes_ = 0;
        }
        // Wait for readiness without consuming it. The file's O_NONBLOCK and the signal
        // handler's SA_RESTART decide, as for any socket read, between waiting, EAGAIN and
        // EINTR.
        char peek;
        const ssize_t got = recv(reader_fd_, &peek, 1, MSG_PEEK);
        if (got < 0) return -1;
        if (got == 0) {  // cannot happen while this object holds the writing end
            errno = EIO;
            return -1;
        }
    }
    errno = EAGAIN;
    return -1;
}

size_t CompChannel::pending() const noexcept {
    Lock lock(&mutex_);
    return events_.size();
}

bool CompChannel::is_open_as(int fd) const noexcept {
    if (fd < 0) return false;
    const int saved = errno;
    struct stat st {};
    const bool same =
        fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev_ && st.st_ino == ino_;
    errno = saved;
    return same;
}

void CompChannel::mark_closed() noexcept {
    Lock lock(&mutex_);
    closed_ = true;
}

void CompChannel::consume_bytes(size_t count) noexcept {
    count = std::min(count, bytes_);
    discard_available(reader_fd_, count);
    bytes_ -= count;
}

void CompChannel::trim_bytes() noexcept {
    // Keep 1 <= bytes_ <= events_.size() while events are queued, and bytes_ == 0 otherwise.
    if (events_.empty()) {
        consume_bytes(bytes_);
    } else if (bytes_ > events_.size()) {
        consume_bytes(bytes_ - events_.size());
    }
}

}  // namespace uroce::provider
