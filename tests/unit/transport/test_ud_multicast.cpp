// UD multicast between two engines over loopback IPv4 multicast: every attached QP gets its
// own copy, detached and destroyed QPs get none, Q_Keys are each QP's own, and datagrams
// whose destination QPN does not fit their address are dropped.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/net_namespace.h"
#include "tests/unit/transport/ud_on.h"
#include "transport/multicast_groups.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

// A group of this process's own (239.77.x.y), new for each call: concurrent test runs and
// test cases do not hear each other (their engines' ports differ too).
IpAddress next_group() {
    static std::atomic<uint32_t> n{0};
    const auto pid = static_cast<uint32_t>(::getpid());
    return ipv4(239, 77, 1 + pid % 254, 1 + n.fetch_add(1) % 254);
}

UdDestination to_group(const IpAddress& group, uint32_t qkey = kQkey, uint8_t hop_limit = 1) {
    // The QPN is the application's; multicast packets carry 0xFFFFFF whatever it says.
    return UdDestination{group, 0x123, qkey, hop_limit};
}

IpAddress grh_dst(const uint8_t* grh) {
    uint32_t dst = 0;
    std::memcpy(&dst, grh + 20 + 16, 4);
    return IpAddress::v4(ntohl(dst));
}

// A UD SEND Only to the multicast QPN from a forged sender, with the ICRC over `group`.
std::vector<uint8_t> forged_ud(const IpAddress& src_ip, uint16_t src_port, const IpAddress& dst_ip,
                               uint16_t dst_port, uint32_t dest_qp, uint32_t qkey = kQkey) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::UdSendOnly);
    h.bth.dest_qp = dest_qp;
    h.deth.qkey = qkey;
    h.deth.src_qp = 0x4242;
    const std::vector<uint8_t> payload(16, 7);
    return forge_packet(h, payload, wire::IpFlow{src_ip, dst_ip, src_port, dst_port});
}

// A member socket of the test's own, joined on `if_ip`, that reads the TTL of what arrives.
class TtlListener {
  public:
    TtlListener(const IpAddress& group, const IpAddress& if_ip, uint16_t port)
        : fd_(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
        REQUIRE(fd_ >= 0);
        const int one = 1;
        REQUIRE(::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(group.v4());
        sa.sin_port = htons(port);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
        ip_mreq m{};
        m.imr_multiaddr.s_addr = htonl(group.v4());
        m.imr_interface.s_addr = htonl(if_ip.v4());
        REQUIRE(::setsockopt(fd_, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) == 0);
        REQUIRE(::setsockopt(fd_, IPPROTO_IP, IP_RECVTTL, &one, sizeof one) == 0);
    }
    ~TtlListener() { ::close(fd_); }
    TtlListener(const TtlListener&) = delete;
    TtlListener& operator=(const TtlListener&) = delete;

    // The TTL of the next datagram, or -1 if none came within 5 s.
    int next_ttl() const {
        pollfd pfd{fd_, POLLIN, 0};
        if (::poll(&pfd, 1, 5000) != 1) return -1;
        uint8_t data[2048];
        alignas(cmsghdr) uint8_t control[256];
        iovec iov{data, sizeof data};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        if (::recvmsg(fd_, &msg, MSG_DONTWAIT) < 0) return -1;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != IPPROTO_IP || c->cmsg_type != IP_TTL) continue;
            int ttl = 0;
            std::memcpy(&ttl, CMSG_DATA(c), sizeof ttl);
            return ttl;
        }
        return -1;
    }

  private:
    int fd_;
};

}  // namespace

TEST_CASE("UD multicast: each QP attached to the group gets its own copy", "[ud][mcast]") {
    Pair p;
    UdOn a(p.a), a2(p.a), b1(p.b), b2(p.b);
    const IpAddress group = next_group();
    REQUIRE(p.b.engine->attach_multicast(group, b1.qp) == 0);
    REQUIRE(p.b.engine->attach_multicast(group, b2.qp) == 0);
    REQUIRE(p.b.engine->attach_multicast(group, b2.qp) == 0);  // again: nothing changes
    REQUIRE(p.a.engine->attach_multicast(group, a2.qp) == 0);  // the sender's engine too
    REQUIRE(b1.qp->post_recv(recv_wqe(1, {p.b.sge(0, 40 + 200)})) == 0);
    REQUIRE(b2.qp->post_recv(recv_wqe(2, {p.b.sge(1000, 40 + 200)})) == 0);
    REQUIRE(a2.qp->post_recv(recv_wqe(3, {p.a.sge(1000, 40 + 200)})) == 0);
    fill(p.a.at(0), 200, 9);
    TxRecorder tx(*p.a.engine);
    REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 200), to_group(group)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const auto rb = p.wait(*p.b.rcq, 2);
    REQUIRE(rb.size() == 2);
    const Completion ra = p.wait_one(*p.a.rcq);
    for (const Completion& c : {rb[0], rb[1], ra}) {
        CHECK(c.status == WcStatus::Success);
        CHECK(c.byte_len == 240);
        CHECK(c.src_qp == a.qp->qpn());
        CHECK(c.with_grh);
    }
    CHECK(((rb[0].qp_num == b1.qp->qpn() && rb[1].qp_num == b2.qp->qpn()) ||
           (rb[0].qp_num == b2.qp->qpn() && rb[1].qp_num == b1.qp->qpn())));
    CHECK(ra.qp_num == a2.qp->qpn());
    CHECK(first_mismatch(p.b.at(40), 200, 9) == 200);
    CHECK(first_mismatch(p.b.at(1040), 200, 9) == 200);
    CHECK(first_mismatch(p.a.at(1040), 200, 9) == 200);
    CHECK(all_bytes(p.b.at(240), 760, kUntouched));
    // The GRH area names the group as the destination, with a valid IPv4 checksum.
    CHECK(grh_dst(p.b.at(0)) == group);
    CHECK(ipv4_checksum(p.b.at(20)) == 0xffff);
    uint32_t src = 0;
    std::memcpy(&src, p.b.at(20 + 12), 4);
    CHECK(IpAddress::v4(ntohl(src)) == p.a.ip);
    // On the wire: to the group, destination QP 0xFFFFFF, the Q_Key of the WR.
    const auto sent = tx.packets();
    REQUIRE(sent.size() == 1);
    CHECK(sent[0].dst_ip == group);
    CHECK(sent[0].parsed().h.bth.dest_qp == kMulticastQpn);
    CHECK(sent[0].parsed().h.deth.qkey == kQkey);
    CHECK(p.b.counters().rx_bad_mcast_qpn.load() == 0);
}

TEST_CASE("UD multicast: detached and destroyed QPs get nothing", "[ud][mcast]") {
    Pair p;
    UdOn a(p.a), b1(p.b);
    auto b2 = std::make_unique<UdOn>(p.b);
    const IpAddress group = next_group();
    REQUIRE(p.b.engine->attach_multicast(group, b1.qp) == 0);
    REQUIRE(p.b.engine->attach_multicast(group, b2->qp) == 0);
    REQUIRE(b1.qp->post_recv(recv_wqe(1, {p.b.sge(0, 128)})) == 0);
    REQUIRE(b1.qp->post_recv(recv_wqe(2, {p.b.sge(0, 128)})) == 0);
    REQUIRE(b2->qp->post_recv(recv_wqe(3, {p.b.sge(1000, 128)})) == 0);
    SECTION("detached: no copy; detaching again, or from another group, is refused") {
        REQUIRE(p.b.engine->detach_multicast(group, b2->qp->qpn()) == 0);
        CHECK(p.b.engine->detach_multicast(group, b2->qp->qpn()) == EINVAL);
        CHECK(p.b.engine->detach_multicast(next_group(), b1.qp->qpn()) == EINVAL);
        REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 16), to_group(group)) == 0);
        CHECK(p.wait_one(*p.b.rcq).qp_num == b1.qp->qpn());
        CHECK(p.stays_empty(*p.b.rcq));
    }
    SECTION("destroyed: detached from its groups") {
        const uint32_t qpn = b2->qp->qpn();
        b2.reset();  // Engine::detach, as ibv_destroy_qp
        CHECK(p.b.engine->detach_multicast(group, qpn) == EINVAL);
        REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 16), to_group(group)) == 0);
        CHECK(p.wait_one(*p.b.rcq).qp_num == b1.qp->qpn());
        CHECK(p.stays_empty(*p.b.rcq));
    }
    SECTION("the last QP to leave leaves the group: nothing arrives any more") {
        REQUIRE(p.b.engine->detach_multicast(group, b2->qp->qpn()) == 0);
        REQUIRE(p.b.engine->detach_multicast(group, b1.qp->qpn()) == 0);
        const uint64_t before = p.b.counters().rx_packets.load();
        REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 16), to_group(group)) == 0);
        CHECK(p.stays_empty(*p.b.rcq));
        CHECK(p.b.counters().rx_packets.load() == before);
        // Attaching again joins again.
        REQUIRE(p.b.engine->attach_multicast(group, b1.qp) == 0);
        REQUIRE(a.qp->post_send(ud_send(6, p.a, 0, 16), to_group(group)) == 0);
        CHECK(p.wait_one(*p.b.rcq).qp_num == b1.qp->qpn());
    }
}

TEST_CASE("UD multicast: each QP checks its own Q_Key and has its own WQEs", "[ud][mcast]") {
    Pair p;
    UdOn a(p.a), b1(p.b), b2(p.b, 0x5555), b3(p.b);
    const IpAddress group = next_group();
    for (UdOn* q : {&b1, &b2, &b3}) REQUIRE(p.b.engine->attach_multicast(group, q->qp) == 0);
    REQUIRE(b1.qp->post_recv(recv_wqe(1, {p.b.sge(0, 128)})) == 0);
    REQUIRE(b2.qp->post_recv(recv_wqe(2, {p.b.sge(1000, 128)})) == 0);
    // b3 has no receive WQE.
    REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 16), to_group(group)) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.qp_num == b1.qp->qpn());
    CHECK(r.status == WcStatus::Success);
    REQUIRE(p.wait_until([&] {
        return p.b.counters().rx_bad_qkey.load() == 1 && p.b.counters().rx_no_recv_wqe.load() == 1;
    }));
    CHECK(p.stays_empty(*p.b.rcq));
    CHECK(all_bytes(p.b.at(1000), 128, kUntouched));
}

TEST_CASE("UD multicast: destination QPNs that do not fit the address", "[ud][mcast]") {
    Pair p;
    UdOn b(p.b);
    const IpAddress group = next_group();
    REQUIRE(p.b.engine->attach_multicast(group, b.qp) == 0);
    REQUIRE(b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 128)})) == 0);
    const uint16_t port = p.b.engine->config().port;
    auto& c = p.b.counters();
    SECTION("to the group, for a QP's own number: dropped") {
        p.b.engine->receive_datagram(forged_ud(p.a.ip, 50000, group, port, b.qp->qpn()), p.a.ip,
                                     50000, true, group);
        CHECK(c.rx_bad_mcast_qpn.load() == 1);
    }
    SECTION("to the device, for the multicast QPN: dropped") {
        p.b.engine->receive_datagram(forged_ud(p.a.ip, 50000, p.b.ip, port, kMulticastQpn), p.a.ip,
                                     50000);
        CHECK(c.rx_bad_mcast_qpn.load() == 1);
        CHECK(c.rx_unknown_qp.load() == 0);
    }
    SECTION("to a group no QP here is attached to: counted") {
        const IpAddress other = next_group();
        p.b.engine->receive_datagram(forged_ud(p.a.ip, 50000, other, port, kMulticastQpn), p.a.ip,
                                     50000, true, other);
        CHECK(c.rx_mcast_no_qp.load() == 1);
    }
    SECTION("an ICRC computed over the device's address, not the group's: dropped") {
        p.b.engine->receive_datagram(forged_ud(p.a.ip, 50000, p.b.ip, port, kMulticastQpn), p.a.ip,
                                     50000, true, group);
        CHECK(c.rx_bad_icrc.load() == 1);
    }
    CHECK(p.stays_empty(*p.b.rcq));
    // The right one goes in.
    p.b.engine->receive_datagram(forged_ud(p.a.ip, 50000, group, port, kMulticastQpn), p.a.ip,
                                 50000, true, group);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.src_qp == 0x4242);
    CHECK(grh_dst(p.b.at(0)) == group);
}

TEST_CASE("UD multicast: what attach refuses", "[ud][mcast]") {
    Pair p;
    UdOn b(p.b);
    CHECK(p.b.engine->attach_multicast(p.a.ip, b.qp) == EINVAL);  // not a group
    CHECK(p.b.engine->attach_multicast(ipv4(240, 0, 0, 1), b.qp) == EINVAL);
    CHECK(p.b.engine->detach_multicast(next_group(), b.qp->qpn()) == EINVAL);
    CHECK(ipv4(224, 0, 0, 0).is_multicast());
    CHECK(ipv4(239, 255, 255, 255).is_multicast());
    CHECK_FALSE(ipv4(223, 255, 255, 255).is_multicast());
}

// The listener is another program's member socket, bound first with SO_REUSEADDR only (the
// usual way): a QP attaches to the group beside it, and both get every datagram.
TEST_CASE("UD multicast: the AH's hop limit is the packets' TTL", "[ud][mcast]") {
    Pair p;
    UdOn a(p.a), member(p.b);
    const IpAddress group = next_group();
    TtlListener listener(group, p.a.ip, p.a.engine->config().port);
    REQUIRE(p.b.engine->attach_multicast(group, member.qp) == 0);
    uint64_t wr_id = 0;
    for (auto [hop_limit, ttl] : {std::pair{7, 7}, std::pair{255, 255}, std::pair{0, 1}}) {
        REQUIRE(member.qp->post_recv(recv_wqe(++wr_id, {p.b.sge(0, 128)})) == 0);
        REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 16),
                                to_group(group, kQkey, static_cast<uint8_t>(hop_limit))) == 0);
        CHECK(listener.next_ttl() == ttl);
        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.wr_id == wr_id);
        CHECK(r.status == WcStatus::Success);
    }
}

TEST_CASE("UD multicast: groups per engine and QPs per group are bounded", "[ud][mcast]") {
    Pair p;
    UdOn b(p.b);
    SECTION("QPs per group") {
        const IpAddress group = next_group();
        std::vector<std::unique_ptr<UdOn>> qps;
        for (size_t i = 0; i < MulticastGroups::kMaxQpsPerGroup; ++i) {
            qps.push_back(std::make_unique<UdOn>(p.b));
            REQUIRE(p.b.engine->attach_multicast(group, qps.back()->qp) == 0);
        }
        CHECK(p.b.engine->attach_multicast(group, b.qp) == ENOMEM);
        REQUIRE(p.b.engine->detach_multicast(group, qps[0]->qp->qpn()) == 0);
        CHECK(p.b.engine->attach_multicast(group, b.qp) == 0);
    }
    SECTION("groups") {
        // Groups of their own (239.79.x.y) so as not to wrap around next_group().
        const auto pid = static_cast<uint32_t>(::getpid());
        const auto group = [pid](uint32_t i) {
            return ipv4(239, 79 + (pid % 100), static_cast<uint8_t>(i >> 8),
                        static_cast<uint8_t>(i));
        };
        for (uint32_t i = 0; i < MulticastGroups::kMaxGroups; ++i)
            REQUIRE(p.b.engine->attach_multicast(group(i), b.qp) == 0);
        CHECK(p.b.engine->attach_multicast(group(MulticastGroups::kMaxGroups), b.qp) == ENOMEM);
        REQUIRE(p.b.engine->detach_multicast(group(0), b.qp->qpn()) == 0);
        CHECK(p.b.engine->attach_multicast(group(MulticastGroups::kMaxGroups), b.qp) == 0);
    }
}

// lo has no MULTICAST flag; a real interface has. Here the sender's device is on va and the
// receiver's on vb: b's copy crosses the veth, a2's is looped back on va. Each member
// socket hears its own interface only (IP_MULTICAST_ALL off): b gets one copy, not also
// the one looped back on va.
TEST_CASE("UD multicast over a veth pair: one copy per member", "[ud][mcast]") {
    VethNamespace ns;
    PairOptions opt;
    opt.addresses = Addresses{VethNamespace::kA, VethNamespace::kB, wire::kRoceV2Port};
    Pair p(opt);
    UdOn a(p.a), a2(p.a), b(p.b);
    const IpAddress group = next_group();
    REQUIRE(p.a.engine->attach_multicast(group, a2.qp) == 0);
    REQUIRE(p.b.engine->attach_multicast(group, b.qp) == 0);
    REQUIRE(a2.qp->post_recv(recv_wqe(1, {p.a.sge(1000, 128)})) == 0);
    REQUIRE(b.qp->post_recv(recv_wqe(2, {p.b.sge(0, 128)})) == 0);
    REQUIRE(b.qp->post_recv(recv_wqe(3, {p.b.sge(200, 128)})) == 0);
    fill(p.a.at(0), 64, 5);
    REQUIRE(a.qp->post_send(ud_send(5, p.a, 0, 64), to_group(group)) == 0);
    const Completion rb = p.wait_one(*p.b.rcq);
    CHECK(rb.status == WcStatus::Success);
    CHECK(rb.qp_num == b.qp->qpn());
    CHECK(first_mismatch(p.b.at(40), 64, 5) == 64);
    CHECK(grh_dst(p.b.at(0)) == group);
    const Completion ra = p.wait_one(*p.a.rcq);
    CHECK(ra.qp_num == a2.qp->qpn());
    CHECK(first_mismatch(p.a.at(1040), 64, 5) == 64);
    CHECK(p.stays_empty(*p.b.rcq));
    CHECK(p.b.counters().rx_packets.load() == 1);
}
