// The kernel rxe reference captures, loaded once for every wire test.
// find_packet() looks among the IPv4 packets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "uroce/icrc.h"

namespace wiretest {

struct CapturedPacket {
    std::string capture;  // file name without ".pcap", e.g. "rc_read"
    size_t frame = 0;     // 1-based, as tshark numbers frames
    uroce::wire::IpFlow flow;
    uroce::wire::Ipv4Unseen unseen;  // identification and DF as captured
    uint16_t other_flag_bits = 0;    // reserved, MF and fragment offset as captured
    std::vector<uint8_t> udp;        // the UDP payload, BTH .. ICRC

    std::span<const uint8_t> roce() const { return std::span(udp).first(udp.size() - 4); }
};

// The directory holding the captures: $UROCE_CAPTURES_DIR, else the repository's tests/data.
std::filesystem::path captures_dir();

// Every RoCEv2 packet over IPv4 of every *.pcap in captures_dir(), in file-name then frame
// order. Throws (failing the calling test) if the directory or a capture is missing or
// unreadable.
const std::vector<CapturedPacket>& all_packets();

// The same for RoCEv2 packets over IPv6 (their `unseen` and `other_flag_bits` are unused).
const std::vector<CapturedPacket>& ipv6_packets();

// The packet with this tshark frame number in this capture; throws if there is none.
const CapturedPacket& find_packet(const std::string& capture, size_t frame);

}  // namespace wiretest
