// Adaptive retransmission (transport/rtt_estimator.h) through the real provider: a message
// whose only packet or whose ACK is lost is resent by a tail-loss probe or after a timeout
// measured from the round trip, not after the QP's local ACK timeout;
// UROCE_RETRANSMIT=ack-timeout keeps the IBA's timer alone; a bad value refuses the context;
// READs that lose responses keep the ones after the loss and ask again for the gap alone.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kMsg = 4096;

// One SEND at a time from a to b, `rounds` times, each checked byte for byte: every loss
// is a tail loss (nothing follows that would make the responder NAK), the case that only a
// timer repairs.
void ping(Endpoint& a, Endpoint& b, int rounds) {
    Buffer src(a.pd, kMsg, kAccess), dst(b.pd, kMsg, kAccess);
    for (int i = 0; i < rounds; ++i) {
        fill_pattern(src.bytes.data(), kMsg, 500 + static_cast<uint64_t>(i));
        std::memset(dst.bytes.data(), 0, kMsg);
        REQUIRE(post_recv_buf(b.qp, dst, 0, kMsg, 2) == 0);
        REQUIRE(post_send_msg(a.qp, src, 0, kMsg, 1) == 0);
        auto got_a = wait_completions(a.cq, 1);
        auto got_b = wait_completions(b.cq, 1);
        REQUIRE(got_a.size() == 1);
        REQUIRE(got_b.size() == 1);
        REQUIRE(got_a[0].status == IBV_WC_SUCCESS);
        REQUIRE(got_b[0].status == IBV_WC_SUCCESS);
        REQUIRE(got_b[0].byte_len == kMsg);
        REQUIRE(std::memcmp(src.bytes.data(), dst.bytes.data(), kMsg) == 0);
    }
}

}  // namespace

TEST_CASE("A tail loss is resent by a probe or the adaptive timeout, without counting a retry",
          "[retransmit][faults]") {
    ::setenv("UROCE_FAULTS", "drop=0.05,seed=31", 1);
    QpOptions opt;
    opt.timeout = 14;  // 67 ms: each loss it had to repair would show as a counted retry
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ::unsetenv("UROCE_FAULTS");
    connect(a, b, opt);
    ping(a, b, 300);
    CHECK(counter(a.ctx, "tx_dropped_fault") + counter(b.ctx, "tx_dropped_fault") > 0);
    // The resends came from tail-loss probes (about two round trips after a silence) and
    // the adaptive timer (when both probes were lost): early, not counted against retry_cnt.
    CHECK(counter(a.ctx, "tail_probes") > 0);
    CHECK(qp_counter(a.qp, "tail_probes") == counter(a.ctx, "tail_probes"));
    CHECK(qp_counter(a.qp, "early_retransmits") == counter(a.ctx, "early_retransmits"));
    CHECK(counter(a.ctx, "retransmitted_packets") > 0);
    CHECK(a.state() == IBV_QPS_RTS);
}

TEST_CASE("UROCE_RETRANSMIT=ack-timeout resends only after the local ACK timeout",
          "[retransmit][faults]") {
    ::setenv("UROCE_FAULTS", "drop=0.05,seed=31", 1);
    ::setenv("UROCE_RETRANSMIT", "ack-timeout", 1);
    QpOptions opt;
    opt.timeout = 10;  // ~4 ms: short, since here every tail loss waits it out
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ::unsetenv("UROCE_FAULTS");
    ::unsetenv("UROCE_RETRANSMIT");
    connect(a, b, opt);
    ping(a, b, 100);
    CHECK(counter(a.ctx, "tx_dropped_fault") + counter(b.ctx, "tx_dropped_fault") > 0);
    CHECK(counter(a.ctx, "early_retransmits") == 0);
    CHECK(counter(a.ctx, "tail_probes") == 0);
    CHECK(counter(a.ctx, "retransmit_timeouts") > 0);
}

TEST_CASE("A bad UROCE_RETRANSMIT refuses the context with EINVAL", "[retransmit]") {
    CHECK(open_errno_with_env(devices().a, "UROCE_RETRANSMIT", "sometimes") == EINVAL);
}

TEST_CASE("READs that lose responses keep the rest and ask again for the gap alone",
          "[retransmit][faults][read_recovery]") {
    // b, the responder, loses 10% of the READ responses it sends. a reads 64 KiB (16
    // responses at MTU 4096), one READ at a time, and checks every byte; it keeps the
    // responses that follow a lost one and asks again for the gap, so b sends little more
    // than one response for each one lost (asking for the rest, several for each).
    constexpr size_t kRead = 65536;
    constexpr int kInFlight = 1;
    constexpr int kRounds = 100;
    ::setenv("UROCE_FAULTS", "op=read-response,drop=0.1,seed=17", 1);
    QpOptions opt;
    Endpoint b(devices().b, opt);
    ::unsetenv("UROCE_FAULTS");
    Endpoint a(devices().a, opt);
    connect(a, b, opt);
    Buffer src(b.pd, kInFlight * kRead, kAccess), dst(a.pd, kInFlight * kRead, kAccess);
    const uint64_t b_sent0 = counter(b.ctx, "tx_packets");
    for (int r = 0; r < kRounds; ++r) {
        fill_pattern(src.bytes.data(), src.bytes.size(), 900 + static_cast<uint64_t>(r));
        std::memset(dst.bytes.data(), 0, dst.bytes.size());
        for (int k = 0; k < kInFlight; ++k)
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, dst, k * kRead, kRead, src.addr() + k * kRead,
                              src.mr->rkey, static_cast<uint64_t>(k)) == 0);
        auto got = wait_completions(a.cq, kInFlight);
        REQUIRE(got.size() == static_cast<size_t>(kInFlight));
        for (int k = 0; k < kInFlight; ++k) {
            INFO("round " << r << ", READ " << k);
            REQUIRE(got[k].status == IBV_WC_SUCCESS);
            CHECK(got[k].wr_id == static_cast<uint64_t>(k));
        }
        REQUIRE(std::memcmp(src.bytes.data(), dst.bytes.data(), dst.bytes.size()) == 0);
    }
    const uint64_t responses = uint64_t{kRounds} * kInFlight * (kRead / 4096);
    const uint64_t dropped = counter(b.ctx, "tx_dropped_fault");
    const uint64_t sent = counter(b.ctx, "tx_packets") - b_sent0;  // what left b's socket
    INFO("responses " << responses << ", lost " << dropped << ", sent " << sent);
    REQUIRE(dropped > 0);
    CHECK(counter(a.ctx, "rx_read_kept") > 0);
    // Each lost response sent again once (a few more on a slow machine, where a timer's
    // go-back-N asks for a READ's rest): asking for the rest costs about 4 per loss here.
    CHECK(sent + dropped <= responses + 3 * dropped);
    CHECK(a.state() == IBV_QPS_RTS);
    CHECK(b.state() == IBV_QPS_RTS);
}
