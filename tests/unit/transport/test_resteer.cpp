// A buffer of several datagrams (a GRO merge, here a GSO train on loopback, which reaches the
// socket lookup as one buffer in the same way) that holds datagrams for QPs of two contexts of
// one device: the steering program hands it to the context of the first datagram, which puts
// the other context's back into the kernel's steering (kernel_resteer.h). Needs root, as
// device sharing does.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/ud_on.h"
#include "tests/unit/transport/udp_send.h"
#include "transport/device_slots.h"

using namespace uroce;
using namespace uroce::transport;
using namespace uroce::transport::test;

namespace {

constexpr uint32_t kLen = 64;
constexpr uint32_t kSlot = kGrhBytes + kLen;
constexpr uint32_t kSrcQp = 0x123456;

// A UD SEND of kLen bytes filled from `seed`, for `dest_qp`, as sent from `from`.
std::vector<uint8_t> ud_datagram(uint32_t dest_qp, uint64_t seed, const wire::IpFlow& from) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::UdSendOnly);
    h.bth.pkey = 0xffff;
    h.bth.dest_qp = dest_qp;
    h.bth.psn = static_cast<uint32_t>(seed);
    h.deth.qkey = kQkey;
    h.deth.src_qp = kSrcQp;
    std::vector<uint8_t> payload(kLen);
    fill(payload.data(), kLen, seed);
    return forge_packet(h, payload, from);
}

// Sends one buffer from `peer_ip` to one, two, two and one of a device shared by p.a and p.b,
// and checks that each datagram reached its QP.
void one_buffer_to_two_contexts(const IpAddress& peer_ip, const std::optional<Addresses>& at) {
    PairOptions o;
    o.shared_device = true;
    o.addresses = at;
    Pair p(o);
    UdOn one(p.a), two(p.b);
    REQUIRE(DeviceSlots::slot_of(one.qp->qpn()) != DeviceSlots::slot_of(two.qp->qpn()));
    for (uint32_t i = 0; i < 2; ++i) {
        REQUIRE(one.qp->post_recv(recv_wqe(100 + i, {p.a.sge(i * kSlot, kSlot)})) == 0);
        REQUIRE(two.qp->post_recv(recv_wqe(200 + i, {p.b.sge(i * kSlot, kSlot)})) == 0);
    }
    // The peer sends one UDP flow: to one, two, two, one, in one buffer. The steering program
    // reads the first datagram: the whole buffer goes to one.
    const int fd = ::socket(peer_ip.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_storage local{};
    socklen_t local_len = peer_ip.to_sockaddr(0, local);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&local), local_len) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0);
    const uint16_t peer_port = peer_ip.is_v4()
                                   ? ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port)
                                   : ntohs(reinterpret_cast<sockaddr_in6&>(local).sin6_port);
    const uint16_t device_port = p.a.engine->config().port;
    const wire::IpFlow flow{peer_ip, p.a.ip, peer_port, device_port};
    std::vector<uint8_t> train;
    const uint32_t to[4] = {one.qp->qpn(), two.qp->qpn(), two.qp->qpn(), one.qp->qpn()};
    size_t segment = 0;
    for (uint64_t i = 0; i < 4; ++i) {
        const std::vector<uint8_t> d = ud_datagram(to[i], 500 + i, flow);
        segment = d.size();
        train.insert(train.end(), d.begin(), d.end());
    }
    sockaddr_storage dst{};
    const socklen_t dst_len = p.a.ip.to_sockaddr(device_port, dst);
    send_udp(fd, dst, dst_len, train, static_cast<uint16_t>(segment));
    ::close(fd);

    // Before, two's datagrams were refused by one (rx_unknown_qp) and two got nothing.
    const auto at_two = p.wait(*p.b.rcq, 2);
    REQUIRE(at_two.size() == 2);
    const auto at_one = p.wait(*p.a.rcq, 2);
    REQUIRE(at_one.size() == 2);
    for (uint32_t i = 0; i < 2; ++i) {
        INFO("receive " << i);
        CHECK(at_one[i].status == WcStatus::Success);
        CHECK(at_one[i].wr_id == 100 + i);
        CHECK(at_one[i].src_qp == kSrcQp);
        CHECK(first_mismatch(p.a.at(i * kSlot + kGrhBytes), kLen, i == 0 ? 500 : 503) == kLen);
        CHECK(at_two[i].status == WcStatus::Success);
        CHECK(at_two[i].wr_id == 200 + i);
        CHECK(at_two[i].src_qp == kSrcQp);
        CHECK(first_mismatch(p.b.at(i * kSlot + kGrhBytes), kLen, 501 + i) == kLen);
    }
    CHECK(p.a.counters().rx_gro_datagrams.load() == 1);
    CHECK(p.a.counters().rx_resteered.load() == 2);
    CHECK(p.a.counters().rx_unknown_qp.load() == 0);
    CHECK(p.b.counters().rx_unknown_qp.load() == 0);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
}

}  // namespace

TEST_CASE(
    "Device sharing: datagrams for another context in a merged buffer reach that context "
    "(put back into the steering)",
    "[qpn_steering][ud]") {
    SECTION("IPv4") {
        // The peer at another address of the host.
        one_buffer_to_two_contexts(next_addresses().a, std::nullopt);
    }
    SECTION("IPv6") {
        // The peer at the device's address, from another port.
        const IpAddress lo6 = *IpAddress::parse("::1");
        const Addresses at = next_addresses();
        one_buffer_to_two_contexts(lo6, Addresses{lo6, lo6, static_cast<uint16_t>(at.port + 1)});
    }
}
