// UC posts that wait (uc_qp.h): a message's packets leave as GSO trains, a busy poller's
// posts wait for its next poll and a post list for its end, then leave together in order;
// queued posts end as the IBA says in ERR and RESET, and a bad key fails its own post only.
#include <catch2/catch.hpp>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/uc_pair.h"

using namespace uroce::transport;
using namespace uroce::transport::test;

namespace {

constexpr uint32_t kSmall = 64;

// Posts `n` 64-byte WRITEs from a to b's offset 8192 + i * kSmall, filled from seed + i;
// each with `more` if `more`.
void post_writes(Pair& p, UcPair& uc, uint32_t n, uint64_t seed, bool more = false) {
    for (uint32_t i = 0; i < n; ++i) {
        fill(p.a.at(i * kSmall), kSmall, seed + i);
        REQUIRE(
            uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, seed + i, {p.a.sge(i * kSmall, kSmall)},
                                     p.b.iova + 8192 + i * kSmall, p.b.keys.rkey),
                            more) == 0);
    }
}

bool writes_arrived(Pair& p, uint32_t n, uint64_t seed) {
    return p.wait_until([&] {
        for (uint32_t i = 0; i < n; ++i)
            if (!landed(p.b.at(8192 + i * kSmall), kSmall, seed + i)) return false;
        return true;
    });
}

std::vector<WcStatus> statuses(const std::vector<Completion>& cs, uint64_t first_id) {
    std::vector<WcStatus> out;
    for (size_t i = 0; i < cs.size(); ++i) {
        CHECK(cs[i].wr_id == first_id + i);
        out.push_back(cs[i].status);
    }
    return out;
}

}  // namespace

TEST_CASE("UC: a message above 1 KiB waits for nothing and leaves packet by packet, in order",
          "[uc][held_posts]") {
    // No flow control (QpCommon::kUnreliableBatchedBytes): a train of large packets would
    // outrun the receiving engine.
    Pair p;
    UcPair uc(p);
    constexpr uint32_t kLen = 4 * kMtu;
    fill(p.a.at(16384), kLen, 40);
    const auto gate = p.a.engine->fork_gate().pass();  // a's engine thread sends nothing
    const uint64_t sent = p.a.counters().tx_packets.load();
    const uint64_t trains = p.a.counters().tx_gso_sends.load();
    const uint64_t calls = p.a.counters().tx_multi_sends.load();
    post_writes(p, uc, 3, 400, true);  // small: they wait for the rest of the list
    CHECK(p.a.counters().tx_packets.load() == sent);
    REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 403, {p.a.sge(16384, kLen)},
                                     p.b.iova + 32768, p.b.keys.rkey),
                            true) == 0);
    // The three small ones as one train first, then the large one's four packets alone.
    CHECK(p.a.counters().tx_packets.load() - sent == 3 + 4);
    CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
    CHECK(p.a.counters().tx_multi_sends.load() == calls);
    CHECK(statuses(p.wait(*p.a.scq, 4), 400) == std::vector(4, WcStatus::Success));
    CHECK(writes_arrived(p, 3, 400));
    CHECK(p.wait_until([&] { return landed(p.b.at(32768), kLen, 40); }));
}

TEST_CASE("UC: posts of a busy poller wait for its next poll and leave as one train",
          "[uc][held_posts]") {
    Pair p;
    UcPair uc(p);
    parked_and_gated(*p.a.engine, [&] {
        const uint64_t held = p.a.counters().tx_held_posts.load();
        const uint64_t sent = p.a.counters().tx_packets.load();
        const uint64_t trains = p.a.counters().tx_gso_sends.load();
        post_writes(p, uc, 16, 100);
        CHECK(p.a.counters().tx_held_posts.load() - held == 16);
        CHECK(p.a.counters().tx_packets.load() == sent);
        CHECK(p.a.scq->depth() == 0);
        p.a.engine->on_cq_poll(false);
        CHECK(p.a.counters().tx_packets.load() - sent == 16);
        CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
    });
    const auto done = p.wait(*p.a.scq, 16);
    CHECK(statuses(done, 100) == std::vector(16, WcStatus::Success));
    CHECK(writes_arrived(p, 16, 100));
}

TEST_CASE("UC: a post list leaves together; a refused list sends what came before",
          "[uc][held_posts]") {
    Pair p;
    UcPair uc(p);
    REQUIRE_FALSE(p.a.engine->socket_parked());
    const auto gate = p.a.engine->fork_gate().pass();
    const uint64_t sent = p.a.counters().tx_packets.load();
    post_writes(p, uc, 8, 200, true);
    CHECK(p.a.counters().tx_packets.load() == sent);
    uc.a->ring();
    CHECK(p.a.counters().tx_packets.load() - sent == 8);
    CHECK(statuses(p.wait(*p.a.scq, 8), 200) == std::vector(8, WcStatus::Success));
    CHECK(writes_arrived(p, 8, 200));
}

TEST_CASE("UC: a queue ends as the IBA says: a bad key, ERR, RESET", "[uc][held_posts]") {
    Pair p;
    UcPair uc(p);
    SECTION("a bad key fails its post; those before it leave, those after flush") {
        post_writes(p, uc, 3, 300, true);
        SendWqe bad = rdma_wqe(SendOpcode::RdmaWrite, 303, {p.a.sge(3 * kSmall, kSmall)},
                               p.b.iova + 8192 + 3 * kSmall, p.b.keys.rkey);
        bad.sgl.sge[0].lkey ^= 0x100;
        REQUIRE(uc.a->post_send(bad, true) == 0);
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 304, {p.a.sge(0, kSmall)},
                                         p.b.iova + 8192 + 4 * kSmall, p.b.keys.rkey)) == 0);
        CHECK(statuses(p.wait(*p.a.scq, 5), 300) ==
              std::vector{WcStatus::Success, WcStatus::Success, WcStatus::Success,
                          WcStatus::LocProtErr, WcStatus::WrFlushErr});
        CHECK(uc.a->state() == QpState::Err);
        CHECK(writes_arrived(p, 3, 300));
        CHECK(all_bytes(p.b.at(8192 + 3 * kSmall), 2 * kSmall, kUntouched));
    }
    SECTION("ERR flushes them in order, none sent") {
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_writes(p, uc, 4, 310, true);
        QpAttributes at = default_attributes();
        REQUIRE(uc.a->modify(at, QpState::Rts, QpState::Err) == 0);
        CHECK(statuses(p.wait(*p.a.scq, 4), 310) == std::vector(4, WcStatus::WrFlushErr));
        CHECK(p.a.counters().tx_packets.load() == sent);
    }
    SECTION("RESET discards them: no completion, and not sent after it either") {
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_writes(p, uc, 4, 320, true);
        QpAttributes at = default_attributes();
        at.dst_ip = p.b.ip;
        at.dest_qpn = uc.b->qpn();
        REQUIRE(uc.a->modify(at, QpState::Rts, QpState::Reset) == 0);
        REQUIRE(uc.a->modify(at, QpState::Reset, QpState::Init) == 0);
        REQUIRE(uc.a->modify(at, QpState::Init, QpState::Rtr) == 0);
        REQUIRE(uc.a->modify(at, QpState::Rtr, QpState::Rts) == 0);
        CHECK(p.stays_empty(*p.a.scq));
        CHECK(p.a.counters().tx_packets.load() == sent);
        // Only what is posted now leaves.
        fill(p.a.at(16384), kSmall, 329);
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 329, {p.a.sge(16384, kSmall)},
                                         p.b.iova + 16384, p.b.keys.rkey)) == 0);
        CHECK(statuses(p.wait(*p.a.scq, 1), 329) == std::vector{WcStatus::Success});
        CHECK(p.a.counters().tx_packets.load() - sent == 1);
        CHECK(p.wait_until([&] { return landed(p.b.at(16384), kSmall, 329); }));
        CHECK(all_bytes(p.b.at(8192), 4 * kSmall, kUntouched));
    }
}
