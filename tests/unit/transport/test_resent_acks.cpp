// What the responder's ACK names while a requester resends (go-back-N): the newest packet
// resent, never a later one the requester has not resent yet. The kernel's rxe (6.1) stops
// for good when an ACK completes a request it is still resending (docs/performance-log.md,
// "rxe stranded by an ACK ahead of its resend"). The test plays the requester by hand.
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kPackets = 4;  // the request resent: PSNs 0 .. kPackets - 1

struct Resender {
    Hostile t;
    bool writes;

    explicit Resender(bool use_writes) : writes(use_writes) {
        REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(0, kPackets * kMtu)})) == 0);
        for (uint32_t psn = 0; psn < kPackets; ++psn) send(psn, 10 + psn, psn + 1 == kPackets);
        if (writes) {
            REQUIRE(t.p.wait_until(
                [&] { return landed(t.p.a.at((kPackets - 1) * kMtu), kMtu, 10 + kPackets - 1); }));
        } else {
            const Completion c = t.p.wait_one(*t.p.a.rcq);
            REQUIRE(c.status == WcStatus::Success);
            REQUIRE(c.byte_len == kPackets * kMtu);
        }
        REQUIRE(acks().size() == 1);
        REQUIRE(acks()[0].psn == kPackets - 1);
        t.a_out.clear();
    }

    // Packet `psn` of the request (payload of seed `seed`); the ACK it asks for leaves with
    // it unless `last_of_batch` is false (then it stays pending, as mid-batch).
    void send(uint32_t psn, uint64_t seed, bool ack_req, bool last_of_batch = true) {
        using wire::Opcode;
        const Opcode op = psn == 0 ? (writes ? Opcode::RcWriteFirst : Opcode::RcSendFirst)
                          : psn + 1 == kPackets
                              ? (writes ? Opcode::RcWriteLast : Opcode::RcSendLast)
                              : (writes ? Opcode::RcWriteMiddle : Opcode::RcSendMiddle);
        wire::Headers h = t.peer.headers(op, psn);
        if (writes && psn == 0) h.reth = {t.p.a.iova, t.p.a.keys.rkey, kPackets * kMtu};
        h.bth.ack_req = ack_req;
        const auto pkt = t.peer.forge(h, bytes(kMtu, seed));
        t.p.a.engine->receive_datagram(pkt, t.peer.ip, t.peer.port, last_of_batch);
    }
    // A one-packet SEND with PSN `psn`, asking for an ACK.
    void send_only(uint32_t psn, bool last_of_batch = true) {
        wire::Headers h = t.peer.headers(wire::Opcode::RcSendOnly, psn);
        h.bth.ack_req = true;
        t.p.a.engine->receive_datagram(t.peer.forge(h, bytes(8, 77)), t.peer.ip, t.peer.port,
                                       last_of_batch);
    }
    std::vector<Sent> acks() const {
        std::vector<Sent> out;
        for (const Sent& s : sent(t.a_out))
            if (s.is_plain_ack()) out.push_back(s);
        return out;
    }
    // The request's data is what its first copy carried, and it completed once.
    void check_executed_once() {
        for (uint32_t k = 0; k < kPackets; ++k) {
            CAPTURE(k);
            CHECK(first_mismatch(t.p.a.at(k * kMtu), kMtu, 10 + k) == kMtu);
        }
        if (!writes) CHECK(t.p.stays_empty(*t.p.a.rcq));
        CHECK(t.p.a.qp->state() == QpState::Rts);
    }
};

}  // namespace

TEST_CASE("Responder: a resent packet is acknowledged as far as it, not beyond",
          "[responder][duplicate][resent_acks]") {
    const bool writes = GENERATE(false, true);
    CAPTURE(writes);
    Resender r(writes);

    // The requester went back to PSN 0 and resends one packet at a time.
    for (uint32_t psn = 0; psn < kPackets; ++psn) {
        CAPTURE(psn);
        r.t.a_out.clear();
        r.send(psn, 90 + psn, false);
        const auto acks = r.acks();
        REQUIRE(acks.size() == 1);
        CHECK(acks[0].psn == psn);
        // The MSN still counts the request the responder completed.
        CHECK(acks[0].msn == 1);
    }
    // Its ACK lost again, the requester goes back once more: each resend is a new start.
    r.t.a_out.clear();
    r.send(0, 90, false);
    REQUIRE(r.acks().size() == 1);
    CHECK(r.acks()[0].psn == 0);
    CHECK(r.t.p.a.counters().rx_duplicate.load() == kPackets + 1);
    r.check_executed_once();
}

TEST_CASE(
    "Responder: resent packets read in one batch are acknowledged by one ACK for the "
    "newest of them",
    "[responder][duplicate][resent_acks]") {
    Resender r(false);
    r.send(2, 92, false, false);
    r.send(0, 90, false, false);  // out of order: the newest is still 2
    r.send(1, 91, false, true);
    const auto acks = r.acks();
    REQUIRE(acks.size() == 1);
    CHECK(acks[0].psn == 2);
    r.check_executed_once();
}

TEST_CASE("Responder: a new request after resent ones in one batch is acknowledged itself",
          "[responder][duplicate][resent_acks]") {
    Resender r(false);
    REQUIRE(r.t.p.a.qp->post_recv(recv_wqe(2, {r.t.p.a.sge(60000, 64)})) == 0);
    r.send(kPackets - 1, 93, true, false);
    r.send_only(kPackets);
    auto acks = r.acks();
    REQUIRE(acks.size() == 1);
    CHECK(acks[0].psn == kPackets);
    CHECK(acks[0].msn == 2);
    const Completion c = r.t.p.wait_one(*r.t.p.a.rcq);
    CHECK(c.wr_id == 2);
    CHECK(first_mismatch(r.t.p.a.at(60000), 8, 77) == 8);

    // A later resend of the first request starts over: its ACK names what it resent.
    r.t.a_out.clear();
    r.send(1, 91, false);
    acks = r.acks();
    REQUIRE(acks.size() == 1);
    CHECK(acks[0].psn == 1);
    CHECK(acks[0].msn == 2);
    r.check_executed_once();
}
