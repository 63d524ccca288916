// CompChannel on its own: event order, purge, readiness, O_NONBLOCK, blocking and signals.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <unistd.h>

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

bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

void set_nonblocking(int fd) {
    const int flags = fcntl(fd, F_GETFL);
    REQUIRE(flags >= 0);
    REQUIRE(fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0);
}

// Reads one event; 0 if the read failed (errno says why).
uint64_t read_one(CompChannel& channel) {
    uint64_t handle = 0;
    if (channel.read_event(&handle, sizeof handle) != static_cast<ssize_t>(sizeof handle)) {
        return 0;
    }
    return handle;
}

// A reader thread blocked in read_event, with a bounded way to wait for it.
struct BlockedReader {
    explicit BlockedReader(CompChannel& channel)
        : thread([this, &channel] {
              uint64_t handle = 0;
              result = channel.read_event(&handle, sizeof handle);
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

TEST_CASE("events come out in notify order, one per read", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    REQUIRE(channel->fd() >= 0);
    CHECK_FALSE(readable(channel->fd()));
    channel->notify(0x1000);
    channel->notify(0x2000);
    channel->notify(0x1000);
    CHECK(channel->pending() == 3);
    CHECK(readable(channel->fd()));
    CHECK(read_one(*channel) == 0x1000);
    CHECK(read_one(*channel) == 0x2000);
    CHECK(readable(channel->fd()));
    CHECK(read_one(*channel) == 0x1000);
    CHECK_FALSE(readable(channel->fd()));
    CHECK(channel->pending() == 0);
}

TEST_CASE("a read shorter than an event is refused", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    channel->notify(7);
    uint32_t small = 0;
    errno = 0;
    CHECK(channel->read_event(&small, sizeof small) == -1);
    CHECK(errno == EINVAL);
    CHECK(channel->pending() == 1);
}

TEST_CASE("purge removes only that CQ's events", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    channel->notify(1);
    channel->notify(2);
    channel->notify(1);
    channel->notify(3);
    CHECK(channel->purge(1) == 2);
    CHECK(channel->purge(99) == 0);
    CHECK(readable(channel->fd()));
    CHECK(read_one(*channel) == 2);
    CHECK(read_one(*channel) == 3);
    CHECK_FALSE(readable(channel->fd()));

    channel->notify(4);
    CHECK(readable(channel->fd()));
    CHECK(channel->purge(4) == 1);
    CHECK_FALSE(readable(channel->fd()));  // nothing queued, nothing readable
    set_nonblocking(channel->fd());
    uint64_t handle = 0;
    CHECK(channel->read_event(&handle, sizeof handle) == -1);
    CHECK(errno == EAGAIN);
}

TEST_CASE("O_NONBLOCK set on the app's fd gives EAGAIN", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    set_nonblocking(channel->fd());
    uint64_t handle = 0;
    errno = 0;
    CHECK(channel->read_event(&handle, sizeof handle) == -1);
    CHECK(errno == EAGAIN);
    channel->notify(5);
    CHECK(read_one(*channel) == 5);
}

TEST_CASE("epoll sees the fd readable exactly while events are queued", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
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
    channel->notify(11);                      // a second event is a new edge, as in the kernel
    CHECK(epoll_wait(edge, out, 2, 0) == 1);
    CHECK(read_one(*channel) == 10);
    CHECK(epoll_wait(level, out, 2, 0) == 1);  // one still queued
    CHECK(read_one(*channel) == 11);
    CHECK(epoll_wait(level, out, 2, 0) == 0);
    close(level);
    close(edge);
}

TEST_CASE("a blocking read wakes when another thread notifies", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    BlockedReader reader(*channel);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
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
    auto channel = CompChannel::create();
    REQUIRE(channel);
    ScopedHandler handler(SIGUSR1, /*restart=*/false);
    BlockedReader reader(*channel);
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

TEST_CASE("a signal with SA_RESTART does not end a blocking read", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    ScopedHandler handler(SIGUSR1, /*restart=*/true);
    BlockedReader reader(*channel);
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

TEST_CASE("many threads notifying concurrently lose nothing", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    constexpr int kThreads = 8;
    constexpr int kPerThread = 2000;  // beyond what the socket buffer holds in bytes
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
        const uint64_t handle = read_one(*channel);
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

TEST_CASE("notify after the app closed its fd raises no SIGPIPE", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    sigset_t pipe_set;
    sigset_t old_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    REQUIRE(pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set) == 0);

    const int app_fd = channel->fd();
    close(app_fd);  // behind libibverbs' back
    CHECK_FALSE(channel->is_open_as(app_fd));
    channel->notify(1);
    channel->mark_closed();
    channel->notify(2);  // ignored once closed
    channel.reset();     // closes the provider's ends, not the (maybe reused) app number

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

TEST_CASE("the channel keeps working through its own duplicate", "[comp_channel]") {
    auto channel = CompChannel::create();
    REQUIRE(channel);
    CHECK(channel->is_open_as(channel->fd()));
    const int app_fd = channel->fd();
    channel->notify(9);
    close(app_fd);
    CHECK(channel->pending() == 1);
    CHECK(read_one(*channel) == 9);
}
