// UD sends the verbs take but the QP must not put on the wire as asked: what a datagram's
// address handle may name.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "tests/integration/ud_end.h"
#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

// An AH belongs to a PD, and a QP may send only through AHs of its own (IBA 10.2.3): as rxe
// does, the post is taken and its request completes with a local QP operation error, nothing
// sent, the QP in ERR.
TEST_CASE("UD: a send through an AH of another PD fails and sends nothing", "[ud]") {
    UdEnd a(devices().a), b(devices().b);
    Buffer in_b(b.pd, 4096, kAccess), out_a(a.pd, 4096, kAccess);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, kGrh + 100, 1) == 0);
    ibv_pd* other = ibv_alloc_pd(a.ctx);
    REQUIRE(other);
    ibv_ah_attr attr{};
    attr.is_global = 1;
    attr.grh.dgid = b.gid;
    attr.grh.hop_limit = 64;
    attr.port_num = 1;
    ibv_ah* ah = ibv_create_ah(other, &attr);
    REQUIRE(ah);
    const uint64_t sent = qp_counter(a.qp, "tx_packets");
    REQUIRE(post_ud_send(a.qp, ah, b.qp->qp_num, kQkey, out_a, 0, 100, 7) == 0);
    const ibv_wc s = one(a.cq);
    CHECK(s.wr_id == 7u);
    CHECK(s.status == IBV_WC_LOC_QP_OP_ERR);
    CHECK(qp_counter(a.qp, "tx_packets") == sent);
    CHECK(wait_completions(b.cq, 1, std::chrono::milliseconds(300)).empty());
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0);
    CHECK(qa.qp_state == IBV_QPS_ERR);
    CHECK(ibv_destroy_ah(ah) == 0);
    CHECK(ibv_dealloc_pd(other) == 0);
}
