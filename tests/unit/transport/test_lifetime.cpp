// Destroying a QP is safe at any moment: with its retransmission timer firing, with packets
// for it being delivered on the engine thread, with work in flight. After Engine::detach()
// returns nothing touches the QP again (run under ASan to see it: the suite does).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

// A QP on `s`'s engine connected to `peer_qpn` at `peer_ip`, in RTS.
std::shared_ptr<RcQp> connected_qp(Side& s, const IpAddress& peer_ip, uint32_t peer_qpn,
                                   uint8_t timeout) {
    auto qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                     QpCaps{64, 64, kMaxSge, kMaxSge, kMaxInlineData}, s.scq, s.rcq,
                                     nullptr);
    s.engine->attach(qp);
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = peer_ip;
    attrs.dest_qpn = peer_qpn;
    attrs.timeout = timeout;
    attrs.retry_cnt = 7;
    bring_up(*qp, attrs);
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
    REQUIRE(p.wait_until([&] { return landed(p.b.at(100), 5000, 9); }));
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

// ibv_rc_pingpong's end: the last message's completion reaches the application while the
// receive batch that executed it has not sent its ACK yet, and the application destroys the
// QP at once. The ACK is owed all the same: without it the requester retries until
// RETRY_EXC_ERR and reports a failure for a message that was delivered.
TEST_CASE("Lifetime: a QP stopped right after a receive completes still sends its ACK",
          "[lifetime]") {
    Pair p;
    p.connect();
    TxRecorder b_out(*p.b.engine, {}, false);
    RecvWqe r;
    r.wr_id = 77;
    r.sgl = sgl({p.b.sge(0, 64)});
    REQUIRE(p.b.qp->post_recv(r) == 0);
    const uint32_t psn = p.b.qp->attributes().rq_psn;
    const ForgedPeer a_as_peer{*p.b.engine, p.a.ip, p.b.engine->config().port, p.a.qp->qpn(),
                               p.b.qp->qpn()};
    wire::Headers h = a_as_peer.headers(wire::Opcode::RcSendOnly, psn);
    h.bth.ack_req = true;
    std::vector<uint8_t> message(64);
    fill(message.data(), message.size(), 5);
    p.b.engine->receive_datagram(a_as_peer.forge(h, message), p.a.ip, p.b.engine->config().port,
                                 /*send_acks=*/false);
    const Completion c = p.wait_one(*p.b.rcq);
    REQUIRE(c.status == WcStatus::Success);
    REQUIRE(first_mismatch(p.b.at(0), 64, 5) == 64);
    REQUIRE(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 0);

    SECTION("destroyed") {
        p.b.engine->detach(p.b.qp->qpn());
    }
    SECTION("moved to the error state") {
        REQUIRE(p.b.qp->modify(p.b.qp->attributes(), QpState::Rts, QpState::Err) == 0);
    }
    // Twice: the second copy is the last ACK sent again (RcQp::send_last_ack), in case the
    // first is lost; no resend of the message would be answered any more.
    const auto acks = b_out.with_opcode(wire::Opcode::RcAcknowledge);
    REQUIRE(acks.size() == 2);
    for (const auto& ack : acks) {
        CHECK(ack.parsed().h.bth.psn == psn);
        CHECK(ack.parsed().h.aeth.type() == wire::AckType::Ack);
        CHECK(ack.parsed().h.aeth.msn == 1);
    }
    CHECK(p.b.counters().tx_last_ack_repeats.load() == 1);
}

// The ACK that named the peer's last message is lost, and the application, its completion
// seen, destroys the QP at once: no resend of that message will be answered. The last ACK,
// sent again as the QP stops, completes it. a may not retry (retry_cnt 0) and resends only
// after 1 s (no adaptive timer): without the second copy its SEND fails with RETRY_EXC_ERR,
// and a peer that retries for ever (the kernel's rxe with retry_cnt 7) would hang.
TEST_CASE("Lifetime: a QP stopped after its last ACK was lost sends that ACK again", "[lifetime]") {
    PairOptions o;
    o.adaptive = false;
    o.faults_b.drop = 1.0;
    o.faults_b.until = 1;  // the first ACK only
    o.faults_b.op_classes = kOpAck;
    Pair p(o);
    QpAttributes pa = default_attributes();
    pa.timeout = 18;  // 1.07 s
    pa.retry_cnt = 0;
    p.connect(pa, default_attributes());
    fill(p.a.at(0), 256, 41);
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 256)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(0, 256)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    REQUIRE(r.status == WcStatus::Success);
    REQUIRE(first_mismatch(p.b.at(0), 256, 41) == 256);
    REQUIRE(eventually([&] { return p.b.counters().tx_dropped_fault.load() == 1; }));
    SECTION("destroyed") {
        p.b.engine->detach(p.b.qp->qpn());
    }
    SECTION("moved to the error state") {
        REQUIRE(p.b.qp->modify(p.b.qp->attributes(), QpState::Rts, QpState::Err) == 0);
    }
    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.wr_id == 2);
    CHECK(s.status == WcStatus::Success);
    CHECK(p.b.counters().tx_last_ack_repeats.load() == 1);
    CHECK(p.a.counters().retransmitted_packets.load() == 0);
}

// Long after its last ACK (here: more than last_ack_repeat_micros and the local ACK
// timeout), a QP that stops sends nothing: a peer that lost that ACK has retried and been
// answered meanwhile, and its QP number may now belong to another connection.
TEST_CASE("Lifetime: a QP stopped long after its last ACK does not send it again", "[lifetime]") {
    PairOptions o;
    o.last_ack_repeat_micros = 1000;
    // No probe from a (its first one would come 1 ms after the SEND, no round trip measured):
    // b's ACK of that copy would be one more ACK than the test counted.
    o.adaptive_a = false;
    Pair p(o);
    QpAttributes pb = default_attributes();
    pb.timeout = 1;  // 8 us: the 1 ms above decides
    p.connect(default_attributes(), pb);
    TxRecorder b_out(*p.b.engine);  // records, and sends
    fill(p.a.at(0), 256, 42);
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 256)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(0, 256)})) == 0);
    REQUIRE(p.wait_one(*p.b.rcq).status == WcStatus::Success);
    REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const size_t acks = b_out.count_opcode(wire::Opcode::RcAcknowledge);
    REQUIRE(acks >= 1);
    std::this_thread::sleep_for(20ms);
    p.b.engine->detach(p.b.qp->qpn());
    CHECK(b_out.count_opcode(wire::Opcode::RcAcknowledge) == acks);
    CHECK(p.b.counters().tx_last_ack_repeats.load() == 0);
}

// close() must not return while a timer callback of the QP is running: the caller frees the
// QP next. The hook holds one callback in flight (before it takes the QP's lock) while the
// test destroys the QP.
TEST_CASE("Lifetime: destroying a QP waits for its running timer callback", "[lifetime]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 8;  // ~1 ms: the retransmission timer fires soon
    p.connect(attrs, attrs);
    TxRecorder silent_b(*p.b.engine, {}, false);
    std::atomic<int> callback{0};  // 1: held in the hook, 2: hook done
    const uint32_t qpn = p.a.qp->qpn();
    p.a.engine->set_timer_hook([&callback, qpn](uint32_t which) {
        int idle = 0;
        if (which != qpn || !callback.compare_exchange_strong(idle, 1)) return;
        std::this_thread::sleep_for(300ms);
        callback = 2;
    });
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 64)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_until([&] { return callback.load() == 1; }));
    p.a.engine->detach(qpn);
    CHECK(callback.load() == 2);
    // (Should it not have waited: let the callback finish before the QP is freed.)
    REQUIRE(p.wait_until([&] { return callback.load() == 2; }));
    p.a.engine->set_timer_hook({});
}

// A packet that reached a QP just as it closed (the receive path held a reference) is
// ignored: nothing executed, nothing completed, nothing answered.
TEST_CASE("Lifetime: a closed QP takes no packet", "[lifetime]") {
    Pair p;
    p.connect();
    TxRecorder b_out(*p.b.engine, {}, false);
    REQUIRE(p.b.qp->post_recv(recv_wqe(5, {p.b.sge(0, 64)})) == 0);
    const uint64_t unknown = p.b.counters().rx_unknown_qp.load();
    p.b.qp->close();  // closed, still in the engine's table
    const ForgedPeer a_as_peer{*p.b.engine, p.a.ip, p.b.engine->config().port, p.a.qp->qpn(),
                               p.b.qp->qpn()};
    wire::Headers h = a_as_peer.headers(wire::Opcode::RcSendOnly, p.b.qp->attributes().rq_psn);
    h.bth.ack_req = true;
    std::vector<uint8_t> message(64, 0x5a);
    a_as_peer.inject(h, message);
    CHECK(p.b.counters().rx_unknown_qp.load() == unknown + 1);
    CHECK(p.stays_empty(*p.b.rcq));
    CHECK(all_bytes(p.b.at(0), 64, kUntouched));
    CHECK(b_out.packets().empty());
}

// fork() while an engine callback runs (fork_gate.h): fork waits for the callback to end, so
// the child inherits no lock the callback held, and afterwards the engine's gate is free in
// both processes (the parent's engine goes on; the child could take the gate).
TEST_CASE("Lifetime: fork() waits for the engine callback in flight", "[lifetime][fork]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 8;  // ~1 ms: the retransmission timer fires soon
    p.connect(attrs, attrs);
    std::optional<TxRecorder> silent_b;
    silent_b.emplace(*p.b.engine, TxRecorder::LosePredicate{}, false);
    std::atomic<int> callback{0};  // 1: held in the hook, 2: hook done
    const uint32_t qpn = p.a.qp->qpn();
    p.a.engine->set_timer_hook([&callback, qpn](uint32_t which) {
        int idle = 0;
        if (which != qpn || !callback.compare_exchange_strong(idle, 1)) return;
        std::this_thread::sleep_for(300ms);
        callback = 2;
    });
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 64)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_until([&] { return callback.load() == 1; }));
    // b answers again: the resend that follows the held callback completes the WRITE,
    // however long the fork takes (a slow one would otherwise use up the retries).
    silent_b.reset();
    ForkGate& gate = p.a.engine->fork_gate();
    const pid_t child = ::fork();
    if (child == 0) {
        ::alarm(10);  // a gate left taken would hang here: killed instead, and seen below
        { const auto pass = gate.pass(); }
        ::_exit(callback.load() == 2 ? 0 : 3);
    }
    REQUIRE(child > 0);
    const bool waited = callback.load() == 2;
    int status = -1;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(waited);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    REQUIRE(p.wait_until([&] { return callback.load() == 2; }));
    p.a.engine->set_timer_hook({});
    // The parent's engine is not left stuck: the WRITE completes.
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
}
