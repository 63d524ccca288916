// Many connected QPs in one process: two contexts (one per device) with N RC QPs each, every
// pair carrying a WRITE one way and a SEND the other, all posted at once, every byte checked.
// N is 10,000 per context (three device slots each, qpn_space.h), $UROCE_TEST_SCALE_QPS when
// set (meson sets 3,000 for sanitizer builds, which pay several times more per packet).
// All QPs sending at the same moment overflow the peer's socket, and the losses are recovered
// by resends (the engine's budget keeps early ones from flooding it, resend_budget.h). The
// QPs' local ACK timeout is 0.5 s (`timeout` 17), so that a slow build drains the burst
// before retries run out: with nothing yet that paces all QPs of an engine together, 67 ms
// (`timeout` 14) is too short for 20,000 at once in a debug build (issue 12).
// tools/bench/many_qps.cpp measures the same at 10,000 per context, with memory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

size_t scale_qps() {
    if (const char* env = std::getenv("UROCE_TEST_SCALE_QPS"); env && *env)
        return std::strtoul(env, nullptr, 10);
    return 10000;
}

ibv_qp* create_small_rc_qp(ibv_pd* pd, ibv_cq* cq) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 2;
    init.cap.max_recv_wr = 2;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    return ibv_create_qp(pd, &init);
}

// Polls until `n` completions arrived; each must succeed, once per wr_id below `n`.
void expect_all(ibv_cq* cq, size_t n, const char* what) {
    INFO(what);
    std::vector<uint8_t> seen(n, 0);
    std::vector<ibv_wc> wcs(256);
    size_t got = 0, failed = 0;
    std::string first_failure;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (got < n && std::chrono::steady_clock::now() < deadline) {
        const int k = ibv_poll_cq(cq, static_cast<int>(wcs.size()), wcs.data());
        REQUIRE(k >= 0);
        for (int i = 0; i < k; ++i) {
            if (wcs[i].status != IBV_WC_SUCCESS && failed++ == 0)
                first_failure = std::string(ibv_wc_status_str(wcs[i].status)) + " on QP " +
                                std::to_string(wcs[i].wr_id);
            REQUIRE(wcs[i].wr_id < n);
            ++seen[wcs[i].wr_id];
        }
        got += static_cast<size_t>(k);
    }
    INFO("first failure: " << first_failure);
    CHECK(got == n);
    CHECK(failed == 0);
    CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(n));
}

}  // namespace

TEST_CASE("Thousands of QPs in one process, all sending at once, all deliver", "[scale]") {
    const size_t n = scale_qps();
    REQUIRE(n > 0);
    constexpr size_t kSize = 64;
    Endpoint a(devices().a);
    Endpoint b(devices().b);
    ibv_cq* cq_a = ibv_create_cq(a.ctx, static_cast<int>(n + 16), nullptr, nullptr, 0);
    ibv_cq* cq_b = ibv_create_cq(b.ctx, static_cast<int>(n + 16), nullptr, nullptr, 0);
    REQUIRE(cq_a);
    REQUIRE(cq_b);
    std::vector<ibv_qp*> qa, qb;
    for (size_t i = 0; i < n; ++i) {
        qa.push_back(create_small_rc_qp(a.pd, cq_a));
        qb.push_back(create_small_rc_qp(b.pd, cq_b));
        REQUIRE(qa.back());
        REQUIRE(qb.back());
    }
    QpOptions opt;
    opt.timeout = 17;
    for (size_t i = 0; i < n; ++i) {
        to_rts(qa[i], qb[i]->qp_num, b.gid, opt);
        to_rts(qb[i], qa[i]->qp_num, a.gid, opt);
    }
    constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Buffer src(a.pd, n * kSize, kAccess);
    Buffer dst(b.pd, n * kSize, kAccess);
    Buffer back(a.pd, n * kSize, kAccess);
    fill_pattern(src.bytes.data(), src.bytes.size(), 77);
    std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
    std::memset(back.bytes.data(), 0xee, back.bytes.size());

    for (size_t i = 0; i < n; ++i)
        REQUIRE(post_rdma(qa[i], IBV_WR_RDMA_WRITE, src, i * kSize, kSize, dst.addr() + i * kSize,
                          dst.mr->rkey, i) == 0);
    expect_all(cq_a, n, "WRITEs a -> b");
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), dst.bytes.size()) == 0);

    for (size_t i = 0; i < n; ++i) REQUIRE(post_recv_buf(qa[i], back, i * kSize, kSize, i) == 0);
    for (size_t i = 0; i < n; ++i) REQUIRE(post_send_msg(qb[i], dst, i * kSize, kSize, i) == 0);
    expect_all(cq_b, n, "SENDs b -> a");
    expect_all(cq_a, n, "receives at a");
    CHECK(std::memcmp(back.bytes.data(), src.bytes.data(), back.bytes.size()) == 0);

    for (ibv_qp* q : qa) ibv_destroy_qp(q);
    for (ibv_qp* q : qb) ibv_destroy_qp(q);
    ibv_destroy_cq(cq_a);
    ibv_destroy_cq(cq_b);
}
