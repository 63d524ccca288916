// UD QPs and address handles through the real libibverbs: datagrams with their GRH, replies
// through an AH made from the work completion, Q_Keys, multicast, and what the verbs refuse.
#include <arpa/inet.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <memory>

#include "tests/integration/ud_end.h"
#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

TEST_CASE("UD: a datagram, its GRH, and a reply through an AH made from the completion", "[ud]") {
    UdEnd a(devices().a), b(devices().b);
    Buffer in_b(b.pd, 4096, kAccess), out_a(a.pd, 4096, kAccess);
    Buffer in_a(a.pd, 4096, kAccess), out_b(b.pd, 4096, kAccess);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, kGrh + 1000, 1) == 0);
    fill_pattern(out_a.bytes.data(), 1000, 31);
    ibv_ah* ah = a.ah_to(b.gid);
    REQUIRE(ah);
    REQUIRE(post_ud_send(a.qp, ah, b.qp->qp_num, kQkey, out_a, 0, 1000, 5) == 0);
    const ibv_wc s = one(a.cq);
    CHECK(s.status == IBV_WC_SUCCESS);
    CHECK(s.opcode == IBV_WC_SEND);
    const ibv_wc r = one(b.cq);
    REQUIRE(r.status == IBV_WC_SUCCESS);
    CHECK(r.opcode == IBV_WC_RECV);
    CHECK(r.byte_len == kGrh + 1000);
    CHECK(r.src_qp == a.qp->qp_num);
    CHECK((r.wc_flags & IBV_WC_GRH) != 0);
    // sl holds the L3 header type, 2 = IPv4, as ConnectX reports it for RoCE: UCX's ud_verbs
    // reads the GRH area by it (and dropped every datagram with 0). A send's sl stays 0.
    CHECK(r.sl == 2);
    CHECK(s.sl == 0);
    CHECK(std::memcmp(in_b.bytes.data() + kGrh, out_a.bytes.data(), 1000) == 0);

    // libibverbs reads the sender's address back out of the GRH area.
    ibv_ah_attr from{};
    REQUIRE(ibv_init_ah_from_wc(b.ctx, 1, const_cast<ibv_wc*>(&r),
                                reinterpret_cast<ibv_grh*>(in_b.bytes.data()), &from) == 0);
    CHECK(from.is_global == 1);
    CHECK(std::memcmp(from.grh.dgid.raw, a.gid.raw, 16) == 0);
    CHECK(from.sl == 2);  // copied from the completion; the AH below takes it
    ibv_ah* reply = ibv_create_ah_from_wc(b.pd, const_cast<ibv_wc*>(&r),
                                          reinterpret_cast<ibv_grh*>(in_b.bytes.data()), 1);
    REQUIRE(reply);
    REQUIRE(post_recv_buf(a.qp, in_a, 0, kGrh + 64, 2) == 0);
    fill_pattern(out_b.bytes.data(), 64, 32);
    REQUIRE(post_ud_send(b.qp, reply, r.src_qp, kQkey, out_b, 0, 64, 6) == 0);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    const ibv_wc r2 = one(a.cq);
    CHECK(r2.status == IBV_WC_SUCCESS);
    CHECK(r2.src_qp == b.qp->qp_num);
    CHECK(std::memcmp(in_a.bytes.data() + kGrh, out_b.bytes.data(), 64) == 0);
    CHECK(ibv_destroy_ah(reply) == 0);
    CHECK(ibv_destroy_ah(ah) == 0);

    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(b.qp, &qa, IBV_QP_QKEY | IBV_QP_STATE, &qi) == 0);
    CHECK(qa.qkey == kQkey);
    CHECK(qa.qp_state == IBV_QPS_RTS);
    CHECK(qi.qp_type == IBV_QPT_UD);
}

TEST_CASE("UD: a post list leaves as one train, in order; a refused WR stops it there", "[ud]") {
    UdEnd a(devices().a), b(devices().b);
    constexpr uint32_t kLen = 200;
    constexpr uint32_t kSlot = kGrh + kLen;
    constexpr int kList = 24;
    Buffer in_b(b.pd, kSlot * 64, kAccess), out_a(a.pd, kLen * 64, kAccess);
    for (int i = 0; i < 2 * kList; ++i)
        REQUIRE(post_recv_buf(b.qp, in_b, i * kSlot, kSlot, 100 + i) == 0);
    fill_pattern(out_a.bytes.data(), kLen * 64, 41);
    ibv_ah* ah = a.ah_to(b.gid);
    REQUIRE(ah);
    ibv_sge sges[kList];
    ibv_send_wr wrs[kList];
    auto make_list = [&](int first) {
        for (int i = 0; i < kList; ++i) {
            sges[i] = {out_a.addr() + (first + i) * kLen, kLen, out_a.mr->lkey};
            wrs[i] = ibv_send_wr{};
            wrs[i].wr_id = first + i;
            wrs[i].opcode = IBV_WR_SEND;
            wrs[i].sg_list = &sges[i];
            wrs[i].num_sge = 1;
            wrs[i].send_flags = IBV_SEND_SIGNALED;
            wrs[i].wr.ud.ah = ah;
            wrs[i].wr.ud.remote_qpn = b.qp->qp_num;
            wrs[i].wr.ud.remote_qkey = kQkey;
            wrs[i].next = i + 1 < kList ? &wrs[i + 1] : nullptr;
        }
    };
    // What arrived at receive i holds message i.
    auto check_arrived = [&](int first, int n) {
        const auto sends = wait_completions(a.cq, n);
        REQUIRE(sends.size() == static_cast<size_t>(n));
        const auto recvs = wait_completions(b.cq, n);
        REQUIRE(recvs.size() == static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
            INFO("message " << first + i);
            CHECK(sends[i].status == IBV_WC_SUCCESS);
            CHECK(sends[i].wr_id == static_cast<uint64_t>(first + i));
            CHECK(recvs[i].status == IBV_WC_SUCCESS);
            CHECK(recvs[i].wr_id == static_cast<uint64_t>(100 + first + i));
            CHECK(recvs[i].byte_len == kSlot);
            CHECK(std::memcmp(in_b.bytes.data() + (first + i) * kSlot + kGrh,
                              out_a.bytes.data() + (first + i) * kLen, kLen) == 0);
        }
    };
    const uint64_t trains = counter(a.ctx, "tx_gso_sends");
    make_list(0);
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, wrs, &bad) == 0);
    check_arrived(0, kList);
    CHECK(counter(a.ctx, "tx_gso_sends") - trains == 1);

    // WR 10 of the next list has no AH: the ten before it are sent, nothing from it on.
    make_list(kList);
    wrs[10].wr.ud.ah = nullptr;
    REQUIRE(ibv_post_send(a.qp, wrs, &bad) == EINVAL);
    CHECK(bad == &wrs[10]);
    check_arrived(kList, 10);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
    CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
    CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("UD: a post list to QPs of two contexts sharing a device reaches each its own",
          "[ud][sharing]") {
    // The receiving host steers a GSO train by its first datagram's QPN (qpn_steering.h): a
    // train holding datagrams for both contexts would hand all of them to the first.
    UdEnd a(devices().a), b1(devices().b), b2(devices().b);
    REQUIRE(b1.qp->qp_num >> 12 != b2.qp->qp_num >> 12);  // two contexts: two device slots
    constexpr uint32_t kLen = 200;
    constexpr uint32_t kSlot = kGrh + kLen;
    constexpr int kList = 16;
    Buffer in1(b1.pd, kSlot * kList, kAccess), in2(b2.pd, kSlot * kList, kAccess);
    Buffer out(a.pd, kLen * kList, kAccess);
    for (int i = 0; i < kList / 2; ++i) {
        REQUIRE(post_recv_buf(b1.qp, in1, i * kSlot, kSlot, 100 + i) == 0);
        REQUIRE(post_recv_buf(b2.qp, in2, i * kSlot, kSlot, 200 + i) == 0);
    }
    fill_pattern(out.bytes.data(), out.bytes.size(), 51);
    ibv_ah* ah = a.ah_to(b1.gid);
    REQUIRE(ah);
    ibv_sge sges[kList];
    ibv_send_wr wrs[kList];
    for (int i = 0; i < kList; ++i) {
        sges[i] = {out.addr() + i * kLen, kLen, out.mr->lkey};
        wrs[i] = ibv_send_wr{};
        wrs[i].wr_id = i;
        wrs[i].opcode = IBV_WR_SEND;
        wrs[i].sg_list = &sges[i];
        wrs[i].num_sge = 1;
        wrs[i].send_flags = IBV_SEND_SIGNALED;
        wrs[i].wr.ud.ah = ah;
        // Alternately to b1's QP and b2's: message i is receive i / 2 of its QP.
        wrs[i].wr.ud.remote_qpn = i % 2 ? b2.qp->qp_num : b1.qp->qp_num;
        wrs[i].wr.ud.remote_qkey = kQkey;
        wrs[i].next = i + 1 < kList ? &wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, wrs, &bad) == 0);
    const auto sends = wait_completions(a.cq, kList);
    REQUIRE(sends.size() == static_cast<size_t>(kList));
    for (const ibv_wc& wc : sends) CHECK(wc.status == IBV_WC_SUCCESS);
    for (int k = 0; k < 2; ++k) {
        UdEnd& to = k == 0 ? b1 : b2;
        Buffer& in = k == 0 ? in1 : in2;
        INFO("context " << k + 1);
        const auto recvs = wait_completions(to.cq, kList / 2);
        REQUIRE(recvs.size() == static_cast<size_t>(kList / 2));
        for (int j = 0; j < kList / 2; ++j) {
            INFO("receive " << j);
            CHECK(recvs[j].status == IBV_WC_SUCCESS);
            CHECK(recvs[j].wr_id == static_cast<uint64_t>((k + 1) * 100 + j));
            CHECK(recvs[j].byte_len == kSlot);
            CHECK(recvs[j].src_qp == a.qp->qp_num);
            CHECK(std::memcmp(in.bytes.data() + j * kSlot + kGrh,
                              out.bytes.data() + (2 * j + k) * kLen, kLen) == 0);
        }
        CHECK(counter(to.ctx, "rx_unknown_qp") == 0);
    }
    CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("UD: a datagram with a wrong Q_Key is dropped and counted", "[ud]") {
    UdEnd a(devices().a), b(devices().b);
    Buffer in_b(b.pd, 4096, kAccess), out_a(a.pd, 4096, kAccess);
    ibv_ah* ah = a.ah_to(b.gid);
    REQUIRE(ah);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, 4096, 1) == 0);
    const uint64_t bad = counter(b.ctx, "rx_bad_qkey");
    REQUIRE(post_ud_send(a.qp, ah, b.qp->qp_num, kQkey + 1, out_a, 0, 100, 1) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);  // sent: UD promises no more
    bool dropped = false;
    for (int i = 0; i < 2000 && !dropped; ++i) {
        dropped = counter(b.ctx, "rx_bad_qkey") > bad;
        if (!dropped) wait_completions(b.cq, 1, std::chrono::milliseconds(5));
    }
    CHECK(dropped);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
    // The right Q_Key (here through the privileged bit: a's own Q_Key is the same) goes in.
    REQUIRE(post_ud_send(a.qp, ah, b.qp->qp_num, 0x80000000u, out_a, 0, 100, 2) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    ibv_destroy_ah(ah);
}

TEST_CASE("UD: what the verbs refuse", "[ud]") {
    UdEnd a(devices().a);
    Buffer out(a.pd, 8192, kAccess);
    SECTION("AHs without a GRH or with a GID that is not IPv4-mapped") {
        ibv_ah_attr attr{};
        attr.port_num = 1;
        errno = 0;
        CHECK(ibv_create_ah(a.pd, &attr) == nullptr);
        CHECK(errno == EINVAL);
        attr.is_global = 1;
        attr.grh.dgid.raw[0] = 0xfe;
        attr.grh.dgid.raw[1] = 0x80;
        errno = 0;
        CHECK(ibv_create_ah(a.pd, &attr) == nullptr);
        CHECK(errno == EINVAL);
    }
    SECTION("sends: larger than the MTU, not a SEND, no AH") {
        ibv_ah* ah = a.ah_to(a.gid);
        REQUIRE(ah);
        ibv_port_attr port{};
        REQUIRE(ibv_query_port(a.ctx, 1, &port) == 0);
        const uint32_t mtu = 128u << port.active_mtu;
        REQUIRE(mtu < out.bytes.size());
        CHECK(post_ud_send(a.qp, ah, a.qp->qp_num, kQkey, out, 0, mtu + 1, 1) == EINVAL);
        CHECK(post_ud_send(a.qp, nullptr, a.qp->qp_num, kQkey, out, 0, 8, 1) == EINVAL);
        CHECK(post_rdma(a.qp, IBV_WR_RDMA_WRITE, out, 0, 8, 0, 0, 1) == EINVAL);
        ibv_wc wc{};
        CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
        CHECK(ibv_dealloc_pd(a.pd) == EBUSY);  // the AH (and the MR) are in it
        CHECK(ibv_destroy_ah(ah) == 0);
    }
    SECTION("modify: INIT needs a Q_Key, and takes no access flags") {
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = a.cq;
        init.qp_type = IBV_QPT_UD;
        init.cap.max_send_wr = init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        ibv_qp* qp = ibv_create_qp(a.pd, &init);
        REQUIRE(qp);
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL);
        CHECK(ibv_modify_qp(qp, &attr,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
                                IBV_QP_ACCESS_FLAGS) == EINVAL);
        CHECK(ibv_modify_qp(qp, &attr,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
        CHECK(ibv_destroy_qp(qp) == 0);
    }
}

TEST_CASE("UD: a QP on an SRQ takes datagrams from it", "[ud][srq]") {
    UdEnd a(devices().a);
    Endpoint bep(devices().b);  // context, PD, CQ
    ibv_srq_init_attr sinit{};
    sinit.attr.max_wr = 8;
    sinit.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(bep.pd, &sinit);
    REQUIRE(srq);
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = bep.cq;
    init.srq = srq;
    init.qp_type = IBV_QPT_UD;
    init.cap.max_send_wr = 4;
    init.cap.max_send_sge = 1;
    ibv_qp* qp = ibv_create_qp(bep.pd, &init);
    REQUIRE(qp);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qkey = kQkey;
    REQUIRE(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ==
            0);
    at = {};
    at.qp_state = IBV_QPS_RTR;
    REQUIRE(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0);
    Buffer in(bep.pd, 4096, kAccess), out(a.pd, 4096, kAccess);
    ibv_sge sge{in.addr(), 4096, in.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 77;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    REQUIRE(ibv_post_srq_recv(srq, &wr, &bad) == 0);
    ibv_ah* ah = a.ah_to(bep.gid);
    REQUIRE(ah);
    fill_pattern(out.bytes.data(), 500, 4);
    REQUIRE(post_ud_send(a.qp, ah, qp->qp_num, kQkey, out, 0, 500, 1) == 0);
    const auto wcs = wait_completions(bep.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(wcs[0].wr_id == 77);
    CHECK(std::memcmp(in.bytes.data() + kGrh, out.bytes.data(), 500) == 0);
    ibv_destroy_ah(ah);
    CHECK(ibv_destroy_qp(qp) == 0);
    CHECK(ibv_destroy_srq(srq) == 0);
}

namespace {

// ::ffff:239.78.x.y, of this process alone (concurrent test runs do not hear each other).
ibv_gid multicast_gid(uint8_t n) {
    ibv_gid g{};
    g.raw[10] = g.raw[11] = 0xff;
    g.raw[12] = 239;
    g.raw[13] = 78;
    g.raw[14] = static_cast<uint8_t>(1 + ::getpid() % 254);
    g.raw[15] = n;
    return g;
}

// Polls `cq` a little: true if nothing arrived.
bool nothing_arrives(ibv_cq* cq) {
    return wait_completions(cq, 1, std::chrono::milliseconds(100)).empty();
}

}  // namespace

TEST_CASE("UD multicast: QPs of two devices attached to a group both receive", "[ud][mcast]") {
    UdEnd a(devices().a), b(devices().b), c(devices().c);
    const ibv_gid group = multicast_gid(1);
    REQUIRE(ibv_attach_mcast(b.qp, &group, 0) == 0);
    REQUIRE(ibv_attach_mcast(c.qp, &group, 0) == 0);
    Buffer in_b(b.pd, 4096, kAccess), in_c(c.pd, 4096, kAccess), out(a.pd, 4096, kAccess);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, kGrh + 700, 1) == 0);
    REQUIRE(post_recv_buf(c.qp, in_c, 0, kGrh + 700, 2) == 0);
    fill_pattern(out.bytes.data(), 700, 41);
    ibv_ah* ah = a.ah_to(group);  // hop_limit 64
    REQUIRE(ah);
    REQUIRE(post_ud_send(a.qp, ah, 0xffffff, kQkey, out, 0, 700, 5) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    for (UdEnd* e : {&b, &c}) {
        const ibv_wc r = one(e->cq);
        CHECK(r.status == IBV_WC_SUCCESS);
        CHECK(r.qp_num == e->qp->qp_num);
        CHECK(r.src_qp == a.qp->qp_num);
        CHECK(r.byte_len == kGrh + 700);
        CHECK((r.wc_flags & IBV_WC_GRH) != 0);
    }
    for (Buffer* in : {&in_b, &in_c}) {
        CHECK(std::memcmp(in->bytes.data() + kGrh, out.bytes.data(), 700) == 0);
        // The GRH area's IPv4 header: from a's address to the group.
        CHECK(std::memcmp(in->bytes.data() + 20 + 12, a.gid.raw + 12, 4) == 0);
        CHECK(std::memcmp(in->bytes.data() + 20 + 16, group.raw + 12, 4) == 0);
        CHECK(in->bytes[kGrh + 700] == 0);  // nothing written past the datagram
    }

    // c leaves: b still gets the next datagram, c does not.
    REQUIRE(ibv_detach_mcast(c.qp, &group, 0) == 0);
    CHECK(ibv_detach_mcast(c.qp, &group, 0) == EINVAL);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, kGrh + 700, 3) == 0);
    REQUIRE(post_recv_buf(c.qp, in_c, 0, kGrh + 700, 4) == 0);
    fill_pattern(out.bytes.data(), 700, 42);
    REQUIRE(post_ud_send(a.qp, ah, 0xffffff, kQkey, out, 0, 700, 6) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    const ibv_wc r = one(b.cq);
    CHECK(r.status == IBV_WC_SUCCESS);
    CHECK(r.wr_id == 3);
    CHECK(std::memcmp(in_b.bytes.data() + kGrh, out.bytes.data(), 700) == 0);
    CHECK(nothing_arrives(c.cq));
    CHECK(ibv_destroy_ah(ah) == 0);
    // b is destroyed while attached (~UdEnd): that detaches it.
}

TEST_CASE("UD multicast: a wrong Q_Key is dropped by that QP alone", "[ud][mcast]") {
    UdEnd a(devices().a), b(devices().b), c(devices().c, kQkey + 1);
    const ibv_gid group = multicast_gid(2);
    REQUIRE(ibv_attach_mcast(b.qp, &group, 0) == 0);
    REQUIRE(ibv_attach_mcast(c.qp, &group, 0) == 0);
    Buffer in_b(b.pd, 4096, kAccess), in_c(c.pd, 4096, kAccess), out(a.pd, 4096, kAccess);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, 4096, 1) == 0);
    REQUIRE(post_recv_buf(c.qp, in_c, 0, 4096, 2) == 0);
    const uint64_t bad = counter(c.ctx, "rx_bad_qkey");
    ibv_ah* ah = a.ah_to(group);
    REQUIRE(ah);
    REQUIRE(post_ud_send(a.qp, ah, 0xffffff, kQkey, out, 0, 100, 1) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    CHECK(one(b.cq).status == IBV_WC_SUCCESS);
    bool dropped = false;
    for (int i = 0; i < 2000 && !dropped; ++i) {
        dropped = counter(c.ctx, "rx_bad_qkey") > bad;
        if (!dropped) wait_completions(c.cq, 1, std::chrono::milliseconds(5));
    }
    CHECK(dropped);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(c.cq, 1, &wc) == 0);
    CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("UD multicast: what ibv_attach_mcast and ibv_detach_mcast refuse", "[ud][mcast]") {
    UdEnd a(devices().a);
    const ibv_gid group = multicast_gid(3);
    SECTION("a QP that is not UD") {
        Endpoint rc(devices().a);
        CHECK(ibv_attach_mcast(rc.qp, &group, 0) == EINVAL);
        CHECK(ibv_detach_mcast(rc.qp, &group, 0) == EINVAL);
    }
    SECTION("GIDs that are not IPv4-mapped multicast") {
        CHECK(ibv_attach_mcast(a.qp, &a.gid, 0) == EINVAL);  // unicast
        ibv_gid v6{};
        v6.raw[0] = 0xff;  // ff0e::1, IPv6 multicast
        v6.raw[1] = 0x0e;
        v6.raw[15] = 1;
        CHECK(ibv_attach_mcast(a.qp, &v6, 0) == EINVAL);
        ibv_gid v4_not_mapped = group;
        v4_not_mapped.raw[10] = 0;
        CHECK(ibv_attach_mcast(a.qp, &v4_not_mapped, 0) == EINVAL);
    }
    SECTION("the device says how many groups and QPs per group it takes") {
        ibv_device_attr attr{};
        REQUIRE(ibv_query_device(a.ctx, &attr) == 0);
        CHECK(attr.max_mcast_grp == 256);
        CHECK(attr.max_mcast_qp_attach == 64);
        CHECK(attr.max_total_mcast_qp_attach == 256 * 64);
    }
    SECTION("detaching a group not attached, or twice") {
        CHECK(ibv_detach_mcast(a.qp, &group, 0) == EINVAL);
        REQUIRE(ibv_attach_mcast(a.qp, &group, 0) == 0);
        CHECK(ibv_attach_mcast(a.qp, &group, 0) == 0);  // again: still attached once
        CHECK(ibv_detach_mcast(a.qp, &group, 0) == 0);
        CHECK(ibv_detach_mcast(a.qp, &group, 0) == EINVAL);
    }
}

// A datagram is sent alone, its ICRC computed over the application's pages where they are:
// gone, the send fails (as an RC one does, test_vanished_memory.cpp) and the process lives.
TEST_CASE("UD: a SEND from local pages that are gone fails and sends nothing", "[ud][vanished]") {
    UdEnd a(devices().a), b(devices().b);
    Buffer in(b.pd, 4096, kAccess);
    REQUIRE(post_recv_buf(b.qp, in, 0, kGrh + 1000, 41) == 0);
    VanishingRegion out(a.pd, 4096, kAccess);
    out.vanish();
    ibv_ah* ah = a.ah_to(b.gid);
    REQUIRE(ah);
    REQUIRE(post_ud_send_at(a.qp, ah, b.qp->qp_num, kQkey, out.addr(), 1000, out.mr->lkey, 42) ==
            0);
    const ibv_wc s = one(a.cq);
    CHECK(s.wr_id == 42);
    CHECK(s.status == IBV_WC_LOC_QP_OP_ERR);
    CHECK(counter(a.ctx, "app_memory_faults") == 1);
    // Nothing arrived (polled for a while: a datagram would be there by then).
    CHECK(wait_completions(b.cq, 1, std::chrono::milliseconds(300)).empty());
    CHECK(ibv_destroy_ah(ah) == 0);
}

// A NIC goes on writing into the pages a region pinned; UCX counts on that, freeing its
// receive buffers before their UD QP (test_vanished_memory.cpp has the RC cases).
TEST_CASE("UD: a datagram for a receive buffer whose pages are gone completes it in error",
          "[ud][vanished]") {
    UdEnd a(devices().a), b(devices().b);
    VanishingRegion in(b.pd, 2 * 4096, kAccess);
    REQUIRE(post_recv_at(b.qp, in.addr(), static_cast<uint32_t>(in.size), in.mr->lkey, 31) == 0);
    in.vanish();
    Buffer out(a.pd, 4096, kAccess);
    fill_pattern(out.bytes.data(), 1000, 4);
    ibv_ah* ah = a.ah_to(b.gid);
    REQUIRE(ah);
    REQUIRE(post_ud_send(a.qp, ah, b.qp->qp_num, kQkey, out, 0, 1000, 32) == 0);
    CHECK(one(a.cq).status == IBV_WC_SUCCESS);
    const ibv_wc r = one(b.cq);
    CHECK(r.wr_id == 31);
    CHECK(r.status == IBV_WC_LOC_PROT_ERR);
    CHECK(counter(b.ctx, "app_memory_faults") == 1);
    CHECK(ibv_destroy_ah(ah) == 0);  // and the region still deregisters, at the end
}

// A post in SQD waits, as RC's does (and rxe's UD): it leaves on the move back to RTS.
TEST_CASE("UD: a post in SQD leaves on the move back to RTS", "[ud]") {
    UdEnd a(devices().a), b(devices().b);
    Buffer in_b(b.pd, 4096, kAccess), out_a(a.pd, 4096, kAccess);
    fill_pattern(out_a.bytes.data(), 500, 41);
    REQUIRE(post_recv_buf(b.qp, in_b, 0, kGrh + 500, 1) == 0);
    ibv_ah* ah = a.ah_to(b.gid);
    REQUIRE(ah);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    const uint64_t sent = qp_counter(a.qp, "tx_packets");
    REQUIRE(post_ud_send(a.qp, ah, b.qp->qp_num, kQkey, out_a, 0, 500, 7) == 0);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);  // a datagram completes within its post
    CHECK(qp_counter(a.qp, "tx_packets") == sent);
    attr.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
    const ibv_wc s = one(a.cq);
    CHECK(s.status == IBV_WC_SUCCESS);
    CHECK(s.wr_id == 7u);
    const ibv_wc r = one(b.cq);
    CHECK(r.status == IBV_WC_SUCCESS);
    CHECK(r.byte_len == kGrh + 500);
    CHECK(std::memcmp(in_b.bytes.data() + kGrh, out_a.bytes.data(), 500) == 0);
    ibv_qp_init_attr init{};
    REQUIRE(ibv_query_qp(a.qp, &attr, IBV_QP_SQ_PSN, &init) == 0);
    CHECK(attr.sq_psn == 0x43u);  // the next one, after the datagram's 0x42
    CHECK(ibv_destroy_ah(ah) == 0);
}
