// Selective recovery: the responder keeps requests that come after a lost one and runs them
// when it comes (early_requests.h), and the requester answers a sequence NAK with the lost
// packet and its newest one (rc_selective_resend.cpp), going back N for a peer that keeps
// nothing. The store alone, then the responder played to by a forged requester (Hostile),
// and both ends for real under loss; the requester alone is in test_selective_requester.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>

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
    EarlyRequestPool budget(1 << 20);
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
    EarlyRequestPool budget(3 * kKept);
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
    EarlyRequestPool budget(1 << 20);
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
    EarlyRequestPool budget(1 << 20);
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

TEST_CASE("EarlyRequests: the memory of one loss is used again at the next, by any QP",
          "[selective][early]") {
    EarlyRequestPool pool(1 << 20);
    const auto a = bytes(1024, 1);
    std::set<const uint8_t*> used;  // the buffers the first loss's packets were kept in
    {
        EarlyRequests store(pool);
        for (uint32_t psn = 11; psn <= 13; ++psn)
            REQUIRE(store.keep(packet(wire::Opcode::RcWriteMiddle, psn, a), psn - 10) ==
                    EarlyRequests::Kept::Yes);
        CHECK(pool.spare_tables() == 0);
        CHECK(pool.spare_buffers() == 0);
        StoredRequest out;
        for (uint32_t psn = 11; psn <= 13; ++psn) {
            REQUIRE(store.take(psn, out));
            CHECK(out.payload == a);
            used.insert(out.payload.data());
        }
        store.give_back(out);
        CHECK(out.payload.empty());
        CHECK(store.empty());
    }
    REQUIRE(used.size() == 3);
    CHECK(pool.spare_tables() == 1);  // the store's slots, given back with its last packet
    CHECK(pool.spare_buffers() == 3);
    CHECK(pool.spare_bytes() >= 3 * a.size());

    // Another QP's loss takes them, and keeps its own bytes in them.
    EarlyRequests other(pool);
    const auto b = bytes(1024, 2);
    for (uint32_t psn = 40; psn <= 42; ++psn)
        REQUIRE(other.keep(packet(wire::Opcode::RcSendMiddle, psn, b), psn - 39) ==
                EarlyRequests::Kept::Yes);
    CHECK(pool.spare_tables() == 0);
    CHECK(pool.spare_buffers() == 0);
    CHECK(pool.spare_bytes() == 0);
    StoredRequest out;
    for (uint32_t psn = 40; psn <= 42; ++psn) {
        REQUIRE(other.take(psn, out));
        CHECK(out.payload == b);
        CHECK(used.count(out.payload.data()) == 1);
    }
    // clear() gives back what is still kept, as the last take does.
    REQUIRE(other.keep(packet(wire::Opcode::RcSendMiddle, 50, b), 1) == EarlyRequests::Kept::Yes);
    other.clear();
    CHECK(pool.spare_tables() == 1);
    CHECK(pool.spare_buffers() == 2);  // out still holds the third
    other.give_back(out);
    CHECK(pool.spare_buffers() == 3);
    CHECK(pool.in_use() == 0);
}

TEST_CASE("EarlyRequestPool: spares beyond its bounds are freed", "[selective][early]") {
    EarlyRequestPool pool(size_t{16} << 20);
    SECTION("buffers: at most kSpareBytes of capacity") {
        // 8 KiB payloads, 255 per store: more than kSpareBytes across three stores.
        const auto big = bytes(8192, 3);
        std::vector<std::unique_ptr<EarlyRequests>> stores;
        for (int k = 0; k < 3; ++k) {
            stores.push_back(std::make_unique<EarlyRequests>(pool));
            for (uint32_t psn = 1; psn < EarlyRequests::kSpan; ++psn)
                REQUIRE(stores.back()->keep(packet(wire::Opcode::RcWriteMiddle, psn, big), psn) ==
                        EarlyRequests::Kept::Yes);
        }
        REQUIRE(3 * (EarlyRequests::kSpan - 1) * big.size() > EarlyRequestPool::kSpareBytes);
        stores.clear();
        CHECK(pool.spare_bytes() <= EarlyRequestPool::kSpareBytes);
        CHECK(pool.spare_bytes() >= EarlyRequestPool::kSpareBytes - big.size());
        CHECK(pool.spare_buffers() == EarlyRequestPool::kSpareBytes / big.size());
        CHECK(pool.in_use() == 0);
    }
    SECTION("buffers: at most kSpareBuffers of them, however small") {
        const auto tiny = bytes(16, 4);
        std::vector<std::unique_ptr<EarlyRequests>> stores;
        while (stores.size() * (EarlyRequests::kSpan - 1) <= EarlyRequestPool::kSpareBuffers) {
            stores.push_back(std::make_unique<EarlyRequests>(pool));
            for (uint32_t psn = 1; psn < EarlyRequests::kSpan; ++psn)
                REQUIRE(stores.back()->keep(packet(wire::Opcode::RcSendMiddle, psn, tiny), psn) ==
                        EarlyRequests::Kept::Yes);
        }
        stores.clear();
        CHECK(pool.spare_buffers() == EarlyRequestPool::kSpareBuffers);
    }
    SECTION("slot tables: at most kSpareTables") {
        std::vector<std::unique_ptr<EarlyRequests>> stores;
        const auto a = bytes(64, 5);
        for (size_t i = 0; i < EarlyRequestPool::kSpareTables + 3; ++i) {
            stores.push_back(std::make_unique<EarlyRequests>(pool));
            REQUIRE(stores.back()->keep(packet(wire::Opcode::RcSendOnly, 9, a), 2) ==
                    EarlyRequests::Kept::Yes);
        }
        CHECK(pool.spare_tables() == 0);
        stores.clear();  // each store's destructor gives its table back
        CHECK(pool.spare_tables() == EarlyRequestPool::kSpareTables);
        CHECK(pool.in_use() == 0);
    }
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

// One packet of a receive batch that is not over yet: the ACKs it asks for stay pending.
void in_batch(Hostile& t, const wire::Headers& h, std::span<const uint8_t> payload = {}) {
    t.p.a.engine->receive_datagram(t.peer.forge(h, payload), t.peer.ip, t.peer.port, false);
}

// A 4-packet WRITE of `data` at kAt whose first packet comes last: 1-3 are kept, and run
// when 0 comes; the ACK names 0 (the cap: 1-3 not sent again yet).
void kept_then_filled(Hostile& t, const std::vector<uint8_t>& data) {
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 2, 0, 0, false), part(data, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 4 * kMtu, true), part(data, 0));
    REQUIRE(region(t.p.a, kAt, data.size()) == data);
    REQUIRE(acks(t.a_out) == std::vector<uint32_t>{0});
}

// The application stops a's QP, one way per section: destroyed, to ERR, to RESET.
void stop_each_way(Hostile& t) {
    SECTION("destroyed") {
        t.p.a.qp->close();
    }
    SECTION("to ERR") {
        REQUIRE(t.p.a.qp->modify(t.p.a.qp->attributes(), QpState::Rts, QpState::Err) == 0);
    }
    SECTION("to RESET") {
        REQUIRE(t.p.a.qp->modify(t.p.a.qp->attributes(), QpState::Rts, QpState::Reset) == 0);
    }
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
    // Their memory waits in the engine's pool for the next loss, the last one run included.
    CHECK(t.p.a.engine->early_request_pool().spare_buffers() == 3);
    CHECK(t.p.a.engine->early_request_pool().spare_tables() == 1);
    // The ACK names PSN 0, the newest the requester has sent since the NAK: a requester that
    // goes back N is still to send 1-3 again (rxe stops if an ACK completes what it resends).
    CHECK(acks(t.a_out) == std::vector<uint32_t>{0});
    t.a_out.clear();

    // The requester's newest packet again, a duplicate now: the ACK names it, and everything.
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    CHECK(acks(t.a_out) == std::vector<uint32_t>{3});
    CHECK(t.p.a.qp->state() == QpState::Rts);
    CHECK(t.p.a.engine->early_request_pool().in_use() == 0);
    // A new request in sequence is taken as usual.
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 4, kAt, 64, true), bytes(64, 8));
    CHECK(acks(t.a_out) == std::vector<uint32_t>{4});
    CHECK(region(t.p.a, kAt, 64) == bytes(64, 8));
}

TEST_CASE(
    "Responder: the newest packet ahead of a gap coming again draws the NAK again; nothing "
    "else does",
    "[selective][responder]") {
    Hostile t;
    const auto data = bytes(4 * kMtu, 7);
    // Packets 1-3 of a 4-packet WRITE: 0 was lost, one NAK.
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0, false), part(data, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 2, 0, 0, false), part(data, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    REQUIRE(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);
    t.a_out.clear();
    // An older kept packet again (a requester going back N, its resend of 0 lost): silence,
    // as IBA's responder keeps after its NAK.
    t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 2, 0, 0, true), part(data, 2));
    CHECK(sent(t.a_out).empty());
    // The newest again (a probe, or the tail of a selective resend whose 0 was lost): the
    // NAK again, each time.
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 2);
    CHECK(t.p.a.counters().tx_seq_nak_repeats.load() == 2);
    CHECK(t.p.a.counters().tx_seq_naks.load() == 3);
    CHECK(acks(t.a_out).empty());
    t.a_out.clear();
    // Once the gap fills, the same packet is a duplicate: an ACK, no NAK.
    t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, kAt, 4 * kMtu, true), part(data, 0));
    CHECK(region(t.p.a, kAt, data.size()) == data);
    t.peer.inject(t.write(wire::Opcode::RcWriteLast, 3, 0, 0, true), part(data, 3));
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 0);
    CHECK(acks(t.a_out) == std::vector<uint32_t>{0, 3});
    CHECK(t.p.a.counters().tx_seq_nak_repeats.load() == 2);
    CHECK(t.p.a.qp->state() == QpState::Rts);
}

TEST_CASE("Responder: a packet further ahead than any window never draws the NAK again",
          "[selective][responder]") {
    Hostile t;
    constexpr uint32_t kFar = EarlyRequests::kSpan + 10;  // no requester sent it since the gap
    SECTION("as the first packet ahead") {
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, kFar, kAt, 64, true), bytes(64, 1));
        REQUIRE(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, kFar, kAt, 64, true), bytes(64, 1));
    }
    SECTION("after a packet in the window") {
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 2, kAt, 64, true), bytes(64, 2));
        REQUIRE(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, kFar, kAt, 64, true), bytes(64, 1));
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, kFar, kAt, 64, true), bytes(64, 1));
        CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);
        // The newest packet in the window is still the one whose copy draws it.
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 2, kAt, 64, true), bytes(64, 2));
        CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 2);
        CHECK(t.p.a.counters().tx_seq_nak_repeats.load() == 1);
        return;
    }
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 1);
    CHECK(t.p.a.counters().tx_seq_nak_repeats.load() == 0);
}

TEST_CASE("Responder: after an RNR NAK, a packet that comes again draws no sequence NAK",
          "[selective][responder]") {
    Hostile t;
    // A SEND finds no receive WQE: RNR NAK; the requester's next packets are dropped, also
    // when one of them comes twice (it waits for the RNR timer, not for a sequence NAK).
    t.peer.inject(t.peer.headers(wire::Opcode::RcSendOnly, 0), bytes(64, 1));
    REQUIRE(naks(t.a_out, wire::NakCode::PsnSequenceError, 0) == 0);
    REQUIRE(t.p.a.counters().tx_rnr_naks.load() == 1);
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, true), bytes(64, 2));
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, true), bytes(64, 2));
    CHECK(sent(t.a_out).empty());
    CHECK(t.p.a.counters().tx_seq_nak_repeats.load() == 0);
}

TEST_CASE("Responder: a QP that stops answering acknowledges all that kept requests completed",
          "[selective][responder]") {
    Hostile t;
    const auto data = bytes(4 * kMtu, 7);
    kept_then_filled(t, data);
    t.a_out.clear();
    // The application, its last completion seen, stops the QP before the requester has sent
    // 1-3 again: nothing would acknowledge them after this.
    stop_each_way(t);
    // Twice: the last ACK goes again in case the first is lost (RcQp::send_last_ack).
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == 2);
    for (const auto& ack : out) {
        CHECK(ack.is_plain_ack());
        CHECK(ack.psn == 3);
        CHECK(ack.msn == 1);
    }
    CHECK(t.p.a.counters().tx_last_ack_repeats.load() == 1);
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
    in_batch(t, t.write(wire::Opcode::RcWriteMiddle, 1, 0, 0), part(data, 1));
    REQUIRE(sent(t.a_out).empty());
    // Nothing of a stopped QP answers the resends of 2 and 3: its last ACK names them, and
    // goes twice (in case the first is lost).
    std::vector<uint32_t> named{3, 3};
    SECTION("the batch ends: its ACK names the resent packet, no further (rxe's rule)") {
        t.p.a.qp->flush_ack();
        named = {1};  // this pass stops nothing: stop_each_way's sections are its siblings
    }
    stop_each_way(t);
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == named.size());
    for (size_t i = 0; i < out.size(); ++i) {
        CHECK(out[i].is_plain_ack());
        CHECK(out[i].psn == named[i]);
        CHECK(out[i].msn == 1);
    }
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
    CHECK(t.p.a.engine->early_request_pool().in_use() == 0);
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
    CHECK(t.p.a.engine->early_request_pool().in_use() == 0);
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

TEST_CASE("Responder: after a READ or an atomic fills the gap, no ACK names its PSN",
          "[selective][responder]") {
    QpAttributes attrs = default_attributes();
    attrs.access |= kRemoteAtomic;
    attrs.max_dest_rd_atomic = 4;
    Hostile t(attrs);
    // PSN 0 is lost; WRITE 1, asking for an ACK, is kept. The requester goes back N (a READ
    // or an atomic is never resent alone), and 0 comes again.
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, true), bytes(64, 5));
    REQUIRE(t.p.a.counters().rx_early_kept.load() == 1);
    t.a_out.clear();
    SECTION("a READ") {
        t.peer.inject(t.read(0, 0, 64));
        CHECK(read_responses(t.a_out) == 1);
    }
    SECTION("an atomic") {
        constexpr size_t kTarget = 32768;
        const MemoryKeys keys = t.p.a.engine->memory().add(
            kPd, t.p.a.addr(kTarget), 64, t.p.a.iova + kTarget, kLocalWrite | kRemoteAtomic);
        wire::Headers fadd = t.peer.headers(wire::Opcode::RcFetchAdd, 0);
        fadd.bth.ack_req = true;
        fadd.atomic = {t.p.a.iova + kTarget, keys.rkey, 1, 0};
        t.peer.inject(fadd);
        CHECK(t.a_out.count_opcode(wire::Opcode::RcAtomicAcknowledge) == 1);
    }
    CHECK(region(t.p.a, kAt, 64) == bytes(64, 5));  // the kept WRITE ran
    // PSN 0's answer is its response: a plain ACK naming 0 would complete it at a requester
    // that lost that response (rxe does, for a one-packet READ or an atomic).
    for (const Sent& x : sent(t.a_out))
        if (x.is_plain_ack()) CHECK(x.psn != 0);
    // The requester resends the WRITE: now the ACK names it.
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, true), bytes(64, 5));
    CHECK(acks(t.a_out) == std::vector<uint32_t>{1});
}

TEST_CASE("Responder: a READ that arrives while a cap holds does not become what the ACK names",
          "[selective][responder]") {
    Hostile t;
    // WRITE 0 and READ 2 are lost; WRITEs 1 and 3 are kept (a READ never is).
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, false), bytes(64, 1));
    t.peer.inject(t.read(2, 0, 64));
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 3, kAt + 64, 64, true), bytes(64, 3));
    REQUIRE(t.p.a.counters().rx_early_kept.load() == 2);
    // 0 comes again alone: 1 runs after it, the ACK names 0 (the cap).
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 0, kAt + 128, 64, true), bytes(64, 0));
    REQUIRE(region(t.p.a, kAt, 64) == bytes(64, 1));
    t.a_out.clear();
    // Then the READ, alone again: it runs, and 3 after it.
    t.peer.inject(t.read(2, 0, 64));
    CHECK(read_responses(t.a_out) == 1);
    CHECK(region(t.p.a, kAt + 64, 64) == bytes(64, 3));
    for (const Sent& x : sent(t.a_out))
        if (x.is_plain_ack()) CHECK(x.psn != 2);
    // The WRITEs the requester sends again are what the ACK may name.
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, false), bytes(64, 1));
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 3, kAt + 64, 64, true), bytes(64, 3));
    CHECK(acks(t.a_out).back() == 3);
}

TEST_CASE("Responder: a kept SEND held behind READ responses draws no RNR NAK either",
          "[selective][responder]") {
    Hostile t;  // no receive WQE posted
    // One receive batch: READ 0, whose response is due at its end; WRITE 2 and SEND 3 early
    // (1 lost); then 1. All three wait behind the response, the kept ones marked so.
    in_batch(t, t.read(0, 0, 64));
    in_batch(t, t.write(wire::Opcode::RcWriteOnly, 2, kAt + 64, 64, false), bytes(64, 2));
    wire::Headers send = t.peer.headers(wire::Opcode::RcSendOnly, 3);
    send.bth.ack_req = true;
    in_batch(t, send, bytes(16, 3));
    REQUIRE(t.p.a.counters().rx_early_kept.load() == 2);
    in_batch(t, t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, true), bytes(64, 1));
    t.p.a.qp->flush_ack();
    CHECK(t.p.a.counters().rx_early_run.load() == 2);
    CHECK(region(t.p.a, kAt, 64) == bytes(64, 1));
    CHECK(region(t.p.a, kAt + 64, 64) == bytes(64, 2));
    // Every buffer went back to the engine's pool: the three copies held behind the
    // response once they ran, and the last of the two kept ones (the first held a copy).
    CHECK(t.p.a.engine->early_request_pool().spare_buffers() == 4);
    // SEND 3 found no WQE: it goes silently, since an RNR NAK for 3 would acknowledge the
    // kept WRITE 2 before the requester sent it again. The ACK names 1.
    CHECK(t.p.a.counters().tx_rnr_naks.load() == 0);
    for (const Sent& x : sent(t.a_out)) {
        CHECK_FALSE((x.is(wire::Opcode::RcAcknowledge) && x.psn >= 2));
    }
    CHECK(acks(t.a_out) == std::vector<uint32_t>{1});
    // Sent again in sequence, SEND 3 draws the RNR NAK (after 2 came again).
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 2, kAt + 64, 64, false), bytes(64, 2));
    t.peer.inject(send, bytes(16, 3));
    CHECK(t.p.a.counters().tx_rnr_naks.load() == 1);
    // Nothing after the RNR NAK names less than it does.
    const auto out = sent(t.a_out);
    REQUIRE_FALSE(out.empty());
    CHECK(out.back().psn == 3);
}

TEST_CASE("Responder: the cap stays while kept requests wait behind READ responses",
          "[selective][responder]") {
    PairOptions o;
    o.mem_bytes = 256 * 1024;
    Hostile t(default_attributes(), o);
    constexpr uint32_t kReadPackets = 128;  // two bursts of responses, PSNs 1-128
    // One batch: WRITE 0 (its ACK pending at the batch's end), a long READ 1, WRITE 130
    // early (129 lost), then 129. The READ's responses go out over two steps; 129 and the
    // kept 130 wait for them.
    in_batch(t, t.write(wire::Opcode::RcWriteOnly, 0, kAt, 64, true), bytes(64, 0));
    in_batch(t, t.read(1, 64 * 1024, kReadPackets * kMtu));
    in_batch(t, t.write(wire::Opcode::RcWriteOnly, 130, kAt + 128, 64, true), bytes(64, 3));
    REQUIRE(t.p.a.counters().rx_early_kept.load() == 1);
    in_batch(t, t.write(wire::Opcode::RcWriteOnly, 129, kAt + 64, 64, false), bytes(64, 2));
    t.p.a.qp->flush_ack();  // the batch's end: ACK 0 goes, the kept 130 still waits
    REQUIRE(eventually(
        [&] { return read_responses(t.a_out) == kReadPackets && acks(t.a_out).size() >= 2; }));
    CHECK(region(t.p.a, kAt + 64, 64) == bytes(64, 2));
    CHECK(region(t.p.a, kAt + 128, 64) == bytes(64, 3));
    // When 129 and 130 ran, the requester had not sent 130 again: the ACK names 129.
    const auto a = acks(t.a_out);
    CHECK(a.front() == 0);
    CHECK(a.back() == 129);
    CHECK(std::find(a.begin(), a.end(), 130u) == a.end());
}

TEST_CASE("Responder: a QP the transport moves to ERR acknowledges all kept requests completed",
          "[selective][responder]") {
    Hostile t;
    const auto data = bytes(4 * kMtu, 7);
    kept_then_filled(t, data);
    t.a_out.clear();
    // The QP's own request fails (a bad lkey): the transport moves it to ERR, not the
    // application.
    REQUIRE(t.p.a.qp->post_send(send_wqe(1, {Sge{t.p.a.addr(0), 100, t.p.a.keys.lkey + 0x100}})) ==
            0);
    const auto failed = t.p.wait(*t.p.a.scq, 1);
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].status == WcStatus::LocProtErr);
    REQUIRE(t.p.a.qp->state() == QpState::Err);
    CHECK(acks(t.a_out) == std::vector<uint32_t>{3, 3});  // the last one goes twice
}

TEST_CASE("Responder: a receive CQ overrun by a held SEND fails that SEND, not the next",
          "[selective][responder]") {
    PairOptions o;
    o.cq_capacity = 1;
    Hostile t(default_attributes(), o);
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(0, 64)})) == 0);
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(2, {t.p.a.sge(100, 64)})) == 0);
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(3, {t.p.a.sge(200, 64)})) == 0);
    wire::Headers send = t.peer.headers(wire::Opcode::RcSendOnly, 0);
    send.bth.ack_req = true;
    t.peer.inject(send, bytes(16, 0));  // fills the receive CQ: nobody polls it
    t.a_out.clear();
    // One batch: READ 1, then SENDs 2 and 3 held behind its response.
    in_batch(t, t.read(1, 0, 64));
    send.bth.psn = 2;
    in_batch(t, send, bytes(16, 2));
    send.bth.psn = 3;
    in_batch(t, send, bytes(16, 3));
    t.p.a.qp->flush_ack();
    REQUIRE(t.p.a.qp->state() == QpState::Err);
    // SEND 2's completion is lost: the NAK fails it at the requester. A NAK for 3 would
    // report 2 done and fail 3, which never ran.
    CHECK(naks(t.a_out, wire::NakCode::RemoteOperationalError, 2) == 1);
    CHECK(naks(t.a_out, wire::NakCode::RemoteOperationalError, 3) == 0);
    CHECK(region(t.p.a, 200, 16) != bytes(16, 3));
}

TEST_CASE("Responder: a READ at the PSN of a kept WRITE throws the kept one away",
          "[selective][responder]") {
    Hostile t;
    const auto before = region(t.p.a, kAt, 64);
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 1, kAt, 64, true), bytes(64, 5));
    REQUIRE(t.p.a.counters().rx_early_kept.load() == 1);
    t.peer.inject(t.read(1, 0, 64));  // the same PSN, another request: one is not the peer's
    CHECK(t.p.a.counters().rx_early_dropped.load() == 1);
    CHECK(t.p.a.engine->early_request_pool().in_use() == 0);
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 0, kAt + 128, 64, true), bytes(64, 6));
    CHECK(t.p.a.counters().rx_early_run.load() == 0);
    CHECK(region(t.p.a, kAt, 64) == before);
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
    // Nor does the newest packet ahead of a gap draw the NAK again: IBA's responder.
    t.a_out.clear();
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 3, kAt, 64, true), bytes(64, 3));
    t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 3, kAt, 64, true), bytes(64, 3));
    CHECK(naks(t.a_out, wire::NakCode::PsnSequenceError, 2) == 1);
    CHECK(t.p.a.counters().tx_seq_nak_repeats.load() == 0);
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
    CHECK(p.b.engine->early_request_pool().in_use() == 0);
}
