// Shared receive queues through the real libibverbs: several connections feeding one SRQ,
// the limit event, RNR while it is empty, Last WQE Reached, and the verbs' error answers.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kSlot = 4096;

ibv_srq* make_srq(ibv_pd* pd, uint32_t max_wr, uint32_t max_sge = 4) {
    ibv_srq_init_attr init{};
    init.attr.max_wr = max_wr;
    init.attr.max_sge = max_sge;
    return ibv_create_srq(pd, &init);
}

ibv_qp* make_qp_on_srq(ibv_pd* pd, ibv_cq* cq, ibv_srq* srq) {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.srq = srq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 64;
    init.cap.max_send_sge = 4;
    return ibv_create_qp(pd, &init);
}

int post_srq_buf(ibv_srq* srq, const Buffer& b, size_t offset, size_t len, uint64_t wr_id) {
    ibv_sge sge{b.addr() + offset, static_cast<uint32_t>(len), b.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
}

// The receiving side: a context whose QPs all take their receives from one SRQ, each
// connected to its own peer Endpoint on the other device.
struct SrqSide {
    Endpoint ep;  // context, PD, CQ (its own QP is not used)
    ibv_srq* srq = nullptr;
    std::vector<ibv_qp*> qps;
    std::vector<std::unique_ptr<Endpoint>> peers;

    SrqSide(size_t n_qps, uint32_t max_wr) : ep(devices().b) {
        srq = make_srq(ep.pd, max_wr);
        REQUIRE(srq);
        for (size_t i = 0; i < n_qps; ++i) {
            ibv_qp* qp = make_qp_on_srq(ep.pd, ep.cq, srq);
            REQUIRE(qp);
            qps.push_back(qp);
            peers.push_back(std::make_unique<Endpoint>(devices().a));
            Endpoint& peer = *peers.back();
            to_rts(qp, peer.qp->qp_num, peer.gid, QpOptions{});
            to_rts(peer, qp->qp_num, ep.gid, QpOptions{});
        }
    }
    ~SrqSide() {
        for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
        if (srq) ibv_destroy_srq(srq);
    }
    SrqSide(const SrqSide&) = delete;
    SrqSide& operator=(const SrqSide&) = delete;
};

bool async_queue_empty(ibv_context* ctx) {
    return !wait_readable(ctx->async_fd, std::chrono::milliseconds(0));
}

}  // namespace

TEST_CASE("SRQ: messages of several connections land in one SRQ, each intact", "[srq]") {
    constexpr size_t kQps = 3;
    constexpr size_t kPerQp = 6;
    SrqSide rx(kQps, 64);
    Buffer in(rx.ep.pd, kSlot * kQps * kPerQp, kAll);
    for (size_t i = 0; i < kQps * kPerQp; ++i)
        REQUIRE(post_srq_buf(rx.srq, in, i * kSlot, kSlot, 1000 + i) == 0);
    // Each message starts with its sender and sequence number, then a pattern of its own.
    std::vector<std::unique_ptr<Buffer>> out;
    for (size_t q = 0; q < kQps; ++q) {
        out.push_back(std::make_unique<Buffer>(rx.peers[q]->pd, kSlot * kPerQp, kAll));
        for (size_t m = 0; m < kPerQp; ++m) {
            uint8_t* msg = out[q]->bytes.data() + m * kSlot;
            const size_t len = 64 + 500 * m + 7 * q;
            fill_pattern(msg, len, q * 100 + m);
            msg[0] = static_cast<uint8_t>(q);
            msg[1] = static_cast<uint8_t>(m);
            REQUIRE(post_send_msg(rx.peers[q]->qp, *out[q], m * kSlot, len, m) == 0);
        }
    }
    const auto wcs = wait_completions(rx.ep.cq, kQps * kPerQp);
    REQUIRE(wcs.size() == kQps * kPerQp);
    std::set<uint64_t> wr_ids;
    std::map<uint32_t, int> next_seq;  // per QP: RC keeps each connection's order
    for (const ibv_wc& wc : wcs) {
        REQUIRE(wc.status == IBV_WC_SUCCESS);
        CHECK(wc.opcode == IBV_WC_RECV);
        REQUIRE(wc.wr_id >= 1000);
        REQUIRE(wc.wr_id < 1000 + kQps * kPerQp);
        wr_ids.insert(wc.wr_id);
        const uint8_t* got = in.bytes.data() + (wc.wr_id - 1000) * kSlot;
        const size_t q = got[0];
        const size_t m = got[1];
        REQUIRE(q < kQps);
        REQUIRE(m < kPerQp);
        CHECK(wc.qp_num == rx.qps[q]->qp_num);
        CHECK(static_cast<int>(m) == next_seq[wc.qp_num]++);
        const size_t len = 64 + 500 * m + 7 * q;
        CHECK(wc.byte_len == len);
        CHECK(std::memcmp(got, out[q]->bytes.data() + m * kSlot, len) == 0);
    }
    CHECK(wr_ids.size() == kQps * kPerQp);  // every WQE used exactly once
    for (auto& peer : rx.peers) {
        const auto s = wait_completions(peer->cq, kPerQp);
        REQUIRE(s.size() == kPerQp);
        for (const ibv_wc& wc : s) CHECK(wc.status == IBV_WC_SUCCESS);
    }
}

TEST_CASE("SRQ: the limit event fires once, when fewer WQEs than the limit remain", "[srq]") {
    SrqSide rx(1, 16);
    Buffer in(rx.ep.pd, kSlot * 4, kAll);
    Buffer out(rx.peers[0]->pd, kSlot, kAll);
    for (int i = 0; i < 4; ++i) REQUIRE(post_srq_buf(rx.srq, in, i * kSlot, kSlot, i) == 0);
    ibv_srq_attr attr{};
    attr.srq_limit = 3;
    REQUIRE(ibv_modify_srq(rx.srq, &attr, IBV_SRQ_LIMIT) == 0);
    attr = {};
    REQUIRE(ibv_query_srq(rx.srq, &attr) == 0);
    CHECK(attr.srq_limit == 3);
    CHECK(attr.max_wr == 16);

    auto receive_one = [&](uint64_t id) {
        REQUIRE(post_send_msg(rx.peers[0]->qp, out, 0, 100, id) == 0);
        const auto wcs = wait_completions(rx.ep.cq, 1);
        REQUIRE(wcs.size() == 1);
        REQUIRE(wcs[0].status == IBV_WC_SUCCESS);
        REQUIRE(wait_completions(rx.peers[0]->cq, 1).size() == 1);
    };
    // The event is posted before the completion that took the WQE, so once the completion
    // is here, an event that is not queued never will be.
    receive_one(1);  // 3 left: not below the limit
    CHECK(async_queue_empty(rx.ep.ctx));
    receive_one(2);  // 2 left
    ibv_async_event ev{};
    REQUIRE(get_async_event_within(rx.ep.ctx, &ev) == 0);
    CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED);
    CHECK(ev.element.srq == rx.srq);
    ibv_ack_async_event(&ev);
    // Disarmed by the event: the application arms it again if it wants another.
    attr = {};
    REQUIRE(ibv_query_srq(rx.srq, &attr) == 0);
    CHECK(attr.srq_limit == 0);
    receive_one(3);
    CHECK(async_queue_empty(rx.ep.ctx));
}

TEST_CASE("SRQ: an empty SRQ holds the sender back (RNR) until a WQE is posted", "[srq]") {
    SrqSide rx(1, 16);
    Buffer in(rx.ep.pd, kSlot, kAll);
    Buffer out(rx.peers[0]->pd, kSlot, kAll);
    fill_pattern(out.bytes.data(), 3000, 77);
    const uint64_t rnr_before = counter(rx.ep.ctx, "tx_rnr_naks");
    REQUIRE(post_send_msg(rx.peers[0]->qp, out, 0, 3000, 1) == 0);
    bool rnr = false;
    for (int i = 0; i < 2000 && !rnr; ++i) {
        rnr = counter(rx.ep.ctx, "tx_rnr_naks") > rnr_before;
        if (!rnr) wait_completions(rx.ep.cq, 1, std::chrono::milliseconds(5));
    }
    REQUIRE(rnr);
    REQUIRE(post_srq_buf(rx.srq, in, 0, kSlot, 9) == 0);
    const auto wcs = wait_completions(rx.ep.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(wcs[0].wr_id == 9);
    CHECK(wcs[0].byte_len == 3000);
    CHECK(std::memcmp(in.bytes.data(), out.bytes.data(), 3000) == 0);
    const auto s = wait_completions(rx.peers[0]->cq, 1);
    REQUIRE(s.size() == 1);
    CHECK(s[0].status == IBV_WC_SUCCESS);
}

TEST_CASE("SRQ: a QP moved to ERR reports Last WQE Reached; its SRQ serves the others", "[srq]") {
    SrqSide rx(2, 16);
    Buffer in(rx.ep.pd, kSlot * 2, kAll);
    Buffer out(rx.peers[1]->pd, kSlot, kAll);
    REQUIRE(post_srq_buf(rx.srq, in, 0, kSlot, 1) == 0);
    REQUIRE(post_srq_buf(rx.srq, in, kSlot, kSlot, 2) == 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    REQUIRE(ibv_modify_qp(rx.qps[0], &a, IBV_QP_STATE) == 0);
    ibv_async_event ev{};
    REQUIRE(get_async_event_within(rx.ep.ctx, &ev) == 0);
    CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED);
    CHECK(ev.element.qp == rx.qps[0]);
    ibv_ack_async_event(&ev);
    // The SRQ's WQEs were not the failed QP's to flush.
    ibv_wc wc{};
    CHECK(ibv_poll_cq(rx.ep.cq, 1, &wc) == 0);
    fill_pattern(out.bytes.data(), 200, 5);
    REQUIRE(post_send_msg(rx.peers[1]->qp, out, 0, 200, 1) == 0);
    const auto wcs = wait_completions(rx.ep.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(wcs[0].wr_id == 1);
    CHECK(wcs[0].qp_num == rx.qps[1]->qp_num);
    CHECK(std::memcmp(in.bytes.data(), out.bytes.data(), 200) == 0);
}

TEST_CASE("SRQ: verbs refuse what they cannot do", "[srq]") {
    Endpoint ep(devices().a);
    ibv_srq_init_attr init{};
    SECTION("create: no WQEs, too many WQEs, too many SGEs") {
        init.attr.max_wr = 0;
        init.attr.max_sge = 1;
        errno = 0;
        CHECK(ibv_create_srq(ep.pd, &init) == nullptr);
        CHECK(errno == EINVAL);
        init.attr.max_wr = 16385;
        errno = 0;
        CHECK(ibv_create_srq(ep.pd, &init) == nullptr);
        CHECK(errno == EINVAL);
        init.attr.max_wr = 16;
        init.attr.max_sge = 17;
        errno = 0;
        CHECK(ibv_create_srq(ep.pd, &init) == nullptr);
        CHECK(errno == EINVAL);
    }
    SECTION("16384 WQEs fit, the next one does not") {
        ibv_srq* srq = make_srq(ep.pd, 16384, 1);
        REQUIRE(srq);
        Buffer b(ep.pd, 64, kAll);
        int err = 0;
        for (int i = 0; i < 16384 && err == 0; ++i) err = post_srq_buf(srq, b, 0, 64, i);
        CHECK(err == 0);
        ibv_sge sge{b.addr(), 64, b.mr->lkey};
        ibv_recv_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        CHECK(ibv_post_srq_recv(srq, &wr, &bad) == ENOMEM);
        CHECK(bad == &wr);
        // Shrinking below what is queued is refused; growing works.
        ibv_srq_attr attr{};
        attr.max_wr = 100;
        CHECK(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR) == EINVAL);
        CHECK(ibv_destroy_srq(srq) == 0);
    }
    SECTION("post: more SGEs than the SRQ was created with") {
        ibv_srq* srq = make_srq(ep.pd, 8, 1);
        REQUIRE(srq);
        Buffer b(ep.pd, 64, kAll);
        ibv_sge sge[2] = {{b.addr(), 32, b.mr->lkey}, {b.addr() + 32, 32, b.mr->lkey}};
        ibv_recv_wr second{};
        second.sg_list = sge;
        second.num_sge = 2;
        ibv_recv_wr first{};
        first.sg_list = sge;
        first.num_sge = 1;
        first.next = &second;
        ibv_recv_wr* bad = nullptr;
        CHECK(ibv_post_srq_recv(srq, &first, &bad) == EINVAL);
        CHECK(bad == &second);
        CHECK(ibv_destroy_srq(srq) == 0);
    }
    SECTION("modify: limit above max_wr, unknown mask bits; growing works") {
        ibv_srq* srq = make_srq(ep.pd, 8, 1);
        REQUIRE(srq);
        ibv_srq_attr attr{};
        attr.srq_limit = 9;
        CHECK(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT) == EINVAL);
        CHECK(ibv_modify_srq(srq, &attr, 1 << 5) == EINVAL);
        attr = {};
        attr.max_wr = 32;
        CHECK(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR) == 0);
        attr = {};
        REQUIRE(ibv_query_srq(srq, &attr) == 0);
        CHECK(attr.max_wr == 32);
        CHECK(attr.max_sge == 1);
        CHECK(ibv_destroy_srq(srq) == 0);
    }
    SECTION("a QP on an SRQ: no ibv_post_recv; the SRQ and PD stay while it is attached") {
        ibv_srq* srq = make_srq(ep.pd, 8, 1);
        REQUIRE(srq);
        ibv_qp* qp = make_qp_on_srq(ep.pd, ep.cq, srq);
        REQUIRE(qp);
        ibv_qp_attr attr{};
        ibv_qp_init_attr qinit{};
        REQUIRE(ibv_query_qp(qp, &attr, IBV_QP_STATE, &qinit) == 0);
        CHECK(qinit.srq == srq);
        Buffer b(ep.pd, 64, kAll);
        CHECK(post_recv_buf(qp, b, 0, 64, 1) == EINVAL);
        CHECK(ibv_destroy_srq(srq) == EBUSY);
        CHECK(ibv_destroy_qp(qp) == 0);
        CHECK(ibv_dealloc_pd(ep.pd) == EBUSY);  // the SRQ and the buffer's MR are in it
        CHECK(ibv_destroy_srq(srq) == 0);
    }
    SECTION("the device advertises what create accepts") {
        ibv_device_attr d{};
        REQUIRE(ibv_query_device(ep.ctx, &d) == 0);
        CHECK(d.max_srq_wr == 16384);
        CHECK(d.max_srq_sge == 16);
        CHECK(d.max_srq > 0);
    }
}

TEST_CASE("SRQ: ibv_modify_srq of max_wr and limit together changes both or neither", "[srq]") {
    // ibv_modify_srq(3): if any of the attributes is invalid, none is modified.
    Endpoint ep(devices().a);
    ibv_srq* srq = make_srq(ep.pd, 16, 1);
    REQUIRE(srq);
    ibv_srq_attr attr{};
    SECTION("a valid max_wr with a limit above it: EINVAL, max_wr unchanged") {
        attr.max_wr = 8;
        attr.srq_limit = 12;
        CHECK(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) == EINVAL);
        attr = {};
        REQUIRE(ibv_query_srq(srq, &attr) == 0);
        CHECK(attr.max_wr == 16);
        CHECK(attr.srq_limit == 0);
    }
    SECTION("shrinking max_wr below the armed limit while lowering the limit: both change") {
        attr.srq_limit = 10;
        REQUIRE(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT) == 0);
        attr = {};
        attr.max_wr = 8;
        attr.srq_limit = 4;
        CHECK(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) == 0);
        attr = {};
        REQUIRE(ibv_query_srq(srq, &attr) == 0);
        CHECK(attr.max_wr == 8);
        CHECK(attr.srq_limit == 4);
    }
    CHECK(ibv_destroy_srq(srq) == 0);
}

// A receive a QP took from its SRQ used up the SRQ's WQE: its completion is how the application
// gets that buffer back. Destroying the QP (or resetting it) before the CQ was polled must not
// take that completion away, or the buffer is never posted again and the SRQ runs dry.
TEST_CASE("SRQ: a receive completed for a QP survives the QP's destruction or reset", "[srq]") {
    SrqSide rx(1, 16);
    Buffer in(rx.ep.pd, kSlot, kAll);
    REQUIRE(post_srq_buf(rx.srq, in, 0, kSlot, 4242) == 0);
    Endpoint& peer = *rx.peers[0];
    Buffer out(peer.pd, kSlot, kAll);
    fill_pattern(out.bytes.data(), 100, 5);
    REQUIRE(post_send_msg(peer.qp, out, 0, 100, 1) == 0);
    REQUIRE(wait_completions(peer.cq, 1).size() == 1);  // acknowledged: executed at rx
    const uint32_t qpn = rx.qps[0]->qp_num;
    SECTION("destroyed") {
        REQUIRE(ibv_destroy_qp(rx.qps[0]) == 0);
        rx.qps.clear();
    }
    SECTION("moved to ERR, then RESET") {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_ERR;
        REQUIRE(ibv_modify_qp(rx.qps[0], &attr, IBV_QP_STATE) == 0);
        attr.qp_state = IBV_QPS_RESET;
        REQUIRE(ibv_modify_qp(rx.qps[0], &attr, IBV_QP_STATE) == 0);
    }
    const auto wcs = wait_completions(rx.ep.cq, 2, std::chrono::milliseconds(200));
    bool found = false;
    for (const ibv_wc& wc : wcs) {
        if (wc.wr_id != 4242) continue;
        found = true;
        CHECK(wc.status == IBV_WC_SUCCESS);
        CHECK(wc.opcode == IBV_WC_RECV);
        CHECK(wc.byte_len == 100);
        CHECK(wc.qp_num == qpn);
    }
    CHECK(found);
    CHECK(std::memcmp(in.bytes.data(), out.bytes.data(), 100) == 0);
}
