// Limits and identifiers of the transport: a CQ overrun is never a silent loss, QPNs and
// memory keys are unpredictable, each QP sends from its own UDP source port, and memory
// regions whose range wraps around 2^64 are refused.
#include <arpa/inet.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>
#include <stdexcept>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "transport/send_sockets.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;

namespace {

std::unique_ptr<Engine> make_engine(const IpAddress& ip, uint16_t port) {
    EngineConfig config;
    config.ip = ip;
    config.port = port;
    return uroce::transport::test::make_engine(config);
}

// A plain UDP socket standing in for a peer, to see packets as the network does.
class PlainSocket {
  public:
    PlainSocket(const IpAddress& ip, uint16_t port) {
        fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(ip.v4());
        sa.sin_port = htons(port);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    }
    ~PlainSocket() { ::close(fd_); }
    PlainSocket(const PlainSocket&) = delete;
    PlainSocket& operator=(const PlainSocket&) = delete;

    // Source port of the next datagram, or 0 if none came within the time limit.
    uint16_t next_source_port(int timeout_ms = 5000) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) != 1) return 0;
        uint8_t buf[8192];
        sockaddr_in from{};
        socklen_t len = sizeof from;
        if (::recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len) < 0)
            return 0;
        return ntohs(from.sin_port);
    }

  private:
    int fd_ = -1;
};

}  // namespace

TEST_CASE(
    "A CQ overrun moves the QP to ERR and the sender never sees success for a lost "
    "completion",
    "[limits][cq_overrun]") {
    Pair p;
    // b receives into a CQ of 4 entries that nobody polls; its overrun callback counts.
    std::atomic<int> overruns{0};
    auto small_rcq = std::make_shared<CompletionQueue>(4, nullptr, [&overruns] { ++overruns; });
    p.b.engine->detach(p.b.qp->qpn());
    p.b.qp = std::make_shared<RcQp>(*p.b.engine, p.b.engine->allocate_qpn(), kPd,
                                    QpCaps{512, 512, kMaxSge, kMaxSge, kMaxInlineData}, p.b.scq,
                                    small_rcq, &p.b);
    p.b.engine->attach(p.b.qp);
    p.connect();

    constexpr int kMessages = 8;
    constexpr uint32_t kLen = 100;
    constexpr uint32_t kSlot = 256;  // receive buffers at b, with guard bytes between them
    fill(p.a.at(0), kMessages * kLen, 42);
    for (int i = 0; i < kMessages; ++i)
        REQUIRE(p.b.qp->post_recv(recv_wqe(100 + i, {p.b.sge(i * kSlot, kLen)})) == 0);
    for (int i = 0; i < kMessages; ++i) {
        SendWqe w = send_wqe(i, {p.a.sge(i * kLen, kLen)});
        w.signaled = true;
        REQUIRE(p.a.qp->post_send(w) == 0);
    }

    // Only a's send CQ is polled.
    const auto sent = p.wait(*p.a.scq, kMessages);
    REQUIRE(sent.size() == kMessages);
    for (int i = 0; i < kMessages; ++i) {
        INFO("send " << i << ": " << to_string(sent[i].status));
        CHECK(sent[i].wr_id == static_cast<uint64_t>(i));
        if (i < 4)
            CHECK(sent[i].status == WcStatus::Success);
        else if (i == 4)
            CHECK(sent[i].status == WcStatus::RemOpErr);
        else
            CHECK(sent[i].status == WcStatus::WrFlushErr);
    }
    CHECK(p.b.qp->state() == QpState::Err);
    CHECK(has_event(p.b, AsyncEventType::QpFatal));
    CHECK(overruns.load() == 1);
    CHECK(p.b.counters().cq_overruns.load() >= 1);

    // Exactly the completions that fit, and the data they report is there.
    std::vector<Completion> got(16);
    REQUIRE(small_rcq->poll(got) == 4);
    for (int i = 0; i < 4; ++i) {
        CHECK(got[i].wr_id == static_cast<uint64_t>(100 + i));
        CHECK(got[i].status == WcStatus::Success);
        CHECK(got[i].byte_len == kLen);
        CHECK(std::memcmp(p.b.at(i * kSlot), p.a.at(i * kLen), kLen) == 0);
        CHECK(all_bytes(p.b.at(i * kSlot + kLen), kSlot - kLen, kUntouched));
    }
    CHECK(p.stays_empty(*small_rcq));
}

TEST_CASE("A full send CQ moves the requester's QP to ERR", "[limits][cq_overrun]") {
    Pair p;
    auto small_scq = std::make_shared<CompletionQueue>(2, nullptr, nullptr);
    p.a.engine->detach(p.a.qp->qpn());
    p.a.qp = std::make_shared<RcQp>(*p.a.engine, p.a.engine->allocate_qpn(), kPd,
                                    QpCaps{512, 512, kMaxSge, kMaxSge, kMaxInlineData}, small_scq,
                                    p.a.rcq, &p.a);
    p.a.engine->attach(p.a.qp);
    p.connect();
    fill(p.a.at(0), 4096, 7);
    for (int i = 0; i < 6; ++i) {
        SendWqe w = rdma_wqe(SendOpcode::RdmaWrite, i, {p.a.sge(i * 100, 100)}, p.b.iova + i * 100,
                             p.b.keys.rkey);
        w.signaled = true;
        REQUIRE(p.a.qp->post_send(w) == 0);
    }
    REQUIRE(p.wait_until([&] { return p.a.qp->state() == QpState::Err; }));
    CHECK(has_event(p.a, AsyncEventType::QpFatal));
    CHECK(small_scq->depth() == 2);
    CHECK(p.a.counters().cq_overruns.load() >= 1);
}

TEST_CASE("QPNs are drawn at random, never 0 or 1", "[limits][random]") {
    std::vector<std::unique_ptr<Engine>> engines;
    std::set<uint32_t> first;
    for (int i = 0; i < 4; ++i) {
        const Addresses addrs = next_addresses();
        for (const IpAddress& ip : {addrs.a, addrs.b}) {
            engines.push_back(make_engine(ip, addrs.port));
            const uint32_t qpn = engines.back()->allocate_qpn();
            CHECK(qpn > 1);
            CHECK(qpn <= uroce::wire::kQpnMask);
            first.insert(qpn);
        }
    }
    // 8 draws from 2^24 - 2 values: all equal only if the draw is not random.
    CHECK(first.size() > 1);

    // Within one engine, every QPN in use is distinct.
    std::set<uint32_t> seen;
    for (int i = 0; i < 1000; ++i) {
        const uint32_t qpn = engines[0]->allocate_qpn();
        CHECK(qpn > 1);
        CHECK(seen.insert(qpn).second);
    }
}

TEST_CASE("Memory key bytes are random and change at every registration", "[limits][random]") {
    std::set<uint8_t> first_lbytes, first_rbytes, rereg_bytes;
    for (int i = 0; i < 8; ++i) {
        MemoryTable t;
        const MemoryKeys k = t.add(kPd, 0x10000, 4096, 0x10000, kLocalWrite | kRemoteRead);
        first_lbytes.insert(static_cast<uint8_t>(k.lkey));
        first_rbytes.insert(static_cast<uint8_t>(k.rkey));
        CHECK(static_cast<uint8_t>(k.lkey) != static_cast<uint8_t>(k.rkey));
    }
    CHECK(first_lbytes.size() > 1);
    CHECK(first_rbytes.size() > 1);

    MemoryTable t;
    for (int i = 0; i < 8; ++i) {
        const MemoryKeys k = t.add(kPd, 0x10000, 4096, 0x10000, kLocalWrite | kRemoteRead);
        rereg_bytes.insert(static_cast<uint8_t>(k.rkey));
        REQUIRE(t.remove(k.lkey));
    }
    CHECK(rereg_bytes.size() > 1);
}

TEST_CASE("Each QP sends from its own UDP source port in the RoCEv2 range",
          "[limits][source_port]") {
    STATIC_REQUIRE(source_port_for_qpn(0x123456) >= 49152);
    // The hash spreads neighbouring QPNs over the ports.
    std::set<uint16_t> ports;
    for (uint32_t qpn = 2; qpn < 2 + 64; ++qpn) {
        const uint16_t port = source_port_for_qpn(qpn);
        CHECK(port >= kSourcePortBase);
        CHECK(port < kSourcePortBase + kSourcePorts);
        ports.insert(port);
    }
    CHECK(ports.size() > 16);

    Pair p;
    // The peer is a plain socket, at the port engines send to.
    const IpAddress peer_ip = next_addresses().a;
    PlainSocket peer(peer_ip, p.a.engine->config().port);
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = peer_ip;
    attrs.dest_qpn = 0x42;
    REQUIRE(p.a.qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
    REQUIRE(p.a.qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
    REQUIRE(p.a.qp->modify(attrs, QpState::Rtr, QpState::Rts) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 10)})) == 0);
    const uint16_t sport = peer.next_source_port();
    CHECK(sport == source_port_for_qpn(p.a.qp->qpn()));
    CHECK(sport >= 49152);
    CHECK(p.a.counters().tx_sport_fallback.load() == 0);
}

TEST_CASE("Datagrams sent to a source port pin a few kilobytes, not a receive buffer",
          "[limits][source_port]") {
    // Nothing reads a send socket: whatever arrives at its port stays queued until the
    // socket closes, up to its receive buffer.
    const Addresses addrs = next_addresses();
    UdpSocket main_socket(addrs.a, addrs.port);
    REQUIRE(main_socket.fd() >= 0);
    SendSockets sockets(addrs.a, main_socket);
    const uint16_t port = source_port_for_qpn(0x1234);
    const UdpSocket& sender = sockets.for_port(port);
    REQUIRE(sender.port() == port);

    const int junk = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(junk >= 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(addrs.a.v4());
    to.sin_port = htons(port);
    const std::vector<uint8_t> datagram(1024, 0x5a);
    int sent = 0;
    for (int i = 0; i < 2000; ++i)
        if (::sendto(junk, datagram.data(), datagram.size(), MSG_DONTWAIT,
                     reinterpret_cast<const sockaddr*>(&to), sizeof to) > 0)
            ++sent;
    ::close(junk);
    CHECK(sent > 1000);

    uint32_t meminfo[SK_MEMINFO_VARS] = {};
    socklen_t len = sizeof meminfo;
    REQUIRE(::getsockopt(sender.fd(), SOL_SOCKET, SO_MEMINFO, meminfo, &len) == 0);
    // Loopback delivers within the sendto: some arrived (the socket does receive), and they
    // hold at most a few datagrams' worth. With the 4 MiB buffer of uroce's receiving
    // sockets (where net.core.rmem_max allows it) 4.6 MB stayed queued here.
    CHECK(meminfo[SK_MEMINFO_RMEM_ALLOC] > 0);
    CHECK(meminfo[SK_MEMINFO_RMEM_ALLOC] <= 16384);
}

TEST_CASE("Memory regions that wrap around 2^64 are refused", "[limits][memory]") {
    MemoryTable t;
    constexpr uint32_t kAccess = kLocalWrite | kRemoteWrite | kRemoteRead;
    // The buffer wraps.
    CHECK_THROWS_AS(t.add(kPd, UINT64_MAX - 0xfff, 0x2000, 0x10000, kAccess),
                    std::invalid_argument);
    // The iova range wraps: a remote va near 2^64 would map anywhere.
    CHECK_THROWS_AS(t.add(kPd, 0x10000, 0x1000, UINT64_MAX - 0x7ff, kAccess),
                    std::invalid_argument);
    // Huge lengths.
    CHECK_THROWS_AS(t.add(kPd, 0x10000, UINT64_MAX, 0x10000, kAccess), std::invalid_argument);
    CHECK_THROWS_AS(t.add(kPd, 0x10000, 1ull << 63, (1ull << 63) + 1, kAccess),
                    std::invalid_argument);
    CHECK(t.size() == 0);

    // Ending exactly at 2^64 is still a region, and no check reaches outside it.
    const MemoryKeys k = t.add(kPd, 0x10000, 0x1000, UINT64_MAX - 0xfff, kAccess);
    uint64_t local = 0;
    CHECK(t.check_remote(k.rkey, kPd, UINT64_MAX - 0xfff, 0x1000, kRemoteRead, local) ==
          KeyCheck::Ok);
    CHECK(local == 0x10000);
    for (uint64_t va :
         std::initializer_list<uint64_t>{UINT64_MAX - 0xfff, UINT64_MAX, 0, 0x10000}) {
        for (uint64_t len :
             std::initializer_list<uint64_t>{0x1001, UINT64_MAX, uint64_t{1} << 62}) {
            local = 0;
            CHECK(t.check_remote(k.rkey, kPd, va, len, kRemoteRead, local) ==
                  KeyCheck::OutOfBounds);
            CHECK(local == 0);
        }
    }
}
