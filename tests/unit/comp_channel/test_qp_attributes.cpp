// ibv_query_qp's view of a QP's attributes across a modify (provider/qp_attributes.h): it
// changes only when the transport took the move. The transport refuses one when it moved the
// QP to ERR on its own after the provider checked the move, a race no test can time: here the
// transport is a function that refuses.
#include <catch2/catch.hpp>
#include <cerrno>

#include "provider/qp_attributes.h"

using uroce::provider::modify_attributes;

namespace {

ibv_qp_attr rts_qp() {
    ibv_qp_attr a{};
    a.qp_state = a.cur_qp_state = IBV_QPS_RTS;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    a.min_rnr_timer = 12;
    a.path_mtu = IBV_MTU_1024;
    a.port_num = 1;
    a.cap.max_send_wr = 64;
    return a;
}

}  // namespace

TEST_CASE("a modify the transport refuses leaves the stored attributes as they were", "[qp]") {
    ibv_qp_attr stored = rts_qp();
    ibv_qp_attr change{};
    change.qp_state = IBV_QPS_RTS;
    change.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    change.min_rnr_timer = 20;
    const int mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER;
    int calls = 0;
    auto refuse = [&](const ibv_qp_attr& a) {
        ++calls;
        CHECK(a.min_rnr_timer == 20);  // the transport is offered the new attributes
        return EINVAL;
    };
    CHECK(modify_attributes(stored, change, mask, IBV_QPS_RTS, IBV_MTU_4096, refuse) == EINVAL);
    CHECK(calls == 1);
    CHECK(stored.qp_access_flags == IBV_ACCESS_REMOTE_WRITE);
    CHECK(stored.min_rnr_timer == 12);
    CHECK(stored.qp_state == IBV_QPS_RTS);

    // Nor does a refused move to SQD say the QP drains.
    change = {};
    change.qp_state = IBV_QPS_SQD;
    change.en_sqd_async_notify = 1;
    CHECK(modify_attributes(stored, change, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, IBV_QPS_SQD,
                            IBV_MTU_4096, [](const ibv_qp_attr&) { return EINVAL; }) == EINVAL);
    CHECK(stored.qp_state == IBV_QPS_RTS);
    CHECK(stored.sq_draining == 0);
    CHECK(stored.en_sqd_async_notify == 0);
}

TEST_CASE("a modify the transport takes is what the stored attributes say", "[qp]") {
    ibv_qp_attr stored = rts_qp();
    ibv_qp_attr change{};
    change.qp_state = IBV_QPS_RTS;
    change.min_rnr_timer = 20;
    auto take = [](const ibv_qp_attr&) { return 0; };
    REQUIRE(modify_attributes(stored, change, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER, IBV_QPS_RTS,
                              IBV_MTU_4096, take) == 0);
    CHECK(stored.min_rnr_timer == 20);
    CHECK(stored.qp_access_flags == IBV_ACCESS_REMOTE_WRITE);
    // RESET brings back a new QP's defaults; the capabilities stay.
    change = {};
    change.qp_state = IBV_QPS_RESET;
    REQUIRE(modify_attributes(stored, change, IBV_QP_STATE, IBV_QPS_RESET, IBV_MTU_4096, take) ==
            0);
    CHECK(stored.qp_state == IBV_QPS_RESET);
    CHECK(stored.min_rnr_timer == 0);
    CHECK(stored.path_mtu == IBV_MTU_4096);
    CHECK(stored.port_num == 1);
    CHECK(stored.cap.max_send_wr == 64u);
}
