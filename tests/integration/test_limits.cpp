// Device limits through the real libibverbs: what ibv_query_device advertises is what the
// provider enforces, with the errno rxe gives; memory registrations that wrap are refused;
// identifiers are unpredictable; a CQ overrun is reported, never silent.
#include <fcntl.h>
#include <poll.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <set>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

// An int, not the enum: libibverbs' ibv_reg_mr macro ANDs it with another enum type, which
// clang refuses (-Wdeprecated-enum-enum-conversion).
constexpr int kLocalWriteOnly = IBV_ACCESS_LOCAL_WRITE;

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

ibv_device_attr_ex query(ibv_context* ctx) {
    ibv_device_attr_ex attr{};
    REQUIRE(ibv_query_device_ex(ctx, nullptr, &attr) == 0);
    return attr;
}

struct Context {
    ibv_context* ctx;
    explicit Context(const std::string& name) : ctx(open_device(name)) {}
    ~Context() { ibv_close_device(ctx); }
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
};

ibv_qp* create_rc_qp(ibv_pd* pd, ibv_cq* cq, uint32_t wr = 1) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = wr;
    init.cap.max_recv_wr = wr;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    return ibv_create_qp(pd, &init);
}

bool readable(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

}  // namespace

TEST_CASE("the device reports a vendor, one port and rxe's rd_atomic limits", "[limits]") {
    Context c(devices().a);
    const ibv_device_attr_ex a = query(c.ctx);
    CHECK(a.orig_attr.vendor_id == 0xffffff);
    CHECK(a.orig_attr.vendor_part_id != 0);
    CHECK(a.orig_attr.max_qp_rd_atom == 128);
    CHECK(a.orig_attr.max_qp_init_rd_atom == 128);
    CHECK(a.phys_port_cnt_ex == 1);
    CHECK(a.orig_attr.phys_port_cnt == 1);
    CHECK(a.orig_attr.max_mr_size < (uint64_t{1} << 47));
}

TEST_CASE("max_rd_atomic and max_dest_rd_atomic up to the advertised 128", "[limits]") {
    Endpoint a(devices().a), b(devices().b);
    const int advertised = query(a.ctx).orig_attr.max_qp_rd_atom;
    REQUIRE(advertised == 128);
    for (Endpoint* e : {&a, &b}) {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
        REQUIRE(ibv_modify_qp(
                    e->qp, &attr,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    }
    auto rtr = [](Endpoint& local, Endpoint& remote, int dest_rd_atomic) {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_RTR;
        attr.path_mtu = IBV_MTU_1024;
        attr.dest_qp_num = remote.qp->qp_num;
        attr.rq_psn = 1;
        attr.max_dest_rd_atomic = static_cast<uint8_t>(dest_rd_atomic);
        attr.min_rnr_timer = 1;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = remote.gid;
        attr.ah_attr.port_num = 1;
        return ibv_modify_qp(local.qp, &attr,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    };
    auto rts = [](Endpoint& local, int rd_atomic) {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_RTS;
        attr.sq_psn = 1;
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = static_cast<uint8_t>(rd_atomic);
        return ibv_modify_qp(local.qp, &attr,
                             IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    };
    // Above what the device advertises: refused, and nothing changes.
    CHECK(rtr(a, b, advertised + 1) == EINVAL);
    CHECK(a.state() == IBV_QPS_INIT);
    REQUIRE(rtr(a, b, advertised) == 0);
    REQUIRE(rtr(b, a, advertised) == 0);
    CHECK(rts(a, advertised + 1) == EINVAL);
    REQUIRE(rts(a, advertised) == 0);
    REQUIRE(rts(b, advertised) == 0);
    ibv_qp_attr got{};
    ibv_qp_init_attr init{};
    REQUIRE(ibv_query_qp(a.qp, &got, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &init) ==
            0);
    CHECK(got.max_rd_atomic == advertised);
    CHECK(got.max_dest_rd_atomic == advertised);

    // The connection works with that many READs allowed in flight.
    Buffer local(a.pd, 64 * 1024, kAll), remote(b.pd, 64 * 1024, kAll);
    fill_pattern(remote.bytes.data(), remote.bytes.size(), 9);
    for (int i = 0; i < 32; ++i)
        REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, local, i * 2048, 2048, remote.addr() + i * 2048,
                          remote.mr->rkey, i) == 0);
    const auto wcs = wait_completions(a.cq, 32);
    REQUIRE(wcs.size() == 32);
    for (const ibv_wc& wc : wcs) CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(local.bytes == remote.bytes);
}

TEST_CASE("ibv_create_cq refuses a comp_vector the device does not have", "[limits]") {
    Context c(devices().a);
    REQUIRE(c.ctx->num_comp_vectors == 1);
    errno = 0;
    CHECK(ibv_create_cq(c.ctx, 4, nullptr, nullptr, 1) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(ibv_create_cq(c.ctx, 4, nullptr, nullptr, -1) == nullptr);
    CHECK(errno == EINVAL);
    ibv_cq* cq = ibv_create_cq(c.ctx, 4, nullptr, nullptr, 0);
    REQUIRE(cq);
    CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("object counts stop at the advertised limits with EINVAL", "[limits]") {
    Context c(devices().a);
    const ibv_device_attr& d = query(c.ctx).orig_attr;
    ibv_pd* pd = ibv_alloc_pd(c.ctx);
    REQUIRE(pd);

    SECTION("max_cq") {
        std::vector<ibv_cq*> cqs;
        for (int i = 0; i < d.max_cq; ++i) {
            ibv_cq* cq = ibv_create_cq(c.ctx, 1, nullptr, nullptr, 0);
            if (!cq) break;
            cqs.push_back(cq);
        }
        // The PD's context holds no other CQ.
        CHECK(cqs.size() == static_cast<size_t>(d.max_cq));
        errno = 0;
        CHECK(ibv_create_cq(c.ctx, 1, nullptr, nullptr, 0) == nullptr);
        CHECK(errno == EINVAL);
        REQUIRE(ibv_destroy_cq(cqs.back()) == 0);
        cqs.pop_back();
        ibv_cq* again = ibv_create_cq(c.ctx, 1, nullptr, nullptr, 0);
        CHECK(again);
        if (again) cqs.push_back(again);
        for (ibv_cq* cq : cqs) ibv_destroy_cq(cq);
    }
    SECTION("max_qp") {
        ibv_cq* cq = ibv_create_cq(c.ctx, 16, nullptr, nullptr, 0);
        REQUIRE(cq);
        std::vector<ibv_qp*> qps;
        std::set<uint32_t> qpns;
        for (int i = 0; i < d.max_qp; ++i) {
            ibv_qp* qp = create_rc_qp(pd, cq);
            if (!qp) break;
            qps.push_back(qp);
            qpns.insert(qp->qp_num);
        }
        CHECK(qps.size() == static_cast<size_t>(d.max_qp));
        CHECK(qpns.size() == qps.size());
        errno = 0;
        CHECK(create_rc_qp(pd, cq) == nullptr);
        CHECK(errno == EINVAL);
        REQUIRE(ibv_destroy_qp(qps.back()) == 0);
        qps.pop_back();
        ibv_qp* again = create_rc_qp(pd, cq);
        CHECK(again);
        if (again) qps.push_back(again);
        for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
        ibv_destroy_cq(cq);
    }
    SECTION("max_pd") {
        std::vector<ibv_pd*> pds;
        for (int i = 1; i < d.max_pd; ++i) {  // one is taken above
            ibv_pd* p = ibv_alloc_pd(c.ctx);
            if (!p) break;
            pds.push_back(p);
        }
        CHECK(pds.size() == static_cast<size_t>(d.max_pd - 1));
        errno = 0;
        CHECK(ibv_alloc_pd(c.ctx) == nullptr);
        CHECK(errno == EINVAL);
        for (ibv_pd* p : pds) ibv_dealloc_pd(p);
    }
    SECTION("max_mr") {
        static uint8_t byte;
        std::vector<ibv_mr*> mrs;
        for (int i = 0; i < d.max_mr; ++i) {
            ibv_mr* mr = ibv_reg_mr(pd, &byte, 1, kLocalWriteOnly);
            if (!mr) break;
            mrs.push_back(mr);
        }
        CHECK(mrs.size() == static_cast<size_t>(d.max_mr));
        errno = 0;
        CHECK(ibv_reg_mr(pd, &byte, 1, kLocalWriteOnly) == nullptr);
        CHECK(errno == EINVAL);
        for (ibv_mr* mr : mrs) ibv_dereg_mr(mr);
    }
    SECTION("per-QP and per-CQ sizes") {
        errno = 0;
        CHECK(ibv_create_cq(c.ctx, d.max_cqe + 1, nullptr, nullptr, 0) == nullptr);
        CHECK(errno == EINVAL);
        ibv_cq* cq = ibv_create_cq(c.ctx, d.max_cqe, nullptr, nullptr, 0);
        REQUIRE(cq);
        ibv_qp_init_attr init{};
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        auto refused = [&](auto tweak) {
            ibv_qp_init_attr i = init;
            i.cap = {1, 1, 1, 1, 0};
            tweak(i.cap);
            errno = 0;
            ibv_qp* qp = ibv_create_qp(pd, &i);
            if (qp) ibv_destroy_qp(qp);
            return !qp && errno == EINVAL;
        };
        CHECK(refused([&](ibv_qp_cap& k) { k.max_send_wr = d.max_qp_wr + 1; }));
        CHECK(refused([&](ibv_qp_cap& k) { k.max_recv_wr = d.max_qp_wr + 1; }));
        CHECK(refused([&](ibv_qp_cap& k) { k.max_send_sge = d.max_sge + 1; }));
        CHECK(refused([&](ibv_qp_cap& k) { k.max_recv_sge = d.max_sge + 1; }));
        ibv_qp_attr qa{};
        ibv_qp_init_attr qi{};
        Endpoint e(devices().b);
        REQUIRE(ibv_query_qp(e.qp, &qa, IBV_QP_CAP, &qi) == 0);
        CHECK(refused([&](ibv_qp_cap& k) { k.max_inline_data = qa.cap.max_inline_data + 1; }));
        CHECK_FALSE(refused([&](ibv_qp_cap& k) {
            k.max_send_wr = d.max_qp_wr;
            k.max_send_sge = d.max_sge;
        }));
        ibv_destroy_cq(cq);
    }
    ibv_dealloc_pd(pd);
}

TEST_CASE("ibv_reg_mr refuses oversized and wrapping ranges", "[limits]") {
    Context c(devices().a);
    ibv_pd* pd = ibv_alloc_pd(c.ctx);
    REQUIRE(pd);
    const uint64_t max_mr_size = query(c.ctx).orig_attr.max_mr_size;
    std::vector<uint8_t> buf(4096);
    auto refused = [&](void* addr, size_t len, uint64_t iova) {
        errno = 0;
        ibv_mr* mr = ibv_reg_mr_iova(pd, addr, len, iova, kLocalWriteOnly);
        if (mr) ibv_dereg_mr(mr);
        return !mr && errno == EINVAL;
    };
    CHECK(refused(buf.data(), size_t{1} << 62, reinterpret_cast<uint64_t>(buf.data())));
    CHECK(refused(buf.data(), max_mr_size + 1, 0x1000));
    // The buffer runs past 2^64.
    CHECK(refused(reinterpret_cast<void*>(UINT64_MAX - 0xfff), 0x2000, 0x1000));
    // The iova range runs past 2^64: a remote va near it would map outside the buffer.
    CHECK(refused(buf.data(), buf.size(), UINT64_MAX - 0x7ff));
    // A sane one still works.
    ibv_mr* mr = ibv_reg_mr_iova(pd, buf.data(), buf.size(), UINT64_MAX - 0xfff, kLocalWriteOnly);
    CHECK(mr);
    if (mr) ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
}

TEST_CASE("ibv_reg_mr takes IBV_ACCESS_MW_BIND; the device reports memory windows", "[limits]") {
    Context c(devices().a);
    ibv_pd* pd = ibv_alloc_pd(c.ctx);
    REQUIRE(pd);
    std::vector<uint8_t> buf(1024);
    constexpr int kWithBind = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
    ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), kWithBind);
    CHECK(mr);
    if (mr) ibv_dereg_mr(mr);
    ibv_device_attr d{};
    REQUIRE(ibv_query_device(c.ctx, &d) == 0);
    CHECK((d.device_cap_flags & IBV_DEVICE_MEM_WINDOW) != 0);
    CHECK((d.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0);
    CHECK(d.max_mw > 0);
    ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    CHECK(mw != nullptr);
    CHECK(ibv_dealloc_pd(pd) == EBUSY);  // the window is in it
    if (mw) ibv_dealloc_mw(mw);
    ibv_dealloc_pd(pd);
}

TEST_CASE("QPNs and key bytes differ between contexts and registrations", "[limits]") {
    std::set<uint32_t> qpns;
    std::set<uint8_t> lkey_bytes, rkey_bytes;
    static uint8_t byte;
    for (int i = 0; i < 8; ++i) {
        Context c(devices().c);
        ibv_pd* pd = ibv_alloc_pd(c.ctx);
        ibv_cq* cq = ibv_create_cq(c.ctx, 4, nullptr, nullptr, 0);
        REQUIRE(pd);
        REQUIRE(cq);
        ibv_qp* qp = create_rc_qp(pd, cq);
        REQUIRE(qp);
        CHECK(qp->qp_num > 1);
        qpns.insert(qp->qp_num);
        ibv_mr* mr = ibv_reg_mr(pd, &byte, 1, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        REQUIRE(mr);
        lkey_bytes.insert(static_cast<uint8_t>(mr->lkey));
        rkey_bytes.insert(static_cast<uint8_t>(mr->rkey));
        ibv_dereg_mr(mr);
        ibv_destroy_qp(qp);
        ibv_destroy_cq(cq);
        ibv_dealloc_pd(pd);
    }
    CHECK(qpns.size() > 1);
    CHECK(lkey_bytes.size() > 1);
    CHECK(rkey_bytes.size() > 1);
}

TEST_CASE("a CQ overrun raises IBV_EVENT_CQ_ERR and moves the QP to ERR", "[limits]") {
    Endpoint a(devices().a), b(devices().b);
    // b's only CQ holds 4 completions, and nobody polls it.
    ibv_destroy_qp(b.qp);
    ibv_destroy_cq(b.cq);
    b.cq = ibv_create_cq(b.ctx, 4, nullptr, nullptr, 0);
    REQUIRE(b.cq);
    b.qp = create_rc_qp(b.pd, b.cq, 16);
    REQUIRE(b.qp);
    connect(a, b);
    constexpr int kMessages = 8;
    constexpr size_t kLen = 100, kSlot = 256;
    Buffer sbuf(a.pd, kMessages * kLen, kAll), rbuf(b.pd, kMessages * kSlot, kAll);
    fill_pattern(sbuf.bytes.data(), sbuf.bytes.size(), 3);
    std::fill(rbuf.bytes.begin(), rbuf.bytes.end(), 0xee);
    for (int i = 0; i < kMessages; ++i)
        REQUIRE(post_recv_buf(b.qp, rbuf, i * kSlot, kLen, 100 + i) == 0);
    for (int i = 0; i < kMessages; ++i) REQUIRE(post_send_msg(a.qp, sbuf, i * kLen, kLen, i) == 0);

    const auto sent = wait_completions(a.cq, kMessages);
    REQUIRE(sent.size() == kMessages);
    for (int i = 0; i < kMessages; ++i) {
        INFO("send " << i << ": " << ibv_wc_status_str(sent[i].status));
        CHECK(sent[i].wr_id == static_cast<uint64_t>(i));
        // Success only for the messages whose receive completion b's CQ holds.
        CHECK((sent[i].status == IBV_WC_SUCCESS) == (i < 4));
    }
    CHECK(sent[4].status == IBV_WC_REM_OP_ERR);
    CHECK(b.state() == IBV_QPS_ERR);

    // The asynchronous events: the CQ error and the QP's fatal error.
    bool cq_err = false, qp_fatal = false;
    for (int n = 0; n < 8 && readable(b.ctx->async_fd, 2000); ++n) {
        ibv_async_event ev{};
        REQUIRE(ibv_get_async_event(b.ctx, &ev) == 0);
        if (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == b.cq) cq_err = true;
        if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == b.qp) qp_fatal = true;
        ibv_ack_async_event(&ev);
        if (cq_err && qp_fatal) break;
    }
    CHECK(cq_err);
    CHECK(qp_fatal);

    // Exactly the completions that fit, with their data; nothing after them.
    ibv_wc wc[16];
    REQUIRE(ibv_poll_cq(b.cq, 16, wc) == 4);
    for (int i = 0; i < 4; ++i) {
        CHECK(wc[i].wr_id == static_cast<uint64_t>(100 + i));
        CHECK(wc[i].status == IBV_WC_SUCCESS);
        CHECK(wc[i].byte_len == kLen);
        CHECK(std::equal(sbuf.bytes.begin() + i * kLen, sbuf.bytes.begin() + (i + 1) * kLen,
                         rbuf.bytes.begin() + i * kSlot));
        CHECK(std::all_of(rbuf.bytes.begin() + i * kSlot + kLen,
                          rbuf.bytes.begin() + (i + 1) * kSlot,
                          [](uint8_t v) { return v == 0xee; }));
    }
    CHECK(ibv_poll_cq(b.cq, 16, wc) == 0);
    CHECK(counter(b.ctx, "cq_overruns") >= 1);
}
