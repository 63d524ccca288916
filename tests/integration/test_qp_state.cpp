// The RC state machine, attribute masks, flushing and the reliability engine's failures.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

ibv_qp_attr init_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    return a;
}

ibv_qp_attr rtr_attr(const Endpoint& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer.qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.port_num = 1;
    return a;
}

ibv_qp_attr rts_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return a;
}

}  // namespace

TEST_CASE("modify_qp enforces the IBA attribute masks", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_qp_attr attr = init_attr();
    CHECK(a.state() == IBV_QPS_RESET);
    // RESET -> INIT without the access flags, or with an attribute INIT does not take.
    CHECK(ibv_modify_qp(a.qp, &attr, kInitMask & ~IBV_QP_ACCESS_FLAGS) == EINVAL);
    CHECK(ibv_modify_qp(a.qp, &attr, kInitMask | IBV_QP_SQ_PSN) == EINVAL);
    // Skipping a state.
    attr = rts_attr();
    CHECK(ibv_modify_qp(a.qp, &attr, kRtsMask) == EINVAL);
    CHECK(a.state() == IBV_QPS_RESET);
    attr = init_attr();
    attr.port_num = 2;
    CHECK(ibv_modify_qp(a.qp, &attr, kInitMask) == EINVAL);
    attr = init_attr();
    REQUIRE(ibv_modify_qp(a.qp, &attr, kInitMask) == 0);
    CHECK(a.state() == IBV_QPS_INIT);
    // INIT -> INIT with optional attributes only.
    attr.qp_access_flags = kAll & ~IBV_ACCESS_LOCAL_WRITE;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_ACCESS_FLAGS) == 0);

    attr = rtr_attr(b);
    CHECK(ibv_modify_qp(a.qp, &attr, kRtrMask & ~IBV_QP_DEST_QPN) == EINVAL);
    CHECK(ibv_modify_qp(a.qp, &attr, kRtrMask | IBV_QP_SQ_PSN) == EINVAL);
    ibv_qp_attr no_grh = attr;
    no_grh.ah_attr.is_global = 0;  // RoCE needs a GRH
    CHECK(ibv_modify_qp(a.qp, &no_grh, kRtrMask) == EINVAL);
    // A connection's peer is one address, never a multicast group (::ffff:239.1.2.3).
    ibv_qp_attr group = attr;
    std::memset(group.ah_attr.grh.dgid.raw, 0, 10);
    group.ah_attr.grh.dgid.raw[10] = group.ah_attr.grh.dgid.raw[11] = 0xff;
    const uint8_t mcast[4] = {239, 1, 2, 3};
    std::memcpy(group.ah_attr.grh.dgid.raw + 12, mcast, 4);
    CHECK(ibv_modify_qp(a.qp, &group, kRtrMask) == EINVAL);
    ibv_qp_attr bad_cur = attr;
    bad_cur.cur_qp_state = IBV_QPS_RTS;
    CHECK(ibv_modify_qp(a.qp, &bad_cur, kRtrMask | IBV_QP_CUR_STATE) == EINVAL);
    REQUIRE(ibv_modify_qp(a.qp, &attr, kRtrMask) == 0);
    CHECK(a.state() == IBV_QPS_RTR);
    // RTR -> RTR is no transition.
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_MIN_RNR_TIMER) == EINVAL);

    attr = rts_attr();
    attr.retry_cnt = 8;
    CHECK(ibv_modify_qp(a.qp, &attr, kRtsMask) == EINVAL);
    attr = rts_attr();
    CHECK(ibv_modify_qp(a.qp, &attr, kRtsMask & ~IBV_QP_TIMEOUT) == EINVAL);
    REQUIRE(ibv_modify_qp(a.qp, &attr, kRtsMask) == 0);
    CHECK(a.state() == IBV_QPS_RTS);

    // RTS <-> SQD, then ERR and RESET.
    attr = {};
    attr.qp_state = IBV_QPS_SQD;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    CHECK(a.state() == IBV_QPS_SQD);
    attr.qp_state = IBV_QPS_RTS;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    attr.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT) == EINVAL);
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    CHECK(a.state() == IBV_QPS_ERR);
    attr.qp_state = IBV_QPS_RTS;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == EINVAL);
    attr.qp_state = IBV_QPS_RESET;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    CHECK(a.state() == IBV_QPS_RESET);
}

// Linux's table (ib_modify_qp_is_ok, which rxe and the other kernel drivers apply): RESET
// goes to INIT or RESET only; CUR_STATE is taken only in RTR, RTS, SQD or SQE, and only on
// the moves that list it (not to RESET or ERR, nor SQD -> SQD).
TEST_CASE("modify_qp follows the kernel's transitions and its CUR_STATE rule", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == EINVAL);  // RESET -> ERR
    CHECK(a.state() == IBV_QPS_RESET);
    attr.qp_state = IBV_QPS_RESET;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    connect(a, b);
    attr = {};
    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    attr.cur_qp_state = IBV_QPS_SQD;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    attr.port_num = 1;  // the kernel's RC row for SQD -> SQD lists the port
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PORT) == 0);
    attr.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    attr.qp_state = IBV_QPS_RESET;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    CHECK(a.state() == IBV_QPS_SQD);
    attr.qp_state = IBV_QPS_RTS;  // SQD -> RTS lists it
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == 0);
    attr.qp_state = IBV_QPS_ERR;
    attr.cur_qp_state = IBV_QPS_RTS;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    attr.cur_qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);  // ERR -> ERR
    CHECK(a.state() == IBV_QPS_ERR);
}

TEST_CASE("query_qp returns the attributes and capabilities in force", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    QpOptions opt;
    opt.timeout = 12;
    opt.retry_cnt = 5;
    connect(a, b, opt);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    REQUIRE(ibv_query_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_CAP, &init) == 0);
    CHECK(attr.qp_state == IBV_QPS_RTS);
    CHECK(attr.dest_qp_num == b.qp->qp_num);
    CHECK(attr.timeout == 12);
    CHECK(attr.retry_cnt == 5);
    CHECK(attr.path_mtu == IBV_MTU_4096);
    CHECK(attr.cap.max_send_wr >= 256);
    CHECK(attr.cap.max_send_sge >= 4);
    CHECK(attr.cap.max_inline_data >= 64);
    CHECK(init.cap.max_send_wr == attr.cap.max_send_wr);
    CHECK(init.qp_type == IBV_QPT_RC);
    CHECK(init.send_cq == a.cq);
    CHECK(std::memcmp(&attr.ah_attr.grh.dgid, &b.gid, sizeof b.gid) == 0);
}

// As mlx5 and rxe do, query_qp reports the PSNs in use: the next one each side sends and
// expects, not those the application set at RTR and RTS.
TEST_CASE("query_qp reports the next PSN sent and expected", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);  // sq_psn and rq_psn 0x123, MTU 4096
    Buffer src(a.pd, 16384, kAll), dst(b.pd, 16384, kAll);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    REQUIRE(ibv_query_qp(a.qp, &attr, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &init) == 0);
    CHECK(attr.sq_psn == 0x123u);
    CHECK(attr.rq_psn == 0x123u);
    REQUIRE(post_recv_buf(b.qp, dst, 0, 10000, 1) == 0);
    REQUIRE(post_send_msg(a.qp, src, 0, 10000, 2) == 0);  // 3
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 100, dst.addr(), dst.mr->rkey, 3) ==
            0);  // 1
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, src, 0, 9000, dst.addr(), dst.mr->rkey, 4) ==
            0);  // 3
    REQUIRE(wait_completions(a.cq, 3).size() == 3);
    REQUIRE(ibv_query_qp(a.qp, &attr, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &init) == 0);
    CHECK(attr.sq_psn == 0x123u + 7);
    CHECK(attr.rq_psn == 0x123u);  // b sent nothing
    // Every request was answered, so b expects the PSN after the last one.
    REQUIRE(ibv_query_qp(b.qp, &attr, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &init) == 0);
    CHECK(attr.rq_psn == 0x123u + 7);
    CHECK(attr.sq_psn == 0x123u);
}

TEST_CASE("posting in a state that takes no work fails with EINVAL", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    Buffer buf(a.pd, 4096, kAll);
    CHECK(post_recv_buf(a.qp, buf, 0, 64, 1) == EINVAL);  // RESET
    ibv_qp_attr attr = init_attr();
    REQUIRE(ibv_modify_qp(a.qp, &attr, kInitMask) == 0);
    CHECK(post_send_msg(a.qp, buf, 0, 64, 1) == EINVAL);  // INIT
    CHECK(post_recv_buf(a.qp, buf, 0, 64, 1) == 0);       // receives may be posted in INIT
    attr = rtr_attr(b);
    REQUIRE(ibv_modify_qp(a.qp, &attr, kRtrMask) == 0);
    CHECK(post_send_msg(a.qp, buf, 0, 64, 1) == EINVAL);  // RTR
    // Malformed requests.
    ibv_sge sge{buf.addr(), 16, buf.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;  // with a 16-byte result buffer: not 8
    ibv_send_wr* bad = nullptr;
    attr = rts_attr();
    REQUIRE(ibv_modify_qp(a.qp, &attr, kRtsMask) == 0);
    CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL);
    CHECK(bad == &wr);
    wr.opcode = IBV_WR_SEND;
    wr.num_sge = 17;
    CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL);
}

TEST_CASE("moving to ERR flushes every outstanding work request", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer buf(a.pd, 65536, kAll);
    for (int i = 0; i < 10; ++i) REQUIRE(post_recv_buf(a.qp, buf, i * 64, 64, 100 + i) == 0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    auto wcs = wait_completions(a.cq, 10);
    REQUIRE(wcs.size() == 10);
    for (int i = 0; i < 10; ++i) {
        CHECK(wcs[i].wr_id == 100u + i);
        CHECK(wcs[i].status == IBV_WC_WR_FLUSH_ERR);
    }
    // Work posted in ERR completes at once, flushed, signaled or not.
    REQUIRE(post_send_msg(a.qp, buf, 0, 64, 7, false) == 0);
    REQUIRE(post_recv_buf(a.qp, buf, 0, 64, 8) == 0);
    wcs = wait_completions(a.cq, 2);
    REQUIRE(wcs.size() == 2);
    CHECK(wcs[0].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(wcs[1].status == IBV_WC_WR_FLUSH_ERR);
}

TEST_CASE("retry exhaustion completes with RETRY_EXC_ERR and moves the QP to ERR", "[qp][retry]") {
    QpOptions opt;
    opt.timeout = 8;  // ~1 ms per try
    opt.retry_cnt = 2;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer buf(a.pd, 4096, kAll);
    Buffer remote(b.pd, 4096, kAll);
    // The peer vanishes: nothing will ever be acknowledged.
    REQUIRE(ibv_destroy_qp(b.qp) == 0);
    b.qp = nullptr;
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, buf, 0, 100, remote.addr(), remote.mr->rkey, 9) ==
            0);
    REQUIRE(post_send_msg(a.qp, buf, 0, 10, 10) == 0);
    auto wcs = wait_completions(a.cq, 2, std::chrono::seconds(10));
    REQUIRE(wcs.size() == 2);
    CHECK(wcs[0].wr_id == 9);
    CHECK(wcs[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(wcs[1].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(a.state() == IBV_QPS_ERR);
    CHECK(counter(a.ctx, "retransmit_timeouts") >= 3);
    // b's engine thread counts them: on a loaded machine it may not have run yet.
    CHECK(wait_counter(b.ctx, "rx_unknown_qp", 3));
}

TEST_CASE("a SEND without a posted receive is retried after RNR NAKs", "[qp][rnr]") {
    QpOptions opt;
    opt.min_rnr_timer = 1;  // 10 us
    SECTION("and succeeds once a receive is posted") {
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer sbuf(a.pd, 4096, kAll), rbuf(b.pd, 4096, kAll);
        fill_pattern(sbuf.bytes.data(), 4096, 3);
        REQUIRE(post_send_msg(a.qp, sbuf, 0, 3000, 1) == 0);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (counter(b.ctx, "tx_rnr_naks") == 0 && std::chrono::steady_clock::now() < end)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        REQUIRE(counter(b.ctx, "tx_rnr_naks") > 0);
        REQUIRE(post_recv_buf(b.qp, rbuf, 0, 4096, 2) == 0);
        auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_SUCCESS);
        auto r = wait_completions(b.cq, 1);
        REQUIRE(r.size() == 1);
        CHECK(r[0].byte_len == 3000);
        CHECK(std::memcmp(sbuf.bytes.data(), rbuf.bytes.data(), 3000) == 0);
    }
    SECTION("and fails with RNR_RETRY_EXC_ERR when the retries run out") {
        opt.rnr_retry = 2;
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer sbuf(a.pd, 4096, kAll);
        REQUIRE(post_send_msg(a.qp, sbuf, 0, 100, 1) == 0);
        auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
        CHECK(a.state() == IBV_QPS_ERR);
    }
}

TEST_CASE("a message longer than the receive buffer fails on both sides", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer sbuf(a.pd, 8192, kAll), rbuf(b.pd, 8192, kAll);
    std::memset(rbuf.bytes.data(), 0x5a, rbuf.bytes.size());
    REQUIRE(post_recv_buf(b.qp, rbuf, 0, 100, 2) == 0);
    REQUIRE(post_send_msg(a.qp, sbuf, 0, 101, 1) == 0);
    auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_REM_INV_REQ_ERR);
    auto r = wait_completions(b.cq, 1);
    REQUIRE(r.size() == 1);
    CHECK(r[0].status == IBV_WC_LOC_LEN_ERR);
    CHECK(b.state() == IBV_QPS_ERR);
    // Nothing beyond the posted buffer was touched.
    CHECK(std::all_of(rbuf.bytes.begin() + 100, rbuf.bytes.end(),
                      [](uint8_t v) { return v == 0x5a; }));
}

TEST_CASE("destroying a CQ still used by a QP fails with EBUSY", "[qp]") {
    Endpoint a(devices().a);
    CHECK(ibv_destroy_cq(a.cq) == EBUSY);
}

TEST_CASE("QP types uroce does not run are refused cleanly", "[qp]") {
    Endpoint a(devices().a);
    // A PD of its own: refused creations must leave no reference on it.
    ibv_pd* pd = ibv_alloc_pd(a.ctx);
    REQUIRE(pd);
    ibv_qp_init_attr init{};
    init.send_cq = a.cq;
    init.recv_cq = a.cq;
    init.cap.max_send_wr = init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    for (ibv_qp_type type : {IBV_QPT_RAW_PACKET, IBV_QPT_DRIVER}) {
        CAPTURE(type);
        init.qp_type = type;
        errno = 0;
        CHECK(ibv_create_qp(pd, &init) == nullptr);
        CHECK(errno == EOPNOTSUPP);
    }
    // An XRC receive QP belongs to an XRC domain, not a PD: ibv_create_qp cannot make one.
    init.qp_type = IBV_QPT_XRC_RECV;
    errno = 0;
    CHECK(ibv_create_qp(pd, &init) == nullptr);
    CHECK(errno == EINVAL);

    // An RC QP naming an SRQ of another context is refused.
    Endpoint other(devices().b);
    ibv_srq_init_attr srq_init{};
    srq_init.attr.max_wr = 4;
    srq_init.attr.max_sge = 1;
    ibv_srq* foreign = ibv_create_srq(other.pd, &srq_init);
    REQUIRE(foreign);
    init.qp_type = IBV_QPT_RC;
    init.srq = foreign;
    errno = 0;
    CHECK(ibv_create_qp(pd, &init) == nullptr);
    CHECK(errno == EINVAL);
    init.srq = nullptr;
    CHECK(ibv_destroy_srq(foreign) == 0);

    // Capabilities beyond the limits are refused with EINVAL.
    init.cap.max_inline_data = 100000;
    errno = 0;
    CHECK(ibv_create_qp(pd, &init) == nullptr);
    CHECK(errno == EINVAL);

    // Nothing refused holds the PD.
    CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("contexts and QPs open and close repeatedly", "[qp][lifecycle]") {
    for (int i = 0; i < 20; ++i) {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer sbuf(a.pd, 4096, kAll), rbuf(b.pd, 8192, kAll);
        fill_pattern(sbuf.bytes.data(), 4096, static_cast<uint64_t>(i) + 1);
        std::memset(rbuf.bytes.data(), 0x5a, rbuf.bytes.size());
        // Into the middle of rbuf: the bytes around the target are guards.
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, sbuf, 0, 4096, rbuf.addr() + 2048, rbuf.mr->rkey,
                          1) == 0);
        auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_SUCCESS);
        CHECK(wcs[0].opcode == IBV_WC_RDMA_WRITE);
        CHECK(std::memcmp(rbuf.bytes.data() + 2048, sbuf.bytes.data(), 4096) == 0);
        CHECK(std::all_of(rbuf.bytes.begin(), rbuf.bytes.begin() + 2048,
                          [](uint8_t v) { return v == 0x5a; }));
        CHECK(std::all_of(rbuf.bytes.begin() + 6144, rbuf.bytes.end(),
                          [](uint8_t v) { return v == 0x5a; }));
        // A second QP on the same context, created and destroyed.
        ibv_qp_init_attr init{};
        init.send_cq = a.cq;
        init.recv_cq = a.cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        ibv_qp* extra = ibv_create_qp(a.pd, &init);
        REQUIRE(extra);
        REQUIRE(ibv_destroy_qp(extra) == 0);
    }
}

TEST_CASE("RESET takes the QP's waiting completions out of its CQs, and only the QP's", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer buf(a.pd, 4096, kAll);
    // A second QP on the same CQ, whose completion must stay.
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = a.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* other = ibv_create_qp(a.pd, &init);
    REQUIRE(other);
    ibv_qp_attr attr = init_attr();
    REQUIRE(ibv_modify_qp(other, &attr, kInitMask) == 0);
    REQUIRE(post_recv_buf(other, buf, 0, 64, 99) == 0);
    for (int i = 0; i < 5; ++i) REQUIRE(post_recv_buf(a.qp, buf, 64 * i, 64, i) == 0);
    attr = {};
    attr.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);   // 5 flush completions
    REQUIRE(ibv_modify_qp(other, &attr, IBV_QP_STATE) == 0);  // 1 flush completion
    attr.qp_state = IBV_QPS_RESET;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    const auto wcs = wait_completions(a.cq, 2, std::chrono::milliseconds(200));
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].wr_id == 99);
    CHECK(wcs[0].qp_num == other->qp_num);
    CHECK(ibv_destroy_qp(other) == 0);
}

// A CQ shared by many QPs outlives the ones an application destroys, and QPNs come back: a
// destroyed QP's unpolled completions must not surface later, least of all under the number
// of a new QP that never posted their work requests (applications find the QP by qp_num).
TEST_CASE("a destroyed QP's waiting completions never surface under a new QP of its number",
          "[qp]") {
    Endpoint a(devices().a);
    Buffer buf(a.pd, 4096, kAll);
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = a.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* old = ibv_create_qp(a.pd, &init);
    REQUIRE(old);
    const uint32_t qpn = old->qp_num;
    ibv_qp_attr attr = init_attr();
    REQUIRE(ibv_modify_qp(old, &attr, kInitMask) == 0);
    REQUIRE(post_recv_buf(old, buf, 0, 64, 777) == 0);
    attr = {};
    attr.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(old, &attr, IBV_QP_STATE) == 0);  // a flush completion waits
    REQUIRE(ibv_destroy_qp(old) == 0);
    // QPNs are drawn within the context's slot until it is full: the number comes back
    // within one slot's worth of creates.
    std::vector<ibv_qp*> made;
    ibv_qp* reused = nullptr;
    for (int i = 0; i < 4096 && !reused; ++i) {
        ibv_qp* q = ibv_create_qp(a.pd, &init);
        REQUIRE(q);
        made.push_back(q);
        if (q->qp_num == qpn) reused = q;
    }
    REQUIRE(reused);
    ibv_wc wc{};
    const int n = ibv_poll_cq(a.cq, 1, &wc);
    CHECK(n == 0);
    if (n == 1) {
        CHECK(wc.qp_num != qpn);
        CHECK(wc.wr_id != 777u);
    }
    for (ibv_qp* q : made) CHECK(ibv_destroy_qp(q) == 0);
}

// ibv_query_qp's sq_draining is set while a QP in SQD still has requests in flight and clears
// once they are done: applications that asked for no SQ_DRAINED event spin on it (rxe yields
// the CPU in query for them).
TEST_CASE("query_qp in SQD reports sq_draining until the send queue has drained", "[qp]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);  // rnr_retry 7: a SEND without a receive waits for one
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    REQUIRE(post_send_msg(a.qp, src, 0, 64, 1) == 0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    ibv_qp_init_attr init{};
    attr = {};
    REQUIRE(ibv_query_qp(a.qp, &attr, IBV_QP_STATE, &init) == 0);
    CHECK(attr.qp_state == IBV_QPS_SQD);
    CHECK(attr.sq_draining == 1);  // the SEND is still in flight
    REQUIRE(post_recv_buf(b.qp, dst, 0, 64, 2) == 0);
    REQUIRE(wait_completions(a.cq, 1).size() == 1);
    // The SEND completed: nothing is in flight, so the drain is over.
    bool draining = true;
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (draining && std::chrono::steady_clock::now() < limit) {
        attr = {};
        if (ibv_query_qp(a.qp, &attr, IBV_QP_STATE, &init) != 0) break;
        if (attr.qp_state != IBV_QPS_SQD) break;
        draining = attr.sq_draining != 0;
    }
    CHECK(attr.qp_state == IBV_QPS_SQD);
    CHECK_FALSE(draining);
}
