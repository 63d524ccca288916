// CompChannel on its own: the records its fd carries, purge, readiness, O_NONBLOCK, blocking
// reads and signals, io_uring, a full fd. Every case runs on both transports (the pipe, and the
// socketpair used when /proc is unusable).
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "provider/comp_channel.h"
#include "tests/unit/comp_channel/test_util.h"

using uroce::provider::CompChannel;
using uroce::test::ScopedHandler;
using uroce::test::wait_until;

namespace {

std::shared_ptr<CompChannel> make_channel() {
    const auto kind = GENERATE(CompChannel::Kind::Pipe, CompChannel::Kind::SocketPair);
    auto channel = CompChannel::create(kind);
    REQUIRE(channel);
    REQUIRE(channel->kind() == kind);  // the pipe must not have fallen back here
    REQUIRE(channel->fd() >= 0);
    return channel;
}

bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

void set_nonblocking(int fd, bool on) {
    const int flags = fcntl(fd, F_GETFL);
    REQUIRE(flags >= 0);
    REQUIRE(fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) == 0);
}

// One record read from the app's fd as ibv_get_cq_event reads it; 0 if the read failed
// (errno says why) or was short.
uint64_t read_one(int fd) {
    uint64_t handle = 0;
    if (read(fd, &handle, sizeof handle) != static_cast<ssize_t>(sizeof handle)) return 0;
    return handle;
}

// A reader thread blocked in read() on the app's fd, with a bounded way to wait for it.
struct BlockedReader {
    explicit BlockedReader(int fd)
        : thread([this, fd] {
              uint64_t handle = 0;
              result = read(fd, &handle, sizeof handle);
              error = errno;
              value = handle;
              done = true;
          }) {}
    std::atomic<bool> done{false};
    ssize_t result = 0;
    int error = 0;
    uint64_t value = 0;
    std::thread thread;
};

}  // namespace

TEST_CASE("records come out of the fd in notify order, 8 bytes each", "[comp_channel]") {
    auto channel = make_channel();
    const int fd = channel->fd();
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);  // blocking, as a kernel channel starts
    CHECK_FALSE(readable(fd));
    channel->notify(0x1000);
    channel->notify(0x2000);
    channel->notify(0x1000);
    CHECK(channel->pending() == 3);
    CHECK(readable(fd));
    CHECK(read_one(fd) == 0x1000);
    CHECK(read_one(fd) == 0x2000);
    CHECK(readable(fd));
    CHECK(read_one(fd) == 0x1000);
    CHECK_FALSE(readable(fd));
    CHECK(channel->pending() == 0);
}

TEST_CASE("purge removes only that CQ's records and counts what was read", "[comp_channel]") {
    auto channel = make_channel();
    const int fd = channel->fd();
    channel->notify(1);
    channel->notify(2);
    channel->notify(1);
    channel->notify(3);
    channel->notify(1);
    CHECK(read_one(fd) == 1);  // one of CQ 1's records is already with the app
    uint64_t taken = 99;
    CHECK(channel->purge(1, &taken) == 2);
    CHECK(taken == 1);
    CHECK(channel->purge(99, &taken) == 0);
    CHECK(taken == 0);
    CHECK(readable(fd));
    CHECK(read_one(fd) == 2);
    CHECK(read_one(fd) == 3);
    CHECK_FALSE(readable(fd));

    // The handle is forgotten: a new CQ at the same address starts from zero.
    channel->notify(1);
    CHECK(channel->purge(1, &taken) == 1);
    CHECK(taken == 0);
    CHECK_FALSE(readable(fd));  // nothing queued, nothing readable
    set_nonblocking(fd, true);
    uint64_t handle = 0;
    errno = 0;
    CHECK(read(fd, &handle, sizeof handle) == -1);
    CHECK(errno == EAGAIN);
}

TEST_CASE("purge does not block on an empty, blocking fd", "[comp_channel]") {
    auto channel = make_channel();
    std::atomic<bool> done{false};
    std::thread purger([&] {
        channel->purge(5);
        done = true;
    });
    const bool returned = wait_until([&] { return done.load(); });
    if (!returned) channel->notify(0);  // unblock it before failing
    purger.join();
    CHECK(returned);
}

TEST_CASE("O_NONBLOCK set on the app's fd gives EAGAIN", "[comp_channel]") {
    auto channel = make_channel();
    set_nonblocking(channel->fd(), true);
    uint64_t handle = 0;
    errno = 0;
    CHECK(read(channel->fd(), &handle, sizeof handle) == -1);
    CHECK(errno == EAGAIN);
    channel->notify(5);
    CHECK(read_one(channel->fd()) == 5);
}

TEST_CASE("epoll sees the fd readable while records are queued, an edge per record",
          "[comp_channel]") {
    auto channel = make_channel();
    const int level = epoll_create1(EPOLL_CLOEXEC);
    const int edge = epoll_create1(EPOLL_CLOEXEC);
    REQUIRE(level >= 0);
    REQUIRE(edge >= 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    REQUIRE(epoll_ctl(level, EPOLL_CTL_ADD, channel->fd(), &ev) == 0);
    ev.events = EPOLLIN | EPOLLET;
    REQUIRE(epoll_ctl(edge, EPOLL_CTL_ADD, channel->fd(), &ev) == 0);
    epoll_event out[2];

    CHECK(epoll_wait(level, out, 2, 0) == 0);
    channel->notify(10);
    CHECK(epoll_wait(level, out, 2, 0) == 1);
    CHECK(epoll_wait(edge, out, 2, 0) == 1);
    CHECK(epoll_wait(edge, out, 2, 0) == 0);  // edge consumed
    channel->notify(11);                      // a second record is a new edge, as in the kernel
    CHECK(epoll_wait(edge, out, 2, 0) == 1);
    channel->notify(12);
    CHECK(epoll_wait(edge, out, 2, 0) == 1);
    // Taking back another CQ's record rewrites the rest: an edge-triggered waiter that saw
    // EAGAIN during the rewrite gets a new edge.
    CHECK(channel->purge(11) == 1);
    CHECK(epoll_wait(edge, out, 2, 0) == 1);
    CHECK(read_one(channel->fd()) == 10);
    CHECK(epoll_wait(level, out, 2, 0) == 1);  // one still queued
    CHECK(read_one(channel->fd()) == 12);
    CHECK(epoll_wait(level, out, 2, 0) == 0);
    close(level);
    close(edge);
}

TEST_CASE("a blocking read wakes when another thread notifies", "[comp_channel]") {
    auto channel = make_channel();
    BlockedReader reader(channel->fd());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(reader.done);
    channel->purge(0xdead);  // a purge meanwhile neither wakes nor feeds the reader
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(reader.done);
    channel->notify(0xabc);
    const bool woke = wait_until([&] { return reader.done.load(); });
    if (!woke) channel->notify(0);  // unblock before failing
    reader.thread.join();
    CHECK(woke);
    CHECK(reader.result == 8);
    CHECK(reader.value == 0xabc);
}

TEST_CASE("a signal without SA_RESTART interrupts a blocking read with EINTR", "[comp_channel]") {
    auto channel = make_channel();
    ScopedHandler handler(SIGUSR1, /*restart=*/false);
    BlockedReader reader(channel->fd());
    // The first signals may land before the thread blocks; keep sending until it returns.
    const bool returned = wait_until([&] {
        if (!reader.done) pthread_kill(reader.thread.native_handle(), SIGUSR1);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return reader.done.load();
    });
    if (!returned) channel->notify(0);
    reader.thread.join();
    REQUIRE(returned);
    CHECK(reader.result == -1);
    CHECK(reader.error == EINTR);
    CHECK(channel->pending() == 0);
}

TEST_CASE("a signal with SA_RESTART does not end a blocking read", "[comp_channel][sa_restart]") {
    auto channel = make_channel();
    ScopedHandler handler(SIGUSR1, /*restart=*/true);
    BlockedReader reader(channel->fd());
    const int seen_before = uroce::test::g_signals_seen.load();
    for (int i = 0; i < 20 && !reader.done; ++i) {
        pthread_kill(reader.thread.native_handle(), SIGUSR1);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(uroce::test::g_signals_seen.load() > seen_before);
    CHECK_FALSE(reader.done);
    channel->notify(77);
    const bool woke = wait_until([&] { return reader.done.load(); });
    if (!woke) channel->notify(0);
    reader.thread.join();
    CHECK(woke);
    CHECK(reader.result == 8);
    CHECK(reader.value == 77);
}

TEST_CASE("a full fd holds records back in order until there is room", "[comp_channel]") {
    auto channel = make_channel();
    const int fd = channel->fd();
    // Far beyond what either transport holds (8192 records in a default pipe).
    constexpr uint64_t kCount = 20000;
    for (uint64_t i = 1; i <= kCount; ++i) channel->notify(i);
    const size_t held = channel->held_back();
    CHECK(held > 0);
    CHECK(channel->pending() == kCount);
    // CQ 7's record is in the fd, CQ kCount's is held back: purge finds both.
    uint64_t taken = 1;
    CHECK(channel->purge(7, &taken) == 1);
    CHECK(taken == 0);
    CHECK(channel->purge(kCount, &taken) == 1);
    set_nonblocking(fd, true);
    std::vector<uint64_t> received;
    for (int pass = 0; pass < 100000 && received.size() < kCount - 2; ++pass) {
        uint64_t handle = 0;
        if (read(fd, &handle, sizeof handle) == static_cast<ssize_t>(sizeof handle)) {
            received.push_back(handle);
        } else {
            // Empty: what ibv_get_cq_event's cq_event op does moves held records in.
            CHECK(errno == EAGAIN);
            channel->refill();
        }
    }
    std::vector<uint64_t> expected;
    for (uint64_t i = 1; i < kCount; ++i) {
        if (i != 7) expected.push_back(i);
    }
    CHECK(received == expected);
    CHECK(channel->held_back() == 0);
    CHECK(channel->pending() == 0);
}

TEST_CASE("many threads notifying concurrently lose nothing", "[comp_channel]") {
    auto channel = make_channel();
    constexpr int kThreads = 8;
    constexpr int kPerThread = 2000;  // 16000 records: more than the fd holds
    std::vector<std::thread> notifiers;
    for (int t = 0; t < kThreads; ++t) {
        notifiers.emplace_back([&channel, t] {
            for (int i = 0; i < kPerThread; ++i) {
                channel->notify((static_cast<uint64_t>(t + 1) << 32) | static_cast<uint32_t>(i));
            }
        });
    }
    std::map<uint64_t, uint32_t> next_index;  // per producer: FIFO order is kept
    int received = 0;
    bool in_order = true;
    bool stalled = false;
    while (received < kThreads * kPerThread) {
        pollfd p{channel->fd(), POLLIN, 0};
        if (poll(&p, 1, 5000) != 1) {
            stalled = true;
            break;
        }
        const uint64_t handle = read_one(channel->fd());
        channel->refill();  // as the cq_event op after each ibv_get_cq_event
        const uint64_t producer = handle >> 32;
        in_order = in_order && static_cast<uint32_t>(handle) == next_index[producer];
        next_index[producer] = static_cast<uint32_t>(handle) + 1;
        ++received;
    }
    for (auto& thread : notifiers) thread.join();
    CHECK_FALSE(stalled);
    CHECK(in_order);
    CHECK(received == kThreads * kPerThread);
    CHECK(channel->pending() == 0);
    CHECK_FALSE(readable(channel->fd()));
}

TEST_CASE("purge racing a reader keeps order and accounts for every record", "[comp_channel]") {
    auto channel = make_channel();
    const int fd = channel->fd();
    // Other CQs' records carry increasing handles; the purged CQ's handle is 1.
    constexpr uint64_t kPurged = 1;
    constexpr uint64_t kOthers = 4000;
    std::atomic<bool> finished{false};
    uint64_t purged_seen = 0;
    uint64_t others_seen = 0;
    bool in_order = true;
    // Non-blocking: a purge may take the record between poll and read.
    set_nonblocking(fd, true);
    std::thread reader([&] {
        uint64_t last = 1;
        while (!finished.load() || readable(fd) || channel->held_back() > 0) {
            channel->refill();  // as the cq_event op does after each ibv_get_cq_event
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, 10) != 1) continue;
            uint64_t handle = 0;
            if (read(fd, &handle, sizeof handle) != static_cast<ssize_t>(sizeof handle)) continue;
            if (handle == kPurged) {
                ++purged_seen;
            } else {
                in_order = in_order && handle > last;
                last = handle;
                ++others_seen;
            }
        }
    });
    uint64_t taken_total = 0;
    uint64_t removed_total = 0;
    uint64_t notified_purged = 0;
    for (uint64_t i = 2; i < kOthers + 2; ++i) {
        channel->notify(i);
        if (i % 3 == 0) {
            channel->notify(kPurged);
            ++notified_purged;
        }
        if (i % 50 == 0) {
            uint64_t taken = 0;
            removed_total += channel->purge(kPurged, &taken);
            taken_total += taken;
        }
        channel->refill();
    }
    uint64_t taken = 0;
    removed_total += channel->purge(kPurged, &taken);
    taken_total += taken;
    finished = true;
    reader.join();
    CHECK(in_order);
    CHECK(others_seen == kOthers);
    CHECK(purged_seen == taken_total);                      // every record read is counted
    CHECK(taken_total + removed_total == notified_purged);  // and every other one taken back
}

TEST_CASE("notify after the app closed its fd raises no SIGPIPE", "[comp_channel]") {
    auto channel = make_channel();
    sigset_t pipe_set;
    sigset_t old_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    REQUIRE(pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set) == 0);

    const int app_fd = channel->fd();
    channel->hand_out();
    close(app_fd);  // what ibv_destroy_comp_channel does
    CHECK_FALSE(channel->is_open_as(app_fd));
    channel->notify(1);  // a late event from a CQ still holding the channel
    channel->notify(2);
    CHECK(channel->purge(1) == 1);
    channel.reset();  // closes the provider's ends, not the (maybe reused) app number

    sigset_t pending;
    sigemptyset(&pending);
    REQUIRE(sigpending(&pending) == 0);
    const bool got_sigpipe = sigismember(&pending, SIGPIPE) == 1;
    if (got_sigpipe) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_set, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
    CHECK_FALSE(got_sigpipe);
}

TEST_CASE("the app's number is closed by the channel only until it is handed out",
          "[comp_channel]") {
    auto channel = make_channel();
    const int fd = channel->fd();
    CHECK(channel->is_open_as(fd));
    channel.reset();
    CHECK(fcntl(fd, F_GETFD) == -1);  // never handed out: closed with the channel

    channel = CompChannel::create();
    REQUIRE(channel);
    const int kept = channel->fd();
    channel->hand_out();
    channel.reset();
    CHECK(fcntl(kept, F_GETFD) != -1);  // libibverbs' to close
    close(kept);

    // A number closed and reused for another file is not the channel any more.
    channel = CompChannel::create();
    REQUIRE(channel);
    channel->hand_out();
    const int number = channel->fd();
    int other[2];
    REQUIRE(pipe2(other, O_CLOEXEC) == 0);
    REQUIRE(dup3(other[0], number, O_CLOEXEC) == number);
    CHECK_FALSE(channel->is_open_as(number));
    close(number);
    close(other[0]);
    close(other[1]);
}

namespace {

// The smallest io_uring: one ring, raw system calls (no liburing on the build host).
class Ring {
  public:
    Ring() {
        io_uring_params params{};
        fd_ = static_cast<int>(syscall(__NR_io_uring_setup, 4, &params));
        if (fd_ < 0) return;
        sq_size_ = params.sq_off.array + params.sq_entries * sizeof(uint32_t);
        cq_size_ = params.cq_off.cqes + params.cq_entries * sizeof(io_uring_cqe);
        const size_t ring_size = std::max(sq_size_, cq_size_);  // IORING_FEAT_SINGLE_MMAP
        if ((params.features & IORING_FEAT_SINGLE_MMAP) == 0) return;
        ring_ = mmap(nullptr, ring_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                     IORING_OFF_SQ_RING);
        sqes_ = mmap(nullptr, params.sq_entries * sizeof(io_uring_sqe), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
        if (ring_ == MAP_FAILED || sqes_ == MAP_FAILED) return;
        ring_size_ = ring_size;
        sqe_bytes_ = params.sq_entries * sizeof(io_uring_sqe);
        params_ = params;
        ok_ = true;
    }
    ~Ring() {
        if (ring_ != nullptr && ring_ != MAP_FAILED) munmap(ring_, ring_size_);
        if (sqes_ != nullptr && sqes_ != MAP_FAILED) munmap(sqes_, sqe_bytes_);
        if (fd_ >= 0) close(fd_);
    }
    Ring(const Ring&) = delete;
    Ring& operator=(const Ring&) = delete;
    bool ok() const { return ok_; }
    int fd() const { return fd_; }

    // Submits one read of `len` bytes from `fd` at the file's position.
    bool submit_read(int fd, void* buf, uint32_t len) {
        auto* sqe = static_cast<io_uring_sqe*>(sqes_);
        *sqe = io_uring_sqe{};
        sqe->opcode = IORING_OP_READ;
        sqe->fd = fd;
        sqe->addr = reinterpret_cast<uintptr_t>(buf);
        sqe->len = len;
        sqe->off = ~uint64_t{0};
        auto* tail = field<uint32_t>(params_.sq_off.tail);
        const uint32_t mask = *field<uint32_t>(params_.sq_off.ring_mask);
        field<uint32_t>(params_.sq_off.array)[*tail & mask] = 0;
        __atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
        return syscall(__NR_io_uring_enter, fd_, 1, 0, 0, nullptr, 0) == 1;
    }

    // The result of the next completion, if there is one.
    bool completion(int32_t* res) {
        auto* head = field<uint32_t>(params_.cq_off.head);
        const uint32_t tail =
            __atomic_load_n(field<uint32_t>(params_.cq_off.tail), __ATOMIC_ACQUIRE);
        if (*head == tail) return false;
        const uint32_t mask = *field<uint32_t>(params_.cq_off.ring_mask);
        *res = field<io_uring_cqe>(params_.cq_off.cqes)[*head & mask].res;
        __atomic_store_n(head, *head + 1, __ATOMIC_RELEASE);
        return true;
    }

  private:
    template <typename T>
    T* field(uint32_t offset) {
        return reinterpret_cast<T*>(static_cast<char*>(ring_) + offset);
    }
    int fd_ = -1;
    void* ring_ = nullptr;
    void* sqes_ = nullptr;
    size_t sq_size_ = 0;
    size_t cq_size_ = 0;
    size_t ring_size_ = 0;
    size_t sqe_bytes_ = 0;
    io_uring_params params_{};
    bool ok_ = false;
};

}  // namespace

TEST_CASE("an io_uring read of the fd completes with the next record", "[comp_channel]") {
    auto channel = make_channel();
    Ring ring;
    if (!ring.ok()) {
        WARN("io_uring unavailable here (" << strerror(errno) << "): case not run");
        return;
    }
    uint64_t record = 0;
    REQUIRE(ring.submit_read(channel->fd(), &record, sizeof record));
    int32_t res = 0;
    CHECK_FALSE(ring.completion(&res));  // nothing queued: the read waits
    channel->notify(0x51);
    channel->notify(0x52);
    pollfd p{ring.fd(), POLLIN, 0};
    REQUIRE(poll(&p, 1, 5000) == 1);  // the ring signals a completion
    REQUIRE(ring.completion(&res));
    CHECK(res == 8);
    CHECK(record == 0x51);
    CHECK(read_one(channel->fd()) == 0x52);
}
