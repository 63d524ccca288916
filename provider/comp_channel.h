// Completion channels without a kernel.
//
// libibverbs 44 implements the channel calls itself, on file descriptors, without asking the
// provider:
//   ibv_create_comp_channel   write(cmd_fd, {hdr command=17, u64 response}); the kernel would
//                             store the new channel's fd at `response`
//   ibv_get_cq_event          read(channel->fd, 8 bytes) -> {u64 cq_handle}, used as the
//                             struct ibv_cq *, then the provider's cq_event op
//   ibv_destroy_comp_channel  close(channel->fd)
// Our cmd_fd is a /dev/null-like node, so the write would "succeed" with a garbage fd.
// comp_channel_hook_install() therefore redirects libibverbs' own imports of write, read
// (and __read_chk) and close (its GOT slots; see got_patch.h) to handlers that serve these
// three calls in-process for the fds registered here and pass every other fd through to
// whatever the slot called before (libc, or an interposer such as ASan's).
//
// The channel fd is one end of an AF_UNIX socketpair that only carries readiness: it holds
// one byte per queued event, so poll/epoll see it readable exactly while events are queued
// and an edge-triggered epoll gets an edge per event, as with the kernel. The events
// themselves live in provider memory, so purge() can take back the events of a destroyed
// CQ (a byte in a pipe could not be taken back, and libibverbs would dereference the freed
// CQ). A blocking read waits in recv(MSG_PEEK) on the socket, so the file's O_NONBLOCK flag
// (fcntl, as UCX sets it) gives EAGAIN, and a signal gives EINTR or restarts the wait
// exactly as the handler's SA_RESTART says, like a read of a kernel channel (qperf relies on
// SIGALRM interrupting it). The provider writes through its own end and reads through its
// own duplicate of the app's end, never through the app-visible fd number: if the app
// closes that number itself, nothing unrelated is written or read, and no SIGPIPE can occur.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>

#include <pthread.h>

#pragma GCC visibility push(hidden)

namespace uroce::provider {

// Installs the interception of libibverbs' write/read/close, once per process; later calls
// return the first call's result. 0, or an errno (ENOENT: libibverbs or one of its imports
// not found; ENOTSUP: unsupported architecture; an mprotect errno). On failure nothing is
// left patched and ibv_create_comp_channel would get a garbage fd: the provider must then
// make it fail cleanly, e.g. by handing libibverbs a cmd_fd on /dev/full (write -> ENOSPC,
// ioctl -> ENOTTY like /dev/null).
[[nodiscard]] int comp_channel_hook_install() noexcept;

// A context registers the cmd_fd libibverbs gave it once verbs_init_and_alloc_context has
// succeeded, and unregisters it in free_context before libibverbs closes it. (A close of a
// registered cmd_fd through libibverbs also unregisters it, so a reused fd number is never
// mistaken for a cmd_fd.) On a registered cmd_fd, command 17 creates a channel; every other
// command fails with EOPNOTSUPP. Register: 0 or ENOMEM.
[[nodiscard]] int cmd_fd_register(int cmd_fd) noexcept;
void cmd_fd_unregister(int cmd_fd) noexcept;

// One completion channel. Shared by the registry (until libibverbs closes its fd) and by
// every CQ attached to it; the fds are closed when the last reference goes.
class CompChannel {
  public:
    // A new channel, not registered anywhere. nullptr with errno set on failure.
    static std::shared_ptr<CompChannel> create() noexcept;
    ~CompChannel();
    CompChannel(const CompChannel&) = delete;
    CompChannel& operator=(const CompChannel&) = delete;

    // Queues one completion event for cq_handle (the struct ibv_cq * as an integer) and
    // makes the fd readable. Thread-safe, never blocks on the fd, never raises SIGPIPE. An
    // event is dropped only if memory runs out (as the kernel drops it on a failed
    // allocation) or after close().
    void notify(uint64_t cq_handle) noexcept;

    // Removes every queued event of cq_handle (its CQ is being destroyed) and returns how
    // many were removed.
    size_t purge(uint64_t cq_handle) noexcept;

    // The fd the app sees (channel->fd).
    int fd() const noexcept { return app_fd_; }

    // What a read of fd() returns: one 8-byte event {u64 cq_handle} into buf, in notify
    // order. Blocks while none is queued unless the file is O_NONBLOCK (-1, EAGAIN); -1 with
    // EINTR when a signal handler without SA_RESTART interrupts the wait; -1 with EINVAL
    // when len < 8. Returns 8.
    ssize_t read_event(void* buf, size_t len) noexcept;

    // Number of queued events.
    size_t pending() const noexcept;

    // Whether `fd` still refers to this channel's socket (false once the app closed the
    // number and it was reused).
    bool is_open_as(int fd) const noexcept;

    // The app-visible fd was closed: later notify() calls are ignored.
    void mark_closed() noexcept;

  private:
    CompChannel() = default;
    void consume_bytes(size_t count) noexcept;  // needs mutex_
    void trim_bytes() noexcept;                 // needs mutex_

    int app_fd_ = -1;     // the end the app polls; libibverbs closes it
    int reader_fd_ = -1;  // our duplicate of app_fd_: peeks and consumes readiness bytes
    int writer_fd_ = -1;  // the other end: notify() writes readiness bytes
    dev_t dev_ = 0;       // identity of the app's end
    ino_t ino_ = 0;
    mutable pthread_mutex_t mutex_ = PTHREAD_MUTEX_INITIALIZER;
    std::deque<uint64_t> events_;  // guarded by mutex_
    size_t bytes_ = 0;             // readiness bytes in the socket; guarded by mutex_
    bool closed_ = false;          // guarded by mutex_
};

// The channel behind an fd that came out of ibv_create_comp_channel (nullptr if none).
std::shared_ptr<CompChannel> comp_channel_lookup(int fd) noexcept;

namespace detail {
// The handlers the hooks run for registered fds, exposed for tests. handle_cmd_write answers
// one command written to a registered cmd_fd: len, or -1 with errno.
ssize_t handle_cmd_write(const void* buf, size_t len) noexcept;
}  // namespace detail

}  // namespace uroce::provider

#pragma GCC visibility pop
