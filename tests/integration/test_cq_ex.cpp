// Extended CQs through the real libibverbs: ibv_create_cq_ex, the start/next/end polling API
// with its read_* accessors and completion timestamps, and what is refused.
#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

ibv_cq_ex* make_cq_ex(ibv_context* ctx, uint64_t wc_flags, ibv_comp_channel* channel = nullptr) {
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 64;
    attr.channel = channel;
    attr.wc_flags = wc_flags;
    return ibv_create_cq_ex(ctx, &attr);
}

}  // namespace

TEST_CASE("cq_ex: completions through start/next/end_poll, with timestamps", "[cq_ex]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_device_attr_ex dev{};
    REQUIRE(ibv_query_device_ex(b.ctx, nullptr, &dev) == 0);
    CHECK(dev.completion_timestamp_mask != 0);
    CHECK(dev.hca_core_clock != 0);
    ibv_cq_ex* cq = make_cq_ex(b.ctx, IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
                                          IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
                                          IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
    REQUIRE(cq);
    // b's QP reports its receives on the extended CQ.
    ibv_qp_init_attr init{};
    init.send_cq = b.cq;
    init.recv_cq = ibv_cq_ex_to_cq(cq);
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 16;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(b.pd, &init);
    REQUIRE(qp);
    ibv_destroy_qp(b.qp);
    b.qp = qp;
    connect(a, b);
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    for (int i = 0; i < 3; ++i) REQUIRE(post_recv_buf(b.qp, dst, 1024 * i, 1024, 10 + i) == 0);
    fill_pattern(src.bytes.data(), 4096, 6);
    REQUIRE(post_send_msg(a.qp, src, 0, 100, 1) == 0);
    REQUIRE(post_send_msg(a.qp, src, 100, 200, 2) == 0);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, src, 300, 300, dst.addr() + 3072,
                      dst.mr->rkey, 3) == 0);
    REQUIRE(wait_completions(a.cq, 3).size() == 3);

    // Poll until all three are there, then read them in one pass.
    ibv_poll_cq_attr pattr{};
    int ret = ENOENT;
    for (int i = 0; i < 20000 && ret == ENOENT; ++i) {
        ret = ibv_start_poll(cq, &pattr);
        if (ret == ENOENT) continue;
    }
    REQUIRE(ret == 0);
    uint32_t lens[3] = {};
    uint64_t ids[3] = {}, stamps[3] = {};
    ibv_wc_opcode ops[3] = {};
    int n = 0;
    for (;;) {
        REQUIRE(cq->status == IBV_WC_SUCCESS);
        ids[n] = cq->wr_id;
        lens[n] = ibv_wc_read_byte_len(cq);
        ops[n] = ibv_wc_read_opcode(cq);
        stamps[n] = ibv_wc_read_completion_ts(cq);
        CHECK(ibv_wc_read_qp_num(cq) == b.qp->qp_num);
        CHECK(ibv_wc_read_src_qp(cq) == a.qp->qp_num);
        CHECK(ibv_wc_read_sl(cq) == 0);  // only a UD receive (a GRH area) reports the L3 type
        if (ops[n] == IBV_WC_RECV_RDMA_WITH_IMM) {
            CHECK((ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_IMM) != 0);
        }
        ++n;
        if (n == 3) break;
        ret = ibv_next_poll(cq);
        for (int i = 0; i < 20000 && ret == ENOENT; ++i) ret = ibv_next_poll(cq);
        REQUIRE(ret == 0);
    }
    ibv_end_poll(cq);
    CHECK(ids[0] == 10);
    CHECK(lens[0] == 100);
    CHECK(ids[1] == 11);
    CHECK(lens[1] == 200);
    CHECK(ids[2] == 12);
    CHECK(ops[2] == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(lens[2] == 300);
    CHECK(stamps[0] != 0);
    CHECK(stamps[0] <= stamps[1]);
    CHECK(stamps[1] <= stamps[2]);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 100) == 0);
    CHECK(std::memcmp(dst.bytes.data() + 1024, src.bytes.data() + 100, 200) == 0);
    // Empty now.
    CHECK(ibv_start_poll(cq, &pattr) == ENOENT);
    // ibv_poll_cq works on the same CQ.
    ibv_wc wc{};
    CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc) == 0);

    ibv_values_ex values{};
    values.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    REQUIRE(ibv_query_rt_values_ex(b.ctx, &values) == 0);
    const uint64_t now = static_cast<uint64_t>(values.raw_clock.tv_sec) * 1000000000ull +
                         static_cast<uint64_t>(values.raw_clock.tv_nsec);
    CHECK(now >= stamps[2]);

    CHECK(ibv_destroy_qp(b.qp) == 0);
    b.qp = nullptr;
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("cq_ex: what create_cq_ex refuses", "[cq_ex]") {
    Endpoint a(devices().a);
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 16;
    attr.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;  // no flow steering here
    errno = 0;
    CHECK(ibv_create_cq_ex(a.ctx, &attr) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    attr.wc_flags = 0;
    attr.cqe = 0;
    errno = 0;
    CHECK(ibv_create_cq_ex(a.ctx, &attr) == nullptr);
    CHECK(errno == EINVAL);
    // With a completion channel: events arrive, and the channel is free again after.
    ibv_comp_channel* ch = ibv_create_comp_channel(a.ctx);
    REQUIRE(ch);
    ibv_cq_ex* cq = make_cq_ex(a.ctx, 0, ch);
    REQUIRE(cq);
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("parent domains: objects made in one belong to its PD", "[cq_ex][pd]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_parent_domain_init_attr pattr{};
    pattr.pd = b.pd;
    ibv_pd* parent = ibv_alloc_parent_domain(b.ctx, &pattr);
    REQUIRE(parent);
    CHECK(ibv_dealloc_pd(b.pd) == EBUSY);  // the parent domain holds it
    // A parent domain of a parent domain, or of another context's PD, is refused.
    ibv_parent_domain_init_attr nested{};
    nested.pd = parent;
    errno = 0;
    CHECK(ibv_alloc_parent_domain(b.ctx, &nested) == nullptr);
    CHECK(errno == EINVAL);
    nested.pd = a.pd;
    CHECK(ibv_alloc_parent_domain(b.ctx, &nested) == nullptr);
    // A CQ naming the parent domain, a QP and an MR made in it.
    ibv_cq_init_attr_ex cattr{};
    cattr.cqe = 16;
    cattr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    cattr.parent_domain = parent;
    ibv_cq_ex* cq = ibv_create_cq_ex(b.ctx, &cattr);
    REQUIRE(cq);
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = ibv_cq_ex_to_cq(cq);
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(parent, &init);
    REQUIRE(qp);
    ibv_destroy_qp(b.qp);
    b.qp = qp;
    connect(a, b);
    Buffer src(a.pd, 4096, kAll), dst(parent, 4096, kAll);
    fill_pattern(src.bytes.data(), 4096, 21);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, dst.addr(), dst.mr->rkey, 1) == 0);
    const auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 4096) == 0);
    // An MR of the wrapped PD serves the QP of the parent domain too: same protection domain.
    Buffer same(b.pd, 64, kAll);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 64, same.addr(), same.mr->rkey, 2) == 0);
    const auto wcs2 = wait_completions(a.cq, 1);
    REQUIRE(wcs2.size() == 1);
    CHECK(wcs2[0].status == IBV_WC_SUCCESS);
    CHECK(ibv_destroy_qp(b.qp) == 0);
    b.qp = nullptr;
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
    CHECK(ibv_dealloc_pd(parent) == EBUSY);  // dst's MR is in it
}

// ibv_wc_read_invalidated_rkey(3) returns what read_imm_data returns, unconverted: the
// invalidated rkey must come back in host order, as ibv_poll_cq's invalidated_rkey does (the
// immediate data alone is in network order).
TEST_CASE("cq_ex: ibv_wc_read_invalidated_rkey names the rkey a SEND with invalidate took",
          "[cq_ex][mw]") {
    QpOptions opt;
    opt.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ibv_cq_ex* cq = make_cq_ex(b.ctx, IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM);
    REQUIRE(cq);
    ibv_qp_init_attr init{};
    init.send_cq = b.cq;
    init.recv_cq = ibv_cq_ex_to_cq(cq);
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 16;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(b.pd, &init);
    REQUIRE(qp);
    ibv_destroy_qp(b.qp);
    b.qp = qp;
    connect(a, b, opt);
    Buffer src(a.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    Buffer dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    REQUIRE(mw);
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    ibv_send_wr bind{};
    bind.wr_id = 1;
    bind.opcode = IBV_WR_BIND_MW;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_mw.mw = mw;
    bind.bind_mw.rkey = rkey;
    bind.bind_mw.bind_info.mr = dst.mr;
    bind.bind_mw.bind_info.addr = dst.addr();
    bind.bind_mw.bind_info.length = 1024;
    bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(b.qp, &bind, &bad) == 0);
    REQUIRE(wait_completions(b.cq, 1).size() == 1);
    REQUIRE(post_recv_buf(b.qp, dst, 2048, 64, 2) == 0);
    ibv_sge sge{src.addr(), 16, src.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 3;
    wr.opcode = IBV_WR_SEND_WITH_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    REQUIRE(wait_completions(a.cq, 1).size() == 1);

    ibv_poll_cq_attr pattr{};
    int ret = ENOENT;
    for (int i = 0; i < 20000 && ret == ENOENT; ++i) ret = ibv_start_poll(cq, &pattr);
    REQUIRE(ret == 0);
    CHECK(cq->status == IBV_WC_SUCCESS);
    CHECK(cq->wr_id == 2);
    CHECK((ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_INV) != 0);
    CHECK(ibv_wc_read_invalidated_rkey(cq) == rkey);
    CHECK(ibv_wc_read_byte_len(cq) == 16);
    ibv_end_poll(cq);
    CHECK(ibv_destroy_qp(b.qp) == 0);
    b.qp = nullptr;
    CHECK(ibv_dealloc_mw(mw) == 0);
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}
