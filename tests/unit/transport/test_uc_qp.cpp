// UC queue pairs between two engines: messages without acknowledgements, and what a lost
// packet, a missing receive WQE or a bad key does to a message (drops it, never corrupts one).
#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/uc_pair.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

bool is_uc(uint8_t opcode) {
    return (opcode >> 5) == static_cast<uint8_t>(wire::Transport::Uc);
}

}  // namespace

TEST_CASE("UC: SEND and WRITE with immediate arrive intact, with no acknowledgement", "[uc]") {
    Pair p;
    UcPair uc(p);
    TxRecorder a_out(*p.a.engine), b_out(*p.b.engine);
    REQUIRE(uc.b->post_recv(recv_wqe(1, {p.b.sge(0, 4 * kMtu)})) == 0);
    REQUIRE(uc.b->post_recv(recv_wqe(2, {p.b.sge(8192, 64)})) == 0);
    fill(p.a.at(0), 3 * kMtu + 5, 1);
    fill(p.a.at(16384), 2 * kMtu, 2);
    REQUIRE(uc.a->post_send(send_wqe(10, {p.a.sge(0, 3 * kMtu + 5)})) == 0);
    SendWqe w = rdma_wqe(SendOpcode::RdmaWriteWithImm, 11, {p.a.sge(16384, 2 * kMtu)},
                         p.b.iova + 20000, p.b.keys.rkey);
    w.imm = 77;
    REQUIRE(uc.a->post_send(w) == 0);
    // Both complete at the sender once sent.
    const auto s = p.wait(*p.a.scq, 2);
    REQUIRE(s.size() == 2);
    CHECK(s[0].status == WcStatus::Success);
    CHECK(s[1].status == WcStatus::Success);
    CHECK(s[1].opcode == WcOpcode::RdmaWrite);
    const auto r = p.wait(*p.b.rcq, 2);
    REQUIRE(r.size() == 2);
    CHECK(r[0].wr_id == 1);
    CHECK(r[0].byte_len == 3 * kMtu + 5);
    CHECK(first_mismatch(p.b.at(0), 3 * kMtu + 5, 1) == 3 * kMtu + 5);
    CHECK(r[1].wr_id == 2);
    CHECK(r[1].opcode == WcOpcode::RecvRdmaWithImm);
    CHECK(r[1].imm == 77);
    CHECK(r[1].byte_len == 2 * kMtu);
    CHECK(first_mismatch(p.b.at(20000), 2 * kMtu, 2) == 2 * kMtu);
    // Six request packets, all UC; the responder sent nothing at all.
    const auto sent = a_out.packets();
    CHECK(sent.size() == 6);
    for (const SentPacket& sp : sent) CHECK(is_uc(sp.opcode()));
    CHECK(b_out.packets().empty());
}

TEST_CASE("UC: a lost packet drops its message; the receive WQE serves the next one", "[uc]") {
    Pair p;
    UcPair uc(p);
    // a loses the second packet it sends: the middle of the first message.
    int n = 0;
    TxRecorder a_out(*p.a.engine, [&n](const wire::ParsedPacket&) { return ++n == 2; });
    REQUIRE(uc.b->post_recv(recv_wqe(1, {p.b.sge(0, 4 * kMtu)})) == 0);
    fill(p.a.at(0), 3 * kMtu, 1);
    fill(p.a.at(16384), 2 * kMtu, 2);
    REQUIRE(uc.a->post_send(send_wqe(10, {p.a.sge(0, 3 * kMtu)})) == 0);
    REQUIRE(uc.a->post_send(send_wqe(11, {p.a.sge(16384, 2 * kMtu)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 1);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.byte_len == 2 * kMtu);  // the second message, whole
    CHECK(first_mismatch(p.b.at(0), 2 * kMtu, 2) == 2 * kMtu);
    CHECK(p.stays_empty(*p.b.rcq));
    CHECK(p.b.counters().rx_uc_dropped.load() >= 1);
    CHECK(a_out.lost() == 1);
}

TEST_CASE("UC: a lost packet stops a WRITE; its immediate is never reported", "[uc]") {
    Pair p;
    UcPair uc(p);
    int n = 0;
    TxRecorder a_out(*p.a.engine, [&n](const wire::ParsedPacket&) { return ++n == 2; });
    REQUIRE(uc.b->post_recv(recv_wqe(1, {p.b.sge(0, 64)})) == 0);
    fill(p.a.at(0), 3 * kMtu, 1);
    SendWqe w = rdma_wqe(SendOpcode::RdmaWriteWithImm, 10, {p.a.sge(0, 3 * kMtu)}, p.b.iova + 8192,
                         p.b.keys.rkey);
    REQUIRE(uc.a->post_send(w) == 0);
    SendWqe w2 = rdma_wqe(SendOpcode::RdmaWriteWithImm, 11, {p.a.sge(0, 100)}, p.b.iova + 32768,
                          p.b.keys.rkey);
    w2.imm = 5;
    REQUIRE(uc.a->post_send(w2) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.imm == 5);  // the second WRITE's
    CHECK(first_mismatch(p.b.at(32768), 100, 1) == 100);
    // Of the first WRITE only its first packet landed; the rest never did.
    CHECK(first_mismatch(p.b.at(8192), kMtu, 1) == kMtu);
    CHECK(all_bytes(p.b.at(8192 + 2 * kMtu), kMtu, kUntouched));
    CHECK(p.stays_empty(*p.b.rcq));
}

TEST_CASE("UC: messages the responder cannot take are dropped, the QP goes on", "[uc]") {
    Pair p;
    UcPair uc(p);
    fill(p.a.at(0), 256, 3);
    SECTION("no receive WQE") {
        REQUIRE(uc.a->post_send(send_wqe(10, {p.a.sge(0, 100)})) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_no_recv_wqe.load() == 1; }));
    }
    SECTION("a WRITE with a bad rkey") {
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 10, {p.a.sge(0, 100)}, p.b.iova,
                                         p.b.keys.rkey ^ 0x100)) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_uc_dropped.load() == 1; }));
        CHECK(all_bytes(p.b.at(0), 256, kUntouched));
    }
    SECTION("a WRITE past the end of the region") {
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 10, {p.a.sge(0, 100)},
                                         p.b.iova + p.b.mem.size() - 50, p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_uc_dropped.load() == 1; }));
        CHECK(all_bytes(p.b.at(p.b.mem.size() - 50), 50, kUntouched));
    }
    SECTION("a WRITE whose first packet fits but whose whole runs past the region") {
        // Refused on its first packet: not even the part that would fit is written.
        fill(p.a.at(4096), 2 * kMtu, 4);
        const size_t at = p.b.mem.size() - kMtu - 8;
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 10, {p.a.sge(4096, 2 * kMtu)},
                                         p.b.iova + at, p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_uc_dropped.load() >= 1; }));
        CHECK(all_bytes(p.b.at(at), kMtu + 8, kUntouched));
    }
    SECTION("a SEND longer than the buffer: a length error for that WQE") {
        REQUIRE(uc.b->post_recv(recv_wqe(1, {p.b.sge(0, 50)})) == 0);
        REQUIRE(uc.a->post_send(send_wqe(10, {p.a.sge(0, 100)})) == 0);
        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.wr_id == 1);
        CHECK(r.status == WcStatus::LocLenErr);
        CHECK(all_bytes(p.b.at(0), 50, kUntouched));
    }
    CHECK(uc.b->state() == QpState::Rts);
    // And the next message goes through.
    REQUIRE(uc.b->post_recv(recv_wqe(2, {p.b.sge(1024, 256)})) == 0);
    REQUIRE(uc.a->post_send(send_wqe(11, {p.a.sge(0, 200)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 2);
    CHECK(r.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(1024), 200, 3) == 200);
}

TEST_CASE("UC: no READs or atomics", "[uc]") {
    Pair p;
    UcPair uc(p);
    CHECK(uc.a->post_send(rdma_wqe(SendOpcode::RdmaRead, 1, {p.a.sge(0, 8)}, p.b.iova,
                                   p.b.keys.rkey)) == EINVAL);
    CHECK(uc.a->post_send(rdma_wqe(SendOpcode::AtomicFetchAdd, 2, {p.a.sge(0, 8)}, p.b.iova,
                                   p.b.keys.rkey)) == EINVAL);
    CHECK(p.stays_empty(*p.a.scq));
}
