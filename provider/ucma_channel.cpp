#include "provider/ucma_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <new>

namespace uroce::provider::ucma {
namespace {
// librdmacm's RDMA_CM_EVENT_CONNECT_REQUEST (rdma_cma.h, not included here).
constexpr uint32_t kConnectRequest = 4;
}  // namespace

std::shared_ptr<Channel> Channel::create() {
    const int fd = eventfd(0, EFD_CLOEXEC);
    if (fd < 0) return nullptr;
    std::shared_ptr<Channel> ch(new (std::nothrow) Channel());
    if (!ch) {
        ::close(fd);
        errno = ENOMEM;
        return nullptr;
    }
    ch->fd_ = fd;
    return ch;
}

Channel::~Channel() = default;  // the fd is the application's: closed by its close()

void Channel::update_readable_locked() {
    const bool want = !queue_.empty();
    if (want == readable_) return;
    // The counter only goes 0 -> 1 -> 0 here, so neither call can block; an application
    // that read the fd itself (librdmacm does not) only makes the read below find 0.
    uint64_t v = 1;
    if (want) {
        [[maybe_unused]] ssize_t n = ::write(fd_, &v, sizeof v);
    } else {
        const int saved = errno;
        [[maybe_unused]] ssize_t n = ::read(fd_, &v, sizeof v);
        errno = saved;
    }
    readable_ = want;
}

void Channel::push(const rdma_ucm_event_resp& ev, uint32_t counted_for) {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    try {
        queue_.push_back(Pending{ev, counted_for});
    } catch (...) {
        return;  // out of memory: the event is lost, as an overflowing kernel queue's
    }
    update_readable_locked();
    cv_.notify_one();
}

int Channel::pop(rdma_ucm_event_resp& out, bool nonblocking) {
    std::unique_lock lock(mutex_);
    if (closed_) return EBADF;
    // A thread that waits while another closes the channel goes on waiting, as in a
    // kernel's rdma_cm file (the waiting write keeps the file open): applications such as
    // rping leave their event thread blocked there and exit.
    if (!nonblocking) cv_.wait(lock, [&] { return !queue_.empty(); });
    if (queue_.empty()) return EAGAIN;
    out = queue_.front().ev;
    ++reported_[queue_.front().counted_for];
    queue_.pop_front();
    update_readable_locked();
    return 0;
}

Channel::Purged Channel::purge(uint32_t id) {
    std::lock_guard lock(mutex_);
    Purged p;
    for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->counted_for == id || it->ev.id == id) {
            if (it->ev.event == kConnectRequest && it->counted_for == id)
                p.orphan_requests.push_back(it->ev.id);
            it = queue_.erase(it);
        } else {
            ++it;
        }
    }
    if (auto it = reported_.find(id); it != reported_.end()) {
        p.reported = it->second;
        reported_.erase(it);
    }
    update_readable_locked();
    return p;
}

Channel::Moved Channel::move_to(Channel& to, uint32_t id) {
    std::deque<Pending> moving;
    Moved moved;
    {
        std::lock_guard lock(mutex_);
        for (auto it = queue_.begin(); it != queue_.end();) {
            if (it->counted_for == id) {
                if (it->ev.event == kConnectRequest) moved.requests.push_back(it->ev.id);
                moving.push_back(*it);
                it = queue_.erase(it);
            } else {
                ++it;
            }
        }
        if (auto it = reported_.find(id); it != reported_.end()) {
            moved.reported = it->second;
            reported_.erase(it);
        }
        update_readable_locked();
    }
    std::lock_guard lock(to.mutex_);
    to.reported_[id] += moved.reported;
    for (auto& p : moving) to.queue_.push_back(p);
    to.update_readable_locked();
    to.cv_.notify_all();
    return moved;
}

void Channel::close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    queue_.clear();
}

}  // namespace uroce::provider::ucma
