// A completion channel: a pipe that carries the kernel's 8-byte event records, plus the
// provider's non-blocking view of it for purge. See comp_channel.h for why it is built so.
#include "provider/comp_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
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

// Restores errno on scope exit: notify and purge run inside verbs calls and engine threads.
class KeepErrno {
  public:
    KeepErrno() noexcept : saved_(errno) {}
    ~KeepErrno() { errno = saved_; }
    KeepErrno(const KeepErrno&) = delete;
    KeepErrno& operator=(const KeepErrno&) = delete;

  private:
    int saved_;
};

void close_quietly(int fd) noexcept {
    if (fd >= 0) {
        const KeepErrno keep;
        close(fd);
    }
}

constexpr size_t kRecord = sizeof(uint64_t);
// Pipe writes up to PIPE_BUF are all-or-nothing, so a record is never split.
constexpr size_t kChunk = PIPE_BUF / kRecord;

// The provider's own reading view of a pipe's read end: a second open file description, so
// O_NONBLOCK here does not touch the app's. -1 if /proc is unusable.
int reopen_nonblocking(int fd) noexcept {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
}

struct Ends {
    int app = -1;
    int view = -1;
    int writer = -1;
    size_t capacity = 0;  // bytes the transport holds by default: purge's first buffer
    void close_all() noexcept {
        close_quietly(app);
        close_quietly(view);
        close_quietly(writer);
    }
};

bool open_pipe(Ends* ends) noexcept {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    ends->app = fds[0];
    ends->writer = fds[1];
    ends->view = reopen_nonblocking(fds[0]);
    const int size = fcntl(fds[0], F_GETPIPE_SZ);
    // The write end is a file description of its own: non-blocking there leaves the app's
    // end blocking, as a kernel channel fd starts.
    const int flags = fcntl(fds[1], F_GETFL);
    if (ends->view < 0 || size <= 0 || flags < 0 ||
        fcntl(fds[1], F_SETFL, flags | O_NONBLOCK) != 0) {
        ends->close_all();
        return false;
    }
    ends->capacity = static_cast<size_t>(size);
    return true;
}

bool open_socketpair(Ends* ends) noexcept {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return false;
    ends->app = fds[0];
    ends->writer = fds[1];
    // A duplicate shares the app's O_NONBLOCK, so every call passes MSG_DONTWAIT instead.
    ends->view = fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
    int sndbuf = 0;
    socklen_t len = sizeof sndbuf;
    if (ends->view < 0 || getsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) != 0 ||
        sndbuf <= 0) {
        ends->close_all();
        return false;
    }
    // A first guess; purge sizes its buffer by what is queued.
    ends->capacity = static_cast<size_t>(sndbuf) / 8;
    return true;
}

}  // namespace

std::shared_ptr<CompChannel> CompChannel::create(Kind kind) noexcept {
    Ends ends;
    if (kind == Kind::Pipe && !open_pipe(&ends)) kind = Kind::SocketPair;
    if (kind == Kind::SocketPair && !open_socketpair(&ends)) return nullptr;
    struct stat st {};
    if (fstat(ends.app, &st) != 0) {
        ends.close_all();
        return nullptr;
    }
    auto* channel = new (std::nothrow) CompChannel();
    if (channel == nullptr) {
        ends.close_all();
        errno = ENOMEM;
        return nullptr;
    }
    channel->kind_ = kind;
    channel->app_fd_ = ends.app;
    channel->view_fd_ = ends.view;
    channel->writer_fd_ = ends.writer;
    channel->dev_ = st.st_dev;
    channel->ino_ = st.st_ino;
    try {
        // Allocated now, so that purge, which must not fail, needs no memory later.
        channel->scratch_.resize(ends.capacity / kRecord + kChunk);
    } catch (...) {
        delete channel;  // closes the ends
        errno = ENOMEM;
        return nullptr;
    }
    try {
        return std::shared_ptr<CompChannel>(channel);
    } catch (...) {
        errno = ENOMEM;  // the shared_ptr constructor deleted the channel
        return nullptr;
    }
}

CompChannel::~CompChannel() {
    // Once handed out, the app's end is libibverbs' to close (and its number may be reused).
    if (!handed_out_) close_quietly(app_fd_);
    close_quietly(view_fd_);
    close_quietly(writer_fd_);
    pthread_mutex_destroy(&mutex_);
}

ssize_t CompChannel::write_records(const uint64_t* records, size_t count) noexcept {
    if (kind_ == Kind::Pipe) return write(writer_fd_, records, count * kRecord);
    return send(writer_fd_, records, count * kRecord, MSG_DONTWAIT | MSG_NOSIGNAL);
}

size_t CompChannel::write_all(const uint64_t* records, size_t count) noexcept {
    // Whole records only: chunks of at most PIPE_BUF bytes, then one record at a time once
    // a chunk no longer fits. Returns how many records went in.
    size_t done = 0;
    size_t chunk = kChunk;
    while (done < count) {
        const size_t n = std::min(chunk, count - done);
        const ssize_t wrote = write_records(records + done, n);
        if (wrote > 0) {
            // A socket may take part of a chunk; a pipe takes all of it or nothing.
            done += static_cast<size_t>(wrote) / kRecord;
            continue;
        }
        if (wrote < 0 && errno == EINTR) continue;
        if (chunk == 1) break;  // full (EAGAIN), or an error no retry mends
        chunk = 1;
    }
    return done;
}

size_t CompChannel::drain(uint64_t* out, size_t capacity) noexcept {
    // Nobody writes while mutex_ is held, so this ends: at most what the pipe holds.
    auto* bytes = reinterpret_cast<char*>(out);
    size_t have = 0;
    while (have < capacity * kRecord) {
        const size_t room = capacity * kRecord - have;
        const ssize_t got = kind_ == Kind::Pipe ? read(view_fd_, bytes + have, room)
                                                : recv(view_fd_, bytes + have, room, MSG_DONTWAIT);
        if (got > 0) {
            have += static_cast<size_t>(got);
        } else if (got < 0 && errno == EINTR) {
            continue;
        } else {
            break;  // empty (EAGAIN)
        }
    }
    // A tail shorter than a record can only come from an app that read odd sizes itself;
    // the stream is already broken then, and the fragment is dropped.
    return have / kRecord;
}

void CompChannel::notify(uint64_t cq_handle) noexcept {
    const KeepErrno keep;
    Lock lock(&mutex_);
    try {
        ++counts_[cq_handle];
    } catch (...) {
        return;  // out of memory: the event is lost, as the kernel loses it
    }
    if (held_.empty() && write_all(&cq_handle, 1) == 1) return;
    try {
        held_.push_back(cq_handle);  // behind what is already held: order is kept
    } catch (...) {
        --counts_[cq_handle];
        return;
    }
    held_count_.store(held_.size(), std::memory_order_release);
    refill_locked();
}

void CompChannel::refill() noexcept {
    if (held_count_.load(std::memory_order_acquire) == 0) return;
    const KeepErrno keep;
    Lock lock(&mutex_);
    refill_locked();
}

void CompChannel::refill_locked() noexcept {
    uint64_t chunk[kChunk];
    while (!held_.empty()) {
        const size_t n = std::min(held_.size(), kChunk);
        std::copy_n(held_.begin(), n, chunk);
        const size_t wrote = write_all(chunk, n);
        held_.erase(held_.begin(), held_.begin() + static_cast<ptrdiff_t>(wrote));
        if (wrote < n) break;
    }
    held_count_.store(held_.size(), std::memory_order_release);
}

size_t CompChannel::purge(uint64_t cq_handle) noexcept {
    return purge(cq_handle, nullptr);
}

size_t CompChannel::purge(uint64_t cq_handle, uint64_t* taken) noexcept {
    const KeepErrno keep;
    Lock lock(&mutex_);
    // Room for everything queued now (the app's reads only make it less; nobody adds while
    // mutex_ is held). The buffer made at create fits a default pipe; a pipe the app enlarged
    // (F_SETPIPE_SZ) or a socket may need more.
    int queued = 0;
    if (ioctl(view_fd_, FIONREAD, &queued) == 0 && queued > 0 &&
        static_cast<size_t>(queued) / kRecord + kChunk > scratch_.size()) {
        try {
            scratch_.resize(static_cast<size_t>(queued) / kRecord + kChunk);
        } catch (...) {
            // Out of memory: purge what fits; the rest stays queued and what is written back
            // goes behind it (out of order, but nothing of the CQ in what was drained).
        }
    }
    const size_t drained = drain(scratch_.data(), scratch_.size());
    const auto kept_end = std::remove(scratch_.data(), scratch_.data() + drained, cq_handle);
    const auto kept = static_cast<size_t>(kept_end - scratch_.data());
    size_t removed = drained - kept;
    // What came out fits back in; only if the app shrank the pipe meanwhile would some stay
    // behind, and those go first among the held-back records.
    const size_t back = write_all(scratch_.data(), kept);
    try {
        held_.insert(held_.begin(), scratch_.data() + back, scratch_.data() + kept);
    } catch (...) {
        // Out of memory as well: those records are lost, and no longer counted, so that
        // destroying their CQs waits for no acknowledgement that cannot come.
        for (size_t i = back; i < kept; ++i) {
            if (const auto lost = counts_.find(scratch_[i]); lost != counts_.end()) --lost->second;
        }
    }
    const size_t held_before = held_.size();
    held_.erase(std::remove(held_.begin(), held_.end(), cq_handle), held_.end());
    removed += held_before - held_.size();
    held_count_.store(held_.size(), std::memory_order_release);
    refill_locked();

    const auto it = counts_.find(cq_handle);
    if (taken != nullptr) *taken = it == counts_.end() ? 0 : it->second - removed;
    if (it != counts_.end()) counts_.erase(it);
    return removed;
}

size_t CompChannel::pending() const noexcept {
    const KeepErrno keep;
    Lock lock(&mutex_);
    int bytes = 0;
    if (ioctl(view_fd_, FIONREAD, &bytes) != 0 || bytes < 0) bytes = 0;
    return static_cast<size_t>(bytes) / kRecord + held_.size();
}

bool CompChannel::is_open_as(int fd) const noexcept {
    if (fd < 0) return false;
    const KeepErrno keep;
    struct stat st {};
    return fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) &&
           st.st_dev == dev_ && st.st_ino == ino_;
}

}  // namespace uroce::provider
