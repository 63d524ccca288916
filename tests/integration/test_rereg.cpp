// Changing objects in place: ibv_rereg_mr (access, PD, translation) and ibv_resize_cq, through
// the real libibverbs; each change takes effect for the very next access.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

ibv_wc one(ibv_cq* cq) {
    const auto wcs = wait_completions(cq, 1);
    REQUIRE(wcs.size() == 1);
    return wcs[0];
}

}  // namespace

TEST_CASE("rereg_mr: a new access takes effect at once, with the same keys", "[mr][rereg]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    const uint32_t rkey = dst.mr->rkey, lkey = dst.mr->lkey;
    fill_pattern(src.bytes.data(), 4096, 1);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 100, dst.addr(), rkey, 1) == 0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    // Read-only now: the next WRITE is refused and changes nothing.
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0);
    CHECK(dst.mr->rkey == rkey);
    CHECK(dst.mr->lkey == lkey);
    fill_pattern(src.bytes.data(), 4096, 2);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 100, dst.addr(), rkey, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    std::vector<uint8_t> first(100);
    fill_pattern(first.data(), 100, 1);
    CHECK(std::memcmp(dst.bytes.data(), first.data(), 100) == 0);
    // A remote write right without local write is refused, as at registration.
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                       IBV_ACCESS_REMOTE_WRITE) != 0);
}

TEST_CASE("rereg_mr: moving a region to another PD takes it from the QPs of the first",
          "[mr][rereg]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    ibv_pd* other = ibv_alloc_pd(b.ctx);
    REQUIRE(other);
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0) == 0);
    CHECK(dst.mr->pd == other);
    CHECK(ibv_dealloc_pd(other) == EBUSY);  // the region is in it now
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), dst.mr->rkey, 1) == 0);
    CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    // A PD of another context is refused.
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, a.pd, nullptr, 0, 0) != 0);
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, 0) == 0);
    CHECK(ibv_dealloc_pd(other) == 0);
}

TEST_CASE("rereg_mr: a new translation: the keys name the new buffer only", "[mr][rereg]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    std::vector<uint8_t> moved(8192, 0);
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, moved.data(),
                         moved.size(), 0) == 0);
    CHECK(dst.mr->addr == moved.data());
    CHECK(dst.mr->length == moved.size());
    fill_pattern(src.bytes.data(), 4096, 3);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096,
                      reinterpret_cast<uint64_t>(moved.data()) + 4096, dst.mr->rkey, 1) == 0);
    REQUIRE(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(moved.data() + 4096, src.bytes.data(), 4096) == 0);
    // The old buffer is no longer behind the key.
    std::fill(dst.bytes.begin(), dst.bytes.end(), uint8_t{0x5a});
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, dst.addr(), dst.mr->rkey, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_REM_ACCESS_ERR);
    CHECK(dst.bytes[0] == 0x5a);
    // Back to the first buffer before it goes (Buffer deregisters what it registered).
    REQUIRE(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, dst.bytes.data(),
                         dst.bytes.size(), 0) == 0);
}

TEST_CASE("resize_cq: grows, shrinks down to what is waiting, keeps completions", "[cq]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    ibv_cq* cq = ibv_create_cq(a.ctx, 4, nullptr, nullptr, 0);
    REQUIRE(cq);
    // Completions come from flushing receives of a QP on this CQ.
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 16;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(a.pd, &init);
    REQUIRE(qp);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    REQUIRE(ibv_modify_qp(qp, &attr,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
            0);
    Buffer buf(a.pd, 4096, kAll);
    REQUIRE(ibv_resize_cq(cq, 16) == 0);
    CHECK(cq->cqe >= 16);
    for (int i = 0; i < 10; ++i) REQUIRE(post_recv_buf(qp, buf, 64 * i, 64, i) == 0);
    attr.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0);  // 10 flush completions: more than 4
    CHECK(ibv_resize_cq(cq, 5) == EINVAL);
    CHECK(ibv_resize_cq(cq, 0) == EINVAL);
    REQUIRE(ibv_resize_cq(cq, 10) == 0);
    const auto wcs = wait_completions(cq, 10);
    REQUIRE(wcs.size() == 10);
    for (int i = 0; i < 10; ++i) {
        CHECK(wcs[i].wr_id == static_cast<uint64_t>(i));
        CHECK(wcs[i].status == IBV_WC_WR_FLUSH_ERR);
    }
    CHECK(ibv_destroy_qp(qp) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("rereg_mr: a change the provider refuses says why in errno", "[mr][rereg]") {
    Endpoint a(devices().a), b(devices().b);
    Buffer dst(b.pd, 4096, kAll);
    // A PD of another context: libibverbs passes it on, the provider refuses it. The caller
    // learns only IBV_REREG_MR_ERR_CMD from the return value; errno tells the reason, as the
    // kernel's answer sets it for a kernel provider.
    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_PD, a.pd, nullptr, 0, 0) ==
          IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_rereg_mr(dst.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                       IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_CMD);
    CHECK(errno == EINVAL);
}
