// ATOMIC WRITE (IBA 1.5, opcode 0x1d) in the engine: the responder's checks, played against by
// hand (ForgedPeer), a duplicate that must not store again, and the requester/completer
// against a real engine that loses its ACKs.
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

constexpr size_t kTarget = 32768;  // offset of the target region in a's memory

uint64_t u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

void put_u64(uint8_t* p, uint64_t v) {
    std::memcpy(p, &v, 8);
}

std::vector<uint8_t> u64_bytes(uint64_t v) {
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), &v, 8);
    return b;
}

// A side whose QP takes remote writes, with 64 bytes that allow remote write only.
struct AtomicWriteHostile {
    Hostile t;  // default attributes: remote read and write, no remote atomics
    MemoryKeys keys = t.p.a.engine->memory().add(kPd, t.p.a.addr(kTarget), 64, t.p.a.iova + kTarget,
                                                 kLocalWrite | kRemoteWrite);
    uint64_t va(size_t off = 0) const { return t.p.a.iova + kTarget + off; }
    uint8_t* target(size_t off = 0) { return t.p.a.at(kTarget + off); }

    wire::Headers request(uint32_t psn, uint64_t va, uint32_t rkey, uint32_t dma_len = 8) const {
        wire::Headers h = t.peer.headers(wire::Opcode::RcAtomicWrite, psn);
        h.bth.ack_req = true;
        h.reth = {va, rkey, dma_len};
        return h;
    }
    size_t acks_for(uint32_t psn) const {
        size_t n = 0;
        for (const Sent& s : sent(t.a_out))
            if (s.is_plain_ack() && s.psn == psn) ++n;
        return n;
    }
};

}  // namespace

TEST_CASE("ATOMIC WRITE: the responder stores 8 bytes and acknowledges them", "[atomic_write]") {
    AtomicWriteHostile h;
    put_u64(h.target(0), 1);
    put_u64(h.target(8), 2);
    put_u64(h.target(16), 3);
    h.t.peer.inject(h.request(0, h.va(8), h.keys.rkey), u64_bytes(0x0123456789abcdefull));
    REQUIRE(h.t.p.wait_until([&] { return h.acks_for(0) == 1; }));
    CHECK(u64(h.target(8)) == 0x0123456789abcdefull);
    CHECK(u64(h.target(0)) == 1);
    CHECK(u64(h.target(16)) == 3);
    CHECK(sent(h.t.a_out)[0].msn == 1);
    CHECK(h.t.p.a.qp->state() == QpState::Rts);

    SECTION("a duplicate is acknowledged, never stored again") {
        // The application changed the word since; the requester resends (its ACK was lost).
        put_u64(h.target(8), 77);
        h.t.peer.inject(h.request(0, h.va(8), h.keys.rkey), u64_bytes(0x0123456789abcdefull));
        REQUIRE(h.t.p.wait_until([&] { return h.acks_for(0) == 2; }));
        CHECK(u64(h.target(8)) == 77);
        CHECK(h.t.p.a.qp->state() == QpState::Rts);
    }
    SECTION("a READ naming its PSN is not answered from its resource") {
        h.t.a_out.clear();
        // Its very PSN, key, address and length.
        wire::Headers read = h.t.peer.headers(wire::Opcode::RcReadRequest, 0);
        read.bth.ack_req = true;
        read.reth = {h.va(8), h.keys.rkey, 8};
        h.t.peer.inject(read);
        REQUIRE(
            h.t.p.wait_until([&] { return h.t.p.a.counters().rx_duplicate_dropped.load() >= 1; }));
        CHECK(read_responses(h.t.a_out) == 0);
    }
    SECTION("a Fetch & Add naming its PSN is not answered from its resource") {
        h.t.a_out.clear();
        wire::Headers fa = h.t.peer.headers(wire::Opcode::RcFetchAdd, 0);
        fa.bth.ack_req = true;
        fa.atomic = {h.va(8), h.keys.rkey, 0x0123456789abcdefull, 0};
        h.t.peer.inject(fa);
        REQUIRE(
            h.t.p.wait_until([&] { return h.t.p.a.counters().rx_duplicate_dropped.load() >= 1; }));
        CHECK(h.t.a_out.count_opcode(wire::Opcode::RcAtomicAcknowledge) == 0);
    }
}

TEST_CASE("ATOMIC WRITE: the responder refuses bad requests before touching memory",
          "[atomic_write]") {
    SECTION("misaligned target: invalid request") {
        AtomicWriteHostile h;
        put_u64(h.target(0), 3);
        put_u64(h.target(8), 5);
        h.t.peer.inject(h.request(0, h.va(4), h.keys.rkey), u64_bytes(9));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::InvalidRequest, 0, AsyncEventType::QpRequestError);
        CHECK(u64(h.target(0)) == 3);
        CHECK(u64(h.target(8)) == 5);
    }
    SECTION("a RETH length other than 8: invalid request") {
        AtomicWriteHostile h;
        put_u64(h.target(0), 3);
        h.t.peer.inject(h.request(0, h.va(0), h.keys.rkey, 16), u64_bytes(9));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::InvalidRequest, 0, AsyncEventType::QpRequestError);
        CHECK(u64(h.target(0)) == 3);
    }
    SECTION("a payload other than 8 bytes: invalid request") {
        AtomicWriteHostile h;
        put_u64(h.target(0), 3);
        put_u64(h.target(8), 4);
        h.t.peer.inject(h.request(0, h.va(0), h.keys.rkey), bytes(16, 7));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::InvalidRequest, 0, AsyncEventType::QpRequestError);
        CHECK(u64(h.target(0)) == 3);
        CHECK(u64(h.target(8)) == 4);
    }
    SECTION("the QP grants no remote write: remote access error") {
        QpAttributes attrs = default_attributes();
        attrs.access = kRemoteRead | kRemoteAtomic;
        Hostile t(attrs);
        const MemoryKeys keys = t.p.a.engine->memory().add(
            kPd, t.p.a.addr(kTarget), 64, t.p.a.iova + kTarget, kLocalWrite | kRemoteWrite);
        put_u64(t.p.a.at(kTarget), 5);
        wire::Headers req = t.peer.headers(wire::Opcode::RcAtomicWrite, 0);
        req.bth.ack_req = true;
        req.reth = {t.p.a.iova + kTarget, keys.rkey, 8};
        t.peer.inject(req, u64_bytes(9));
        REQUIRE(t.p.wait_until([&] { return t.p.a.qp->state() == QpState::Err; }));
        t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
        CHECK(u64(t.p.a.at(kTarget)) == 5);
    }
    SECTION("the region grants no remote write: remote access error") {
        AtomicWriteHostile h;
        const MemoryKeys ro = h.t.p.a.engine->memory().add(
            kPd, h.t.p.a.addr(kTarget + 4096), 64, h.t.p.a.iova + kTarget + 4096,
            kLocalWrite | kRemoteRead | kRemoteAtomic);
        put_u64(h.t.p.a.at(kTarget + 4096), 4);
        h.t.peer.inject(h.request(0, h.t.p.a.iova + kTarget + 4096, ro.rkey), u64_bytes(9));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
        CHECK(u64(h.t.p.a.at(kTarget + 4096)) == 4);
    }
    SECTION("past the end of the region, or a wrong key: remote access error") {
        const bool past_end = GENERATE(true, false);
        AtomicWriteHostile h;
        const std::vector<uint8_t> before(h.target(0), h.target(4096));
        h.t.peer.inject(
            h.request(0, past_end ? h.va(64) : h.va(0), past_end ? h.keys.rkey : h.keys.rkey + 1),
            u64_bytes(9));
        REQUIRE(h.t.p.wait_until([&] { return h.t.p.a.qp->state() == QpState::Err; }));
        h.t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
        CHECK(std::vector<uint8_t>(h.target(0), h.target(4096)) == before);
    }
}

TEST_CASE("ATOMIC WRITE: lost ACKs are recovered; WRITEs and ATOMIC WRITEs land in order",
          "[atomic_write]") {
    Pair p;
    p.connect(default_attributes(), default_attributes());
    // b loses every third ACK it sends.
    std::atomic<int> n{0};
    TxRecorder b_out(*p.b.engine, [&n](const wire::ParsedPacket& pkt) {
        if (pkt.h.bth.opcode != static_cast<uint8_t>(wire::Opcode::RcAcknowledge)) return false;
        return n.fetch_add(1) % 3 == 0;
    });
    constexpr int kOps = 20;
    for (int i = 0; i < kOps; ++i) {
        // A block of data, then a flag naming it, as a producer publishes.
        put_u64(p.a.at(4096 + 8 * i), 1000u + i);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2 * i, {p.a.sge(0, 256)},
                                           p.b.iova + 8192 + 256 * i, p.b.keys.rkey)) == 0);
        SendWqe w = rdma_wqe(SendOpcode::AtomicWrite, 2 * i + 1, {p.a.sge(4096 + 8 * i, 8)},
                             p.b.iova + 64, p.b.keys.rkey);
        REQUIRE(p.a.qp->post_send(w) == 0);
    }
    const auto done = p.wait(*p.a.scq, 2 * kOps);
    REQUIRE(done.size() == 2 * kOps);
    for (int i = 0; i < 2 * kOps; ++i) {
        CHECK(done[i].status == WcStatus::Success);
        CHECK(done[i].wr_id == static_cast<uint64_t>(i));
    }
    CHECK(done[1].opcode == WcOpcode::AtomicWrite);
    CHECK(done[1].byte_len == 8);
    CHECK(u64(p.b.at(64)) == 1000u + kOps - 1);
    for (int i = 0; i < kOps; ++i) CHECK(std::memcmp(p.b.at(8192 + 256 * i), p.a.at(0), 256) == 0);
    CHECK(b_out.lost() > 0);
}
