// The provider's own packet capture (transport/packet_capture.h), read back with libpcap:
// one frame per RoCE packet in each direction, whatever the batching, each with sound
// Ethernet/IPv4/UDP headers and the ICRC for the IPv4 identification the frame carries.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pcap/pcap.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/net_namespace.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

struct Frame {
    IpAddress src_ip, dst_ip;
    uint16_t src_port = 0, dst_port = 0;
    uint16_t id = 0;
    uint8_t ecn = 0;    // the IP header's ECN field
    int64_t ts_ns = 0;  // the frame's timestamp, nanoseconds since the epoch
    std::vector<uint8_t> udp_payload;
};

uint16_t get16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] << 8 | p[1]);
}
uint32_t get32(const uint8_t* p) {
    return uint32_t{get16(p)} << 16 | get16(p + 2);
}

// Every frame of `path`, each checked for what a capture of the wire would show.
std::vector<Frame> read_capture(const std::string& path) {
    char err[PCAP_ERRBUF_SIZE];
    // At the file's own precision: libpcap would round nanoseconds to microseconds.
    pcap_t* p =
        pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err);
    INFO(path << ": " << err);
    REQUIRE(p);
    REQUIRE(pcap_datalink(p) == DLT_EN10MB);
    std::vector<Frame> out;
    pcap_pkthdr* h = nullptr;
    const u_char* d = nullptr;
    while (pcap_next_ex(p, &h, &d) == 1) {
        INFO("frame " << out.size() + 1);
        REQUIRE(h->caplen == h->len);
        Frame f;
        const uint8_t* udp = nullptr;
        if (get16(d + 12) == 0x86dd) {  // IPv6
            REQUIRE(h->caplen >= 14 + 40 + 8);
            const uint8_t* ip = d + 14;
            CHECK(ip[0] >> 4 == 6);
            CHECK((get32(ip) & 0x0fcfffff) == 0);  // DSCP and flow label 0
            f.ecn = static_cast<uint8_t>(get32(ip) >> 20 & 3);
            CHECK(ip[6] == 17);
            CHECK(get16(ip + 4) == h->len - 14 - 40);
            udp = ip + 40;
            CHECK(get16(udp + 4) == h->len - 14 - 40);
            f.src_ip = IpAddress::from_bytes(ip + 8);
            f.dst_ip = IpAddress::from_bytes(ip + 24);
            // The UDP checksum IPv6 requires holds (pseudo-header + datagram sum to ones).
            uint32_t sum = 0;
            for (int i = 8; i < 40; i += 2) sum += get16(ip + i);
            sum += get16(udp + 4) + 17u;
            const size_t udp_len = h->len - 14 - 40;
            for (size_t i = 0; i + 1 < udp_len; i += 2) sum += get16(udp + i);
            if (udp_len & 1) sum += uint32_t{udp[udp_len - 1]} << 8;
            while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
            CHECK(get16(udp + 6) != 0);
            CHECK(sum == 0xffff);
        } else {
            REQUIRE(h->caplen >= 14 + 20 + 8);
            CHECK(get16(d + 12) == 0x0800);
            const uint8_t* ip = d + 14;
            CHECK(ip[0] == 0x45);
            CHECK((ip[1] & 0xfc) == 0);  // DSCP 0
            f.ecn = ip[1] & 3;
            CHECK(ip[9] == 17);
            CHECK(get16(ip + 6) == 0x4000);  // DF, no fragment
            CHECK(get16(ip + 2) == h->len - 14);
            uint32_t sum = 0;
            for (int i = 0; i < 20; i += 2) sum += get16(ip + i);
            while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
            CHECK(sum == 0xffff);  // the header checksum holds
            udp = ip + 20;
            CHECK(get16(udp + 4) == h->len - 14 - 20);
            f.src_ip = IpAddress::v4(get32(ip + 12));
            f.dst_ip = IpAddress::v4(get32(ip + 16));
            f.id = get16(ip + 4);
        }
        f.ts_ns = int64_t{h->ts.tv_sec} * 1'000'000'000 + h->ts.tv_usec;
        f.src_port = get16(udp);
        f.dst_port = get16(udp + 2);
        f.udp_payload.assign(udp + 8, d + h->caplen);
        // The ICRC is exactly the one for the identification in the frame.
        const wire::IpFlow flow{f.src_ip, f.dst_ip, f.src_port, f.dst_port};
        CHECK(wire::icrc_verify(flow, f.udp_payload, f.id) == wire::IcrcCheck::Exact);
        wire::ParsedPacket pkt;
        CHECK(wire::parse_packet(f.udp_payload, pkt) == wire::ParseError::None);
        out.push_back(std::move(f));
    }
    pcap_close(p);
    return out;
}

int64_t realtime_ns() {
    timespec t{};
    ::clock_gettime(CLOCK_REALTIME, &t);
    return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// The first four bytes of `path`, as the host reads them (libpcap writes its magic in the
// host's byte order).
uint32_t file_magic(const std::string& path) {
    uint32_t magic = 0;
    FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f);
    const size_t got = std::fread(&magic, sizeof magic, 1, f);
    std::fclose(f);
    REQUIRE(got == 1);
    return magic;
}

// Frames of one file: timestamps of this run, in nanoseconds, in file order.
void check_timestamps(const std::vector<Frame>& frames, int64_t from_ns, int64_t to_ns) {
    size_t sub_microsecond = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
        INFO("frame " << i + 1);
        CHECK(frames[i].ts_ns >= from_ns);
        CHECK(frames[i].ts_ns <= to_ns);
        if (i > 0) CHECK(frames[i].ts_ns >= frames[i - 1].ts_ns);
        sub_microsecond += frames[i].ts_ns % 1000 != 0;
    }
    // Some frame's timestamp is not a whole microsecond (all of them would be, one in 1000^n,
    // with microsecond timestamps scaled up).
    CHECK(sub_microsecond > 0);
}

class TempDir {
  public:
    TempDir() {
        char tmpl[] = "/tmp/uroce-pcap-XXXXXX";
        REQUIRE(::mkdtemp(tmpl));
        path_ = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

constexpr uint32_t kWrite = 40 * kMtu;
constexpr uint32_t kSend = 9 * kMtu + 5;
constexpr uint32_t kRead = 20 * kMtu;

void traffic(Pair& p) {
    fill(p.a.at(0), kWrite, 1);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kWrite)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), kWrite, 1) == kWrite);
    fill(p.a.at(kWrite), kSend, 2);
    REQUIRE(p.b.qp->post_recv(recv_wqe(2, {p.b.sge(kWrite, kSend)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(3, {p.a.sge(kWrite, kSend)})) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(p.wait_one(*p.b.rcq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(kWrite), kSend, 2) == kSend);
    fill(p.b.at(kWrite + kSend), kRead, 3);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 4, {p.a.sge(kWrite + kSend, kRead)},
                                       p.b.iova + kWrite + kSend, p.b.keys.rkey)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.a.at(kWrite + kSend), kRead, 3) == kRead);
}

std::vector<Frame> from(const std::vector<Frame>& frames, const IpAddress& src_ip) {
    std::vector<Frame> out;
    for (const Frame& f : frames)
        if (f.src_ip == src_ip) out.push_back(f);
    return out;
}

// What one side sent is what the other received, frame for frame: same payload, same
// identification (the receiver recovered the one the sender's ICRC was made for).
void same_frames(const std::vector<Frame>& sent, const std::vector<Frame>& received) {
    REQUIRE(sent.size() == received.size());
    for (size_t i = 0; i < sent.size(); ++i) {
        INFO("frame " << i);
        CHECK(sent[i].udp_payload == received[i].udp_payload);
        CHECK(sent[i].id == received[i].id);
        CHECK(sent[i].ecn == received[i].ecn);
        CHECK(sent[i].src_port == received[i].src_port);
        CHECK(sent[i].dst_ip == received[i].dst_ip);
    }
}

}  // namespace

TEST_CASE("UROCE_PCAP: one frame per packet sent and received, ICRC right for its id",
          "[capture]") {
    const bool gso = GENERATE(true, false);
    INFO("GSO " << gso);
    TempDir dir;
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    o.gso_a = o.gso_b = gso;
    o.pcap_a = dir.file("a.pcap");
    o.pcap_b = dir.file("b.pcap");
    IpAddress ip_a, ip_b;
    uint64_t a_tx = 0, a_rx = 0, b_tx = 0, b_rx = 0, trains = 0, multi = 0;
    const int64_t from_ns = realtime_ns();
    {
        Pair p(o);
        p.connect();
        traffic(p);
        ip_a = p.a.ip;
        ip_b = p.b.ip;
        // The QPs stop (each sends its last ACK again: RcQp::send_last_ack); let the last
        // ACKs arrive before the engines close.
        p.a.qp->close();
        p.b.qp->close();
        REQUIRE(p.wait_until([&] {
            return p.a.counters().rx_packets.load() == p.b.counters().tx_packets.load() &&
                   p.b.counters().rx_packets.load() == p.a.counters().tx_packets.load();
        }));
        a_tx = p.a.counters().tx_packets.load();
        a_rx = p.a.counters().rx_packets.load();
        b_tx = p.b.counters().tx_packets.load();
        b_rx = p.b.counters().rx_packets.load();
        trains = p.a.counters().tx_gso_sends.load() + p.b.counters().tx_gso_sends.load();
        multi = p.a.counters().tx_multi_sends.load() + p.b.counters().tx_multi_sends.load();
    }  // the engines close: the files are complete
    const int64_t to_ns = realtime_ns();
    const auto a = read_capture(o.pcap_a);
    const auto b = read_capture(o.pcap_b);
    // libpcap's nanosecond magic, and timestamps to match.
    CHECK(file_magic(o.pcap_a) == 0xa1b23c4d);
    CHECK(file_magic(o.pcap_b) == 0xa1b23c4d);
    check_timestamps(a, from_ns, to_ns);
    check_timestamps(b, from_ns, to_ns);
    CHECK(a.size() == a_tx + a_rx);
    CHECK(b.size() == b_tx + b_rx);
    CHECK(from(a, ip_a).size() == a_tx);
    CHECK(from(b, ip_b).size() == b_tx);
    same_frames(from(a, ip_a), from(b, ip_a));
    same_frames(from(b, ip_b), from(a, ip_b));
    // Without UROCE_ECN every packet leaves Not-ECT, as the kernel's rxe sends.
    for (const Frame& f : a) CHECK(f.ecn == 0);
    // Packets of a train carry identifications 0, 1, 2, ...; without GSO all are 0.
    size_t nonzero = 0;
    for (const Frame& f : a) nonzero += f.id != 0;
    if (gso) {
        CHECK(trains > 0);
        // Several trains in one sendmmsg: each numbered from 0 in the capture, as on the wire.
        CHECK(multi > 0);
        CHECK(nonzero > 0);
    } else {
        CHECK(trains == 0);
        CHECK(nonzero == 0);
    }
}

// Whole frames in `path` now (a frame cut short at the end of the file is not counted).
size_t frames_in(const std::string& path) {
    char err[PCAP_ERRBUF_SIZE];
    pcap_t* p = pcap_open_offline(path.c_str(), err);
    if (!p) return 0;  // not even the file header yet
    size_t n = 0;
    pcap_pkthdr* h = nullptr;
    const u_char* d = nullptr;
    while (pcap_next_ex(p, &h, &d) == 1) ++n;
    pcap_close(p);
    return n;
}

TEST_CASE("UROCE_PCAP: the frames reach the file while the engines run", "[capture]") {
    // The stream is buffered and flushed at most PacketCapture::kFlushAfterNanos after a
    // frame was written: once the traffic stops, the engine's capture timer flushes the
    // last frames, with no batch and no close to do it.
    TempDir dir;
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    o.pcap_a = dir.file("a.pcap");
    Pair p(o);
    p.connect();
    traffic(p);
    REQUIRE(p.wait_until([&] {
        return p.a.counters().rx_packets.load() == p.b.counters().tx_packets.load() &&
               p.b.counters().rx_packets.load() == p.a.counters().tx_packets.load();
    }));
    const uint64_t a_frames = p.a.counters().tx_packets.load() + p.a.counters().rx_packets.load();
    REQUIRE(a_frames > 0);
    size_t seen = 0;
    // 5 s at most: the flush is due within 10 ms.
    for (int i = 0; i < 1000 && seen != a_frames; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        seen = frames_in(o.pcap_a);
    }
    CHECK(seen == a_frames);
    CHECK(p.a.counters().tx_packets.load() + p.a.counters().rx_packets.load() == a_frames);
}

TEST_CASE("UROCE_PCAP: a fork neither doubles nor loses the frames still buffered", "[capture]") {
    // The child gets a copy of the stream's buffer, and exit() flushes every stdio stream
    // into the file the parent writes too. The fork handlers flush first.
    TempDir dir;
    const std::string path = dir.file("fork.pcap");
    std::string error;
    int err = 0;
    auto capture = PacketCapture::open(path, error, err);
    REQUIRE(capture);
    const wire::IpFlow flow{IpAddress::v4(0x7f000001), IpAddress::v4(0x7f000002), 49152, 4791};
    std::vector<uint8_t> payload(64, 0x5a);
    const iovec iov{payload.data(), payload.size()};
    constexpr size_t kFrames = 5;
    for (size_t i = 0; i < kFrames; ++i) capture->sent(flow, 0, 0, std::span(&iov, 1));
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        std::fflush(nullptr);  // what exit() does with every stream, without Catch's exit
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    for (size_t i = 0; i < kFrames; ++i) capture->sent(flow, 0, 0, std::span(&iov, 1));
    capture.reset();  // closes the file
    CHECK(frames_in(path) == 2 * kFrames);
}

TEST_CASE("UROCE_PCAP over IPv6: IPv6 frames with their UDP checksum, ICRC right",
          "[capture][ipv6]") {
    Ipv6Namespace ns;
    TempDir dir;
    PairOptions o;
    o.mem_bytes = 256 * 1024;
    o.addresses = Ipv6Namespace::addresses();
    o.pcap_a = dir.file("a.pcap");
    o.pcap_b = dir.file("b.pcap");
    uint64_t a_tx = 0, a_rx = 0, b_tx = 0, trains = 0;
    {
        Pair p(o);
        p.connect();
        traffic(p);       // WRITE, SEND and READ, data checked
        p.a.qp->close();  // their last ACKs again, as in the case above
        p.b.qp->close();
        REQUIRE(p.wait_until([&] {
            return p.a.counters().rx_packets.load() == p.b.counters().tx_packets.load() &&
                   p.b.counters().rx_packets.load() == p.a.counters().tx_packets.load();
        }));
        a_tx = p.a.counters().tx_packets.load();
        a_rx = p.a.counters().rx_packets.load();
        b_tx = p.b.counters().tx_packets.load();
        trains = p.a.counters().tx_gso_sends.load() + p.b.counters().tx_gso_sends.load();
        CHECK(p.a.counters().rx_bad_icrc.load() == 0);
        CHECK(p.b.counters().rx_bad_icrc.load() == 0);
    }
    // read_capture checks each frame: IPv6 header, UDP checksum, ICRC exact, BTH parses.
    const auto a = read_capture(o.pcap_a);
    const auto b = read_capture(o.pcap_b);
    CHECK(a.size() == a_tx + a_rx);
    CHECK(from(a, Ipv6Namespace::a()).size() == a_tx);
    CHECK(from(b, Ipv6Namespace::b()).size() == b_tx);
    same_frames(from(a, Ipv6Namespace::a()), from(b, Ipv6Namespace::a()));
    same_frames(from(b, Ipv6Namespace::b()), from(a, Ipv6Namespace::b()));
    CHECK(trains > 0);  // GSO trains over IPv6 too, cut into one frame per packet
    for (const Frame& f : a) CHECK(f.id == 0);
}

TEST_CASE("UROCE_PCAP: packets the fault injector drops are not in the sender's capture",
          "[capture]") {
    TempDir dir;
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    o.faults_a.drop = 0.05;
    o.faults_a.seed = 9;
    o.pcap_a = dir.file("a.pcap");
    o.pcap_b = dir.file("b.pcap");
    IpAddress ip_a;
    uint64_t a_tx = 0, dropped = 0;
    {
        Pair p(o);
        p.connect();
        traffic(p);
        ip_a = p.a.ip;
        REQUIRE(p.wait_until(
            [&] { return p.b.counters().rx_packets.load() == p.a.counters().tx_packets.load(); }));
        a_tx = p.a.counters().tx_packets.load();
        dropped = p.a.counters().tx_dropped_fault.load();
    }
    CHECK(dropped > 0);
    const auto a = read_capture(o.pcap_a);
    const auto b = read_capture(o.pcap_b);
    CHECK(from(a, ip_a).size() == a_tx);
    same_frames(from(a, ip_a), from(b, ip_a));
}

TEST_CASE("UROCE_PCAP: engines naming one file share it; %p is the process id", "[capture]") {
    CHECK(PacketCapture::expand("x-%p.pcap") == "x-" + std::to_string(::getpid()) + ".pcap");
    CHECK(PacketCapture::expand("100%%-%q%") == "100%-%q%");
    TempDir dir;
    std::string why;
    int err = 0;
    auto one = PacketCapture::open(dir.file("s-%p.pcap"), why, err);
    auto two = PacketCapture::open(dir.file("s-%p.pcap"), why, err);
    REQUIRE(one);
    CHECK(one == two);
    CHECK(one->path() == dir.file("s-" + std::to_string(::getpid()) + ".pcap"));
    CHECK(std::filesystem::exists(one->path()));
}

TEST_CASE("UROCE_PCAP: a file that cannot be written refuses the engine, saying why", "[capture]") {
    EngineConfig config;
    const Addresses addrs = next_addresses();
    config.ip = addrs.a;
    config.port = addrs.port;
    config.pcap_path = "/nonexistent-uroce-dir/x.pcap";
    std::string error;
    int err = 0;
    CHECK(Engine::create(config, error, err) == nullptr);
    CHECK(err == ENOENT);
    CHECK(error.find("/nonexistent-uroce-dir/x.pcap") != std::string::npos);
}

TEST_CASE("UROCE_PCAP: a received packet gets the identification its sender used", "[capture]") {
    // A peer like the kernel's rxe numbers its packets itself: here a packet whose ICRC was
    // made for identification 0x1234, sent from a plain UDP socket at a's address.
    TempDir dir;
    PairOptions o;
    o.pcap_b = dir.file("b.pcap");
    IpAddress ip_a;
    {
        Pair p(o);
        p.connect();
        ip_a = p.a.ip;
        const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        REQUIRE(fd >= 0);
        sockaddr_in self{};
        self.sin_family = AF_INET;
        self.sin_addr.s_addr = htonl(p.a.ip.v4());
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self) == 0);
        socklen_t len = sizeof self;
        REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0);
        wire::Headers h;
        h.bth.opcode = static_cast<uint8_t>(wire::Opcode::RcSendOnly);
        h.bth.dest_qp = p.b.qp->qpn();
        h.bth.psn = p.b.qp->attributes().rq_psn;
        h.bth.ack_req = true;
        std::vector<uint8_t> message(100);
        fill(message.data(), message.size(), 77);
        const auto pkt = forge_packet(
            h, message,
            wire::IpFlow{p.a.ip, p.b.ip, ntohs(self.sin_port), p.b.engine->config().port},
            wire::Ipv4Unseen{0x1234, true});
        REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 100)})) == 0);
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_addr.s_addr = htonl(p.b.ip.v4());
        to.sin_port = htons(p.b.engine->config().port);
        REQUIRE(::sendto(fd, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&to),
                         sizeof to) == static_cast<ssize_t>(pkt.size()));
        ::close(fd);
        const Completion c = p.wait_one(*p.b.rcq);
        CHECK(c.status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(0), 100, 77) == 100);
        CHECK(p.b.counters().rx_icrc_unseen_fields.load() == 1);
    }
    const auto b = read_capture(o.pcap_b);  // checks the ICRC of each frame for its id
    const auto forged = from(b, ip_a);
    REQUIRE(forged.size() == 1);
    CHECK(forged[0].id == 0x1234);
}

TEST_CASE("UROCE_PCAP: packets marked CE show it on both sides, and so do the CNPs they draw",
          "[capture][congestion]") {
    TempDir dir;
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    o.pcap_a = dir.file("a.pcap");
    o.pcap_b = dir.file("b.pcap");
    o.faults_a.ce = 0.5;
    o.faults_a.op_classes = kOpWrite;
    // UROCE_ECN=on: the rest leave, and arrive, ECT(0), and the receiver reads the marks.
    o.ecn = true;
    const uint8_t unmarked = 2;
    IpAddress ip_a, ip_b;
    uint64_t marked = 0, cnps = 0;
    {
        Pair p(o);
        p.connect();
        traffic(p);
        p.a.qp->close();  // their last ACKs again, as in the first case
        p.b.qp->close();
        ip_a = p.a.ip;
        ip_b = p.b.ip;
        const EngineCounters& b = p.b.counters();
        REQUIRE(p.wait_until([&] {
            return p.a.counters().rx_packets.load() == b.tx_packets.load() &&
                   b.rx_packets.load() == p.a.counters().tx_packets.load() &&
                   b.tx_cnps.load() + b.cnps_paced.load() == b.rx_ce_marked.load();
        }));
        marked = p.a.counters().tx_ce_fault.load();
        cnps = p.b.counters().tx_cnps.load();
    }
    const auto a = read_capture(o.pcap_a);
    const auto b = read_capture(o.pcap_b);
    same_frames(from(a, ip_a), from(b, ip_a));
    same_frames(from(b, ip_b), from(a, ip_b));
    REQUIRE(marked > 0);
    size_t marked_frames = 0, cnp_frames = 0;
    for (const Frame& f : from(a, ip_a)) {
        if (f.ecn == 3) {
            ++marked_frames;
            CHECK((f.udp_payload[0] & 0x1f) >= 0x06);  // a WRITE (RC opcodes 0x06..0x0b)
            CHECK((f.udp_payload[0] & 0x1f) <= 0x0b);
        } else {
            CHECK(f.ecn == unmarked);
        }
    }
    for (const Frame& f : from(b, ip_b)) {
        CHECK(f.ecn == unmarked);
        if (f.udp_payload[0] == static_cast<uint8_t>(wire::Opcode::Cnp)) ++cnp_frames;
    }
    CHECK(marked_frames == marked);
    CHECK(cnps > 0);
    CHECK(cnp_frames == cnps);
}
