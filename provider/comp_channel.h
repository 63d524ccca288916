// Completion channels without a kernel.
//
// libibverbs 44 implements the channel calls itself, on file descriptors, without asking the
// provider:
//   ibv_create_comp_channel   write(cmd_fd, {hdr command=17, u64 response}); the kernel would
//                             store the new channel's fd at `response`
//   ibv_get_cq_event          read(channel->fd, 8 bytes) -> {u64 cq_handle}, used as the
//                             struct ibv_cq *, then the provider's cq_event op
//   ibv_destroy_comp_channel  close(channel->fd)
// Only the first needs in-process help: our cmd_fd is a /dev/null-like node, so the write
// would "succeed" with a garbage fd. comp_channel_attach() redirects libibverbs' own import
// of write (its GOT slots; see got_patch.h) to a handler that answers command 17 for the
// cmd_fds registered here and passes every other write through.
//
// The channel fd is the read end of a pipe that carries the kernel's records themselves:
// 8 bytes {u64 cq_handle} per event, written by notify(). read, O_NONBLOCK, poll, epoll
// (an edge per record) and io_uring therefore behave as with the kernel, with no read or
// close hook. The provider keeps the write end and its own reading view of the pipe, a
// second open file description (reopened through /proc/self/fd) so its reads are
// non-blocking whatever the app sets on its fd. Because the provider always holds a reader,
// a write never raises SIGPIPE, even after the app closed its end.
//
// purge() (ibv_destroy_cq) takes the destroyed CQ's records back, as the kernel drops them
// from its event list: under the channel's lock (so no notify interleaves) it drains the
// pipe through its view, drops that CQ's records and writes the rest back in order. A
// reader blocked in read() meanwhile simply sleeps on until the write-back; one that races
// the drain takes the oldest record first, which is the order anyway; a non-blocking reader
// may see EAGAIN in between, and each record written back is a new edge for epoll.
// Records the app read are counted per CQ, so destroy can wait for their acknowledgement
// exactly as libibverbs waits for the kernel's count.
//
// A full pipe (8192 unread records by default) holds further records back in memory; they
// follow once the app reads (the cq_event op that ibv_get_cq_event calls, and every notify
// and purge, move them in). Without /proc the channel falls back to an AF_UNIX stream
// socketpair with per-call non-blocking I/O (a much smaller buffer, same behaviour).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include <pthread.h>

#pragma GCC visibility push(hidden)

namespace uroce::provider {

// Makes ibv_create_comp_channel work on a context's cmd_fd, once verbs_init_and_alloc_context
// has succeeded: installs the write hook (once per process) and registers cmd_fd. 0 on
// success. If that is impossible (see comp_channel_hook_install), says why in one stderr line
// (once per process) and puts a stand-in under the cmd_fd number whose write fails with
// EPERM (a sealed memfd; /dev/full and ENOSPC if memfds are unavailable) while ioctl still
// fails with ENOTTY: ibv_create_comp_channel then fails with that errno instead of returning
// a garbage fd, and everything else keeps working. Returns the reason.
[[nodiscard]] int comp_channel_attach(int cmd_fd) noexcept;

// Installs the interception of libibverbs' write, once per process; later calls return the
// first call's result. 0, or an errno: ENOENT (libibverbs or its import of write not found,
// e.g. an ioctl-only build), E2BIG (more import slots than got_patch records), ENOTSUP
// (unsupported architecture), ENOEXEC (unusable dynamic section), an mprotect errno (a
// sealed or otherwise unwritable GOT). On failure nothing is left patched.
[[nodiscard]] int comp_channel_hook_install() noexcept;

// A context registers its cmd_fd (comp_channel_attach does) and unregisters it in
// free_context before libibverbs closes it. The registry remembers the file behind the
// number, so a number the app closed and reused is never mistaken for a cmd_fd. On a
// registered cmd_fd, command 17 creates a channel; every other command fails with
// EOPNOTSUPP. Register: 0, EBADF or ENOMEM. Unregistering also drops channels whose fd
// libibverbs closed.
[[nodiscard]] int cmd_fd_register(int cmd_fd) noexcept;
void cmd_fd_unregister(int cmd_fd) noexcept;

// One completion channel. Shared by the registry (until its fd is found closed) and by every
// CQ attached to it; the provider's fds are closed when the last reference goes.
class CompChannel {
  public:
    enum class Kind { Pipe, SocketPair };

    // A new channel, not registered anywhere; the app's end is closed with the channel until
    // hand_out(). Kind::Pipe falls back to a socketpair if /proc is unusable. nullptr with
    // errno set on failure.
    static std::shared_ptr<CompChannel> create(Kind kind = Kind::Pipe) noexcept;
    ~CompChannel();
    CompChannel(const CompChannel&) = delete;
    CompChannel& operator=(const CompChannel&) = delete;

    // Writes one record {cq_handle} (the struct ibv_cq * as an integer) to the fd, behind
    // any held-back records. Thread-safe, never blocks, never raises SIGPIPE. A record is
    // dropped only if memory runs out (as the kernel drops an event on a failed allocation).
    void notify(uint64_t cq_handle) noexcept;

    // Takes back every record of cq_handle not yet read (its CQ is being destroyed) and
    // returns how many. With `taken`: also stores how many records of cq_handle the app has
    // read since its first notify (what libibverbs' comp_events_completed must reach), and
    // forgets the handle, whose address a later CQ may reuse.
    size_t purge(uint64_t cq_handle) noexcept;
    size_t purge(uint64_t cq_handle, uint64_t* taken) noexcept;

    // Moves held-back records into the fd as far as it has room. Cheap when none are held.
    void refill() noexcept;

    // The fd the app sees (channel->fd).
    int fd() const noexcept { return app_fd_; }
    Kind kind() const noexcept { return kind_; }

    // The app owns fd() from now on (libibverbs closes it): the channel never closes it.
    void hand_out() noexcept { handed_out_ = true; }

    // Records not yet read: in the fd plus held back.
    size_t pending() const noexcept;
    size_t held_back() const noexcept { return held_count_.load(std::memory_order_acquire); }

    // Whether `fd` refers to this channel's app end (false once the app closed the number,
    // even if it was reused).
    bool is_open_as(int fd) const noexcept;

  private:
    CompChannel() = default;
    ssize_t write_records(const uint64_t* records, size_t count) noexcept;
    size_t write_all(const uint64_t* records, size_t count) noexcept;
    size_t drain(uint64_t* out, size_t capacity) noexcept;
    void refill_locked() noexcept;  // needs mutex_

    Kind kind_ = Kind::Pipe;
    int app_fd_ = -1;     // the end the app reads; libibverbs closes it
    int view_fd_ = -1;    // the provider's non-blocking reading view of the same pipe/socket
    int writer_fd_ = -1;  // the end notify() writes
    bool handed_out_ = false;
    dev_t dev_ = 0;  // identity of the app's end
    ino_t ino_ = 0;
    mutable pthread_mutex_t mutex_ = PTHREAD_MUTEX_INITIALIZER;
    std::deque<uint64_t> held_;                      // guarded by mutex_
    std::atomic<size_t> held_count_{0};              // held_.size(), readable without the lock
    std::unordered_map<uint64_t, uint64_t> counts_;  // records accepted per handle; mutex_
    std::vector<uint64_t> scratch_;                  // purge's drain buffer; mutex_
};

// The channel behind an fd that came out of ibv_create_comp_channel (nullptr if none, or if
// that fd was closed).
std::shared_ptr<CompChannel> comp_channel_lookup(int fd) noexcept;

namespace detail {
// Answers one command written to a registered cmd_fd: len, or -1 with errno. For tests.
ssize_t handle_cmd_write(const void* buf, size_t len) noexcept;
// Drops channels whose app fd was closed and that no CQ holds; returns how many remain.
size_t sweep_channels() noexcept;
// What comp_channel_attach does when the hook cannot be had: the stand-in under cmd_fd and
// the stderr line (printed once per process). Returns the errno the stand-in's write gives.
int disable_channels(int cmd_fd, int reason) noexcept;
}  // namespace detail

}  // namespace uroce::provider

#pragma GCC visibility pop
