// The requester believes only what it sent: responses (ACK, NAK, RNR NAK, READ response)
// whose PSN lies outside [oldest unacknowledged, highest sent] are dropped and counted, a
// fatal NAK fails the request it names, and the retransmission and RNR timers keep the
// durations the IBA gives them.
//
// The peer b is real (it receives a's requests) but silent: what it would answer is recorded
// and not sent, and the test answers for it with forged packets.
#include <catch2/catch.hpp>
#include <chrono>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

ForgedPeer peer_of_a(Pair& p) {
    return ForgedPeer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};
}

double us_of(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
}

SendWqe signaled(SendWqe w) {
    w.signaled = true;
    return w;
}

}  // namespace

TEST_CASE("Requester: responses for PSNs never sent are dropped and counted", "[requester]") {
    PairOptions opt;
    opt.mem_bytes = 2 * 1024 * 1024;
    Pair p(opt);
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;  // 1 s: no retransmission interferes while the test forges answers
    p.connect(attrs, attrs);
    auto silent_b = std::make_unique<TxRecorder>(*p.b.engine, TxRecorder::LosePredicate{}, false);
    const ForgedPeer peer = peer_of_a(p);

    // 1 MiB: 1024 packets, more than the send window, so PSNs are assigned beyond what went out.
    constexpr uint32_t kLen = 1024 * 1024;
    constexpr uint32_t kPkts = kLen / kMtu;
    fill(p.a.at(0), kLen, 5);
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kLen)},
                                                p.b.iova + kLen, p.b.keys.rkey))) == 0);
    // Whatever the window let out has reached b.
    REQUIRE(p.wait_until([&] { return p.b.counters().rx_packets.load() >= 16; }));
    const uint64_t dropped_before = p.a.counters().rx_response_out_of_window.load();

    SECTION("an ACK for the last PSN of the message, not yet sent") {
        peer.inject(peer.ack(kPkts - 1));
    }
    SECTION("a READ response beyond anything sent") {
        const std::vector<uint8_t> payload(64, 0);
        peer.inject(peer.headers(wire::Opcode::RcReadResponseOnly, kPkts + 5), payload);
    }
    SECTION("a READ response for the PSN of a WRITE packet") {
        const std::vector<uint8_t> payload(64, 0);
        peer.inject(peer.headers(wire::Opcode::RcReadResponseOnly, 3), payload);
        // In the window, but no READ owns that PSN.
    }
    SECTION("an ACK far behind (stale)") {
        peer.inject(peer.ack(wire::kPsnMask - 100));
    }
    SECTION("a fatal NAK beyond anything sent") {
        peer.inject(peer.ack(kPkts - 1, wire::AckType::Nak,
                             static_cast<uint8_t>(wire::NakCode::RemoteAccessError)));
    }
    SECTION("an RNR NAK beyond anything sent") {
        peer.inject(peer.ack(kPkts - 1, wire::AckType::RnrNak, 1));
    }
    CHECK(p.a.counters().rx_response_out_of_window.load() == dropped_before + 1);
    CHECK(p.stays_empty(*p.a.scq));
    CHECK(p.a.qp->state() == QpState::Rts);

    // Let b answer for itself: the WRITE completes, and every byte is there.
    silent_b.reset();
    const Completion c = p.wait_one(*p.a.scq, 30s);
    CHECK(c.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(kLen), kLen, 5) == kLen);
    CHECK(all_bytes(p.b.at(0), kLen, kUntouched));
}

TEST_CASE("Requester: a stale RNR NAK neither stalls nor kills the QP", "[requester]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.sq_psn = 1000;
    attrs.rnr_retry = 0;  // one RNR NAK believed would end the QP
    attrs.timeout = 18;
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    const ForgedPeer peer = peer_of_a(p);
    fill(p.a.at(0), 100, 1);
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 100)},
                                                p.b.iova, p.b.keys.rkey))) == 0);
    REQUIRE(p.wait_until([&] { return p.b.counters().rx_packets.load() >= 1; }));

    peer.inject(peer.ack(500, wire::AckType::RnrNak, 0x1f));  // far before PSN 1000
    CHECK(p.a.counters().rx_response_out_of_window.load() == 1);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.stays_empty(*p.a.scq));
    // The genuine ACK still completes the WRITE.
    peer.inject(peer.ack(1000));
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::Success);
    CHECK(c.wr_id == 1);
}

TEST_CASE("Requester: a fatal NAK fails the request whose PSN it names", "[requester]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    const ForgedPeer peer = peer_of_a(p);

    // PSN 0: a READ whose response never comes; PSN 1: a WRITE.
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaRead, 10, {p.a.sge(0, 64)},
                                                p.b.iova, p.b.keys.rkey))) == 0);
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaWrite, 11, {p.a.sge(64, 64)},
                                                p.b.iova + 64, p.b.keys.rkey))) == 0);
    REQUIRE(p.wait_until([&] { return p.b.counters().rx_packets.load() >= 2; }));
    peer.inject(
        peer.ack(1, wire::AckType::Nak, static_cast<uint8_t>(wire::NakCode::RemoteAccessError)));

    const auto done = p.wait(*p.a.scq, 2);
    REQUIRE(done.size() == 2);
    // In order: the READ is flushed (it never completed), the WRITE carries the error.
    CHECK(done[0].wr_id == 10);
    CHECK(done[0].status == WcStatus::WrFlushErr);
    CHECK(done[1].wr_id == 11);
    CHECK(done[1].status == WcStatus::RemAccessErr);
    CHECK(p.a.qp->state() == QpState::Err);
    CHECK(all_bytes(p.a.at(0), 64, kUntouched));
}

TEST_CASE("Requester: a PSN sequence NAK restarts the retransmission timer", "[requester]") {
    // The IBA's local ACK timeout alone: no adaptive timeout resends before the NAK.
    PairOptions o;
    o.adaptive = false;
    Pair p(o);
    QpAttributes attrs = default_attributes();
    attrs.timeout = 16;  // 4.096 us * 2^16 = 268 ms
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    TxRecorder a_out(*p.a.engine);
    const ForgedPeer peer = peer_of_a(p);
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 100)},
                                                p.b.iova, p.b.keys.rkey))) == 0);
    REQUIRE(p.wait_until([&] { return a_out.count_opcode(wire::Opcode::RcWriteOnly) >= 1; }));
    // Part-way into the timeout, the peer says it expects PSN 0 again.
    std::this_thread::sleep_for(150ms);
    const auto nak_time = std::chrono::steady_clock::now();
    peer.inject(
        peer.ack(0, wire::AckType::Nak, static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
    // One resend for the NAK, then one for the timer.
    REQUIRE(p.wait_until([&] { return a_out.count_opcode(wire::Opcode::RcWriteOnly) >= 3; }, 5s));
    const auto sends = a_out.with_opcode(wire::Opcode::RcWriteOnly);
    CHECK(sends[1].when >= nak_time);
    // The timer counts a full timeout from the NAK, not from the first transmission.
    const auto after_nak = sends[2].when - nak_time;
    INFO("timer resend " << us_of(after_nak) / 1000 << " ms after the NAK");
    CHECK(after_nak >= 265ms);
}

TEST_CASE("Requester: retransmissions follow timeout and retry_cnt exactly", "[requester]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 8;  // 4.096 us * 2^8 = 1.05 ms
    attrs.retry_cnt = 3;
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    TxRecorder a_out(*p.a.engine);
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 100)},
                                                p.b.iova, p.b.keys.rkey))) == 0);
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::RetryExcErr);
    // The first transmission and retry_cnt retries, no more.
    const auto sends = a_out.with_opcode(wire::Opcode::RcWriteOnly);
    CHECK(sends.size() == 4);
    CHECK(p.a.counters().retransmit_timeouts.load() == 4);
    for (size_t i = 1; i < sends.size(); ++i) {
        const auto gap = sends[i].when - sends[i - 1].when;
        INFO("gap " << i << ": " << us_of(gap) << " us");
        CHECK(gap >= 1040us);
    }
}

TEST_CASE("Requester: an RNR NAK waits the time its timer code gives", "[requester]") {
    // a has only its local ACK timeout (67 ms): with adaptive retransmission, a has no round
    // trip measured (an RNR NAK gives none) and probes its resend after 1-4 ms when b's RNR
    // NAK comes later than that, a gap shorter than the RNR wait that the wait did not make
    // (CI, and 4 in 60 runs beside two busy loops, 2026-12-06).
    PairOptions o;
    o.adaptive_a = false;
    Pair p(o);
    QpAttributes pa = default_attributes();
    QpAttributes pb = default_attributes();
    pb.min_rnr_timer = 18;  // IBA table: 5.12 ms
    p.connect(pa, pb);
    TxRecorder a_out(*p.a.engine);
    fill(p.a.at(0), 200, 3);
    REQUIRE(p.a.qp->post_send(signaled(send_wqe(1, {p.a.sge(0, 200)}))) == 0);
    // b has no receive posted: it answers RNR NAK until one is.
    REQUIRE(p.wait_until([&] { return a_out.count_opcode(wire::Opcode::RcSendOnly) >= 3; }, 5s));
    REQUIRE(p.b.qp->post_recv(recv_wqe(2, {p.b.sge(0, 200)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), 200, 3) == 200);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const auto sends = a_out.with_opcode(wire::Opcode::RcSendOnly);
    REQUIRE(sends.size() >= 3);
    for (size_t i = 1; i < sends.size(); ++i) {
        const auto gap = sends[i].when - sends[i - 1].when;
        INFO("gap " << i << ": " << us_of(gap) << " us");
        CHECK(gap >= 5100us);
    }
    CHECK(p.a.counters().tail_probes.load() == 0);
}

// READ responses must come in order (FIRST, MIDDLE..., LAST, or ONLY) with full-MTU payloads
// except the last, whose payload is exactly what remains: anything else fails the READ with
// a bad-response error and writes nothing beyond what the READ asked for.
TEST_CASE("Requester: READ responses out of order or of the wrong length fail the READ",
          "[requester]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;  // ~1 s: no retransmission while the test answers
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    const ForgedPeer peer = peer_of_a(p);
    constexpr uint32_t kLen = 3 * kMtu;
    REQUIRE(p.a.qp->post_send(signaled(rdma_wqe(SendOpcode::RdmaRead, 7, {p.a.sge(0, kLen)},
                                                p.b.iova, p.b.keys.rkey))) == 0);
    REQUIRE(p.wait_until([&] { return p.b.counters().rx_packets.load() >= 1; }));
    const uint32_t psn = attrs.sq_psn;  // the READ is a's first request
    std::vector<uint8_t> full(kMtu, 0x11);
    bool expect_partial = false;

    SECTION("a MIDDLE response first") {
        peer.inject(peer.headers(wire::Opcode::RcReadResponseMiddle, psn), full);
    }
    SECTION("a FIRST response shorter than the MTU") {
        std::vector<uint8_t> short_one(kMtu - 24, 0x11);
        peer.inject(peer.headers(wire::Opcode::RcReadResponseFirst, psn), short_one);
    }
    SECTION("a LAST response longer than what remains") {
        peer.inject(peer.headers(wire::Opcode::RcReadResponseFirst, psn), full);
        peer.inject(peer.headers(wire::Opcode::RcReadResponseMiddle, psn + 1), full);
        std::vector<uint8_t> too_long(kMtu + 64, 0x11);
        peer.inject(peer.headers(wire::Opcode::RcReadResponseLast, psn + 2), too_long);
        expect_partial = true;
    }
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.wr_id == 7);
    CHECK(c.status == WcStatus::BadResp);
    CHECK(p.a.qp->state() == QpState::Err);
    // Nothing beyond the READ's buffer, ever; nothing at all when the first response is bad.
    CHECK(all_bytes(p.a.at(kLen), 4096, kUntouched));
    if (!expect_partial) CHECK(all_bytes(p.a.at(0), kLen, kUntouched));
}

TEST_CASE("Requester: nothing posted after a failed bind reaches the peer", "[requester][mw]") {
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;  // 1 s: no timer resend while the test answers by hand
    Hostile t(attrs);
    auto& a = t.p.a;
    REQUIRE(a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {a.sge(0, 64)}, t.p.b.iova,
                                     t.p.b.keys.rkey)) == 0);
    REQUIRE(t.p.wait_until([&] { return t.a_out.count_opcode(wire::Opcode::RcWriteOnly) == 1; }));
    // A bind of a window that does not exist fails; the WRITE after it must not go out (the
    // peer would execute it, and the application be told it was flushed).
    SendWqe bind;
    bind.wr_id = 2;
    bind.opcode = SendOpcode::BindMw;
    bind.bind.mw_rkey = 0x12345678;
    bind.bind.new_rkey = 0x12345679;
    bind.bind.mr_lkey = a.keys.lkey;
    bind.bind.addr = a.addr(0);
    bind.bind.length = 64;
    bind.bind.access = kRemoteWrite;
    REQUIRE(a.qp->post_send(bind) == 0);
    REQUIRE(a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 3, {a.sge(64, 64)}, t.p.b.iova + 64,
                                     t.p.b.keys.rkey)) == 0);
    t.p.wait_until([] { return false; }, 100ms);
    CHECK(t.a_out.count([](const wire::ParsedPacket& p) { return p.h.bth.psn == 1; }) == 0);
    t.peer.inject(t.peer.ack(0));
    const auto cs = t.p.wait(*a.scq, 3);
    REQUIRE(cs.size() == 3);
    CHECK(cs[0].status == WcStatus::Success);
    CHECK(cs[1].status == WcStatus::MwBindErr);
    CHECK(cs[2].status == WcStatus::WrFlushErr);
    CHECK(a.qp->state() == QpState::Err);
}

TEST_CASE("Requester: a READ its responder stops part-way fails with the NAK's error",
          "[requester][read]") {
    QpAttributes attrs = default_attributes();
    // ~1 s: two timeouts of 4 ms (retry_cnt 1) failed the READ before the forged answers
    // whenever the test thread was held off the CPU that long.
    attrs.timeout = 18;
    attrs.retry_cnt = 1;
    Hostile t(attrs);
    auto& a = t.p.a;
    constexpr uint32_t kPkts = 4;
    REQUIRE(a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 1, {a.sge(0, kPkts * kMtu)}, t.p.b.iova,
                                     t.p.b.keys.rkey)) == 0);
    REQUIRE(t.p.wait_until([&] { return t.a_out.count_opcode(wire::Opcode::RcReadRequest) >= 1; }));
    // Two responses, then the responder's region goes away: a remote access error NAK for the
    // READ request's PSN (as uroce's responder and rxe send it), before the responses taken.
    const std::vector<uint8_t> data(kMtu, 7);
    t.peer.inject(t.peer.headers(wire::Opcode::RcReadResponseFirst, 0), data);
    t.peer.inject(t.peer.headers(wire::Opcode::RcReadResponseMiddle, 1), data);
    t.peer.inject(
        t.peer.ack(0, wire::AckType::Nak, static_cast<uint8_t>(wire::NakCode::RemoteAccessError)));
    const Completion c = t.p.wait_one(*a.scq);
    CHECK(c.status == WcStatus::RemAccessErr);
    CHECK(a.qp->state() == QpState::Err);
    CHECK(t.p.stays_empty(*a.scq));  // once
}
