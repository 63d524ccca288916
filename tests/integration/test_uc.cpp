// UC QPs through the real libibverbs: SEND and WRITE with immediate data between two
// devices, the UC state-change rules, and the verbs UC does not have.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

ibv_qp* make_uc_qp(Endpoint& ep) {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = ep.cq;
    init.qp_type = IBV_QPT_UC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 64;
    init.cap.max_send_sge = init.cap.max_recv_sge = 2;
    return ibv_create_qp(ep.pd, &init);
}

void uc_to_rts(ibv_qp* qp, uint32_t remote_qpn, const ibv_gid& remote_gid) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    REQUIRE(ibv_modify_qp(
                qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0x321;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote_gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    // RC's responder attributes are not UC's.
    a.max_dest_rd_atomic = 1;
    CHECK(ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL);
    REQUIRE(ibv_modify_qp(
                qp, &a,
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN) == 0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x321;
    a.timeout = 14;
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT) == EINVAL);
    REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

// Two UC QPs in RTS, connected to each other.
std::pair<ibv_qp*, ibv_qp*> connected_uc(Endpoint& a, Endpoint& b) {
    ibv_qp* qa = make_uc_qp(a);
    ibv_qp* qb = make_uc_qp(b);
    REQUIRE(qa);
    REQUIRE(qb);
    uc_to_rts(qa, qb->qp_num, b.gid);
    uc_to_rts(qb, qa->qp_num, a.gid);
    return {qa, qb};
}

}  // namespace

TEST_CASE("UC: SEND and RDMA WRITE with immediate between two devices", "[uc]") {
    Endpoint a(devices().a), b(devices().b);
    auto [qa, qb] = connected_uc(a, b);
    Buffer src(a.pd, 65536, kAll), dst(b.pd, 65536, kAll);
    fill_pattern(src.bytes.data(), 65536, 9);
    REQUIRE(post_recv_buf(qb, dst, 0, 16384, 1) == 0);
    REQUIRE(post_recv_buf(qb, dst, 16384, 64, 2) == 0);
    REQUIRE(post_send_msg(qa, src, 0, 10000, 10) == 0);
    REQUIRE(post_rdma(qa, IBV_WR_RDMA_WRITE_WITH_IMM, src, 10000, 20000, dst.addr() + 32768,
                      dst.mr->rkey, 11) == 0);
    const auto s = wait_completions(a.cq, 2);
    REQUIRE(s.size() == 2);
    for (const ibv_wc& wc : s) CHECK(wc.status == IBV_WC_SUCCESS);
    const auto r = wait_completions(b.cq, 2);
    REQUIRE(r.size() == 2);
    CHECK(r[0].status == IBV_WC_SUCCESS);
    CHECK(r[0].wr_id == 1);
    CHECK(r[0].byte_len == 10000);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 10000) == 0);
    CHECK(r[1].status == IBV_WC_SUCCESS);
    CHECK(r[1].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(r[1].byte_len == 20000);
    CHECK(std::memcmp(dst.bytes.data() + 32768, src.bytes.data() + 10000, 20000) == 0);
    // No READ on UC.
    CHECK(post_rdma(qa, IBV_WR_RDMA_READ, src, 0, 64, dst.addr(), dst.mr->rkey, 12) == EINVAL);
    ibv_qp_attr qattr{};
    ibv_qp_init_attr qinit{};
    REQUIRE(ibv_query_qp(qa, &qattr, IBV_QP_STATE, &qinit) == 0);
    CHECK(qinit.qp_type == IBV_QPT_UC);
    CHECK(qattr.qp_state == IBV_QPS_RTS);
    // The PSNs in use, as rxe reports them: 10 + 20 packets of 1 KiB from 0x321.
    CHECK(qattr.sq_psn == 0x321u + 30);
    REQUIRE(ibv_query_qp(qb, &qattr, IBV_QP_RQ_PSN, &qinit) == 0);
    CHECK(qattr.rq_psn == 0x321u + 30);
    CHECK(ibv_destroy_qp(qa) == 0);
    CHECK(ibv_destroy_qp(qb) == 0);
}

TEST_CASE("UC: a post list leaves together, in order; a refused WR stops it there", "[uc]") {
    Endpoint a(devices().a), b(devices().b);
    auto [qa, qb] = connected_uc(a, b);
    constexpr int kList = 12;
    constexpr uint32_t kLen = 100;
    Buffer src(a.pd, 2 * kList * kLen, kAll), dst(b.pd, 2 * kList * kLen, kAll);
    fill_pattern(src.bytes.data(), 2 * kList * kLen, 17);
    ibv_sge sges[kList];
    ibv_send_wr wrs[kList];
    auto make_list = [&](int first) {
        for (int i = 0; i < kList; ++i) {
            const uint64_t off = (first + i) * kLen;
            sges[i] = {src.addr() + off, kLen, src.mr->lkey};
            wrs[i] = ibv_send_wr{};
            wrs[i].wr_id = first + i;
            wrs[i].opcode = IBV_WR_RDMA_WRITE;
            wrs[i].sg_list = &sges[i];
            wrs[i].num_sge = 1;
            wrs[i].send_flags = IBV_SEND_SIGNALED;
            wrs[i].wr.rdma.remote_addr = dst.addr() + off;
            wrs[i].wr.rdma.rkey = dst.mr->rkey;
            wrs[i].next = i + 1 < kList ? &wrs[i + 1] : nullptr;
        }
    };
    // What the first n WRs of list `first` wrote arrived, and they completed in order.
    auto check_written = [&](int first, int n) {
        const auto done = wait_completions(a.cq, n);
        REQUIRE(done.size() == static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
            CHECK(done[i].status == IBV_WC_SUCCESS);
            CHECK(done[i].wr_id == static_cast<uint64_t>(first + i));
        }
        const size_t at = first * kLen, len = n * kLen;
        bool arrived = false;
        for (int i = 0; i < 4000 && !arrived; ++i) {
            arrived = bytes_landed(dst.bytes.data() + at, src.bytes.data() + at, len);
            if (!arrived) wait_completions(b.cq, 1, std::chrono::milliseconds(5));
        }
        CHECK(arrived);
    };
    const uint64_t trains = counter(a.ctx, "tx_gso_sends");
    make_list(0);
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(qa, wrs, &bad) == 0);
    check_written(0, kList);
    CHECK(counter(a.ctx, "tx_gso_sends") - trains == 1);

    // WR 5 of the next list is a READ (UC has none): the five before it are written.
    make_list(kList);
    wrs[5].opcode = IBV_WR_RDMA_READ;
    REQUIRE(ibv_post_send(qa, wrs, &bad) == EINVAL);
    CHECK(bad == &wrs[5]);
    check_written(kList, 5);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
    const uint8_t* after = dst.bytes.data() + (kList + 5) * kLen;
    CHECK(std::all_of(after, after + 7 * kLen, [](uint8_t v) { return v == 0; }));
    CHECK(ibv_destroy_qp(qa) == 0);
    CHECK(ibv_destroy_qp(qb) == 0);
}

// A post in SQD waits, as RC's does (and rxe's UC): nothing leaves before the move back to RTS,
// and a move to ERR flushes it instead.
TEST_CASE("UC: a post in SQD leaves on the move back to RTS, or is flushed by ERR", "[uc]") {
    Endpoint a(devices().a), b(devices().b);
    auto [qa, qb] = connected_uc(a, b);
    Buffer src(a.pd, 8192, kAll), dst(b.pd, 8192, kAll);
    fill_pattern(src.bytes.data(), 8192, 23);
    REQUIRE(post_recv_buf(qb, dst, 0, 4096, 1) == 0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(qa, &attr, IBV_QP_STATE) == 0);
    attr.cur_qp_state = IBV_QPS_SQD;  // the kernel's UC row for SQD -> SQD has no CUR_STATE
    CHECK(ibv_modify_qp(qa, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    const uint64_t sent = qp_counter(qa, "tx_packets");
    REQUIRE(post_send_msg(qa, src, 0, 3000, 10) == 0);
    // A UC message completes as the socket takes it, within the post: none has left.
    ibv_wc wc{};
    CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
    CHECK(qp_counter(qa, "tx_packets") == sent);
    attr.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(qa, &attr, IBV_QP_STATE) == 0);
    const auto s = wait_completions(a.cq, 1);
    REQUIRE(s.size() == 1);
    CHECK(s[0].status == IBV_WC_SUCCESS);
    CHECK(s[0].wr_id == 10u);
    const auto r = wait_completions(b.cq, 1);
    REQUIRE(r.size() == 1);
    CHECK(r[0].status == IBV_WC_SUCCESS);
    CHECK(r[0].byte_len == 3000u);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 3000) == 0);

    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(qa, &attr, IBV_QP_STATE) == 0);
    const uint64_t before_err = qp_counter(qa, "tx_packets");
    REQUIRE(post_send_msg(qa, src, 4096, 100, 11) == 0);
    attr.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(qa, &attr, IBV_QP_STATE) == 0);
    const auto f = wait_completions(a.cq, 1);
    REQUIRE(f.size() == 1);
    CHECK(f[0].wr_id == 11u);
    CHECK(f[0].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(qp_counter(qa, "tx_packets") == before_err);
    CHECK(ibv_destroy_qp(qa) == 0);
    CHECK(ibv_destroy_qp(qb) == 0);
}
