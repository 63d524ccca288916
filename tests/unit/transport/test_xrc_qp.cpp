// XRC: an initiator QP on one engine, a target QP on the other, and XRC SRQs found by the
// number each request carries in its XRCETH. What is checked: requests land in the SRQ they
// name and complete on that SRQ's CQ; keys are checked in the SRQ's PD; a request naming an
// SRQ of another domain (or none) executes nothing; each half takes one direction only.
#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>
#include <set>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/shared_receive_queue.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kDomain = 5;
constexpr uint32_t kSrqPd = kPd + 1;  // the SRQs' PD differs from the initiator's

// An XRC SRQ of `s`'s engine in domain `xrcd`, attached so requests can name it, with its
// own CQ.
struct XrcSrq {
    std::shared_ptr<CompletionQueue> cq;
    std::shared_ptr<SharedReceiveQueue> queue;
    Engine* engine = nullptr;

    XrcSrq(Side& s, uint32_t xrcd, uint32_t pd = kSrqPd) : engine(s.engine.get()) {
        cq = std::make_shared<CompletionQueue>(64, nullptr, nullptr);
        XrcSrqBinding b;
        b.srqn = engine->allocate_srqn();
        b.xrcd = xrcd;
        b.cq = cq;
        queue = std::make_shared<SharedReceiveQueue>(pd, 64, 4, nullptr, b);
        engine->attach_xrc_srq(queue);
    }
    ~XrcSrq() { engine->detach_xrc_srq(srqn()); }
    uint32_t srqn() const { return queue->xrc().srqn; }
};

// Makes a's QP an XRC initiator and b's an XRC target of kDomain (neither connected yet).
void make_xrc(Pair& p) {
    const QpCaps caps = p.a.qp->caps();
    p.a.engine->detach(p.a.qp->qpn());
    p.a.qp = std::make_shared<RcQp>(*p.a.engine, p.a.engine->allocate_qpn(), kPd, caps, p.a.scq,
                                    nullptr, &p.a, nullptr, XrcRole::Initiator);
    p.a.engine->attach(p.a.qp);
    p.b.engine->detach(p.b.qp->qpn());
    p.b.qp = std::make_shared<RcQp>(*p.b.engine, p.b.engine->allocate_qpn(), 0, QpCaps{}, nullptr,
                                    nullptr, &p.b, nullptr, XrcRole::Target, kDomain);
    p.b.engine->attach(p.b.qp);
}

SendWqe xrc(SendWqe w, uint32_t srqn) {
    w.remote_srqn = srqn;
    return w;
}

// b's memory registered again in the SRQs' PD: the keys requests to the target must use.
MemoryKeys srq_pd_keys(Side& s) {
    return s.engine->memory().add(kSrqPd, s.addr(0), s.mem.size(), s.iova + 0x10000000,
                                  kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
}

}  // namespace

TEST_CASE("XRC: a SEND lands in the SRQ it names and completes on that SRQ's CQ", "[xrc]") {
    Pair p;
    make_xrc(p);
    XrcSrq one(p.b, kDomain);
    XrcSrq two(p.b, kDomain);
    p.connect();
    const MemoryKeys k = srq_pd_keys(p.b);
    REQUIRE(one.queue->post(recv_wqe(1, {Sge{p.b.addr(0), 256, k.lkey}})) == 0);
    REQUIRE(two.queue->post(recv_wqe(2, {Sge{p.b.addr(1024), 4096, k.lkey}})) == 0);
    TxRecorder a_out(*p.a.engine);
    fill(p.a.at(0), 3000, 21);
    fill(p.a.at(4096), 100, 22);
    // Three packets to the second SRQ, one to the first.
    REQUIRE(p.a.qp->post_send(xrc(send_wqe(10, {p.a.sge(0, 3000)}), two.srqn())) == 0);
    REQUIRE(p.a.qp->post_send(xrc(send_wqe(11, {p.a.sge(4096, 100)}), one.srqn())) == 0);

    const Completion c2 = p.wait_one(*two.cq);
    CHECK(c2.status == WcStatus::Success);
    CHECK(c2.wr_id == 2);
    CHECK(c2.byte_len == 3000);
    CHECK(c2.qp_num == p.b.qp->qpn());  // the target QP that received it
    CHECK(first_mismatch(p.b.at(1024), 3000, 21) == 3000);
    const Completion c1 = p.wait_one(*one.cq);
    CHECK(c1.status == WcStatus::Success);
    CHECK(c1.wr_id == 1);
    CHECK(c1.byte_len == 100);
    CHECK(first_mismatch(p.b.at(0), 100, 22) == 100);
    CHECK(all_bytes(p.b.at(100), 924, kUntouched));
    CHECK(p.b.rcq->depth() == 0);
    const auto sc = p.wait(*p.a.scq, 2);
    REQUIRE(sc.size() == 2);
    CHECK(sc[0].status == WcStatus::Success);
    CHECK(sc[1].status == WcStatus::Success);

    // On the wire: XRC opcodes, every request packet naming its SRQ.
    CHECK(a_out.count_opcode(wire::Opcode::RcSendFirst) == 0);
    // Counted by PSN: a resend (a's probe when b answers late on a busy machine) is one more
    // packet, not one more request, and must name its SRQ all the same.
    std::set<uint32_t> requests;
    for (const SentPacket& s : a_out.packets()) {
        const wire::ParsedPacket pkt = s.parsed();
        if (!(pkt.info->flags & wire::kRequest)) continue;
        requests.insert(pkt.h.bth.psn);
        CHECK(pkt.h.bth.opcode >> 5 == static_cast<uint8_t>(wire::Transport::Xrc));
        CHECK((pkt.info->headers & wire::kHasXrceth) != 0);
        CHECK((pkt.h.xrc_srqn == two.srqn() || pkt.h.xrc_srqn == one.srqn()));
    }
    CHECK(requests.size() == 4);
}

TEST_CASE("XRC: WRITE, READ and atomics check their keys in the named SRQ's PD", "[xrc]") {
    Pair p;
    make_xrc(p);
    XrcSrq srq(p.b, kDomain);
    QpAttributes attrs = default_attributes();
    attrs.access = kRemoteWrite | kRemoteRead | kRemoteAtomic;
    p.connect(attrs, attrs);
    const MemoryKeys k = srq_pd_keys(p.b);
    const uint64_t va = p.b.iova + 0x10000000;

    fill(p.a.at(0), 2500, 31);
    REQUIRE(p.a.qp->post_send(
                xrc(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 2500)}, va + 100, k.rkey),
                    srq.srqn())) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(100), 2500, 31) == 2500);
    CHECK(all_bytes(p.b.at(0), 100, kUntouched));

    fill(p.b.at(8192), 3000, 32);
    REQUIRE(p.a.qp->post_send(
                xrc(rdma_wqe(SendOpcode::RdmaRead, 2, {p.a.sge(16384, 3000)}, va + 8192, k.rkey),
                    srq.srqn())) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.a.at(16384), 3000, 32) == 3000);

    uint64_t target = 40;
    std::memcpy(p.b.at(12288), &target, 8);
    SendWqe fa = rdma_wqe(SendOpcode::AtomicFetchAdd, 3, {p.a.sge(20480, 8)}, va + 12288, k.rkey);
    fa.compare_add = 2;
    REQUIRE(p.a.qp->post_send(xrc(fa, srq.srqn())) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    std::memcpy(&target, p.b.at(12288), 8);
    CHECK(target == 42);
    uint64_t original = 0;
    std::memcpy(&original, p.a.at(20480), 8);
    CHECK(original == 40);

    // b's first registration is in kPd, the initiator's PD but not the SRQ's: refused, and
    // not a byte written.
    std::fill_n(p.b.at(30000), 64, kUntouched);
    fill(p.a.at(0), 64, 33);
    REQUIRE(p.a.qp->post_send(xrc(rdma_wqe(SendOpcode::RdmaWrite, 4, {p.a.sge(0, 64)},
                                           p.b.iova + 30000, p.b.keys.rkey),
                                  srq.srqn())) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::RemAccessErr);
    CHECK(all_bytes(p.b.at(30000), 64, kUntouched));
}

TEST_CASE("XRC: a request naming an SRQ outside the target's domain executes nothing", "[xrc]") {
    for (const bool exists : {true, false}) {
        CAPTURE(exists);
        Pair p;
        make_xrc(p);
        XrcSrq other(p.b, kDomain + 1);  // same engine, another domain
        p.connect();
        const MemoryKeys k = srq_pd_keys(p.b);
        REQUIRE(other.queue->post(recv_wqe(1, {Sge{p.b.addr(0), 256, k.lkey}})) == 0);
        fill(p.a.at(0), 64, 41);
        const uint32_t srqn = exists ? other.srqn() : other.srqn() ^ 0x5a5;
        REQUIRE(p.a.qp->post_send(xrc(send_wqe(1, {p.a.sge(0, 64)}), srqn)) == 0);
        CHECK(p.wait_one(*p.a.scq).status == WcStatus::RemInvReqErr);
        CHECK(p.b.counters().rx_bad_xrc_srq.load() == 1);
        CHECK(all_bytes(p.b.at(0), 256, kUntouched));
        CHECK(other.queue->depth() == 1);  // its WQE was not taken
        CHECK(other.cq->depth() == 0);
        CHECK(p.b.qp->state() == QpState::Err);
    }
}

TEST_CASE("XRC: each half takes one direction only", "[xrc]") {
    Pair p;
    make_xrc(p);
    XrcSrq srq(p.b, kDomain);
    p.connect();
    // A target has no send queue, an initiator no receive queue.
    CHECK(p.b.qp->post_send(send_wqe(1, {p.b.sge(0, 8)})) == EINVAL);
    CHECK(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 8)})) == EINVAL);
    CHECK(p.a.qp->post_recv(recv_wqe(1, {p.a.sge(0, 8)})) == EINVAL);

    // A request forged to the initiator, an ACK forged to the target: both dropped, and
    // neither QP changes state.
    ForgedPeer to_a{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};
    wire::Headers req = to_a.headers(wire::Opcode::RcSendOnly, 0);
    req.bth.opcode |= wire::kXrcOpcodeBase;
    req.xrc_srqn = srq.srqn();
    const uint64_t a_before = p.a.counters().rx_unsupported.load();
    const uint8_t payload[4] = {1, 2, 3, 4};
    to_a.inject(req, payload);
    CHECK(p.a.counters().rx_unsupported.load() == a_before + 1);
    ForgedPeer to_b{*p.b.engine, p.a.ip, p.b.engine->config().port, p.a.qp->qpn(), p.b.qp->qpn()};
    wire::Headers ack = to_b.ack(0);
    ack.bth.opcode |= wire::kXrcOpcodeBase;
    const uint64_t b_before = p.b.counters().rx_unsupported.load();
    to_b.inject(ack);
    CHECK(p.b.counters().rx_unsupported.load() == b_before + 1);
    // An RC packet for an XRC QP is another transport: never delivered.
    to_b.inject(to_b.headers(wire::Opcode::RcSendOnly, 0), payload);
    CHECK(p.b.counters().rx_unsupported.load() == b_before + 2);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
    CHECK(srq.cq->depth() == 0);
}

TEST_CASE("XRC: a target moved to ERR mid-message lets go of the SRQ it was receiving into",
          "[xrc]") {
    bool cq_free = false;  // before the pair: the QPs go first
    Pair p;
    make_xrc(p);
    p.connect();
    // An XRC SRQ as the provider makes one: its CQ is busy (cq_hold) until the queue goes.
    auto cq = std::make_shared<CompletionQueue>(64, nullptr, nullptr);
    XrcSrqBinding b;
    b.srqn = p.b.engine->allocate_srqn();
    b.xrcd = kDomain;
    b.cq = cq;
    b.cq_hold = std::shared_ptr<void>(&cq_free, [](void* f) { *static_cast<bool*>(f) = true; });
    auto queue = std::make_shared<SharedReceiveQueue>(kSrqPd, 16, 4, nullptr, b);
    b = {};
    p.b.engine->attach_xrc_srq(queue);
    const MemoryKeys k = srq_pd_keys(p.b);
    REQUIRE(queue->post(recv_wqe(1, {Sge{p.b.addr(0), 4 * kMtu, k.lkey}})) == 0);
    REQUIRE(queue->post(recv_wqe(2, {Sge{p.b.addr(0), 4 * kMtu, k.lkey}})) == 0);
    // The first packet of a two-packet SEND takes WQE 1; the last never comes.
    ForgedPeer to_b{*p.b.engine, p.a.ip, p.b.engine->config().port, p.a.qp->qpn(), p.b.qp->qpn()};
    wire::Headers first = to_b.headers(wire::Opcode::RcSendFirst, 0);
    first.bth.opcode |= wire::kXrcOpcodeBase;
    first.xrc_srqn = queue->xrc().srqn;
    const std::vector<uint8_t> payload(kMtu, 0x5a);
    to_b.inject(first, payload);
    REQUIRE(p.wait_until([&] { return queue->depth() == 1; }));
    REQUIRE(p.b.qp->modify(default_attributes(), QpState::Rts, QpState::Err) == 0);
    const Completion c = p.wait_one(*cq);
    CHECK(c.wr_id == 1);
    CHECK(c.status == WcStatus::WrFlushErr);
    CHECK(queue->depth() == 1);  // the SRQ's other WQE is not the target's to flush
    // ibv_destroy_srq: out of the table, the provider's reference gone. No message is open:
    // nothing holds the queue any more, and its CQ may be destroyed.
    p.b.engine->detach_xrc_srq(queue->xrc().srqn);
    queue.reset();
    CHECK(cq_free);
}
