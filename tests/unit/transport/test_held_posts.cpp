// Posts held for the next poll (held_posts.h), and WQEs of one ibv_post_send sent together
// (RcQp::post_send's `more`): what is held goes out at the next poll or when the poller
// leaves, never later, and a train's worth never waits.
//
// Holding a's fork gate stops a's engine thread before its next callback (fork_gate.h): no
// hand-back and no read by that thread can then send what a's posts hold, so only this
// thread's polls can, and what each of them sent is known exactly.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "tests/unit/transport/engine_pair.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kSmall = 64;  // one packet each

// Posts `n` one-packet WRITEs from a to b, message i to b's offset 8192 + i * kSmall.
void post_small_writes(Pair& p, uint32_t n, uint64_t seed, bool chain = false) {
    for (uint32_t i = 0; i < n; ++i) {
        fill(p.a.at(i * kSmall), kSmall, seed + i);
        REQUIRE(p.a.qp->post_send(
                    rdma_wqe(SendOpcode::RdmaWrite, seed + i, {p.a.sge(i * kSmall, kSmall)},
                             p.b.iova + 8192 + i * kSmall, p.b.keys.rkey),
                    chain && i + 1 < n) == 0);
    }
}

void check_small_writes(Pair& p, uint32_t n, uint64_t seed) {
    for (uint32_t i = 0; i < n; ++i) {
        INFO("message " << i);
        CHECK(first_mismatch(p.b.at(8192 + i * kSmall), kSmall, seed + i) == kSmall);
    }
}

// Polls a (the requester's engine) until `n` send completions arrived, all successful.
void complete_all(Pair& p, uint32_t n) {
    std::vector<Completion> got;
    Completion c[64];
    REQUIRE(busy_poll(*p.a.engine, [&] {
        const size_t k = p.a.scq->poll(std::span(c, 64));
        got.insert(got.end(), c, c + k);
        return got.size() >= n;
    }));
    for (const Completion& one : got) CHECK(one.status == WcStatus::Success);
}

}  // namespace

TEST_CASE("Posts of a busy poller wait for its next poll and leave as one train", "[held_posts]") {
    Pair p;
    p.connect();
    parked_and_gated(*p.a.engine, [&] {
        REQUIRE(p.a.engine->socket_parked());
        const uint64_t held = p.a.counters().tx_held_posts.load();
        const uint64_t sent = p.a.counters().tx_packets.load();
        const uint64_t trains = p.a.counters().tx_gso_sends.load();
        post_small_writes(p, 32, 500);
        CHECK(p.a.counters().tx_held_posts.load() - held == 32);
        CHECK(p.a.counters().tx_packets.load() == sent);  // nothing left yet

        p.a.engine->on_cq_poll(false);  // a poll (that found completions, so reads nothing)
        CHECK(p.a.counters().tx_packets.load() - sent == 32);
        CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
        p.a.engine->on_cq_poll(false);  // nothing more: sent once
        CHECK(p.a.counters().tx_packets.load() - sent == 32);
    });
    complete_all(p, 32);
    check_small_writes(p, 32, 500);
}

TEST_CASE("A post that fills a train does not wait for the poll", "[held_posts]") {
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    Pair p(o);
    p.connect();
    parked_and_gated(*p.a.engine, [&] {
        const uint64_t held = p.a.counters().tx_held_posts.load();
        const uint64_t sent = p.a.counters().tx_packets.load();
        // 63 small WRITEs wait; the 64th makes a train, and all 64 go at once.
        post_small_writes(p, 64, 600);
        CHECK(p.a.counters().tx_held_posts.load() - held == 63);
        CHECK(p.a.counters().tx_packets.load() - sent == 64);
        // A message of a train's worth of packets goes at once too.
        constexpr uint32_t kBig = TransmitBatch::kMaxPackets * kMtu;
        fill(p.a.at(16384), kBig, 601);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 601, {p.a.sge(16384, kBig)},
                                           p.b.iova + 16384, p.b.keys.rkey)) == 0);
        CHECK(p.a.counters().tx_held_posts.load() - held == 63);
        CHECK(p.a.counters().tx_packets.load() - sent > 64);
    });
    complete_all(p, 65);
    check_small_writes(p, 64, 600);
    CHECK(first_mismatch(p.b.at(16384), TransmitBatch::kMaxPackets * kMtu, 601) ==
          TransmitBatch::kMaxPackets * kMtu);
}

TEST_CASE("What a poller held goes out when it stops polling", "[held_posts]") {
    Pair p;
    p.connect();
    int held_rounds = 0;
    for (uint64_t round = 0; round < 30 && held_rounds < 3; ++round) {
        INFO("round " << round);
        REQUIRE(busy_poll(*p.a.engine, [&] { return p.a.engine->socket_parked(); }));
        const uint64_t held = p.a.counters().tx_held_posts.load();
        post_small_writes(p, 8, 700 + 10 * round);
        // a's thread may lose the CPU for a whole watch period between the parking and the
        // posts (ASan, a loaded machine): then nothing waited, and the round proves nothing
        // of what this test is about (the data must arrive all the same).
        const bool waited = p.a.counters().tx_held_posts.load() > held;
        held_rounds += waited ? 1 : 0;
        // Nobody polls a from now on: its engine thread takes the socket back within a watch
        // period and sends what waited. b's engine thread executes the WRITEs; their data
        // arrives without any poll of a's.
        const auto deadline = std::chrono::steady_clock::now() + kWait;
        bool arrived = false;
        while (!arrived && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(1ms);
            arrived = landed(p.b.at(8192 + 7 * kSmall), kSmall, 700 + 10 * round + 7);
        }
        CHECK(arrived);
        complete_all(p, 8);
        check_small_writes(p, 8, 700 + 10 * round);
    }
    CHECK(held_rounds == 3);
}

TEST_CASE("With hold_posts off a busy poller's posts leave at once", "[held_posts]") {
    PairOptions o;
    o.hold_posts = false;
    Pair p(o);
    p.connect();
    parked_and_gated(*p.a.engine, [&] {
        const uint64_t sent = p.a.counters().tx_packets.load();
        post_small_writes(p, 8, 800);
        CHECK(p.a.counters().tx_packets.load() - sent == 8);
        CHECK(p.a.counters().tx_held_posts.load() == 0);
    });
    complete_all(p, 8);
    check_small_writes(p, 8, 800);
}

TEST_CASE("The WQEs of one post leave together, a refused one's before it too", "[held_posts]") {
    Pair p;
    p.connect();
    // Nobody busy-polls a: nothing is held for a poll, but a chain waits for its last WQE.
    REQUIRE_FALSE(p.a.engine->socket_parked());
    {
        const auto gate = p.a.engine->fork_gate().pass();
        const uint64_t sent = p.a.counters().tx_packets.load();
        const uint64_t trains = p.a.counters().tx_gso_sends.load();
        post_small_writes(p, 16, 900, true);
        CHECK(p.a.counters().tx_packets.load() - sent == 16);
        CHECK(p.a.counters().tx_gso_sends.load() - trains == 1);
        CHECK(p.a.counters().tx_held_posts.load() == 0);

        // A chain the provider cut short (a WQE it refused): ring() sends what came before.
        const uint64_t before_ring = p.a.counters().tx_packets.load();
        for (uint32_t i = 0; i < 4; ++i) {
            fill(p.a.at(4096 + i * kSmall), kSmall, 950 + i);
            REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 950 + i,
                                               {p.a.sge(4096 + i * kSmall, kSmall)},
                                               p.b.iova + 12288 + i * kSmall, p.b.keys.rkey),
                                      true) == 0);
        }
        CHECK(p.a.counters().tx_packets.load() == before_ring);
        p.a.qp->ring();
        CHECK(p.a.counters().tx_packets.load() - before_ring == 4);
    }
    complete_all(p, 20);
    check_small_writes(p, 16, 900);
    for (uint32_t i = 0; i < 4; ++i)
        CHECK(first_mismatch(p.b.at(12288 + i * kSmall), kSmall, 950 + i) == kSmall);
}

namespace {

// Connects p: b has posted before (its ACKs wait for its answers from then on) and owes
// nothing; two answers from b each find a receive posted on a.
void prepare_answering(Pair& p) {
    QpAttributes attrs = default_attributes();
    attrs.timeout = 31;  // hours: nothing is resent meanwhile
    p.connect(attrs, attrs);
    fill(p.b.at(0), kSmall, 1);
    REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.b.sge(0, kSmall)},
                                       p.a.iova + 16384, p.a.keys.rkey)) == 0);
    REQUIRE(p.wait_one(*p.b.scq).status == WcStatus::Success);
    REQUIRE(p.a.qp->post_recv(recv_wqe(2000, {p.a.sge(8192, kSmall)})) == 0);
    REQUIRE(p.a.qp->post_recv(recv_wqe(2001, {p.a.sge(8192 + kSmall, kSmall)})) == 0);
}

void post_answer(Pair& p, uint64_t wr_id, uint32_t offset) {
    fill(p.b.at(offset), kSmall, wr_id);
    REQUIRE(p.b.qp->post_send(send_wqe(wr_id, {p.b.sge(offset, kSmall)})) == 0);
}

// a's request completed and the answers `first`.. arrived intact at a, in order.
void check_answers(Pair& p, uint64_t first, uint32_t n) {
    REQUIRE(p.wait_one(*p.a.scq).wr_id == 1000);
    const auto answers = p.wait(*p.a.rcq, n);
    REQUIRE(answers.size() == n);
    for (uint32_t i = 0; i < n; ++i) {
        CHECK(answers[i].wr_id == first + i);
        CHECK(first_mismatch(p.a.at(8192 + i * kSmall), kSmall, first + i) == kSmall);
    }
}

}  // namespace

TEST_CASE("An answer with nothing of its own in flight leaves at once, with its ACK",
          "[held_posts]") {
    // b owes a the ACK of a's SEND and has nothing in flight: its answer is a ping-pong's,
    // and leaves at once with the ACK rather than at b's next poll. A second answer, posted
    // while the first is in flight (and owing nothing), waits for that poll as any post does.
    Pair p(holding_acks());
    prepare_answering(p);
    parked_and_gated(*p.b.engine, [&] {
        polled_request(p, 1000);
        const uint64_t held = p.b.counters().tx_held_posts.load();
        const uint64_t sent = p.b.counters().tx_packets.load();
        post_answer(p, 2000, 0);
        CHECK(p.b.counters().tx_packets.load() - sent == 2);  // the answer and the ACK
        CHECK(p.b.counters().tx_held_posts.load() == held);

        post_answer(p, 2001, kSmall);
        CHECK(p.b.counters().tx_held_posts.load() - held == 1);
        CHECK(p.b.counters().tx_packets.load() - sent == 2);
        p.b.engine->on_cq_poll(false);  // a poll that found completions: it sends the post
        CHECK(p.b.counters().tx_packets.load() - sent == 3);
    });
    check_answers(p, 2000, 2);
    const auto done = p.wait(*p.b.scq, 2);
    REQUIRE(done.size() == 2);
    for (const Completion& one : done) CHECK(one.status == WcStatus::Success);
}

TEST_CASE("An answer waits for the poll while a request of its QP is in flight", "[held_posts]") {
    // b's WRITE is in flight (a's engine thread, gated, reads nothing: no ACK comes back)
    // when b answers a's request: the answer is not a ping-pong's, and waits for b's poll.
    Pair p(holding_acks());
    prepare_answering(p);
    parked_and_gated(*p.b.engine, [&] {
        with_b_write_in_flight(p, 3000, 2 * kSmall, 20480, kSmall, [&] {
            polled_request(p, 1000);  // its poll sends the WRITE, held until then
            const uint64_t held = p.b.counters().tx_held_posts.load();
            const uint64_t sent = p.b.counters().tx_packets.load();
            post_answer(p, 2000, 0);
            CHECK(p.b.counters().tx_held_posts.load() - held == 1);
            CHECK(p.b.counters().tx_packets.load() == sent);
            p.b.engine->on_cq_poll(false);
            CHECK(p.b.counters().tx_packets.load() - sent == 2);  // the answer and the ACK
        });
    });
    check_answers(p, 2000, 1);
    CHECK(first_mismatch(p.a.at(20480), kSmall, 3000) == kSmall);
    const auto done = p.wait(*p.b.scq, 2);
    REQUIRE(done.size() == 2);
    for (const Completion& one : done) CHECK(one.status == WcStatus::Success);
}
