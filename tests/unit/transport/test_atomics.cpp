// RC atomics in the engine: the responder's checks and replay cache, played against by hand
// (ForgedPeer), and the requester/completer against a real engine that loses answers.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

QpAttributes atomic_attributes() {
    QpAttributes a = default_attributes();
    a.access |= kRemoteAtomic;
    a.max_rd_atomic = 4;
    a.max_dest_rd_atomic = 4;
    return a;
}

// 64 bytes of side `s` that remote atomics may target, at offset `offset` of its memory.
MemoryKeys atomic_region(Side& s, size_t offset) {
    return s.engine->memory().add(kPd, s.addr(offset), 64, s.iova + offset,
                                  kLocalWrite | kRemoteAtomic);
}

uint64_t u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

void put_u64(uint8_t* p, uint64_t v) {
    std::memcpy(p, &v, 8);
}

wire::Headers atomic_request(const ForgedPeer& peer, wire::Opcode op, uint32_t psn, uint64_t va,
                             uint32_t rkey, uint64_t swap_add, uint64_t compare = 0) {
    wire::Headers h = peer.headers(op, psn);
    h.bth.ack_req = true;
    h.atomic = {va, rkey, swap_add, compare};
    return h;
}

size_t atomic_acks(const TxRecorder& rec) {
    return rec.count_opcode(wire::Opcode::RcAtomicAcknowledge);
}

constexpr size_t kTarget = 32768;  // offset of the atomic region in a's memory

struct AtomicHostile {
    Hostile t{atomic_attributes()};
    MemoryKeys keys = atomic_region(t.p.a, kTarget);
    uint64_t va(size_t off = 0) const { return t.p.a.iova + kTarget + off; }
    uint8_t* target(size_t off = 0) { return t.p.a.at(kTarget + off); }
};

}  // namespace

TEST_CASE("Atomics: a duplicate is answered from the replay cache, never run again", "[atomic]") {
    AtomicHostile h;
    put_u64(h.target(), 40);
    h.t.peer.inject(atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 2));
    REQUIRE(h.t.p.wait_until([&] { return atomic_acks(h.t.a_out) == 1; }));
    CHECK(u64(h.target()) == 42);
    // The same request again (its answer was lost): the same answer, nothing executed.
    h.t.peer.inject(atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 2));
    REQUIRE(h.t.p.wait_until([&] { return atomic_acks(h.t.a_out) == 2; }));
    CHECK(u64(h.target()) == 42);
    const auto out = sent(h.t.a_out);
    REQUIRE(out.size() == 2);
    for (const Sent& s : out) {
        CHECK(s.psn == 0);
        CHECK(s.msn == 1);
        CHECK(s.atomic_ack == 40);
    }
    SECTION("a 'duplicate' with other operands is a forgery: dropped, not answered") {
        h.t.a_out.clear();
        const uint64_t dropped = h.t.p.a.counters().rx_duplicate_dropped.load();
        h.t.peer.inject(
            atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 3));
        h.t.peer.inject(
            atomic_request(h.t.peer, wire::Opcode::RcCompareSwap, 0, h.va(), h.keys.rkey, 2));
        h.t.peer.inject(
            atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(8), h.keys.rkey, 2));
        REQUIRE(h.t.p.wait_until(
            [&] { return h.t.p.a.counters().rx_duplicate_dropped.load() == dropped + 3; }));
        CHECK(atomic_acks(h.t.a_out) == 0);
        CHECK(u64(h.target()) == 42);
        CHECK(h.t.p.a.qp->state() == QpState::Rts);
    }
    SECTION("a READ request naming the atomic's PSN is not answered from its resource") {
        h.t.a_out.clear();
        h.t.peer.inject(h.t.read(0, kTarget, 0));
        h.t.peer.inject(h.t.read(0, kTarget, 8));
        REQUIRE(
            h.t.p.wait_until([&] { return h.t.p.a.counters().rx_duplicate_dropped.load() >= 2; }));
        CHECK(read_responses(h.t.a_out) == 0);
    }
}

TEST_CASE("Atomics: compare & swap answers with the value found", "[atomic]") {
    AtomicHostile h;
    put_u64(h.target(8), 7);
    h.t.peer.inject(
        atomic_request(h.t.peer, wire::Opcode::RcCompareSwap, 0, h.va(8), h.keys.rkey, 9, 6));
    h.t.peer.inject(
        atomic_request(h.t.peer, wire::Opcode::RcCompareSwap, 1, h.va(8), h.keys.rkey, 11, 7));
    REQUIRE(h.t.p.wait_until([&] { return atomic_acks(h.t.a_out) == 2; }));
    const auto out = sent(h.t.a_out);
    REQUIRE(out.size() == 2);
    CHECK(out[0].atomic_ack == 7);  // no swap: 7 != 6
    CHECK(out[1].atomic_ack == 7);  // swapped
    CHECK(out[1].msn == 2);
    CHECK(u64(h.target(8)) == 11);
}

TEST_CASE("Atomics: the responder refuses bad atomics before touching memory", "[atomic]") {
    SECTION("misaligned target: invalid request") {
        AtomicHostile h;
        put_u64(h.target(0), 3);
        put_u64(h.target(8), 5);
        h.t.peer.inject(
            atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(4), h.keys.rkey, 1));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::InvalidRequest, 0, AsyncEventType::QpRequestError);
        CHECK(u64(h.target(0)) == 3);
        CHECK(u64(h.target(8)) == 5);
    }
    SECTION("the QP grants no remote atomics: remote access error") {
        Hostile t;  // default attributes: no kRemoteAtomic
        const MemoryKeys keys = atomic_region(t.p.a, kTarget);
        put_u64(t.p.a.at(kTarget), 5);
        t.peer.inject(atomic_request(t.peer, wire::Opcode::RcFetchAdd, 0, t.p.a.iova + kTarget,
                                     keys.rkey, 1));
        REQUIRE(t.p.wait_until([&] { return t.p.a.qp->state() == QpState::Err; }));
        t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
        CHECK(u64(t.p.a.at(kTarget)) == 5);
    }
    SECTION("the region grants no remote atomics: remote access error") {
        AtomicHostile h;
        // The pair's own region allows remote read and write, not atomics.
        put_u64(h.t.p.a.at(0), 4);
        h.t.peer.inject(atomic_request(h.t.peer, wire::Opcode::RcCompareSwap, 0, h.t.p.a.iova,
                                       h.t.p.a.keys.rkey, 9, 4));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
        CHECK(u64(h.t.p.a.at(0)) == 4);
    }
    SECTION("past the end of the region: remote access error") {
        AtomicHostile h;
        h.t.peer.inject(
            atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(64), h.keys.rkey, 1));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
    }
    SECTION("an atomic with a payload is malformed: dropped before the responder") {
        AtomicHostile h;
        put_u64(h.target(), 5);
        h.t.peer.inject(
            atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 1),
            bytes(8, 3));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.counters().rx_malformed.load() == 1; }));
        CHECK(u64(h.target()) == 5);
        CHECK(h.t.a_out.packets().empty());
        CHECK(h.t.p.a.qp->state() == QpState::Rts);
    }
}

TEST_CASE("Atomics: lost Atomic Acknowledges are recovered; each atomic runs once", "[atomic]") {
    Pair p;
    p.connect(atomic_attributes(), atomic_attributes());
    const MemoryKeys keys = atomic_region(p.b, kTarget);
    put_u64(p.b.at(kTarget), 100);
    // b loses every other Atomic Acknowledge it sends.
    std::atomic<int> n{0};
    TxRecorder b_out(*p.b.engine, [&n](const wire::ParsedPacket& pkt) {
        if (pkt.h.bth.opcode != static_cast<uint8_t>(wire::Opcode::RcAtomicAcknowledge))
            return false;
        return n.fetch_add(1) % 2 == 0;
    });
    constexpr int kOps = 20;
    for (int i = 0; i < kOps; ++i) {
        SendWqe w = rdma_wqe(SendOpcode::AtomicFetchAdd, i, {p.a.sge(8 * i, 8)}, p.b.iova + kTarget,
                             keys.rkey);
        w.compare_add = 1;
        REQUIRE(p.a.qp->post_send(w) == 0);
    }
    const auto done = p.wait(*p.a.scq, kOps);
    REQUIRE(done.size() == kOps);
    for (int i = 0; i < kOps; ++i) {
        CHECK(done[i].status == WcStatus::Success);
        CHECK(done[i].opcode == WcOpcode::FetchAdd);
        CHECK(done[i].byte_len == 8);
        CHECK(u64(p.a.at(8 * i)) == 100u + i);
    }
    CHECK(u64(p.b.at(kTarget)) == 100u + kOps);
    CHECK(b_out.lost() > 0);
    CHECK(p.b.counters().rx_duplicate.load() > 0);
}

TEST_CASE("Atomics: an Atomic Acknowledge must answer an atomic", "[atomic]") {
    Pair p;
    p.connect(atomic_attributes(), atomic_attributes());
    TxRecorder b_out(*p.b.engine, {}, false);  // b is silent: the test answers for it
    ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};
    REQUIRE(p.a.qp->post_send(
                rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 8)}, p.b.iova, p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_until([&] { return b_out.packets().size() >= 1; }));
    const uint32_t psn = b_out.packets()[0].psn();
    wire::Headers ack = peer.ack(psn);
    ack.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcAtomicAcknowledge);
    ack.atomic_ack = 0x5555;
    const uint64_t before = p.a.counters().rx_response_out_of_window.load();
    peer.inject(ack);
    REQUIRE(p.wait_until(
        [&] { return p.a.counters().rx_response_out_of_window.load() == before + 1; }));
    // The WRITE is not completed by it, and no byte of a's memory changed.
    CHECK(p.stays_empty(*p.a.scq));
    CHECK(all_bytes(p.a.at(8), 64, kUntouched));
}

// The PSN space is 24 bits: one lap later a request takes the PSN of an old one. A duplicate
// of the new one must be answered from its own resource, not from the old one's, which no
// lap of fewer than max_dest_rd_atomic READs and atomics pushes out (zero-length WRITEs
// carry the PSN round here: 2^24 packets, a few seconds).
TEST_CASE("Atomics: one lap of the PSN space later, a duplicate is answered from its own request",
          "[atomic][wrap]") {
    AtomicHostile h;
    put_u64(h.target(), 100);
    h.t.peer.inject(atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 1));
    h.t.peer.inject(h.t.read(1, 0, 4 * kMtu));  // PSNs 1-4
    REQUIRE(h.t.p.wait_until(
        [&] { return atomic_acks(h.t.a_out) == 1 && read_responses(h.t.a_out) == 4; }));
    // One buffer for the 2^24 - 5 WRITEs, its PSN (BTH bytes 9-11) and ICRC rewritten for each.
    std::vector<uint8_t> write =
        h.t.peer.forge(h.t.write(wire::Opcode::RcWriteOnly, 5, 0, 0, false));
    const wire::IpFlow flow{h.t.peer.ip, h.t.p.a.engine->config().ip, h.t.peer.port,
                            h.t.p.a.engine->config().port};
    const size_t covered = write.size() - 4;
    for (uint32_t psn = 5; psn <= wire::kPsnMask; ++psn) {
        write[9] = static_cast<uint8_t>(psn >> 16);
        write[10] = static_cast<uint8_t>(psn >> 8);
        write[11] = static_cast<uint8_t>(psn);
        const uint32_t crc =
            wire::icrc(flow, wire::Ipv4Unseen{}, std::span<const uint8_t>(write.data(), covered));
        for (size_t i = 0; i < 4; ++i) write[covered + i] = static_cast<uint8_t>(crc >> (8 * i));
        h.t.p.a.engine->receive_datagram(write, h.t.peer.ip, h.t.peer.port);
    }
    REQUIRE(h.t.p.a.counters().rx_bad_icrc.load() == 0);
    h.t.a_out.clear();
    // PSN 0 again: a new FetchAdd with the same operands (it finds 101), and a new READ at
    // PSN 1, elsewhere.
    h.t.peer.inject(atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 1));
    h.t.peer.inject(h.t.read(1, 8192, kMtu));
    REQUIRE(h.t.p.wait_until(
        [&] { return atomic_acks(h.t.a_out) == 1 && read_responses(h.t.a_out) == 1; }));
    CHECK(u64(h.target()) == 102);
    h.t.a_out.clear();
    // Both answers were lost: the requester asks again.
    h.t.peer.inject(atomic_request(h.t.peer, wire::Opcode::RcFetchAdd, 0, h.va(), h.keys.rkey, 1));
    h.t.peer.inject(h.t.read(1, 8192, kMtu));
    REQUIRE(h.t.p.wait_until(
        [&] { return atomic_acks(h.t.a_out) == 1 && read_responses(h.t.a_out) == 1; }));
    for (const Sent& s : sent(h.t.a_out)) {
        if (s.is(wire::Opcode::RcAtomicAcknowledge)) CHECK(s.atomic_ack == 101);
        if (s.is_read_response()) {
            CHECK(s.psn == 1);
            CHECK(s.payload == std::vector<uint8_t>(h.t.p.a.at(8192), h.t.p.a.at(8192 + kMtu)));
        }
    }
    CHECK(u64(h.target()) == 102);  // executed once
    CHECK(h.t.p.a.counters().rx_duplicate_dropped.load() == 0);
}
