// The engine's flight budget (flight_budget.h, rc_flight.cpp): the RC QPs of one engine
// together never have more than FlightBudget::kBytes of first transmissions unacknowledged;
// the others wait in line, oldest first, and take their turns as ACKs make room; resends,
// a QP that stops, and a resend from the start give their bytes back.
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/engine_thread_blocker.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/flight_budget.h"

using uroce::IpAddress;
using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

TEST_CASE("Flight budget: room, the line, and turns oldest first", "[flight]") {
    FlightBudget b(100);
    CHECK(b.admits(0, false));
    CHECK(b.admits(99, false));
    CHECK_FALSE(b.admits(100, false));  // what this QP sent since it settled counts too
    CHECK_FALSE(b.change(100));         // more in flight wakes nobody
    CHECK(b.in_flight() == 100);
    CHECK_FALSE(b.admits(0, false));
    CHECK_FALSE(b.admits(0, true));  // a turn gives no room that is not there

    CHECK_FALSE(b.wait(7));  // no room: the ACKs that make it give the turns
    CHECK_FALSE(b.wait(8));
    CHECK(b.waiting() == 2);
    uint32_t qpn = 0;
    CHECK_FALSE(b.next_turn(qpn));  // still full
    CHECK(b.waiting() == 2);

    CHECK(b.change(-1));              // room now, and QPs wait
    CHECK_FALSE(b.admits(0, false));  // the line goes first
    CHECK(b.admits(0, true));         // its turn
    REQUIRE(b.next_turn(qpn));
    CHECK(qpn == 7);
    REQUIRE(b.next_turn(qpn));
    CHECK(qpn == 8);
    CHECK_FALSE(b.next_turn(qpn));
    CHECK(b.waiting() == 0);
    CHECK(b.admits(0, false));
    CHECK_FALSE(b.change(-50));  // nobody waits

    // Turned away only because others waited: the room is there already.
    CHECK(b.wait(9));
    CHECK_FALSE(b.admits(0, false));
    REQUIRE(b.next_turn(qpn));
    CHECK(qpn == 9);
}

namespace {

constexpr uint32_t kFirstPeerQpn = 0x10000;

// `n` QPs of `s`, each connected to QP kFirstPeerQpn + i at `peer_ip`, which never answers
// unless the test forges it, with no retransmission timer (timeout 0): what they send is
// exactly what their windows and the engine's budget let out, once.
std::vector<std::shared_ptr<RcQp>> silent_qps(Side& s, const IpAddress& peer_ip, size_t n,
                                              uint8_t timeout = 0) {
    std::vector<std::shared_ptr<RcQp>> qps;
    for (size_t i = 0; i < n; ++i) {
        auto qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                         QpCaps{4, 4, kMaxSge, kMaxSge, kMaxInlineData}, s.scq,
                                         s.rcq, nullptr);
        s.engine->attach(qp);
        QpAttributes attrs = default_attributes();
        attrs.dst_ip = peer_ip;
        attrs.dest_qpn = kFirstPeerQpn + static_cast<uint32_t>(i);
        attrs.timeout = timeout;
        bring_up(*qp, attrs);
        qps.push_back(qp);
    }
    return qps;
}

// Packets sent, by the index of the QP that sent them (its peer's QPN less kFirstPeerQpn).
std::map<uint32_t, size_t> by_qp(const TxRecorder& out) {
    std::map<uint32_t, size_t> n;
    for (const SentPacket& s : out.packets()) ++n[s.parsed().h.bth.dest_qp - kFirstPeerQpn];
    return n;
}

// 200 QPs (and the Pair's own, not connected) each WRITE 16 KiB: 16 packets of 1 KiB, their
// send windows' floor. 200 x 16 KiB is 3.2 MB; the budget lets 3 MiB of it go: the first
// 192 QPs' WRITEs, whole.
struct Crowd {
    static constexpr size_t kQps = 200;
    static constexpr uint32_t kPackets = 16;
    static constexpr size_t kAdmitted = FlightBudget::kBytes / (kPackets * kMtu);  // 192 QPs

    explicit Crowd(uint8_t timeout = 0)
        : p(options()), qps(silent_qps(p.a, p.b.ip, kQps, timeout)) {}
    static PairOptions options() {
        PairOptions o;
        o.mem_bytes = 64 * 1024;
        return o;
    }
    void write(size_t i, uint64_t wr_id = 1) {
        REQUIRE(
            qps[i]->post_send(rdma_wqe(SendOpcode::RdmaWrite, wr_id, {p.a.sge(0, kPackets * kMtu)},
                                       p.b.iova, p.b.keys.rkey)) == 0);
    }
    void write_all() {
        write_all_unpolled();
        p.progress();  // posts held for the next poll go out
    }
    void write_all_unpolled() {
        for (size_t i = 0; i < kQps; ++i) write(i);
    }
    // The peer of QP i acknowledges its first `packets` packets.
    void ack(size_t i, uint32_t packets) {
        const ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port,
                              kFirstPeerQpn + static_cast<uint32_t>(i), qps[i]->qpn()};
        peer.inject(peer.ack(packets - 1));
    }
    // Waits until `n` packets went out, and a little for more that should not. The test
    // polls (a poll's receive batch gives the turns at its end) unless `unpolled`: then only
    // the engine threads run, and b sends nothing, so turns come from a's engine thread.
    void settle_at(size_t n, bool unpolled = false) {
        const auto enough = [&] { return out.packets().size() >= n; };
        CHECK((unpolled ? eventually(enough) : p.wait_until(enough)));
        std::this_thread::sleep_for(20ms);
    }

    Pair p;
    TxRecorder out{*p.a.engine, {}, false};
    std::vector<std::shared_ptr<RcQp>> qps;
};

}  // namespace

TEST_CASE("Flight budget: 200 QPs with a WRITE each put 3 MiB in flight and wait in line",
          "[flight]") {
    Crowd c;
    c.write_all();
    c.settle_at(Crowd::kAdmitted * Crowd::kPackets);
    const auto sent = by_qp(c.out);
    CHECK(c.out.packets().size() == Crowd::kAdmitted * Crowd::kPackets);
    // The first 192 QPs, whole; none of the others.
    CHECK(sent.size() == Crowd::kAdmitted);
    for (const auto& [i, n] : sent) {
        CAPTURE(i);
        CHECK(i < Crowd::kAdmitted);
        CHECK(n == Crowd::kPackets);
    }
    CHECK(c.p.a.engine->flight_budget().in_flight() == FlightBudget::kBytes);
    CHECK(c.p.a.engine->flight_budget().waiting() == Crowd::kQps - Crowd::kAdmitted);
    CHECK(c.p.a.counters().flight_waits.load() == Crowd::kQps - Crowd::kAdmitted);
    SECTION("an ACK's room goes to the oldest in line, whole messages in turn") {
        c.out.clear();
        c.ack(0, Crowd::kPackets);  // QP 0's WRITE done: 16 KiB of room
        c.settle_at(Crowd::kPackets);
        CHECK(by_qp(c.out) == std::map<uint32_t, size_t>{{Crowd::kAdmitted, Crowd::kPackets}});
        c.out.clear();
        c.ack(1, 4);  // a quarter of QP 1's: room for 4 packets
        c.settle_at(4);
        CHECK(by_qp(c.out) == std::map<uint32_t, size_t>{{Crowd::kAdmitted + 1, 4}});
        // The last of them asked for an ACK (no other rule would have: the QP asks twice per
        // window of 16, and at its message's end): the budget stopped it there, and nothing
        // else would make its peer answer.
        const auto last4 = c.out.packets();
        REQUIRE(last4.size() == 4);
        CHECK(last4.back().psn() == 3);
        CHECK(last4.back().parsed().h.bth.ack_req);
        CHECK_FALSE(last4[1].parsed().h.bth.ack_req);
        // The QP whose turn it was, cut short, waits again, at the end of the line.
        CHECK(c.p.a.engine->flight_budget().waiting() == Crowd::kQps - Crowd::kAdmitted - 1);
        CHECK(c.p.a.counters().flight_waits.load() == Crowd::kQps - Crowd::kAdmitted + 1);
    }
    SECTION("a QP that stops gives its bytes back") {
        c.out.clear();
        c.p.a.engine->detach(c.qps[0]->qpn());  // destroyed with 16 KiB unacknowledged
        c.qps[0].reset();
        c.settle_at(Crowd::kPackets, true);
        CHECK(by_qp(c.out) == std::map<uint32_t, size_t>{{Crowd::kAdmitted, Crowd::kPackets}});
        c.out.clear();
        REQUIRE(c.qps[1]->modify(c.qps[1]->attributes(), QpState::Rts, QpState::Err) == 0);
        c.settle_at(Crowd::kPackets, true);
        CHECK(by_qp(c.out) == std::map<uint32_t, size_t>{{Crowd::kAdmitted + 1, Crowd::kPackets}});
        CHECK(c.p.a.engine->flight_budget().in_flight() == FlightBudget::kBytes);
    }
    SECTION("a resend needs no room") {
        c.out.clear();
        // QP 2's peer lost packet 3: a sequence NAK. Its resend goes though QPs wait.
        const ForgedPeer peer{*c.p.a.engine, c.p.b.ip, c.p.a.engine->config().port,
                              kFirstPeerQpn + 2, c.qps[2]->qpn()};
        peer.inject(
            peer.ack(3, wire::AckType::Nak, static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
        // The NAK acknowledged packets 0-2: room for 3, which the oldest in line takes.
        c.settle_at(5);
        auto resent = by_qp(c.out);
        CHECK(resent[Crowd::kAdmitted] == 3);
        CHECK(resent[2] == 2);  // the lost packet and the newest one (selective recovery)
        size_t psn3 = 0;
        for (const SentPacket& s : c.out.packets())
            if (s.parsed().h.bth.dest_qp == kFirstPeerQpn + 2 && s.psn() == 3) ++psn3;
        CHECK(psn3 == 1);
        CHECK(resent.size() == 2);
    }
    for (auto& qp : c.qps)
        if (qp) c.p.a.engine->detach(qp->qpn());
    CHECK(c.p.a.engine->flight_budget().in_flight() == 0);
}

TEST_CASE("Flight budget: a QP whose timer goes back N is charged nothing for what it sent",
          "[flight]") {
    // b answers nothing; a's local ACK timeout (4 ms) goes back N. A peer that went away must
    // not hold the engine's budget until a's retries run out.
    PairOptions o;
    o.adaptive = false;
    Pair p(o);
    TxRecorder silent_b{*p.b.engine, {}, false};
    TxRecorder a_out{*p.a.engine};
    QpAttributes attrs = default_attributes();
    attrs.timeout = 10;
    p.connect(attrs, attrs);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 16 * kMtu)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_until([&] { return a_out.packets().size() >= 16; }));
    CHECK(p.a.engine->flight_budget().in_flight() == 16 * kMtu);
    const FlightBudget& budget = p.a.engine->flight_budget();
    REQUIRE(p.wait_until([&] { return budget.in_flight() == 0; }));
    // Still trying (7 retries of 4 ms): not a QP that stopped.
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.a.counters().retransmit_timeouts.load() >= 1);
    CHECK(a_out.packets().size() >= 17);  // it went on resending
}

TEST_CASE("Flight budget: a QP that waits out an RNR NAK is charged nothing", "[flight]") {
    Pair p;
    p.connect();
    // b has no receive posted: every SEND draws an RNR NAK, and a sends it again 10 us later.
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 16 * kMtu)})) == 0);
    auto& rnr = p.a.engine->qp_counters(p.a.qp->qpn()).rx_rnr_naks;
    REQUIRE(p.wait_until([&] { return rnr.load() >= 2; }));
    CHECK(p.a.engine->flight_budget().in_flight() == 0);
    // Its receive posted, b takes the SEND at the next try; a's budget is clear again.
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 16 * kMtu)})) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(p.wait_until([&] { return p.a.engine->flight_budget().in_flight() == 0; }));
}

TEST_CASE("Flight budget: QPs with no round trip measured send no probe while QPs wait in line",
          "[flight]") {
    // The first guess (1 ms) assumes an idle path; here the engine's own traffic fills it,
    // and the peer drains up to 3 MiB ahead of each packet. Each QP in flight holds its first
    // early expiry back once, then waits for the local ACK timeout alone; the QPs in line arm
    // no first guess at all. That timeout is 4.3 s (timeout 20): with 67 ms (timeout 14) a
    // TSan build took longer than that to post the 200 WRITEs, and the first QPs' local ACK
    // timeouts went back N while the test still waited (3-12 of them, in 3 runs of 3).
    Crowd c(20);
    {
        // Timers wait until the line has formed (a sanitizer build posts slowly).
        EngineThreadBlocker hold(*c.p.a.engine);
        c.write_all_unpolled();
        REQUIRE(c.p.a.engine->flight_budget().waiting() == Crowd::kQps - Crowd::kAdmitted);
    }
    std::this_thread::sleep_for(20ms);
    const auto& n = c.p.a.counters();
    CAPTURE(n.retransmit_timeouts.load(), n.early_retransmits.load(), n.tail_probes.load(),
            n.resends_held_back.load(), c.p.a.engine->flight_budget().waiting());
    CHECK(c.out.packets().size() == Crowd::kAdmitted * Crowd::kPackets);
    CHECK(c.p.a.counters().retransmitted_packets.load() == 0);
    CHECK(c.p.a.counters().tail_probes.load() == 0);
    const uint64_t held = c.p.a.counters().resends_held_back.load();
    CHECK(held >= 1);
    CHECK(held <= Crowd::kAdmitted);  // once each, not at 1, 3, 7, 15 ms
    for (auto& qp : c.qps) c.p.a.engine->detach(qp->qpn());
}
