// The fast paths through the real provider, on and off: GSO trains (UROCE_GSO), GRO reads
// (UROCE_GRO), reads by the polling thread (UROCE_INLINE_PROGRESS), posts held for the
// next poll (UROCE_HOLD_POSTS) and ACKs held for the answer (UROCE_HOLD_ACKS). Whichever is
// on, every byte arrives whole; the counters show which path carried it; a bad value
// refuses the context.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kMsg = 64 * 1024;

// Polls `cq` back to back (no sleep: a busy poll, as perftest's) until `n` completions came
// or 20 s passed.
std::vector<ibv_wc> spin_for(ibv_cq* cq, size_t n) {
    std::vector<ibv_wc> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (long i = 0; out.size() < n && i < 2'000'000'000L; ++i) {
        ibv_wc wc[8];
        const int got = ibv_poll_cq(cq, 8, wc);
        REQUIRE(got >= 0);
        out.insert(out.end(), wc, wc + got);
        if ((i & 1023) == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    return out;
}

// `rounds` times: a SENDs 64 KiB to b and WRITEs 64 KiB into b, b READs 64 KiB from a; both
// sides spin on their CQs; every byte is checked.
void traffic(Endpoint& a, Endpoint& b, int rounds) {
    Buffer sa(a.pd, 2 * kMsg, kAccess), sb(b.pd, 3 * kMsg, kAccess);
    for (int i = 0; i < rounds; ++i) {
        const auto seed = static_cast<uint64_t>(i) * 3;
        fill_pattern(sa.bytes.data(), 2 * kMsg, 900 + seed);
        fill_pattern(sb.bytes.data() + 2 * kMsg, kMsg, 901 + seed);
        std::memset(sb.bytes.data(), 0, 2 * kMsg);
        REQUIRE(post_recv_buf(b.qp, sb, 0, kMsg, 1) == 0);
        REQUIRE(post_send_msg(a.qp, sa, 0, kMsg, 2) == 0);
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, sa, kMsg, kMsg, sb.addr() + kMsg, sb.mr->rkey,
                          3) == 0);
        REQUIRE(post_rdma(b.qp, IBV_WR_RDMA_READ, sb, 2 * kMsg, kMsg, sa.addr() + kMsg, sa.mr->rkey,
                          4) == 0);
        const auto got_a = spin_for(a.cq, 2);
        const auto got_b = spin_for(b.cq, 2);
        REQUIRE(got_a.size() == 2);
        REQUIRE(got_b.size() == 2);
        for (const ibv_wc& wc : got_a) REQUIRE(wc.status == IBV_WC_SUCCESS);
        for (const ibv_wc& wc : got_b) REQUIRE(wc.status == IBV_WC_SUCCESS);
        REQUIRE(std::memcmp(sa.bytes.data(), sb.bytes.data(), 2 * kMsg) == 0);
        // b READ a's second 64 KiB (the WRITE's source) into its third.
        REQUIRE(std::memcmp(sb.bytes.data() + 2 * kMsg, sa.bytes.data() + kMsg, kMsg) == 0);
    }
}

constexpr const char* kPathVars[] = {"UROCE_GSO", "UROCE_GRO", "UROCE_INLINE_PROGRESS",
                                     "UROCE_HOLD_POSTS", "UROCE_HOLD_ACKS"};

void set_paths(const char* value) {
    for (const char* var : kPathVars) ::setenv(var, value, 1);
}

void unset_paths() {
    for (const char* var : kPathVars) ::unsetenv(var);
}

constexpr size_t kSmall = 64;

// perftest's message-rate loop: a keeps up to 64 small WRITEs in flight into b, posting one
// WQE per ibv_post_send and spinning on its CQ in between, `count` in all; message i
// lands at b's offset i * kSmall and is checked there.
void small_writes(Endpoint& a, Endpoint& b, size_t count, uint64_t seed) {
    Buffer sa(a.pd, count * kSmall, kAccess), sb(b.pd, count * kSmall, kAccess);
    fill_pattern(sa.bytes.data(), count * kSmall, seed);
    size_t posted = 0, done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (long i = 0; done < count && i < 2'000'000'000L; ++i) {
        while (posted < count && posted - done < 64) {
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, sa, posted * kSmall, kSmall,
                              sb.addr() + posted * kSmall, sb.mr->rkey, posted) == 0);
            ++posted;
        }
        ibv_wc wc[16];
        const int got = ibv_poll_cq(a.cq, 16, wc);
        REQUIRE(got >= 0);
        for (int k = 0; k < got; ++k) REQUIRE(wc[k].status == IBV_WC_SUCCESS);
        done += static_cast<size_t>(got);
        if ((i & 1023) == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    REQUIRE(done == count);
    REQUIRE(std::memcmp(sa.bytes.data(), sb.bytes.data(), count * kSmall) == 0);
}

// Waits (20 s at most) until `at` holds the kSmall bytes of pattern `seed`, as written by the
// provider's threads (bytes_landed).
bool arrives(const uint8_t* at, uint64_t seed) {
    uint8_t want[kSmall];
    fill_pattern(want, kSmall, seed);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (long i = 0; i < 2'000'000'000L; ++i) {
        if (bytes_landed(at, want, kSmall)) return true;
        if ((i & 1023) == 0 && std::chrono::steady_clock::now() > deadline) return false;
    }
    return false;
}

// Spins on `cq` (20 s at most) for one completion: whether it came, successful, for
// `wr_id`. No Catch2 assertion: it runs on a second thread too.
bool completes(ibv_cq* cq, uint64_t wr_id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (long i = 0; i < 2'000'000'000L; ++i) {
        ibv_wc wc;
        const int got = ibv_poll_cq(cq, 1, &wc);
        if (got < 0) return false;
        if (got == 1) return wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id;
        if ((i & 1023) == 0 && std::chrono::steady_clock::now() > deadline) return false;
    }
    return false;
}

// ib_write_lat's loop: a WRITEs kSmall bytes into b, spins on its CQ until that completes,
// then spins on its memory for b's WRITE, which b sends once a's has arrived; `iters`
// rounds, each message's bytes checked on arrival. b runs on a thread of its own.
void write_ping_pong(Endpoint& a, Endpoint& b, int iters) {
    Buffer ma(a.pd, 2 * kSmall, kAccess), mb(b.pd, 2 * kSmall, kAccess);
    // [0, kSmall): where the peer's WRITE lands; [kSmall, 2 kSmall): what this side sends.
    auto round = [](Endpoint& me, Buffer& mine, const Buffer& peer, uint64_t seed) {
        fill_pattern(mine.bytes.data() + kSmall, kSmall, seed);
        return post_rdma(me.qp, IBV_WR_RDMA_WRITE, mine, kSmall, kSmall, peer.addr(), peer.mr->rkey,
                         seed) == 0 &&
               completes(me.cq, seed);
    };
    int b_rounds = 0;
    std::thread tb([&] {
        for (; b_rounds < iters; ++b_rounds)
            if (!arrives(mb.bytes.data(), 10'000 + b_rounds) ||
                !round(b, mb, ma, 20'000 + b_rounds))
                return;
    });
    int a_rounds = 0;
    for (; a_rounds < iters; ++a_rounds)
        if (!round(a, ma, mb, 10'000 + a_rounds) || !arrives(ma.bytes.data(), 20'000 + a_rounds))
            break;
    tb.join();
    CHECK(a_rounds == iters);
    CHECK(b_rounds == iters);
}

// ib_send_lat's loop: a SENDs kSmall bytes to b and spins on its one CQ until both its send
// completion and b's answer (a SEND back) came, the send completion first (a requester sees
// the ACK before the answer: train_order.h); b spins for a's message, checks it, answers.
// `iters` rounds, every message checked; returns the rounds a finished in order.
int send_ping_pong(Endpoint& a, Endpoint& b, int iters) {
    Buffer ma(a.pd, 2 * kSmall, kAccess), mb(b.pd, 2 * kSmall, kAccess);
    // [0, kSmall): the receive buffer; [kSmall, 2 kSmall): what this side sends.
    int b_rounds = 0;
    std::thread tb([&] {
        for (; b_rounds < iters; ++b_rounds) {
            if (post_recv_buf(b.qp, mb, 0, kSmall, 1) != 0 || !completes(b.cq, 1)) return;
            uint8_t want[kSmall];
            fill_pattern(want, kSmall, 10'000 + b_rounds);
            if (std::memcmp(mb.bytes.data(), want, kSmall) != 0) return;
            fill_pattern(mb.bytes.data() + kSmall, kSmall, 20'000 + b_rounds);
            if (post_send_msg(b.qp, mb, kSmall, kSmall, 2) != 0 || !completes(b.cq, 2)) return;
        }
    });
    int in_order = 0;
    for (int i = 0; i < iters; ++i) {
        if (post_recv_buf(a.qp, ma, 0, kSmall, 3) != 0) break;
        fill_pattern(ma.bytes.data() + kSmall, kSmall, 10'000 + i);
        if (post_send_msg(a.qp, ma, kSmall, kSmall, 4) != 0) break;
        const auto got = spin_for(a.cq, 2);
        if (got.size() != 2 || got[0].status != IBV_WC_SUCCESS || got[1].status != IBV_WC_SUCCESS)
            break;
        uint8_t want[kSmall];
        fill_pattern(want, kSmall, 20'000 + i);
        if (std::memcmp(ma.bytes.data(), want, kSmall) != 0) break;
        if (got[0].wr_id == 4 && got[1].wr_id == 3) ++in_order;
    }
    tb.join();
    CHECK(b_rounds == iters);
    return in_order;
}
}  // namespace

TEST_CASE("Fast paths on (the default): trains, GRO reads, reads by the polling thread",
          "[fast_paths]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    traffic(a, b, 40);
    // a sends every long message here: the SEND, the WRITE and the READ responses.
    CHECK(counter(a.ctx, "tx_gso_sends") > 0);
    CHECK(counter(b.ctx, "rx_gro_datagrams") > 0);
    // Both threads spun on their CQs: at least some of what they received they read
    // themselves (how much depends on the scheduler).
    CHECK(counter(a.ctx, "rx_polled_packets") + counter(b.ctx, "rx_polled_packets") > 0);
    // Those reads were the pollers' because the socket was theirs: parked at least once.
    CHECK(counter(a.ctx, "socket_parks") + counter(b.ctx, "socket_parks") > 0);
    // Nobody polls now: within a watch period each socket goes back to its engine thread,
    // once per park, found by a watch wake-up.
    for (ibv_context* ctx : {a.ctx, b.ctx}) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (int i = 0;
             i < 10'000 && counter(ctx, "socket_handbacks") < counter(ctx, "socket_parks") &&
             std::chrono::steady_clock::now() < deadline;
             ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK(counter(ctx, "socket_handbacks") == counter(ctx, "socket_parks"));
        CHECK(counter(ctx, "watch_wakeups") >= counter(ctx, "socket_handbacks"));
    }
    CHECK(counter(a.ctx, "rx_bad_icrc") + counter(b.ctx, "rx_bad_icrc") == 0);
    CHECK(counter(a.ctx, "rx_icrc_unseen_fields") + counter(b.ctx, "rx_icrc_unseen_fields") == 0);
}

TEST_CASE("Fast paths off: one datagram per sendmsg and per read, the engine thread reads",
          "[fast_paths]") {
    const char* value = GENERATE("off", "0");
    INFO("UROCE_GSO/GRO/INLINE_PROGRESS=" << value);
    set_paths(value);
    Endpoint a(devices().a), b(devices().b);
    unset_paths();
    connect(a, b);
    traffic(a, b, 10);
    for (ibv_context* ctx : {a.ctx, b.ctx}) {
        CHECK(counter(ctx, "tx_gso_sends") == 0);
        CHECK(counter(ctx, "rx_gro_datagrams") == 0);
        CHECK(counter(ctx, "rx_polled_packets") == 0);
        CHECK(counter(ctx, "tx_held_posts") == 0);
        CHECK(counter(ctx, "tx_held_acks") == 0);
        CHECK(counter(ctx, "socket_parks") == 0);
        CHECK(counter(ctx, "socket_handbacks") == 0);
        CHECK(counter(ctx, "watch_wakeups") == 0);
        CHECK(counter(ctx, "rx_packets") > 0);
    }
}

TEST_CASE("Small posts of a busy poller wait for its next poll and leave in trains",
          "[fast_paths]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    small_writes(a, b, 4000, 1000);
    // a spun on its CQ: it took the socket, and what it posted meanwhile waited for its
    // polls, several posts to a train (how many depends on the scheduler).
    CHECK(counter(a.ctx, "tx_held_posts") > 0);
    CHECK(counter(a.ctx, "tx_gso_sends") > 0);
}

TEST_CASE("UROCE_HOLD_POSTS=off: every post leaves at once", "[fast_paths]") {
    const char* value = GENERATE("off", "0");
    ::setenv("UROCE_HOLD_POSTS", value, 1);
    Endpoint a(devices().a), b(devices().b);
    ::unsetenv("UROCE_HOLD_POSTS");
    connect(a, b);
    small_writes(a, b, 2000, 2000);
    CHECK(counter(a.ctx, "tx_held_posts") == 0);
}

TEST_CASE("In a WRITE ping-pong the ACKs wait for the answer, and every byte arrives",
          "[fast_paths]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    write_ping_pong(a, b, 2000);
    INFO("held ACKs " << counter(a.ctx, "tx_held_acks") << " + " << counter(b.ctx, "tx_held_acks"));
    CHECK(counter(a.ctx, "tx_held_acks") + counter(b.ctx, "tx_held_acks") > 0);
    CHECK(counter(a.ctx, "held_ack_timeouts") + counter(b.ctx, "held_ack_timeouts") <
          counter(a.ctx, "tx_held_acks") + counter(b.ctx, "tx_held_acks"));
}

// Between devices of this host the answer leads its ACK in one train, which the requester
// takes ACK first: every send completion still comes before the answer's.
TEST_CASE("A SEND answer to a device of this host leads its ACK in one train",
          "[fast_paths][answer_first]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    CHECK(send_ping_pong(a, b, 2000) == 2000);
    // A SEND of 64 bytes is one packet: only an answer and the ACK behind it make a train.
    INFO("trains " << counter(a.ctx, "tx_gso_sends") << " + " << counter(b.ctx, "tx_gso_sends")
                   << ", held ACKs " << counter(a.ctx, "tx_held_acks") << " + "
                   << counter(b.ctx, "tx_held_acks"));
    CHECK(counter(a.ctx, "tx_gso_sends") + counter(b.ctx, "tx_gso_sends") > 0);
}

TEST_CASE("A SEND answer to a context that reads without GRO keeps its ACK first",
          "[fast_paths][answer_first]") {
    ::setenv("UROCE_GRO", "off", 1);
    Endpoint b(devices().b);
    ::unsetenv("UROCE_GRO");
    Endpoint a(devices().a);
    connect(a, b);
    CHECK(send_ping_pong(a, b, 1000) == 1000);
    // Neither leads: b reads without GRO, and a's peer device counts b as such.
    CHECK(counter(a.ctx, "tx_gso_sends") == 0);
    CHECK(counter(b.ctx, "tx_gso_sends") == 0);
}

TEST_CASE("UROCE_HOLD_ACKS=off: every ACK leaves at the end of its batch", "[fast_paths]") {
    const char* value = GENERATE("off", "0");
    ::setenv("UROCE_HOLD_ACKS", value, 1);
    Endpoint a(devices().a), b(devices().b);
    ::unsetenv("UROCE_HOLD_ACKS");
    connect(a, b);
    write_ping_pong(a, b, 500);
    CHECK(counter(a.ctx, "tx_held_acks") + counter(b.ctx, "tx_held_acks") == 0);
}

TEST_CASE("The WQEs of one ibv_post_send leave together, even when one is refused",
          "[fast_paths]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    constexpr int kChain = 16;
    Buffer sa(a.pd, (kChain + 1) * kSmall, kAccess), sb(b.pd, (kChain + 1) * kSmall, kAccess);
    fill_pattern(sa.bytes.data(), (kChain + 1) * kSmall, 3000);
    auto chain = [&](int n, ibv_send_wr* wrs, ibv_sge* sges) {
        for (int i = 0; i < n; ++i) {
            sges[i] = {sa.addr() + i * kSmall, kSmall, sa.mr->lkey};
            wrs[i] = {};
            wrs[i].wr_id = static_cast<uint64_t>(i);
            wrs[i].sg_list = &sges[i];
            wrs[i].num_sge = 1;
            wrs[i].opcode = IBV_WR_RDMA_WRITE;
            wrs[i].send_flags = IBV_SEND_SIGNALED;
            wrs[i].wr.rdma.remote_addr = sb.addr() + i * kSmall;
            wrs[i].wr.rdma.rkey = sb.mr->rkey;
            wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
        }
    };
    // The first traffic of the connection, nobody polling yet: one train of 16.
    ibv_send_wr wrs[kChain + 1];
    ibv_sge sges[kChain + 1];
    chain(kChain, wrs, sges);
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, wrs, &bad) == 0);
    CHECK(counter(a.ctx, "tx_gso_sends") >= 1);  // left at the post, as a train
    REQUIRE(wait_completions(a.cq, kChain).size() == kChain);
    // All acknowledged: the counters no longer move. A resend may have gone out meanwhile
    // (the first expiry comes 1 ms after the train, no round trip being measured yet, and an
    // ASan build on a loaded host took longer than that to read the counters after the post:
    // 17 packets seen). The first transmissions are the 16, in one train unless resent.
    const uint64_t resent = counter(a.ctx, "retransmitted_packets");
    CHECK(counter(a.ctx, "tx_packets") - resent == kChain);
    if (resent == 0) CHECK(counter(a.ctx, "tx_gso_sends") == 1);
    REQUIRE(std::memcmp(sa.bytes.data(), sb.bytes.data(), kChain * kSmall) == 0);

    // A chain whose last WQE is refused (more SGEs than the QP takes): the ones before it
    // are posted, and they go out without any further post.
    std::memset(sb.bytes.data(), 0, (kChain + 1) * kSmall);
    fill_pattern(sa.bytes.data(), (kChain + 1) * kSmall, 3001);
    chain(4, wrs, sges);
    wrs[3].num_sge = 99;
    REQUIRE(ibv_post_send(a.qp, wrs, &bad) == EINVAL);
    CHECK(bad == &wrs[3]);
    const auto got = wait_completions(a.cq, 3);
    REQUIRE(got.size() == 3);
    for (const ibv_wc& wc : got) CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(sa.bytes.data(), sb.bytes.data(), 3 * kSmall) == 0);
    const uint8_t* refused = sb.bytes.data() + 3 * kSmall;
    CHECK(std::all_of(refused, refused + kSmall, [](uint8_t v) { return v == 0; }));
}

TEST_CASE(
    "A bad UROCE_GSO, UROCE_GRO, UROCE_INLINE_PROGRESS, UROCE_HOLD_POSTS, UROCE_HOLD_ACKS or "
    "UROCE_ECN refuses the context",
    "[fast_paths]") {
    const char* var = GENERATE("UROCE_GSO", "UROCE_GRO", "UROCE_INLINE_PROGRESS",
                               "UROCE_HOLD_POSTS", "UROCE_HOLD_ACKS", "UROCE_ECN");
    INFO(var);
    CHECK(open_errno_with_env(devices().a, var, "maybe") == EINVAL);
    // The accepted spellings open it.
    CHECK(open_errno_with_env(devices().a, var, "on") == 0);
    CHECK(open_errno_with_env(devices().a, var, "1") == 0);
}
