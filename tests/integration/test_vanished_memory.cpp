// Registered memory whose pages the application gave back while the region (or a receive
// naming it) was still there. A NIC goes on writing into the pages the registration pinned;
// UCX counts on that at teardown (its UD receive buffers are freed before their QP). uroce
// has no pin: each access finds the pages gone, the operation ends as if its key had been
// refused, and the process lives on (app_memory_guard.h). Counted in app_memory_faults.
// (The UD case is in test_ud.cpp.)
#include <catch2/catch.hpp>
#include <cstring>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr size_t kBytes = 2 * 4096;

ibv_wc one(ibv_cq* cq) {
    const auto wcs = wait_completions(cq, 1);
    REQUIRE(wcs.size() == 1);
    return wcs[0];
}

QpOptions all_access() {
    QpOptions o;
    o.access = kAllAccess;
    return o;
}

}  // namespace

TEST_CASE("An RDMA WRITE into pages that are gone ends in a remote access error", "[vanished]") {
    Endpoint a(devices().a, all_access()), b(devices().b, all_access());
    connect(a, b, all_access());
    Buffer src(a.pd, kBytes, kAllAccess);
    fill_pattern(src.bytes.data(), kBytes, 5);
    VanishingRegion target(b.pd, kBytes, kAllAccess);
    // Before the pages go, the same WRITE lands: the region and the key are good.
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, kBytes, target.addr(), target.mr->rkey, 1) ==
            0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(target.base, src.bytes.data(), kBytes) == 0);
    CHECK(counter(b.ctx, "app_memory_faults") == 0);
    target.vanish();
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, kBytes, target.addr(), target.mr->rkey, 2) ==
            0);
    const ibv_wc wc = one(a.cq);
    CHECK(wc.wr_id == 2);
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(counter(b.ctx, "app_memory_faults") == 1);
    CHECK(b.state() == IBV_QPS_ERR);
}

TEST_CASE("An RDMA READ of pages that are gone ends in a remote access error", "[vanished]") {
    Endpoint a(devices().a, all_access()), b(devices().b, all_access());
    connect(a, b, all_access());
    Buffer dst(a.pd, kBytes, kAllAccess);
    std::memset(dst.bytes.data(), 0x77, kBytes);
    VanishingRegion source(b.pd, kBytes, kAllAccess);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, dst, 0, kBytes, source.addr(), source.mr->rkey, 1) ==
            0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(dst.bytes[0] == 0x11);
    CHECK(dst.bytes[kBytes - 1] == 0x11);
    std::memset(dst.bytes.data(), 0x77, kBytes);
    source.vanish();
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, dst, 0, kBytes, source.addr(), source.mr->rkey, 2) ==
            0);
    const ibv_wc wc = one(a.cq);
    CHECK(wc.wr_id == 2);
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(counter(b.ctx, "app_memory_faults") == 1);
    // Nothing of the refused READ landed.
    for (size_t i = 0; i < kBytes; i += 512) CHECK(dst.bytes[i] == 0x77);
}

TEST_CASE("An RDMA READ into local pages that are gone ends in a local protection error",
          "[vanished]") {
    Endpoint a(devices().a, all_access()), b(devices().b, all_access());
    connect(a, b, all_access());
    Buffer source(b.pd, kBytes, kAllAccess);
    fill_pattern(source.bytes.data(), kBytes, 8);
    VanishingRegion dst(a.pd, kBytes, kAllAccess);
    dst.vanish();
    REQUIRE(post_rdma_at(a.qp, IBV_WR_RDMA_READ, dst.addr(), kBytes, dst.mr->lkey, source.addr(),
                         source.mr->rkey, 3) == 0);
    const ibv_wc wc = one(a.cq);
    CHECK(wc.wr_id == 3);
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
    CHECK(counter(a.ctx, "app_memory_faults") == 1);
}

TEST_CASE("A SEND from local pages that are gone fails and delivers nothing", "[vanished]") {
    Endpoint a(devices().a, all_access()), b(devices().b, all_access());
    connect(a, b, all_access());
    Buffer in(b.pd, kBytes, kAllAccess);
    std::memset(in.bytes.data(), 0x77, kBytes);
    REQUIRE(post_recv_buf(b.qp, in, 0, kBytes, 9) == 0);
    VanishingRegion src(a.pd, kBytes, kAllAccess);
    src.vanish();
    REQUIRE(post_rdma_at(a.qp, IBV_WR_SEND, src.addr(), kBytes, src.mr->lkey, 0, 0, 4) == 0);
    const ibv_wc wc = one(a.cq);
    CHECK(wc.wr_id == 4);
    CHECK(wc.status == IBV_WC_LOC_QP_OP_ERR);
    CHECK(counter(a.ctx, "app_memory_faults") >= 1);
    CHECK(a.state() == IBV_QPS_ERR);
    // The receive saw nothing arrive (polled for a while: a packet would be there by then).
    CHECK(wait_completions(b.cq, 1, std::chrono::milliseconds(300)).empty());
    for (size_t i = 0; i < kBytes; i += 512) CHECK(in.bytes[i] == 0x77);
}

TEST_CASE("A SEND into a receive buffer whose pages are gone completes it in error", "[vanished]") {
    Endpoint a(devices().a, all_access()), b(devices().b, all_access());
    connect(a, b, all_access());
    Buffer src(a.pd, kBytes, kAllAccess);
    fill_pattern(src.bytes.data(), kBytes, 9);
    VanishingRegion in(b.pd, kBytes, kAllAccess);
    REQUIRE(post_recv_at(b.qp, in.addr(), kBytes, in.mr->lkey, 21) == 0);
    in.vanish();
    REQUIRE(post_send_msg(a.qp, src, 0, kBytes, 5) == 0);
    const ibv_wc r = one(b.cq);
    CHECK(r.wr_id == 21);
    CHECK(r.status == IBV_WC_LOC_PROT_ERR);
    CHECK(counter(b.ctx, "app_memory_faults") == 1);
    CHECK(one(a.cq).status != IBV_WC_SUCCESS);
}

TEST_CASE("An atomic on pages that are gone ends in a remote access error", "[vanished]") {
    Endpoint a(devices().a, all_access()), b(devices().b, all_access());
    connect(a, b, all_access());
    Buffer result(a.pd, 4096, kAllAccess);
    VanishingRegion target(b.pd, kBytes, kAllAccess);
    REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, result, 0, target.addr(),
                        target.mr->rkey, 1, 0, 6) == 0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    uint64_t v = 0;
    std::memcpy(&v, target.base, 8);
    CHECK(v == 0x1111111111111112ull);
    target.vanish();
    REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, result, 0, target.addr(),
                        target.mr->rkey, 1, 0, 7) == 0);
    const ibv_wc wc = one(a.cq);
    CHECK(wc.wr_id == 7);
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(counter(b.ctx, "app_memory_faults") == 1);
}
