// Loss recovery that does not wait for the local ACK timeout (rc_qp.h, rtt_estimator.h):
// the tail-loss probe, the initial timeout before any round trip is measured, and the round
// trip a sequence NAK measures. Every case uses `timeout` 14 (67 ms): a recovery that fell
// back to it would count a retransmit_timeout.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kBurst = 8;  // packets of the WRITE whose last packet is lost

bool is_op(const wire::ParsedPacket& p, wire::Opcode op) {
    return p.h.bth.opcode == static_cast<uint8_t>(op);
}

// One SEND of `len` bytes from a to b, byte-checked.
void send_one(Pair& p, uint32_t len, uint64_t seed) {
    fill(p.a.at(0), len, seed);
    REQUIRE(p.b.qp->post_recv(recv_wqe(seed, {p.b.sge(0, len)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(seed, {p.a.sge(0, len)})) == 0);
    REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const Completion got = p.wait_one(*p.b.rcq);
    REQUIRE(got.status == WcStatus::Success);
    REQUIRE(got.byte_len == len);
    CHECK(first_mismatch(p.b.at(0), len, seed) == len);
}

// A connected pair whose round trip a has measured, with a's probes and early resends
// counted from there; `a_attrs` are a's attributes (b has the defaults).
struct MeasuredPair {
    Pair p;
    uint64_t probes0 = 0, early0 = 0, spurious0 = 0, timeouts0 = 0;
    explicit MeasuredPair(const PairOptions& o = {},
                          const QpAttributes& a_attrs = default_attributes())
        : p(o) {
        p.connect(a_attrs, default_attributes());
        for (uint64_t i = 1; i <= 3; ++i) send_one(p, 64, i);
        probes0 = p.a.counters().tail_probes.load();
        early0 = p.a.counters().early_retransmits.load();
        spurious0 = p.a.counters().spurious_retransmits.load();
        timeouts0 = p.a.counters().retransmit_timeouts.load();
    }
    uint64_t probes() { return p.a.counters().tail_probes.load() - probes0; }
    uint64_t early_resends() { return p.a.counters().early_retransmits.load() - early0; }
    uint64_t timeouts() { return p.a.counters().retransmit_timeouts.load() - timeouts0; }
    // Resends proven needless since the three SENDs above: one of those may have been probed
    // (its ACK later than the first wait, 1 ms with no round trip measured, on a loaded
    // machine: seen in CI's ASan run) and proven needless; disturbed() is true then.
    uint64_t spurious() { return p.a.counters().spurious_retransmits.load() - spurious0; }
    // An engine thread held off the CPU past a probe's wait, the adaptive timeout (1 ms) or
    // the QP's own timeout turns a late ACK into a further probe, an early resend or a
    // timeout's resend, which changes what is sent (CI's ASan run: a timeout went back N a
    // second time after the scenario's two probes). So does a probe of the three SENDs
    // above, whose needless-resend verdict may come later. The scenarios that ask expect no
    // timeout: a build that always times out fails in until_undisturbed.
    bool disturbed(uint64_t probes_expected) {
        return probes0 + early0 + timeouts0 > 0 || early_resends() > 0 || timeouts() > 0 ||
               probes() > probes_expected;
    }
};

// Runs `scenario` on a new measured pair until a run was not disturbed (above): it returns
// false for such a run before its exact checks. 5 runs at most; a build that always probes
// or resends too much fails here. Seen in CI on 2 vCPUs: 1 run in ~40 under 4 suites at once.
template <class Scenario>
void until_undisturbed(Scenario scenario, const PairOptions& o = {},
                       const QpAttributes& a_attrs = default_attributes()) {
    for (int attempt = 0; attempt < 5; ++attempt) {
        INFO("attempt " << attempt);
        MeasuredPair m(o, a_attrs);
        if (scenario(m)) return;
    }
    FAIL(
        "every run was disturbed: it resent early, probed more than expected, or (see the "
        "scenario) measured too long a round trip");
}

// What a sent after a kBurst WRITE whose repair took two probes: the burst, a probe of its
// last packet, then (the second probe) the burst again from its first.
void check_probe_then_burst_again(const std::vector<SentPacket>& sent) {
    REQUIRE(sent.size() >= 2 * kBurst + 1);
    const wire::ParsedPacket probe = sent[kBurst].parsed();
    CHECK(probe.h.bth.psn == sent[kBurst - 1].parsed().h.bth.psn);
    CHECK(probe.h.bth.ack_req);
    for (uint32_t i = 0; i < kBurst; ++i)
        CHECK(sent[kBurst + 1 + i].parsed().h.bth.psn == sent[i].parsed().h.bth.psn);
}

// What a sent after a kBurst WRITE whose second packet was lost: the burst, then `pairs`
// times its second packet and its last, each asking for an ACK; nothing else.
void check_pairs_after_burst(const std::vector<SentPacket>& sent, size_t pairs) {
    std::string psns;  // what was sent, for the report of a failure
    for (const SentPacket& s : sent) psns += std::to_string(s.psn()) + (s.lost ? "x " : " ");
    INFO("PSNs sent (x: lost): " << psns);
    REQUIRE(sent.size() == kBurst + 2 * pairs);
    const uint32_t lost = sent[1].parsed().h.bth.psn, last = sent[kBurst - 1].parsed().h.bth.psn;
    for (size_t i = 0; i < pairs; ++i) {
        INFO("pair " << i);
        const wire::ParsedPacket x = sent[kBurst + 2 * i].parsed();
        const wire::ParsedPacket t = sent[kBurst + 2 * i + 1].parsed();
        CHECK(x.h.bth.psn == lost);
        CHECK(t.h.bth.psn == last);
        CHECK(x.h.bth.ack_req);
        CHECK(t.h.bth.ack_req);
    }
}

// Whether a's first packet after its kBurst WRITE was a probe of the burst's last packet, not
// the resend of the lost one that b's first NAK asks for: a's probe wait ran out before a took
// that NAK (either side off the CPU), so b's later NAKs (one of them lost by the test) came
// in another order than the test arranged. Seen in CI and in a loaded mutant run on 2 vCPUs,
// PSNs 3 4x 5 6 7 8 9 10, then 10, 4x 10, 4 10: 13 packets where the arranged order sends 12.
bool probed_before_the_nak(const TxRecorder& a_out) {
    const std::vector<SentPacket> sent = a_out.packets();
    return sent.size() > kBurst && sent[kBurst].psn() == sent[kBurst - 1].psn();
}

// A WRITE of kBurst packets from a to b, byte-checked.
void write_burst(Pair& p, uint64_t seed) {
    const uint32_t len = kBurst * kMtu;
    fill(p.a.at(0), len, seed);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, seed, {p.a.sge(0, len)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), len, seed) == len);
}

// Loses the WRITE LAST packets a sends, the first `times` of them: the burst's last packet as
// first sent, then as probed.
TxRecorder::LosePredicate lose_write_last(int times) {
    return [left = times](const wire::ParsedPacket& pkt) mutable {
        return is_op(pkt, wire::Opcode::RcWriteLast) && left-- > 0;
    };
}

// Loses the first MIDDLE packet a sends, `times` times: as first sent, then as resent.
TxRecorder::LosePredicate lose_first_middle(int times) {
    return
        [left = times, victim = std::optional<uint32_t>()](const wire::ParsedPacket& pkt) mutable {
            if (!is_op(pkt, wire::Opcode::RcWriteMiddle)) return false;
            if (!victim) victim = pkt.h.bth.psn;
            return pkt.h.bth.psn == *victim && left-- > 0;
        };
}

}  // namespace

TEST_CASE("A lost last packet is sent again alone, asking for an ACK (tail-loss probe)",
          "[rc][retransmit]") {
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        // The WRITE's last packet is lost the first time it is sent.
        TxRecorder a_out(*p.a.engine, lose_write_last(1));
        write_burst(p, 77);
        if (m.disturbed(1)) return false;

        // FIRST, MIDDLE x 6, LAST (lost), then the probe: that LAST again, and nothing before
        // it (a whole-window resend would start with the FIRST).
        const auto sent = a_out.packets();
        REQUIRE(sent.size() >= kBurst + 1);
        REQUIRE(sent[kBurst - 1].lost);
        const wire::ParsedPacket lost = sent[kBurst - 1].parsed();
        const wire::ParsedPacket probe = sent[kBurst].parsed();
        CHECK(is_op(probe, wire::Opcode::RcWriteLast));
        CHECK(probe.h.bth.psn == lost.h.bth.psn);
        CHECK(probe.h.bth.ack_req);
        CHECK(m.probes() == 1);
        // The probe repaired a loss: nothing to undo (spurious_resend.h).
        CHECK(m.spurious() == 0);
        return true;
    });
}

TEST_CASE("A probe whose ACK was what got lost is answered as a duplicate", "[rc][retransmit]") {
    // A second probe (its wait ran out before the first one's ACK came) would draw a later
    // duplicate's ACK, which does prove that one needless: such a run is disturbed.
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        // b's first ACK after this point is lost: a's SEND arrived, a does not know it.
        int lose_left = 1;
        TxRecorder b_out(*p.b.engine, [&lose_left](const wire::ParsedPacket& pkt) {
            return is_op(pkt, wire::Opcode::RcAcknowledge) && lose_left-- > 0;
        });
        const uint64_t dup0 = p.b.counters().rx_duplicate.load();
        send_one(p, 3 * kMtu, 41);
        CHECK(b_out.lost() == 1);
        if (m.disturbed(1)) return false;
        // The probe reached b as a duplicate of the SEND's last packet: ACKed again, not
        // delivered twice (b's receive queue held one WQE, and no second completion came).
        CHECK(p.b.counters().rx_duplicate.load() - dup0 >= 1);
        CHECK(m.probes() == 1);
        CHECK(p.b.rcq->depth() == 0);
        // The duplicate's ACK was the first news of the SEND: the probe was needed.
        CHECK(m.spurious() == 0);
        return true;
    });
}

TEST_CASE("A READ whose only response is lost is asked for again by the probe",
          "[rc][retransmit][read_recovery]") {
    // Nothing after the lost response shows the loss: only the timer can. The probe asks
    // for the READ again (a READ's responses are the responder's to send again, and asking
    // twice only replays them), two round trips after the request, not 1 ms later.
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        int lose_left = 1;
        TxRecorder b_out(*p.b.engine, [&lose_left](const wire::ParsedPacket& pkt) {
            return is_op(pkt, wire::Opcode::RcReadResponseOnly) && lose_left-- > 0;
        });
        TxRecorder a_out(*p.a.engine);
        const uint64_t dup0 = p.b.counters().rx_duplicate.load();
        fill(p.b.at(0), 256, 5);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 3, {p.a.sge(0, 256)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.a.at(0), 256, 5) == 256);
        if (m.disturbed(1)) return false;
        CHECK(m.probes() == 1);
        // The request and the probe: the same PSN, address and length.
        const auto reqs = a_out.with_opcode(wire::Opcode::RcReadRequest);
        REQUIRE(reqs.size() == 2);
        const wire::ParsedPacket first = reqs[0].parsed(), probe = reqs[1].parsed();
        CHECK(probe.h.bth.psn == first.h.bth.psn);
        CHECK(probe.h.reth.va == first.h.reth.va);
        CHECK(probe.h.reth.dma_len == 256);
        CHECK(p.b.counters().rx_duplicate.load() - dup0 == 1);
        CHECK(b_out.count_opcode(wire::Opcode::RcReadResponseOnly) == 2);
        return true;
    });
}

TEST_CASE("A READ whose second request was lost too is asked for again by the probe",
          "[rc][retransmit][read_recovery]") {
    // A response in the middle of the READ is lost: the next one shows the gap (and is
    // kept) and the READ is asked for again at once, for the gap; that request is lost too.
    // Nothing more comes, and the mark that kept the gap's later responses from asking again
    // must not keep the probe from asking. It asks for the gap again (the timer's go-back-N
    // would ask for the rest).
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        constexpr uint32_t kLen = 3 * kMtu;
        int responses_to_lose = 1;
        TxRecorder b_out(*p.b.engine, [&responses_to_lose](const wire::ParsedPacket& pkt) {
            return is_op(pkt, wire::Opcode::RcReadResponseMiddle) && responses_to_lose-- > 0;
        });
        int requests_seen = 0;
        TxRecorder a_out(*p.a.engine, [&requests_seen](const wire::ParsedPacket& pkt) {
            return is_op(pkt, wire::Opcode::RcReadRequest) && ++requests_seen == 2;
        });
        fill(p.b.at(0), kLen, 6);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 4, {p.a.sge(0, kLen)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.a.at(0), kLen, 6) == kLen);
        if (m.disturbed(1)) return false;
        CHECK(m.probes() == 1);
        // The request, the one the gap asked for (lost), and the probe's, from the same PSN.
        const auto reqs = a_out.with_opcode(wire::Opcode::RcReadRequest);
        REQUIRE(reqs.size() == 3);
        CHECK(reqs[1].lost);
        const wire::ParsedPacket first = reqs[0].parsed(), gap = reqs[1].parsed(),
                                 probe = reqs[2].parsed();
        CHECK(gap.h.bth.psn == first.h.bth.psn + 1);
        CHECK(gap.h.reth.dma_len == kMtu);
        CHECK(probe.h.bth.psn == gap.h.bth.psn);
        CHECK(probe.h.reth.va == gap.h.reth.va);
        CHECK(probe.h.reth.dma_len == kMtu);
        return true;
    });
}

TEST_CASE("Before any round trip is measured, a loss waits the initial guess, not 67 ms",
          "[rc][retransmit]") {
    Pair p;
    p.connect();
    // The very first packet a sends is lost: there is no sample yet, and nothing follows it.
    int lose_left = 1;
    TxRecorder a_out(*p.a.engine,
                     [&lose_left](const wire::ParsedPacket&) { return lose_left-- > 0; });
    send_one(p, 64, 3);
    CHECK(a_out.lost() == 1);
    // The first expiry sends the last packet alone (here the lost one itself) and cuts no
    // window: before any sample the wait is a guess. Only if that probe's answer took
    // another guess's wait (a slow machine) would the requester go back N.
    CHECK(p.a.counters().tail_probes.load() == 1);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    const std::vector<SentPacket> sent = a_out.packets();
    REQUIRE(sent.size() >= 2);
    CHECK(sent[1].psn() == sent[0].psn());
    if (p.a.counters().early_retransmits.load() == 0)
        CHECK(p.a.counters().send_window_cuts.load() == 0);
}

TEST_CASE("A sequence NAK measures the round trip when nothing else can", "[rc][retransmit]") {
    // The first packet of a's first SEND is lost: b NAKs on the second, a resends all three.
    // Resent packets time nothing (Karn), so the NAK is the only round trip measured ... unless
    // the 1 ms initial timeout fired before the NAK came back (a machine too busy to run the
    // engine thread for 1 ms): its probe of the newest packet draws the NAK again (5 runs in
    // 10 of an ASan build beside two busy loops), or its go-back-N resends everything. Then
    // the scenario is tried again on a new pair, 6 times at most.
    bool measured_by_nak = false;
    for (int attempt = 0; attempt < 6 && !measured_by_nak; ++attempt) {
        INFO("attempt " << attempt);
        Pair p;
        p.connect();
        int lose_left = 1;
        TxRecorder a_out(*p.a.engine,
                         [&lose_left](const wire::ParsedPacket&) { return lose_left-- > 0; });
        send_one(p, 3 * kMtu, 11);
        if (p.a.counters().early_retransmits.load() + p.a.counters().tail_probes.load() != 0)
            continue;
        REQUIRE(p.a.counters().rx_naks.load() == 1);
        measured_by_nak = true;
        CHECK(p.a.qp->smoothed_rtt_us() > 0);
        // ... and it is enough for the next tail loss to get a probe (which needs a measured
        // round trip) instead of an early timeout.
        int lose_next = 1;
        TxRecorder a_out2(*p.a.engine,
                          [&lose_next](const wire::ParsedPacket&) { return lose_next-- > 0; });
        send_one(p, 64, 12);
        CHECK(a_out2.lost() == 1);
        // A second probe comes if the first one's ACK is later than two round trips (the
        // engine threads held off the CPU): 1 in 5 full runs of the suite on 2 vCPUs.
        CHECK(p.a.counters().tail_probes.load() >= 1);
        CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    }
    REQUIRE(measured_by_nak);
}

TEST_CASE("Without adaptive retransmission nothing is probed", "[rc][retransmit]") {
    PairOptions o;
    o.adaptive = false;
    Pair p(o);
    QpAttributes attrs = default_attributes();
    attrs.timeout = 8;  // ~1 ms: the only timer left
    p.connect(attrs, default_attributes());
    for (uint64_t i = 1; i <= 3; ++i) send_one(p, 64, i);
    int lose_left = 1;
    TxRecorder a_out(*p.a.engine,
                     [&lose_left](const wire::ParsedPacket&) { return lose_left-- > 0; });
    send_one(p, 64, 4);
    CHECK(a_out.lost() == 1);
    CHECK(p.a.counters().tail_probes.load() == 0);
    CHECK(p.a.counters().early_retransmits.load() == 0);
    CHECK(p.a.counters().retransmit_timeouts.load() >= 1);
}

TEST_CASE("With the engine's resend budget spent, a loss waits for the local ACK timeout",
          "[rc][retransmit]") {
    // What thousands of QPs timing out together meet (resend_budget.h): early resends and
    // probes are held back, the local ACK timeout still resends, and nothing is lost.
    PairOptions o;
    o.resend_burst = 0;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 12;  // ~17 ms: the resend that is never held back
    until_undisturbed(
        [](MeasuredPair& m) {
            Pair& p = m.p;
            // The probe waits two smoothed round trips. An ASan build beside two busy loops
            // measured round trips so long that the local ACK timeout (then ~4 ms) came first,
            // and nothing was held back (2 runs in 10): a run whose probe cannot come well
            // before the timeout is tried again.
            const uint64_t srtt = p.a.qp->smoothed_rtt_us();
            INFO("smoothed round trip " << srtt << " us");
            if (2 * srtt >= 8000) return false;
            const uint64_t held0 = p.a.counters().resends_held_back.load();
            int lose_left = 1;
            TxRecorder a_out(*p.a.engine,
                             [&lose_left](const wire::ParsedPacket&) { return lose_left-- > 0; });
            send_one(p, 64, 4);
            CHECK(a_out.lost() == 1);
            CHECK(p.a.counters().resends_held_back.load() > held0);
            // With no budget, nothing is ever probed or resent early, setup included.
            CHECK(p.a.counters().tail_probes.load() == 0);
            CHECK(p.a.counters().early_retransmits.load() == 0);
            CHECK(p.a.counters().retransmit_timeouts.load() >= 1);
            return true;
        },
        o, attrs);
}

TEST_CASE("The resend budget allows a burst, then comes back at its rate", "[rc][retransmit]") {
    using std::chrono::microseconds;
    ResendBudget budget;
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t i = 0; i < ResendBudget::kBurst; ++i) REQUIRE(budget.take(t0));
    CHECK(!budget.take(t0));
    CHECK(!budget.take(t0 + ResendBudget::kRefillEvery - microseconds(1)));
    CHECK(budget.take(t0 + ResendBudget::kRefillEvery));
    CHECK(!budget.take(t0 + ResendBudget::kRefillEvery));
    // Three periods later: three more, no more.
    const auto t1 = t0 + 4 * ResendBudget::kRefillEvery;
    for (int i = 0; i < 3; ++i) CHECK(budget.take(t1));
    CHECK(!budget.take(t1));
    // Long idle: the whole burst again, never more.
    const auto t2 = t1 + 1000 * ResendBudget::kRefillEvery;
    uint32_t taken = 0;
    while (taken < 2 * ResendBudget::kBurst && budget.take(t2)) ++taken;
    CHECK(taken == ResendBudget::kBurst);
    ResendBudget none(0);
    CHECK(!none.take(t2));
}

TEST_CASE("The packet that fills the window asks for an ACK, and so does its probe",
          "[rc][retransmit]") {
    std::atomic<bool> posted{false};  // before the engines: their timer hook reads it
    PairOptions o;
    o.mem_bytes = 512 * 1024;
    Pair p(o);
    p.connect();
    for (uint64_t i = 1; i <= 3; ++i) send_one(p, 64, i);
    // Until told otherwise b's ACKs are lost: a stalls when its window (256 packets of 1 KiB)
    // is full. The window starts inside the first WRITE, so it ends at packet 250 of the
    // second: the requester waits there, so that packet asks for an ACK, though it ends no
    // message; the one before it does not (a stream asks twice per window).
    std::atomic<bool> ack_through{false};
    TxRecorder b_out(*p.b.engine, [&ack_through](const wire::ParsedPacket& pkt) {
        return !ack_through.load() && is_op(pkt, wire::Opcode::RcAcknowledge);
    });
    TxRecorder a_out(*p.a.engine);
    const uint32_t first = 5 * kMtu, second = 300 * kMtu;
    fill(p.a.at(0), first + second, 8);
    // The probe must come after both WRITEs went out: a timer that fires in between (a
    // descheduled test thread) waits for the second post, at most 2 s.
    p.a.engine->set_timer_hook([&posted](uint32_t) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (!posted.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::yield();
    });
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, first)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2, {p.a.sge(first, second)},
                                       p.b.iova + first, p.b.keys.rkey)) == 0);
    posted = true;
    // The window's last packet, sent twice: once in the burst, once as the probe.
    auto window_packet = [&](uint32_t index) {
        std::vector<SentPacket> out;
        const auto sent = a_out.packets();
        for (const SentPacket& s : sent)
            if (s.psn() == psn_add(sent.front().psn(), index)) out.push_back(s);
        return out;
    };
    REQUIRE(p.wait_until([&] { return window_packet(255).size() >= 2; }));
    const auto twice = window_packet(255);
    CHECK(is_op(twice[0].parsed(), wire::Opcode::RcWriteMiddle));
    CHECK(twice[0].parsed().h.bth.ack_req);
    CHECK(twice[1].parsed().h.bth.ack_req);
    const auto before = window_packet(254);
    REQUIRE(!before.empty());
    CHECK_FALSE(before[0].parsed().h.bth.ack_req);
    CHECK(p.a.counters().tail_probes.load() >= 1);
    p.a.engine->set_timer_hook({});
    ack_through = true;
    REQUIRE(p.wait(*p.a.scq, 2).size() == 2);
    CHECK(first_mismatch(p.b.at(0), first + second, 8) == first + second);
}

TEST_CASE("Early resends use no retry: retry_cnt 1 survives several", "[rc][retransmit]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.retry_cnt = 1;
    // 4.096 us * 2^18 = 1.07 s: the early resends (1, 3, 7, 15, ... ms) keep coming long
    // after the silence ends, even when a loaded machine lets the test thread see it late.
    attrs.timeout = 18;
    p.connect(attrs, default_attributes());
    for (uint64_t i = 1; i <= 3; ++i) send_one(p, 64, i);
    std::atomic<bool> silent{true};
    TxRecorder b_out(*p.b.engine, [&silent](const wire::ParsedPacket&) { return silent.load(); });
    const uint64_t early0 = p.a.counters().early_retransmits.load();
    fill(p.a.at(0), 64, 21);
    REQUIRE(p.b.qp->post_recv(recv_wqe(21, {p.b.sge(0, 64)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(21, {p.a.sge(0, 64)})) == 0);
    // A probe, then early resends (1, 2, 4 ms apart) go unanswered.
    REQUIRE(p.wait_until([&] { return p.a.counters().early_retransmits.load() - early0 >= 2; }));
    silent = false;
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(p.wait_one(*p.b.rcq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), 64, 21) == 64);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    CHECK(p.a.qp->state() == QpState::Rts);
}

// A probe that is lost too (or whose ACK is) is followed, after twice the wait, by the newest
// packet alone again (rc_retransmit_timer.cpp): no NAK is in hand, and a peer that keeps what
// follows a gap would have answered the first probe with its NAK again; a peer merely late
// (off the CPU) costs one more packet, not the window.
TEST_CASE("A lost tail-loss probe is followed by the newest packet again", "[rc][retransmit]") {
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        // The WRITE's last packet is lost the first two times it is sent.
        TxRecorder a_out(*p.a.engine, lose_write_last(2));
        write_burst(p, 78);
        if (m.disturbed(2)) return false;

        // The burst (its LAST lost), the first probe (lost), the second: nothing else.
        const std::vector<SentPacket> sent = a_out.packets();
        REQUIRE(sent.size() == kBurst + 2);
        for (uint32_t i = kBurst; i < kBurst + 2; ++i) {
            CHECK(sent[i].parsed().h.bth.psn == sent[kBurst - 1].parsed().h.bth.psn);
            CHECK(sent[i].parsed().h.bth.ack_req);
        }
        CHECK(m.probes() == 2);
        CHECK(m.spurious() == 0);
        return true;
    });
}

namespace {

// Losses whose NAK b, which keeps nothing (no bytes for early requests), answers after a's
// selective resend with a NAK for the next packet, until a knows it (three such answers,
// rc_selective_resend.cpp; test_selective_requester.cpp counts them): a NAK then draws
// go-back-N at once, no selective resend. False if a has not learnt it in 8 losses. Asked of
// a's QP, not read off its resends: on a loaded machine a probe may go back N before a takes
// b's NAK, which resends nothing selectively while the peer is still unknown.
bool learn_that_b_keeps_nothing(MeasuredPair& m) {
    Pair& p = m.p;
    for (uint64_t seed = 90; seed < 98 && !p.a.qp->peer_keeps_nothing(); ++seed) {
        TxRecorder a_out(*p.a.engine, lose_first_middle(1));
        write_burst(p, seed);
        CHECK(a_out.lost() == 1);
    }
    if (!p.a.qp->peer_keeps_nothing()) return false;
    const uint64_t resends = p.a.counters().selective_resends.load();
    TxRecorder a_out(*p.a.engine, lose_first_middle(1));
    write_burst(p, 98);
    CHECK(a_out.lost() == 1);
    CHECK(p.a.counters().selective_resends.load() == resends);
    return true;
}

// The burst (its LAST lost), the first probe (lost), then the burst again from its FIRST
// (nothing of it was acknowledged: b ACKs only what asks for an ACK). False if disturbed,
// or if a read anything between its two probes: an ACK for a packet of the burst that came
// only then (b off the CPU; a burst sent in a window cut by the losses before asks for ACKs
// inside it) is progress, after which the next probe is a first one again, the newest
// packet alone (seen once on 2 vCPUs under a mutant run: 10 packets sent, not 17).
bool lost_probe_goes_back_n(MeasuredPair& m) {
    Pair& p = m.p;
    const uint64_t probes = m.probes();
    std::mutex mutex;
    std::vector<uint64_t> reads_at_send;  // a's datagrams read as each of its packets went
    TxRecorder a_out(*p.a.engine,
                     [&, lose = lose_write_last(2)](const wire::ParsedPacket& pkt) mutable {
                         std::lock_guard lock(mutex);
                         reads_at_send.push_back(p.a.counters().rx_packets.load());
                         return lose(pkt);
                     });
    write_burst(p, 78);
    if (m.disturbed(probes + 2)) return false;
    {
        std::lock_guard lock(mutex);
        if (reads_at_send.size() > kBurst + 1 && reads_at_send[kBurst + 1] != reads_at_send[kBurst])
            return false;
    }
    CHECK(a_out.packets().size() == 2 * kBurst + 1);
    check_probe_then_burst_again(a_out.packets());
    CHECK(m.probes() == probes + 2);
    return true;
}

}  // namespace

// To a peer known to keep nothing, the second probe goes back N: such a peer (the kernel's
// rxe) NAKs a sequence error once and then drops every later packet silently until the PSN
// it asked for comes, so when that NAK was lost, a probe of the last packet is never
// answered and everything from that PSN on must go again anyway.
TEST_CASE("To a peer known to keep nothing, a lost probe is followed by a resend of everything",
          "[rc][retransmit][selective]") {
    PairOptions o;
    o.early_bytes = 0;
    until_undisturbed(
        [](MeasuredPair& m) {
            REQUIRE(learn_that_b_keeps_nothing(m));
            return lost_probe_goes_back_n(m);
        },
        o);
}

// So it does with selective recovery off (UROCE_SELECTIVE=off: go-back-N, as the IBA
// describes), whatever the peer.
TEST_CASE("Without selective recovery, a lost probe is followed by a resend of everything",
          "[rc][retransmit][selective]") {
    PairOptions o;
    o.selective = false;
    until_undisturbed(lost_probe_goes_back_n, o);
}

// A responder NAKs a sequence error once, then drops every later packet silently until the
// PSN it asked for comes; uroce's (selective recovery) NAKs again when the newest packet
// comes again. When the resend a NAK asked for is lost too, the newest packet of the
// selective resend draws the NAK again and the requester resends at once, no probe's wait.
TEST_CASE("A NAK's resend that is lost too goes again at the NAK sent again", "[rc][retransmit]") {
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        // The WRITE's second packet is lost twice: first sent, and resent after b's NAK.
        TxRecorder a_out(*p.a.engine, lose_first_middle(2));
        write_burst(p, 79);
        CHECK(a_out.lost() == 2);
        if (m.disturbed(0)) return false;
        check_pairs_after_burst(a_out.packets(), 2);
        CHECK(p.a.counters().rx_naks.load() == 2);
        CHECK(p.b.counters().tx_seq_naks.load() == 2);
        CHECK(p.b.counters().tx_seq_nak_repeats.load() == 1);
        CHECK(m.probes() == 0);
        return true;
    });
}

// The NAK sent again lost as well: the probe after the NAK's resend sends the two packets
// again (the peer not yet known to keep: its answer to the first is still the verdict).
TEST_CASE("A NAK's resend lost too, and the NAK sent again lost: the probe resends the two",
          "[rc][retransmit]") {
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        TxRecorder a_out(*p.a.engine, lose_first_middle(2));
        int naks_seen = 0;
        TxRecorder b_out(*p.b.engine, [&naks_seen](const wire::ParsedPacket& pkt) {
            return is_op(pkt, wire::Opcode::RcAcknowledge) &&
                   pkt.h.aeth.type() == wire::AckType::Nak && ++naks_seen == 2;
        });
        write_burst(p, 85);
        CHECK(a_out.lost() == 2);
        CHECK(b_out.lost() == 1);
        if (m.disturbed(1) || probed_before_the_nak(a_out)) return false;
        check_pairs_after_burst(a_out.packets(), 2);
        CHECK(m.probes() == 1);
        return true;
    });
}

// The same with a READ sent last: its request is never probed, but the probe after a NAK's
// resend goes back N from the packet the NAK named, which the READ follows, so it is armed
// all the same, and the repair waits a probe's wait, not an early resend's.
TEST_CASE("A NAK's resend lost too, with a READ sent last, goes again after a probe's wait",
          "[rc][retransmit]") {
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        TxRecorder a_out(*p.a.engine, lose_first_middle(2));
        const uint32_t len = kBurst * kMtu, back = 2 * len;
        fill(p.a.at(0), len, 84);
        fill(p.a.at(back), len, 0);
        // One post of both (a list): the READ request leaves right after the WRITE.
        REQUIRE(p.a.qp->post_send(
                    rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, len)}, p.b.iova, p.b.keys.rkey),
                    true) == 0);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 2, {p.a.sge(back, len)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        const auto done = p.wait(*p.a.scq, 2);
        REQUIRE(done.size() == 2);
        CHECK(done[0].status == WcStatus::Success);
        CHECK(done[1].status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(0), len, 84) == len);
        CHECK(first_mismatch(p.a.at(back), len, 84) == len);
        CHECK(a_out.lost() == 2);
        if (m.disturbed(UINT64_MAX)) return false;
        CHECK(m.probes() >= 1);
        return true;
    });
}

// The NAK itself lost: the probe of the last packet, which b kept, draws the NAK again, and
// the lost packet goes alone with the newest one.
TEST_CASE("A lost sequence NAK is sent again when the probe comes", "[rc][retransmit]") {
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        TxRecorder a_out(*p.a.engine, lose_first_middle(1));
        int naks_left = 1;
        TxRecorder b_out(*p.b.engine, [&naks_left](const wire::ParsedPacket& pkt) {
            return is_op(pkt, wire::Opcode::RcAcknowledge) &&
                   pkt.h.aeth.type() == wire::AckType::Nak && naks_left-- > 0;
        });
        write_burst(p, 80);
        CHECK(a_out.lost() == 1);
        CHECK(b_out.lost() == 1);
        if (m.disturbed(1)) return false;

        // The burst, the probe of its LAST, then its lost MIDDLE and LAST: 11 packets.
        const auto& sent = a_out.packets();
        REQUIRE(sent.size() == kBurst + 3);
        const uint32_t lost = sent[1].parsed().h.bth.psn,
                       last = sent[kBurst - 1].parsed().h.bth.psn;
        CHECK(sent[kBurst].parsed().h.bth.psn == last);
        CHECK(sent[kBurst + 1].parsed().h.bth.psn == lost);
        CHECK(sent[kBurst + 2].parsed().h.bth.psn == last);
        CHECK(p.a.counters().rx_naks.load() == 1);
        CHECK(p.b.counters().tx_seq_nak_repeats.load() == 1);
        CHECK(p.a.counters().selective_resends.load() == 1);
        CHECK(m.probes() == 1);
        return true;
    });
}

// To a peer known to keep (rc_selective_resend.cpp), the probe after a NAK's resend is a
// selective resend: the packet the NAK named and the newest.
namespace {

// Losses that b repairs from what it kept, until a knows that b keeps: a selective resend
// answered before a probe's wait (the runs where a probe came are not counted on), at most 5
// tries. False if none was.
bool learn_that_b_keeps(MeasuredPair& m) {
    Pair& p = m.p;
    for (uint64_t seed = 81; seed < 86; ++seed) {
        const uint64_t probes = m.probes(), resends = p.a.counters().selective_resends.load();
        TxRecorder a_out(*p.a.engine, lose_first_middle(1));
        write_burst(p, seed);
        CHECK(a_out.lost() == 1);
        CHECK(p.a.counters().selective_resends.load() == resends + 1);
        if (a_out.packets().size() == kBurst + 2 && m.probes() == probes) return true;
    }
    return false;
}

}  // namespace

TEST_CASE("To a peer known to keep, a NAK's resend lost too goes again with the newest packet",
          "[rc][retransmit][selective]") {
    // (The same loss before a knows: "A NAK's resend that is lost too goes again after a
    // probe's wait", whose probe goes back N.)
    until_undisturbed([](MeasuredPair& m) {
        Pair& p = m.p;
        if (!learn_that_b_keeps(m)) return false;
        const uint64_t probes = m.probes(), resends = p.a.counters().selective_resends.load();
        // The second packet is lost as first sent and as resent after b's NAK.
        TxRecorder a_out(*p.a.engine, lose_first_middle(2));
        write_burst(p, 83);
        CHECK(a_out.lost() == 2);
        if (m.disturbed(probes)) return false;

        // The burst, the NAK's selective resend (its first packet lost), then the same again:
        // b saw the newest packet come again without the lost one and sent its NAK again,
        // which a answers at once, with no probe's wait.
        check_pairs_after_burst(a_out.packets(), 2);
        CHECK(m.probes() == probes);
        CHECK(p.b.counters().tx_seq_nak_repeats.load() >= 1);
        CHECK(p.a.counters().selective_resends.load() == resends + 1);
        return true;
    });
}

TEST_CASE("A tail-loss probe goes when a cut window holds fewer packets than are in flight",
          "[rc][retransmit]") {
    // b is silent and the test answers for it. A WRITE of 200 packets goes out whole (the
    // window holds 256); a loss early in it draws a selective resend and halves the window
    // to 128, and b's ACK of the repair (it kept what followed the loss up to the 11th
    // packet) leaves 189 packets in flight: more than the window. The probe that follows
    // stands for one of them and must go, not wait for room (a go-back-N would then stand
    // "under way", and the next wait would be the early resend's).
    constexpr uint32_t kPkts = 200;
    PairOptions o;
    o.mem_bytes = 512 * 1024;
    // Everything b sends comes 20 ms late: once a has measured that, its probe waits about
    // 40 ms, so the test's forged answers come first even on a loaded machine.
    o.faults_b.delay_us = 20'000;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;  // 1 s: only the adaptive waits act while the test answers
    for (int attempt = 0; attempt < 10; ++attempt) {
        INFO("attempt " << attempt);
        Pair p(o);
        p.connect(attrs, attrs);
        // The round trip: the first SENDs are probed (1 ms before any is measured), which
        // the late ACKs prove needless; later ones measure it.
        for (uint64_t i = 1; i <= 5; ++i) send_one(p, 64, i);
        const auto& c = p.a.counters();
        const uint64_t probes0 = c.tail_probes.load(), early0 = c.early_retransmits.load(),
                       cuts0 = c.send_window_cuts.load();
        TxRecorder silent_b(*p.b.engine, {}, false);
        TxRecorder a_out(*p.a.engine);
        const ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(),
                              p.a.qp->qpn()};
        fill(p.a.at(0), kPkts * kMtu, 9);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kPkts * kMtu)},
                                           p.b.iova, p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_until([&] { return a_out.size() >= kPkts; }));
        const uint32_t first = a_out.packets().front().psn();
        const auto psn = [first](uint32_t n) { return (first + n) & wire::kPsnMask; };
        peer.inject(peer.ack(psn(5), wire::AckType::Nak,
                             static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
        const auto resent = a_out.packets();
        a_out.clear();
        peer.inject(peer.ack(psn(10)));
        // A probe or an early resend before the test's answers (its thread held off the CPU
        // that long) changes what follows: such a run is disturbed.
        if (c.tail_probes.load() != probes0 || c.early_retransmits.load() != early0 ||
            resent.size() != kPkts + 2)
            continue;
        // The selective resend: the packet the NAK named, and the newest.
        CHECK(resent[kPkts].psn() == psn(5));
        CHECK(resent[kPkts + 1].psn() == psn(kPkts - 1));
        CHECK(c.send_window_cuts.load() == cuts0 + 1);
        // Nothing more from b: the first thing a sends is the probe, the newest packet alone.
        REQUIRE(p.wait_until([&] { return a_out.size() > 0; }, 5s));
        // Unless a's adaptive timeout (an early resend) came first: under parallel load (ASan,
        // both CPUs busy) it did in 6-9 of 12 runs, before 3751544 and after. Such a run is
        // disturbed too.
        if (c.tail_probes.load() == probes0 && c.early_retransmits.load() != early0) continue;
        const wire::ParsedPacket probe = a_out.packets().front().parsed();
        CHECK(probe.h.bth.psn == psn(kPkts - 1));
        CHECK(probe.h.bth.ack_req);
        CHECK(c.tail_probes.load() == probes0 + 1);
        CHECK(c.early_retransmits.load() == early0);
        peer.inject(peer.ack(psn(kPkts - 1)));
        const Completion done = p.wait_one(*p.a.scq);
        CHECK(done.wr_id == 1);
        CHECK(done.status == WcStatus::Success);
        return;
    }
    FAIL(
        "every run was disturbed: a probe or an early resend came before the test's answers, "
        "or an early resend before the probe");
}
