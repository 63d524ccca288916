// UD posts that wait (ud_qp.h): for the next poll of a busy poller, or for the rest of their
// post list. What waits leaves at the poll (or the end of the list, or a train's worth at
// once) as GSO trains, in post order, and completes then; a queue that meets a local error,
// a move to SQD, ERR or RESET, or the QP's destruction ends as the IBA says.
//
// Holding a's fork gate stops a's engine thread (parked_and_gated, test_held_posts.cpp): only
// this thread's polls then send what a's posts hold.
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/ud_on.h"
#include "transport/device_slots.h"

using namespace uroce::transport;
using namespace uroce::transport::test;

namespace {

constexpr uint32_t kSmall = 64;
constexpr uint32_t kSlot = kGrhBytes + kSmall;  // one receive buffer at b

// Posts `n` receives at `to`, buffer i at offset i * kSlot of `side`'s memory.
void post_receives(UdOn& to, uint32_t n, uint64_t first_id) {
    for (uint32_t i = 0; i < n; ++i)
        REQUIRE(to.qp->post_recv(recv_wqe(first_id + i, {to.side.sge(i * kSlot, kSlot)})) == 0);
}

// How post_sends chains its WRs.
enum class Chain {
    None,     // each a post list of its own
    List,     // one post list: all but the last with `more`
    Unended,  // all with `more`: a list whose last WR the provider refused
};

// Posts `n` 64-byte SENDs from `from` to `to`, message i from offset i * kSmall, filled
// from seed + i.
void post_sends(UdOn& from, const UdDestination& to, uint32_t n, uint64_t seed,
                Chain chain = Chain::None) {
    for (uint32_t i = 0; i < n; ++i) {
        fill(from.side.at(i * kSmall), kSmall, seed + i);
        const bool more = chain == Chain::Unended || (chain == Chain::List && i + 1 < n);
        REQUIRE(from.qp->post_send(ud_send(seed + i, from.side, i * kSmall, kSmall), to, more) ==
                0);
    }
}

// Receive i at `side` holds message seed + i (after its GRH area).
void check_received(Side& side, uint32_t n, uint64_t seed) {
    for (uint32_t i = 0; i < n; ++i) {
        INFO("message " << i);
        CHECK(first_mismatch(side.at(i * kSlot + kGrhBytes), kSmall, seed + i) == kSmall);
    }
}

// The wr_ids of `cs`, in order.
std::vector<uint64_t> ids(const std::vector<Completion>& cs) {
    std::vector<uint64_t> out;
    for (const Completion& c : cs) out.push_back(c.wr_id);
    return out;
}

std::vector<uint64_t> range(uint64_t first, uint32_t n) {
    std::vector<uint64_t> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(first + i);
    return out;
}

// a's sends seed .. seed+n-1 completed in order, b's receives first_recv .. in order, each
// with its message.
void check_delivered(Pair& p, uint32_t n, uint64_t seed, uint64_t first_recv) {
    CHECK(ids(p.wait(*p.a.scq, n)) == range(seed, n));
    CHECK(ids(p.wait(*p.b.rcq, n)) == range(first_recv, n));
    check_received(p.b, n, seed);
}

}  // namespace

TEST_CASE("UD: posts of a busy poller wait for its next poll and leave as one train",
          "[ud][held_posts]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    post_receives(b, 32, 1000);
    parked_and_gated(*p.a.engine, [&] {
        const uint64_t held = p.a.counters().tx_held_posts.load();
        const uint64_t sent = p.a.counters().tx_packets.load();
        const uint64_t trains = p.a.counters().tx_gso_sends.load();
        post_sends(a, a.to(b), 32, 100);
        CHECK(p.a.counters().tx_held_posts.load() - held == 32);
        CHECK(p.a.counters().tx_packets.load() == sent);  // nothing left yet
        CHECK(p.a.scq->depth() == 0);                     // nor completed

        p.a.engine->on_cq_poll(false);
        CHECK(p.a.counters().tx_packets.load() - sent == 32);
        CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
        const QpCounters& qc = p.a.engine->qp_counters(a.qp->qpn());
        CHECK(qc.tx_packets.load() == 32);
        CHECK(qc.tx_payload_bytes.load() == 32 * kSmall);
        p.a.engine->on_cq_poll(false);  // nothing more: sent once
        CHECK(p.a.counters().tx_packets.load() - sent == 32);
    });
    const auto sends = p.wait(*p.a.scq, 32);
    CHECK(ids(sends) == range(100, 32));
    for (const Completion& c : sends) CHECK(c.status == WcStatus::Success);
    const auto recvs = p.wait(*p.b.rcq, 32);
    REQUIRE(recvs.size() == 32);
    CHECK(ids(recvs) == range(1000, 32));
    for (const Completion& c : recvs) {
        CHECK(c.status == WcStatus::Success);
        CHECK(c.byte_len == kSlot);
        CHECK(c.src_qp == a.qp->qpn());
    }
    check_received(p.b, 32, 100);
}

TEST_CASE("UD: a train's worth of posts, or the whole send queue, does not wait",
          "[ud][held_posts]") {
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    Pair p(o);
    UdOn a(p.a), b(p.b);  // a send queue of 64 (UdOn's caps)
    post_receives(b, 64, 2000);
    parked_and_gated(*p.a.engine, [&] {
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_sends(a, a.to(b), 63, 200);
        CHECK(p.a.counters().tx_packets.load() == sent);
        fill(p.a.at(63 * kSmall), kSmall, 263);
        REQUIRE(a.qp->post_send(ud_send(263, p.a, 63 * kSmall, kSmall), a.to(b)) == 0);
        CHECK(p.a.counters().tx_packets.load() - sent == 64);
    });
    check_delivered(p, 64, 200, 2000);
}

// Sends 16 small datagrams from a fresh UD QP of `p.a`, alternately to two QPs b and c of
// `p.b`, while the engine is parked, and checks each QP took its own, in order. Returns how
// many GSO trains carried them. `same_slot`: whether b's and c's QPNs are in one device slot.
uint64_t alternate_to_two_qps(Pair& p, bool same_slot) {
    UdOn a(p.a), b(p.b);
    // Without a slot table QPNs are drawn from the whole space: c is drawn again in the
    // rare case it falls into b's slot.
    std::vector<std::unique_ptr<UdOn>> drawn;
    auto same = [&] {
        return DeviceSlots::slot_of(b.qp->qpn()) == DeviceSlots::slot_of(drawn.back()->qp->qpn());
    };
    do drawn.push_back(std::make_unique<UdOn>(p.b));
    while (!same_slot && same() && drawn.size() < 8);
    UdOn& c = *drawn.back();
    REQUIRE(same() == same_slot);
    post_receives(b, 8, 3000);
    // c's buffers after b's.
    for (uint32_t i = 0; i < 8; ++i)
        REQUIRE(c.qp->post_recv(recv_wqe(4000 + i, {p.b.sge((8 + i) * kSlot, kSlot)})) == 0);
    uint64_t trains = 0;
    parked_and_gated(*p.a.engine, [&] {
        const uint64_t before = p.a.counters().tx_gso_sends.load();
        const uint64_t sent = p.a.counters().tx_packets.load();
        for (uint32_t i = 0; i < 16; ++i) {
            fill(p.a.at(i * kSmall), kSmall, 300 + i);
            REQUIRE(a.qp->post_send(ud_send(300 + i, p.a, i * kSmall, kSmall),
                                    i % 2 ? a.to(c) : a.to(b)) == 0);
        }
        p.a.engine->on_cq_poll(false);
        CHECK(p.a.counters().tx_packets.load() - sent == 16);
        trains = p.a.counters().tx_gso_sends.load() - before;
    });
    CHECK(ids(p.wait(*p.a.scq, 16)) == range(300, 16));
    const auto at_b = p.wait(*p.b.rcq, 16);
    REQUIRE(at_b.size() == 16);
    // b's and c's receives share b's CQ; each QP took its own messages, in order.
    uint32_t nb = 0, nc = 0;
    for (const Completion& r : at_b) {
        CHECK(r.status == WcStatus::Success);
        if (r.qp_num == b.qp->qpn()) {
            CHECK(r.wr_id == 3000 + nb);
            CHECK(first_mismatch(p.b.at(nb * kSlot + kGrhBytes), kSmall, 300 + 2 * nb) == kSmall);
            ++nb;
        } else {
            CHECK(r.qp_num == c.qp->qpn());
            CHECK(r.wr_id == 4000 + nc);
            CHECK(first_mismatch(p.b.at((8 + nc) * kSlot + kGrhBytes), kSmall, 301 + 2 * nc) ==
                  kSmall);
            ++nc;
        }
    }
    CHECK(nb == 8);
    CHECK(nc == 8);
    return trains;
}

TEST_CASE("UD: posts to QPs of one context share a train; to two contexts' QPs, they do not",
          "[ud][held_posts]") {
    SECTION("b and c in one device slot (one context): one train") {
        PairOptions o;
        o.host_peers = true;  // a slot table: every QPN of b's engine in its one slot
        Pair p(o);
        CHECK(alternate_to_two_qps(p, true) == 1);
    }
    SECTION("b and c in different slots: a train each time the slot changes") {
        // Without a slot table an engine draws QPNs from the whole space: b's and c's slots
        // differ, as two contexts' QPs on one device do. A receiving host steers a train
        // by its first packet (qpn_steering.h): every datagram goes alone here.
        Pair p;
        CHECK(alternate_to_two_qps(p, false) == 0);
    }
}

TEST_CASE("UD: a post list leaves together; a refused list sends what came before",
          "[ud][held_posts]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    post_receives(b, 20, 5000);
    REQUIRE_FALSE(p.a.engine->socket_parked());
    {
        const auto gate = p.a.engine->fork_gate().pass();
        const uint64_t sent = p.a.counters().tx_packets.load();
        const uint64_t trains = p.a.counters().tx_gso_sends.load();
        post_sends(a, a.to(b), 16, 500, Chain::List);
        CHECK(p.a.counters().tx_packets.load() - sent == 16);
        CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
        CHECK(p.a.counters().tx_held_posts.load() == 0);

        // The provider refused the list's next WR: ring() sends those before it.
        const uint64_t before_ring = p.a.counters().tx_packets.load();
        for (uint32_t i = 0; i < 4; ++i) {
            const uint32_t off = (16 + i) * kSmall;
            fill(p.a.at(off), kSmall, 516 + i);
            REQUIRE(a.qp->post_send(ud_send(516 + i, p.a, off, kSmall), a.to(b), true) == 0);
        }
        CHECK(p.a.counters().tx_packets.load() == before_ring);
        a.qp->ring();
        CHECK(p.a.counters().tx_packets.load() - before_ring == 4);
    }
    check_delivered(p, 20, 500, 5000);
}

TEST_CASE("UD: a bad key in a queue fails its post; those before it leave, those after flush",
          "[ud][held_posts]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    post_receives(b, 8, 6000);
    parked_and_gated(*p.a.engine, [&] {
        post_sends(a, a.to(b), 3, 600);
        SendWqe bad = ud_send(603, p.a, 3 * kSmall, kSmall);
        bad.sgl.sge[0].lkey ^= 0x100;
        REQUIRE(a.qp->post_send(bad, a.to(b)) == 0);
        for (uint32_t i = 4; i < 6; ++i)
            REQUIRE(a.qp->post_send(ud_send(600 + i, p.a, i * kSmall, kSmall), a.to(b)) == 0);
        CHECK(a.qp->state() == QpState::Rts);
        p.a.engine->on_cq_poll(false);
        CHECK(a.qp->state() == QpState::Err);
    });
    const auto sends = p.wait(*p.a.scq, 6);
    REQUIRE(sends.size() == 6);
    CHECK(ids(sends) == range(600, 6));
    for (int i = 0; i < 3; ++i) CHECK(sends[i].status == WcStatus::Success);
    CHECK(sends[3].status == WcStatus::LocProtErr);
    CHECK(sends[4].status == WcStatus::WrFlushErr);
    CHECK(sends[5].status == WcStatus::WrFlushErr);
    CHECK(ids(p.wait(*p.b.rcq, 3)) == range(6000, 3));
    check_received(p.b, 3, 600);
    CHECK(p.stays_empty(*p.b.rcq));  // nothing after the bad one left
}

TEST_CASE("UD: queued posts leave before SQD, flush in ERR, vanish in RESET and on destroy",
          "[ud][held_posts]") {
    Pair p;
    UdOn b(p.b);
    post_receives(b, 4, 7000);
    const UdAttributes attrs{kQkey, 0, kMtu, true};
    SECTION("SQD: sent and completed first, then drained") {
        UdOn a(p.a);
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_sends(a, a.to(b), 4, 700, Chain::Unended);
        CHECK(p.a.counters().tx_packets.load() == sent);
        REQUIRE(a.qp->modify(attrs, QpState::Rts, QpState::Sqd) == 0);
        CHECK(p.a.counters().tx_packets.load() - sent == 4);
        const auto sends = p.wait(*p.a.scq, 4);
        CHECK(ids(sends) == range(700, 4));
        for (const Completion& c : sends) CHECK(c.status == WcStatus::Success);
        REQUIRE(p.wait_until([&] { return has_event(p.a, AsyncEventType::SqDrained); }));
        CHECK(ids(p.wait(*p.b.rcq, 4)) == range(7000, 4));
        check_received(p.b, 4, 700);
    }
    SECTION("ERR: flushed in order, none sent") {
        UdOn a(p.a);
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_sends(a, a.to(b), 4, 710, Chain::Unended);
        REQUIRE(a.qp->modify(attrs, QpState::Rts, QpState::Err) == 0);
        const auto sends = p.wait(*p.a.scq, 4);
        CHECK(ids(sends) == range(710, 4));
        for (const Completion& c : sends) CHECK(c.status == WcStatus::WrFlushErr);
        CHECK(p.a.counters().tx_packets.load() == sent);
        CHECK(p.stays_empty(*p.b.rcq));
    }
    SECTION("RESET: discarded without completions, and not sent after it either") {
        UdOn a(p.a);
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_sends(a, a.to(b), 4, 720, Chain::Unended);
        REQUIRE(a.qp->modify(attrs, QpState::Rts, QpState::Reset) == 0);
        a.qp->ring();
        CHECK(p.stays_empty(*p.a.scq));
        CHECK(p.a.counters().tx_packets.load() == sent);
        CHECK(p.stays_empty(*p.b.rcq));
        // Back in RTS, only what is posted now leaves.
        REQUIRE(a.qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
        REQUIRE(a.qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
        REQUIRE(a.qp->modify(attrs, QpState::Rtr, QpState::Rts) == 0);
        fill(p.a.at(4 * kSmall), kSmall, 729);
        REQUIRE(a.qp->post_send(ud_send(729, p.a, 4 * kSmall, kSmall), a.to(b)) == 0);
        CHECK(ids(p.wait(*p.a.scq, 1)) == range(729, 1));
        CHECK(ids(p.wait(*p.b.rcq, 1)) == range(7000, 1));
        CHECK(first_mismatch(p.b.at(kGrhBytes), kSmall, 729) == kSmall);
        CHECK(p.stays_empty(*p.b.rcq));
        CHECK(p.a.counters().tx_packets.load() - sent == 1);
    }
    SECTION("destroyed while held for a poll: nothing sent, nothing completed") {
        auto a = std::make_unique<UdOn>(p.a);
        const uint64_t sent = p.a.counters().tx_packets.load();
        parked_and_gated(*p.a.engine, [&] {
            post_sends(*a, a->to(b), 4, 730);
            CHECK(p.a.counters().tx_held_posts.load() >= 4);
            const std::shared_ptr<UdQp> qp = a->qp;
            a.reset();  // detaches (closes) the QP with its posts noted for the poll
            p.a.engine->on_cq_poll(false);
            // A poll that found the QP just before it was destroyed sends nothing either.
            qp->send_held();
        });
        CHECK(p.stays_empty(*p.a.scq));
        CHECK(p.a.counters().tx_packets.load() == sent);
        CHECK(p.stays_empty(*p.b.rcq));
    }
}

TEST_CASE("UD: a datagram above 1 KiB waits for nothing and leaves alone, in order",
          "[ud][held_posts]") {
    // No flow control (QpCommon::kUnreliableBatchedBytes): a train of large datagrams would
    // outrun the receiving engine.
    Pair p;
    UdOn a(p.a), b(p.b);
    const UdAttributes large{kQkey, 0, 4096, false};
    REQUIRE(a.qp->modify(large, QpState::Rts, QpState::Rts) == 0);
    REQUIRE(b.qp->modify(large, QpState::Rts, QpState::Rts) == 0);
    constexpr uint32_t kLarge = 2048;
    post_receives(b, 3, 8000);
    REQUIRE(b.qp->post_recv(recv_wqe(8003, {p.b.sge(16384, kGrhBytes + kLarge)})) == 0);
    fill(p.a.at(8192), kLarge, 803);
    const auto gate = p.a.engine->fork_gate().pass();  // a's engine thread sends nothing
    const uint64_t sent = p.a.counters().tx_packets.load();
    const uint64_t trains = p.a.counters().tx_gso_sends.load();
    const uint64_t calls = p.a.counters().tx_multi_sends.load();
    post_sends(a, a.to(b), 3, 800, Chain::Unended);  // small: they wait
    CHECK(p.a.counters().tx_packets.load() == sent);
    REQUIRE(a.qp->post_send(ud_send(803, p.a, 8192, kLarge), a.to(b), true) == 0);
    CHECK(p.a.counters().tx_packets.load() - sent == 4);
    // The three small ones as a train, then the large one in a system call of its own.
    CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
    CHECK(p.a.counters().tx_multi_sends.load() == calls);
    CHECK(ids(p.wait(*p.a.scq, 4)) == range(800, 4));
    CHECK(ids(p.wait(*p.b.rcq, 4)) == range(8000, 4));
    check_received(p.b, 3, 800);
    CHECK(first_mismatch(p.b.at(16384 + kGrhBytes), kLarge, 803) == kLarge);
}
