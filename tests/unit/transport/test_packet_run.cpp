// PacketRun (transport/packet_run.h): packets for one QP from one source handed over
// together, in arrival order, and nothing joins that belongs to another QP or source.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/udp_send.h"
#include "transport/packet_run.h"

using namespace uroce;
using namespace uroce::transport;

namespace {

// Records every hand-over: the PSNs it carried and the source it named.
class RecordingQp : public Qp {
  public:
    explicit RecordingQp(uint32_t qpn) : Qp(qpn) {}
    wire::Transport transport() const override { return wire::Transport::Rc; }
    void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) override {
        on_packets(std::span(&pkt, 1), src_ip);
    }
    void on_packets(std::span<const wire::ParsedPacket> pkts, const IpAddress& src_ip) override {
        std::vector<uint32_t> psns;
        for (const wire::ParsedPacket& p : pkts) psns.push_back(p.h.bth.psn);
        calls.push_back({std::move(psns), src_ip});
    }
    void close() override {}

    struct Call {
        std::vector<uint32_t> psns;
        IpAddress src;
    };
    std::vector<Call> calls;
};

wire::ParsedPacket packet(uint32_t psn) {
    wire::ParsedPacket p;
    p.h.bth.psn = psn;
    return p;
}

const IpAddress kPeer = IpAddress::v4(0x7f000101);
const IpAddress kOther = IpAddress::v4(0x7f000102);

}  // namespace

TEST_CASE("PacketRun hands a QP its packets in one call, in arrival order", "[packet_run]") {
    RecordingQp qp(0x11);
    PacketRun run;
    CHECK(run.empty());
    run.hand_over();  // nothing: no call
    CHECK(qp.calls.empty());
    for (uint32_t psn = 100; psn < 105; ++psn) {
        REQUIRE(run.joins(&qp, kPeer));
        run.add(qp, kPeer, packet(psn));
    }
    CHECK(run.size() == 5);
    CHECK(qp.calls.empty());  // nothing reaches the QP before the hand-over
    run.hand_over();
    REQUIRE(qp.calls.size() == 1);
    CHECK(qp.calls[0].psns == std::vector<uint32_t>{100, 101, 102, 103, 104});
    CHECK(qp.calls[0].src == kPeer);
    CHECK(run.empty());
    run.hand_over();  // emptied: no second call
    CHECK(qp.calls.size() == 1);
}

TEST_CASE("PacketRun takes nothing for another QP or from another source", "[packet_run]") {
    RecordingQp a(0x11);
    RecordingQp b(0x12);
    PacketRun run;
    // An empty run takes anything.
    CHECK(run.joins(&a, kPeer));
    CHECK(run.joins(&b, kOther));
    run.add(a, kPeer, packet(1));
    CHECK(run.joins(&a, kPeer));
    CHECK_FALSE(run.joins(&b, kPeer));   // another QP
    CHECK_FALSE(run.joins(&a, kOther));  // a spoofed or second source: checked on its own
    run.hand_over();
    // After the hand-over the next QP starts its own run, with its own source.
    CHECK(run.joins(&b, kOther));
    run.add(b, kOther, packet(2));
    CHECK_FALSE(run.joins(&a, kOther));
    run.hand_over();
    REQUIRE(a.calls.size() == 1);
    REQUIRE(b.calls.size() == 1);
    CHECK(a.calls[0].src == kPeer);
    CHECK(b.calls[0].src == kOther);
    CHECK(b.calls[0].psns == std::vector<uint32_t>{2});
}

TEST_CASE("PacketRun holds at most a GSO train's worth", "[packet_run]") {
    RecordingQp qp(0x11);
    PacketRun run;
    for (uint32_t psn = 0; psn < PacketRun::kMaxPackets; ++psn) {
        REQUIRE(run.joins(&qp, kPeer));
        run.add(qp, kPeer, packet(psn));
    }
    CHECK_FALSE(run.joins(&qp, kPeer));  // full: hand over first
    run.hand_over();
    REQUIRE(qp.calls.size() == 1);
    REQUIRE(qp.calls[0].psns.size() == PacketRun::kMaxPackets);
    for (uint32_t i = 0; i < PacketRun::kMaxPackets; ++i) CHECK(qp.calls[0].psns[i] == i);
    CHECK(run.joins(&qp, kPeer));
}

// --- through an engine's socket ------------------------------------------------------------

namespace {

using namespace uroce::transport::test;

// A peer by hand on an address of its own, which sends its packets as one GSO train.
class TrainSender {
  public:
    explicit TrainSender(const IpAddress& ip) : ip_(ip) {
        fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_storage sa{};
        const socklen_t len = ip.to_sockaddr(0, sa);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), len) == 0);
        sockaddr_storage bound{};
        socklen_t blen = sizeof bound;
        REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &blen) == 0);
        port_ = ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
    }
    ~TrainSender() { ::close(fd_); }
    TrainSender(const TrainSender&) = delete;
    TrainSender& operator=(const TrainSender&) = delete;

    // Packets of equal length, back to back, to engine `to`: packet k carries the ICRC for
    // IPv4 identification k, as a GSO train's k-th segment does.
    void send_train(const std::vector<std::pair<wire::Headers, std::vector<uint8_t>>>& packets,
                    const Engine& to) {
        std::vector<uint8_t> train;
        size_t segment = 0;
        for (size_t k = 0; k < packets.size(); ++k) {
            const auto pkt =
                forge_packet(packets[k].first, packets[k].second,
                             wire::IpFlow{ip_, to.config().ip, port_, to.config().port},
                             wire::Ipv4Unseen{static_cast<uint16_t>(k), true});
            if (k == 0) segment = pkt.size();
            REQUIRE(pkt.size() == segment);
            train.insert(train.end(), pkt.begin(), pkt.end());
        }
        sockaddr_storage dst{};
        const socklen_t dlen = to.config().ip.to_sockaddr(to.config().port, dst);
        send_udp(fd_, dst, dlen, train, static_cast<uint16_t>(segment));
    }

  private:
    IpAddress ip_;
    uint16_t port_ = 0;
    int fd_ = -1;
};

wire::Headers send_header(wire::Opcode op, uint32_t dest_qp, uint32_t psn) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(op);
    h.bth.dest_qp = dest_qp;
    h.bth.psn = psn;
    h.bth.ack_req = op == wire::Opcode::RcSendLast;
    return h;
}

std::vector<uint8_t> payload(uint64_t seed) {
    std::vector<uint8_t> v(kMtu);
    fill(v.data(), v.size(), seed);
    return v;
}

}  // namespace

TEST_CASE("A train's packets for two QPs each reach their own QP, in order", "[packet_run]") {
    // One GSO train, read whole (GRO): SEND FIRST and MIDDLE for QP 1 (a run of two), FIRST
    // for QP 2, LAST for QP 1, LAST for QP 2. Handed to one QP together, the other QP's
    // packets would break both messages (an opcode out of sequence, the wrong bytes).
    PairOptions o;
    o.mem_bytes = 16 * 1024;
    Pair p(o);
    const IpAddress peer = next_addresses().a;  // an address no engine of this test uses
    TrainSender sender(peer);
    auto qp2 = std::make_shared<RcQp>(*p.b.engine, p.b.engine->allocate_qpn(), kPd, o.caps, p.b.scq,
                                      p.b.rcq, nullptr);
    p.b.engine->attach(qp2);
    for (const auto& [qp, remote_qpn] : {std::pair{p.b.qp, 0x100u}, std::pair{qp2, 0x101u}}) {
        QpAttributes attrs = default_attributes();
        attrs.dst_ip = peer;
        attrs.dest_qpn = remote_qpn;
        attrs.rq_psn = 0;
        bring_up(*qp, attrs);
    }
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 3 * kMtu)})) == 0);
    REQUIRE(qp2->post_recv(recv_wqe(2, {p.b.sge(8192, 2 * kMtu)})) == 0);

    const uint32_t q1 = p.b.qp->qpn();
    const uint32_t q2 = qp2->qpn();
    using wire::Opcode;
    sender.send_train({{send_header(Opcode::RcSendFirst, q1, 0), payload(11)},
                       {send_header(Opcode::RcSendMiddle, q1, 1), payload(12)},
                       {send_header(Opcode::RcSendFirst, q2, 0), payload(21)},
                       {send_header(Opcode::RcSendLast, q1, 2), payload(13)},
                       {send_header(Opcode::RcSendLast, q2, 1), payload(22)}},
                      *p.b.engine);

    const auto done = p.wait(*p.b.rcq, 2);
    REQUIRE(done.size() == 2);
    for (const Completion& c : done) {
        CAPTURE(c.wr_id);
        CHECK(c.status == WcStatus::Success);
        CHECK(c.byte_len == (c.wr_id == 1 ? 3 : 2) * kMtu);
        CHECK(c.qp_num == (c.wr_id == 1 ? q1 : q2));
    }
    CHECK(first_mismatch(p.b.at(0), kMtu, 11) == kMtu);
    CHECK(first_mismatch(p.b.at(kMtu), kMtu, 12) == kMtu);
    CHECK(first_mismatch(p.b.at(2 * kMtu), kMtu, 13) == kMtu);
    CHECK(first_mismatch(p.b.at(8192), kMtu, 21) == kMtu);
    CHECK(first_mismatch(p.b.at(8192 + kMtu), kMtu, 22) == kMtu);
    CHECK(p.b.counters().rx_packets.load() == 5);
    // Each QP counted its own packets and bytes, though each run took one update.
    CHECK(p.b.engine->qp_counters(q1).rx_packets.load() == 3);
    CHECK(p.b.engine->qp_counters(q1).rx_payload_bytes.load() == 3 * kMtu);
    CHECK(p.b.engine->qp_counters(q2).rx_packets.load() == 2);
    CHECK(p.b.engine->qp_counters(q2).rx_payload_bytes.load() == 2 * kMtu);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
    // One datagram: the kernel kept the train whole (UDP_GRO), so one read brought all four.
    CHECK(p.b.counters().rx_gro_datagrams.load() == 1);
    p.b.engine->detach(q2);
    qp2->close();
}
