// The forged-peer seam itself: a packet built by the test reaches a QP exactly as one from
// the socket would, and the recorder sees what the engine sends back.
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

TEST_CASE("Forged peer: an injected SEND is received and ACKed", "[forged]") {
    Pair p;
    p.connect();
    // b stays silent: what it would send is recorded, not sent, and the test speaks for it.
    TxRecorder b_out(*p.b.engine, {}, false);
    TxRecorder a_out(*p.a.engine, {}, false);
    ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};

    REQUIRE(p.a.qp->post_recv(recv_wqe(9, {p.a.sge(0, 64)})) == 0);
    wire::Headers h = peer.headers(wire::Opcode::RcSendOnly, 0);
    h.bth.ack_req = true;
    const std::vector<uint8_t> payload(13, 0x5a);
    peer.inject(h, payload);

    const Completion c = p.wait_one(*p.a.rcq);
    CHECK(c.status == WcStatus::Success);
    CHECK(c.byte_len == 13);
    CHECK(all_bytes(p.a.at(0), 13, 0x5a));
    CHECK(all_bytes(p.a.at(13), 64 - 13, kUntouched));
    const auto sent = a_out.packets();
    REQUIRE(sent.size() == 1);
    CHECK(sent[0].opcode() == static_cast<uint8_t>(wire::Opcode::RcAcknowledge));
    CHECK(sent[0].psn() == 0);
    CHECK(sent[0].dst_ip == p.b.ip);
    CHECK(p.a.counters().tx_dropped_filter.load() == 1);

    SECTION("a corrupted copy is dropped and counted") {
        auto pkt = peer.forge(peer.headers(wire::Opcode::RcSendOnly, 1), payload);
        pkt[20] ^= 1;
        p.a.engine->receive_datagram(pkt, p.b.ip, peer.port);
        CHECK(p.a.counters().rx_bad_icrc.load() == 1);
        CHECK(p.stays_empty(*p.a.rcq));
    }
}
