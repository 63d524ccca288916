// Destroy is safe at any moment through the real libibverbs: with traffic in flight, with
// asynchronous events queued or being handled, with a peer reading and writing a region as it
// is deregistered. libibverbs' contract for async events holds: an event read by the
// application holds destroy until it is acknowledged, and an event not yet read is never
// handed out once its object is gone.
#include <poll.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;
using namespace std::chrono_literals;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

bool readable(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

// Makes b's QP raise IBV_EVENT_QP_ACCESS_ERR (a WRITE with a bad rkey) and waits until the
// event is readable on b's async fd.
void raise_access_error(Endpoint& a, Endpoint& b, Buffer& src) {
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, 0x1000, 0xbad, 1) == 0);
    auto wc = wait_completions(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_REM_ACCESS_ERR);
    REQUIRE(readable(b.ctx->async_fd, 5000));
}

// Reads async events of b until one for `type` arrives (COMM_EST may come first; those
// are acknowledged at once). Returns it unacknowledged.
ibv_async_event read_event(ibv_context* ctx, ibv_event_type type) {
    for (int i = 0; i < 8; ++i) {
        REQUIRE(readable(ctx->async_fd, 5000));
        ibv_async_event ev{};
        REQUIRE(ibv_get_async_event(ctx, &ev) == 0);
        if (ev.event_type == type) return ev;
        ibv_ack_async_event(&ev);
    }
    FAIL("no event of type " << type);
    return {};
}

}  // namespace

TEST_CASE("destroy_qp waits until a delivered async event is acknowledged", "[lifetime]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 4096, kAll);
    raise_access_error(a, b, src);
    ibv_async_event ev = read_event(b.ctx, IBV_EVENT_QP_ACCESS_ERR);
    CHECK(ev.element.qp == b.qp);

    std::atomic<bool> destroyed{false};
    std::thread destroyer([&] {
        CHECK(ibv_destroy_qp(b.qp) == 0);
        destroyed = true;
    });
    // The event still names the QP: it must stay valid until acknowledged.
    std::this_thread::sleep_for(200ms);
    CHECK_FALSE(destroyed.load());
    CHECK(ev.element.qp->qp_num != 0);  // readable memory (ASan would object otherwise)
    ibv_ack_async_event(&ev);
    for (int i = 0; i < 1000 && !destroyed.load(); ++i) std::this_thread::sleep_for(10ms);
    CHECK(destroyed.load());
    if (!destroyed.load())
        destroyer.detach();  // a failure, not a hang of the whole binary
    else
        destroyer.join();
    b.qp = nullptr;
}

TEST_CASE("an async event not yet read is never delivered after its QP is destroyed",
          "[lifetime]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 4096, kAll);
    raise_access_error(a, b, src);
    // Queued, unread: destroying takes it back and does not wait for it.
    REQUIRE(ibv_destroy_qp(b.qp) == 0);
    b.qp = nullptr;
    CHECK_FALSE(readable(b.ctx->async_fd, 100));
}

TEST_CASE("destroy_qp with traffic in flight in both directions", "[lifetime]") {
    for (int round = 0; round < 10; ++round) {
        QpOptions opt;
        opt.timeout = 8;
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer abuf(a.pd, 1 << 20, kAll), bbuf(b.pd, 1 << 20, kAll);
        for (int i = 0; i < 16; ++i) {
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, abuf, 0, 1 << 16, bbuf.addr(), bbuf.mr->rkey,
                              i) == 0);
            REQUIRE(post_rdma(b.qp, IBV_WR_RDMA_READ, bbuf, 0, 1 << 16, abuf.addr(), abuf.mr->rkey,
                              i) == 0);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
        // a's QP goes while a WRITEs and b READs from it; b's next.
        REQUIRE(ibv_destroy_qp(a.qp) == 0);
        a.qp = nullptr;
        REQUIRE(ibv_destroy_qp(b.qp) == 0);
        b.qp = nullptr;
    }
}

TEST_CASE("deregistering a region while a peer WRITEs to and READs from it", "[lifetime]") {
    for (int round = 0; round < 10; ++round) {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer abuf(a.pd, 1 << 20, kAll);
        // b's region is plain heap memory, freed right after deregistration: under ASan any
        // access after ibv_dereg_mr returned is reported.
        constexpr size_t kLen = 1 << 20;
        auto* mem = new uint8_t[kLen];
        std::memset(mem, 0x11, kLen);
        ibv_mr* mr = ibv_reg_mr(b.pd, mem, kLen, kAll);
        REQUIRE(mr);
        for (int i = 0; i < 32; ++i) {
            const auto op = i % 2 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
            REQUIRE(post_rdma(a.qp, op, abuf, 0, kLen / 4, reinterpret_cast<uint64_t>(mem),
                              mr->rkey, i) == 0);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(300 * round));
        REQUIRE(ibv_dereg_mr(mr) == 0);
        std::memset(mem, 0x22, kLen);
        delete[] mem;
        // Every request completes: successes for what ran before, then a remote access error
        // and flushes; none is left hanging.
        const auto wcs = wait_completions(a.cq, 32);
        CHECK(wcs.size() == 32);
        bool failed = false;
        for (const ibv_wc& wc : wcs) {
            if (wc.status != IBV_WC_SUCCESS) failed = true;
            // Once one failed, the QP is in ERR: nothing after it succeeds.
            if (failed) CHECK(wc.status != IBV_WC_SUCCESS);
        }
    }
}
