// Remote access is checked before any byte lands: bad keys, out-of-range addresses,
// missing rights and dead regions all end in a remote access error, both QPs in ERR, and
// the target memory (inside and around the region) unchanged.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr size_t kRegion = 64 * 1024;
constexpr size_t kGuard = 4096;

// A region with guard bytes on both sides, all filled with a known pattern.
struct GuardedTarget {
    std::vector<uint8_t> whole;
    ibv_mr* mr = nullptr;
    std::vector<uint8_t> before;
    GuardedTarget(ibv_pd* pd, int access) : whole(kRegion + 2 * kGuard) {
        fill_pattern(whole.data(), whole.size(), 99);
        mr = ibv_reg_mr(pd, whole.data() + kGuard, kRegion, access);
        REQUIRE(mr);
        before = whole;
    }
    ~GuardedTarget() {
        if (mr) ibv_dereg_mr(mr);
    }
    uint64_t addr() const { return reinterpret_cast<uint64_t>(whole.data() + kGuard); }
    bool unchanged() const { return whole == before; }
};

void expect_access_error(Endpoint& a, Endpoint& b) {
    auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_REM_ACCESS_ERR);
    CHECK(wcs[0].wr_id == 77);
    // The responder moved to ERR when it refused; the requester on the NAK.
    CHECK(a.state() == IBV_QPS_ERR);
    CHECK(b.state() == IBV_QPS_ERR);
}

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

}  // namespace

TEST_CASE("RDMA WRITE violations write nothing", "[access]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, kRegion + 4096, kAll);
    fill_pattern(src.bytes.data(), src.bytes.size(), 5);

    SECTION("unknown rkey") {
        GuardedTarget t(b.pd, kAll);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, t.addr(), t.mr->rkey + 0x100,
                          77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("lkey used as rkey") {
        GuardedTarget t(b.pd, kAll);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, t.addr(), t.mr->lkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("one byte past the end") {
        GuardedTarget t(b.pd, kAll);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, t.addr() + kRegion - 4095,
                          t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("one byte before the start") {
        GuardedTarget t(b.pd, kAll);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 100, t.addr() - 1, t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("a multi-packet write whose tail is out of range writes no head either") {
        GuardedTarget t(b.pd, kAll);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, kRegion, t.addr() + 8, t.mr->rkey, 77) ==
                0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("region without remote write access") {
        GuardedTarget t(b.pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, t.addr(), t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("region of another protection domain") {
        ibv_pd* other = ibv_alloc_pd(b.ctx);
        REQUIRE(other);
        {
            GuardedTarget t(other, kAll);
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, t.addr(), t.mr->rkey, 77) ==
                    0);
            expect_access_error(a, b);
            CHECK(t.unchanged());
        }
        ibv_dealloc_pd(other);
    }
    SECTION("deregistered region") {
        GuardedTarget t(b.pd, kAll);
        const uint32_t rkey = t.mr->rkey;
        // The region works, then is deregistered; the same key must fail at once.
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 16, t.addr(), rkey, 1) == 0);
        REQUIRE(wait_completions(a.cq, 1).at(0).status == IBV_WC_SUCCESS);
        CHECK(std::memcmp(t.whole.data() + kGuard, src.bytes.data(), 16) == 0);
        t.before = t.whole;
        REQUIRE(ibv_dereg_mr(t.mr) == 0);
        t.mr = nullptr;
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 4096, 4096, t.addr(), rkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
}

TEST_CASE("QP without remote write or read rights refuses them", "[access]") {
    QpOptions no_remote;
    no_remote.access = IBV_ACCESS_LOCAL_WRITE;
    Endpoint a(devices().a), b(devices().b, no_remote);
    to_rts(a, b.qp->qp_num, b.gid, QpOptions{});
    to_rts(b, a.qp->qp_num, a.gid, no_remote);
    Buffer src(a.pd, 8192, kAll);
    GuardedTarget t(b.pd, kAll);
    SECTION("write") {
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, t.addr(), t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(t.unchanged());
    }
    SECTION("read") {
        // The READ lands in src: a refused READ leaves it as it was.
        fill_pattern(src.bytes.data(), src.bytes.size(), 5);
        const std::vector<uint8_t> local_before = src.bytes;
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, src, 0, 4096, t.addr(), t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
        CHECK(src.bytes == local_before);
        CHECK(t.unchanged());
    }
}

TEST_CASE("RDMA READ violations return no data", "[access]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer dst(a.pd, 8192, kAll);
    std::memset(dst.bytes.data(), 0xab, dst.bytes.size());
    SECTION("out of range") {
        GuardedTarget t(b.pd, kAll);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, dst, 0, 4096, t.addr() + kRegion - 100,
                          t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
    }
    SECTION("no remote read right on the region") {
        GuardedTarget t(b.pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, dst, 0, 4096, t.addr(), t.mr->rkey, 77) == 0);
        expect_access_error(a, b);
    }
    CHECK(std::all_of(dst.bytes.begin(), dst.bytes.end(), [](uint8_t v) { return v == 0xab; }));
}

TEST_CASE("The responder reports an access error as an asynchronous event", "[access][events]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 4096, kAll);
    GuardedTarget t(b.pd, kAll);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, t.addr(), 0xbad, 77) == 0);
    expect_access_error(a, b);
    // COMM_EST may come first (the QP was in RTR... or RTS); look for the access error.
    bool seen = false;
    for (int i = 0; i < 4 && !seen; ++i) {
        ibv_async_event ev{};
        REQUIRE(get_async_event_within(b.ctx, &ev) == 0);
        if (ev.event_type == IBV_EVENT_QP_ACCESS_ERR) {
            CHECK(ev.element.qp == b.qp);
            seen = true;
        }
        ibv_ack_async_event(&ev);
    }
    CHECK(seen);
}

TEST_CASE("Local key errors complete with a local protection error", "[access]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 8192, kAll);
    GuardedTarget t(b.pd, kAll);
    ibv_sge sge{src.addr(), 4096, src.mr->lkey + 0x100};
    ibv_send_wr wr{};
    wr.wr_id = 5;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = t.addr();
    wr.wr.rdma.rkey = t.mr->rkey;
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_LOC_PROT_ERR);
    CHECK(a.state() == IBV_QPS_ERR);
    CHECK(t.unchanged());
}
