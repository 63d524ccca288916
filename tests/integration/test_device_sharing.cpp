// Several contexts on one device, in one process: each QP is reachable at the device's
// IP:4791 by its QPN, whoever owns it. Traffic between contexts of the same device, and
// between pairs of contexts running at once, arrives byte for byte.
// (Across processes, with kill -9: tests/scripts/test_device_sharing.sh.)
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "tests/integration/verbs_fixture.h"
#include "transport/send_sockets.h"

using namespace uroce::test;

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kMsg = 256 * 1024;
constexpr size_t kGuard = 64;

// WRITE a->b, SEND a->b, READ b->a of kMsg bytes each, with guard bytes around every
// target, checking every byte.
void exchange_and_verify(Endpoint& a, Endpoint& b, uint64_t seed) {
    Buffer a_buf(a.pd, kMsg + 2 * kGuard, kAccess);
    Buffer b_buf(b.pd, kMsg + 2 * kGuard, kAccess);
    for (const ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ}) {
        INFO("opcode " << op);
        Buffer& src = op == IBV_WR_RDMA_READ ? b_buf : a_buf;
        Buffer& dst = op == IBV_WR_RDMA_READ ? a_buf : b_buf;
        fill_pattern(src.bytes.data(), src.bytes.size(), seed + op);
        std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
        if (op == IBV_WR_SEND) REQUIRE(post_recv_buf(b.qp, dst, kGuard, kMsg, 7) == 0);
        const int rc =
            op == IBV_WR_SEND ? post_send_msg(a.qp, src, kGuard, kMsg, 1)
            : op == IBV_WR_RDMA_WRITE
                ? post_rdma(a.qp, op, src, kGuard, kMsg, dst.addr() + kGuard, dst.mr->rkey, 1)
                : post_rdma(a.qp, op, dst, kGuard, kMsg, src.addr() + kGuard, src.mr->rkey, 1);
        REQUIRE(rc == 0);
        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        REQUIRE(wcs[0].status == IBV_WC_SUCCESS);
        if (op == IBV_WR_SEND) {
            const auto rwcs = wait_completions(b.cq, 1);
            REQUIRE(rwcs.size() == 1);
            REQUIRE(rwcs[0].status == IBV_WC_SUCCESS);
            REQUIRE(rwcs[0].byte_len == kMsg);
        }
        CHECK(std::memcmp(dst.bytes.data() + kGuard, src.bytes.data() + kGuard, kMsg) == 0);
        for (size_t i = 0; i < kGuard; ++i) {
            REQUIRE(dst.bytes[i] == 0xee);
            REQUIRE(dst.bytes[kGuard + kMsg + i] == 0xee);
        }
    }
}

}  // namespace

TEST_CASE("Two contexts of one device talk to each other", "[sharing]") {
    Endpoint a(devices().a), b(devices().a);
    CHECK(a.qp->qp_num != b.qp->qp_num);
    connect(a, b);
    exchange_and_verify(a, b, 1);
    exchange_and_verify(b, a, 2);
    CHECK(counter(a.ctx, "rx_unknown_qp") == 0);
    CHECK(counter(b.ctx, "rx_unknown_qp") == 0);
}

TEST_CASE("Contexts of two devices, two on each, in two pairs at once", "[sharing]") {
    Endpoint a1(devices().a), a2(devices().a), b1(devices().b), b2(devices().b);
    connect(a1, b1);
    connect(a2, b2);
    // Interleaved: each pair's traffic reaches its own QPs while the other's runs.
    for (uint64_t round = 0; round < 3; ++round) {
        exchange_and_verify(a1, b1, 10 + round);
        exchange_and_verify(b2, a2, 20 + round);
    }
    for (ibv_context* ctx : {a1.ctx, a2.ctx, b1.ctx, b2.ctx})
        CHECK(counter(ctx, "rx_unknown_qp") == 0);
}

TEST_CASE("QP numbers are unique across a device's contexts, and never 0 or 1", "[sharing]") {
    std::vector<std::unique_ptr<Endpoint>> eps;
    for (int i = 0; i < 6; ++i) eps.push_back(std::make_unique<Endpoint>(devices().a));
    std::set<uint32_t> qpns;
    std::set<uint32_t> slots;
    for (auto& e : eps) {
        qpns.insert(e->qp->qp_num);
        slots.insert(e->qp->qp_num >> 12);  // the context's slot
        CHECK(e->qp->qp_num > 1);
    }
    CHECK(qpns.size() == eps.size());
    CHECK(slots.size() == eps.size());  // one slot per context
    CHECK(!slots.contains(0));
}

TEST_CASE("Packets for a closed context's QP reach no QP of the context that comes next",
          "[sharing]") {
    // A peer keeps retransmitting WRITEs to a QP whose context went away (IBA's QPN reuse
    // rule: a new QP must not take packets meant for the old one). The context opened next
    // on that device gets another slot (the old one rests in quarantine), so none of its
    // QPNs is the old one; the stray packets are refused by QPN and counted; its QPs and
    // memory see none of them.
    QpOptions opt;
    opt.timeout = 10;  // retransmissions every ~4 ms while the test looks
    opt.retry_cnt = 7;
    Endpoint peer(devices().a, opt);
    auto gone = std::make_unique<Endpoint>(devices().b, opt);
    connect(peer, *gone, opt);
    const uint32_t dead_qpn = gone->qp->qp_num;
    Buffer src(peer.pd, 1 << 16, kAccess);
    auto target = std::make_unique<Buffer>(gone->pd, 1 << 16, kAccess);
    const uint64_t target_addr = target->addr();
    const uint32_t target_rkey = target->mr->rkey;
    REQUIRE(ibv_close_device(gone->ctx) == 0);  // with its QP, MR, CQ, PD: all go with it
    target->mr = nullptr;
    gone->qp = nullptr;
    gone->cq = nullptr;
    gone->pd = nullptr;
    gone->ctx = nullptr;

    // The next contexts on the device, each with QPs ready to receive anything.
    std::vector<std::unique_ptr<Endpoint>> next;
    for (int i = 0; i < 3; ++i) next.push_back(std::make_unique<Endpoint>(devices().b, opt));
    std::vector<std::unique_ptr<Buffer>> landing;
    for (auto& e : next) {
        CHECK(e->qp->qp_num != dead_qpn);
        CHECK((e->qp->qp_num >> 12) != (dead_qpn >> 12));  // another slot
        // Connected to the peer's QP, as the old QP was: only the QPN tells them apart.
        to_rts(*e, peer.qp->qp_num, peer.gid, opt);
        landing.push_back(std::make_unique<Buffer>(e->pd, 1 << 16, kAccess));
        std::memset(landing.back()->bytes.data(), 0x5a, landing.back()->bytes.size());
    }
    fill_pattern(src.bytes.data(), src.bytes.size(), 77);
    for (int i = 0; i < 4; ++i)
        REQUIRE(post_rdma(peer.qp, IBV_WR_RDMA_WRITE, src, 0, 1 << 16, target_addr, target_rkey,
                          i) == 0);
    // The peer gives up (nobody answers for the dead QPN)...
    const auto wcs = wait_completions(peer.cq, 4);
    REQUIRE(wcs.size() == 4);
    CHECK(wcs[0].status == IBV_WC_RETRY_EXC_ERR);
    // ...while its packets reached the device and were refused by QPN.
    uint64_t refused = 0;
    for (auto& e : next) refused += counter(e->ctx, "rx_unknown_qp");
    CHECK(refused > 0);
    for (size_t i = 0; i < next.size(); ++i) {
        ibv_wc wc{};
        CHECK(ibv_poll_cq(next[i]->cq, 1, &wc) == 0);
        CHECK(std::all_of(landing[i]->bytes.begin(), landing[i]->bytes.end(),
                          [](uint8_t b) { return b == 0x5a; }));
        CHECK(next[i]->state() == IBV_QPS_RTS);
    }
}

// Destroys `one`'s QP, then waits (5 s at most) until each side has received all the other
// sent: the last ACKs a destroyed QP sends are counted at both ends.
static void destroy_qp_and_settle(Endpoint& one, Endpoint& other) {
    REQUIRE(ibv_destroy_qp(one.qp) == 0);
    one.qp = nullptr;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < end &&
           (counter(one.ctx, "tx_packets") != counter(other.ctx, "rx_packets") ||
            counter(other.ctx, "tx_packets") != counter(one.ctx, "rx_packets")))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(counter(one.ctx, "tx_packets") == counter(other.ctx, "rx_packets"));
    REQUIRE(counter(other.ctx, "tx_packets") == counter(one.ctx, "rx_packets"));
}

TEST_CASE("A device's counters cover all its contexts, including closed ones", "[sharing]") {
    // Two pairs on the same two devices; one pair is closed before the totals are read.
    Endpoint watcher(devices().b);  // stays open: reads the device's counters
    const uint64_t tx0 = device_counter(watcher.ctx, "tx_packets");
    const uint64_t rx0 = device_counter(watcher.ctx, "rx_packets");
    uint64_t tx_closed = 0, rx_closed = 0;
    {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        exchange_and_verify(a, b, 21);
        // Each QP sends its last ACK again as it is destroyed: one side at a time, each
        // ACK arrived, before b's figures are taken.
        destroy_qp_and_settle(a, b);
        destroy_qp_and_settle(b, a);
        tx_closed = counter(b.ctx, "tx_packets");
        rx_closed = counter(b.ctx, "rx_packets");
        REQUIRE(tx_closed > 0);
        REQUIRE(rx_closed > 0);
    }
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    exchange_and_verify(a, b, 22);
    // Every packet the device sent or received since tx0/rx0 was counted by one of b's two
    // contexts (the watcher sent and received none): the totals add up exactly.
    CHECK(counter(watcher.ctx, "tx_packets") == 0);
    CHECK(device_counter(watcher.ctx, "tx_packets") - tx0 ==
          tx_closed + counter(b.ctx, "tx_packets"));
    CHECK(device_counter(watcher.ctx, "rx_packets") - rx0 ==
          rx_closed + counter(b.ctx, "rx_packets"));
    // A context's own counters start from zero even when its slot held an earlier context's.
    CHECK(counter(b.ctx, "tx_packets") < device_counter(b.ctx, "tx_packets"));
}

TEST_CASE("Contexts of one device share the per-QP source ports", "[sharing]") {
    // QPs send from 49152 + a hash of their QPN. Two contexts whose QPs hash to the same port
    // both send from it (it is bound with SO_REUSEPORT), none falls back to the device port.
    Endpoint a(devices().a), peer(devices().b);
    const uint16_t port = uroce::transport::source_port_for_qpn(a.qp->qp_num);
    Endpoint other(devices().a);
    ibv_qp* same = nullptr;
    std::vector<ibv_qp*> tried;
    ibv_qp_init_attr init{};
    init.send_cq = other.cq;
    init.recv_cq = other.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {16, 16, 1, 1, 0};
    for (int i = 0; i < 1000 && !same; ++i) {
        ibv_qp* q = ibv_create_qp(other.pd, &init);
        REQUIRE(q);
        if (uroce::transport::source_port_for_qpn(q->qp_num) == port)
            same = q;
        else
            tried.push_back(q);
    }
    for (ibv_qp* q : tried) ibv_destroy_qp(q);
    REQUIRE(same);
    // Both send: a to peer, and the other context's QP (same source port) to peer as well.
    connect(a, peer);
    Endpoint peer2(devices().b);
    std::swap(other.qp, same);  // the fixture connects other.qp; `same` now holds the first QP
    connect(other, peer2);
    exchange_and_verify(a, peer, 31);
    exchange_and_verify(other, peer2, 32);
    CHECK(counter(a.ctx, "tx_sport_fallback") == 0);
    CHECK(counter(other.ctx, "tx_sport_fallback") == 0);
    ibv_destroy_qp(same);
}

TEST_CASE("Each QP counts its own packets and bytes", "[sharing]") {
    // Exact byte counts below: no resend, not even an early one that a stall on a loaded
    // machine would cause with adaptive retransmission; the local ACK timeout alone is 67 ms.
    ::setenv("UROCE_RETRANSMIT", "ack-timeout", 1);
    Endpoint a(devices().a), b(devices().b);
    ::unsetenv("UROCE_RETRANSMIT");
    // A second QP in a's context, idle: it counts nothing of a.qp's traffic.
    ibv_qp_init_attr init{};
    init.send_cq = a.cq;
    init.recv_cq = a.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {16, 16, 1, 1, 0};
    ibv_qp* idle = ibv_create_qp(a.pd, &init);
    REQUIRE(idle);
    connect(a, b);
    exchange_and_verify(a, b, 41);  // WRITE and SEND of kMsg from a, READ of kMsg by a
    REQUIRE(qp_counter(a.qp, "retransmitted_packets") == 0);  // loopback: nothing lost
    // Every packet of a's context was a.qp's.
    CHECK(qp_counter(a.qp, "tx_packets") == counter(a.ctx, "tx_packets"));
    CHECK(qp_counter(a.qp, "rx_packets") == counter(a.ctx, "rx_packets"));
    CHECK(qp_counter(a.qp, "tx_payload_bytes") == 2 * kMsg);
    CHECK(qp_counter(a.qp, "rx_payload_bytes") == kMsg);
    CHECK(qp_counter(b.qp, "rx_payload_bytes") == 2 * kMsg);
    CHECK(qp_counter(b.qp, "tx_payload_bytes") == kMsg);
    for (const char* name : {"tx_packets", "rx_packets", "tx_payload_bytes", "rx_payload_bytes"})
        CHECK(qp_counter(idle, name) == 0);
    REQUIRE(ibv_destroy_qp(idle) == 0);
    CHECK_THROWS(qp_counter(a.qp, "no_such_counter"));
}

TEST_CASE("A context past 4096 QPs is reached on every QP, beside another context of its device",
          "[sharing]") {
    // The device's other context holds a slot of its own: a packet for one of the big
    // context's further slots that steering did not route would land there (refused,
    // rx_unknown_qp) or nowhere, and the WRITE on that QP would fail.
    Endpoint other(devices().b);
    Endpoint big(devices().b);
    Endpoint a(devices().a);
    constexpr size_t kPairs = 32;
    constexpr size_t kChunk = 8192;  // two packets at MTU 4096
    const uint32_t first_slot = big.qp->qp_num >> 12;

    const QpOptions opt;
    const auto create = [](Endpoint& e) {
        ibv_qp_init_attr init{};
        init.send_cq = e.cq;
        init.recv_cq = e.cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = 2;
        init.cap.max_recv_wr = 2;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        return ibv_create_qp(e.pd, &init);
    };
    // The first slot's numbers all taken (the endpoint's own QP is one), then kPairs more.
    std::vector<ibv_qp*> filler;
    std::vector<ibv_qp*> far;
    const auto destroy_all = [&] {
        for (ibv_qp* q : far) ibv_destroy_qp(q);
        for (ibv_qp* q : filler) ibv_destroy_qp(q);
    };
    for (size_t i = 1; i < 4096 + kPairs; ++i) {
        ibv_qp* q = create(big);
        if (!q) break;
        ((q->qp_num >> 12) == first_slot ? filler : far).push_back(q);
    }
    INFO("QPs in the first slot " << filler.size() + 1 << ", past it " << far.size());
    REQUIRE(filler.size() + 1 == 4096);
    REQUIRE(far.size() == kPairs);
    std::set<uint32_t> far_slots;
    for (ibv_qp* q : far) far_slots.insert(q->qp_num >> 12);
    CHECK(far_slots.size() == 1);
    CHECK(!far_slots.contains(first_slot));
    CHECK(!far_slots.contains(other.qp->qp_num >> 12));

    std::vector<ibv_qp*> peers;
    for (size_t i = 0; i < kPairs; ++i) {
        ibv_qp* q = create(a);
        REQUIRE(q);
        peers.push_back(q);
    }
    for (size_t i = 0; i < kPairs; ++i) {
        to_rts(peers[i], far[i]->qp_num, big.gid, opt);
        to_rts(far[i], peers[i]->qp_num, a.gid, opt);
    }
    Buffer src(a.pd, kPairs * kChunk, kAccess);
    Buffer dst(big.pd, kPairs * kChunk, kAccess);
    Buffer back(a.pd, kPairs * kChunk, kAccess);
    fill_pattern(src.bytes.data(), src.bytes.size(), 41);
    std::memset(dst.bytes.data(), 0xee, dst.bytes.size());
    std::memset(back.bytes.data(), 0xee, back.bytes.size());
    // a -> big: WRITEs into the further slot's QPs; big -> a: SENDs out of them (their ACKs
    // come back to the further slot).
    for (size_t i = 0; i < kPairs; ++i) {
        REQUIRE(post_rdma(peers[i], IBV_WR_RDMA_WRITE, src, i * kChunk, kChunk,
                          dst.addr() + i * kChunk, dst.mr->rkey, i) == 0);
        REQUIRE(post_recv_buf(peers[i], back, i * kChunk, kChunk, 100 + i) == 0);
    }
    auto wcs = wait_completions(a.cq, kPairs);
    REQUIRE(wcs.size() == kPairs);
    for (const ibv_wc& wc : wcs) CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), dst.bytes.size()) == 0);
    for (size_t i = 0; i < kPairs; ++i)
        REQUIRE(post_send_msg(far[i], dst, i * kChunk, kChunk, 200 + i) == 0);
    const auto sent = wait_completions(big.cq, kPairs);
    const auto received = wait_completions(a.cq, kPairs);
    REQUIRE(sent.size() == kPairs);
    REQUIRE(received.size() == kPairs);
    for (const ibv_wc& wc : sent) CHECK(wc.status == IBV_WC_SUCCESS);
    for (const ibv_wc& wc : received) {
        CHECK(wc.status == IBV_WC_SUCCESS);
        CHECK(wc.byte_len == kChunk);
    }
    CHECK(std::memcmp(back.bytes.data(), src.bytes.data(), back.bytes.size()) == 0);
    // Nothing went astray to the other context.
    CHECK(counter(other.ctx, "rx_unknown_qp") == 0);
    for (ibv_qp* q : peers) ibv_destroy_qp(q);
    destroy_all();
}
