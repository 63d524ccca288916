// UD sends the verbs take but the QP must not put on the wire as asked: what a datagram's
// address handle may name, and which Q_Keys a QP may hold.
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "tests/integration/ud_end.h"
#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

// Takes CAP_NET_RAW out of the calling thread's effective set (capabilities are per thread,
// and Linux checks the caller's) and puts it back when it goes.
class WithoutNetRaw {
  public:
    WithoutNetRaw() {
        REQUIRE(syscall(SYS_capget, &header_, saved_) == 0);
        __user_cap_data_struct less[2] = {saved_[0], saved_[1]};
        less[CAP_NET_RAW / 32].effective &= ~(1u << (CAP_NET_RAW % 32));
        REQUIRE(syscall(SYS_capset, &header_, less) == 0);
    }
    ~WithoutNetRaw() { syscall(SYS_capset, &header_, saved_); }
    WithoutNetRaw(const WithoutNetRaw&) = delete;
    WithoutNetRaw& operator=(const WithoutNetRaw&) = delete;

  private:
    __user_cap_header_struct header_{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct saved_[2]{};
};

uint32_t qkey_of(ibv_qp* qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    REQUIRE(ibv_query_qp(qp, &a, IBV_QP_QKEY, &init) == 0);
    return a.qkey;
}

}  // namespace

// Q_Keys with bit 31 set are controlled (IBA 10.2.4): a QP holding one reaches the services
// behind them, such as QP1's 0x80010000. Linux lets ibv_modify_qp set one only with CAP_NET_RAW
// (EPERM otherwise), and a send asking for bit 31 sends the QP's own.
TEST_CASE("UD: setting a controlled Q_Key needs CAP_NET_RAW, as on Linux", "[ud]") {
    UdEnd a(devices().a);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.qkey = 0x80010000u;
    {
        WithoutNetRaw drop;
        CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_QKEY) == EPERM);
        CHECK(qkey_of(a.qp) == kQkey);
        attr.qkey = kQkey + 1;  // an ordinary one still changes
        CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_QKEY) == 0);
        CHECK(qkey_of(a.qp) == kQkey + 1);
    }
    attr.qkey = 0x80010000u;
    CHECK(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_QKEY) == 0);
    CHECK(qkey_of(a.qp) == 0x80010000u);
}

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
