// A requester's recovery of lost READ responses (rc_completer.cpp): responses to the READs
// behind one that lacks some, and those after a gap within a READ, are kept in their buffers,
// each READ is asked for again only for the gap it has (the rest, if nothing after it came),
// as soon as a later response shows the loss, and a go-back-N passes over the READs already
// complete.
//
// a is the requester under test; b is silent and the test answers for it with forged
// responses, in the order each case needs (hostile_peer.h). What a sends is recorded.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kPkts = 4;  // responses per READ
constexpr uint32_t kLen = kPkts * kMtu;
constexpr uint32_t kReads = 4;

QpAttributes requester_attributes(uint8_t timeout) {
    QpAttributes a = default_attributes();
    a.timeout = timeout;
    a.max_rd_atomic = kReads;
    return a;
}

// Only the local ACK timeout unless `adaptive`: no probe changes what a sends.
PairOptions timer_options(bool adaptive) {
    PairOptions o;
    o.adaptive = adaptive;
    return o;
}

// kReads READs of kLen bytes each, READ r from b's region at r * kLen into a's at r * kLen,
// PSNs r * kPkts (and `write_after_first`: a one-packet WRITE between READ 0 and READ 1, its
// PSN kPkts, every later READ one PSN further).
struct ReadStream {
    Hostile t;
    bool with_write;
    std::vector<std::vector<uint8_t>> data;  // what b's READ r returns

    explicit ReadStream(uint8_t timeout = 18, bool write_after_first = false, bool adaptive = false)
        : t(requester_attributes(timeout), timer_options(adaptive)), with_write(write_after_first) {
        auto& a = t.p.a;
        uint64_t id = 0;
        for (uint32_t r = 0; r < kReads; ++r) {
            data.emplace_back(kLen);
            fill(data.back().data(), kLen, 500 + r);
            REQUIRE(a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, id++, {a.sge(r * kLen, kLen)},
                                             t.p.b.iova + r * kLen, t.p.b.keys.rkey)) == 0);
            if (r == 0 && with_write)
                REQUIRE(a.qp->post_send(
                            rdma_wqe(SendOpcode::RdmaWrite, id++, {a.sge(kReads * kLen, 64)},
                                     t.p.b.iova + kReads * kLen, t.p.b.keys.rkey)) == 0);
        }
        REQUIRE(t.p.wait_until([&] { return requests().size() >= kReads; }));
    }

    uint32_t psn_of(uint32_t r) const { return r * kPkts + (with_write && r > 0 ? 1 : 0); }

    // Response `i` of READ `r`, as the first of a run (a FIRST, or the ONLY one of a run
    // of one) when `starts_run`, as the last of one (a LAST) when `ends_run`: a READ asked
    // for again is answered from there, as uroce's responder answers, up to the part's end.
    void respond(uint32_t r, uint32_t i, bool starts_run = false, bool ends_run = false) {
        const bool first = i == 0 || starts_run;
        const bool last = i + 1 == kPkts || ends_run;
        wire::Opcode op = wire::Opcode::RcReadResponseMiddle;
        if (first && last)
            op = wire::Opcode::RcReadResponseOnly;
        else if (first)
            op = wire::Opcode::RcReadResponseFirst;
        else if (last)
            op = wire::Opcode::RcReadResponseLast;
        respond_as(r, i, op);
    }
    void respond_as(uint32_t r, uint32_t i, wire::Opcode op) {
        t.peer.inject(t.peer.headers(op, psn_of(r) + i),
                      std::span(data[r].data() + i * kMtu, kMtu));
    }
    void respond_all(uint32_t r) {
        for (uint32_t i = 0; i < kPkts; ++i) respond(r, i);
    }

    std::vector<wire::ParsedPacket> requests() const {
        std::vector<wire::ParsedPacket> out;
        for (const SentPacket& s : t.a_out.with_opcode(wire::Opcode::RcReadRequest))
            out.push_back(s.parsed());
        return out;
    }
    // The PSNs of a's READ requests, in the order sent (for failure reports).
    std::string request_psns() const {
        std::string s;
        for (const wire::ParsedPacket& q : requests()) s += std::to_string(q.h.bth.psn) + " ";
        return s;
    }
    // Checks that `q` asks for READ r's `n` responses from its response i (to its end
    // without `n`).
    void check_asks_from(const wire::ParsedPacket& q, uint32_t r, uint32_t i,
                         uint32_t n = 0) const {
        INFO("READ " << r << " from response " << i << ", " << n << " responses (0: the rest)");
        CHECK(q.h.bth.psn == psn_of(r) + i);
        CHECK(q.h.reth.va == t.p.b.iova + r * kLen + i * kMtu);
        CHECK(q.h.reth.rkey == t.p.b.keys.rkey);
        CHECK(q.h.reth.dma_len == (n == 0 ? kLen - i * kMtu : n * kMtu));
    }

    // Every work request completes, successfully and in order, and every READ's buffer
    // holds what b returned.
    void check_all_complete(size_t expected) {
        const auto cs = t.p.wait(*t.p.a.scq, expected, 5s);
        REQUIRE(cs.size() == expected);
        for (size_t i = 0; i < cs.size(); ++i) {
            INFO("completion " << i);
            CHECK(cs[i].wr_id == i);
            CHECK(cs[i].status == WcStatus::Success);
        }
        for (uint32_t r = 0; r < kReads; ++r) {
            INFO("READ " << r);
            CHECK(first_mismatch(t.p.a.at(r * kLen), kLen, 500 + r) == kLen);
        }
        CHECK(t.p.a.qp->state() == QpState::Rts);
        CHECK(t.p.a.counters().retransmit_timeouts.load() == 0);
    }
};

}  // namespace

TEST_CASE("A lost READ response costs itself alone, not the rest of its READ or the READs behind",
          "[rc][read_recovery]") {
    ReadStream s;
    INFO("requests sent (PSNs): " << s.request_psns());
    // READ 0's second response is lost; the rest of READ 0 and all of READs 1-3 come.
    s.respond(0, 0);
    s.respond(0, 2);
    s.respond(0, 3);
    for (uint32_t r = 1; r < kReads; ++r) s.respond_all(r);
    // At the first response after the gap, READ 0 is asked for again for the gap alone,
    // once: the responses that followed it were kept, and they and those of the later READs
    // show the same gap.
    auto q = s.requests();
    REQUIRE(q.size() == kReads + 1);
    s.check_asks_from(q[kReads], 0, 1, 1);
    CHECK(s.t.p.a.counters().rx_read_kept.load() == 2);
    // Nothing completes before READ 0: completions come in order.
    CHECK(s.t.p.stays_empty(*s.t.p.a.scq));
    // The answer to it, as uroce's responder gives it: the one response, an ONLY. All four
    // complete, with the kept responses in place, and nothing was asked for again.
    s.respond(0, 1, true, true);
    s.check_all_complete(kReads);
    CHECK(s.requests().size() == kReads + 1);
}

TEST_CASE("A READ whose responses keep coming is not asked for again, however long they take",
          "[rc][read_recovery]") {
    // timeout 16: the local ACK timeout is 268 ms. READ 0's responses come 120 ms apart, 360
    // ms in all: each one restarts the wait (once per receive batch, rc_qp.h), so none of
    // the READs is asked for again and no timeout is counted. A timer that went on from the
    // requests would have gone back N at 268 ms.
    ReadStream s(16);
    INFO("requests sent (PSNs): " << s.request_psns());
    for (uint32_t i = 0; i < kPkts; ++i) {
        if (i != 0) std::this_thread::sleep_for(120ms);
        s.respond(0, i);
    }
    for (uint32_t r = 1; r < kReads; ++r) s.respond_all(r);
    s.check_all_complete(kReads);
    CHECK(s.requests().size() == kReads);
}

TEST_CASE("A READ's gap answered as rxe answers a part (MIDDLEs, then a LAST) completes it",
          "[rc][read_recovery]") {
    // rxe's responder answers a part that starts inside a READ with MIDDLEs and a LAST at
    // the part's end (a lone LAST for one response), never a FIRST.
    ReadStream s;
    INFO("requests sent (PSNs): " << s.request_psns());
    s.respond(0, 0);
    s.respond(0, 3);  // responses 1 and 2 lost
    for (uint32_t r = 1; r < kReads; ++r) s.respond_all(r);
    auto q = s.requests();
    REQUIRE(q.size() == kReads + 1);
    s.check_asks_from(q[kReads], 0, 1, 2);
    s.respond_as(0, 1, wire::Opcode::RcReadResponseMiddle);
    s.respond_as(0, 2, wire::Opcode::RcReadResponseLast);
    s.check_all_complete(kReads);
    CHECK(s.requests().size() == kReads + 1);
}

TEST_CASE("A READ's kept responses are checked: wrong length or place is not kept",
          "[rc][read_recovery]") {
    ReadStream s;
    INFO("requests sent (PSNs): " << s.request_psns());
    s.respond(0, 0);
    // After the gap: a response one byte short, and a MIDDLE where the READ's LAST belongs.
    // Neither is kept (nor fails the READ: it may be a stale copy); the gap is asked for,
    // to the end, since nothing after it was kept.
    s.t.peer.inject(s.t.peer.headers(wire::Opcode::RcReadResponseMiddle, s.psn_of(0) + 2),
                    std::span(s.data[0].data() + 2 * kMtu, kMtu - 1));
    s.respond_as(0, 3, wire::Opcode::RcReadResponseMiddle);
    auto q = s.requests();
    REQUIRE(q.size() == kReads + 1);
    s.check_asks_from(q[kReads], 0, 1);
    CHECK(s.t.p.a.counters().rx_read_kept.load() == 0);
    for (uint32_t i = 1; i < kPkts; ++i) s.respond(0, i, i == 1);
    for (uint32_t r = 1; r < kReads; ++r) s.respond_all(r);
    s.check_all_complete(kReads);
}

TEST_CASE("A READ behind one lacking a response is asked again when a later READ answers",
          "[rc][read_recovery]") {
    ReadStream s;
    INFO("requests sent (PSNs): " << s.request_psns());
    s.respond(0, 0);
    s.respond(0, 2);  // READ 0 is asked for again for its response 1
    s.respond(0, 3);
    for (uint32_t i = 0; i + 1 < kPkts; ++i) s.respond(1, i);  // READ 1's LAST is lost
    REQUIRE(s.requests().size() == kReads + 1);
    // READ 2's first response shows that READ 1's last one is not coming: READ 1 alone is
    // asked for again, for its last response (READ 0 has been asked for already).
    s.respond(2, 0);
    auto q = s.requests();
    REQUIRE(q.size() == kReads + 2);
    s.check_asks_from(q[kReads], 0, 1, 1);
    s.check_asks_from(q[kReads + 1], 1, kPkts - 1);
    for (uint32_t i = 1; i < kPkts; ++i) s.respond(2, i);
    s.respond_all(3);
    CHECK(s.requests().size() == kReads + 2);
    s.respond(0, 1, true, true);
    s.respond(1, kPkts - 1, true);
    s.check_all_complete(kReads);
    CHECK(s.requests().size() == kReads + 2);
}

TEST_CASE("The rest of a READ lost behind its gap is asked for when the gap's answer ends",
          "[rc][read_recovery]") {
    ReadStream s;
    INFO("requests sent (PSNs): " << s.request_psns());
    // Responses 1 and 3 (the LAST) are lost: response 2 shows the first gap, which is asked
    // for alone (response 2 was kept).
    s.respond(0, 0);
    s.respond(0, 2);
    REQUIRE(s.requests().size() == kReads + 1);
    // A second copy of the kept response changes nothing and asks for nothing more.
    s.respond(0, 2);
    CHECK(s.requests().size() == kReads + 1);
    CHECK(s.t.p.a.counters().rx_read_kept.load() == 1);
    // The answer to the gap ends with its ONLY: the responder had sent every response of
    // the READ before it, so the missing LAST is lost too and is asked for at once (not
    // after the timer, 1 s here), to the end.
    s.respond(0, 1, true, true);
    auto q = s.requests();
    REQUIRE(q.size() == kReads + 2);
    s.check_asks_from(q[kReads], 0, 1, 1);
    s.check_asks_from(q[kReads + 1], 0, 3);
    s.respond(0, 3, true);
    for (uint32_t r = 1; r < kReads; ++r) s.respond_all(r);
    s.check_all_complete(kReads);
    CHECK(s.requests().size() == kReads + 2);
}

TEST_CASE("Before the first round trip, a silent responder is asked again for the front READ first",
          "[rc][read_recovery]") {
    // The adaptive timer's first wait (1 ms) is a guess: no round trip is measured yet, and
    // a responder that has not run (a process starting up, a thread off the CPU) is likelier
    // than a loss. Its first expiry asks again for the front READ alone, as a probe; the
    // next, as long, goes back N to all of them. The local ACK timeout (timeout 18) is 1 s.
    ReadStream s(18, false, true);
    INFO("requests sent (PSNs): " << s.request_psns());
    REQUIRE(s.t.p.wait_until([&] { return s.requests().size() >= 2 * kReads + 1; }, 5s));
    const auto q = s.requests();
    s.check_asks_from(q[kReads], 0, 0);
    for (uint32_t r = 0; r < kReads; ++r) s.check_asks_from(q[kReads + 1 + r], r, 0);
    CHECK(s.t.p.a.counters().tail_probes.load() == 1);
    CHECK(s.t.p.a.counters().early_retransmits.load() >= 1);
    // The responder runs at last: every READ completes, with b's data.
    for (uint32_t r = 0; r < kReads; ++r) s.respond_all(r);
    s.check_all_complete(kReads);
}

TEST_CASE("A timeout's go-back-N asks again only for the READs that lack responses",
          "[rc][read_recovery]") {
    // timeout 12: the local ACK timeout is 16.8 ms.
    ReadStream s(12);
    INFO("requests sent (PSNs): " << s.request_psns());
    s.respond(0, 0);
    s.respond(0, 2);  // READ 0 asked for again for 1: that request goes unanswered
    s.respond(0, 3);
    s.respond_all(1);
    s.respond_all(2);
    s.respond(3, 0);
    s.respond(3, 1);  // READ 3 lacks its last two
    REQUIRE(s.requests().size() == kReads + 1);
    // The timer goes back N from READ 0: READ 0 and READ 3 again, each from what it lacks to
    // its end (the responses READ 0 kept forgotten: a responder may answer only the rest);
    // READs 1 and 2 are complete and not asked for again.
    REQUIRE(s.t.p.wait_until([&] { return s.requests().size() >= kReads + 3; }, 5s));
    CHECK(s.t.p.a.counters().retransmit_timeouts.load() >= 1);
    auto q = s.requests();
    s.check_asks_from(q[kReads], 0, 1, 1);
    s.check_asks_from(q[kReads + 1], 0, 1);
    s.check_asks_from(q[kReads + 2], 3, 2);
    // Whatever further timeouts sent (the test thread held off the CPU), only READs 0 and 3.
    for (size_t i = kReads + 1; i < q.size(); ++i) {
        INFO("request " << i);
        const uint32_t psn = q[i].h.bth.psn;
        CHECK((psn == s.psn_of(0) + 1 || psn == s.psn_of(3) + 2));
    }
    for (uint32_t i = 1; i < kPkts; ++i) s.respond(0, i, i == 1);
    s.respond(3, 2, true);
    s.respond(3, 3);
    const auto cs = s.t.p.wait(*s.t.p.a.scq, kReads, 5s);
    REQUIRE(cs.size() == kReads);
    for (size_t i = 0; i < cs.size(); ++i) {
        CHECK(cs[i].wr_id == i);
        CHECK(cs[i].status == WcStatus::Success);
    }
    for (uint32_t r = 0; r < kReads; ++r)
        CHECK(first_mismatch(s.t.p.a.at(r * kLen), kLen, 500 + r) == kLen);
}

TEST_CASE("The front READ completes what the later READs' responses acknowledged",
          "[rc][read_recovery]") {
    // READ 0, a WRITE, READs 1-3. Responses to READ 1 mean that b executed the WRITE; b sends
    // no ACK for it (nothing asks), so READ 0's completion must complete the WRITE and the
    // READs already answered with it.
    ReadStream s(18, true);
    INFO("requests sent (PSNs): " << s.request_psns());
    REQUIRE(
        s.t.p.wait_until([&] { return s.t.a_out.count_opcode(wire::Opcode::RcWriteOnly) == 1; }));
    s.respond(0, 0);
    s.respond(0, 2);
    s.respond(0, 3);
    for (uint32_t r = 1; r < kReads; ++r) s.respond_all(r);
    CHECK(s.t.p.stays_empty(*s.t.p.a.scq));
    s.respond(0, 1, true, true);
    s.check_all_complete(kReads + 1);
    CHECK(s.requests().size() == kReads + 1);
    CHECK(s.t.a_out.count_opcode(wire::Opcode::RcWriteOnly) == 1);
}

TEST_CASE("A READ asked for again after a sequence NAK goes whatever the cut window",
          "[rc][read_recovery]") {
    // Two READs of 128 packets: 256 PSNs, the whole window. b's sequence NAK for READ 1's
    // PSN (its request was lost) halves the window to 128 PSNs, which READ 0 fills until it
    // completes; READ 1 must be asked for again at once all the same (its responses were
    // admitted when it first went), not after READ 0 has completed, or after a timeout.
    constexpr uint32_t kBigPkts = 128;
    constexpr uint32_t kBig = kBigPkts * kMtu;
    PairOptions o = timer_options(false);
    o.mem_bytes = 2 * kBig;
    QpAttributes attrs = requester_attributes(18);
    attrs.max_rd_atomic = 2;
    Hostile t(attrs, o);
    auto& a = t.p.a;
    std::vector<uint8_t> data(2 * kBig);
    fill(data.data(), data.size(), 77);
    for (uint32_t r = 0; r < 2; ++r)
        REQUIRE(a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, r, {a.sge(r * kBig, kBig)},
                                         t.p.b.iova + r * kBig, t.p.b.keys.rkey)) == 0);
    auto request_psns = [&t] {
        std::vector<uint32_t> psns;
        for (const SentPacket& s : t.a_out.with_opcode(wire::Opcode::RcReadRequest))
            psns.push_back(s.parsed().h.bth.psn);
        return psns;
    };
    REQUIRE(t.p.wait_until([&] { return request_psns().size() >= 2; }));
    t.peer.inject(t.peer.ack(kBigPkts, wire::AckType::Nak,
                             static_cast<uint8_t>(wire::NakCode::PsnSequenceError)));
    // READ 0 again (the NAK acknowledges PSNs before READ 1, and READ 0 has no response),
    // and READ 1 again from its first PSN.
    const auto psns = request_psns();
    REQUIRE(psns.size() == 4);
    CHECK(psns[2] == 0);
    CHECK(psns[3] == kBigPkts);
    CHECK(a.counters().send_window_cuts.load() == 1);
    // The answers: both READs whole, each a FIRST, MIDDLEs and a LAST.
    for (uint32_t r = 0; r < 2; ++r) {
        for (uint32_t i = 0; i < kBigPkts; ++i) {
            wire::Opcode op = wire::Opcode::RcReadResponseMiddle;
            if (i == 0) op = wire::Opcode::RcReadResponseFirst;
            if (i + 1 == kBigPkts) op = wire::Opcode::RcReadResponseLast;
            t.peer.inject(t.peer.headers(op, r * kBigPkts + i),
                          std::span(data.data() + r * kBig + i * kMtu, kMtu));
        }
    }
    const auto cs = t.p.wait(*a.scq, 2, 5s);
    REQUIRE(cs.size() == 2);
    CHECK(cs[0].wr_id == 0);
    CHECK(cs[1].wr_id == 1);
    CHECK(cs[0].status == WcStatus::Success);
    CHECK(cs[1].status == WcStatus::Success);
    CHECK(std::memcmp(a.at(0), data.data(), 2 * kBig) == 0);
    CHECK(request_psns().size() == 4);
}

TEST_CASE("READ responses for a buffer deregistered since the request went land nowhere",
          "[rc][read_recovery]") {
    // The buffer's key was checked when the READ was sent; each response is checked again
    // where it lands, so a region gone meanwhile takes no byte and fails the READ.
    ReadStream s;
    REQUIRE(s.t.p.a.engine->memory().remove(s.t.p.a.keys.lkey));
    s.respond_all(0);
    const auto cs = s.t.p.wait(*s.t.p.a.scq, kReads, 5s);
    REQUIRE(cs.size() == kReads);
    CHECK(cs[0].wr_id == 0);
    CHECK(cs[0].status == WcStatus::LocProtErr);
    for (size_t i = 1; i < cs.size(); ++i) CHECK(cs[i].status == WcStatus::WrFlushErr);
    CHECK(s.t.p.a.qp->state() == QpState::Err);
    // Hostile filled a's memory with pattern 1: not a byte of b's data (pattern 500) came.
    CHECK(first_mismatch(s.t.p.a.at(0), kReads * kLen, 1) == kReads * kLen);
}
