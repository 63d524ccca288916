// The fault menu through two real engines (fault_injector.h): corrupted packets are caught by
// the receiver's ICRC check and repaired by retransmission, duplicates are answered without
// being executed twice, bursts of loss are recovered; every fault is counted and every byte
// arrives once, in place.
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"

using namespace uroce::transport;
using namespace uroce::transport::test;

namespace {

constexpr uint32_t kWrite = 24 * kMtu + 100;
constexpr uint32_t kSend = 6 * kMtu + 3;
constexpr uint32_t kRead = 12 * kMtu;

// WRITE and SEND from a, READ by a, `rounds` times, each byte checked; b's receive queue and
// completion queue hold nothing extra afterwards (no message delivered twice).
void exchange(Pair& p, int rounds) {
    for (int i = 0; i < rounds; ++i) {
        INFO("round " << i);
        const uint64_t seed = 100 + static_cast<uint64_t>(i);
        fill(p.a.at(0), kWrite, seed);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kWrite)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(0), kWrite, seed) == kWrite);

        fill(p.a.at(kWrite), kSend, seed + 1);
        REQUIRE(p.b.qp->post_recv(recv_wqe(2, {p.b.sge(kWrite, kSend)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(3, {p.a.sge(kWrite, kSend)})) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        const Completion r = p.wait_one(*p.b.rcq);
        REQUIRE(r.status == WcStatus::Success);
        CHECK(r.byte_len == kSend);
        CHECK(first_mismatch(p.b.at(kWrite), kSend, seed + 1) == kSend);

        const size_t at = kWrite + kSend;
        fill(p.b.at(at), kRead, seed + 2);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 4, {p.a.sge(at, kRead)},
                                           p.b.iova + at, p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.a.at(at), kRead, seed + 2) == kRead);
    }
    CHECK(p.b.rcq->depth() == 0);
    CHECK(p.a.scq->depth() == 0);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
}

PairOptions pair_with(FaultConfig fa, FaultConfig fb) {
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    o.faults_a = fa;
    o.faults_b = fb;
    return o;
}

}  // namespace

TEST_CASE("corrupt=P: every flipped bit is caught by the receiver, and repaired",
          "[faults][fault_kinds]") {
    FaultConfig fa, fb;
    fa.corrupt = 0.05;
    fa.seed = 21;
    fb.corrupt = 0.05;
    fb.seed = 22;
    Pair p(pair_with(fa, fb));
    p.connect();
    exchange(p, 6);
    // Loopback loses nothing else: what each side corrupted, the other refused.
    REQUIRE(p.wait_until([&] {
        return p.b.counters().rx_packets.load() == p.a.counters().tx_packets.load() &&
               p.a.counters().rx_packets.load() == p.b.counters().tx_packets.load();
    }));
    const uint64_t a_bad = p.a.counters().tx_corrupted_fault.load();
    const uint64_t b_bad = p.b.counters().tx_corrupted_fault.load();
    CHECK(a_bad > 0);
    CHECK(b_bad > 0);
    // Packets of trains are corrupted too (they leave alone then): about 5% of all.
    const uint64_t a_tx = p.a.counters().tx_packets.load();
    INFO("a sent " << a_tx << ", corrupted " << a_bad);
    CHECK(a_bad * 40 > a_tx);
    CHECK(a_bad * 10 < a_tx);
    CHECK(p.b.counters().rx_bad_icrc.load() + p.b.counters().rx_malformed.load() == a_bad);
    CHECK(p.a.counters().rx_bad_icrc.load() + p.a.counters().rx_malformed.load() == b_bad);
    CHECK(p.a.counters().retransmitted_packets.load() > 0);
    CHECK(p.a.counters().tx_dropped_fault.load() == 0);
    CHECK(p.a.engine->qp_counters(p.a.qp->qpn()).tx_faults.load() == a_bad);
}

TEST_CASE("duplicate=P: duplicates are answered, never executed or delivered twice",
          "[faults][fault_kinds]") {
    FaultConfig fa, fb;
    fa.duplicate = 0.1;
    fa.seed = 31;
    fb.duplicate = 0.1;
    fb.seed = 32;
    Pair p(pair_with(fa, fb));
    p.connect();
    exchange(p, 6);
    CHECK(p.a.counters().tx_duplicated_fault.load() > 0);
    CHECK(p.b.counters().tx_duplicated_fault.load() > 0);
    CHECK(p.b.counters().rx_duplicate.load() > 0);  // a's requests seen twice
    CHECK(p.a.counters().rx_bad_icrc.load() == 0);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
}

TEST_CASE("burst=ENTER:LEAVE: runs of lost packets are recovered", "[faults][fault_kinds]") {
    FaultConfig fa, fb;
    fa.burst_enter = 0.02;
    fa.burst_leave = 0.3;
    fa.seed = 41;
    fb = fa;
    fb.seed = 42;
    Pair p(pair_with(fa, fb));
    p.connect();
    exchange(p, 6);
    CHECK(p.a.counters().tx_dropped_fault.load() > 0);
    CHECK(p.b.counters().tx_dropped_fault.load() > 0);
}

TEST_CASE("outage=ENTER:US: a link down for milliseconds at a time is recovered from",
          "[faults][fault_kinds]") {
    FaultConfig fa, fb;
    fa.outage_enter = 0.03;
    fa.outage_us = 3000;  // longer than the first retransmission waits (1 ms)
    fa.seed = 51;
    fb = fa;
    fb.seed = 52;
    Pair p(pair_with(fa, fb));
    p.connect();
    exchange(p, 6);
    CHECK(p.a.counters().tx_dropped_fault.load() > 0);
    CHECK(p.b.counters().tx_dropped_fault.load() > 0);
}

TEST_CASE("reorder=P: packets overtaken by later ones are put right", "[faults][fault_kinds]") {
    FaultConfig fa, fb;
    fa.reorder = 0.1;
    fa.seed = 51;
    fb.reorder = 0.1;
    fb.seed = 52;
    Pair p(pair_with(fa, fb));
    p.connect();
    exchange(p, 6);
    CHECK(p.a.counters().tx_reordered_fault.load() > 0);
    CHECK(p.b.counters().tx_reordered_fault.load() > 0);
    // b saw a's requests out of order (and asked for the rest again).
    CHECK(p.b.counters().rx_out_of_sequence.load() > 0);
    CHECK(p.a.counters().tx_delayed_fault.load() == 0);
    CHECK(p.a.counters().tx_dropped_fault.load() == 0);
}

TEST_CASE("delay=US:JITTER: every packet leaves late, and all arrive", "[faults][fault_kinds]") {
    FaultConfig fa, fb;
    fa.delay_us = 300;
    fa.jitter_us = 100;
    fa.seed = 61;
    fb.delay_us = 1000;
    Pair p(pair_with(fa, fb));
    p.connect();
    exchange(p, 2);
    // Each packet sent went through the delay line (held packets count when they leave).
    REQUIRE(p.wait_until([&] {
        return p.a.counters().tx_delayed_fault.load() == p.a.counters().tx_packets.load() &&
               p.b.counters().tx_delayed_fault.load() == p.b.counters().tx_packets.load();
    }));
    CHECK(p.a.counters().tx_packets.load() > 0);
    // The QP's own count of the packets faulted: each one held back.
    CHECK(p.a.engine->qp_counters(p.a.qp->qpn()).tx_faults.load() ==
          p.a.counters().tx_delayed_fault.load());
    // A request and its ACK are each held back: a round trip takes at least 200 + 1000 us.
    fill(p.a.at(0), 8, 7);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(p.a.qp->post_send(
                rdma_wqe(SendOpcode::RdmaWrite, 9, {p.a.sge(0, 8)}, p.b.iova, p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::microseconds(1200));
    CHECK(first_mismatch(p.b.at(0), 8, 7) == 8);
}

TEST_CASE("dir=rx: received packets lost, corrupted, duplicated and reordered",
          "[faults][fault_kinds]") {
    FaultConfig rx;
    rx.direction = FaultDirection::Rx;
    rx.drop = 0.03;
    rx.corrupt = 0.03;
    rx.duplicate = 0.05;
    rx.reorder = 0.05;
    rx.seed = 71;
    PairOptions o = pair_with(FaultConfig{}, FaultConfig{});
    o.rules_b = {rx};
    Pair p(o);
    p.connect();
    exchange(p, 6);
    const EngineCounters& b = p.b.counters();
    CHECK(b.rx_dropped_fault.load() > 0);
    CHECK(b.rx_corrupted_fault.load() > 0);
    CHECK(b.rx_duplicated_fault.load() > 0);
    CHECK(b.rx_reordered_fault.load() > 0);
    // b's ICRC check refused exactly what b itself corrupted: a sent everything intact.
    CHECK(b.rx_bad_icrc.load() + b.rx_malformed.load() == b.rx_corrupted_fault.load());
    CHECK(p.a.counters().tx_dropped_fault.load() == 0);
    CHECK(p.a.counters().tx_corrupted_fault.load() == 0);
    CHECK(p.a.counters().rx_dropped_fault.load() == 0);
    CHECK(p.a.counters().rx_bad_icrc.load() == 0);
}

TEST_CASE("dir=rx,delay=US: every received packet is handled late", "[faults][fault_kinds]") {
    FaultConfig rx;
    rx.direction = FaultDirection::Rx;
    rx.delay_us = 1500;
    PairOptions o = pair_with(FaultConfig{}, FaultConfig{});
    o.rules_b = {rx};
    Pair p(o);
    p.connect();
    fill(p.a.at(0), 8, 3);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(p.a.qp->post_send(
                rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 8)}, p.b.iova, p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::microseconds(1500));
    CHECK(first_mismatch(p.b.at(0), 8, 3) == 8);
    exchange(p, 1);
    // The first WRITE's early resend (its round trip, 1.5 ms, is longer than the initial
    // guess) may still wait in b's delay line.
    CHECK(p.wait_until([&] {
        return p.b.counters().rx_delayed_fault.load() == p.b.counters().rx_packets.load();
    }));
    CHECK(p.a.counters().rx_delayed_fault.load() == 0);
}

TEST_CASE("op=CLASS: only packets of the class are faulted", "[faults][fault_kinds]") {
    // b answers a's READs: with every ACK of b lost, the READs still go through untouched
    // (READ responses are not ACKs).
    FaultConfig acks;
    acks.op_classes = kOpAck;
    acks.drop = 1.0;
    FaultConfig responses;
    responses.op_classes = kOpReadResponse;
    responses.drop = 1.0;
    responses.until = 2;
    SECTION("tx") {
        PairOptions o = pair_with(acks, FaultConfig{});
        o.rules_b = {acks, responses};
        Pair p(o);
        p.connect();
        for (int i = 0; i < 4; ++i) {
            fill(p.b.at(0), kRead, 80 + i);
            REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 1, {p.a.sge(0, kRead)},
                                               p.b.iova, p.b.keys.rkey)) == 0);
            REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
            CHECK(first_mismatch(p.a.at(0), kRead, 80 + i) == kRead);
        }
        // Exactly the first two READ responses were lost, and a's READ request, not an ACK,
        // went through every time.
        CHECK(p.b.counters().tx_dropped_fault.load() == 2);
        CHECK(p.a.counters().tx_dropped_fault.load() == 0);
        CHECK(p.a.counters().retransmitted_packets.load() > 0);  // the READ asked again
    }
    SECTION("rx") {
        FaultConfig rx = responses;
        rx.direction = FaultDirection::Rx;
        PairOptions o = pair_with(FaultConfig{}, FaultConfig{});
        o.rules_a = {rx};
        Pair p(o);
        p.connect();
        exchange(p, 2);
        CHECK(p.a.counters().rx_dropped_fault.load() == 2);
        CHECK(p.b.counters().rx_dropped_fault.load() == 0);
    }
}

TEST_CASE("qp=QPN: packets for other QPs are left alone", "[faults][fault_kinds]") {
    // QPNs are never 0 or 1: a rule for QP 1 never matches, even losing every packet.
    FaultConfig other;
    other.qpn = 1;
    other.drop = 1.0;
    FaultConfig rx = other;
    rx.direction = FaultDirection::Rx;
    PairOptions o = pair_with(other, other);
    o.rules_a = {rx};
    o.rules_b = {rx};
    Pair p(o);
    p.connect();
    exchange(p, 2);
    CHECK(p.a.counters().tx_dropped_fault.load() == 0);
    CHECK(p.b.counters().tx_dropped_fault.load() == 0);
    CHECK(p.a.counters().rx_dropped_fault.load() == 0);
    CHECK(p.b.counters().rx_dropped_fault.load() == 0);
}
