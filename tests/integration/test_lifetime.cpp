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
#include <vector>

#include "tests/integration/scenario.h"
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
    REQUIRE(wc[0].status == IBV_WC_REM_ACCESS_ERR);
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
    // In a process of its own: if destroy did not wait, acknowledging the event would touch a
    // freed QP (its mutex), which can hang instead of failing.
    const bool passed = scenario_passes([] {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer src(a.pd, 4096, kAll);
        raise_access_error(a, b, src);
        ibv_async_event ev = read_event(b.ctx, IBV_EVENT_QP_ACCESS_ERR);
        int failures = expect(ev.element.qp == b.qp, "the event names b's QP");
        std::atomic<bool> destroyed{false};
        std::thread destroyer([&] {
            failures += expect(ibv_destroy_qp(b.qp) == 0, "destroy_qp returns 0");
            destroyed = true;
        });
        // The event still names the QP: it must stay valid until acknowledged.
        std::this_thread::sleep_for(200ms);
        failures += expect(!destroyed.load(), "destroy_qp still waits for the acknowledgement");
        failures += expect(ev.element.qp->qp_num != 0, "the QP is still there");
        ibv_ack_async_event(&ev);
        for (int i = 0; i < 1000 && !destroyed.load(); ++i) std::this_thread::sleep_for(10ms);
        failures += expect(destroyed.load(), "destroy_qp returned after the acknowledgement");
        if (!destroyed.load()) {
            destroyer.detach();  // stuck: the process ends without waiting for it
            return failures;
        }
        destroyer.join();
        b.qp = nullptr;
        return failures;
    });
    CHECK(passed);
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

TEST_CASE("closing a context with its objects still open and traffic in flight", "[lifetime]") {
    // The application closes b's context without destroying its QP, CQ, MR or PD, while a
    // WRITEs into b and b READs from a. As with a kernel provider, the context takes its
    // objects with it (under ASan, LeakSanitizer reports any it forgets), nothing touches
    // them afterwards, and a's requests all complete: a WRITE reported successful put its
    // bytes in b's memory, the rest fail; none is left hanging.
    constexpr size_t kLen = 1 << 16;
    constexpr int kWrites = 16;
    for (int round = 0; round < 5; ++round) {
        QpOptions opt;
        opt.timeout = 8;
        opt.retry_cnt = 2;
        Endpoint a(devices().a, opt);
        auto b = std::make_unique<Endpoint>(devices().b, opt);
        connect(a, *b, opt);
        Buffer abuf(a.pd, kLen * kWrites, kAll);
        fill_pattern(abuf.bytes.data(), abuf.bytes.size(), 100 + round);
        // b's buffer memory stays with the test; its registration goes with the context.
        auto bbuf = std::make_unique<Buffer>(b->pd, kLen * kWrites, kAll);
        std::vector<uint8_t> reads(kLen * kWrites);
        ibv_mr* read_mr = ibv_reg_mr(b->pd, reads.data(), reads.size(), kAll);
        REQUIRE(read_mr);
        for (int i = 0; i < kWrites; ++i) {
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, abuf, i * kLen, kLen,
                              bbuf->addr() + i * kLen, bbuf->mr->rkey, i) == 0);
            ibv_sge sge{reinterpret_cast<uint64_t>(reads.data()) + i * kLen,
                        static_cast<uint32_t>(kLen), read_mr->lkey};
            ibv_send_wr wr{};
            ibv_send_wr* bad = nullptr;
            wr.wr_id = 100 + i;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_RDMA_READ;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.rdma.remote_addr = abuf.addr() + i * kLen;
            wr.wr.rdma.rkey = abuf.mr->rkey;
            REQUIRE(ibv_post_send(b->qp, &wr, &bad) == 0);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(300 * round));
        REQUIRE(ibv_close_device(b->ctx) == 0);
        // Everything of b's is gone with its context: the fixture must not free it again.
        bbuf->mr = nullptr;
        b->qp = nullptr;
        b->cq = nullptr;
        b->pd = nullptr;
        b->ctx = nullptr;
        b.reset();

        const auto wcs = wait_completions(a.cq, kWrites);
        REQUIRE(wcs.size() == kWrites);
        bool failed = false;
        for (const ibv_wc& wc : wcs) {
            if (wc.status != IBV_WC_SUCCESS) {
                failed = true;
                continue;
            }
            CHECK_FALSE(failed);  // in order: no success after a failure
            const size_t off = wc.wr_id * kLen;
            CHECK(std::memcmp(bbuf->bytes.data() + off, abuf.bytes.data() + off, kLen) == 0);
        }
        // The device is usable again at once: a new context on it talks to a.
        Endpoint c(devices().b);
        Endpoint d(devices().a);
        connect(d, c);
        Buffer dbuf(d.pd, 4096, kAll), cbuf(c.pd, 4096, kAll);
        fill_pattern(dbuf.bytes.data(), dbuf.bytes.size(), 7 + round);
        REQUIRE(post_rdma(d.qp, IBV_WR_RDMA_WRITE, dbuf, 0, 4096, cbuf.addr(), cbuf.mr->rkey, 1) ==
                0);
        const auto done = wait_completions(d.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].status == IBV_WC_SUCCESS);
        CHECK(cbuf.bytes == dbuf.bytes);
    }
}
