// ATOMIC WRITE through the real libibverbs: ibv_wr_atomic_write and ibv_post_send with
// IBV_WR_ATOMIC_WRITE store 8 bytes at the peer at once, complete as IBV_WC_ATOMIC_WRITE, stay
// in order with the WRITEs around them under loss, and are refused where they must be.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

// Remote write, no remote atomics: all ATOMIC WRITE needs (rxe's rule).
constexpr int kWriteAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

uint64_t u64_at(const Buffer& b, size_t offset) {
    uint64_t v = 0;
    std::memcpy(&v, b.bytes.data() + offset, 8);
    return v;
}

// Replaces `ep`'s RC QP by one that can ATOMIC WRITE and RDMA WRITE through ibv_wr_*.
ibv_qp_ex* use_qp_ex(Endpoint& ep) {
    ibv_qp* qp =
        create_qp_ex(ep, IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE, 256);
    REQUIRE(qp);
    ibv_destroy_qp(ep.qp);
    ep.qp = qp;
    ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp);
    REQUIRE(qpx);
    return qpx;
}

int post_atomic_write(ibv_qp* qp, uint64_t local_addr, uint32_t length, uint32_t lkey,
                      bool inline_data, uint64_t remote_addr, uint32_t rkey, uint64_t wr_id) {
    ibv_sge sge{local_addr, length, lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_ATOMIC_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED | (inline_data ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

}  // namespace

TEST_CASE("ATOMIC WRITE: ibv_wr_atomic_write stores 8 bytes at the peer, in queue order",
          "[atomic_write]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_qp_ex* qpx = use_qp_ex(a);
    connect(a, b);
    Buffer src(a.pd, 4096, kWriteAccess);
    Buffer target(b.pd, 4096, kWriteAccess);
    fill_pattern(src.bytes.data(), 256, 5);

    // A block of data, then a word announcing it: the word lands after the block.
    uint64_t word = 0x0123456789abcdefull;
    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = 0;
    ibv_wr_rdma_write(qpx, target.mr->rkey, target.addr() + 256);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 256);
    qpx->wr_id = 2;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(qpx, target.mr->rkey, target.addr() + 8, &word);
    word = 0;  // copied at the call, as inline data is
    REQUIRE(ibv_wr_complete(qpx) == 0);
    auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(wcs[0].wr_id == 2);
    CHECK(wcs[0].opcode == IBV_WC_ATOMIC_WRITE);
    CHECK(wcs[0].byte_len == 8);
    CHECK(u64_at(target, 8) == 0x0123456789abcdefull);
    CHECK(std::memcmp(target.bytes.data() + 256, src.bytes.data(), 256) == 0);
    // Nothing around the word moved.
    CHECK(u64_at(target, 0) == 0);
    CHECK(u64_at(target, 16) == 0);

    // ibv_post_send takes it too: the 8 bytes from a registered buffer, or inline.
    const uint64_t from_buffer = 0x1111111122222222ull;
    std::memcpy(src.bytes.data() + 1024, &from_buffer, 8);
    REQUIRE(post_atomic_write(a.qp, src.addr() + 1024, 8, src.mr->lkey, false, target.addr() + 16,
                              target.mr->rkey, 3) == 0);
    uint64_t inline_word = 0x3333333344444444ull;
    REQUIRE(post_atomic_write(a.qp, reinterpret_cast<uint64_t>(&inline_word), 8, 0, true,
                              target.addr() + 24, target.mr->rkey, 4) == 0);
    wcs = wait_completions(a.cq, 2);
    REQUIRE(wcs.size() == 2);
    for (const ibv_wc& wc : wcs) {
        CHECK(wc.status == IBV_WC_SUCCESS);
        CHECK(wc.opcode == IBV_WC_ATOMIC_WRITE);
    }
    CHECK(u64_at(target, 16) == from_buffer);
    CHECK(u64_at(target, 24) == inline_word);
    CHECK(u64_at(target, 32) == 0);
}

TEST_CASE("ATOMIC WRITE: with 20% of packets lost, every word lands after its block",
          "[atomic_write][faults]") {
    ::setenv("UROCE_FAULTS", "drop=0.2,seed=33", 1);
    QpOptions opt;
    opt.timeout = 12;  // as the atomics' loss test: outlasts a loaded machine's stalls
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ::unsetenv("UROCE_FAULTS");
    connect(a, b, opt);
    constexpr int kRounds = 200;
    Buffer src(a.pd, 8 * kRounds + 4096, kWriteAccess);
    Buffer target(b.pd, 64 * kRounds + 64, kWriteAccess);
    fill_pattern(src.bytes.data(), 4096, 9);
    for (int i = 0; i < kRounds; ++i) {
        const uint64_t v = 1000u + i;
        std::memcpy(src.bytes.data() + 4096 + 8 * i, &v, 8);
    }
    for (int base = 0; base < kRounds; base += 25) {
        for (int i = base; i < base + 25; ++i) {
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 64 * (i % 64), 64,
                              target.addr() + 64 + 64 * i, target.mr->rkey, 2 * i, false) == 0);
            REQUIRE(post_atomic_write(a.qp, src.addr() + 4096 + 8 * i, 8, src.mr->lkey, false,
                                      target.addr(), target.mr->rkey, 2 * i + 1) == 0);
        }
        const auto wcs = wait_completions(a.cq, 25, std::chrono::seconds(60));
        REQUIRE(wcs.size() == 25);
        for (const ibv_wc& wc : wcs) REQUIRE(wc.status == IBV_WC_SUCCESS);
    }
    CHECK(u64_at(target, 0) == 1000u + kRounds - 1);
    for (int i = 0; i < kRounds; ++i)
        CHECK(std::memcmp(target.bytes.data() + 64 + 64 * i, src.bytes.data() + 64 * (i % 64),
                          64) == 0);
    CHECK(counter(a.ctx, "tx_dropped_fault") > 0);
    CHECK(counter(b.ctx, "rx_duplicate") > 0);
}

TEST_CASE("ATOMIC WRITE: what is refused, and how", "[atomic_write]") {
    SECTION("at post: a misaligned target, not 8 bytes, a QP type without it") {
        Endpoint a(devices().a), b(devices().b);
        ibv_qp_ex* qpx = use_qp_ex(a);
        connect(a, b);
        Buffer src(a.pd, 64, kWriteAccess);
        Buffer target(b.pd, 64, kWriteAccess);
        const uint64_t word = 7;
        ibv_wr_start(qpx);
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_atomic_write(qpx, target.mr->rkey, target.addr() + 4, &word);
        CHECK(ibv_wr_complete(qpx) == EINVAL);
        CHECK(post_atomic_write(a.qp, src.addr(), 4, src.mr->lkey, false, target.addr(),
                                target.mr->rkey, 1) == EINVAL);
        CHECK(post_atomic_write(a.qp, src.addr(), 16, src.mr->lkey, false, target.addr(),
                                target.mr->rkey, 1) == EINVAL);
        ibv_wc wc{};
        CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
        CHECK(u64_at(target, 0) == 0);
        // A QP created without it cannot ask for it.
        ibv_qp* plain = create_qp_ex(a, IBV_QPT_RC, IBV_QP_EX_WITH_RDMA_WRITE);
        REQUIRE(plain);
        ibv_qp_ex* px = ibv_qp_to_qp_ex(plain);
        ibv_wr_start(px);
        ibv_wr_atomic_write(px, target.mr->rkey, target.addr(), &word);
        CHECK(ibv_wr_complete(px) == EINVAL);
        CHECK(ibv_destroy_qp(plain) == 0);
        // UC and XRC have no ATOMIC WRITE.
        errno = 0;
        CHECK(create_qp_ex(a, IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_WRITE) == nullptr);
        CHECK(errno == EOPNOTSUPP);
        errno = 0;
        CHECK(create_qp_ex(a, IBV_QPT_UD, IBV_QP_EX_WITH_ATOMIC_WRITE) == nullptr);
        CHECK(errno == EOPNOTSUPP);
        ibv_qp_init_attr uc_init{};
        uc_init.send_cq = uc_init.recv_cq = a.cq;
        uc_init.qp_type = IBV_QPT_UC;
        uc_init.cap.max_send_wr = uc_init.cap.max_recv_wr = 4;
        uc_init.cap.max_send_sge = uc_init.cap.max_recv_sge = 1;
        ibv_qp* uc = ibv_create_qp(a.pd, &uc_init);
        REQUIRE(uc);
        CHECK(post_atomic_write(uc, src.addr(), 8, src.mr->lkey, false, target.addr(),
                                target.mr->rkey, 1) == EINVAL);
        CHECK(ibv_destroy_qp(uc) == 0);
    }
    SECTION("the responder's QP does not allow remote write") {
        QpOptions opt, read_only;
        read_only.access =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        Endpoint a(devices().a, opt), b(devices().b, read_only);
        to_rts(a, b.qp->qp_num, b.gid, opt);
        to_rts(b, a.qp->qp_num, a.gid, read_only);
        Buffer src(a.pd, 64, kWriteAccess);
        Buffer target(b.pd, 64, kWriteAccess);
        REQUIRE(post_atomic_write(a.qp, src.addr(), 8, src.mr->lkey, false, target.addr(),
                                  target.mr->rkey, 1) == 0);
        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_REM_ACCESS_ERR);
        CHECK(u64_at(target, 0) == 0);
    }
    SECTION("the target region does not allow remote write (remote atomics are not enough)") {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer src(a.pd, 64, kWriteAccess);
        std::memset(src.bytes.data(), 0x5a, 64);
        Buffer target(b.pd, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
        REQUIRE(post_atomic_write(a.qp, src.addr(), 8, src.mr->lkey, false, target.addr(),
                                  target.mr->rkey, 1) == 0);
        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_REM_ACCESS_ERR);
        CHECK(u64_at(target, 0) == 0);
    }
    SECTION("past the end of the region, or a key that is not one") {
        const bool past_end = GENERATE(true, false);
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer src(a.pd, 64, kWriteAccess);
        std::memset(src.bytes.data(), 0x5a, 64);
        Buffer target(b.pd, 64, kWriteAccess);
        REQUIRE(post_atomic_write(a.qp, src.addr(), 8, src.mr->lkey, false,
                                  target.addr() + (past_end ? 64 : 0),
                                  target.mr->rkey + (past_end ? 0 : 0x100), 1) == 0);
        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_REM_ACCESS_ERR);
        for (size_t i = 0; i < 64; i += 8) CHECK(u64_at(target, i) == 0);
    }
    SECTION("the local buffer is not one of the PD's regions") {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer target(b.pd, 64, kWriteAccess);
        uint64_t word = 9;
        REQUIRE(post_atomic_write(a.qp, reinterpret_cast<uint64_t>(&word), 8, 0x7777, false,
                                  target.addr(), target.mr->rkey, 1) == 0);
        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_LOC_PROT_ERR);
        CHECK(u64_at(target, 0) == 0);
    }
}
