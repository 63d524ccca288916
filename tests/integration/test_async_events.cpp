// The affiliated asynchronous events applications wait for, through the real libibverbs:
// communication established, send queue drained, and the errors that stop a QP, each naming
// the QP it is about and acknowledged before the QP goes.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// The next asynchronous event of `ctx`, which must come within the bound; acknowledged.
ibv_async_event next_event(ibv_context* ctx) {
    ibv_async_event ev{};
    REQUIRE(get_async_event_within(ctx, &ev) == 0);
    ibv_ack_async_event(&ev);
    return ev;
}

bool no_event(ibv_context* ctx) {
    return !wait_readable(ctx->async_fd, std::chrono::milliseconds(100));
}

void to_init(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    REQUIRE(ibv_modify_qp(
                qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
}

void to_rtr(ibv_qp* qp, uint32_t remote_qpn, const ibv_gid& gid) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = QpOptions{}.mtu;  // as the peer's to_rts sets it
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0x123;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.port_num = 1;
    REQUIRE(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ==
            0);
}

}  // namespace

TEST_CASE("async events: the first request reaching a QP in RTR raises COMM_EST, once",
          "[events][async]") {
    Endpoint a(devices().a);
    Endpoint b(devices().b);
    to_rts(a, b.qp->qp_num, b.gid, QpOptions{});
    to_init(b.qp);
    to_rtr(b.qp, a.qp->qp_num, a.gid);  // b receives, but stays in RTR
    Buffer src(a.pd, 4096, kAll);
    Buffer dst(b.pd, 4096, kAll);
    fill_pattern(src.bytes.data(), 2000, 1);
    REQUIRE(post_recv_buf(b.qp, dst, 0, 4096, 1) == 0);
    REQUIRE(post_recv_buf(b.qp, dst, 0, 4096, 2) == 0);
    REQUIRE(post_send_msg(a.qp, src, 0, 2000, 10) == 0);
    const auto wc = wait_completions(b.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 2000) == 0);
    const ibv_async_event ev = next_event(b.ctx);
    CHECK(ev.event_type == IBV_EVENT_COMM_EST);
    CHECK(ev.element.qp == b.qp);
    // A second message raises no second event.
    REQUIRE(post_send_msg(a.qp, src, 0, 100, 11) == 0);
    REQUIRE(wait_completions(b.cq, 1).size() == 1);
    CHECK(no_event(b.ctx));
    CHECK(no_event(a.ctx));  // the requester in RTS never raises it
    REQUIRE(wait_completions(a.cq, 2).size() == 2);
}

TEST_CASE("async events: SQD with notification raises SQ_DRAINED when the send queue is empty",
          "[events][async]") {
    Endpoint a(devices().a);
    Endpoint b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 64 * 1024, kAll);
    Buffer dst(b.pd, 64 * 1024, kAll);
    // A WRITE in flight when the drain is asked for: the event follows its completion.
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64 * 1024, dst.addr(), dst.mr->rkey, 1) ==
            0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    attr.en_sqd_async_notify = 1;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
    const ibv_async_event ev = next_event(a.ctx);
    CHECK(ev.event_type == IBV_EVENT_SQ_DRAINED);
    CHECK(ev.element.qp == a.qp);
    const auto wc = wait_completions(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    // In SQD new work is not started; back in RTS it is.
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), dst.mr->rkey, 2) == 0);
    REQUIRE(wait_completions(a.cq, 1).size() == 1);
    // Without the notification flag, no event.
    attr = {};
    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    CHECK(no_event(a.ctx));
}

TEST_CASE("async events: a request the responder cannot take raises QP_REQ_ERR there",
          "[events][async]") {
    Endpoint a(devices().a);
    Endpoint b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 8192, kAll);
    Buffer dst(b.pd, 8192, kAll);
    // A SEND longer than the receive buffer: the requester's error (an invalid request).
    REQUIRE(post_recv_buf(b.qp, dst, 0, 100, 1) == 0);
    REQUIRE(post_send_msg(a.qp, src, 0, 5000, 2) == 0);
    const auto sc = wait_completions(a.cq, 1);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_REM_INV_REQ_ERR);
    const ibv_async_event ev = next_event(b.ctx);
    CHECK(ev.event_type == IBV_EVENT_QP_REQ_ERR);
    CHECK(ev.element.qp == b.qp);
    CHECK(b.state() == IBV_QPS_ERR);
    // Its receive completes in error (too long for the buffer), nothing beyond it written.
    const auto rc = wait_completions(b.cq, 1);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_LOC_LEN_ERR);
}
