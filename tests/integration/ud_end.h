// A UD QP in RTS on a device through the real libibverbs, and the sends and waits the UD
// integration tests share (test_ud.cpp, test_ud_sends.cpp).
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "tests/integration/verbs_fixture.h"

namespace uroce::test {

constexpr uint32_t kQkey = 0x11111111;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE;
constexpr uint32_t kGrh = 40;

// A context with a UD QP in RTS.
struct UdEnd {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_gid gid{};

    explicit UdEnd(const std::string& device, uint32_t qkey = kQkey) {
        ctx = open_device(device);
        REQUIRE(ctx);
        pd = ibv_alloc_pd(ctx);
        cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
        REQUIRE(pd);
        REQUIRE(cq);
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = cq;
        init.qp_type = IBV_QPT_UD;
        init.cap.max_send_wr = init.cap.max_recv_wr = 64;
        init.cap.max_send_sge = init.cap.max_recv_sge = 2;
        qp = ibv_create_qp(pd, &init);
        REQUIRE(qp);
        REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = qkey;
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
        a = {};
        a.qp_state = IBV_QPS_RTR;
        REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
        a = {};
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0x42;
        REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
    }
    ~UdEnd() {
        if (qp) ibv_destroy_qp(qp);
        if (cq) ibv_destroy_cq(cq);
        if (pd) ibv_dealloc_pd(pd);
        if (ctx) ibv_close_device(ctx);
    }
    UdEnd(const UdEnd&) = delete;
    UdEnd& operator=(const UdEnd&) = delete;

    ibv_ah* ah_to(const ibv_gid& dgid) {
        ibv_ah_attr attr{};
        attr.is_global = 1;
        attr.grh.dgid = dgid;
        attr.grh.hop_limit = 64;
        attr.port_num = 1;
        return ibv_create_ah(pd, &attr);
    }
};

inline int post_ud_send_at(ibv_qp* qp, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey,
                           uint64_t addr, uint32_t len, uint32_t lkey, uint64_t wr_id) {
    ibv_sge sge{addr, len, lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = remote_qpn;
    wr.wr.ud.remote_qkey = remote_qkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

inline int post_ud_send(ibv_qp* qp, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey,
                        const Buffer& b, size_t offset, uint32_t len, uint64_t wr_id) {
    return post_ud_send_at(qp, ah, remote_qpn, remote_qkey, b.addr() + offset, len, b.mr->lkey,
                           wr_id);
}

inline ibv_wc one(ibv_cq* cq) {
    const auto wcs = wait_completions(cq, 1);
    REQUIRE(wcs.size() == 1);
    return wcs[0];
}

}  // namespace uroce::test
