// Catch2 main for the wire tests, and the loader of the reference captures.

// GCC 12 with -fsanitize=address at -O2 warns of a maybe-uninitialized std::function inside
// libstdc++'s <regex>, which Catch's main instantiates; the warning is about library code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CATCH_CONFIG_MAIN
#include <pcap/pcap.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>

#include "captures.h"
#include "uroce/wire.h"

namespace wiretest {
namespace {

constexpr size_t kEthernetBytes = 14;
constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint16_t kEtherTypeIpv6 = 0x86dd;
constexpr uint8_t kIpProtoUdp = 17;

uint16_t be16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] << 8 | p[1]);
}
uint32_t be32(const uint8_t* p) {
    return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

[[noreturn]] void fail(const std::filesystem::path& file, size_t frame, const std::string& why) {
    throw std::runtime_error(file.string() + " frame " + std::to_string(frame) + ": " + why);
}

// An IPv6 frame: the fixed header (no extension headers: RoCEv2 senders add none) and UDP.
CapturedPacket ipv6_packet(const std::filesystem::path& file, size_t frame, const u_char* data,
                           size_t caplen) {
    if (caplen < kEthernetBytes + 40 + 8) fail(file, frame, "too short for IPv6/UDP");
    const uint8_t* ip = data + kEthernetBytes;
    if (ip[0] >> 4 != 6) fail(file, frame, "bad IPv6 header");
    if (ip[6] != kIpProtoUdp) fail(file, frame, "not UDP");
    const size_t payload = be16(ip + 4);
    if (kEthernetBytes + 40 + payload > caplen || payload < 8) fail(file, frame, "bad IPv6 length");
    const uint8_t* udp = ip + 40;
    const size_t udp_len = be16(udp + 4);
    if (udp_len < 8 || udp_len > payload) fail(file, frame, "bad UDP length");
    if (be16(udp + 2) != uroce::wire::kRoceV2Port) fail(file, frame, "not RoCEv2");
    CapturedPacket p;
    p.frame = frame;
    p.flow.src_ip = uroce::IpAddress::from_bytes(ip + 8);
    p.flow.dst_ip = uroce::IpAddress::from_bytes(ip + 24);
    p.flow.src_port = be16(udp);
    p.flow.dst_port = be16(udp + 2);
    p.udp.assign(udp + 8, udp + udp_len);
    if (p.udp.size() < uroce::wire::kIcrcBytes) fail(file, frame, "no room for an ICRC");
    return p;
}

// IPv4 frames go to `out`, IPv6 ones to `out6`.
void load_pcap(const std::filesystem::path& file, std::vector<CapturedPacket>& out,
               std::vector<CapturedPacket>& out6) {
    char errbuf[PCAP_ERRBUF_SIZE] = {};
    std::unique_ptr<pcap_t, decltype(&pcap_close)> pcap(pcap_open_offline(file.c_str(), errbuf),
                                                        &pcap_close);
    if (!pcap) throw std::runtime_error("cannot open " + file.string() + ": " + errbuf);
    if (pcap_datalink(pcap.get()) != DLT_EN10MB) fail(file, 0, "link type is not Ethernet");

    const std::string capture = file.stem().string();
    size_t frame = 0;
    for (;;) {
        pcap_pkthdr* hdr = nullptr;
        const u_char* data = nullptr;
        const int rc = pcap_next_ex(pcap.get(), &hdr, &data);
        if (rc == PCAP_ERROR_BREAK) break;
        if (rc != 1) fail(file, frame, std::string("read error: ") + pcap_geterr(pcap.get()));
        ++frame;
        const size_t caplen = hdr->caplen;
        if (caplen != hdr->len) fail(file, frame, "truncated capture");
        if (caplen >= kEthernetBytes && be16(data + 12) == kEtherTypeIpv6) {
            out6.push_back(ipv6_packet(file, frame, data, caplen));
            out6.back().capture = capture;
            continue;
        }
        if (caplen < kEthernetBytes + 20 + 8) fail(file, frame, "too short for IPv4/UDP");
        if (be16(data + 12) != kEtherTypeIpv4) fail(file, frame, "neither IPv4 nor IPv6");

        const uint8_t* ip = data + kEthernetBytes;
        const size_t ihl = size_t{ip[0] & 0x0fu} * 4;
        if (ip[0] >> 4 != 4 || ihl < 20) fail(file, frame, "bad IPv4 header");
        if (ip[9] != kIpProtoUdp) fail(file, frame, "not UDP");
        const size_t ip_total = be16(ip + 2);
        if (kEthernetBytes + ip_total > caplen || ip_total < ihl + 8) {
            fail(file, frame, "bad IPv4 total length");
        }
        const uint8_t* udp = ip + ihl;
        const size_t udp_len = be16(udp + 4);
        if (udp_len < 8 || ihl + udp_len > ip_total) fail(file, frame, "bad UDP length");
        if (be16(udp + 2) != uroce::wire::kRoceV2Port) fail(file, frame, "not RoCEv2");

        CapturedPacket p;
        p.capture = capture;
        p.frame = frame;
        p.flow.src_ip = uroce::IpAddress::v4(be32(ip + 12));
        p.flow.dst_ip = uroce::IpAddress::v4(be32(ip + 16));
        p.flow.src_port = be16(udp);
        p.flow.dst_port = be16(udp + 2);
        const uint16_t flags = be16(ip + 6);
        p.unseen.identification = be16(ip + 4);
        p.unseen.dont_fragment = (flags & 0x4000) != 0;
        p.other_flag_bits = flags & static_cast<uint16_t>(~0x4000u);
        p.udp.assign(udp + 8, udp + udp_len);
        if (p.udp.size() < uroce::wire::kIcrcBytes) fail(file, frame, "no room for an ICRC");
        out.push_back(std::move(p));
    }
    if (frame == 0) fail(file, 0, "no packets");
}

struct Loaded {
    std::vector<CapturedPacket> v4;
    std::vector<CapturedPacket> v6;
};

Loaded load_all() {
    const std::filesystem::path dir = captures_dir();
    if (!std::filesystem::is_directory(dir)) {
        throw std::runtime_error(
            "RoCEv2 captures not found at " + dir.string() +
            " (they are in the repository's tests/data; UROCE_CAPTURES_DIR overrides)");
    }
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() == ".pcap") files.push_back(entry.path());
    }
    if (files.empty()) throw std::runtime_error("no .pcap files in " + dir.string());
    std::sort(files.begin(), files.end());

    Loaded packets;
    for (const auto& f : files) load_pcap(f, packets.v4, packets.v6);
    return packets;
}

const Loaded& loaded() {
    static const Loaded packets = load_all();
    return packets;
}

}  // namespace

std::filesystem::path captures_dir() {
    if (const char* env = std::getenv("UROCE_CAPTURES_DIR"); env != nullptr && *env != '\0') {
        return env;
    }
    return UROCE_CAPTURES_DIR;
}

const std::vector<CapturedPacket>& all_packets() {
    return loaded().v4;
}

const std::vector<CapturedPacket>& ipv6_packets() {
    return loaded().v6;
}

const CapturedPacket& find_packet(const std::string& capture, size_t frame) {
    static const auto index = [] {
        std::map<std::pair<std::string, size_t>, const CapturedPacket*> m;
        for (const auto& p : all_packets()) m[{p.capture, p.frame}] = &p;
        return m;
    }();
    const auto it = index.find({capture, frame});
    if (it == index.end()) {
        throw std::runtime_error("no frame " + std::to_string(frame) + " in " + capture);
    }
    return *it->second;
}

}  // namespace wiretest
