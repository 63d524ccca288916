// The fast paths through the real provider, on and off: GSO trains (UROCE_GSO), GRO reads
// (UROCE_GRO) and reads by the polling thread (UROCE_INLINE_PROGRESS). Whichever is on, every
// byte arrives whole; the counters show which path carried it; a bad value refuses the
// context.
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

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

void set_paths(const char* value) {
    ::setenv("UROCE_GSO", value, 1);
    ::setenv("UROCE_GRO", value, 1);
    ::setenv("UROCE_INLINE_PROGRESS", value, 1);
}

void unset_paths() {
    ::unsetenv("UROCE_GSO");
    ::unsetenv("UROCE_GRO");
    ::unsetenv("UROCE_INLINE_PROGRESS");
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
        CHECK(counter(ctx, "rx_packets") > 0);
    }
}

TEST_CASE("A bad UROCE_GSO, UROCE_GRO or UROCE_INLINE_PROGRESS refuses the context",
          "[fast_paths]") {
    const char* var = GENERATE("UROCE_GSO", "UROCE_GRO", "UROCE_INLINE_PROGRESS");
    INFO(var);
    CHECK(open_errno_with_env(devices().a, var, "maybe") == EINVAL);
    // The accepted spellings open it.
    CHECK(open_errno_with_env(devices().a, var, "on") == 0);
    CHECK(open_errno_with_env(devices().a, var, "1") == 0);
}
