// An adversary on the path: while verified RC traffic (SEND, WRITE, READ) runs between two
// devices, a sender that spoofs each device's address and RoCEv2 port injects ACKs, NAKs, RNR
// NAKs and READ responses at the requester, and SEND/WRITE/READ requests at the responder, all
// with a correct ICRC but PSNs outside anything the connection uses: far ahead of what was sent
// and far behind it. The traffic must end byte-exact with every completion successful, the
// canaries and the bait region (which only spoofed WRITEs aim at) untouched, and each device's
// drop counters must have grown by at least the number of spoofed packets it had to drop.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tests/integration/verbs_fixture.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

using namespace uroce::test;
namespace wire = uroce::wire;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kFirstPsn = 0x123;  // both directions start here (verbs_fixture.cpp)
constexpr uint32_t kFar = 1u << 22;    // far beyond any PSN the traffic reaches
constexpr uint8_t kCanary = 0xc5;
constexpr uint8_t kSpoofByte = 0xee;  // payload of every spoofed packet

uint32_t ip_of(const std::string& s) {
    in_addr a{};
    inet_pton(AF_INET, s.c_str(), &a);
    return ntohl(a.s_addr);
}

// A counter that may not exist on this build: nullopt instead of an exception, so that a
// missing counter shows as a failed CHECK with its name.
std::optional<uint64_t> try_counter(ibv_context* ctx, const char* name) {
    try {
        return counter(ctx, name);
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

// Sends RoCEv2 packets that claim to come from `from_ip`:4791. As root, a raw socket writes the
// IPv4 and UDP headers itself (source port 4791, DF, identification 0: the kernel may fill in an
// identification, which the receiver's ICRC check accepts). Without CAP_NET_RAW it falls back to
// a UDP socket bound to `from_ip` on another port; receivers do not check the source port.
class Spoofer {
  public:
    explicit Spoofer(const std::string& from_ip) : src_ip_(ip_of(from_ip)) {
        fd_ = ::socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
        if (fd_ >= 0) {
            int on = 1;
            REQUIRE(::setsockopt(fd_, IPPROTO_IP, IP_HDRINCL, &on, sizeof on) == 0);
            raw_ = true;
            src_port_ = devices().port;
            return;
        }
        fd_ = ::socket(AF_INET, SOCK_DGRAM, 0);
        REQUIRE(fd_ >= 0);
        int pmtu = IP_PMTUDISC_DO;
        ::setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(src_ip_);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
        socklen_t len = sizeof sa;
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
        src_port_ = ntohs(sa.sin_port);
    }
    ~Spoofer() { ::close(fd_); }
    Spoofer(const Spoofer&) = delete;
    Spoofer& operator=(const Spoofer&) = delete;

    bool raw() const { return raw_; }

    // Builds (with a correct ICRC) and sends one packet with `payload` bytes of kSpoofByte.
    void send(const wire::Headers& h, const std::string& to_ip, size_t payload = 0) const {
        const uint32_t dst_ip = ip_of(to_ip);
        std::vector<uint8_t> roce(wire::kMaxHeaderBytes);
        wire::Headers hh = h;
        hh.bth.pad = wire::pad_for(payload);
        const size_t hl = wire::build_headers(hh, roce.data());
        REQUIRE(hl > 0);
        roce.resize(hl);
        roce.insert(roce.end(), payload, kSpoofByte);
        roce.insert(roce.end(), hh.bth.pad, 0);
        const wire::IpFlow flow{uroce::IpAddress::v4(src_ip_), uroce::IpAddress::v4(dst_ip),
                                src_port_, devices().port};
        const uint32_t crc = wire::icrc(flow, wire::Ipv4Unseen{}, roce);
        for (int i = 0; i < 4; ++i) roce.push_back(static_cast<uint8_t>(crc >> (8 * i)));

        std::vector<uint8_t> datagram;
        if (raw_) {
            iphdr ip{};
            ip.version = 4;
            ip.ihl = 5;
            ip.tot_len = htons(static_cast<uint16_t>(sizeof(iphdr) + sizeof(udphdr) + roce.size()));
            ip.frag_off = htons(IP_DF);
            ip.ttl = 64;
            ip.protocol = IPPROTO_UDP;
            ip.saddr = htonl(src_ip_);
            ip.daddr = htonl(dst_ip);
            udphdr udp{};
            udp.source = htons(src_port_);
            udp.dest = htons(devices().port);
            udp.len = htons(static_cast<uint16_t>(sizeof(udphdr) + roce.size()));
            udp.check = 0;  // optional over IPv4; the ICRC protects the payload
            const auto* ipb = reinterpret_cast<const uint8_t*>(&ip);
            const auto* udpb = reinterpret_cast<const uint8_t*>(&udp);
            datagram.assign(ipb, ipb + sizeof ip);
            datagram.insert(datagram.end(), udpb, udpb + sizeof udp);
        }
        datagram.insert(datagram.end(), roce.begin(), roce.end());
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(dst_ip);
        sa.sin_port = raw_ ? 0 : htons(devices().port);
        REQUIRE(::sendto(fd_, datagram.data(), datagram.size(), 0, reinterpret_cast<sockaddr*>(&sa),
                         sizeof sa) == static_cast<ssize_t>(datagram.size()));
    }

  private:
    int fd_ = -1;
    bool raw_ = false;
    uint32_t src_ip_;
    uint16_t src_port_ = 0;
};

wire::Headers headers(wire::Opcode op, uint32_t dest_qp, uint32_t psn) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(op);
    h.bth.dest_qp = dest_qp;
    h.bth.psn = psn & wire::kPsnMask;
    return h;
}

// What the spoofers sent, by the counter that must count its drop.
struct Injected {
    uint64_t responses = 0;        // at the requester: rx_response_out_of_window
    uint64_t requests_ahead = 0;   // at the responder: rx_out_of_sequence
    uint64_t requests_behind = 0;  // at the responder: rx_duplicate
    uint64_t acks = 0, naks = 0, rnr_naks = 0, read_responses = 0;
    uint64_t sends = 0, writes = 0, reads = 0;
};

bool all_are(const uint8_t* p, size_t n, uint8_t v) {
    return std::all_of(p, p + n, [v](uint8_t b) { return b == v; });
}

}  // namespace

TEST_CASE("spoofed responses and requests with wrong PSNs are dropped while traffic runs",
          "[adversary]") {
    QpOptions opt;
    opt.mtu = IBV_MTU_1024;  // many packets in flight per message
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);

    // The requester a sends SEND, WRITE and READ to b. b's memory:
    //   [canary 4K][WRITE target 64K][canary 4K][bait 8K][canary 4K][READ source 64K][canary 4K]
    // a's memory: [SEND/WRITE source 64K][canary 4K][READ destination 64K][canary 4K]
    // and b receives SENDs into [canary 4K][recv 64K][canary 4K].
    constexpr size_t kMsg = 64 * 1024, kCan = 4096, kBait = 8192;
    constexpr size_t kWriteAt = kCan, kBaitAt = kWriteAt + kMsg + kCan,
                     kReadSrcAt = kBaitAt + kBait + kCan, kBBytes = kReadSrcAt + kMsg + kCan;
    constexpr size_t kReadDstAt = kMsg + kCan, kABytes = kReadDstAt + kMsg + kCan;
    constexpr size_t kRecvAt = kCan, kRecvBytes = kRecvAt + kMsg + kCan;
    Buffer amem(a.pd, kABytes, kAll), bmem(b.pd, kBBytes, kAll), brecv(b.pd, kRecvBytes, kAll);
    std::fill(amem.bytes.begin(), amem.bytes.end(), kCanary);
    std::fill(bmem.bytes.begin(), bmem.bytes.end(), kCanary);
    std::fill(brecv.bytes.begin(), brecv.bytes.end(), kCanary);

    // Spoofed responses come "from b" to a, spoofed requests "from a" to b.
    Spoofer as_b(devices().ip_b), as_a(devices().ip_a);
    INFO("raw IP_HDRINCL sockets (source port 4791): " << as_b.raw());
    const uint32_t aqpn = a.qp->qp_num, bqpn = b.qp->qp_num;
    Injected n;

    auto before = [](ibv_context* ctx, const char* name) { return try_counter(ctx, name); };
    const auto a_window0 = before(a.ctx, "rx_response_out_of_window");
    const auto b_ahead0 = before(b.ctx, "rx_out_of_sequence");
    const auto b_behind0 = before(b.ctx, "rx_duplicate");

    // One volley of every kind, at PSNs `ahead` of and `behind` what the connection uses.
    auto volley = [&](uint32_t round) {
        for (const uint32_t psn : {kFirstPsn + kFar + round, kFirstPsn - kFar - round}) {
            // At the requester a (as if from b).
            wire::Headers h = headers(wire::Opcode::RcAcknowledge, aqpn, psn);
            h.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits);
            as_b.send(h, devices().ip_a);
            ++n.acks;
            for (const auto code :
                 {wire::NakCode::PsnSequenceError, wire::NakCode::InvalidRequest,
                  wire::NakCode::RemoteAccessError, wire::NakCode::RemoteOperationalError}) {
                h.aeth.syndrome = wire::Aeth::make(wire::AckType::Nak, static_cast<uint8_t>(code));
                as_b.send(h, devices().ip_a);
                ++n.naks;
            }
            h.aeth.syndrome = wire::Aeth::make(wire::AckType::RnrNak, 1);
            as_b.send(h, devices().ip_a);
            ++n.rnr_naks;
            for (const auto op :
                 {wire::Opcode::RcReadResponseOnly, wire::Opcode::RcReadResponseFirst,
                  wire::Opcode::RcReadResponseMiddle, wire::Opcode::RcReadResponseLast}) {
                wire::Headers r = headers(op, aqpn, psn);
                r.aeth.syndrome = wire::Aeth::make(wire::AckType::Ack, wire::kAethInvalidCredits);
                as_b.send(r, devices().ip_a, op == wire::Opcode::RcReadResponseMiddle ? 1024 : 512);
                ++n.read_responses;
            }
            n.responses += 1 + 4 + 1 + 4;

            // At the responder b (as if from a), aimed at real keys and memory.
            const bool ahead = psn == kFirstPsn + kFar + round;
            wire::Headers s = headers(wire::Opcode::RcSendOnly, bqpn, psn);
            s.bth.ack_req = true;
            as_a.send(s, devices().ip_b, 256);
            ++n.sends;
            wire::Headers w = headers(wire::Opcode::RcWriteOnly, bqpn, psn);
            w.bth.ack_req = true;
            w.reth = {bmem.addr() + kBaitAt, bmem.mr->rkey, 512};
            as_a.send(w, devices().ip_b, 512);
            w.reth = {bmem.addr() + kWriteAt - 256, bmem.mr->rkey, 512};  // across the canary
            as_a.send(w, devices().ip_b, 512);
            n.writes += 2;
            wire::Headers rd = headers(wire::Opcode::RcReadRequest, bqpn, psn);
            rd.bth.ack_req = true;
            rd.reth = {bmem.addr() + kReadSrcAt, bmem.mr->rkey, 2048};
            as_a.send(rd, devices().ip_b);
            ++n.reads;
            (ahead ? n.requests_ahead : n.requests_behind) += 4;
        }
    };

    constexpr int kRounds = 24;
    uint64_t wr_id = 1;
    for (int round = 0; round < kRounds; ++round) {
        const auto seed = static_cast<uint64_t>(round);
        fill_pattern(amem.bytes.data(), kMsg, seed);                      // SEND/WRITE source
        fill_pattern(bmem.bytes.data() + kReadSrcAt, kMsg, seed + 1000);  // READ source
        std::fill_n(amem.bytes.data() + kReadDstAt, kMsg, uint8_t{0});
        std::fill_n(brecv.bytes.data() + kRecvAt, kMsg, uint8_t{0});
        // Each kind in turn, so that each one's verification sees only its own transfer.
        const ibv_wr_opcode op = round % 3 == 0   ? IBV_WR_SEND
                                 : round % 3 == 1 ? IBV_WR_RDMA_WRITE
                                                  : IBV_WR_RDMA_READ;
        if (op == IBV_WR_SEND)
            REQUIRE(post_recv_buf(b.qp, brecv, kRecvAt, kMsg, 1000 + wr_id) == 0);
        const size_t local = op == IBV_WR_RDMA_READ ? kReadDstAt : 0;
        const uint64_t remote =
            op == IBV_WR_RDMA_READ ? bmem.addr() + kReadSrcAt : bmem.addr() + kWriteAt;
        REQUIRE(post_rdma(a.qp, op, amem, local, kMsg, remote, bmem.mr->rkey, wr_id) == 0);
        volley(static_cast<uint32_t>(round));  // while the transfer is in flight

        const auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].wr_id == wr_id);
        CHECK(wcs[0].status == IBV_WC_SUCCESS);
        if (op == IBV_WR_RDMA_READ) CHECK(wcs[0].byte_len == kMsg);
        if (op == IBV_WR_SEND) {
            const auto rwc = wait_completions(b.cq, 1);
            REQUIRE(rwc.size() == 1);
            CHECK(rwc[0].wr_id == 1000 + wr_id);
            CHECK(rwc[0].status == IBV_WC_SUCCESS);
            CHECK(rwc[0].byte_len == kMsg);
            CHECK(std::memcmp(brecv.bytes.data() + kRecvAt, amem.bytes.data(), kMsg) == 0);
        } else if (op == IBV_WR_RDMA_WRITE) {
            CHECK(std::memcmp(bmem.bytes.data() + kWriteAt, amem.bytes.data(), kMsg) == 0);
        } else {
            CHECK(std::memcmp(amem.bytes.data() + kReadDstAt, bmem.bytes.data() + kReadSrcAt,
                              kMsg) == 0);
        }
        ++wr_id;
        if (a.state() != IBV_QPS_RTS) break;  // a believed a spoofed NAK: stop, report below
    }

    CHECK(a.state() == IBV_QPS_RTS);
    CHECK(b.state() == IBV_QPS_RTS);
    // No completion beyond the real ones: spoofed SENDs consumed no receive (none were left),
    // spoofed responses completed nothing. Wait a little for stragglers.
    const auto extra_a = wait_completions(a.cq, 1, std::chrono::milliseconds(200));
    CHECK(extra_a.empty());
    const auto extra_b = wait_completions(b.cq, 1, std::chrono::milliseconds(50));
    CHECK(extra_b.empty());

    // Canaries and bait: nothing spoofed landed anywhere.
    CHECK(all_are(bmem.bytes.data(), kCan, kCanary));
    CHECK(all_are(bmem.bytes.data() + kWriteAt + kMsg, kCan + kBait + kCan, kCanary));
    CHECK(all_are(bmem.bytes.data() + kReadSrcAt + kMsg, kCan, kCanary));
    CHECK(all_are(amem.bytes.data() + kMsg, kCan, kCanary));
    CHECK(all_are(amem.bytes.data() + kReadDstAt + kMsg, kCan, kCanary));
    CHECK(all_are(brecv.bytes.data(), kCan, kCanary));
    CHECK(all_are(brecv.bytes.data() + kRecvAt + kMsg, kCan, kCanary));

    // Every spoofed packet was dropped and counted, by kind. (The spoofed packets arrive
    // before the real traffic's last completion only if the loopback kept their order; wait,
    // bounded, for the counters to settle.)
    INFO("injected: " << n.acks << " ACKs, " << n.naks << " NAKs, " << n.rnr_naks << " RNR NAKs, "
                      << n.read_responses << " READ responses at a; " << n.sends << " SENDs, "
                      << n.writes << " WRITEs, " << n.reads << " READs at b");
    const auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto grew = [&](ibv_context* ctx, const char* name, const std::optional<uint64_t>& start,
                    uint64_t want) {
        for (int i = 0; i < 2500; ++i) {
            const auto now = try_counter(ctx, name);
            if (!now || !start) return false;
            if (*now - *start >= want) return true;
            if (std::chrono::steady_clock::now() > settle) break;
            ::usleep(2000);
        }
        return false;
    };
    INFO("a rx_response_out_of_window " << (a_window0 ? "exists" : "does not exist on this build"));
    CHECK(grew(a.ctx, "rx_response_out_of_window", a_window0, n.responses));
    CHECK(grew(b.ctx, "rx_out_of_sequence", b_ahead0, n.requests_ahead));
    CHECK(grew(b.ctx, "rx_duplicate", b_behind0, n.requests_behind));
}
