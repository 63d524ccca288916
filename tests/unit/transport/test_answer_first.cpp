// An RC answer that leads the ACK it carries (Engine::answer_may_lead_ack, RcQp::leads_ack):
// to a uroce device of this host whose contexts all read with GRO, a SEND answer goes first
// and its held ACK closes the GSO train of its last packet; the requester takes that ACK
// first (train_order.h), so its send completion still comes before the answer's receive
// completion. Anything that would put the ACK in a datagram of its own keeps it ahead of the
// answer's last packet, the one that completes a receive at the requester (RcQp::
// send_with_ack): the packets before that one go first, and the ACK closes their train.
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/scratch_dir.h"
#include "transport/device_slots.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kLen = 64;

// ACKs held until the answer (never by time; holding_acks), the engines each other's host
// devices unless `host_peers` is false.
PairOptions holding(bool host_peers = true) {
    PairOptions o = holding_acks();
    o.host_peers = host_peers;
    return o;
}

// a and b connected, a's QP completing sends and receives on one CQ (a.scq), so that the
// order a takes an ACK and an answer in shows; b has answered once (a WRITE), so b holds the
// ACKs of a's requests for its application's answer.
struct AnsweringPair {
    Pair p;
    explicit AnsweringPair(const PairOptions& o) : p(o) {
        p.a.engine->detach(p.a.qp->qpn());
        p.a.qp = std::make_shared<RcQp>(*p.a.engine, p.a.engine->allocate_qpn(), kPd,
                                        QpCaps{512, 512, kMaxSge, kMaxSge, kMaxInlineData}, p.a.scq,
                                        p.a.scq, &p.a);
        p.a.engine->attach(p.a.qp);
        QpAttributes attrs = default_attributes();
        attrs.timeout = 31;  // hours: no resend while b holds an ACK
        p.connect(attrs, attrs);
        fill(p.b.at(0), kLen, 1);
        REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.b.sge(0, kLen)},
                                           p.a.iova + 32768, p.a.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.b.scq).status == WcStatus::Success);
    }
    // a SENDs `seed` to b; b's engine thread reads it and holds the ACK (tx_held_acks
    // counts a QP's notes, not each ACK it holds: no use here). The request's completion is
    // taken from b's CQ directly, not through a poll of b's engine, which would send the ACK.
    void request(uint64_t seed) {
        REQUIRE(p.b.qp->post_recv(recv_wqe(seed, {p.b.sge(4096, kLen)})) == 0);
        fill(p.a.at(0), kLen, seed);
        REQUIRE(p.a.qp->post_send(send_wqe(seed, {p.a.sge(0, kLen)})) == 0);
        Completion c;
        REQUIRE(eventually([&] { return p.b.rcq->poll(std::span(&c, 1)) == 1; }));
        CHECK(c.wr_id == seed);
        CHECK(c.status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(4096), kLen, seed) == kLen);
    }
    // a's completions, in order, until `n` or kWait.
    std::vector<Completion> a_completions(size_t n) { return p.wait(*p.a.scq, n); }
};

size_t index_of(const std::vector<SentPacket>& sent, wire::Opcode op) {
    for (size_t i = 0; i < sent.size(); ++i)
        if (sent[i].opcode() == static_cast<uint8_t>(op)) return i;
    return sent.size();
}

// b answers a's request `seed` with `answer` (a receives it at 8192, at most `recv_len`
// bytes); returns what b sent.
std::vector<SentPacket> answer_with(AnsweringPair& ap, uint64_t seed, const SendWqe& answer,
                                    uint32_t recv_len = 2 * kMtu) {
    Pair& p = ap.p;
    REQUIRE(p.a.qp->post_recv(recv_wqe(answer.wr_id, {p.a.sge(8192, recv_len)})) == 0);
    ap.request(seed);
    TxRecorder b_out(*p.b.engine);
    REQUIRE(p.b.qp->post_send(answer) == 0);
    const auto got = ap.a_completions(2);
    REQUIRE(got.size() == 2);
    // Whatever went first on the wire, a completes its request before the answer.
    CHECK(got[0].wr_id == seed);
    CHECK(got[0].status == WcStatus::Success);
    CHECK(got[1].wr_id == answer.wr_id);
    CHECK(got[1].status == WcStatus::Success);
    CHECK(got[1].byte_len == answer.length);
    CHECK(got[1].imm == answer.imm);
    CHECK(first_mismatch(p.a.at(8192), answer.length, answer.wr_id) == answer.length);
    CHECK(p.b.counters().held_ack_timeouts.load() == 0);
    return b_out.packets();
}

// b's SEND answer of `len` bytes, from b's memory at `from` (not 4096, where b takes a's
// requests), filled with pattern `wr_id`.
SendWqe send_answer(Pair& p, uint64_t wr_id, uint32_t len, uint32_t from = 0) {
    fill(p.b.at(from), len, wr_id);
    SendWqe w = len ? send_wqe(wr_id, {p.b.sge(from, len)}) : send_wqe(wr_id, {});
    return w;
}

// b answers with SENDs of 2 and 20 whole packets, from seed on. To a device of this host
// (`host_peer`) the answer leads and the ACK closes its train; to another, the ACK closes the
// train of the packets before the LAST, which follows alone. One GSO train either way.
void answer_whole_packets(bool host_peer, uint64_t seed) {
    AnsweringPair ap(holding(host_peer));
    Pair& p = ap.p;
    for (const uint32_t npkts : {2u, 20u}) {
        CAPTURE(npkts);
        const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
        const uint32_t len = npkts * kMtu;
        const auto sent = answer_with(ap, seed, send_answer(p, seed + 1, len, 16384), len);
        seed += 2;
        REQUIRE(sent.size() == npkts + 1);
        CHECK(index_of(sent, wire::Opcode::RcSendFirst) == 0);
        CHECK(index_of(sent, wire::Opcode::RcSendLast) == (host_peer ? npkts - 1 : npkts));
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == (host_peer ? npkts : npkts - 1));
        CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 1);
    }
}

}  // namespace

TEST_CASE("A SEND answer to a device of this host leads its ACK in one train", "[answer_first]") {
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
    const auto sent = answer_with(ap, 11, send_answer(p, 12, kLen));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcSendOnly) == 0);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
    CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 1);
    // a took the train's closing ACK first (its request completed before the answer).
    CHECK(p.a.counters().rx_gro_datagrams.load() >= 1);
}

TEST_CASE("A SEND answer leads its ACK again and again", "[answer_first]") {
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
    for (uint64_t i = 0; i < 20; ++i) {
        const auto sent = answer_with(ap, 100 + 2 * i, send_answer(p, 101 + 2 * i, kLen + i));
        REQUIRE(sent.size() == 2);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
    }
    CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 20);
}

TEST_CASE("A SEND answer of no bytes keeps its ACK first", "[answer_first]") {
    // Shorter than the ACK: the ACK could not close its train.
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    const auto sent = answer_with(ap, 21, send_answer(p, 22, 0));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
    CHECK(index_of(sent, wire::Opcode::RcSendOnly) == 1);
}

TEST_CASE("A SEND answer whose last packet is short keeps its ACK ahead of that packet",
          "[answer_first]") {
    // The short last packet closes the train of the full one: the ACK could not follow it.
    // It closes the full packet's train instead.
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
    const auto sent = answer_with(ap, 31, send_answer(p, 32, kMtu + 100));
    REQUIRE(sent.size() == 3);
    CHECK(index_of(sent, wire::Opcode::RcSendFirst) == 0);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
    CHECK(index_of(sent, wire::Opcode::RcSendLast) == 2);
    CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 1);  // FIRST and the ACK
}

TEST_CASE("A SEND answer of whole packets leads its ACK, which closes the last train",
          "[answer_first]") {
    answer_whole_packets(true, 33);
}

TEST_CASE("A SEND answer with an immediate leads its ACK in its last packet's train",
          "[answer_first]") {
    // The last packet carries the ImmDt: longer than the full ones, it starts a train.
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    SendWqe answer = send_answer(p, 38, 2 * kMtu, 16384);
    answer.opcode = SendOpcode::SendWithImm;
    answer.imm = 0x5eed;
    const auto sent = answer_with(ap, 37, answer);
    REQUIRE(sent.size() == 3);
    CHECK(index_of(sent, wire::Opcode::RcSendFirst) == 0);
    CHECK(index_of(sent, wire::Opcode::RcSendLastImm) == 1);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 2);
}

TEST_CASE("A SEND answer of a batch's packets or more keeps its ACK ahead of its last packet",
          "[answer_first]") {
    PairOptions o = holding();
    o.mem_bytes = 256 * 1024;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    const uint32_t len = TransmitBatch::kMaxPackets * kMtu;
    const auto sent = answer_with(ap, 39, send_answer(p, 40, len, 131072), len);
    REQUIRE(sent.size() == TransmitBatch::kMaxPackets + 1);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == TransmitBatch::kMaxPackets - 1);
    CHECK(index_of(sent, wire::Opcode::RcSendLast) == TransmitBatch::kMaxPackets);
}

TEST_CASE("A SEND answer keeps its ACK first while packets may be faulted", "[answer_first]") {
    // A faulted packet leaves alone (here: each marked CE), so no train carries the ACK.
    PairOptions o = holding();
    o.faults_b.ce = 1.0;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    const auto sent = answer_with(ap, 45, send_answer(p, 46, kLen));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
}

TEST_CASE("A SEND answer leads its ACK while faults can only lose packets", "[answer_first]") {
    // A rule that loses packets never sends one alone: the train stays as it would be. The
    // rule sees only CNPs, which b never sends: it is on, and loses nothing here.
    for (const bool burst : {false, true}) {
        CAPTURE(burst);
        PairOptions o = holding();
        if (burst)
            o.faults_b.burst_enter = 1.0;
        else
            o.faults_b.drop = 1.0;
        o.faults_b.op_classes = kOpCnp;
        AnsweringPair ap(o);
        Pair& p = ap.p;
        const uint64_t trains0 = p.b.counters().tx_gso_sends.load();
        const auto sent = answer_with(ap, 91, send_answer(p, 92, kLen));
        REQUIRE(sent.size() == 2);
        CHECK(index_of(sent, wire::Opcode::RcSendOnly) == 0);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
        CHECK(p.b.counters().tx_gso_sends.load() == trains0 + 1);
    }
}

TEST_CASE("A SEND answer lost from the train its ACK closes comes again, after that ACK",
          "[answer_first]") {
    // b's first SEND packet is lost: the ACK it led goes alone, a completes its request, and
    // b's tail-loss probe (adaptive retransmission on) brings the answer. Not a's: when the
    // machine held b's answer back past a's first wait (1 ms, no round trip measured), a
    // probed its request and b's ACK of that duplicate went out before b's answer (29 times
    // in 80 runs beside three busy loops).
    PairOptions o = holding();
    o.adaptive = true;
    o.adaptive_a = false;
    o.faults_b.drop = 1.0;
    o.faults_b.op_classes = kOpSend;
    o.faults_b.until = 1;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    const auto sent = answer_with(ap, 93, send_answer(p, 94, kLen));
    CHECK(p.b.counters().tx_dropped_fault.load() == 1);
    CHECK(p.b.counters().tail_probes.load() >= 1);
    CHECK(p.a.counters().tail_probes.load() == 0);
    REQUIRE(sent.size() >= 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
    CHECK(index_of(sent, wire::Opcode::RcSendOnly) == 1);
}

TEST_CASE("A SEND answer to a device that is not this host's keeps its ACK first",
          "[answer_first]") {
    AnsweringPair ap(holding(false));
    Pair& p = ap.p;
    const auto sent = answer_with(ap, 41, send_answer(p, 42, kLen));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
}

TEST_CASE("A long SEND answer to another host's device: the ACK closes its first train",
          "[answer_first]") {
    // What a 64 KiB answer does between network namespaces or to another host: the packets
    // that complete nothing at a go first, the ACK closes their train, the last packet
    // follows alone. Two datagrams, not the ACK alone and then the answer.
    answer_whole_packets(false, 43);
}

TEST_CASE("A SEND answer to a context that reads without GRO completes after the request",
          "[answer_first]") {
    // a reads datagram by datagram, in wire order, as the kernel's rxe or a NIC would: the
    // ACK must be on the wire before the packet that completes a's receive (answer_with
    // checks a's completion order).
    PairOptions o = holding();
    o.gro_a = false;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    uint64_t seed = 47;
    for (const uint32_t npkts : {1u, 2u, 7u}) {
        const uint32_t len = npkts * kMtu;
        SendWqe answer = send_answer(p, seed + 1, len, 16384);
        if (npkts == 7) {  // the last packet with an immediate
            answer.opcode = SendOpcode::SendWithImm;
            answer.imm = 0x4747;
        }
        const auto sent = answer_with(ap, seed, answer, len);
        seed += 2;
        REQUIRE(sent.size() == npkts + 1);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == npkts - 1);
    }
}

TEST_CASE("A SEND answer to a context that reads without GRO keeps its ACK first",
          "[answer_first]") {
    PairOptions o = holding();
    o.gro_a = false;  // a counts itself in its device's table: b sees it at RTR
    AnsweringPair ap(o);
    Pair& p = ap.p;
    const auto sent = answer_with(ap, 51, send_answer(p, 52, kLen));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
}

TEST_CASE("A SEND answer from a context without GSO keeps its ACK first", "[answer_first]") {
    PairOptions o = holding();
    o.gso_b = false;
    AnsweringPair ap(o);
    Pair& p = ap.p;
    const auto sent = answer_with(ap, 61, send_answer(p, 62, kLen));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
}

TEST_CASE("A SEND answer keeps its ACK first once the path refused GSO", "[answer_first]") {
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    // No UDP checksum: the kernel refuses a GSO train (EINVAL), and b's engine sends packet
    // by packet from then on, which would put its ACK after the answer.
    const int fd = p.b.engine->sender_for_qpn(p.b.qp->qpn()).fd();
    const int one = 1;
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_NO_CHECK, &one, sizeof one) == 0);
    fill(p.b.at(0), 3 * kMtu, 65);
    REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 65, {p.b.sge(0, 3 * kMtu)},
                                       p.a.iova + 32768, p.a.keys.rkey)) == 0);
    REQUIRE(p.wait_one(*p.b.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.a.at(32768), 3 * kMtu, 65) == 3 * kMtu);
    REQUIRE_FALSE(p.b.engine->gso_enabled());

    const auto sent = answer_with(ap, 66, send_answer(p, 67, kLen));
    REQUIRE(sent.size() == 2);
    CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
}

TEST_CASE("A busy poller's SEND answer leads its ACK; two answers of two sizes do not",
          "[answer_first]") {
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    // One answer, at once (nothing of b's in flight: RcQp::may_wait), and one held for the
    // poll (held_posts.h; a WRITE of b's in flight) that leaves from send_held(): each leads
    // the ACK.
    const auto request_and_answer = [&](uint64_t seed, bool held) {
        REQUIRE(p.a.qp->post_recv(recv_wqe(seed + 1, {p.a.sge(8192, kLen)})) == 0);
        polled_request(p, seed);
        TxRecorder b_out(*p.b.engine);
        REQUIRE(p.b.qp->post_send(send_answer(p, seed + 1, kLen)) == 0);
        if (held) {
            CHECK(b_out.packets().empty());
            p.b.engine->on_cq_poll(false);
        }
        const auto sent = b_out.packets();
        REQUIRE(sent.size() == 2);
        CHECK(index_of(sent, wire::Opcode::RcSendOnly) == 0);
        CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 1);
    };
    const auto check_a = [&](uint64_t seed) {
        const auto got = ap.a_completions(2);
        REQUIRE(got.size() == 2);
        CHECK(got[0].wr_id == seed);
        CHECK(got[1].wr_id == seed + 1);
        CHECK(first_mismatch(p.a.at(8192), kLen, seed + 1) == kLen);
    };
    parked_and_gated(*p.b.engine, [&] { request_and_answer(69, false); });
    check_a(69);
    parked_and_gated(*p.b.engine, [&] {
        with_b_write_in_flight(p, 76, 2048, 40960, kLen, [&] { request_and_answer(71, true); });
    });
    check_a(71);
    CHECK(first_mismatch(p.a.at(40960), kLen, 76) == kLen);

    // Two answers of two sizes in one poll's batch: the second would close a train of its
    // own, the first alone before it, so the ACK goes first.
    REQUIRE(p.a.qp->post_recv(recv_wqe(74, {p.a.sge(8192, kLen)})) == 0);
    REQUIRE(p.a.qp->post_recv(recv_wqe(75, {p.a.sge(12288, kLen)})) == 0);
    parked_and_gated(*p.b.engine, [&] {
        with_b_write_in_flight(p, 77, 2048, 40960, kLen, [&] {
            polled_request(p, 73);
            TxRecorder b_out(*p.b.engine);
            fill(p.b.at(0), kLen, 74);
            fill(p.b.at(1024), kLen / 2, 75);
            REQUIRE(p.b.qp->post_send(send_wqe(74, {p.b.sge(0, kLen)})) == 0);
            REQUIRE(p.b.qp->post_send(send_wqe(75, {p.b.sge(1024, kLen / 2)})) == 0);
            CHECK(b_out.packets().empty());  // both held for the poll, with the ACK
            p.b.engine->on_cq_poll(false);
            const auto sent = b_out.packets();
            REQUIRE(sent.size() == 3);
            CHECK(index_of(sent, wire::Opcode::RcAcknowledge) == 0);
        });
    });
    const auto got = ap.a_completions(3);
    REQUIRE(got.size() == 3);
    CHECK(got[0].wr_id == 73);
    CHECK(got[1].wr_id == 74);
    CHECK(got[2].wr_id == 75);
    CHECK(first_mismatch(p.a.at(8192), kLen, 74) == kLen);
    CHECK(first_mismatch(p.a.at(12288), kLen / 2, 75) == kLen / 2);
}

TEST_CASE("A busy poller's held ACK outlasts one poll that finds completions, not two",
          "[answer_first]") {
    // ib_send_lat's requester polls its send CQ, then its receive CQ, then answers: the
    // poll that takes the batch's completion must not send the ACK the answer will carry.
    AnsweringPair ap(holding());
    Pair& p = ap.p;
    parked_and_gated(*p.b.engine, [&] {
        polled_request(p, 81);
        CHECK(first_mismatch(p.b.at(4096), kLen, 81) == kLen);
        const uint64_t acks0 = p.b.counters().tx_acks.load();
        p.b.engine->on_cq_poll(false);
        CHECK(p.b.counters().tx_acks.load() == acks0);  // held on
        p.b.engine->on_cq_poll(false);
        CHECK(p.b.counters().tx_acks.load() == acks0 + 1);
    });
    const auto got = ap.a_completions(1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].wr_id == 81);
    CHECK(got[0].status == WcStatus::Success);
}

TEST_CASE("Whether an answer may lead its ACK: a device of this host, all reading with GRO",
          "[answer_first]") {
    const auto dir = scratch_dir("uroce-answer");
    const std::string table = (dir / "slots").string();
    const Addresses self = next_addresses();
    const Addresses peer = next_addresses();
    const Addresses more = next_addresses();
    const uroce::IpAddress elsewhere = ipv4(192, 0, 2, 1);  // TEST-NET-1: no address of this host
    EngineConfig config;
    config.ip = self.a;
    config.port = self.port;
    config.host_devices = {{peer.a, self.port, table},
                           {elsewhere, self.port, table},
                           {peer.b, static_cast<uint16_t>(self.port + 1), table},
                           {more.a, self.port, (dir / "never-opened").string()}};
    auto engine = make_engine(config);
    CHECK_FALSE(engine->answer_may_lead_ack(peer.a));  // no context opened the device yet

    EngineConfig device;
    device.ip = peer.a;
    device.port = self.port;
    device.slot_table = table;
    auto reader = make_engine(device);
    CHECK(engine->answer_may_lead_ack(peer.a));
    CHECK_FALSE(engine->answer_may_lead_ack(peer.b));     // another port
    CHECK_FALSE(engine->answer_may_lead_ack(elsewhere));  // not of this network namespace
    CHECK_FALSE(engine->answer_may_lead_ack(self.b));     // not a device of this host
    CHECK_FALSE(engine->answer_may_lead_ack(more.a));     // its table cannot be read

    // Contexts of the device that read without GRO (their own addresses: a count in the
    // table is all that matters), counted up at open and down at close.
    SharedValueReader split_readers(table);
    EngineConfig split = device;
    split.gro = false;
    split.ip = more.b;
    auto split1 = make_engine(split);
    CHECK(split_readers.read(Engine::kSplitReadersValue) == 1u);
    CHECK_FALSE(engine->answer_may_lead_ack(peer.a));
    split.ip = self.b;
    auto split2 = make_engine(split);
    CHECK(split_readers.read(Engine::kSplitReadersValue) == 2u);
    split1.reset();
    CHECK(split_readers.read(Engine::kSplitReadersValue) == 1u);
    CHECK_FALSE(engine->answer_may_lead_ack(peer.a));
    split2.reset();
    CHECK(split_readers.read(Engine::kSplitReadersValue) == 0u);
    CHECK(engine->answer_may_lead_ack(peer.a));

    // This engine must send and read trains itself.
    engine.reset();
    config.gro = false;
    engine = make_engine(config);
    CHECK_FALSE(engine->answer_may_lead_ack(peer.a));
    engine.reset();
    config.gro = true;
    config.gso = false;
    engine = make_engine(config);
    CHECK_FALSE(engine->answer_may_lead_ack(peer.a));
}
