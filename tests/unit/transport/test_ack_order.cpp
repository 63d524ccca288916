// The order of an ACK and the answer to the message it acknowledges.
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
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
