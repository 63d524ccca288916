// Packets that must not be accepted: malformed, corrupted, from the wrong peer, for a QP
// that does not exist. Each is dropped and counted, and the connection keeps working.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/integration/verbs_fixture.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

using namespace uroce::test;
namespace wire = uroce::wire;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

uint32_t ip_of(const std::string& s) {
    in_addr a{};
    inet_pton(AF_INET, s.c_str(), &a);
    return ntohl(a.s_addr);
}

// A UDP socket on `from_ip` (any port) that sends to a device's RoCEv2 port.
struct Injector {
    int fd;
    uint32_t src_ip;
    uint16_t src_port = 0;
    explicit Injector(const std::string& from_ip) : src_ip(ip_of(from_ip)) {
        fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        int pmtu = IP_PMTUDISC_DO;  // id 0 and DF, like uroce itself
        ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(src_ip);
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
        socklen_t len = sizeof sa;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
        src_port = ntohs(sa.sin_port);
    }
    ~Injector() { ::close(fd); }
    void send(const std::string& to_ip, const std::vector<uint8_t>& pkt) const {
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(ip_of(to_ip));
        sa.sin_port = htons(devices().port);
        REQUIRE(::sendto(fd, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&sa),
                         sizeof sa) == static_cast<ssize_t>(pkt.size()));
    }
    // A well-formed packet with a correct ICRC for this sender and `to_ip`.
    std::vector<uint8_t> packet(const wire::Headers& h, const std::string& to_ip,
                                size_t payload = 0) const {
        return packet_with_pad(h, to_ip, payload, wire::pad_for(payload), wire::pad_for(payload));
    }
    // A packet whose BTH says `pad_count` pad bytes while `pad_bytes` follow the payload,
    // with a correct ICRC: only the pad is wrong.
    std::vector<uint8_t> packet_with_pad(const wire::Headers& h, const std::string& to_ip,
                                         size_t payload, uint8_t pad_count,
                                         size_t pad_bytes) const {
        std::vector<uint8_t> out(wire::kMaxHeaderBytes);
        wire::Headers hh = h;
        hh.bth.pad = pad_count;
        const size_t hl = wire::build_headers(hh, out.data());
        REQUIRE(hl > 0);
        out.resize(hl + payload + pad_bytes, 0x42);
        const wire::IpFlow flow{uroce::IpAddress::v4(src_ip), uroce::IpAddress::v4(ip_of(to_ip)),
                                src_port, devices().port};
        const uint32_t crc = wire::icrc(flow, wire::Ipv4Unseen{}, out);
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(crc >> (8 * i)));
        return out;
    }
};

}  // namespace

TEST_CASE("hostile packets are dropped and counted; the connection keeps working", "[packets]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 8192, kAll), dst(b.pd, 8192, kAll);
    std::memset(dst.bytes.data(), 0, dst.bytes.size());

    // A valid-looking RDMA WRITE aimed at b's QP and region.
    wire::Headers w;
    w.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcWriteOnly);
    w.bth.dest_qp = b.qp->qp_num;
    w.bth.psn = 0x123;  // the PSN b expects next
    w.bth.ack_req = true;
    w.reth = {dst.addr(), dst.mr->rkey, 64};

    SECTION("from an address that is not the QP's peer") {
        Injector stranger(devices().ip_c);
        const uint64_t before = counter(b.ctx, "rx_wrong_peer");
        stranger.send(devices().ip_b, stranger.packet(w, devices().ip_b, 64));
        REQUIRE(wait_counter(b.ctx, "rx_wrong_peer", before + 1));
        CHECK(std::all_of(dst.bytes.begin(), dst.bytes.end(), [](uint8_t v) { return v == 0; }));
    }
    SECTION("with a corrupted ICRC or payload") {
        Injector peer(devices().ip_a);  // the right address, another port: still a stranger's bytes
        auto pkt = peer.packet(w, devices().ip_b, 64);
        // Also tells GCC's -O3 flow analysis that the packet is not empty (a false
        // -Wstringop-overflow on back() otherwise).
        REQUIRE(pkt.size() == wire::kBthBytes + wire::kRethBytes + 64 + 4);
        const uint64_t before = counter(b.ctx, "rx_bad_icrc");
        auto bad_crc = pkt;
        bad_crc[pkt.size() - 1] ^= 0x01;
        peer.send(devices().ip_b, bad_crc);
        auto bad_payload = pkt;
        bad_payload[wire::kBthBytes + wire::kRethBytes + 5] ^= 0x80;
        peer.send(devices().ip_b, bad_payload);
        REQUIRE(wait_counter(b.ctx, "rx_bad_icrc", before + 2));
        CHECK(std::all_of(dst.bytes.begin(), dst.bytes.end(), [](uint8_t v) { return v == 0; }));
    }
    SECTION("malformed: truncated, unknown opcode, bad version, bad pad") {
        Injector peer(devices().ip_a);
        const uint64_t before = counter(b.ctx, "rx_malformed");
        auto pkt = peer.packet(w, devices().ip_b, 64);
        peer.send(devices().ip_b, std::vector<uint8_t>(pkt.begin(), pkt.begin() + 7));
        peer.send(devices().ip_b, std::vector<uint8_t>(pkt.begin(), pkt.begin() + 20));
        auto unknown = pkt;
        unknown[0] = 0x1f;  // reserved RC opcode
        peer.send(devices().ip_b, unknown);
        auto version = pkt;
        version[1] |= 0x0f;  // TVer != 0
        peer.send(devices().ip_b, version);
        peer.send(devices().ip_b, {});
        // A WRITE ONLY whose BTH claims 3 pad bytes after a 2-byte payload (no pad bytes
        // follow): more pad than there are bytes between the headers and the ICRC.
        peer.send(devices().ip_b, peer.packet_with_pad(w, devices().ip_b, 2, 3, 0));
        REQUIRE(wait_counter(b.ctx, "rx_malformed", before + 6));
        // Each one counted once, none taken for anything else.
        CHECK(counter(b.ctx, "rx_malformed") == before + 6);
        CHECK(std::all_of(dst.bytes.begin(), dst.bytes.end(), [](uint8_t v) { return v == 0; }));
    }
    SECTION("for a QP that does not exist, or with a foreign P_Key") {
        Injector peer(devices().ip_a);
        wire::Headers h = w;
        h.bth.dest_qp = 0xabcdef;
        const uint64_t unknown = counter(b.ctx, "rx_unknown_qp");
        peer.send(devices().ip_b, peer.packet(h, devices().ip_b, 64));
        REQUIRE(wait_counter(b.ctx, "rx_unknown_qp", unknown + 1));
        h = w;
        h.bth.pkey = 0x8001;
        const uint64_t pkey = counter(b.ctx, "rx_bad_pkey");
        peer.send(devices().ip_b, peer.packet(h, devices().ip_b, 64));
        REQUIRE(wait_counter(b.ctx, "rx_bad_pkey", pkey + 1));
        h = w;
        h.bth.opcode = 0x64;  // UD SEND ONLY, for an RC QP
        const uint64_t unsupported = counter(b.ctx, "rx_unsupported");
        peer.send(devices().ip_b, peer.packet(h, devices().ip_b, 0));
        REQUIRE(wait_counter(b.ctx, "rx_unsupported", unsupported + 1));
    }

    // Whatever was thrown at it, the real connection still carries data.
    fill_pattern(src.bytes.data(), 4096, 8);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 4096, dst.addr(), dst.mr->rkey, 1) == 0);
    auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(src.bytes.data(), dst.bytes.data(), 4096) == 0);
    CHECK(a.state() == IBV_QPS_RTS);
    CHECK(b.state() == IBV_QPS_RTS);
}

TEST_CASE("a READ's late duplicate, for a region deregistered since, leaves the connection up",
          "[packets][duplicate]") {
    // The requester resent a READ request while the responses were on their way; the READ
    // completed, and the region was deregistered before the resent request arrived. The
    // responder may not answer it from the region any more, but the connection did nothing
    // wrong: it must go on (a NAK for a READ the requester completed is dropped there).
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    constexpr uint32_t kLen = 3 * 4096 + 100;  // 4 responses
    Buffer back(a.pd, kLen, kAll);
    auto dst = std::make_unique<Buffer>(b.pd, kLen, kAll);
    fill_pattern(dst->bytes.data(), kLen, 31);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, back, 0, kLen, dst->addr(), dst->mr->rkey, 1) == 0);
    auto wcs = wait_completions(a.cq, 1);
    REQUIRE(wcs.size() == 1);
    REQUIRE(wcs[0].status == IBV_WC_SUCCESS);
    REQUIRE(back.bytes == dst->bytes);
    const uint64_t va = dst->addr();
    const uint32_t rkey = dst->mr->rkey;
    dst.reset();  // deregistered and freed

    wire::Headers r;
    r.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcReadRequest);
    r.bth.dest_qp = b.qp->qp_num;
    r.bth.psn = 0x123;  // the READ's own PSN (the fixture starts there)
    r.bth.ack_req = true;
    r.reth = {va, rkey, kLen};
    const uint64_t duplicates = counter(b.ctx, "rx_duplicate");
    const uint64_t stale = counter(a.ctx, "rx_response_out_of_window");
    Injector peer(devices().ip_a);
    peer.send(devices().ip_b, peer.packet(r, devices().ip_b, 0));
    REQUIRE(wait_counter(b.ctx, "rx_duplicate", duplicates + 1));
    // Answered with a NAK, not with the freed bytes; a drops it as stale.
    CHECK(wait_counter(a.ctx, "rx_response_out_of_window", stale + 1));
    CHECK(b.state() == IBV_QPS_RTS);

    // Traffic both ways with new regions: every byte arrives.
    Buffer src(a.pd, kLen, kAll), dst2(b.pd, kLen, kAll), back2(a.pd, kLen, kAll);
    fill_pattern(src.bytes.data(), kLen, 32);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, kLen, dst2.addr(), dst2.mr->rkey, 2) == 0);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_READ, back2, 0, kLen, dst2.addr(), dst2.mr->rkey, 3) == 0);
    wcs = wait_completions(a.cq, 2);
    REQUIRE(wcs.size() == 2);
    CHECK(wcs[0].status == IBV_WC_SUCCESS);
    CHECK(wcs[1].status == IBV_WC_SUCCESS);
    CHECK(dst2.bytes == src.bytes);
    CHECK(back2.bytes == src.bytes);
    CHECK(a.state() == IBV_QPS_RTS);
    CHECK(b.state() == IBV_QPS_RTS);
}
