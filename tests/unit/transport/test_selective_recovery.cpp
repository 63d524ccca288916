// Selective recovery: the responder keeps requests that come after a lost one and runs them
// when it comes (early_requests.h), and the requester answers a sequence NAK with the lost
// packet and its newest one (rc_selective_resend.cpp), going back N for a peer that keeps
// nothing. The store alone, then the responder played to by a forged requester (Hostile),
// and both ends for real under loss; the requester alone is in test_selective_requester.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"
#include "transport/early_requests.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

// A parsed packet of opcode `op` and PSN `psn` over `payload` (which must outlive it).
wire::ParsedPacket packet(wire::Opcode op, uint32_t psn, const std::vector<uint8_t>& payload) {
    wire::ParsedPacket p;
    p.info = wire::opcode_info(static_cast<uint8_t>(op));
    REQUIRE(p.info != nullptr);
    p.h.bth.opcode = static_cast<uint8_t>(op);
    p.h.bth.psn = psn;
    p.payload = payload;
    return p;
}

constexpr size_t kKept = 1024 + EarlyRequests::kOverhead;  // what a full packet counts

}  // namespace

// --- the store ---

TEST_CASE("EarlyRequests: a kept packet comes back whole, once, and its bytes are given back",
          "[selective][early]") {
    EarlyRequestBudget budget(1 << 20);
    EarlyRequests store(budget);
    const auto a = bytes(1024, 1), b = bytes(1024, 2);
    CHECK(store.keep(packet(wire::Opcode::RcWriteMiddle, 11, a), 1) == EarlyRequests::Kept::Yes);
    CHECK(store.keep(packet(wire::Opcode::RcWriteLast, 12, b), 2) == EarlyRequests::Kept::Yes);
    CHECK(store.size() == 2);
    CHECK(budget.in_use() == 2 * kKept);
    StoredRequest out;
    CHECK_FALSE(store.take(10, out));  // the missing one was never kept
    REQUIRE(store.take(11, out));
    CHECK(out.h.bth.psn == 11);
    CHECK(out.info == wire::opcode_info(static_cast<uint8_t>(wire::Opcode::RcWriteMiddle)));
    CHECK(out.payload == a);
    CHECK(out.view().payload.size() == 1024);
    CHECK_FALSE(store.take(11, out));  // once
    CHECK(budget.in_use() == kKept);
    REQUIRE(store.take(12, out));
    CHECK(out.payload == b);
    CHECK(store.empty());
    CHECK(budget.in_use() == 0);
}

TEST_CASE("EarlyRequests: what is not kept", "[selective][early]") {
    EarlyRequestBudget budget(3 * kKept);
    EarlyRequests store(budget);
    const auto a = bytes(1024, 1);
    SECTION("READ and atomic requests") {
        CHECK(store.keep(packet(wire::Opcode::RcReadRequest, 5, {}), 1) ==
              EarlyRequests::Kept::NotKind);
        CHECK(store.keep(packet(wire::Opcode::RcFetchAdd, 5, {}), 1) ==
              EarlyRequests::Kept::NotKind);
    }
    SECTION("the expected PSN itself, or a span or more ahead") {
        CHECK(store.keep(packet(wire::Opcode::RcSendOnly, 5, a), 0) == EarlyRequests::Kept::TooFar);
        CHECK(store.keep(packet(wire::Opcode::RcSendOnly, 5, a), EarlyRequests::kSpan) ==
              EarlyRequests::Kept::TooFar);
        CHECK(store.keep(packet(wire::Opcode::RcSendOnly, 5, a), EarlyRequests::kSpan - 1) ==
              EarlyRequests::Kept::Yes);
    }
    SECTION("beyond the engine's budget") {
        for (uint32_t i = 1; i <= 3; ++i)
            CHECK(store.keep(packet(wire::Opcode::RcWriteMiddle, i, a), i) ==
                  EarlyRequests::Kept::Yes);
        CHECK(store.keep(packet(wire::Opcode::RcWriteMiddle, 4, a), 4) ==
              EarlyRequests::Kept::NoBudget);
        CHECK(store.size() == 3);
        store.clear();
        CHECK(budget.in_use() == 0);
        CHECK(store.keep(packet(wire::Opcode::RcWriteMiddle, 4, a), 4) == EarlyRequests::Kept::Yes);
    }
}

TEST_CASE(
    "EarlyRequests: a second copy that differs throws both away; the same one changes "
    "nothing but AckReq",
    "[selective][early]") {
    EarlyRequestBudget budget(1 << 20);
    EarlyRequests store(budget);
    const auto a = bytes(1024, 1);
    CHECK(store.keep(packet(wire::Opcode::RcWriteMiddle, 7, a), 3) == EarlyRequests::Kept::Yes);
    wire::ParsedPacket again = packet(wire::Opcode::RcWriteMiddle, 7, a);
    again.h.bth.ack_req = true;
    CHECK(store.keep(again, 3) == EarlyRequests::Kept::Already);
    SECTION("the same packet: kept once, asking for the ACK the resend asked for") {
        StoredRequest out;
        REQUIRE(store.take(7, out));
        CHECK(out.h.bth.ack_req);
        CHECK(out.payload == a);
    }
    SECTION("another payload") {
        auto b = a;
        b[1000] ^= 1;
        CHECK(store.keep(packet(wire::Opcode::RcWriteMiddle, 7, b), 3) ==
              EarlyRequests::Kept::Conflict);
        StoredRequest out;
        CHECK_FALSE(store.take(7, out));
        CHECK(budget.in_use() == 0);
    }
    SECTION("another opcode") {
        CHECK(store.keep(packet(wire::Opcode::RcWriteLast, 7, a), 3) ==
              EarlyRequests::Kept::Conflict);
        StoredRequest out;
        CHECK_FALSE(store.take(7, out));
    }
    SECTION("another RETH") {
        wire::ParsedPacket first = packet(wire::Opcode::RcWriteFirst, 9, a);
        first.h.reth = {0x1000, 5, 4096};
        CHECK(store.keep(first, 5) == EarlyRequests::Kept::Yes);
        first.h.reth.va += 8;
        CHECK(store.keep(first, 5) == EarlyRequests::Kept::Conflict);
        StoredRequest out;
        CHECK_FALSE(store.take(9, out));
        CHECK(store.take(7, out));  // its neighbour is untouched
    }
}

TEST_CASE("EarlyRequests: PSNs the expected one has passed are forgotten, across the wrap",
          "[selective][early]") {
    EarlyRequestBudget budget(1 << 20);
    EarlyRequests store(budget);
    const auto a = bytes(64, 1);
    const uint32_t base = wire::kPsnMask - 2;  // 0xfffffd: the PSNs wrap after two
    for (uint32_t i = 1; i <= 5; ++i)
        REQUIRE(store.keep(packet(wire::Opcode::RcSendMiddle, (base + i) & wire::kPsnMask, a), i) ==
                EarlyRequests::Kept::Yes);
    store.forget_before(1);  // PSNs 0xfffffe, 0xffffff and 0 are behind
    CHECK(store.size() == 2);
    StoredRequest out;
    CHECK_FALSE(store.take(0, out));
    CHECK(store.take(1, out));
    CHECK(store.take(2, out));
    CHECK(budget.in_use() == 0);
}

// --- the responder ---

namespace {

constexpr uint64_t kAt = 8192;  // where the WRITEs below land in a's region

// Packet `i` of `data` cut at the path MTU.
std::vector<uint8_t> part(const std::vector<uint8_t>& data, uint32_t i) {
    const size_t from = size_t{i} * kMtu, to = std::min(data.size(), from + kMtu);
    return {data.begin() + static_cast<ptrdiff_t>(from), data.begin() + static_cast<ptrdiff_t>(to)};
}

std::vector<uint8_t> region(Side& s, uint64_t offset, size_t len) {
    return {s.at(offset), s.at(offset) + len};
}

// The plain ACKs `rec` holds, by PSN.
std::vector<uint32_t> acks(const TxRecorder& rec) {
    std::vector<uint32_t> out;
    for (const Sent& s : sent(rec))
        if (s.is_plain_ack()) out.push_back(s.psn);
    return out;
}

}  // namespace

TEST_CASE(
    "Responder: requests after a lost one are kept and run when it comes; the ACK names "
    "only what the requester has sent since",
    "[selective][responder]") {
    Hostile t;
    const auto data = bytes(4 * kMtu, 7);
    const auto before = region(t.p.a, kAt, data.size());
    // Packets 1-3 of a 4-packet WRITE come first: packet 0 was lost.
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 2, 0, 0, false), part(data, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);  // one NAK, for the first
    CHECK(acks(t.a_out).empty());
    CHECK(t.p.a.counters().rx_early_kept.load() == 3);
    CHECK(region(t.p.a, kAt, data.size()) == before);  // nothing runs out of order
    t.a_out.clear();

    // The lost packet comes again alone (with its RETH), asking for an ACK: all four run.
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 4 * kMtu, true), part(data, 0));
    CHECK(region(t.p.a, kAt, data.size()) == data);
    CHECK(t.p.a.counters().rx_early_run.load() == 3);
    // The ACK names PSN 0, the newest the requester has sent since the NAK: a requester that
    // goes back N is still to send 1-3 again (rxe stops if an ACK completes what it resends).
    CHECK(acks(t.a_out) == std::vector<uint32_t>{0});
    t.a_out.clear();

    // The requester's newest packet again, a duplicate now: the ACK names it, and everything.
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    CHECK(acks(t.a_out) == std::vector<uint32_t>{3});
    CHECK(t.p.a.qp->state() == QpState::Rts);
    CHECK(t.p.a.engine->early_request_budget().in_use() == 0);
    // A new request in sequence is taken as usual.
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 4, kAt, 64, true), bytes(64, 8));
    CHECK(acks(t.a_out) == std::vector<uint32_t>{4});
    CHECK(region(t.p.a, kAt, 64) == bytes(64, 8));
}

TEST_CASE("Responder: a QP that stops answering acknowledges all that kept requests completed",
          "[selective][responder]") {
    Hostile t;
    const auto data = bytes(4 * kMtu, 7);
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 2, 0, 0, false), part(data, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 4 * kMtu, true), part(data, 0));
    REQUIRE(acks(t.a_out) == std::vector<uint32_t>{0});  // capped: 1-3 not resent yet
    t.a_out.clear();
    // The application, its last completion seen, stops the QP before the requester has sent
    // 1-3 again: nothing would acknowledge them after this.
    SECTION("destroyed") {
        t.p.a.qp->close();
    }
    SECTION("to ERR") {
        REQUIRE(t.p.a.qp->modify(t.p.a.qp->attributes(), QpState::Rts, QpState::Err) == 0);
    }
    SECTION("to RESET") {
        REQUIRE(t.p.a.qp->modify(t.p.a.qp->attributes(), QpState::Rts, QpState::Reset) == 0);
    }
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].is_plain_ack());
    CHECK(out[0].psn == 3);
    CHECK(out[0].msn == 1);
}

TEST_CASE("Responder: a QP that stops mid-batch acknowledges all it executed, not only a resend",
          "[selective][responder]") {
    Hostile t;
    const auto data = bytes(4 * kMtu, 7);
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 4 * kMtu, false), part(data, 0));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 2, 0, 0, false), part(data, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    REQUIRE(region(t.p.a, kAt, data.size()) == data);
    REQUIRE(acks(t.a_out) == std::vector<uint32_t>{3});
    t.a_out.clear();
    // The ACK for 3 was lost: the requester goes back to 1. In the middle of the receive
    // batch that took the resend (its ACK still pending), the application stops the QP.
    t.p.a.engine->receive_datagram(
        t.peer.forge(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0), part(data, 1)), t.peer.ip,
        t.peer.port, false);
    REQUIRE(sent(t.a_out).empty());
    // Nothing of a stopped QP answers the resends of 2 and 3: its last ACK names them.
    uint32_t named = 3;
    SECTION("the batch ends: its ACK names the resent packet, no further (rxe's rule)") {
        t.p.a.qp->flush_ack();
        named = 1;
    }
    SECTION("destroyed") {
        t.p.a.qp->close();
    }
    SECTION("to ERR") {
        REQUIRE(t.p.a.qp->modify(t.p.a.qp->attributes(), QpState::Rts, QpState::Err) == 0);
    }
    SECTION("to RESET") {
        REQUIRE(t.p.a.qp->modify(t.p.a.qp->attributes(), QpState::Rts, QpState::Reset) == 0);
    }
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].is_plain_ack());
    CHECK(out[0].psn == named);
    CHECK(out[0].msn == 1);
    CHECK(region(t.p.a, kAt, data.size()) == data);
}

TEST_CASE(
    "Responder: a second, different copy of a kept request throws both away; the resend "
    "decides",
    "[selective][responder]") {
    Hostile t;
    const auto data = bytes(3 * kMtu, 7);
    const auto before = region(t.p.a, kAt, data.size());
    auto forged = part(data, 1);
    forged[100] ^= 0xff;
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), forged);
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    CHECK(t.p.a.counters().rx_early_dropped.load() == 1);
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 2, 0, 0, true), part(data, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 3 * kMtu, true), part(data, 0));
    // Packet 0 ran; packet 1 is not kept, so nothing after it runs.
    CHECK(region(t.p.a, kAt, kMtu) == part(data, 0));
    CHECK(region(t.p.a, kAt + kMtu, 2 * kMtu) ==
          std::vector<uint8_t>(before.begin() + kMtu, before.end()));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    CHECK(region(t.p.a, kAt, data.size()) == data);
    CHECK(t.p.a.counters().rx_early_run.load() == 1);
    CHECK(t.p.a.qp->state() == QpState::Rts);
}

TEST_CASE("Responder: a kept request passes every check when it runs", "[selective][responder]") {
    Hostile t;
    const auto data = bytes(3 * kMtu, 7);
    const auto before = region(t.p.a, kAt, data.size());
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    SECTION("the WRITE's key fails on its First: no byte of the kept packets lands") {
        t.peer.inject(t.write(wire::Opcode::RcWriteLast, 2, 0, 0, true), part(data, 2));
        wire::Headers first = t.write(wire::Opcode::RcWriteFirst, 0, kAt, 3 * kMtu, true);
        first.reth.rkey ^= 0x100;
        t.peer.inject(first, part(data, 0));
        t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
        CHECK(region(t.p.a, kAt, data.size()) == before);
        CHECK(t.p.a.counters().rx_early_run.load() == 0);
    }
    SECTION("a kept Last longer than the RETH: refused when it runs, after what came before") {
        const auto longer = bytes(kMtu, 9);  // the WRITE is 2 MTUs and a bit: this overruns it
        t.peer.inject(t.write(wire::Opcode::RcWriteLast, 2, 0, 0, true), longer);
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 2 * kMtu + 16, true),
                      part(data, 0));
        t.check_refused(wire::NakCode::InvalidRequest, 2, AsyncEventType::QpRequestError);
        CHECK(region(t.p.a, kAt, 2 * kMtu) ==
              std::vector<uint8_t>(data.begin(), data.begin() + 2 * kMtu));
        CHECK(region(t.p.a, kAt + 2 * kMtu, kMtu) ==
              std::vector<uint8_t>(before.begin() + 2 * kMtu, before.end()));
        CHECK(t.p.a.counters().rx_early_run.load() == 2);
    }
    CHECK(t.p.a.engine->early_request_budget().in_use() == 0);
}

TEST_CASE(
    "Responder: a kept SEND without a receive WQE draws no RNR NAK until it comes in "
    "sequence",
    "[selective][responder]") {
    Hostile t;
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(0, 64)})) == 0);
    wire::Headers send = t.peer.headers(wire::Opcode::RcSendOnly, 1);
    send.bth.ack_req = true;
    t.peer.inject(send, bytes(16, 1));
    send.bth.psn = 2;
    t.peer.inject(send, bytes(16, 2));
    CHECK(t.p.a.counters().rx_early_kept.load() == 2);
    t.a_out.clear();
    send.bth.psn = 0;
    t.peer.inject(send, bytes(16, 0));
    REQUIRE(t.p.wait_one(*t.p.a.rcq).wr_id == 1);
    // PSN 1 found no WQE: it and PSN 2 go, silently; the ACK names PSN 0.
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 1) == 0);
    for (const Sent& s : sent(t.a_out)) CHECK(s.is_plain_ack());
    CHECK(acks(t.a_out) == std::vector<uint32_t>{0});
    CHECK(t.p.a.counters().tx_rnr_naks.load() == 0);
    CHECK(t.p.a.engine->early_request_budget().in_use() == 0);
    // Sent again in sequence, PSN 1 draws the RNR NAK.
    send.bth.psn = 1;
    t.peer.inject(send, bytes(16, 1));
    CHECK(t.p.a.counters().tx_rnr_naks.load() == 1);
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(2, {t.p.a.sge(100, 64)})) == 0);
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(3, {t.p.a.sge(200, 64)})) == 0);
    t.peer.inject(send, bytes(16, 1));
    send.bth.psn = 2;
    t.peer.inject(send, bytes(16, 2));
    const auto got = t.p.wait(*t.p.a.rcq, 2);
    REQUIRE(got.size() == 2);
    CHECK(got[0].wr_id == 2);
    CHECK(got[1].wr_id == 3);
    CHECK(region(t.p.a, 100, 16) == bytes(16, 1));
    CHECK(region(t.p.a, 200, 16) == bytes(16, 2));
}

TEST_CASE("Responder: with selective recovery off, requests after a lost one are dropped",
          "[selective][responder]") {
    PairOptions o;
    o.selective = false;
    Hostile t(default_attributes(), o);
    const auto data = bytes(2 * kMtu, 7);
    const auto before = region(t.p.a, kAt, data.size());
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 1, 0, 0, true), part(data, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 2 * kMtu, true), part(data, 0));
    CHECK(region(t.p.a, kAt + kMtu, kMtu) ==
          std::vector<uint8_t>(before.begin() + kMtu, before.end()));
    CHECK(t.p.a.counters().rx_early_kept.load() == 0);
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 1, 0, 0, true), part(data, 1));
    CHECK(region(t.p.a, kAt, data.size()) == data);
}

// --- both ends, for real ---

TEST_CASE("Selective recovery: a stream under loss or reordering arrives whole, on and off",
          "[selective][stream]") {
    constexpr uint32_t kMessages = 24, kBytes = 16 * kMtu;
    const bool on = GENERATE(true, false);
    // Lost requests; or requests overtaken (held back 200 us) and sent twice.
    const bool reorder = GENERATE(false, true);
    INFO("selective recovery " << (on ? "on" : "off") << (reorder ? ", reordered" : ", lost"));
    PairOptions o;
    o.mem_bytes = size_t{kMessages} * kBytes;
    o.selective = on;
    if (reorder) {
        o.faults_a.reorder = 0.03;  // a's packets: requests
        o.faults_a.duplicate = 0.03;
    } else {
        o.faults_a.drop = 0.03;
    }
    o.faults_a.seed = 5;
    Pair p(o);
    p.connect();
    for (uint32_t i = 0; i < kMessages; ++i) {
        fill(p.a.at(i * kBytes), kBytes, 100 + i);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, i, {p.a.sge(i * kBytes, kBytes)},
                                           p.b.iova + i * kBytes, p.b.keys.rkey),
                                  i + 1 < kMessages) == 0);
    }
    const auto done = p.wait(*p.a.scq, kMessages);
    REQUIRE(done.size() == kMessages);
    for (const Completion& c : done) CHECK(c.status == WcStatus::Success);
    for (uint32_t i = 0; i < kMessages; ++i) {
        INFO("message " << i);
        CHECK(first_mismatch(p.b.at(i * kBytes), kBytes, 100 + i) == kBytes);
    }
    CHECK((reorder ? p.a.counters().tx_reordered_fault.load()
                   : p.a.counters().tx_dropped_fault.load()) > 0);
    if (on) {
        // Kept packets ran at b, and at least one loss was repaired by a selective resend.
        CHECK(p.b.counters().rx_early_run.load() > 0);
        CHECK(p.a.counters().selective_resends.load() > 0);
    } else {
        CHECK(p.b.counters().rx_early_kept.load() == 0);
        CHECK(p.a.counters().selective_resends.load() == 0);
    }
    CHECK(p.b.engine->early_request_budget().in_use() == 0);
}
