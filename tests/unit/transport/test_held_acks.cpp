// ACKs held for the answer (transport/engine_held_acks.cpp): a responder whose application
// posted send work lately keeps the ACK of a batch its engine thread read until that
// application posts (a WRITE or READ answer leaves first, a SEND after the ACK), polls or
// arms a CQ, or ack_hold_micros pass. Here only a's CQ is polled (by a's engine alone) unless
// a test says otherwise: a poll of b's would send what b holds.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kLen = 64;

// Polls `cq` through `s`'s engine only (busy_poll), until a completion or `timeout`.
std::optional<Completion> poll_side(Side& s, CompletionQueue& cq,
                                    std::chrono::milliseconds timeout = kWait) {
    Completion c;
    if (busy_poll(
            *s.engine, [&] { return cq.poll(std::span(&c, 1)) == 1; }, timeout))
        return c;
    return std::nullopt;
}

// QP attributes whose local ACK timeout (`timeout` 31: 2.4 hours) allows any hold here.
QpAttributes patient(uint8_t timeout = 31) {
    QpAttributes a = default_attributes();
    a.timeout = timeout;
    return a;
}

// A pair where b's application has just answered once (a WRITE to a): b's QP is within
// the answer window. `timeout`: the QPs' local ACK timeout (a's may differ).
struct AnsweringPair {
    Pair p;
    explicit AnsweringPair(PairOptions o, uint8_t timeout = 31, uint8_t a_timeout = 0) : p(o) {
        p.connect(patient(a_timeout ? a_timeout : timeout), patient(timeout));
        fill(p.b.at(0), kLen, 1);
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.b.sge(0, kLen)},
                                           p.a.iova + 4096, p.a.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.b.scq).status == WcStatus::Success);
        // The ACK that completed it may have woken b's engine thread while this thread's
        // poll held b's receive lock: the socket is then parked (park_from_loop) until the
        // watch sees the polls stopped. A test that stops b's engine thread at its gate right
        // away would keep it parked throughout (1 of about 600 setups here, two runs side by side).
        REQUIRE(eventually([&] { return !p.b.engine->socket_parked(); }));
    }
    // b's application answers with a WRITE `seed` into a.at(0); what a's engine, polling
    // a's send CQ alone, completes first.
    std::optional<Completion> answer(uint64_t seed) {
        fill(p.b.at(0), kLen, seed);
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, seed, {p.b.sge(0, kLen)},
                                           p.a.iova, p.a.keys.rkey)) == 0);
        return poll_side(p.a, *p.a.scq);
    }
    // a WRITEs to b, and b's engine thread reads it.
    void request(uint64_t seed) {
        fill(p.a.at(0), kLen, seed);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, seed, {p.a.sge(0, kLen)},
                                           p.b.iova, p.b.keys.rkey)) == 0);
        REQUIRE(eventually([&] { return landed(p.b.at(0), kLen, seed); }));
    }
};

// a's WRITE `seed` completes with no answer from b, and b held no ACK.
void check_acked_at_once(Pair& p, uint64_t seed) {
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == seed);
    CHECK(p.b.counters().tx_held_acks.load() == 0);
}

// b holds the ACK of a's WRITE `seed` until `release` (not an answer) sends it.
void check_released_by(uint64_t seed, const std::function<void(Engine&)>& release) {
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    ap.request(seed);
    REQUIRE(eventually([&] { return p.b.counters().tx_held_acks.load() >= 1; }));
    CHECK(p.a.scq->depth() == 0);
    release(*p.b.engine);
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);  // not a retry count spent
    CHECK(done->wr_id == seed);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
}

// The ACKs (not NAKs) among what `out` recorded.
size_t positive_acks(const TxRecorder& out) {
    return out.count([](const wire::ParsedPacket& pkt) {
        return pkt.h.bth.opcode == static_cast<uint8_t>(wire::Opcode::RcAcknowledge) &&
               pkt.h.aeth.type() == wire::AckType::Ack;
    });
}

size_t index_of(const std::vector<SentPacket>& sent, wire::Opcode op) {
    for (size_t i = 0; i < sent.size(); ++i)
        if (sent[i].parsed().h.bth.opcode == static_cast<uint8_t>(op)) return i;
    return sent.size();
}

}  // namespace

TEST_CASE("A WRITE's ACK waits for the application's WRITE answer and leaves behind it",
          "[held_acks]") {
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    TxRecorder b_out(*p.b.engine);
    ap.request(21);
    REQUIRE(eventually([&] { return p.b.counters().tx_held_acks.load() >= 1; }));
    CHECK(p.a.scq->depth() == 0);
    CHECK(b_out.packets().empty());

    const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
    const auto done = ap.answer(22);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 21);
    CHECK(first_mismatch(p.a.at(0), kLen, 22) == kLen);
    // The answer first, then the ACK, in one system call: one GSO train, which a reads in
    // one piece (UDP_GRO), never the answer without its ACK.
    const auto sent = b_out.packets();
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcWriteOnly) == 0);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
    CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 1);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
}

TEST_CASE("A SEND answer leaves behind the ACK it answers", "[held_acks]") {
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    TxRecorder b_out(*p.b.engine);
    ap.request(31);
    REQUIRE(eventually([&] { return p.b.counters().tx_held_acks.load() >= 1; }));

    REQUIRE(p.a.qp->post_recv(recv_wqe(32, {p.a.sge(4096, kLen)})) == 0);
    fill(p.b.at(0), kLen, 32);
    REQUIRE(p.b.qp->post_send(send_wqe(32, {p.b.sge(0, kLen)})) == 0);
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->wr_id == 31);
    const auto got = poll_side(p.a, *p.a.rcq);
    REQUIRE(got);
    CHECK(got->byte_len == kLen);
    CHECK(first_mismatch(p.a.at(4096), kLen, 32) == kLen);
    const auto sent = b_out.packets();
    const size_t answer = index_of(sent, wire::Opcode::RcSendOnly);
    const size_t ack = index_of(sent, wire::Opcode::RcAcknowledge);
    REQUIRE(answer < sent.size());
    CHECK(ack < answer);
}

TEST_CASE("A responder whose application never posted keeps no ACK", "[held_acks]") {
    Pair p(holding_acks());
    p.connect(patient(), patient());
    fill(p.a.at(0), kLen, 41);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 41, {p.a.sge(0, kLen)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    check_acked_at_once(p, 41);
    CHECK(first_mismatch(p.b.at(0), kLen, 41) == kLen);
}

TEST_CASE("A held ACK leaves after ack_hold_micros when no answer comes", "[held_acks]") {
    AnsweringPair ap(holding_acks(2000));
    Pair& p = ap.p;
    ap.request(51);
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(p.b.counters().tx_held_acks.load() >= 1);
    CHECK(p.b.counters().held_ack_timeouts.load() >= 1);
}

TEST_CASE("An ACK held after the hold timer was set waits its own ack_hold_micros", "[held_acks]") {
    // The timer is set when b holds the ACK of 161; the answer takes that ACK along at once,
    // and b holds the ACK of 163 while the timer still runs for 161's. When it fires, 163's
    // has waited half a hold: sent then, it would reach a just before an answer (and a busy
    // poller would find the answer in memory it no longer polls for). It leaves a whole hold
    // after it was held, measured from before a sent 163: a lower bound, which a slow
    // machine only makes longer (a test thread held off past 161's timer leaves nothing to
    // tell apart, and passes).
    constexpr uint32_t kHoldMicros = 400'000;
    AnsweringPair ap(holding_acks(kHoldMicros));
    Pair& p = ap.p;
    ap.request(161);
    REQUIRE(eventually([&] { return p.b.counters().tx_held_acks.load() >= 1; }));
    const auto first = ap.answer(162);
    REQUIRE(first);
    CHECK(first->wr_id == 161);
    // Half the hold later, so that the timer set for 161 comes half a hold after 163 is
    // held (sooner, its expiry and 163's own deadline would be microseconds apart).
    std::this_thread::sleep_for(std::chrono::microseconds(kHoldMicros / 2));
    const auto sent = std::chrono::steady_clock::now();
    ap.request(163);
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 163);
    CHECK(std::chrono::steady_clock::now() - sent >= std::chrono::microseconds(kHoldMicros));
    CHECK(p.b.counters().held_ack_timeouts.load() >= 1);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
}

TEST_CASE("An ACK a poller holds while it has the socket sets no timer until the hand-back",
          "[held_acks]") {
    // b's poll reads a's request and holds its ACK, then b stops polling. While the socket
    // is parked the timer stays unset (its timerfd_settime and expiry would cost the
    // pollers' CPUs); the hand-back that follows sets it, and the ACK leaves.
    AnsweringPair ap(holding_acks(20'000));
    Pair& p = ap.p;
    bool held = false;
    parked_and_gated(*p.b.engine, [&] {
        const uint64_t before = p.b.counters().tx_held_acks.load();
        fill(p.a.at(0), kLen, 171);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 171, {p.a.sge(0, kLen)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        held = busy_poll(*p.b.engine, [&] { return p.b.counters().tx_held_acks.load() > before; });
        CHECK(first_mismatch(p.b.at(0), kLen, 171) == kLen);
        CHECK(p.b.engine->socket_parked());
        CHECK_FALSE(p.b.engine->held_acks_timer_pending());
    });
    REQUIRE(held);
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 171);
    CHECK(p.b.counters().socket_handbacks.load() >= 1);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
}

TEST_CASE("A poll of the responder's CQ sends the ACK it holds", "[held_acks]") {
    check_released_by(61, [](Engine& e) { e.on_cq_poll(true); });
}

TEST_CASE("Arming the responder's CQ sends the ACK it holds", "[held_acks]") {
    check_released_by(71, [](Engine& e) { e.note_cq_armed(); });
}

TEST_CASE("A responder with several requests in flight (a stream) keeps no ACK", "[held_acks]") {
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    // b's next two WRITEs never arrive: they stay in flight while a's request comes.
    TxRecorder b_out(*p.b.engine, [](const wire::ParsedPacket& pkt) {
        return pkt.h.bth.opcode == static_cast<uint8_t>(wire::Opcode::RcWriteOnly);
    });
    for (uint64_t id : {101, 102})
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, id, {p.b.sge(0, kLen)},
                                           p.a.iova + 4096, p.a.keys.rkey)) == 0);
    REQUIRE(eventually([&] { return b_out.lost() >= 2; }));
    ap.request(103);
    check_acked_at_once(p, 103);
}

TEST_CASE("A responder whose application answered too long ago keeps no ACK", "[held_acks]") {
    PairOptions o = holding_acks();
    o.answer_window_micros = 1;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    ap.request(91);
    check_acked_at_once(p, 91);
}

TEST_CASE("A QP whose local ACK timeout is short keeps no ACK", "[held_acks]") {
    // `timeout` 14: 67 ms, less than 4 x the hold.
    AnsweringPair ap(holding_acks(), 14);
    Pair& p = ap.p;
    ap.request(111);
    check_acked_at_once(p, 111);
}

TEST_CASE("A duplicate of a request whose ACK is held leaves the ACK held for the answer",
          "[held_acks]") {
    // a resends after its local ACK timeout (`timeout` 14: 67 ms) while b holds the ACK of
    // the first copy. That ACK was never sent, so nothing was lost: what a resends is a
    // probe (its tail-loss probe comes after two round trips, an answer may take longer),
    // and the answer will carry the ACK.
    AnsweringPair ap(holding_acks(), 31, 14);
    Pair& p = ap.p;
    TxRecorder b_out(*p.b.engine);
    ap.request(121);
    REQUIRE(eventually([&] { return p.b.counters().rx_duplicate_ack_pending.load() >= 1; }));
    CHECK(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 0);
    CHECK(p.a.scq->depth() == 0);

    const auto done = ap.answer(122);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 121);
    CHECK(first_mismatch(p.a.at(0), kLen, 122) == kLen);
    CHECK(first_mismatch(p.b.at(0), kLen, 122) == kLen);
    CHECK(p.a.counters().retransmit_timeouts.load() >= 1);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
}

TEST_CASE("A second duplicate while the ACK is held sends it: the answer is not coming soon",
          "[held_acks]") {
    // a resends after its local ACK timeout (`timeout` 14: 67 ms), then again after twice
    // that. b holds "forever" and its application never answers: the first resend changes
    // nothing, the second gets the ACK.
    AnsweringPair ap(holding_acks(), 31, 14);
    Pair& p = ap.p;
    TxRecorder b_out(*p.b.engine);
    ap.request(141);
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 141);
    CHECK(p.b.counters().rx_duplicate_ack_pending.load() == 1);
    CHECK(p.b.counters().rx_duplicate.load() >= 2);
    CHECK(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 1);
    CHECK(p.a.counters().retransmit_timeouts.load() == 2);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
}

TEST_CASE("Each held ACK absorbs its own first duplicate, also after an error and a reset",
          "[held_acks]") {
    // Two held exchanges on one QP pair, each with one resend of a (`timeout` 14: 67 ms)
    // while b holds the ACK: the second exchange's resend is absorbed like the first's. With
    // `error` set, b's QP goes to ERR between them (a's next request breaks its rkey: b's
    // NAK takes the place of the held ACK), and both QPs through RESET and back to RTS;
    // otherwise b's answer sends the first ACK.
    const bool error = GENERATE(false, true);
    CAPTURE(error);
    AnsweringPair ap(holding_acks(), 31, 14);
    Pair& p = ap.p;
    TxRecorder b_out(*p.b.engine);
    ap.request(151);
    REQUIRE(eventually([&] { return p.b.counters().rx_duplicate_ack_pending.load() >= 1; }));
    if (error) {
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 152, {p.a.sge(0, kLen)}, p.b.iova,
                                           p.b.keys.rkey + 0x100)) == 0);
        // Only a's engine polls: b holds its ACK until the NAK.
        const auto first = poll_side(p.a, *p.a.scq);
        const auto second = poll_side(p.a, *p.a.scq);
        REQUIRE(first);
        REQUIRE(second);
        CHECK(first->wr_id == 151);
        CHECK(first->status == WcStatus::Success);  // the NAK acknowledges what came before
        CHECK(second->wr_id == 152);
        CHECK(second->status == WcStatus::RemAccessErr);
        REQUIRE(p.wait_until([&] { return p.b.qp->state() == QpState::Err; }));
        for (Side* s : {&p.a, &p.b})
            REQUIRE(s->qp->modify(s->qp->attributes(), QpState::Err, QpState::Reset) == 0);
        QpAttributes pa = patient(14);
        QpAttributes pb = patient(31);
        pa.sq_psn = 0x1000;
        pb.sq_psn = 0x2000;
        p.connect(pa, pb);
        // b answers once more: its QP is within the answer window again.
        fill(p.b.at(0), kLen, 152);
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 152, {p.b.sge(0, kLen)},
                                           p.a.iova + 4096, p.a.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.b.scq).status == WcStatus::Success);
        // The NAK alone: it acknowledges what the held ACK would have (an ACK after it would
        // say nothing).
        CHECK(positive_acks(b_out) == 0);
        CHECK(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 1);
    } else {
        const auto first = ap.answer(152);
        REQUIRE(first);
        CHECK(first->status == WcStatus::Success);
        CHECK(first->wr_id == 151);
        CHECK(positive_acks(b_out) == 1);
    }
    const size_t acks_before = positive_acks(b_out);

    ap.request(153);
    REQUIRE(eventually([&] { return p.b.counters().rx_duplicate_ack_pending.load() >= 2; }));
    CHECK(positive_acks(b_out) == acks_before);
    const auto done = ap.answer(154);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 153);
    CHECK(first_mismatch(p.a.at(0), kLen, 154) == kLen);
    CHECK(p.b.counters().rx_duplicate_ack_pending.load() == 2);
    CHECK(positive_acks(b_out) == acks_before + 1);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
}

TEST_CASE("A QP that fails its own request sends the ACK it holds first", "[held_acks]") {
    // b's SEND finds no receive at a: a's RNR NAK has it wait 327 ms (code 30) and resend,
    // once (rnr_retry 1). Meanwhile a WRITEs to b, which executes it and holds the ACK for its
    // application. b's resend is refused again: b's QP fails (RNR retries exceeded), and the
    // ACK of a's WRITE, executed, must still reach a: a's WRITE succeeded.
    Pair p(holding_acks());
    QpAttributes pa = patient();
    QpAttributes pb = patient();
    pa.min_rnr_timer = 30;
    pb.rnr_retry = 1;
    p.connect(pa, pb);
    TxRecorder b_out(*p.b.engine);
    REQUIRE(p.b.qp->post_send(send_wqe(161, {p.b.sge(0, kLen)})) == 0);
    REQUIRE(eventually([&] { return p.b.counters().rx_naks.load() >= 1; }));
    fill(p.a.at(0), kLen, 162);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 162, {p.a.sge(0, kLen)},
                                       p.b.iova + 4096, p.b.keys.rkey)) == 0);
    REQUIRE(eventually([&] { return p.b.counters().tx_held_acks.load() >= 1; }));
    CHECK(p.b.qp->state() == QpState::Rts);  // the RNR timer has not run out yet
    CHECK(positive_acks(b_out) == 0);

    // Nothing polls b's CQ (which would send the ACK) until a has its completion.
    REQUIRE(eventually([&] { return p.b.qp->state() == QpState::Err; }));
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->wr_id == 162);
    CHECK(done->status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(4096), kLen, 162) == kLen);
    CHECK(positive_acks(b_out) == 2);  // the held one, then again as b's QP stops answering
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    const auto failed = p.wait_one(*p.b.scq);
    CHECK(failed.wr_id == 161);
    CHECK(failed.status == WcStatus::RnrRetryExcErr);
}

TEST_CASE("A duplicate of a request whose ACK went out is acknowledged at once", "[held_acks]") {
    // b holds the ACK of a's request; a poll of b's CQ sends it, and it is lost. a's resend
    // (after its local ACK timeout, 67 ms) finds the request executed: a is waiting for that
    // ACK, and gets it at once, not held again for an answer.
    AnsweringPair ap(holding_acks(), 31, 14);
    Pair& p = ap.p;
    TxRecorder b_out(*p.b.engine, [n = 0](const wire::ParsedPacket& pkt) mutable {
        return pkt.h.bth.opcode == static_cast<uint8_t>(wire::Opcode::RcAcknowledge) && n++ == 0;
    });
    ap.request(131);
    REQUIRE(eventually([&] { return p.b.counters().tx_held_acks.load() >= 1; }));
    p.b.engine->on_cq_poll(true);  // sends the held ACK (lost)
    REQUIRE(eventually([&] { return b_out.lost() == 1; }));
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 131);
    CHECK(b_out.count_opcode(wire::Opcode::RcAcknowledge) == 2);
    CHECK(p.b.counters().rx_duplicate.load() >= 1);
    CHECK(p.b.counters().rx_duplicate_ack_pending.load() == 0);
    CHECK(p.a.counters().retransmit_timeouts.load() == 1);
}

TEST_CASE("With hold_acks off the ACK leaves at the end of its batch", "[held_acks]") {
    PairOptions o = holding_acks();
    o.hold_acks = false;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    ap.request(81);
    check_acked_at_once(p, 81);
}

namespace {}  // namespace

TEST_CASE("A busy poller's ACK waits for its application's answer: one system call for both",
          "[held_acks]") {
    // The answer leaves at once when nothing of b's is in flight, and waits for b's next poll
    // (held_posts.h) when a WRITE of b's is: either way it takes the held ACK along.
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    const auto request_and_answer = [&](uint64_t seed, bool held) {
        REQUIRE(p.a.qp->post_recv(recv_wqe(seed + 1, {p.a.sge(8192, kLen)})) == 0);
        const uint64_t held0 = p.b.counters().tx_held_acks.load();
        const uint64_t acks0 = p.b.counters().tx_acks.load();
        polled_request(p, seed);  // its poll sends what b held
        CHECK(p.b.counters().tx_held_acks.load() == held0 + 1);
        CHECK(p.b.counters().tx_acks.load() == acks0);
        TxRecorder b_out(*p.b.engine);
        const uint64_t multi0 = p.b.counters().tx_multi_sends.load();
        fill(p.b.at(0), kLen, seed + 1);
        REQUIRE(p.b.qp->post_send(send_wqe(seed + 1, {p.b.sge(0, kLen)})) == 0);
        if (held) {
            CHECK(b_out.packets().empty());
            CHECK(p.b.counters().tx_acks.load() == acks0);
            p.b.engine->on_cq_poll(false);
        }
        CHECK(p.b.counters().tx_acks.load() == acks0 + 1);
        CHECK(p.b.counters().tx_multi_sends.load() == multi0 + 1);  // ACK and SEND: one call
        const auto sent = b_out.packets();
        REQUIRE(sent.size() == 2);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
        CHECK(index_of(sent, wire::Opcode::RcSendOnly) == 1);
    };
    const auto check_a = [&](uint64_t seed) {
        const auto done = poll_side(p.a, *p.a.scq);
        REQUIRE(done);
        CHECK(done->status == WcStatus::Success);
        CHECK(done->wr_id == seed);
        const auto got = poll_side(p.a, *p.a.rcq);
        REQUIRE(got);
        CHECK(got->wr_id == seed + 1);
        CHECK(first_mismatch(p.a.at(8192), kLen, seed + 1) == kLen);
    };
    parked_and_gated(*p.b.engine, [&] { request_and_answer(201, false); });
    check_a(201);
    parked_and_gated(*p.b.engine, [&] {
        with_b_write_in_flight(p, 233, 2048, 40960, kLen, [&] { request_and_answer(231, true); });
    });
    check_a(231);
    CHECK(first_mismatch(p.a.at(40960), kLen, 233) == kLen);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
}

TEST_CASE("A busy poller's held ACK leaves at its next poll when no answer comes", "[held_acks]") {
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    parked_and_gated(*p.b.engine, [&] {
        const uint64_t acks0 = p.b.counters().tx_acks.load();
        polled_request(p, 211);
        CHECK(p.b.counters().tx_acks.load() == acks0);
        p.b.engine->on_cq_poll(true);
        CHECK(p.b.counters().tx_acks.load() == acks0 + 1);
    });
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 211);
}

TEST_CASE("With hold_acks off a busy poller's ACK leaves at the end of its batch", "[held_acks]") {
    PairOptions o = holding_acks();
    o.hold_acks = false;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    parked_and_gated(*p.b.engine, [&] {
        const uint64_t acks0 = p.b.counters().tx_acks.load();
        polled_request(p, 221);
        CHECK(p.b.counters().tx_acks.load() == acks0 + 1);
        CHECK(p.b.counters().tx_held_acks.load() == 0);
    });
}

TEST_CASE("A busy poller's WRITE answer leaves before its ACK, in one train", "[held_acks]") {
    // At once (nothing of b's in flight), and held for the poll (a WRITE of b's in flight).
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    const auto answer = [&](uint64_t wr_id, bool held) {
        TxRecorder b_out(*p.b.engine);
        const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
        fill(p.b.at(0), kLen, wr_id);
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, wr_id, {p.b.sge(0, kLen)},
                                           p.a.iova + 1024 * (wr_id - 240), p.a.keys.rkey)) == 0);
        if (held) {
            CHECK(b_out.packets().empty());  // held for the next poll, with the ACK
            p.b.engine->on_cq_poll(false);
        }
        const auto sent = b_out.packets();
        REQUIRE(sent.size() == 2);
        CHECK(index_of(sent, wire::Opcode::RcWriteOnly) == 0);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
        CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 1);
    };
    parked_and_gated(*p.b.engine, [&] {
        polled_request(p, 241);
        answer(242, false);
    });
    auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 241);
    CHECK(first_mismatch(p.a.at(1024 * 2), kLen, 242) == kLen);

    parked_and_gated(*p.b.engine, [&] {
        with_b_write_in_flight(p, 245, 2048, 40960, kLen, [&] {
            polled_request(p, 243);
            answer(244, true);
        });
    });
    done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 243);
    CHECK(first_mismatch(p.a.at(1024 * 4), kLen, 244) == kLen);
    CHECK(first_mismatch(p.a.at(40960), kLen, 245) == kLen);
}

TEST_CASE("A poller's ACK waits for the answer before the socket is parked", "[held_acks]") {
    // ib_write_lat polls its CQ only between its post and the ACK: often too few polls in a
    // row to park the socket. Its batches hold the ACK all the same.
    AnsweringPair ap(holding_acks());
    Pair& p = ap.p;
    {
        const auto gate = p.b.engine->fork_gate().pass();  // b's engine thread stands still
        TxRecorder b_out(*p.b.engine);
        const uint64_t held0 = p.b.counters().tx_held_acks.load();
        fill(p.a.at(0), kLen, 251);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 251, {p.a.sge(0, kLen)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        // Polls far enough apart never to be a busy poll.
        const auto deadline = std::chrono::steady_clock::now() + kWait;
        while (!landed(p.b.at(0), kLen, 251) && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(200us);
            p.b.engine->on_cq_poll(true);
        }
        REQUIRE(first_mismatch(p.b.at(0), kLen, 251) == kLen);
        CHECK_FALSE(p.b.engine->socket_parked());
        CHECK(p.b.counters().tx_held_acks.load() == held0 + 1);
        CHECK(b_out.packets().empty());
        fill(p.b.at(0), kLen, 252);
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 252, {p.b.sge(0, kLen)}, p.a.iova,
                                           p.a.keys.rkey)) == 0);
        const auto sent = b_out.packets();
        REQUIRE(sent.size() == 2);
        CHECK(index_of(sent, wire::Opcode::RcWriteOnly) == 0);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
    }
    const auto done = poll_side(p.a, *p.a.scq);
    REQUIRE(done);
    CHECK(done->status == WcStatus::Success);
    CHECK(done->wr_id == 251);
    CHECK(first_mismatch(p.a.at(0), kLen, 252) == kLen);
}
