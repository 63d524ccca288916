// Several contexts on one device, in one process: each QP is reachable at the device's
// IP:4791 by its QPN, whoever owns it. Traffic between contexts of the same device, and
// between pairs of contexts running at once, arrives byte for byte.
// (Across processes, with kill -9: tests/scripts/test_device_sharing.sh.)
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kMsg = 256 * 1024;
constexpr size_t kGuard = 64;

// WRITE a->b, SEND a->b, READ b->a of kMsg bytes each, with guard bytes around every
// target, checking every byte.
void exchange_and_verify(Endpoint& a, Endpoint& b, uint64_t seed) {
    Buffer a_buf(a.pd, kMsg + 2 * kGuard, kAccess);
    Buffer b_buf(b.pd, kMsg + 2 * kGuard, kAccess);
    for (const ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ}) {
        INFO("opcode " << op);
        Buffer& src = op == IBV_WR_RDMA_READ ? b_buf : a_buf;
        Buffer& dst = op == IBV_WR_RDMA_READ ? a_buf : b_buf;
        fill_pattern(src.bytes.data(), src.bytes.size(), seed + op);
        std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
        if (op == IBV_WR_SEND) REQUIRE(post_recv_buf(b.qp, dst, kGuard, kMsg, 7) == 0);
        const int rc =
            op == IBV_WR_SEND ? post_send_msg(a.qp, src, kGuard, kMsg, 1)
            : op == IBV_WR_RDMA_WRITE
                ? post_rdma(a.qp, op, src, kGuard, kMsg, dst.addr() + kGuard, dst.mr->rkey, 1)
                : post_rdma(a.qp, op, dst, kGuard, kMsg, src.addr() + kGuard, src.mr->rkey, 1);
        REQUIRE(rc == 0);
        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        REQUIRE(wcs[0].status == IBV_WC_SUCCESS);
        if (op == IBV_WR_SEND) {
            const auto rwcs = wait_completions(b.cq, 1);
            REQUIRE(rwcs.size() == 1);
            REQUIRE(rwcs[0].status == IBV_WC_SUCCESS);
            REQUIRE(rwcs[0].byte_len == kMsg);
        }
        CHECK(std::memcmp(dst.bytes.data() + kGuard, src.bytes.data() + kGuard, kMsg) == 0);
        for (size_t i = 0; i < kGuard; ++i) {
            REQUIRE(dst.bytes[i] == 0xee);
            REQUIRE(dst.bytes[kGuard + kMsg + i] == 0xee);
        }
    }
}

}  // namespace

TEST_CASE("Two contexts of one device talk to each other", "[sharing]") {
    Endpoint a(devices().a), b(devices().a);
    CHECK(a.qp->qp_num != b.qp->qp_num);
    connect(a, b);
    exchange_and_verify(a, b, 1);
    exchange_and_verify(b, a, 2);
    CHECK(counter(a.ctx, "rx_unknown_qp") == 0);
    CHECK(counter(b.ctx, "rx_unknown_qp") == 0);
}

TEST_CASE("Contexts of two devices, two on each, in two pairs at once", "[sharing]") {
    Endpoint a1(devices().a), a2(devices().a), b1(devices().b), b2(devices().b);
    connect(a1, b1);
    connect(a2, b2);
    // Interleaved: each pair's traffic reaches its own QPs while the other's runs.
    for (uint64_t round = 0; round < 3; ++round) {
        exchange_and_verify(a1, b1, 10 + round);
        exchange_and_verify(b2, a2, 20 + round);
    }
    for (ibv_context* ctx : {a1.ctx, a2.ctx, b1.ctx, b2.ctx})
        CHECK(counter(ctx, "rx_unknown_qp") == 0);
}

TEST_CASE("QP numbers are unique across a device's contexts, and never 0 or 1", "[sharing]") {
    std::vector<std::unique_ptr<Endpoint>> eps;
    for (int i = 0; i < 6; ++i) eps.push_back(std::make_unique<Endpoint>(devices().a));
    std::set<uint32_t> qpns;
    std::set<uint32_t> slots;
    for (auto& e : eps) {
        qpns.insert(e->qp->qp_num);
        slots.insert(e->qp->qp_num >> 12);  // the context's slot
        CHECK(e->qp->qp_num > 1);
    }
    CHECK(qpns.size() == eps.size());
    CHECK(slots.size() == eps.size());  // one slot per context
    CHECK(!slots.contains(0));
}
