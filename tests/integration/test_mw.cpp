// Memory windows through the real libibverbs: type 1 and type 2 binds, access through a
// window and only within it, local and remote invalidation, deallocation, refused binds.
#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
constexpr int kSrc = IBV_ACCESS_LOCAL_WRITE;

ibv_wc one(ibv_cq* cq) {
    const auto wcs = wait_completions(cq, 1);
    REQUIRE(wcs.size() == 1);
    return wcs[0];
}

int post_bind2(ibv_qp* qp, ibv_mw* mw, uint32_t rkey, ibv_mr* mr, uint64_t addr, uint64_t len,
               uint64_t wr_id) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info.mr = mr;
    wr.bind_mw.bind_info.addr = addr;
    wr.bind_mw.bind_info.length = len;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

int post_inv(ibv_qp* qp, ibv_wr_opcode op, uint32_t rkey, const Buffer* src, uint64_t wr_id) {
    ibv_sge sge{src ? src->addr() : 0, 16, src ? src->mr->lkey : 0};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    wr.sg_list = src ? &sge : nullptr;
    wr.num_sge = src ? 1 : 0;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

ibv_qp* small_rc_qp(ibv_pd* pd, ibv_cq* cq) {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 4;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    return ibv_create_qp(pd, &init);
}

}  // namespace

TEST_CASE("MW type 2: access through the window, within it only, until invalidated", "[mw]") {
    QpOptions opt;
    opt.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kSrc), dst(b.pd, 4096, kMrAccess);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    // The window covers bytes 1024..2047 of the region.
    REQUIRE(post_bind2(b.qp, mw, rkey, dst.mr, dst.addr() + 1024, 1024, 1) == 0);
    ibv_wc wc = one(b.cq);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(wc.opcode == IBV_WC_BIND_MW);
    CHECK(mw->rkey == rkey);
    fill_pattern(src.bytes.data(), 4096, 8);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 512, dst.addr() + 1024, rkey, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.bytes.data() + 1024, src.bytes.data(), 512) == 0);

    SECTION("outside the window: refused, nothing written") {
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), rkey, 3) == 0);
        CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
        CHECK(dst.bytes[0] == 0);
    }
    SECTION("invalidated locally") {
        REQUIRE(post_inv(b.qp, IBV_WR_LOCAL_INV, rkey, nullptr, 4) == 0);
        wc = one(b.cq);
        CHECK(wc.status == IBV_WC_SUCCESS);
        CHECK(wc.opcode == IBV_WC_LOCAL_INV);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr() + 1024, rkey, 5) == 0);
        CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("invalidated by the peer's SEND with invalidate") {
        Buffer rbuf(b.pd, 64, IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(post_recv_buf(b.qp, rbuf, 0, 64, 6) == 0);
        REQUIRE(post_inv(a.qp, IBV_WR_SEND_WITH_INV, rkey, &src, 7) == 0);
        CHECK(one(a.cq).status == IBV_WC_SUCCESS);
        wc = one(b.cq);
        CHECK(wc.status == IBV_WC_SUCCESS);
        CHECK((wc.wc_flags & IBV_WC_WITH_INV) != 0);
        CHECK(wc.invalidated_rkey == rkey);
        CHECK(wc.byte_len == 16);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr() + 1024, rkey, 8) == 0);
        CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("deallocated") {
        REQUIRE(ibv_dealloc_mw(mw) == 0);
        mw = nullptr;
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr() + 1024, rkey, 9) == 0);
        CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    }
    if (mw) CHECK(ibv_dealloc_mw(mw) == 0);
}

TEST_CASE("MW type 1: ibv_bind_mw, and a zero-length bind takes the access away", "[mw]") {
    QpOptions opt;
    opt.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kSrc), dst(b.pd, 4096, kMrAccess);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
    REQUIRE(mw);
    ibv_mw_bind bind{};
    bind.wr_id = 1;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info.mr = dst.mr;
    bind.bind_info.addr = dst.addr();
    bind.bind_info.length = 4096;
    bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    REQUIRE(ibv_bind_mw(b.qp, mw, &bind) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    fill_pattern(src.bytes.data(), 4096, 9);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, dst.addr(), mw->rkey, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 4096) == 0);
    const uint32_t old_rkey = mw->rkey;
    bind.bind_info.length = 0;
    bind.bind_info.mw_access_flags = 0;
    REQUIRE(ibv_bind_mw(b.qp, mw, &bind) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), old_rkey, 3) == 0);
    CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    CHECK(ibv_dealloc_mw(mw) == 0);
}

TEST_CASE("MW: binds that cannot be made", "[mw]") {
    Endpoint b(devices().b);
    errno = 0;
    CHECK(ibv_alloc_mw(b.pd, static_cast<ibv_mw_type>(3)) == nullptr);
    CHECK(errno == EINVAL);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    QpOptions opt;
    Endpoint a(devices().a, opt);
    connect(a, b, opt);
    SECTION("a region registered without MW_BIND: the bind fails and the QP stops") {
        Buffer dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(post_bind2(b.qp, mw, ibv_inc_rkey(mw->rkey), dst.mr, dst.addr(), 64, 1) == 0);
        CHECK(one(b.cq).status == IBV_WC_MW_BIND_ERR);
        CHECK(b.state() == IBV_QPS_ERR);
    }
    SECTION("an rkey of another window, or a type 1 window posted as type 2") {
        Buffer dst(b.pd, 4096, kMrAccess);
        CHECK(post_bind2(b.qp, mw, mw->rkey + 0x100, dst.mr, dst.addr(), 64, 1) == EINVAL);
        ibv_mw* t1 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
        REQUIRE(t1);
        CHECK(post_bind2(b.qp, t1, ibv_inc_rkey(t1->rkey), dst.mr, dst.addr(), 64, 2) == EINVAL);
        CHECK(ibv_dealloc_mw(t1) == 0);
        ibv_wc wc{};
        CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
    }
    CHECK(ibv_dealloc_mw(mw) == 0);
}

TEST_CASE("MW type 2: a window outlives the QP it was bound on, not its access", "[mw]") {
    // A type 2 window answers only to the QP it was bound on. Once that QP is destroyed,
    // nothing reaches the window, not even through a later QP that draws the same number.
    QpOptions opt;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    Buffer src(a.pd, 4096, kSrc), dst(b.pd, 4096, kMrAccess);
    ibv_qp* x = small_rc_qp(b.pd, b.cq);
    REQUIRE(x);
    to_rts(x, a.qp->qp_num, a.gid, opt);
    to_rts(a, x->qp_num, b.gid, opt);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    REQUIRE(post_bind2(x, mw, rkey, dst.mr, dst.addr(), 4096, 1) == 0);
    REQUIRE(one(b.cq).status == IBV_WC_SUCCESS);
    fill_pattern(src.bytes.data(), 4096, 10);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), rkey, 2) == 0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    const uint32_t x_num = x->qp_num;
    REQUIRE(ibv_destroy_qp(x) == 0);

    // New QPs of b's context until one has x's number: it is free, so it comes before the
    // numbers of the slot run out.
    std::vector<ibv_qp*> held;
    ibv_qp* y = nullptr;
    for (int i = 0; i < 8192 && !y; ++i) {
        ibv_qp* q = small_rc_qp(b.pd, b.cq);
        REQUIRE(q);
        if (q->qp_num == x_num)
            y = q;
        else
            held.push_back(q);
    }
    REQUIRE(y);
    Endpoint a2(devices().a, opt);
    to_rts(y, a2.qp->qp_num, a2.gid, opt);
    to_rts(a2, y->qp_num, b.gid, opt);
    std::memset(dst.bytes.data(), 0, 4096);
    Buffer src2(a2.pd, 4096, kSrc);
    fill_pattern(src2.bytes.data(), 4096, 11);
    REQUIRE(post_rdma(a2.qp, IBV_WR_RDMA_WRITE, src2, 0, 64, dst.addr(), rkey, 3) == 0);
    CHECK(one(a2.cq).status == IBV_WC_REM_ACCESS_ERR);
    CHECK(dst.bytes[0] == 0);
    CHECK(std::memcmp(dst.bytes.data(), std::vector<uint8_t>(64, 0).data(), 64) == 0);
    CHECK(ibv_destroy_qp(y) == 0);
    for (ibv_qp* q : held) CHECK(ibv_destroy_qp(q) == 0);
    CHECK(ibv_dealloc_mw(mw) == 0);
}

TEST_CASE("MW type 2: bound once until invalidated; a zero-length bind is no invalidation",
          "[mw]") {
    // IBA o10-37.2.30: a type 2 window is bound only from the free state; o10-37.2.40: a
    // bind of length 0 does not invalidate it. Either bind fails (and stops the QP).
    QpOptions opt;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kSrc), dst(b.pd, 4096, kMrAccess);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    REQUIRE(post_bind2(b.qp, mw, rkey, dst.mr, dst.addr(), 1024, 1) == 0);
    REQUIRE(one(b.cq).status == IBV_WC_SUCCESS);
    fill_pattern(src.bytes.data(), 4096, 12);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), rkey, 3) == 0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    SECTION("bound again while bound") {
        REQUIRE(post_bind2(b.qp, mw, ibv_inc_rkey(rkey), dst.mr, dst.addr() + 2048, 1024, 2) == 0);
        CHECK(one(b.cq).status == IBV_WC_MW_BIND_ERR);
    }
    SECTION("bound with length 0") {
        REQUIRE(post_bind2(b.qp, mw, ibv_inc_rkey(rkey), dst.mr, dst.addr(), 0, 2) == 0);
        CHECK(one(b.cq).status == IBV_WC_MW_BIND_ERR);
    }
    SECTION("bound again once invalidated") {
        REQUIRE(post_inv(b.qp, IBV_WR_LOCAL_INV, rkey, nullptr, 4) == 0);
        REQUIRE(one(b.cq).status == IBV_WC_SUCCESS);
        const uint32_t again = ibv_inc_rkey(rkey);
        REQUIRE(post_bind2(b.qp, mw, again, dst.mr, dst.addr() + 2048, 1024, 5) == 0);
        CHECK(one(b.cq).status == IBV_WC_SUCCESS);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr() + 2048, again, 6) == 0);
        CHECK(one(a.cq).status == IBV_WC_SUCCESS);
        CHECK(std::memcmp(dst.bytes.data() + 2048, src.bytes.data(), 64) == 0);
    }
    CHECK(ibv_dealloc_mw(mw) == 0);
}

// IBA 10.6.7.2.6, as rxe has it: a region with windows bound to it is not deregistered
// (EINVAL), and keeps serving them; once they are invalidated, unbound or freed, it is.
TEST_CASE("MW: ibv_dereg_mr refuses a region windows are bound to", "[mw]") {
    QpOptions opt;
    opt.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kSrc);
    fill_pattern(src.bytes.data(), 4096, 5);
    std::vector<uint8_t> mem(4096);
    const uint64_t base = reinterpret_cast<uint64_t>(mem.data());
    ibv_mr* mr = ibv_reg_mr(b.pd, mem.data(), mem.size(), kMrAccess);
    REQUIRE(mr);
    ibv_mw* mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    ibv_mw* mw1 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
    REQUIRE(mw2);
    REQUIRE(mw1);
    const uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
    REQUIRE(post_bind2(b.qp, mw2, rkey2, mr, base, 4096, 1) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    CHECK(ibv_dereg_mr(mr) == EINVAL);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, base, rkey2, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(mem.data(), src.bytes.data(), 4096) == 0);
    // A type 1 window keeps it too, once the type 2 one is invalidated.
    ibv_mw_bind bind{};
    bind.wr_id = 3;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info.mr = mr;
    bind.bind_info.addr = base;
    bind.bind_info.length = 64;
    bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    REQUIRE(ibv_bind_mw(b.qp, mw1, &bind) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    REQUIRE(post_inv(b.qp, IBV_WR_LOCAL_INV, rkey2, nullptr, 4) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    CHECK(ibv_dereg_mr(mr) == EINVAL);
    CHECK(ibv_dealloc_mw(mw1) == 0);
    CHECK(ibv_dereg_mr(mr) == 0);
    CHECK(ibv_dealloc_mw(mw2) == 0);
}

TEST_CASE("MW: ibv_rereg_mr refuses a region windows are bound to", "[mw][rereg]") {
    // ibv_rereg_mr is a deregistration and a registration in one: as ibv_dereg_mr, it fails
    // while a window is bound, or the window would keep granting what the region no longer
    // allows (remote write without local write, access from another PD's QPs).
    QpOptions opt;
    opt.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kSrc), dst(b.pd, 4096, kMrAccess);
    ibv_pd* other = ibv_alloc_pd(b.ctx);
    REQUIRE(other);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
    REQUIRE(mw);
    ibv_mw_bind bind{};
    bind.wr_id = 1;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info.mr = dst.mr;
    bind.bind_info.addr = dst.addr();
    bind.bind_info.length = 4096;
    bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    REQUIRE(ibv_bind_mw(b.qp, mw, &bind) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);

    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                       IBV_ACCESS_MW_BIND) == IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0) ==
          IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);
    CHECK(dst.mr->pd == b.pd);
    CHECK(ibv_dealloc_pd(other) == 0);  // the region never went there
    // The region is as it was: the window writes into it.
    fill_pattern(src.bytes.data(), 4096, 4);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, dst.addr(), mw->rkey, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 4096) == 0);

    // Unbound, the region changes.
    bind.bind_info.length = 0;
    bind.bind_info.mw_access_flags = 0;
    REQUIRE(ibv_bind_mw(b.qp, mw, &bind) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                       IBV_ACCESS_MW_BIND) == 0);
    CHECK(ibv_dealloc_mw(mw) == 0);
}
