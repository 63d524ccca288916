// UD queue pairs between two engines: datagrams with their GRH area, Q_Key checks, the
// privileged Q_Key bit, and what happens to datagrams nobody can take.
#include <arpa/inet.h>
#include <linux/udp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <memory>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/net_namespace.h"
#include "tests/unit/transport/ud_on.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

TEST_CASE("UD: a datagram arrives after its GRH area, with its source QP", "[ud]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 40 + 300)})) == 0);
    fill(p.a.at(0), 300, 3);
    SendWqe w = ud_send(1, p.a, 0, 300);
    w.opcode = SendOpcode::SendWithImm;
    w.imm = 0xa1b2c3d4;
    REQUIRE(a.qp->post_send(w, a.to(b)) == 0);
    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.status == WcStatus::Success);
    CHECK(s.wr_id == 1);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.wr_id == 7);
    CHECK(r.byte_len == 340);
    CHECK(r.src_qp == a.qp->qpn());
    CHECK(r.qp_num == b.qp->qpn());
    CHECK(r.with_grh);
    CHECK(r.with_imm);
    CHECK(r.imm == 0xa1b2c3d4);
    CHECK(first_mismatch(p.b.at(40), 300, 3) == 300);
    CHECK(all_bytes(p.b.at(340), 64, kUntouched));
    // The GRH area: 20 zero bytes, then an IPv4 header with a valid checksum.
    CHECK(all_bytes(p.b.at(0), 20, 0));
    const uint8_t* ip = p.b.at(20);
    CHECK(ip[0] == 0x45);
    CHECK(ip[9] == 17);
    CHECK(ipv4_checksum(ip) == 0xffff);
    uint32_t src = 0, dst = 0;
    std::memcpy(&src, ip + 12, 4);
    std::memcpy(&dst, ip + 16, 4);
    CHECK(IpAddress::v4(ntohl(src)) == p.a.ip);
    CHECK(IpAddress::v4(ntohl(dst)) == p.b.ip);
    // IP + UDP + BTH + DETH + ImmDt + payload + ICRC.
    CHECK(((ip[2] << 8) | ip[3]) == 20 + 8 + 12 + 8 + 4 + 300 + 4);
}

TEST_CASE("UD over IPv6: the GRH area holds the packet's IPv6 header", "[ud][ipv6]") {
    Ipv6Namespace ns;
    PairOptions o;
    o.addresses = Ipv6Namespace::addresses();
    Pair p(o);
    UdOn a(p.a), b(p.b);
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 40 + 300)})) == 0);
    fill(p.a.at(0), 300, 4);
    REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 300), a.to(b)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.byte_len == 340);
    CHECK(r.src_qp == a.qp->qpn());
    CHECK(r.with_grh);
    CHECK(first_mismatch(p.b.at(40), 300, 4) == 300);
    const uint8_t* grh = p.b.at(0);
    CHECK(grh[0] >> 4 == 6);
    CHECK(((grh[4] << 8) | grh[5]) == 8 + 12 + 8 + 300 + 4);  // UDP + BTH + DETH + data + ICRC
    CHECK(grh[6] == 17);
    CHECK(IpAddress::from_bytes(grh + 8) == Ipv6Namespace::a());
    CHECK(IpAddress::from_bytes(grh + 24) == Ipv6Namespace::b());
}

TEST_CASE("IPv6: a datagram with UDP checksum 0 is taken (the kernel's rxe sends them)", "[ipv6]") {
    // RFC 6935/6936 allow a zero UDP checksum over IPv6 for tunnels; rxe sends every RoCEv2
    // packet so, and the ICRC protects the packet. Linux drops such datagrams unless the
    // receiving socket opts in. The sender here is a plain socket at a's address that sends
    // with checksum 0 (UDP_NO_CHECK6_TX).
    Ipv6Namespace ns;
    PairOptions o;
    o.addresses = Ipv6Namespace::addresses();
    Pair p(o);
    p.connect();
    const int fd = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    const int one = 1;
    REQUIRE(::setsockopt(fd, IPPROTO_UDP, UDP_NO_CHECK6_TX, &one, sizeof one) == 0);
    sockaddr_storage self;
    socklen_t len = p.a.ip.to_sockaddr(0, self);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&self), len) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0);
    const uint16_t src_port = ntohs(reinterpret_cast<sockaddr_in6*>(&self)->sin6_port);
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcSendOnly);
    h.bth.dest_qp = p.b.qp->qpn();
    h.bth.psn = p.b.qp->attributes().rq_psn;
    h.bth.ack_req = true;
    std::vector<uint8_t> message(100);
    fill(message.data(), message.size(), 78);
    const auto pkt =
        forge_packet(h, message, wire::IpFlow{p.a.ip, p.b.ip, src_port, p.b.engine->config().port});
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 100)})) == 0);
    sockaddr_storage to;
    const socklen_t to_len = p.b.ip.to_sockaddr(p.b.engine->config().port, to);
    REQUIRE(::sendto(fd, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&to), to_len) ==
            static_cast<ssize_t>(pkt.size()));
    ::close(fd);
    const Completion c = p.wait_one(*p.b.rcq);
    CHECK(c.status == WcStatus::Success);
    CHECK(c.byte_len == 100);
    CHECK(first_mismatch(p.b.at(0), 100, 78) == 100);
}

TEST_CASE("UD over IPv6: a destination of the other family is not reached", "[ud][ipv6]") {
    Ipv6Namespace ns;
    PairOptions o;
    o.addresses = Ipv6Namespace::addresses();
    Pair p(o);
    UdOn a(p.a), b(p.b);
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 40 + 64)})) == 0);
    UdDestination wrong = a.to(b);
    wrong.ip = IpAddress::v4(0x7f000001);
    REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 64), wrong) == 0);
    // UD is unreliable: the send completes, the packet never leaves (the socket refuses it).
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(p.a.counters().tx_errors.load() > 0);
    Completion c;
    CHECK(p.b.rcq->poll(std::span(&c, 1)) == 0);
}

TEST_CASE("UD: Q_Keys", "[ud]") {
    Pair p;
    UdOn a(p.a, 0x2222), b(p.b);
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 128)})) == 0);
    SECTION("a wrong Q_Key is dropped and counted") {
        REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 16), a.to(b, 0x3333)) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_bad_qkey.load() == 1; }));
        CHECK(p.b.rcq->depth() == 0);
        // The right one still goes in.
        REQUIRE(a.qp->post_send(ud_send(2, p.a, 0, 16), a.to(b, kQkey)) == 0);
        CHECK(p.wait_one(*p.b.rcq).status == WcStatus::Success);
    }
    SECTION("the privileged bit sends the QP's own Q_Key") {
        // a's own Q_Key (0x2222) is not b's: the datagram is refused.
        REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 16), a.to(b, kPrivilegedQkeyBit)) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_bad_qkey.load() == 1; }));
        UdOn a2(p.a, kQkey);
        REQUIRE(a2.qp->post_send(ud_send(2, p.a, 0, 16), a2.to(b, kPrivilegedQkeyBit | 5)) == 0);
        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.status == WcStatus::Success);
        CHECK(r.src_qp == a2.qp->qpn());
    }
}

TEST_CASE("UD: datagrams nobody can take", "[ud]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    SECTION("no receive WQE: dropped and counted, the QP goes on") {
        REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 16), a.to(b)) == 0);
        REQUIRE(p.wait_until([&] { return p.b.counters().rx_no_recv_wqe.load() == 1; }));
        CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);  // sent is all UD promises
        REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 128)})) == 0);
        REQUIRE(a.qp->post_send(ud_send(2, p.a, 0, 16), a.to(b)) == 0);
        CHECK(p.wait_one(*p.b.rcq).status == WcStatus::Success);
    }
    SECTION("a buffer too small: that WQE completes with a length error, nothing written") {
        REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 40 + 10)})) == 0);
        REQUIRE(b.qp->post_recv(recv_wqe(8, {p.b.sge(100, 40 + 64)})) == 0);
        REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 11), a.to(b)) == 0);
        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.wr_id == 7);
        CHECK(r.status == WcStatus::LocLenErr);
        CHECK(all_bytes(p.b.at(0), 50, kUntouched));
        CHECK(b.qp->state() == QpState::Rts);
        REQUIRE(a.qp->post_send(ud_send(2, p.a, 0, 64), a.to(b)) == 0);
        const Completion r2 = p.wait_one(*p.b.rcq);
        CHECK(r2.wr_id == 8);
        CHECK(r2.status == WcStatus::Success);
    }
    SECTION("an RC packet for a UD QP never reaches it") {
        ForgedPeer peer{*p.b.engine, p.a.ip, p.b.engine->config().port, 77, b.qp->qpn()};
        REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 128)})) == 0);
        peer.inject(peer.headers(wire::Opcode::RcSendOnly, 0), std::vector<uint8_t>(8, 1));
        CHECK(p.b.counters().rx_unsupported.load() == 1);
        CHECK(p.stays_empty(*p.b.rcq));
    }
}

// A datagram is taken by its receive buffer's size, not by this port's MTU: its sender's port
// may have a larger one (another device, an rxe peer), and rxe takes it so. Beyond the
// largest IBA MTU nothing is a datagram.
TEST_CASE("UD: a datagram longer than the receiver's port MTU is taken if it fits the buffer",
          "[ud]") {
    Pair p;
    UdOn a(p.a, kQkey, nullptr, 4096), b(p.b);  // b's port MTU: kMtu (1024)
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 40 + 3000)})) == 0);
    fill(p.a.at(0), 3000, 9);
    REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 3000), a.to(b)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.byte_len == 40 + 3000);
    CHECK(first_mismatch(p.b.at(40), 3000, 9) == 3000);
    CHECK(all_bytes(p.b.at(40 + 3000), 64, kUntouched));
    CHECK(p.b.counters().rx_malformed.load() == 0);

    ForgedPeer peer{*p.b.engine, p.a.ip, p.b.engine->config().port, 77, b.qp->qpn()};
    REQUIRE(b.qp->post_recv(recv_wqe(8, {p.b.sge(8192, 40 + 8192)})) == 0);
    wire::Headers h = peer.headers(wire::Opcode::UdSendOnly, 0);
    h.bth.pkey = 0xffff;
    h.deth.qkey = kQkey;
    h.deth.src_qp = 77;
    peer.inject(h, std::vector<uint8_t>(kLargestMtu + 4, 1));
    CHECK(p.b.counters().rx_malformed.load() == 1);
    CHECK(p.stays_empty(*p.b.rcq));
}

TEST_CASE("UD: what post_send refuses, and ERR", "[ud]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    // Larger than the MTU, or not a SEND.
    CHECK(a.qp->post_send(ud_send(1, p.a, 0, kMtu + 1), a.to(b)) == EINVAL);
    SendWqe w = ud_send(2, p.a, 0, 8);
    w.opcode = SendOpcode::RdmaWrite;
    CHECK(a.qp->post_send(w, a.to(b)) == EINVAL);
    CHECK(p.stays_empty(*p.a.scq));
    // ERR flushes the receive queue and every later post.
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 128)})) == 0);
    REQUIRE(b.qp->modify(UdAttributes{kQkey, 0, kMtu, false}, QpState::Rts, QpState::Err) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 7);
    CHECK(r.status == WcStatus::WrFlushErr);
    REQUIRE(b.qp->post_send(ud_send(3, p.b, 0, 8), b.to(a)) == 0);
    CHECK(p.wait_one(*p.b.scq).status == WcStatus::WrFlushErr);
    // Datagrams for it are not taken.
    REQUIRE(a.qp->post_send(ud_send(4, p.a, 0, 8), a.to(b)) == 0);
    REQUIRE(p.wait_until([&] { return p.b.counters().rx_wrong_state.load() == 1; }));
}

TEST_CASE("UD: a request through an AH of another PD fails and sends nothing", "[ud]") {
    Pair p;
    UdOn a(p.a), b(p.b);
    REQUIRE(b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 128)})) == 0);
    UdDestination other = a.to(b);
    other.pd = kPd + 1;
    const uint64_t sent = p.a.counters().tx_packets.load();
    REQUIRE(a.qp->post_send(ud_send(1, p.a, 0, 16), other) == 0);
    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.wr_id == 1);
    CHECK(s.status == WcStatus::LocQpOpErr);
    CHECK(a.qp->state() == QpState::Err);
    CHECK(p.a.counters().tx_packets.load() == sent);
    CHECK(p.stays_empty(*p.b.rcq));
    // Through one of its own PD, a QP sends as ever.
    UdOn a2(p.a);
    UdDestination own = a2.to(b);
    own.pd = kPd;
    REQUIRE(a2.qp->post_send(ud_send(2, p.a, 0, 16), own) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(p.wait_one(*p.b.rcq).status == WcStatus::Success);
}
