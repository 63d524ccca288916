// The RC requester's send window (send_window.h): how many packets may be unacknowledged,
// halved by a loss once per flight and grown back by ACKs; and where the requester asks for
// an ACK (RcQp::send_request_packet): twice per window and wherever it stops sending, not
// at every message's end.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <optional>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/psn.h"
#include "transport/send_window.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;
using namespace std::chrono_literals;

TEST_CASE("Send window: opens at its ceiling, halves on a loss once per flight", "[window]") {
    SendWindow w;
    w.set_ceiling(256);
    CHECK(w.packets() == 256);
    CHECK(w.ack_interval() == 128);

    // A loss of PSN 10 while PSN 300 is next: halved.
    CHECK(w.on_loss(10, 300));
    CHECK(w.packets() == 128);
    CHECK(w.ack_interval() == 64);
    // More losses of packets sent before the cut (even resent after it): no further cut.
    CHECK_FALSE(w.on_loss(10, 310));
    CHECK_FALSE(w.on_loss(299, 320));
    CHECK(w.packets() == 128);
    // ACKs inside that flight grow nothing.
    w.on_acknowledged(200, 290);
    CHECK(w.packets() == 128);
    // A loss of a packet sent after the cut is a new flight's.
    CHECK(w.on_loss(300, 400));
    CHECK(w.packets() == 64);
    // Never below the floor.
    for (uint32_t psn = 400; psn < 1000; psn += 100) w.on_loss(psn, psn + 100);
    CHECK(w.packets() == SendWindow::kMinPackets);
}

TEST_CASE("Send window: grows back by a few packets per window acknowledged", "[window]") {
    SendWindow w;
    w.set_ceiling(64);
    REQUIRE(w.on_loss(0, 64));
    REQUIRE(w.packets() == 32);
    // The cut's flight ends when the PSN after it is acknowledged; from then on every window's
    // worth acknowledged adds kGrowthPackets.
    w.on_acknowledged(64, 64);
    CHECK(w.packets() == 32 + SendWindow::kGrowthPackets);
    w.on_acknowledged(3, 67);
    CHECK(w.packets() == 36);
    w.on_acknowledged(1, 68);
    CHECK(w.packets() == 40);
    // Up to the ceiling, not beyond.
    for (uint32_t psn = 100; psn < 2000; psn += 10) w.on_acknowledged(10, psn + 10);
    CHECK(w.packets() == 64);
    // A lower ceiling (more QPs share the engine's budget) lowers it; a higher one does not
    // raise it at once.
    w.set_ceiling(40);
    CHECK(w.packets() == 40);
    w.set_ceiling(256);
    CHECK(w.packets() == 40);
    CHECK(w.ceiling() == 256);
    // A reset QP starts again at its ceiling.
    w.reset();
    w.set_ceiling(100);
    CHECK(w.packets() == 100);
    // A ceiling under the floor is the floor.
    w.reset();
    w.set_ceiling(2);
    CHECK(w.packets() == SendWindow::kMinPackets);
}

TEST_CASE("Send window: a peer known to keep what follows a loss keeps a floor of 64 packets",
          "[window]") {
    SendWindow w;
    w.set_ceiling(256);
    CHECK(w.floor() == SendWindow::kMinPackets);
    // Cut to 32 while the peer is not known to keep: the verdict lifts it to the new floor.
    REQUIRE(w.on_loss(0, 256));
    REQUIRE(w.on_loss(256, 300));
    REQUIRE(w.on_loss(300, 340));
    REQUIRE(w.packets() == 32);
    w.set_peer_keeps();
    CHECK(w.floor() == SendWindow::kKeepingMinPackets);
    CHECK(w.packets() == SendWindow::kKeepingMinPackets);
    // Cuts of new flights stop there.
    for (uint32_t psn = 340; psn < 1000; psn += 100) CHECK(w.on_loss(psn, psn + 100));
    CHECK(w.packets() == SendWindow::kKeepingMinPackets);
    // Never above the ceiling: with 32 (many QPs share the engine's budget) the floor is 32.
    w.set_ceiling(32);
    CHECK(w.floor() == 32);
    CHECK(w.on_loss(1100, 1200));
    CHECK(w.packets() == 32);
    // A reset QP knows nothing of its next peer.
    w.reset();
    w.set_ceiling(256);
    CHECK(w.floor() == SendWindow::kMinPackets);
    for (uint32_t psn = 0; psn < 1000; psn += 100) w.on_loss(psn, psn + 100);
    CHECK(w.packets() == SendWindow::kMinPackets);

    // CNPs cut a keeping peer's window down to kMinPackets, once per flight as well; a later
    // proof of keeping does not lift it again, nor does a loss's cut.
    w.reset();
    w.set_ceiling(256);
    w.set_peer_keeps();
    CHECK(w.on_congestion(0, 100));
    CHECK(w.packets() == 128);
    CHECK_FALSE(w.on_congestion(50, 120));
    for (uint32_t psn = 100; psn < 1000; psn += 100) CHECK(w.on_congestion(psn, psn + 100));
    CHECK(w.packets() == SendWindow::kMinPackets);
    w.set_peer_keeps();
    CHECK(w.packets() == SendWindow::kMinPackets);
    CHECK(w.on_loss(1000, 1100));
    CHECK(w.packets() == SendWindow::kMinPackets);
}

TEST_CASE("Send window: PSNs wrap", "[window]") {
    SendWindow w;
    w.set_ceiling(128);
    REQUIRE(w.on_loss(kPsnMask - 5, 20));  // next PSN past the wrap
    CHECK_FALSE(w.on_loss(kPsnMask, 30));  // before 20, across the wrap: the same flight
    CHECK(w.on_loss(25, 90));
    CHECK(w.packets() == 32);
}

namespace {

bool is_op(const wire::ParsedPacket& p, wire::Opcode op) {
    return p.h.bth.opcode == static_cast<uint8_t>(op);
}

// 512 packets in all: twice the window. Two messages make a train's worth, which a post
// sends at once (RcQp::may_wait): each pump covers two messages or more.
constexpr uint32_t kMessages = 16;
constexpr uint32_t kMessagePackets = 32;
constexpr uint32_t kMessageBytes = kMessagePackets * kMtu;

// Posts kMessages WRITEs of kMessageBytes from a to b as one chain (one ibv_post_send), so
// that the requester sees them all queued at once.
void post_stream(Pair& p, uint64_t seed) {
    for (uint32_t i = 0; i < kMessages; ++i) {
        fill(p.a.at(i * kMessageBytes), kMessageBytes, seed + i);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, seed + i,
                                           {p.a.sge(i * kMessageBytes, kMessageBytes)},
                                           p.b.iova + i * kMessageBytes, p.b.keys.rkey),
                                  i + 1 < kMessages) == 0);
    }
}

void check_stream(Pair& p, uint64_t seed) {
    const auto done = p.wait(*p.a.scq, kMessages);
    REQUIRE(done.size() == kMessages);
    for (const Completion& c : done) CHECK(c.status == WcStatus::Success);
    for (uint32_t i = 0; i < kMessages; ++i) {
        INFO("message " << i);
        CHECK(first_mismatch(p.b.at(i * kMessageBytes), kMessageBytes, seed + i) == kMessageBytes);
    }
}

PairOptions stream_options() {
    PairOptions o;
    o.mem_bytes = kMessages * kMessageBytes;
    return o;
}

// One WRITE of 300 packets from a: the first pump sends a full window of 256 under the QP's
// lock, so what asks in it is exact: packet 127 (half a window since the last ask) and 255
// (the window is full). The rest (256-299) goes once an ACK comes; its last packet asks.
void check_one_long_write(Pair& p, uint64_t seed) {
    constexpr uint32_t kPackets = 300, kLen = kPackets * kMtu;
    TxRecorder a_out(*p.a.engine);
    fill(p.a.at(0), kLen, seed);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, seed, {p.a.sge(0, kLen)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), kLen, seed) == kLen);

    std::map<uint32_t, bool> asks;  // PSN offset -> AckReq of its first transmission
    const auto sent = a_out.packets();
    REQUIRE(!sent.empty());
    const uint32_t psn0 = sent.front().psn();
    for (const SentPacket& s : sent)
        asks.emplace(static_cast<uint32_t>(psn_diff(s.psn(), psn0)), s.parsed().h.bth.ack_req);
    REQUIRE(asks.size() == kPackets);
    std::vector<uint32_t> asking;
    for (const auto& [off, ask] : asks)
        if (ask && off < 256) asking.push_back(off);
    CHECK(asking == std::vector<uint32_t>{127, 255});
    CHECK(asks.at(kPackets - 1));
}

}  // namespace

TEST_CASE("A stream asks for an ACK twice per window, not at every message's end", "[window]") {
    // a has only its local ACK timeout: an adaptive one, b's ACK late on a busy machine,
    // would halve the window, and a halved window asks twice as often.
    PairOptions o = stream_options();
    o.adaptive_a = false;
    Pair p(o);
    p.connect();
    TxRecorder a_out(*p.a.engine);
    TxRecorder b_out(*p.b.engine);
    post_stream(p, 40);
    check_stream(p, 40);

    // The first transmission of each PSN, in order.
    std::map<uint32_t, bool> asks;  // PSN offset -> AckReq
    const auto sent = a_out.packets();
    REQUIRE(!sent.empty());
    const uint32_t psn0 = sent.front().psn();
    for (const SentPacket& s : sent) {
        const uint32_t off = static_cast<uint32_t>(psn_diff(s.psn(), psn0));
        asks.emplace(off, s.parsed().h.bth.ack_req);
    }
    REQUIRE(asks.size() == kMessages * kMessagePackets);
    // The stream's last packet asks: nothing follows it.
    CHECK(asks.at(kMessages * kMessagePackets - 1));
    // A 256-packet window asks at least every 128 packets (so it keeps moving) ...
    int64_t last_ask = -1;
    uint32_t asking = 0, message_ends_asking = 0;
    for (const auto& [off, ask] : asks) {
        if (!ask) continue;
        ++asking;
        if ((off + 1) % kMessagePackets == 0) ++message_ends_asking;
        INFO("packet " << off);
        CHECK(off - last_ask <= 128);
        last_ask = off;
    }
    // ... but far less often than at every message's end and every 16 packets (32 times
    // here), the rule before the window adapted; and many message ends do not ask.
    CHECK(asking <= 20);
    CHECK(message_ends_asking <= kMessages - 4);
    // b answered what was asked, no more (an ACK per packet that asked, at most).
    const size_t acks = b_out.count(
        [](const wire::ParsedPacket& pkt) { return is_op(pkt, wire::Opcode::RcAcknowledge); });
    CHECK(acks >= 1);
    CHECK(acks <= asking + (sent.size() - asks.size()));
}

TEST_CASE("One long message asks for an ACK at half the window and where the window fills",
          "[window]") {
    PairOptions o;
    o.mem_bytes = 300 * kMtu;
    Pair p(o);
    p.connect();
    check_one_long_write(p, 81);
}

TEST_CASE("A message after which the requester must wait asks for an ACK", "[window]") {
    // a WRITEs two packets after a READ; what follows the WRITE cannot go while the READ is
    // outstanding (a fence, or the READ limit of 1), so the WRITE's last packet is where the
    // requester stops: it asks, though more is queued. The WRITE's first packet does not.
    const bool fence = GENERATE(true, false);
    INFO((fence ? "a fenced WRITE follows" : "a second READ follows (max_rd_atomic 1)"));
    PairOptions o;
    o.mem_bytes = 256 * 1024;
    Pair p(o);
    QpAttributes attrs = default_attributes();
    attrs.max_rd_atomic = 1;
    p.connect(attrs, attrs);
    TxRecorder a_out(*p.a.engine);
    // b's READ responses wait until the WRITE went out: only then is the READ surely
    // outstanding when the requester reaches the WRITE.
    constexpr uint32_t kRead = 32 * kMtu, kWrite = 2 * kMtu;
    fill(p.b.at(0), kRead, 61);
    fill(p.a.at(kRead), kWrite, 62);
    fill(p.a.at(kRead + kWrite), kWrite, 63);
    REQUIRE(p.a.qp->post_send(
                rdma_wqe(SendOpcode::RdmaRead, 1, {p.a.sge(0, kRead)}, p.b.iova, p.b.keys.rkey),
                true) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2, {p.a.sge(kRead, kWrite)},
                                       p.b.iova + kRead, p.b.keys.rkey),
                              true) == 0);
    SendWqe third = fence ? rdma_wqe(SendOpcode::RdmaWrite, 3, {p.a.sge(kRead + kWrite, kWrite)},
                                     p.b.iova + kRead + kWrite, p.b.keys.rkey)
                          : rdma_wqe(SendOpcode::RdmaRead, 3, {p.a.sge(kRead + kWrite, kWrite)},
                                     p.b.iova + kRead + kWrite, p.b.keys.rkey);
    third.fence = fence;
    if (!fence) fill(p.b.at(kRead + kWrite), kWrite, 63);
    REQUIRE(p.a.qp->post_send(third) == 0);
    const auto done = p.wait(*p.a.scq, 3);
    REQUIRE(done.size() == 3);
    for (const Completion& c : done) CHECK(c.status == WcStatus::Success);
    CHECK(first_mismatch(p.a.at(0), kRead, 61) == kRead);
    CHECK(first_mismatch(p.b.at(kRead), kWrite, 62) == kWrite);
    CHECK(first_mismatch(fence ? p.b.at(kRead + kWrite) : p.a.at(kRead + kWrite), kWrite, 63) ==
          kWrite);

    std::vector<SentPacket> writes;
    for (const SentPacket& s : a_out.packets())
        if (is_op(s.parsed(), wire::Opcode::RcWriteFirst) ||
            is_op(s.parsed(), wire::Opcode::RcWriteLast))
            writes.push_back(s);
    REQUIRE(writes.size() >= 2);
    const wire::ParsedPacket w0 = writes[0].parsed();
    const wire::ParsedPacket w1 = writes[1].parsed();
    REQUIRE(is_op(w0, wire::Opcode::RcWriteFirst));
    REQUIRE(is_op(w1, wire::Opcode::RcWriteLast));
    CHECK_FALSE(w0.h.bth.ack_req);
    CHECK(w1.h.bth.ack_req);
}

TEST_CASE("A loss halves the send window once per flight", "[window]") {
    // a streams 512 packets with a window of 256. Its first transmission of packet 20 is lost
    // (b NAKs: the window is cut to 128), then its second transmission of packet 50 (a second
    // NAK, for a packet of the flight the cut was for: no second cut), then the first
    // transmission of packet 400 (sent after the cut: a new flight, a second cut). After the
    // first cut no packet leaves more than the window ahead of what b has acknowledged; a
    // reset QP's window is whole again.
    bool clean = false;
    for (int attempt = 0; attempt < 8 && !clean; ++attempt) {
        INFO("attempt " << attempt);
        // Both go back N, as the IBA describes: the second loss must leave a gap (b keeping
        // early requests has packet 50 from its first transmission).
        PairOptions o = stream_options();
        o.selective = false;
        Pair p(o);
        p.connect();
        // One packet first: the round trip is measured (a QP that has measured none resends
        // after 1 ms, which a busy machine reaches).
        const auto resends = [&] {
            const EngineCounters& k = p.a.counters();
            return k.early_retransmits.load() + k.retransmit_timeouts.load();
        };
        fill(p.a.at(0), 64, 60);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 60, {p.a.sge(0, 64)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        if (resends() != 0) continue;  // and its window was cut
        const uint64_t naks0 = p.a.counters().rx_naks.load();
        // Whether a had taken b's first NAK when it sent packet 20 again. A tail probe cuts
        // nothing, but the second one goes back N: when b's engine thread is slow to read, it
        // may resend packet 20 before the NAK arrives, with the window still whole (once in a
        // full run of the unit tests: a packet 256 ahead of what b had acknowledged).
        bool resent_after_nak = false;
        std::map<uint32_t, int> seen;  // PSN offset -> transmissions so far
        std::optional<uint32_t> psn0;
        TxRecorder a_out(*p.a.engine, [&](const wire::ParsedPacket& pkt) {
            if (!is_op(pkt, wire::Opcode::RcWriteFirst) &&
                !is_op(pkt, wire::Opcode::RcWriteMiddle) && !is_op(pkt, wire::Opcode::RcWriteLast))
                return false;
            if (!psn0) psn0 = pkt.h.bth.psn;
            const auto off = static_cast<uint32_t>(psn_diff(pkt.h.bth.psn, *psn0));
            const int n = ++seen[off];
            if (off == 20 && n == 2) resent_after_nak = p.a.counters().rx_naks.load() > naks0;
            return (off == 20 && n == 1) || (off == 50 && n == 2) || (off == 400 && n == 1);
        });
        TxRecorder b_out(*p.b.engine);
        post_stream(p, 70);
        check_stream(p, 70);
        // A timeout on a busy machine is a loss too (and may cut), and a probe's go-back-N
        // may resend packet 20 before the NAK: try again.
        if (resends() != 0 || !resent_after_nak) continue;
        clean = true;
        CHECK(a_out.lost() == 3);
        CHECK(p.a.counters().rx_naks.load() - naks0 == 3);
        CHECK(p.a.counters().send_window_cuts.load() == 2);
        CHECK(p.a.engine->qp_counters(p.a.qp->qpn()).send_window_cuts.load() == 2);

        // b's acknowledgements by time (an ACK or NAK acknowledges what came before its PSN).
        std::vector<std::pair<std::chrono::steady_clock::time_point, int64_t>> acked;
        for (const SentPacket& s : b_out.packets()) {
            const wire::ParsedPacket pkt = s.parsed();
            if (!is_op(pkt, wire::Opcode::RcAcknowledge)) continue;
            const int64_t off = psn_diff(pkt.h.bth.psn, *psn0);
            const bool nak = pkt.h.aeth.type() == wire::AckType::Nak;
            acked.emplace_back(s.when, nak ? off - 1 : off);
        }
        const auto acked_at = [&](std::chrono::steady_clock::time_point t) {
            int64_t best = -1;
            for (const auto& [when, off] : acked)
                if (when < t) best = std::max(best, off);
            return best;
        };
        // From the resend of packet 20 on (a has the NAK), at most 128 packets beyond what b
        // acknowledged, plus what ACKs grew the window by since (a few packets per window).
        bool cut = false;
        int64_t most = 0;
        std::map<uint32_t, int> count;
        for (const SentPacket& s : a_out.packets()) {
            const wire::ParsedPacket pkt = s.parsed();
            if (is_op(pkt, wire::Opcode::RcAcknowledge)) continue;
            const int64_t off = psn_diff(pkt.h.bth.psn, *psn0);
            if (off == 20 && ++count[20] == 2) cut = true;
            if (cut) most = std::max(most, off - acked_at(s.when));
        }
        CHECK(cut);
        CHECK(most <= 128 + 4 * SendWindow::kGrowthPackets);
        CHECK(most >= 16);

        // A QP moved to RESET starts again with its full window.
        for (Side* s : {&p.a, &p.b})
            REQUIRE(s->qp->modify(s->qp->attributes(), QpState::Rts, QpState::Reset) == 0);
        QpAttributes again = default_attributes();
        again.sq_psn = 0x4000;
        p.connect(again, default_attributes());
        check_one_long_write(p, 90);
    }
    CHECK(clean);
}
