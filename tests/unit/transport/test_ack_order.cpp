// The order of an ACK and the answer to the message it acknowledges.
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

// ib_send_lat -e hung (issue 10): the responder's ACK waits for the end of its receive batch,
// but the receive completion is visible (and its event fired) at once, so the application's
// answer could leave before the ACK. The peer then got the answer's event where it waited
// for its send completion, and with a send CQ of one entry it later overran that CQ. The ACK
// must be on the wire before anything the application sends on that QP afterwards.
TEST_CASE("ACK order: an answer posted as soon as a message completes follows its ACK", "[rc]") {
    Pair p;
    p.connect();
    // b's packets are recorded, not sent: nothing can reach b but the forged request.
    TxRecorder b_out(*p.b.engine, {}, false);
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 64)})) == 0);
    const uint32_t psn = p.b.qp->attributes().rq_psn;
    const ForgedPeer a_as_peer{*p.b.engine, p.a.ip, p.b.engine->config().port, p.a.qp->qpn(),
                               p.b.qp->qpn()};
    wire::Headers h = a_as_peer.headers(wire::Opcode::RcSendOnly, psn);
    h.bth.ack_req = true;
    std::vector<uint8_t> message(64);
    fill(message.data(), message.size(), 9);
    // Executed and completed, its ACK still pending, as in the middle of a receive batch.
    p.b.engine->receive_datagram(a_as_peer.forge(h, message), p.a.ip, p.b.engine->config().port,
                                 /*send_acks=*/false);
    REQUIRE(p.b.rcq->depth() == 1);
    REQUIRE(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 0);

    // The application answers at once.
    REQUIRE(p.b.qp->post_send(send_wqe(2, {p.b.sge(64, 64)})) == 0);
    const auto sent = b_out.packets();
    REQUIRE(!sent.empty());
    CHECK(sent[0].opcode() == static_cast<uint8_t>(wire::Opcode::RcAcknowledge));
    CHECK(sent[0].psn() == psn);
    CHECK(sent[0].parsed().h.aeth.type() == wire::AckType::Ack);
    REQUIRE(sent.size() >= 2);
    CHECK(sent[1].opcode() == static_cast<uint8_t>(wire::Opcode::RcSendOnly));
    // One ACK for the message, not a second one at the end of the batch.
    p.b.qp->flush_ack();
    CHECK(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 1);
}

namespace {

// A QP of `s` connected to a peer that never answers, with no retransmission timer (timeout
// 0): what it sends is exactly what its window lets out, once.
std::shared_ptr<RcQp> silent_qp(Side& s, const IpAddress& peer_ip) {
    auto qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                     QpCaps{64, 64, kMaxSge, kMaxSge, kMaxInlineData}, s.scq, s.rcq,
                                     nullptr);
    s.engine->attach(qp);
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = peer_ip;
    attrs.dest_qpn = 0xabcde;
    attrs.timeout = 0;
    bring_up(*qp, attrs);
    return qp;
}

}  // namespace

// ib_write_bw -q 16 -b failed with RETRY_EXC_ERR: 16 QPs with 256 KiB in flight each (4 MiB
// per direction) overran the peer's receive socket, a third of the packets were dropped and
// the go-back-N resends dropped more. The QPs of an engine share 2 MiB in flight; a QP alone
// keeps its full window (256 packets: 256 KiB at this MTU).
TEST_CASE("Send window: the QPs of an engine share what may be in flight", "[rc]") {
    PairOptions opt;
    opt.mem_bytes = 1 << 20;
    Pair p(opt);
    TxRecorder a_out(*p.a.engine, {}, false);
    const auto write_all = [&](std::vector<std::shared_ptr<RcQp>>& qps) {
        for (auto& qp : qps)
            REQUIRE(qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 1 << 20)},
                                           p.b.iova, p.b.keys.rkey)) == 0);
    };
    // The Pair's own QP (not connected) is attached too: 2 QPs, then 16.
    std::vector<std::shared_ptr<RcQp>> qps{silent_qp(p.a, p.b.ip)};
    write_all(qps);
    CHECK(a_out.packets().size() == 256 * 1024 / kMtu);
    for (auto& qp : qps) p.a.engine->detach(qp->qpn());
    qps.clear();
    a_out.clear();

    for (int i = 0; i < 15; ++i) qps.push_back(silent_qp(p.a, p.b.ip));
    write_all(qps);
    CHECK(a_out.packets().size() == 15 * (2 * 1024 * 1024 / 16) / kMtu);
    for (auto& qp : qps) p.a.engine->detach(qp->qpn());
}
