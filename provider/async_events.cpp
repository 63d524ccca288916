#include "provider/async_events.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace uroce::provider {

namespace {

// The record libibverbs' ibv_get_async_event reads: element, event type, reserved.
struct Record {
    uint64_t element;
    uint32_t event_type;
    uint32_t reserved;
};
static_assert(sizeof(Record) == 16);

}  // namespace

AsyncEventQueue::~AsyncEventQueue() {
    if (write_fd_ >= 0) ::close(write_fd_);
}

int AsyncEventQueue::open() {
    // SEQPACKET keeps records whole, and recv(MSG_DONTWAIT) lets retract() read the queue
    // without touching the O_NONBLOCK flag the application may have set on its end.
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return -1;
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    ::shutdown(read_fd_, SHUT_WR);
    return read_fd_;
}

void AsyncEventQueue::post(ibv_event_type type, uint64_t element, AsyncEventTally* tally) noexcept {
    const Record rec{element, static_cast<uint32_t>(type), 0};
    std::lock_guard lock(mutex_);
    if (::send(write_fd_, &rec, sizeof rec, MSG_DONTWAIT | MSG_NOSIGNAL) ==
            static_cast<ssize_t>(sizeof rec) &&
        tally)
        ++tally->queued;
}

void AsyncEventQueue::delivered(AsyncEventTally* tally) noexcept {
    if (!tally) return;
    {
        std::lock_guard lock(mutex_);
        ++tally->delivered;
    }
    settled_.notify_all();
}

void AsyncEventQueue::retract(uint64_t element, AsyncEventTally* tally) noexcept {
    std::unique_lock lock(mutex_);
    // Take every queued record out, put back those of other objects, in order.
    std::vector<Record> keep;
    for (int i = 0; i < 100000; ++i) {
        Record rec{};
        if (::recv(read_fd_, &rec, sizeof rec, MSG_DONTWAIT) != static_cast<ssize_t>(sizeof rec))
            break;
        if (rec.element == element && tally)
            ++tally->purged;
        else if (rec.element != element)
            keep.push_back(rec);
    }
    for (const Record& rec : keep)
        [[maybe_unused]] ssize_t n =
            ::send(write_fd_, &rec, sizeof rec, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (!tally) return;
    // A record another thread read a moment ago reaches delivered() shortly.
    settled_.wait(lock, [&] { return tally->queued == tally->purged + tally->delivered; });
}

void wait_for_acks(pthread_mutex_t* mutex, pthread_cond_t* cond, const uint32_t* completed,
                   uint32_t delivered) noexcept {
    pthread_mutex_lock(mutex);
    while (*completed != delivered) pthread_cond_wait(cond, mutex);
    pthread_mutex_unlock(mutex);
}

}  // namespace uroce::provider
