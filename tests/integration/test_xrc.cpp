// XRC through the real libibverbs: ibv_open_xrcd, XRC SRQs (ibv_create_srq_ex,
// ibv_get_srq_num), XRC send and receive QPs (ibv_create_qp_ex), requests that name their
// SRQ (wr.qp_type.xrc.remote_srqn and ibv_wr_set_xrc_srqn), and the verbs' error answers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC;

// A file to open XRC domains on, removed at the end.
struct DomainFile {
    std::string path;
    int fd = -1;
    DomainFile() {
        char tmpl[] = "/tmp/uroce-xrcd-XXXXXX";
        fd = ::mkstemp(tmpl);
        REQUIRE(fd >= 0);
        path = tmpl;
    }
    ~DomainFile() {
        ::close(fd);
        ::unlink(path.c_str());
    }
};

ibv_xrcd* open_xrcd(ibv_context* ctx, int fd, int oflags) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = fd;
    a.oflags = oflags;
    return ibv_open_xrcd(ctx, &a);
}

ibv_srq* xrc_srq(ibv_context* ctx, ibv_pd* pd, ibv_xrcd* xrcd, ibv_cq* cq, uint32_t max_wr = 32) {
    ibv_srq_init_attr_ex a{};
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 2;
    a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                  IBV_SRQ_INIT_ATTR_CQ;
    a.srq_type = IBV_SRQT_XRC;
    a.pd = pd;
    a.xrcd = xrcd;
    a.cq = cq;
    return ibv_create_srq_ex(ctx, &a);
}

ibv_qp* xrc_target(ibv_context* ctx, ibv_xrcd* xrcd) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_XRC_RECV;
    a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    a.xrcd = xrcd;
    return ibv_create_qp_ex(ctx, &a);
}

ibv_qp* xrc_initiator(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq, uint64_t send_ops = 0) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_XRC_SEND;
    a.send_cq = cq;
    a.cap.max_send_wr = 64;
    a.cap.max_send_sge = 2;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd;
    if (send_ops) {
        a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        a.send_ops_flags = send_ops;
    }
    return ibv_create_qp_ex(ctx, &a);
}

// ibv_close_xrcd, whose inline body in verbs.h trips -Wnull-dereference (verbs_get_ctx is
// null for contexts of providers older than verbs_context; ours never is).
int close_xrcd(ibv_xrcd* xrcd) {
    verbs_context* v = verbs_get_ctx(xrcd->context);
    REQUIRE(v);
    return v->close_xrcd(xrcd);
}

uint32_t srq_num(ibv_srq* srq) {
    uint32_t n = 0;
    REQUIRE(ibv_get_srq_num(srq, &n) == 0);
    return n;
}

int post_srq(ibv_srq* srq, const Buffer& b, size_t offset, size_t len, uint64_t wr_id) {
    ibv_sge sge{b.addr() + offset, static_cast<uint32_t>(len), b.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
}

int post_xrc(ibv_qp* qp, ibv_wr_opcode op, const Buffer& b, size_t offset, size_t len,
             uint32_t srqn, uint64_t wr_id, uint64_t remote_addr = 0, uint32_t rkey = 0) {
    ibv_sge sge{b.addr() + offset, static_cast<uint32_t>(len), b.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    wr.imm_data = htonl(0x5eed);
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

// Side a sends (an XRC initiator), side b receives (an XRC target in a domain on a file,
// with one XRC SRQ whose completions go to b's CQ).
struct XrcPair {
    DomainFile file;
    Endpoint a{devices().a};
    Endpoint b{devices().b};
    ibv_xrcd* xrcd = nullptr;
    ibv_srq* srq = nullptr;
    ibv_qp* ini = nullptr;
    ibv_qp* tgt = nullptr;

    explicit XrcPair(uint64_t send_ops = 0) {
        xrcd = open_xrcd(b.ctx, file.fd, O_CREAT);
        REQUIRE(xrcd);
        srq = xrc_srq(b.ctx, b.pd, xrcd, b.cq);
        REQUIRE(srq);
        tgt = xrc_target(b.ctx, xrcd);
        REQUIRE(tgt);
        ini = xrc_initiator(a.ctx, a.pd, a.cq, send_ops);
        REQUIRE(ini);
        to_rts(ini, tgt->qp_num, b.gid, QpOptions{});
        to_rts(tgt, ini->qp_num, a.gid, QpOptions{});
    }
    ~XrcPair() {
        if (ini) ibv_destroy_qp(ini);
        if (tgt) ibv_destroy_qp(tgt);
        if (srq) ibv_destroy_srq(srq);
        if (xrcd) close_xrcd(xrcd);
    }
    XrcPair(const XrcPair&) = delete;
    XrcPair& operator=(const XrcPair&) = delete;
};

}  // namespace

TEST_CASE("XRC: SEND, WRITE with immediate and READ through an XRC target into its SRQ", "[xrc]") {
    XrcPair x;
    Buffer src(x.a.pd, 64 * 1024, kAll);
    Buffer dst(x.b.pd, 64 * 1024, kAll);
    std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
    const uint32_t srqn = srq_num(x.srq);
    CHECK(srqn != 0);

    // A multi-packet SEND lands in the SRQ's WQE; its completion is on the SRQ's CQ and
    // names the target QP.
    REQUIRE(post_srq(x.srq, dst, 0, 8192, 1) == 0);
    fill_pattern(src.bytes.data(), 6000, 1);
    REQUIRE(post_xrc(x.ini, IBV_WR_SEND, src, 0, 6000, srqn, 10) == 0);
    auto rc = wait_completions(x.b.cq, 1);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].opcode == IBV_WC_RECV);
    CHECK(rc[0].wr_id == 1);
    CHECK(rc[0].byte_len == 6000);
    CHECK(rc[0].qp_num == x.tgt->qp_num);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 6000) == 0);
    CHECK(dst.bytes[6000] == 0xee);
    auto sc = wait_completions(x.a.cq, 1);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].wr_id == 10);

    // WRITE with immediate: the data where the rkey says, the immediate on a WQE of the SRQ.
    REQUIRE(post_srq(x.srq, dst, 0, 16, 2) == 0);
    fill_pattern(src.bytes.data(), 5000, 2);
    REQUIRE(post_xrc(x.ini, IBV_WR_RDMA_WRITE_WITH_IMM, src, 0, 5000, srqn, 11, dst.addr() + 10000,
                     dst.mr->rkey) == 0);
    rc = wait_completions(x.b.cq, 1);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(rc[0].wr_id == 2);
    CHECK((rc[0].wc_flags & IBV_WC_WITH_IMM) != 0);
    CHECK(ntohl(rc[0].imm_data) == 0x5eed);
    CHECK(std::memcmp(dst.bytes.data() + 10000, src.bytes.data(), 5000) == 0);
    REQUIRE(wait_completions(x.a.cq, 1).size() == 1);

    // READ back from the target side.
    fill_pattern(dst.bytes.data() + 20000, 7000, 3);
    REQUIRE(post_xrc(x.ini, IBV_WR_RDMA_READ, src, 30000, 7000, srqn, 12, dst.addr() + 20000,
                     dst.mr->rkey) == 0);
    sc = wait_completions(x.a.cq, 1);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_SUCCESS);
    CHECK(sc[0].opcode == IBV_WC_RDMA_READ);
    CHECK(std::memcmp(src.bytes.data() + 30000, dst.bytes.data() + 20000, 7000) == 0);
}

TEST_CASE("XRC: the ibv_wr_* API names the SRQ with ibv_wr_set_xrc_srqn", "[xrc]") {
    XrcPair x(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
    Buffer src(x.a.pd, 4096, kAll);
    Buffer dst(x.b.pd, 4096, kAll);
    REQUIRE(post_srq(x.srq, dst, 0, 4096, 7) == 0);
    fill_pattern(src.bytes.data(), 300, 4);
    ibv_qp_ex* qx = ibv_qp_to_qp_ex(x.ini);
    REQUIRE(qx);
    ibv_wr_start(qx);
    qx->wr_id = 77;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_imm(qx, htonl(0xabc));
    ibv_wr_set_xrc_srqn(qx, srq_num(x.srq));
    ibv_wr_set_sge(qx, src.mr->lkey, src.addr(), 300);
    REQUIRE(ibv_wr_complete(qx) == 0);
    const auto rc = wait_completions(x.b.cq, 1);
    REQUIRE(rc.size() == 1);
    CHECK(rc[0].status == IBV_WC_SUCCESS);
    CHECK(rc[0].wr_id == 7);
    CHECK(ntohl(rc[0].imm_data) == 0xabc);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 300) == 0);
    const auto sc = wait_completions(x.a.cq, 1);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].wr_id == 77);
}

TEST_CASE("XRC: a request naming an SRQ of another domain is refused and writes nothing", "[xrc]") {
    XrcPair x;
    // Another domain in the same context (fd -1: a private one), with an SRQ of its own.
    ibv_xrcd* other = open_xrcd(x.b.ctx, -1, 0);
    REQUIRE(other);
    ibv_srq* foreign = xrc_srq(x.b.ctx, x.b.pd, other, x.b.cq);
    REQUIRE(foreign);
    Buffer src(x.a.pd, 4096, kAll);
    Buffer dst(x.b.pd, 4096, kAll);
    std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
    REQUIRE(post_srq(foreign, dst, 0, 4096, 1) == 0);
    fill_pattern(src.bytes.data(), 100, 5);
    const uint64_t before = counter(x.b.ctx, "rx_bad_xrc_srq");
    REQUIRE(post_xrc(x.ini, IBV_WR_SEND, src, 0, 100, srq_num(foreign), 1) == 0);
    const auto sc = wait_completions(x.a.cq, 1);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_REM_INV_REQ_ERR);
    CHECK(counter(x.b.ctx, "rx_bad_xrc_srq") == before + 1);
    CHECK(dst.bytes[0] == 0xee);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(x.b.cq, 1, &wc) == 0);  // the foreign SRQ's WQE was not used
    CHECK(ibv_destroy_srq(foreign) == 0);
    CHECK(close_xrcd(other) == 0);
}

TEST_CASE("XRC: a WRITE's rkey is checked in the PD of the SRQ it names", "[xrc]") {
    XrcPair x;
    // A region in another PD of b's context than the SRQ's.
    ibv_pd* pd2 = ibv_alloc_pd(x.b.ctx);
    REQUIRE(pd2);
    {
        Buffer src(x.a.pd, 4096, kAll);
        Buffer dst(pd2, 4096, kAll);
        std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
        fill_pattern(src.bytes.data(), 64, 6);
        REQUIRE(post_xrc(x.ini, IBV_WR_RDMA_WRITE, src, 0, 64, srq_num(x.srq), 1, dst.addr(),
                         dst.mr->rkey) == 0);
        const auto sc = wait_completions(x.a.cq, 1);
        REQUIRE(sc.size() == 1);
        CHECK(sc[0].status == IBV_WC_REM_ACCESS_ERR);
        CHECK(dst.bytes[0] == 0xee);
        CHECK(dst.bytes[63] == 0xee);
    }
    CHECK(ibv_dealloc_pd(pd2) == 0);
}

// The kernel's XRC rows, after uverbs drops what an XRC QP does not use (a target's retry
// counts and READ credits, an initiator's RNR timer and responder resources): those are
// taken on any move and ignored.
TEST_CASE("XRC: modify_qp follows the kernel's XRC rows", "[xrc]") {
    XrcPair p;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.retry_cnt = 9;  // ignored, so not checked either
    CHECK(ibv_modify_qp(p.tgt, &attr, IBV_QP_STATE | IBV_QP_RETRY_CNT) == 0);
    attr = {};
    attr.qp_state = IBV_QPS_SQD;
    attr.max_dest_rd_atomic = 1;
    CHECK(ibv_modify_qp(p.ini, &attr, IBV_QP_STATE | IBV_QP_MAX_DEST_RD_ATOMIC) == 0);
    REQUIRE(ibv_modify_qp(p.tgt, &attr, IBV_QP_STATE) == 0);
    attr.cur_qp_state = IBV_QPS_SQD;
    CHECK(ibv_modify_qp(p.ini, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    CHECK(ibv_modify_qp(p.tgt, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    attr.port_num = 1;
    attr.timeout = 14;
    CHECK(ibv_modify_qp(p.ini, &attr, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_TIMEOUT) == 0);
    CHECK(ibv_modify_qp(p.tgt, &attr, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_TIMEOUT) == 0);
}

TEST_CASE("XRC: what the XRC verbs refuse", "[xrc]") {
    DomainFile file;
    Endpoint e(devices().a);
    SECTION("ibv_open_xrcd: no domain without O_CREAT, none twice with O_EXCL, bad fd") {
        errno = 0;
        CHECK(open_xrcd(e.ctx, file.fd, 0) == nullptr);
        CHECK(errno == EINVAL);
        ibv_xrcd* x = open_xrcd(e.ctx, file.fd, O_CREAT);
        REQUIRE(x);
        errno = 0;
        CHECK(open_xrcd(e.ctx, file.fd, O_CREAT | O_EXCL) == nullptr);
        CHECK(errno == EINVAL);
        // Opened again on the same file: the same domain (an SRQ made through one handle
        // is reached through a target QP made through the other).
        ibv_xrcd* again = open_xrcd(e.ctx, file.fd, 0);
        REQUIRE(again);
        CHECK(again->context == e.ctx);
        CHECK(close_xrcd(again) == 0);
        CHECK(close_xrcd(x) == 0);
        const int bad = ::open("/dev/null", O_RDONLY);
        REQUIRE(bad >= 0);
        ::close(bad);
        errno = 0;
        CHECK(open_xrcd(e.ctx, bad, O_CREAT) == nullptr);
        CHECK(errno == EBADF);
    }
    SECTION("a domain, an SRQ's CQ stay while the SRQ uses them") {
        ibv_xrcd* x = open_xrcd(e.ctx, file.fd, O_CREAT);
        REQUIRE(x);
        ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
        REQUIRE(cq);
        ibv_srq* srq = xrc_srq(e.ctx, e.pd, x, cq);
        REQUIRE(srq);
        CHECK(close_xrcd(x) == EBUSY);
        CHECK(ibv_destroy_cq(cq) == EBUSY);
        ibv_qp* tgt = xrc_target(e.ctx, x);
        REQUIRE(tgt);
        CHECK(ibv_destroy_srq(srq) == 0);
        CHECK(close_xrcd(x) == EBUSY);  // the target QP still uses it
        CHECK(ibv_destroy_qp(tgt) == 0);
        CHECK(close_xrcd(x) == 0);
        CHECK(ibv_destroy_cq(cq) == 0);
    }
    SECTION("XRC SRQs need a domain and a CQ; only they have a number") {
        ibv_xrcd* x = open_xrcd(e.ctx, file.fd, O_CREAT);
        REQUIRE(x);
        errno = 0;
        CHECK(xrc_srq(e.ctx, e.pd, x, nullptr) == nullptr);
        CHECK(errno == EINVAL);
        errno = 0;
        CHECK(xrc_srq(e.ctx, e.pd, nullptr, e.cq) == nullptr);
        CHECK(errno == EINVAL);
        ibv_srq_init_attr basic{};
        basic.attr.max_wr = 4;
        ibv_srq* plain = ibv_create_srq(e.pd, &basic);
        REQUIRE(plain);
        uint32_t n = 0;
        CHECK(ibv_get_srq_num(plain, &n) != 0);
        CHECK(ibv_destroy_srq(plain) == 0);
        CHECK(close_xrcd(x) == 0);
    }
    SECTION("XRC QPs: a target needs a domain; each half has one queue only") {
        ibv_qp_init_attr_ex a{};
        a.qp_type = IBV_QPT_XRC_RECV;
        a.comp_mask = IBV_QP_INIT_ATTR_PD;
        a.pd = e.pd;
        errno = 0;
        CHECK(ibv_create_qp_ex(e.ctx, &a) == nullptr);
        CHECK(errno == EINVAL);
        ibv_xrcd* x = open_xrcd(e.ctx, file.fd, O_CREAT);
        REQUIRE(x);
        ibv_qp* tgt = xrc_target(e.ctx, x);
        REQUIRE(tgt);
        CHECK(tgt->qp_type == IBV_QPT_XRC_RECV);
        ibv_qp* ini = xrc_initiator(e.ctx, e.pd, e.cq);
        REQUIRE(ini);
        CHECK(ini->qp_type == IBV_QPT_XRC_SEND);
        to_rts(ini, tgt->qp_num, e.gid, QpOptions{});
        to_rts(tgt, ini->qp_num, e.gid, QpOptions{});
        Buffer b(e.pd, 64, kAll);
        CHECK(post_recv_buf(ini, b, 0, 64, 1) == EINVAL);
        CHECK(post_recv_buf(tgt, b, 0, 64, 1) == EINVAL);
        CHECK(post_send_msg(tgt, b, 0, 64, 1) == EINVAL);
        CHECK(ibv_destroy_qp(ini) == 0);
        CHECK(ibv_destroy_qp(tgt) == 0);
        CHECK(close_xrcd(x) == 0);
    }
}

TEST_CASE("XRC: a destroyed SRQ takes nothing more, and its CQ can go at once", "[xrc]") {
    XrcPair x;
    Buffer src(x.a.pd, 4096, kAll);
    Buffer dst(x.b.pd, 4096, kAll);
    // A second SRQ with a CQ of its own receives one message.
    ibv_cq* cq2 = ibv_create_cq(x.b.ctx, 16, nullptr, nullptr, 0);
    REQUIRE(cq2);
    ibv_srq* srq2 = xrc_srq(x.b.ctx, x.b.pd, x.xrcd, cq2);
    REQUIRE(srq2);
    const uint32_t n2 = srq_num(srq2);
    REQUIRE(post_srq(srq2, dst, 0, 4096, 1) == 0);
    REQUIRE(post_srq(srq2, dst, 0, 4096, 2) == 0);
    fill_pattern(src.bytes.data(), 3000, 8);
    REQUIRE(post_xrc(x.ini, IBV_WR_SEND, src, 0, 3000, n2, 1) == 0);
    REQUIRE(wait_completions(cq2, 1).size() == 1);
    REQUIRE(wait_completions(x.a.cq, 1).size() == 1);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 3000) == 0);
    // The target holds the SRQ only while a message is open: both go at once.
    CHECK(ibv_destroy_srq(srq2) == 0);
    CHECK(ibv_destroy_cq(cq2) == 0);
    // A request naming it now names no SRQ: refused, and nothing is written.
    std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
    REQUIRE(post_xrc(x.ini, IBV_WR_SEND, src, 0, 100, n2, 2) == 0);
    const auto sc = wait_completions(x.a.cq, 1);
    REQUIRE(sc.size() == 1);
    CHECK(sc[0].status == IBV_WC_REM_INV_REQ_ERR);
    CHECK(dst.bytes[0] == 0xee);
}
