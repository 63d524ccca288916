// Destroying a QP is safe at any moment: with its retransmission timer firing, with packets
// for it being delivered on the engine thread, with work in flight. After Engine::detach()
// returns nothing touches the QP again (run under ASan to see it: the suite does).
#include <catch2/catch.hpp>
#include <random>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;

namespace {

// A QP on `s`'s engine connected to `peer_qpn` at `peer_ip`, in RTS.
std::shared_ptr<RcQp> connected_qp(Side& s, uint32_t peer_ip, uint32_t peer_qpn, uint8_t timeout) {
    auto qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                     QpCaps{64, 64, kMaxSge, kMaxSge, kMaxInlineData}, s.scq, s.rcq,
                                     nullptr);
    s.engine->attach(qp);
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = peer_ip;
    attrs.dest_qpn = peer_qpn;
    attrs.timeout = timeout;
    attrs.retry_cnt = 7;
    REQUIRE(qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
    REQUIRE(qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
    REQUIRE(qp->modify(attrs, QpState::Rtr, QpState::Rts) == 0);
    return qp;
}

}  // namespace

TEST_CASE("Lifetime: a QP destroyed while its retransmission timer fires", "[lifetime]") {
    Pair p;
    std::mt19937 rng(42);
    for (int i = 0; i < 500; ++i) {
        // The peer QP does not exist: every request times out, again and again (timeout 1 is
        // 8 us), so the timer is pending or running whenever the QP goes away.
        auto qp = connected_qp(p.a, p.b.ip, 0xabcde, 1);
        for (uint64_t n = 0; n < 4; ++n)
            REQUIRE(qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, n, {p.a.sge(0, 3000)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        const uint32_t qpn = qp->qpn();
        p.a.engine->detach(qpn);
        qp.reset();
    }
    // The engine still works: a fresh QP pair moves data.
    p.connect();
    fill(p.a.at(0), 5000, 9);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 5000)}, p.b.iova + 100,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_until([&] { return first_mismatch(p.b.at(100), 5000, 9) == 5000; }));
}

TEST_CASE("Lifetime: a QP destroyed while packets for it arrive", "[lifetime]") {
    Pair p;
    for (int i = 0; i < 100; ++i) {
        // b streams WRITEs at a fresh QP of a; a's QP is destroyed mid-stream.
        auto qa = connected_qp(p.a, p.b.ip, 0, 14);
        auto qb = connected_qp(p.b, p.a.ip, qa->qpn(), 1);
        // qa must know qb to accept its packets.
        QpAttributes attrs = default_attributes();
        attrs.dst_ip = p.b.ip;
        attrs.dest_qpn = qb->qpn();
        REQUIRE(qa->modify(attrs, QpState::Rts, QpState::Rts) == 0);
        for (uint64_t n = 0; n < 8; ++n)
            REQUIRE(qb->post_send(rdma_wqe(SendOpcode::RdmaWrite, n, {p.b.sge(0, 8000)}, p.a.iova,
                                           p.a.keys.rkey)) == 0);
        std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 7)));
        p.a.engine->detach(qa->qpn());
        qa.reset();
        p.b.engine->detach(qb->qpn());
        qb.reset();
    }
    SUCCEED("no use after free (checked by ASan) and no hang");
}
