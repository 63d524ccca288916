// Completion channels created through libibverbs' own ibv_create_comp_channel (which the
// provider answers in-process), completion events, and the asynchronous event fd.
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "tests/integration/scenario.h"
#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {
constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

bool readable(int fd, int ms) {
    return wait_readable(fd, std::chrono::milliseconds(ms));
}

// Bytes waiting in a channel fd: 8 per completion event (FIONREAD on the pipe).
int queued_bytes(int fd) {
    int bytes = -1;
    return ::ioctl(fd, FIONREAD, &bytes) == 0 ? bytes : -1;
}

// A QP whose send and receive CQ is `cq`, in INIT with one receive posted: flush() moves it
// to ERR, which completes that receive with IBV_WC_WR_FLUSH_ERR, one completion on `cq`
// (and an event if `cq` is armed). No peer needed.
struct FlushingQp {
    FlushingQp(ibv_pd* pd, ibv_cq* cq) : buf(std::make_unique<Buffer>(pd, 64, kAll)) {
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        qp = ibv_create_qp(pd, &init);
        REQUIRE(qp);
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        REQUIRE(ibv_modify_qp(
                    qp, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
        REQUIRE(post_recv_buf(qp, *buf, 0, 64, 1) == 0);
    }
    ~FlushingQp() {
        if (qp) ibv_destroy_qp(qp);
    }
    FlushingQp(const FlushingQp&) = delete;
    FlushingQp& operator=(const FlushingQp&) = delete;
    void flush() {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_ERR;
        REQUIRE(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0);
    }
    void destroy() {
        REQUIRE(ibv_destroy_qp(qp) == 0);
        qp = nullptr;
    }
    std::unique_ptr<Buffer> buf;
    ibv_qp* qp = nullptr;
};

// Runs ibv_destroy_cq on another thread; done_within() waits for it, bounded. A destroy
// that never returns is a failure, not a hang: the thread is left behind with its state.
class Destroyer {
  public:
    explicit Destroyer(ibv_cq* cq) : state_(std::make_shared<State>()) {
        thread_ = std::thread([state = state_, cq] {
            state->result = ibv_destroy_cq(cq);
            state->done = true;
        });
    }
    ~Destroyer() {
        if (state_->done.load())
            thread_.join();
        else
            thread_.detach();
    }
    Destroyer(const Destroyer&) = delete;
    Destroyer& operator=(const Destroyer&) = delete;
    bool done_within(std::chrono::milliseconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (!state_->done.load() && std::chrono::steady_clock::now() < end)
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return state_->done.load();
    }
    bool done() const { return state_->done.load(); }
    int result() const { return state_->result; }

  private:
    struct State {
        std::atomic<bool> done{false};
        int result = -1;
    };
    std::shared_ptr<State> state_;
    std::thread thread_;
};
}  // namespace

TEST_CASE("completion events arrive on a channel made by ibv_create_comp_channel", "[events]") {
    Endpoint a(devices().a, {}, true), b(devices().b, {}, true);
    connect(a, b);
    Buffer sbuf(a.pd, 4096, kAll), rbuf(b.pd, 4096, kAll);
    REQUIRE(a.channel->fd >= 0);
    REQUIRE(b.channel->fd != a.channel->fd);

    // Nothing armed, nothing pending: a non-blocking read says EAGAIN.
    const int flags = ::fcntl(b.channel->fd, F_GETFL);
    REQUIRE(::fcntl(b.channel->fd, F_SETFL, flags | O_NONBLOCK) == 0);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    errno = 0;
    CHECK(ibv_get_cq_event(b.channel, &ev_cq, &ev_ctx) == -1);
    CHECK(errno == EAGAIN);
    REQUIRE(::fcntl(b.channel->fd, F_SETFL, flags) == 0);

    for (int round = 0; round < 20; ++round) {
        REQUIRE(ibv_req_notify_cq(b.cq, 0) == 0);
        REQUIRE(post_recv_buf(b.qp, rbuf, 0, 4096, round) == 0);
        REQUIRE(post_send_msg(a.qp, sbuf, 0, 100, round) == 0);
        REQUIRE(get_cq_event_within(b.channel, &ev_cq, &ev_ctx) == 0);
        CHECK(ev_cq == b.cq);
        ibv_ack_cq_events(ev_cq, 1);
        auto wcs = wait_completions(b.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].wr_id == static_cast<uint64_t>(round));
        REQUIRE(wait_completions(a.cq, 1).size() == 1);
    }
    // Unarmed: a completion makes no event.
    REQUIRE(post_recv_buf(b.qp, rbuf, 0, 4096, 99) == 0);
    REQUIRE(post_send_msg(a.qp, sbuf, 0, 100, 99) == 0);
    REQUIRE(wait_completions(b.cq, 1).size() == 1);
    CHECK_FALSE(readable(b.channel->fd, 50));
}

TEST_CASE("solicited-only arming wakes only for solicited completions", "[events]") {
    Endpoint a(devices().a), b(devices().b, {}, true);
    connect(a, b);
    Buffer sbuf(a.pd, 4096, kAll), rbuf(b.pd, 4096, kAll);
    REQUIRE(ibv_req_notify_cq(b.cq, 1) == 0);
    REQUIRE(post_recv_buf(b.qp, rbuf, 0, 1024, 1) == 0);
    REQUIRE(post_recv_buf(b.qp, rbuf, 1024, 1024, 2) == 0);
    REQUIRE(post_send_msg(a.qp, sbuf, 0, 10, 1) == 0);
    REQUIRE(wait_completions(b.cq, 1).size() == 1);
    CHECK_FALSE(readable(b.channel->fd, 50));
    ibv_sge sge{sbuf.addr(), 10, sbuf.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SOLICITED | IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    REQUIRE(get_cq_event_within(b.channel, &ev_cq, &ev_ctx) == 0);
    CHECK(ev_cq == b.cq);
    ibv_ack_cq_events(ev_cq, 1);
}

TEST_CASE("a destroyed CQ's pending events never surface", "[events]") {
    ibv_context* ctx = open_device(devices().a);
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
    REQUIRE(ch);
    ibv_cq* cq1 = ibv_create_cq(ctx, 16, nullptr, ch, 0);
    ibv_cq* cq2 = ibv_create_cq(ctx, 16, nullptr, ch, 0);
    REQUIRE(cq1);
    REQUIRE(cq2);
    // A channel with CQs attached cannot go away.
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
    {
        ibv_pd* pd = ibv_alloc_pd(ctx);
        ibv_qp_init_attr init{};
        init.send_cq = cq1;
        init.recv_cq = cq2;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        ibv_qp* qp = ibv_create_qp(pd, &init);
        REQUIRE(qp);
        // Moving to ERR flushes a posted receive: a completion on cq2, and on cq1 after a
        // flushed send. Arm both first.
        REQUIRE(ibv_req_notify_cq(cq1, 0) == 0);
        REQUIRE(ibv_req_notify_cq(cq2, 0) == 0);
        auto bufp = std::make_unique<Buffer>(pd, 64, kAll);
        Buffer& buf = *bufp;
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        REQUIRE(ibv_modify_qp(
                    qp, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
        REQUIRE(post_recv_buf(qp, buf, 0, 64, 1) == 0);
        attr.qp_state = IBV_QPS_ERR;
        REQUIRE(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0);
        REQUIRE(post_send_msg(qp, buf, 0, 8, 2) == 0);
        REQUIRE(wait_readable(ch->fd, kEventLimit));
        REQUIRE(ibv_destroy_qp(qp) == 0);
        bufp.reset();
        ibv_dealloc_pd(pd);
    }
    // Both CQs have an event queued; cq1's is discarded with it.
    REQUIRE(ibv_destroy_cq(cq1) == 0);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    REQUIRE(get_cq_event_within(ch, &ev_cq, &ev_ctx) == 0);
    CHECK(ev_cq == cq2);
    ibv_ack_cq_events(ev_cq, 1);
    CHECK_FALSE(readable(ch->fd, 50));
    REQUIRE(ibv_destroy_cq(cq2) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
    ibv_close_device(ctx);
}

TEST_CASE("the asynchronous event fd is pollable and non-blocking on request", "[events]") {
    ibv_context* ctx = open_device(devices().a);
    REQUIRE(ctx->async_fd >= 0);
    const int flags = ::fcntl(ctx->async_fd, F_GETFL);
    REQUIRE(::fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
    CHECK_FALSE(readable(ctx->async_fd, 10));
    ibv_async_event ev{};
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &ev) == -1);
    CHECK(errno == EAGAIN);
    ibv_close_device(ctx);
}

TEST_CASE("a missing event fails its wait within the bound instead of hanging", "[events]") {
    Endpoint a(devices().a, {}, true), b(devices().b);
    connect(a, b);
    // Nothing armed, nothing posted: no completion event and no asynchronous event will come.
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    errno = 0;
    CHECK(get_cq_event_within(a.channel, &ev_cq, &ev_ctx, std::chrono::milliseconds(100)) == -1);
    CHECK(errno == ETIMEDOUT);
    ibv_async_event ev{};
    errno = 0;
    CHECK(get_async_event_within(a.ctx, &ev, std::chrono::milliseconds(100)) == -1);
    CHECK(errno == ETIMEDOUT);
    // The fds are left as they were: blocking.
    CHECK((::fcntl(a.channel->fd, F_GETFL) & O_NONBLOCK) == 0);
    CHECK((::fcntl(a.ctx->async_fd, F_GETFL) & O_NONBLOCK) == 0);

    // And an event that does come is read, with the fd blocking again afterwards.
    REQUIRE(ibv_req_notify_cq(a.cq, 0) == 0);
    Buffer sbuf(b.pd, 64, kAll), rbuf(a.pd, 64, kAll);
    REQUIRE(post_recv_buf(a.qp, rbuf, 0, 64, 1) == 0);
    REQUIRE(post_send_msg(b.qp, sbuf, 0, 64, 2) == 0);
    REQUIRE(get_cq_event_within(a.channel, &ev_cq, &ev_ctx) == 0);
    CHECK(ev_cq == a.cq);
    ibv_ack_cq_events(ev_cq, 1);
    CHECK((::fcntl(a.channel->fd, F_GETFL) & O_NONBLOCK) == 0);
    REQUIRE(wait_completions(a.cq, 1).size() == 1);
    REQUIRE(wait_completions(b.cq, 1).size() == 1);
}

// libibverbs' contract, as the kernel enforces it: ibv_destroy_cq returns only once every
// completion event ibv_get_cq_event handed out for the CQ was acknowledged.
TEST_CASE("destroy_cq waits until delivered completion events are acknowledged", "[events]") {
    // In a process of its own: if destroy did not wait, acknowledging the event would touch a
    // freed CQ (its mutex), which can hang instead of failing.
    const bool passed = scenario_passes([] {
        ibv_context* ctx = open_device(devices().a);
        ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
        ibv_cq* cq = ch ? ibv_create_cq(ctx, 16, nullptr, ch, 0) : nullptr;
        ibv_pd* pd = ibv_alloc_pd(ctx);
        if (expect(ch && cq && pd, "channel, CQ and PD created")) return 1;
        {
            FlushingQp q(pd, cq);
            REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
            q.flush();  // one completion, one event
            q.destroy();
        }
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        int failures = expect(get_cq_event_within(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq,
                              "the completion event for the CQ");
        std::atomic<bool> destroyed{false};
        std::thread destroyer([&] {
            failures += expect(ibv_destroy_cq(cq) == 0, "destroy_cq returns 0");
            destroyed = true;
        });
        // The event names the CQ: destroy must wait for its acknowledgement.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        failures += expect(!destroyed.load(), "destroy_cq still waits for the acknowledgement");
        ibv_ack_cq_events(ev_cq, 1);
        for (int i = 0; i < 1000 && !destroyed.load(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        failures += expect(destroyed.load(), "destroy_cq returned after the acknowledgement");
        if (!destroyed.load()) {
            destroyer.detach();  // stuck: the process ends without waiting for it
            return failures;
        }
        destroyer.join();
        ibv_dealloc_pd(pd);
        failures += expect(ibv_destroy_comp_channel(ch) == 0, "the channel is destroyed");
        ibv_close_device(ctx);
        return failures;
    });
    CHECK(passed);
}

// The channel fd is a real fd carrying the kernel's records: the application may wait with
// poll or edge-triggered epoll and read the 8-byte record {u64 cq_handle} itself.
TEST_CASE("a channel fd works with poll, epoll and the app's own non-blocking read",
          "[events][channel]") {
    Endpoint a(devices().a), b(devices().b, {}, true);
    connect(a, b);
    Buffer sbuf(a.pd, 4096, kAll), rbuf(b.pd, 4096, kAll);
    const int fd = b.channel->fd;
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    REQUIRE(ep >= 0);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    const int flags = ::fcntl(fd, F_GETFL);
    REQUIRE(::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0);
    epoll_event out{};
    CHECK(::epoll_wait(ep, &out, 1, 0) == 0);

    for (int round = 0; round < 5; ++round) {
        REQUIRE(ibv_req_notify_cq(b.cq, 0) == 0);
        REQUIRE(post_recv_buf(b.qp, rbuf, 0, 4096, round) == 0);
        REQUIRE(post_send_msg(a.qp, sbuf, 0, 100, round) == 0);
        REQUIRE(::epoll_wait(ep, &out, 1, static_cast<int>(kEventLimit.count())) == 1);
        CHECK((out.events & EPOLLIN) != 0);
        pollfd p{fd, POLLIN, 0};
        CHECK(::poll(&p, 1, 0) == 1);
        CHECK(queued_bytes(fd) == 8);
        uint64_t record = 0;
        REQUIRE(::read(fd, &record, sizeof record) == static_cast<ssize_t>(sizeof record));
        CHECK(record == reinterpret_cast<uintptr_t>(b.cq));
        errno = 0;
        CHECK(::read(fd, &record, sizeof record) == -1);  // drained: EAGAIN, as the kernel's
        CHECK(errno == EAGAIN);
        CHECK(::epoll_wait(ep, &out, 1, 0) == 0);  // no edge without a new record
        // Read by hand, acknowledged as usual: ibv_destroy_cq (in ~Endpoint) counts it.
        ibv_ack_cq_events(b.cq, 1);
        auto wcs = wait_completions(b.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].wr_id == static_cast<uint64_t>(round));
        REQUIRE(wait_completions(a.cq, 1).size() == 1);
    }
    ::close(ep);
}

TEST_CASE("several CQs share one channel, each event naming its CQ", "[events][channel]") {
    ibv_context* ctx = open_device(devices().a);
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
    REQUIRE(ch);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    REQUIRE(pd);
    constexpr int kCqs = 4;
    std::vector<ibv_cq*> cqs;
    for (int i = 0; i < kCqs; ++i) {
        cqs.push_back(ibv_create_cq(ctx, 16, reinterpret_cast<void*>(uintptr_t{100} + i), ch, 0));
        REQUIRE(cqs.back());
    }
    {
        std::vector<std::unique_ptr<FlushingQp>> qps;
        for (ibv_cq* cq : cqs) {
            qps.push_back(std::make_unique<FlushingQp>(pd, cq));
            REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
        }
        // Flushed in reverse order: the events come in that order, one per CQ.
        for (int i = kCqs - 1; i >= 0; --i) qps[static_cast<size_t>(i)]->flush();
        for (int i = kCqs - 1; i >= 0; --i) {
            ibv_cq* ev_cq = nullptr;
            void* ev_ctx = nullptr;
            REQUIRE(get_cq_event_within(ch, &ev_cq, &ev_ctx) == 0);
            CHECK(ev_cq == cqs[static_cast<size_t>(i)]);
            CHECK(ev_ctx == reinterpret_cast<void*>(uintptr_t{100} + i));
            ibv_ack_cq_events(ev_cq, 1);
            CHECK(wait_completions(ev_cq, 1).size() == 1);
        }
        CHECK_FALSE(readable(ch->fd, 50));  // armed once, one event each
    }
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
    for (ibv_cq* cq : cqs) REQUIRE(ibv_destroy_cq(cq) == 0);
    ibv_dealloc_pd(pd);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
    ibv_close_device(ctx);
}

// The kernel's rules: an event still queued is taken back with its CQ; one the application
// has read (by ibv_get_cq_event or by its own read) must be acknowledged first.
TEST_CASE("destroying CQs with events unread and events read but unacknowledged",
          "[events][channel]") {
    ibv_context* ctx = open_device(devices().a);
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
    REQUIRE(ch);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    REQUIRE(pd);
    ibv_cq* cq1 = ibv_create_cq(ctx, 16, nullptr, ch, 0);
    ibv_cq* cq2 = ibv_create_cq(ctx, 16, nullptr, ch, 0);
    ibv_cq* cq3 = ibv_create_cq(ctx, 16, nullptr, ch, 0);
    REQUIRE(cq1);
    REQUIRE(cq2);
    REQUIRE(cq3);
    {
        FlushingQp q1(pd, cq1), q2(pd, cq2), q3(pd, cq3);
        for (ibv_cq* cq : {cq1, cq2, cq3}) REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
        // One at a time, so that the records are queued as cq1, cq2, cq3.
        int expected = 0;
        for (FlushingQp* q : {&q1, &q2, &q3}) {
            q->flush();
            expected += 8;
            for (int i = 0; i < 1000 && queued_bytes(ch->fd) < expected; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            REQUIRE(queued_bytes(ch->fd) == expected);
        }
    }
    // cq1's record: read by the application itself, not acknowledged yet.
    uint64_t record = 0;
    REQUIRE(::read(ch->fd, &record, sizeof record) == static_cast<ssize_t>(sizeof record));
    REQUIRE(record == reinterpret_cast<uintptr_t>(cq1));

    // cq2's record is still queued: destroying cq2 takes it back and does not wait.
    {
        Destroyer destroy2(cq2);
        REQUIRE(destroy2.done_within(kEventLimit));
        CHECK(destroy2.result() == 0);
    }
    // cq1's was handed out: its destroy waits for the acknowledgement.
    {
        Destroyer destroy1(cq1);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        CHECK_FALSE(destroy1.done());
        ibv_ack_cq_events(cq1, 1);
        CHECK(destroy1.done_within(kEventLimit));
        CHECK(destroy1.result() == 0);
    }
    // cq3's record is next and nothing of cq2 surfaces.
    CHECK(queued_bytes(ch->fd) == 8);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    REQUIRE(get_cq_event_within(ch, &ev_cq, &ev_ctx) == 0);
    CHECK(ev_cq == cq3);
    CHECK_FALSE(readable(ch->fd, 50));
    // Unacknowledged when destroy starts; acknowledged from another thread meanwhile.
    {
        Destroyer destroy3(cq3);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK_FALSE(destroy3.done());
        ibv_ack_cq_events(ev_cq, 1);
        CHECK(destroy3.done_within(kEventLimit));
    }
    ibv_dealloc_pd(pd);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
    ibv_close_device(ctx);
}

// More events than the channel's pipe holds (8192 by default): the rest wait in the provider and
// follow as ibv_get_cq_event makes room, in order, none lost.
TEST_CASE("events beyond what the channel fd holds follow as they are read", "[events][channel]") {
    Endpoint a(devices().a), b(devices().b, {}, true);
    connect(a, b);
    Buffer sbuf(a.pd, 64, kAll), rbuf(b.pd, 64, kAll);
    const int capacity = ::fcntl(b.channel->fd, F_GETPIPE_SZ);  // 64 KiB unless limited
    REQUIRE(capacity > 0);
    const int kEvents = capacity / 8 + 300;
    for (int i = 0; i < kEvents; ++i) {
        REQUIRE(ibv_req_notify_cq(b.cq, 0) == 0);
        REQUIRE(post_recv_buf(b.qp, rbuf, 0, 64, static_cast<uint64_t>(i)) == 0);
        REQUIRE(post_send_msg(a.qp, sbuf, 0, 8, static_cast<uint64_t>(i)) == 0);
        REQUIRE(wait_completions(b.cq, 1).size() == 1);
        REQUIRE(wait_completions(a.cq, 1).size() == 1);
    }
    CHECK(queued_bytes(b.channel->fd) == capacity);  // full
    int events = 0;
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    while (events < kEvents &&
           get_cq_event_within(b.channel, &ev_cq, &ev_ctx, std::chrono::milliseconds(500)) == 0) {
        if (ev_cq != b.cq) break;
        ++events;
    }
    CHECK(events == kEvents);
    if (events > 0) ibv_ack_cq_events(b.cq, static_cast<unsigned>(events));
    CHECK_FALSE(readable(b.channel->fd, 50));
}
