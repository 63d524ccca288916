// The receive filters in front of every QP: a packet is handed to its QP only if it parses,
// its ICRC matches (exactly, or for some IP identification the kernel may have chosen), its
// P_Key is the default partition, it is RC, its destination QP exists and it comes from that
// QP's connected peer. Each refused packet is counted and changes nothing: no byte, no
// completion, no PSN consumed (the same request, sent correctly afterwards, is executed).
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

struct Target {
    Pair p;
    ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};
    std::vector<uint8_t> payload = std::vector<uint8_t>(256, 0x3c);

    Target() { p.connect(); }
    // An RDMA WRITE ONLY of `payload` into a's region at offset 1000, PSN 0.
    wire::Headers write() const {
        wire::Headers h = peer.headers(wire::Opcode::RcWriteOnly, 0);
        h.bth.ack_req = true;
        h.reth = {p.a.iova + 1000, p.a.keys.rkey, static_cast<uint32_t>(payload.size())};
        return h;
    }
    bool untouched() { return all_bytes(p.a.at(0), p.a.mem.size(), kUntouched); }
    bool written() {
        return all_bytes(p.a.at(1000), payload.size(), 0x3c) &&
               all_bytes(p.a.at(0), 1000, kUntouched) &&
               all_bytes(p.a.at(1000 + payload.size()), p.a.mem.size() - 1000 - payload.size(),
                         kUntouched);
    }
};

}  // namespace

TEST_CASE("Receive filters: refused packets change nothing and are counted", "[filters]") {
    Target t;
    TxRecorder a_out(*t.p.a.engine, {}, false);
    EngineCounters& c = t.p.a.counters();
    const uint64_t rx_before = c.rx_packets.load();
    QpCounters& qc = t.p.a.engine->qp_counters(t.p.a.qp->qpn());
    const uint64_t qp_rx_before = qc.rx_packets.load();

    SECTION("ICRC that does not match") {
        auto pkt = t.peer.forge(t.write(), t.payload);
        pkt[wire::kBthBytes + wire::kRethBytes + 7] ^= 0x10;  // one payload bit
        t.p.a.engine->receive_datagram(pkt, t.peer.ip, t.peer.port);
        CHECK(c.rx_bad_icrc.load() == 1);
        CHECK(qc.rx_packets.load() == qp_rx_before);  // its QPN is unverified: no QP's
    }
    SECTION("source address other than the connected peer") {
        const ForgedPeer stranger{t.peer.engine, IpAddress::v4(t.p.b.ip.v4() + 100), t.peer.port,
                                  t.peer.qpn, t.peer.local_qpn};
        stranger.inject(t.write(), t.payload);
        CHECK(c.rx_wrong_peer.load() == 1);
        CHECK(qc.rx_wrong_peer.load() == 1);  // the QP it named
    }
    SECTION("P_Key of another partition") {
        wire::Headers h = t.write();
        h.bth.pkey = 0x8001;
        t.peer.inject(h, t.payload);
        CHECK(c.rx_bad_pkey.load() == 1);
    }
    SECTION("destination QP that does not exist") {
        wire::Headers h = t.write();
        h.bth.dest_qp = t.p.a.qp->qpn() + 77;
        t.peer.inject(h, t.payload);
        CHECK(c.rx_unknown_qp.load() == 1);
    }
    SECTION("UD opcode to an RC QP") {
        wire::Headers h = t.peer.headers(static_cast<wire::Opcode>(0x64), 0);
        h.deth = {0x11111111, t.p.b.qp->qpn()};
        t.peer.inject(h, t.payload);
        CHECK(c.rx_unsupported.load() == 1);
    }
    SECTION("truncated packet") {
        auto pkt = t.peer.forge(t.write(), t.payload);
        pkt.resize(wire::kBthBytes + 6);
        t.p.a.engine->receive_datagram(pkt, t.peer.ip, t.peer.port);
        CHECK(c.rx_malformed.load() == 1);
    }
    CHECK(c.rx_packets.load() == rx_before + 1);
    CHECK(t.untouched());
    CHECK(a_out.packets().empty());
    CHECK(t.p.a.qp->state() == QpState::Rts);
    // PSN 0 is still expected: the genuine packet is executed and acknowledged.
    t.peer.inject(t.write(), t.payload);
    CHECK(t.written());
    REQUIRE(a_out.packets().size() == 1);
    CHECK(a_out.packets()[0].opcode() == static_cast<uint8_t>(wire::Opcode::RcAcknowledge));
    CHECK(a_out.packets()[0].psn() == 0);
}

TEST_CASE(
    "Receive filters: an ICRC computed with the IP identification the kernel chose is accepted",
    "[filters]") {
    Target t;
    TxRecorder a_out(*t.p.a.engine, {}, false);
    const auto pkt =
        forge_packet(t.write(), t.payload,
                     wire::IpFlow{t.peer.ip, t.p.a.engine->config().ip, t.peer.port, t.peer.port},
                     wire::Ipv4Unseen{0x5a17, true});
    t.p.a.engine->receive_datagram(pkt, t.peer.ip, t.peer.port);
    CHECK(t.p.a.counters().rx_icrc_unseen_fields.load() == 1);
    CHECK(t.p.a.counters().rx_bad_icrc.load() == 0);
    CHECK(t.written());

    SECTION("but not one computed with DF clear") {
        const auto no_df = forge_packet(
            [&] {
                wire::Headers h = t.write();
                h.bth.psn = 1;
                return h;
            }(),
            t.payload, wire::IpFlow{t.peer.ip, t.p.a.engine->config().ip, t.peer.port, t.peer.port},
            wire::Ipv4Unseen{0x5a17, false});
        t.p.a.engine->receive_datagram(no_df, t.peer.ip, t.peer.port);
        CHECK(t.p.a.counters().rx_bad_icrc.load() == 1);
    }
}

TEST_CASE("Receive filters: each datagram of one read reaches its own QP", "[filters]") {
    // The engine looks a packet's QP up once per run of packets for the same QP (a train):
    // datagrams for two QPs, interleaved in one read, must not follow the QP before them.
    // a has only its local ACK timeout: its QPs, no round trip measured yet, would probe a
    // WRITE again if b read it more than 1 ms after it left, and b would count one more.
    PairOptions o;
    o.adaptive_a = false;
    Pair p(o);
    p.connect();
    const auto extra_qp = [](Side& s) {
        auto qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                         QpCaps{64, 64, kMaxSge, kMaxSge, kMaxInlineData}, s.scq,
                                         s.rcq, nullptr);
        s.engine->attach(qp);
        return qp;
    };
    auto a2 = extra_qp(p.a);
    auto b2 = extra_qp(p.b);
    QpAttributes pa = default_attributes(), pb = default_attributes();
    pa.dst_ip = p.b.ip;
    pa.dest_qpn = b2->qpn();
    pb.dst_ip = p.a.ip;
    pb.dest_qpn = a2->qpn();
    pa.sq_psn = pb.rq_psn = 5000;  // not the first pair's PSNs
    pb.sq_psn = pa.rq_psn = 7000;
    for (auto [qp, attrs] : {std::pair{a2, pa}, std::pair{b2, pb}}) {
        REQUIRE(qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
        REQUIRE(qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
    }
    for (auto [qp, attrs] : {std::pair{a2, pa}, std::pair{b2, pb}})
        REQUIRE(qp->modify(attrs, QpState::Rtr, QpState::Rts) == 0);

    QpCounters& q1 = p.b.engine->qp_counters(p.b.qp->qpn());
    QpCounters& q2 = p.b.engine->qp_counters(b2->qpn());
    const uint64_t rx1 = q1.rx_packets.load(), rx2 = q2.rx_packets.load();
    const uint64_t reads = p.b.counters().rx_packets.load();
    {
        // b's engine thread held still: the three WRITEs wait in its socket, read at once.
        const auto gate = p.b.engine->fork_gate().pass();
        const std::shared_ptr<RcQp> via[] = {p.a.qp, a2, p.a.qp};
        for (uint32_t i = 0; i < 3; ++i) {
            fill(p.a.at(1024 * i), 256, 40 + i);
            REQUIRE(
                via[i]->post_send(rdma_wqe(SendOpcode::RdmaWrite, 40 + i, {p.a.sge(1024 * i, 256)},
                                           p.b.iova + 8192 + 1024 * i, p.b.keys.rkey)) == 0);
        }
    }
    const auto done = p.wait(*p.a.scq, 3);
    REQUIRE(done.size() == 3);
    for (const Completion& c : done) CHECK(c.status == WcStatus::Success);
    for (uint32_t i = 0; i < 3; ++i)
        CHECK(first_mismatch(p.b.at(8192 + 1024 * i), 256, 40 + i) == 256);
    CHECK(p.b.counters().rx_packets.load() == reads + 3);
    CHECK(q1.rx_packets.load() == rx1 + 2);
    CHECK(q2.rx_packets.load() == rx2 + 1);
    CHECK(p.b.counters().rx_out_of_sequence.load() == 0);
    CHECK(p.b.counters().rx_duplicate.load() == 0);
    p.a.engine->detach(a2->qpn());
    p.b.engine->detach(b2->qpn());
}
