// Selective recovery, the requester's half (rc_selective_resend.cpp): a sequence NAK is
// answered with the lost packet and the newest one, a peer that keeps nothing gets go-back-N,
// and a peer known to keep gets selective resends for a few losses in a row and for the
// timer's probes. A forged responder answers for a silent b; the probes, which need a
// measured round trip and a real b, are in test_adaptive_retransmit.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <initializer_list>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/congestion.h"
#include "transport/send_window.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

// a sends WRITEs to a b that answers nothing: the test answers for it. Only the local ACK
// timeout (1 s) could resend, so every packet a sends is an answer to what the test forged.
struct SilentResponder {
    SilentResponder() : p(options()) {
        QpAttributes attrs = default_attributes();
        attrs.timeout = 18;
        p.connect(attrs, attrs);
        fill(p.a.at(0), p.a.mem.size(), 3);
    }
    static PairOptions options() {
        PairOptions o;
        o.adaptive = false;
        o.mem_bytes = 512 * 1024;
        return o;
    }
    // Posts an 8-packet WRITE and waits until all of it went out; clears the record.
    void write8(uint64_t wr_id) {
        const size_t before = a_out.packets().size();
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, wr_id, {p.a.sge(0, 8 * kMtu)},
                                           p.b.iova, p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_until([&] { return a_out.packets().size() >= before + 8; }));
        a_out.clear();
    }
    void nak(uint32_t psn) {
        peer.inject(peer.ack(psn, wire::AckType::Nak,
                             static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
    }
    // The PSNs a sends within a short while, and whether each asked for an ACK.
    std::vector<std::pair<uint32_t, bool>> sends(size_t at_least) {
        REQUIRE(p.wait_until([&] { return a_out.packets().size() >= at_least; }));
        p.wait_until([] { return false; }, 30ms);  // and nothing more
        std::vector<std::pair<uint32_t, bool>> out;
        for (const SentPacket& s : a_out.packets())
            out.emplace_back(s.psn(), s.parsed().h.bth.ack_req);
        a_out.clear();
        return out;
    }
    std::vector<uint32_t> psns(size_t at_least) {
        std::vector<uint32_t> out;
        for (const auto& [psn, ack] : sends(at_least)) out.push_back(psn);
        return out;
    }
    // An 8-packet WRITE from PSN `first` whose packet first + 2 is lost, then first + 3 too
    // (or dropped by the peer): a selective resend, then go-back-N from first + 3.
    void tried_then_back(uint64_t wr_id, uint32_t first) {
        write8(wr_id);
        nak(first + 2);
        CHECK(psns(2) == std::vector<uint32_t>{first + 2, first + 7});
        nak(first + 3);
        CHECK(psns(5) ==
              std::vector<uint32_t>{first + 3, first + 4, first + 5, first + 6, first + 7});
        done(first + 7, wr_id);
    }
    // A NAK for each of `lost` in turn, each answered by a selective resend of it and of
    // `tail`, the newest packet.
    void selectively(std::initializer_list<uint32_t> lost, uint32_t tail) {
        for (const uint32_t psn : lost) {
            INFO("NAK for " << psn);
            nak(psn);
            CHECK(psns(2) == std::vector<uint32_t>{psn, tail});
        }
    }
    // An 8-packet WRITE from PSN `first` whose packet first + 2 is lost: go-back-N at once.
    void back_at_once(uint64_t wr_id, uint32_t first) {
        write8(wr_id);
        nak(first + 2);
        CHECK(psns(6) == std::vector<uint32_t>{first + 2, first + 3, first + 4, first + 5,
                                               first + 6, first + 7});
        done(first + 7, wr_id);
    }
    void done(uint32_t last_psn, uint64_t wr_id) {
        peer.inject(peer.ack(last_psn));
        const Completion c = p.wait_one(*p.a.scq);
        CHECK(c.wr_id == wr_id);
        CHECK(c.status == WcStatus::Success);
    }

    Pair p;
    TxRecorder silent_b{*p.b.engine, {}, false};
    TxRecorder a_out{*p.a.engine};
    ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};
};

using Psns = std::vector<uint32_t>;

}  // namespace

TEST_CASE("Requester: a sequence NAK draws the lost packet and the newest one, asking for an ACK",
          "[selective][requester]") {
    SilentResponder t;
    t.write8(1);  // PSNs 0-7
    t.nak(2);
    const auto out = t.sends(2);
    REQUIRE(out.size() == 2);
    CHECK(out[0] == std::pair<uint32_t, bool>{2, true});
    CHECK(out[1] == std::pair<uint32_t, bool>{7, true});
    CHECK(t.p.a.counters().selective_resends.load() == 1);
    CHECK(t.p.a.counters().retransmitted_packets.load() == 2);
    CHECK(t.p.a.engine->qp_counters(t.p.a.qp->qpn()).selective_resends.load() == 1);
    t.done(7, 1);
}

TEST_CASE("Requester: a peer that keeps nothing gets go-back-N, after three tries for good",
          "[selective][requester]") {
    SilentResponder t;
    t.tried_then_back(1, 0);   // PSNs 0-7: a first try
    t.tried_then_back(2, 8);   // PSNs 8-15: a second
    t.tried_then_back(3, 16);  // PSNs 16-23: a third
    t.back_at_once(4, 24);     // PSNs 24-31: no more
    CHECK(t.p.a.counters().selective_resends.load() == 3);
}

TEST_CASE("Requester: a peer that kept is answered selectively, three losses in a row at most",
          "[selective][requester]") {
    SilentResponder t;
    t.write8(1);  // PSNs 0-7
    t.nak(2);
    CHECK(t.psns(2) == Psns{2, 7});
    t.nak(5);  // it had 3 and 4, never sent again: it keeps; 5 is missing too
    CHECK(t.psns(2) == Psns{5, 7});
    t.done(7, 1);
    // PSNs 8-15: 10 lost, then 11, 12 and 13 as well (or the peer stopped keeping): the
    // packet after each resent one draws another selective resend, three in a row, then the
    // requester goes back N from the fourth.
    t.write8(2);
    t.selectively({10, 11, 12}, 15);
    t.nak(13);
    CHECK(t.psns(3) == Psns{13, 14, 15});
    t.done(15, 2);
    // PSNs 16-31, still known to keep: 18, 19 and 20 lost in a row, then 22 after 21 that
    // was kept: that proof starts the count of the row again, and 23 and 24 lost in a row
    // are resent selectively as well; 25 after them goes back N.
    t.write8(3);
    t.write8(4);
    t.selectively({18, 19, 20, 22, 23, 24}, 31);
    t.nak(25);
    CHECK(t.psns(7) == Psns{25, 26, 27, 28, 29, 30, 31});
    t.peer.inject(t.peer.ack(31));
    const auto done = t.p.wait(*t.p.a.scq, 2);
    REQUIRE(done.size() == 2);
    CHECK(done[0].wr_id == 3);
    CHECK(done[1].wr_id == 4);
    CHECK(t.p.a.counters().selective_resends.load() == 11);
}

// A responder that keeps sends its NAK again when the newest packet comes again ahead of the
// gap (rc_responder.cpp): after a selective resend, that says the resent packet was lost.
TEST_CASE("Requester: the same NAK again after a selective resend draws it again, a few times",
          "[selective][requester]") {
    SilentResponder t;
    SECTION("a peer not known to keep yet: twice") {
        t.write8(1);  // PSNs 0-7
        t.nak(2);
        CHECK(t.psns(2) == Psns{2, 7});
        t.selectively({2, 2}, 7);
        t.nak(2);
        CHECK(t.psns(0).empty());
        CHECK(t.p.a.counters().retransmitted_packets.load() == 6);
        t.done(7, 1);
    }
    SECTION("a peer known to keep: four times") {
        t.write8(1);
        t.nak(2);
        CHECK(t.psns(2) == Psns{2, 7});
        t.nak(5);  // 3 and 4 kept: known to keep
        CHECK(t.psns(2) == Psns{5, 7});
        t.selectively({5, 5, 5, 5}, 7);
        t.nak(5);
        CHECK(t.psns(0).empty());
        t.done(7, 1);
    }
    SECTION("a peer known to keep, after a go-back-N: selectively") {
        t.write8(1);  // PSNs 0-7: known to keep
        t.nak(2);
        CHECK(t.psns(2) == Psns{2, 7});
        t.nak(5);
        CHECK(t.psns(2) == Psns{5, 7});
        t.done(7, 1);
        t.write8(2);  // PSNs 8-15: three in a row, then back N from 13
        t.selectively({10, 11, 12}, 15);
        t.nak(13);
        CHECK(t.psns(3) == Psns{13, 14, 15});
        t.nak(13);  // 13 lost again: the peer kept 14 and 15
        CHECK(t.psns(2) == Psns{13, 15});
        t.done(15, 2);
    }
    SECTION("a peer not known yet, after a go-back-N: nothing, it is under way") {
        t.write8(1);
        t.nak(2);
        CHECK(t.psns(2) == Psns{2, 7});
        t.nak(3);  // nothing kept: back N from 3
        CHECK(t.psns(5) == Psns{3, 4, 5, 6, 7});
        t.nak(3);
        CHECK(t.psns(0).empty());
        t.done(7, 1);
    }
    CHECK(t.p.a.counters().retransmit_timeouts.load() == 0);
}

TEST_CASE("Requester: an answer to packets a go-back-N sent again proves nothing kept",
          "[selective][requester]") {
    SilentResponder t;
    t.write8(1);  // PSNs 0-7: a first try, nothing kept, go back N from 3
    t.nak(2);
    CHECK(t.psns(2) == Psns{2, 7});
    t.nak(3);
    CHECK(t.psns(5) == Psns{3, 4, 5, 6, 7});
    // A NAK for 5, late (the peer sent it before it took the packets sent again), draws a
    // selective resend: 6 lies between 5 and 7, but went again with the go-back-N, and the
    // ACK that follows shows only that the peer took it then.
    t.nak(5);
    CHECK(t.psns(2) == Psns{5, 7});
    t.done(7, 1);
    // Still not known to keep: the next two losses in a row go back N, and they are the
    // second and third strikes.
    t.tried_then_back(2, 8);
    t.tried_then_back(3, 16);
    t.back_at_once(4, 24);
    CHECK(t.p.a.counters().selective_resends.load() == 4);
}

TEST_CASE("Requester: with selective recovery off, a sequence NAK goes back N",
          "[selective][requester]") {
    PairOptions o = SilentResponder::options();
    o.selective = false;
    Pair p(o);
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    TxRecorder a_out(*p.a.engine);
    const ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(),
                          p.a.qp->qpn()};
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 8 * kMtu)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_until([&] { return a_out.packets().size() >= 8; }));
    a_out.clear();
    peer.inject(
        peer.ack(2, wire::AckType::Nak, static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
    REQUIRE(p.wait_until([&] { return a_out.packets().size() >= 6; }));
    p.wait_until([] { return false; }, 30ms);
    Psns out;
    for (const SentPacket& s : a_out.packets()) out.push_back(s.psn());
    CHECK(out == Psns{2, 3, 4, 5, 6, 7});
    CHECK(p.a.counters().selective_resends.load() == 0);
}

TEST_CASE("Requester: an answer covering only packets sent again proves nothing kept",
          "[selective][requester]") {
    SilentResponder t;
    // A 4-packet WRITE (PSNs 0-3): the NAK names 2, whose newest packet is 3, right after it.
    REQUIRE(t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {t.p.a.sge(0, 4 * kMtu)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
    REQUIRE(t.p.wait_until([&] { return t.a_out.packets().size() >= 4; }));
    t.a_out.clear();
    t.nak(2);
    CHECK(t.psns(2) == Psns{2, 3});
    t.done(3, 1);  // 2 and 3 both came again: no proof that the peer keeps
    // So three answers showing nothing kept still make it give up.
    t.tried_then_back(2, 4);   // PSNs 4-11
    t.tried_then_back(3, 12);  // PSNs 12-19
    t.tried_then_back(4, 20);  // PSNs 20-27
    t.back_at_once(5, 28);     // PSNs 28-35
}

TEST_CASE("Requester: a NAK in the middle of a go-back-N goes back N", "[selective][requester]") {
    SilentResponder t;
    // 300 packets: the first pump sends a window of 256 (PSNs 0-255).
    constexpr uint32_t kPackets = 300;
    REQUIRE(t.p.a.mem.size() >= kPackets * kMtu);
    REQUIRE(t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {t.p.a.sge(0, kPackets * kMtu)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
    REQUIRE(t.p.wait_until([&] { return t.a_out.packets().size() >= 256; }));
    t.p.wait_until([] { return false; }, 30ms);
    t.a_out.clear();
    t.nak(2);
    CHECK(t.psns(2) == Psns{2, 255});
    // Nothing kept: go back N from 3, within the window the NAK halved (128 from PSN 3).
    t.nak(3);
    const Psns back = t.psns(128);
    REQUIRE(back.size() == 128);
    CHECK(back.front() == 3);
    CHECK(back.back() == 130);
    // Packet 50 of that resend was lost: 131-255 are still to go again, so the NAK goes back
    // N from 50, not a selective resend of 50 and 255.
    t.nak(50);
    const Psns again = t.psns(2);
    REQUIRE(again.size() >= 2);
    CHECK(again[0] == 50);
    CHECK(again[1] == 51);
    CHECK(t.p.a.counters().selective_resends.load() == 1);
}

TEST_CASE("Requester: a NAK for a READ after a selective resend is no strike against keeping",
          "[selective][requester]") {
    SilentResponder t;
    const std::vector<uint8_t> data(64, 9);
    // Twice: a 2-packet WRITE, a READ, a 2-packet WRITE; the WRITE's second packet is lost
    // (a selective resend), then the peer NAKs the READ after it, which no peer keeps. That
    // says nothing of keeping: back N from the READ, and no strike.
    for (uint32_t round = 0; round < 3; ++round) {
        INFO("round " << round);
        const uint32_t first = 5 * round;
        const uint64_t id = 10 * round;
        REQUIRE(
            t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, id + 1, {t.p.a.sge(0, 2 * kMtu)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
        REQUIRE(
            t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, id + 2, {t.p.a.sge(64 * 1024, 64)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
        REQUIRE(
            t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, id + 3, {t.p.a.sge(0, 2 * kMtu)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
        CHECK(t.psns(5) == Psns{first, first + 1, first + 2, first + 3, first + 4});
        t.nak(first + 1);
        CHECK(t.psns(2) == Psns{first + 1, first + 4});
        t.nak(first + 2);
        CHECK(t.psns(3) == Psns{first + 2, first + 3, first + 4});
        wire::Headers response = t.peer.headers(wire::Opcode::RcReadResponseOnly, first + 2);
        response.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, 0x1f);
        t.peer.inject(response, data);
        t.peer.inject(t.peer.ack(first + 4));
        const auto done = t.p.wait(*t.p.a.scq, 3);
        REQUIRE(done.size() == 3);
        for (const Completion& c : done) CHECK(c.status == WcStatus::Success);
        CHECK(std::vector<uint8_t>(t.p.a.at(64 * 1024), t.p.a.at(64 * 1024) + 64) == data);
    }
    // The next loss still gets a selective resend: three strikes would have ended them.
    t.write8(30);  // PSNs 15-22
    t.nak(17);
    CHECK(t.psns(2) == Psns{17, 22});
    t.done(22, 30);
}

// A loss to a peer known to keep costs two packets, whatever the window: the window's cut only
// brakes, and stops at 64 packets (send_window.h), where it stops at 16 for any other peer.
TEST_CASE("Requester: to a peer known to keep, losses cut the send window to 64 packets, no lower",
          "[selective][requester][window]") {
    SilentResponder t;
    const auto range = [](uint32_t first, uint32_t last) {
        Psns out;
        for (uint32_t psn = first; psn <= last; ++psn) out.push_back(psn);
        return out;
    };
    // One 512-packet WRITE: the window's 256 packets leave.
    REQUIRE(t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {t.p.a.sge(0, 512 * kMtu)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
    CHECK(t.psns(256) == range(0, 255));
    t.nak(2);  // a loss: the window is cut to 128
    CHECK(t.psns(2) == Psns{2, 255});
    t.nak(5);  // 3 and 4 were kept: the peer keeps; a loss of the same flight cuts nothing
    CHECK(t.psns(2) == Psns{5, 255});
    t.peer.inject(t.peer.ack(200));  // 55 in flight: 73 more
    CHECK(t.psns(73) == range(256, 328));
    t.nak(256);  // a loss of the flight after the cut: to 64
    CHECK(t.psns(2) == Psns{256, 328});
    t.peer.inject(t.peer.ack(300));  // 28 in flight: 36 more
    CHECK(t.psns(36) == range(329, 364));
    // Another flight's loss: halving would leave 32, fewer than the 35 in flight. The floor
    // keeps 64: 29 more.
    t.nak(330);
    Psns expected{330, 364};
    for (const uint32_t psn : range(365, 393)) expected.push_back(psn);
    CHECK(t.psns(31) == expected);
    // Three cuts: a flight is what was sent before the cut, not the whole message (512
    // packets, posted at once).
    CHECK(t.p.a.counters().send_window_cuts.load() == 3);
}

// A CNP is congestion itself, whatever the peer keeps: its cuts go below the keeping peer's
// floor of 64 packets, down to 16 (send_window.h, congestion.h).
TEST_CASE("Requester: CNPs cut a keeping peer's send window below 64 packets",
          "[selective][requester][window][congestion]") {
    SilentResponder t;
    const std::vector<uint8_t> reserved(wire::kCnpReservedBytes, 0);
    const auto cnp = [&] { t.peer.inject(cnp_headers(t.p.a.qp->qpn()), reserved); };
    REQUIRE(t.p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {t.p.a.sge(0, 512 * kMtu)},
                                         t.p.b.iova, t.p.b.keys.rkey)) == 0);
    REQUIRE(t.psns(256).size() == 256);
    t.nak(2);
    CHECK(t.psns(2) == Psns{2, 255});
    t.nak(5);  // the peer keeps
    CHECK(t.psns(2) == Psns{5, 255});
    // Each round: everything sent acknowledged, then the next flight goes out and draws a
    // CNP. The flights shrink (plus the window's growth) below 64.
    uint32_t high = 255;
    std::vector<size_t> flights;
    for (int round = 0; round < 3; ++round) {
        t.peer.inject(t.peer.ack(high));
        const Psns out = t.psns(1);
        REQUIRE(!out.empty());
        CHECK(out.front() == high + 1);
        high = out.back();
        flights.push_back(out.size());
        cnp();
    }
    INFO("flights " << flights[0] << ", " << flights[1] << ", " << flights[2]);
    CHECK(t.p.a.counters().cnp_window_cuts.load() == 3);
    CHECK(flights[2] < SendWindow::kKeepingMinPackets);
    t.peer.inject(t.peer.ack(high));
    const size_t last = t.psns(1).size();
    CHECK(last < flights[2]);
}
