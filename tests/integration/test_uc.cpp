// UC QPs through the real libibverbs: SEND and WRITE with immediate data between two
// devices, the UC state-change rules, and the verbs UC does not have.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

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

}  // namespace

TEST_CASE("UC: SEND and RDMA WRITE with immediate between two devices", "[uc]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_qp* qa = make_uc_qp(a);
    ibv_qp* qb = make_uc_qp(b);
    REQUIRE(qa);
    REQUIRE(qb);
    uc_to_rts(qa, qb->qp_num, b.gid);
    uc_to_rts(qb, qa->qp_num, a.gid);
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
    CHECK(ibv_destroy_qp(qa) == 0);
    CHECK(ibv_destroy_qp(qb) == 0);
}
