// RC QPs on a shared receive queue: where the responder takes its receive WQEs, what
// happens when there is none, and what becomes of a WQE taken for a message that never ends.
#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/shared_receive_queue.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

// Replaces side `s`'s QP (not yet connected) by one that takes its receives from `srq`.
void put_on_srq(Side& s, const std::shared_ptr<SharedReceiveQueue>& srq) {
    const QpCaps caps = s.qp->caps();
    s.engine->detach(s.qp->qpn());
    s.qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd, caps, s.scq, s.rcq, &s,
                                  srq);
    s.engine->attach(s.qp);
}

}  // namespace

TEST_CASE("SRQ: a QP takes its receives from the SRQ, in posting order", "[srq]") {
    Pair p;
    auto srq = std::make_shared<SharedReceiveQueue>(kPd, 16, 4, nullptr);
    put_on_srq(p.a, srq);
    p.connect();
    // The QP has no receive queue of its own.
    CHECK(p.a.qp->post_recv(recv_wqe(99, {p.a.sge(0, 64)})) == EINVAL);
    REQUIRE(srq->post(recv_wqe(1, {p.a.sge(0, 100)})) == 0);
    REQUIRE(srq->post(recv_wqe(2, {p.a.sge(100, 100)})) == 0);
    std::fill_n(p.b.at(0), 30, uint8_t{0x11});
    std::fill_n(p.b.at(30), 40, uint8_t{0x22});
    REQUIRE(p.b.qp->post_send(send_wqe(10, {p.b.sge(0, 30)})) == 0);
    REQUIRE(p.b.qp->post_send(send_wqe(11, {p.b.sge(30, 40)})) == 0);
    const auto rc = p.wait(*p.a.rcq, 2);
    REQUIRE(rc.size() == 2);
    CHECK(rc[0].status == WcStatus::Success);
    CHECK(rc[0].wr_id == 1);
    CHECK(rc[0].byte_len == 30);
    CHECK(rc[1].status == WcStatus::Success);
    CHECK(rc[1].wr_id == 2);
    CHECK(rc[1].byte_len == 40);
    CHECK(all_bytes(p.a.at(0), 30, 0x11));
    CHECK(all_bytes(p.a.at(30), 70, kUntouched));
    CHECK(all_bytes(p.a.at(100), 40, 0x22));
    CHECK(srq->depth() == 0);
    CHECK(p.wait(*p.b.scq, 2).size() == 2);
}

TEST_CASE("SRQ: an empty SRQ answers RNR until a WQE is posted", "[srq]") {
    Pair p;
    auto srq = std::make_shared<SharedReceiveQueue>(kPd, 16, 4, nullptr);
    put_on_srq(p.a, srq);
    p.connect();
    std::fill_n(p.b.at(0), 50, uint8_t{0x33});
    REQUIRE(p.b.qp->post_send(send_wqe(10, {p.b.sge(0, 50)})) == 0);
    REQUIRE(p.wait_until([&] { return p.a.counters().tx_rnr_naks.load() >= 1; }));
    CHECK(p.a.rcq->depth() == 0);
    REQUIRE(srq->post(recv_wqe(5, {p.a.sge(0, 64)})) == 0);
    const Completion c = p.wait_one(*p.a.rcq);
    CHECK(c.status == WcStatus::Success);
    CHECK(c.wr_id == 5);
    CHECK(all_bytes(p.a.at(0), 50, 0x33));
    const Completion s = p.wait_one(*p.b.scq);
    CHECK(s.status == WcStatus::Success);
}

TEST_CASE("SRQ: WQEs name buffers of the SRQ's protection domain", "[srq]") {
    Pair p;
    // The SRQ and the buffer are in another PD, the QP in kPd: the SRQ's PD decides.
    constexpr uint32_t kSrqPd = kPd + 1;
    static_assert(kSrqPd != kPd);
    std::vector<uint8_t> buf(256, kUntouched);
    const MemoryKeys k =
        p.a.engine->memory().add(kSrqPd, reinterpret_cast<uint64_t>(buf.data()), buf.size(),
                                 reinterpret_cast<uint64_t>(buf.data()), kLocalWrite);
    auto srq = std::make_shared<SharedReceiveQueue>(kSrqPd, 16, 4, nullptr);
    put_on_srq(p.a, srq);
    p.connect();
    REQUIRE(srq->post(recv_wqe(1, {Sge{reinterpret_cast<uint64_t>(buf.data()), 256, k.lkey}})) ==
            0);
    std::fill_n(p.b.at(0), 20, uint8_t{0x44});
    REQUIRE(p.b.qp->post_send(send_wqe(10, {p.b.sge(0, 20)})) == 0);
    const Completion c = p.wait_one(*p.a.rcq);
    CHECK(c.status == WcStatus::Success);
    CHECK(all_bytes(buf.data(), 20, 0x44));
    p.a.engine->detach(p.a.qp->qpn());  // before buf goes
    p.a.qp.reset();
}

TEST_CASE("SRQ: the WQE of a message cut short by ERR is flushed, the rest stay", "[srq]") {
    Pair p;
    auto srq = std::make_shared<SharedReceiveQueue>(kPd, 16, 4, nullptr);
    put_on_srq(p.a, srq);
    p.connect();
    TxRecorder a_out(*p.a.engine, {}, false);
    ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};
    REQUIRE(srq->post(recv_wqe(1, {p.a.sge(0, 4 * kMtu)})) == 0);
    REQUIRE(srq->post(recv_wqe(2, {p.a.sge(0, 4 * kMtu)})) == 0);
    REQUIRE(srq->post(recv_wqe(3, {p.a.sge(0, 4 * kMtu)})) == 0);
    // The first packet of a two-packet SEND takes WQE 1; the last never comes.
    const std::vector<uint8_t> payload(kMtu, 0x55);
    peer.inject(peer.headers(wire::Opcode::RcSendFirst, 0), payload);
    REQUIRE(p.wait_until([&] { return srq->depth() == 2; }));
    CHECK(p.a.rcq->depth() == 0);
    REQUIRE(p.a.qp->modify(default_attributes(), QpState::Rts, QpState::Err) == 0);
    const Completion c = p.wait_one(*p.a.rcq);
    CHECK(c.wr_id == 1);
    CHECK(c.status == WcStatus::WrFlushErr);
    // The SRQ's other WQEs are not the QP's to flush: they wait for the other QPs.
    CHECK(srq->depth() == 2);
    CHECK(p.stays_empty(*p.a.rcq));
    CHECK(has_event(p.a, AsyncEventType::LastWqeReached));
}

TEST_CASE("SRQ: a QP with its own receive queue raises no Last WQE Reached", "[srq]") {
    Pair p;
    p.connect();
    REQUIRE(p.a.qp->post_recv(recv_wqe(1, {p.a.sge(0, 64)})) == 0);
    REQUIRE(p.a.qp->modify(default_attributes(), QpState::Rts, QpState::Err) == 0);
    const Completion c = p.wait_one(*p.a.rcq);
    CHECK(c.status == WcStatus::WrFlushErr);
    CHECK_FALSE(has_event(p.a, AsyncEventType::LastWqeReached));
}
