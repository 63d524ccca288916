// Congestion notification (congestion.h): a QP that takes a packet marked ECN Congestion
// Experienced from its peer sends the peer's QP a CNP (paced, never to a spoofed source),
// and an RC QP that takes a CNP from its peer halves its send window once per flight.
//
// The marks are real: a test socket sets the ECN field of what it sends (IP_TOS), or
// UROCE_FAULTS' ce marks an engine's packets on their way out, and the receiving engine
// reads the field from the kernel (IP_RECVTOS).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/net_namespace.h"
#include "tests/unit/transport/uc_pair.h"
#include "transport/congestion.h"
#include "transport/send_sockets.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using uroce::IpAddress;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

// A UDP socket at ip:port that plays a peer by hand: what it sends carries ECN field
// `ecn` (IP_TOS), as if a congested switch had marked it.
class MarkingSocket {
  public:
    MarkingSocket(const IpAddress& ip, uint16_t port) : ip_(ip), port_(port) {
        fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in sa = address(ip, port);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    }
    ~MarkingSocket() { ::close(fd_); }
    MarkingSocket(const MarkingSocket&) = delete;
    MarkingSocket& operator=(const MarkingSocket&) = delete;

    void mark(uint8_t ecn) {
        const int tos = ecn;
        REQUIRE(::setsockopt(fd_, IPPROTO_IP, IP_TOS, &tos, sizeof tos) == 0);
    }
    // Sends headers `h` and `payload` to to_ip:port as one RoCEv2 packet (ICRC included).
    void send(const wire::Headers& h, std::span<const uint8_t> payload, const IpAddress& to_ip) {
        const auto pkt = forge_packet(h, payload, wire::IpFlow{ip_, to_ip, port_, port_});
        sockaddr_in to = address(to_ip, port_);
        REQUIRE(::sendto(fd_, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&to),
                         sizeof to) == static_cast<ssize_t>(pkt.size()));
    }
    struct Received {
        std::vector<uint8_t> bytes;
        uint16_t src_port;
    };
    // The next datagram whose first byte is `opcode`, skipping others, or nothing within
    // `timeout`.
    std::optional<Received> next_with_opcode(uint8_t opcode, std::chrono::milliseconds timeout) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        for (int i = 0; i < 100; ++i) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                end - std::chrono::steady_clock::now());
            if (left.count() <= 0) break;
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
            Received r{std::vector<uint8_t>(9000), 0};
            sockaddr_in from{};
            socklen_t len = sizeof from;
            const ssize_t n = ::recvfrom(fd_, r.bytes.data(), r.bytes.size(), 0,
                                         reinterpret_cast<sockaddr*>(&from), &len);
            if (n <= 0) continue;
            r.bytes.resize(static_cast<size_t>(n));
            r.src_port = ntohs(from.sin_port);
            if (r.bytes[0] == opcode) return r;
        }
        return std::nullopt;
    }

  private:
    static sockaddr_in address(const IpAddress& ip, uint16_t port) {
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(ip.v4());
        sa.sin_port = htons(port);
        return sa;
    }
    int fd_ = -1;
    IpAddress ip_;
    uint16_t port_;
};

constexpr uint8_t kCnpOpcode = static_cast<uint8_t>(wire::Opcode::Cnp);

wire::Headers send_only(uint32_t dest_qp, uint32_t psn) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcSendOnly);
    h.bth.dest_qp = dest_qp;
    h.bth.psn = psn;
    h.bth.ack_req = true;
    return h;
}

// The highest PSN among the WRITE packets `rec` saw leave.
uint32_t highest_write_psn(const TxRecorder& rec) {
    uint32_t high = 0;
    for (const SentPacket& s : rec.packets()) {
        const wire::ParsedPacket p = s.parsed();
        if (p.info->flags & wire::kWrite) high = std::max(high, p.h.bth.psn);
    }
    return high;
}

}  // namespace

TEST_CASE("CnpPacer lets one CNP through per interval", "[congestion]") {
    CnpPacer pacer;
    const auto t0 = CnpPacer::Clock::time_point{} + 1h;
    CHECK(pacer.take(t0));
    CHECK_FALSE(pacer.take(t0));
    CHECK_FALSE(pacer.take(t0 + CnpPacer::kCnpInterval - 1ns));
    CHECK(pacer.take(t0 + CnpPacer::kCnpInterval));
    CHECK_FALSE(pacer.take(t0 + CnpPacer::kCnpInterval + 1us));
    CHECK(pacer.take(t0 + 10 * CnpPacer::kCnpInterval));
    // The first CNP ever is never held back, whatever the clock says.
    CnpPacer fresh;
    CHECK(fresh.take(CnpPacer::Clock::time_point{}));
}

TEST_CASE("A CE-marked packet from the peer is answered with a CNP to the peer's QP",
          "[congestion]") {
    PairOptions opt;
    opt.ecn = true;  // UROCE_ECN=on: the engine reads the ECN field of what arrives
    Pair p(opt);
    const uint16_t port = p.a.engine->config().port;
    const IpAddress peer_ip = next_addresses().a;
    MarkingSocket peer(peer_ip, port);
    constexpr uint32_t kPeerQpn = 0x4242;
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = peer_ip;
    attrs.dest_qpn = kPeerQpn;
    REQUIRE(p.a.qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
    REQUIRE(p.a.qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
    REQUIRE(p.a.qp->post_recv(recv_wqe(1, {p.a.sge(0, 64)})) == 0);
    REQUIRE(p.a.qp->post_recv(recv_wqe(2, {p.a.sge(64, 64)})) == 0);
    const uint32_t qpn = p.a.qp->qpn();
    const std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6, 7, 8};
    const EngineCounters& c = p.a.counters();

    peer.mark(kEcnCe);
    peer.send(send_only(qpn, attrs.rq_psn), data, p.a.ip);
    // The message itself is delivered as ever.
    const Completion r = p.wait_one(*p.a.rcq);
    REQUIRE(r.status == WcStatus::Success);
    CHECK(std::equal(data.begin(), data.end(), p.a.at(0)));

    const auto cnp = peer.next_with_opcode(kCnpOpcode, 5s);
    REQUIRE(cnp);
    // BTH: CNP, no flags but BECN, the default P_Key, the peer's QP, PSN 0; 16 reserved zero
    // bytes; the ICRC, for the QP's own source port.
    const std::vector<uint8_t>& b = cnp->bytes;
    REQUIRE(b.size() == wire::kBthBytes + wire::kCnpReservedBytes + wire::kIcrcBytes);
    CHECK(b[1] == 0x00);
    CHECK(b[2] == 0xff);
    CHECK(b[3] == 0xff);
    CHECK(b[4] == 0x40);
    CHECK((uint32_t{b[5]} << 16 | uint32_t{b[6]} << 8 | b[7]) == kPeerQpn);
    CHECK(std::all_of(b.begin() + 8, b.begin() + 12 + 16, [](uint8_t x) { return x == 0; }));
    CHECK(cnp->src_port == source_port_for_qpn(qpn));
    CHECK(wire::icrc_verify(wire::IpFlow{p.a.ip, peer_ip, cnp->src_port, port}, b) ==
          wire::IcrcCheck::Exact);
    CHECK(c.rx_ce_marked.load() == 1);
    // Counted once the socket took it: a moment after the peer may have it.
    REQUIRE(p.wait_until([&] { return c.tx_cnps.load() == 1; }));
    CHECK(c.cnps_paced.load() == 0);

    SECTION("every marked packet is answered or paced, never both") {
        // A duplicate of the SEND, marked too: answered again (an ACK), and either a CNP or
        // nothing, if it came within the interval.
        peer.send(send_only(qpn, attrs.rq_psn), data, p.a.ip);
        REQUIRE(p.wait_until([&] { return c.rx_ce_marked.load() == 2; }));
        REQUIRE(p.wait_until([&] { return c.tx_cnps.load() + c.cnps_paced.load() == 2; }));
        CHECK(c.tx_cnps.load() >= 1);
    }
    SECTION("an unmarked packet is not") {
        peer.mark(0);
        peer.send(send_only(qpn, attrs.rq_psn + 1), data, p.a.ip);
        REQUIRE(p.wait_one(*p.a.rcq).status == WcStatus::Success);
        CHECK(std::equal(data.begin(), data.end(), p.a.at(64)));
        CHECK_FALSE(peer.next_with_opcode(kCnpOpcode, 200ms));
        CHECK(c.rx_ce_marked.load() == 1);
        CHECK(c.tx_cnps.load() + c.cnps_paced.load() == 1);
    }
    SECTION("a marked packet from a spoofed source gets no CNP, there or anywhere") {
        const IpAddress spoofer_ip = next_addresses().a;
        MarkingSocket spoofer(spoofer_ip, port);
        spoofer.mark(kEcnCe);
        spoofer.send(send_only(qpn, attrs.rq_psn + 1), data, p.a.ip);
        REQUIRE(p.wait_until([&] { return c.rx_wrong_peer.load() == 1; }));
        CHECK_FALSE(spoofer.next_with_opcode(kCnpOpcode, 200ms));
        CHECK_FALSE(peer.next_with_opcode(kCnpOpcode, 10ms));
        CHECK(c.tx_cnps.load() + c.cnps_paced.load() == 1);
        CHECK(p.a.rcq->depth() == 0);
    }
    SECTION("a QP in ERR answers no mark, even from its peer") {
        REQUIRE(p.a.qp->modify(p.a.qp->attributes(), QpState::Rtr, QpState::Err) == 0);
        // Well past the pacing interval: a CNP would not be held back.
        std::this_thread::sleep_for(10 * CnpPacer::kCnpInterval);
        peer.send(send_only(qpn, attrs.rq_psn + 1), data, p.a.ip);
        REQUIRE(p.wait_until([&] { return c.rx_ce_marked.load() == 2; }));
        CHECK_FALSE(peer.next_with_opcode(kCnpOpcode, 200ms));
        CHECK(c.tx_cnps.load() + c.cnps_paced.load() == 1);
    }
}

TEST_CASE("Without UROCE_ECN the ECN field is not read: a marked packet draws no CNP",
          "[congestion]") {
    Pair p;
    const uint16_t port = p.a.engine->config().port;
    const IpAddress peer_ip = next_addresses().a;
    MarkingSocket peer(peer_ip, port);
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = peer_ip;
    attrs.dest_qpn = 0x4242;
    REQUIRE(p.a.qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
    REQUIRE(p.a.qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
    REQUIRE(p.a.qp->post_recv(recv_wqe(1, {p.a.sge(0, 64)})) == 0);
    const std::vector<uint8_t> data = {8, 7, 6, 5, 4, 3, 2, 1};
    peer.mark(kEcnCe);
    peer.send(send_only(p.a.qp->qpn(), attrs.rq_psn), data, p.a.ip);
    REQUIRE(p.wait_one(*p.a.rcq).status == WcStatus::Success);
    CHECK(std::equal(data.begin(), data.end(), p.a.at(0)));
    CHECK_FALSE(peer.next_with_opcode(kCnpOpcode, 200ms));
    CHECK(p.a.counters().rx_ce_marked.load() == 0);
    CHECK(p.a.counters().tx_cnps.load() + p.a.counters().cnps_paced.load() == 0);
}

TEST_CASE("A CNP from the peer halves the RC send window, once per flight", "[congestion]") {
    PairOptions opt;
    opt.mem_bytes = 2 * 1024 * 1024;
    opt.adaptive = false;  // no early resend (itself a cut of the window) while b is silent
    Pair p(opt);
    QpAttributes attrs = default_attributes();
    attrs.timeout = 18;  // 1 s: no retransmission while the test answers for b
    p.connect(attrs, attrs);
    // b receives a's packets but answers nothing: the test does, with forged packets.
    auto silent_b = std::make_unique<TxRecorder>(*p.b.engine, TxRecorder::LosePredicate{}, false);
    TxRecorder sent_by_a(*p.a.engine);
    const ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(),
                          p.a.qp->qpn()};
    const EngineCounters& c = p.a.counters();

    // 1 MiB of WRITE: far more packets than the window lets out unacknowledged.
    constexpr uint32_t kLen = 1024 * 1024;
    fill(p.a.at(0), kLen, 9);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kLen)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    // The window is full when nothing new leaves for a while.
    uint32_t window = 0;
    for (int i = 0; i < 100; ++i) {
        std::this_thread::sleep_for(20ms);
        const uint32_t high = highest_write_psn(sent_by_a) + 1;
        if (high == window) break;
        window = high;
    }
    REQUIRE(window >= 32);
    const uint32_t flight_start = attrs.sq_psn & wire::kPsnMask;
    REQUIRE(flight_start == 0);

    const wire::Headers cnp = cnp_headers(p.a.qp->qpn());
    const std::vector<uint8_t> reserved(wire::kCnpReservedBytes, 0);

    SECTION("a CNP from elsewhere changes nothing") {
        const ForgedPeer stranger{*p.a.engine, next_addresses().a, p.a.engine->config().port,
                                  p.b.qp->qpn(), p.a.qp->qpn()};
        stranger.inject(cnp, reserved);
        CHECK(c.rx_cnp.load() == 1);
        CHECK(c.rx_wrong_peer.load() == 1);
        CHECK(c.cnp_window_cuts.load() == 0);
        // A CNP for no QP, and one whose ICRC is wrong.
        wire::Headers nobody = cnp_headers(p.a.qp->qpn() + 1000);
        peer.inject(nobody, reserved);
        CHECK(c.rx_unknown_qp.load() == 1);
        auto bad = peer.forge(cnp, reserved);
        bad[20] ^= 1;
        p.a.engine->receive_datagram(bad, p.b.ip, p.a.engine->config().port);
        CHECK(c.rx_bad_icrc.load() == 1);
        CHECK(c.rx_cnp.load() == 2);
        CHECK(c.cnp_window_cuts.load() == 0);
    }
    SECTION("three CNPs for one flight cut it once, and fewer packets follow an ACK") {
        for (int i = 0; i < 3; ++i) peer.inject(cnp, reserved);
        CHECK(c.rx_cnp.load() == 3);
        CHECK(c.cnp_window_cuts.load() == 1);
        CHECK(c.send_window_cuts.load() == 0);  // not a loss

        // Half the flight and 10 more acknowledged: with the window halved, only about those
        // 10 may follow (plus its growth); with the whole window, half a window more would.
        const uint32_t before = highest_write_psn(sent_by_a);
        peer.inject(peer.ack(window / 2 + 9));
        std::this_thread::sleep_for(100ms);
        const uint32_t after = highest_write_psn(sent_by_a);
        CHECK(after > before);
        CHECK(after - before < window / 4);
    }
    SECTION("once the cut's flight is acknowledged, the next CNP cuts again") {
        // A flight is what was sent before the cut, not the whole message (1 MiB, posted
        // at once): the next flight's CNP is a new congestion.
        peer.inject(cnp, reserved);
        REQUIRE(c.cnp_window_cuts.load() == 1);
        peer.inject(peer.ack(window - 1));
        REQUIRE(p.wait_until([&] { return highest_write_psn(sent_by_a) >= window; }));
        peer.inject(cnp, reserved);
        CHECK(c.rx_cnp.load() == 2);
        CHECK(c.cnp_window_cuts.load() == 2);
    }
    CHECK(p.a.qp->state() == QpState::Rts);
}

TEST_CASE("ce=P marks packets on the wire; the receiver's CNPs slow the sender, data intact",
          "[congestion][faults]") {
    PairOptions opt;
    opt.mem_bytes = 1024 * 1024;
    std::optional<Ipv6Namespace> ns;
    opt.ecn = true;  // UROCE_ECN=on: the receiver reads the marks
    SECTION("marked on the way out") {
        opt.faults_a.ce = 1.0;
        opt.faults_a.op_classes = kOpWrite;
    }
    SECTION("over IPv6, marked on the way out (the traffic class)") {
        ns.emplace();
        opt.addresses = Ipv6Namespace::addresses();
        opt.faults_a.ce = 1.0;
        opt.faults_a.op_classes = kOpWrite;
    }
    SECTION("taken as marked on the way in (dir=rx)") {
        opt.faults_b.ce = 1.0;
        opt.faults_b.direction = FaultDirection::Rx;
        opt.faults_b.op_classes = kOpWrite;
    }
    Pair p(opt);
    p.connect();
    constexpr uint32_t kLen = 512 * 1024;
    for (int round = 0; round < 4; ++round) {
        const uint64_t seed = 40 + static_cast<uint64_t>(round);
        fill(p.a.at(0), kLen, seed);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kLen)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(0), kLen, seed) == kLen);
    }
    const EngineCounters& a = p.a.counters();
    const EngineCounters& b = p.b.counters();
    CHECK(a.tx_ce_fault.load() + b.rx_ce_fault.load() > 0);
    // Every marked packet (a retransmission may still be on its way) is counted by b and
    // answered with a CNP or paced, each CNP counted by a.
    REQUIRE(p.wait_until([&] {
        return b.rx_ce_marked.load() == a.tx_ce_fault.load() + b.rx_ce_fault.load() &&
               b.tx_cnps.load() + b.cnps_paced.load() == b.rx_ce_marked.load() &&
               a.rx_cnp.load() == b.tx_cnps.load();
    }));
    CHECK(b.tx_cnps.load() >= 1);
    // Every one of a's packets was marked, and they come in trains read in one go: most
    // find a CNP sent less than the pacing interval ago.
    CHECK(b.cnps_paced.load() > 0);
    CHECK(a.cnp_window_cuts.load() >= 1);
    CHECK(a.cnp_window_cuts.load() <= a.rx_cnp.load());
    // Only a's WRITEs were marked: b's ACKs drew no CNP from a.
    CHECK(a.rx_ce_marked.load() == 0);
    CHECK(a.tx_cnps.load() == 0);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
}

TEST_CASE("UC: CE-marked SENDs draw CNPs, which the UC sender counts and nothing more",
          "[congestion][uc]") {
    PairOptions opt;
    opt.ecn = true;
    opt.faults_a.ce = 1.0;
    opt.faults_a.op_classes = kOpSend;
    Pair p(opt);
    UcPair uc(p);
    for (int i = 0; i < 4; ++i) {
        const uint64_t seed = 70 + static_cast<uint64_t>(i);
        fill(p.a.at(0), 3 * kMtu, seed);
        REQUIRE(uc.b->post_recv(recv_wqe(1, {p.b.sge(0, 3 * kMtu)})) == 0);
        REQUIRE(uc.a->post_send(send_wqe(2, {p.a.sge(0, 3 * kMtu)})) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        REQUIRE(p.wait_one(*p.b.rcq).status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(0), 3 * kMtu, seed) == 3 * kMtu);
    }
    const EngineCounters& a = p.a.counters();
    const EngineCounters& b = p.b.counters();
    REQUIRE(p.wait_until([&] {
        return b.rx_ce_marked.load() == a.tx_ce_fault.load() &&
               b.tx_cnps.load() + b.cnps_paced.load() == b.rx_ce_marked.load() &&
               a.rx_cnp.load() == b.tx_cnps.load();
    }));
    CHECK(a.tx_ce_fault.load() == 12);
    CHECK(b.tx_cnps.load() >= 1);
    CHECK(a.cnp_window_cuts.load() == 0);  // UC has no window
    CHECK(a.rx_wrong_peer.load() == 0);
}
