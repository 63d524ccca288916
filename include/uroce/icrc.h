// The RoCEv2 Invariant CRC (IBA Annex A17).
//
// The ICRC is a CRC-32 (the Ethernet/zlib polynomial, reflected) over
//   8 bytes of 0xff | IP header | UDP header | BTH | extension headers | payload | pad
// with the fields that routers may change replaced by ones: IPv4 TOS, TTL and header
// checksum, or IPv6 traffic class, flow label and hop limit; the UDP checksum, and the BTH
// reserved byte (byte 4). It is stored in the last four bytes of the UDP payload, least
// significant byte first.
//
// Over IPv6 a receiver sees every field the ICRC covers, so the check is exact. Over IPv4
// a receiver on a UDP socket sees the addresses, ports and lengths of the IP and UDP
// headers, but not the IPv4 identification field or the flags, both of which the ICRC
// covers. icrc_verify() therefore requires DF set (RoCEv2 packets are never
// fragmented; rxe and uroce set DF) and accepts a packet when some identification value
// explains the received ICRC; see docs/wire-format.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "uroce/ip_address.h"

namespace uroce::wire {

// The IP/UDP fields the ICRC covers that a UDP socket can see. Ports in host byte order.
// Both addresses are of one family, which says whether the packet travels in IPv4 or IPv6.
struct IpFlow {
    IpAddress src_ip;
    IpAddress dst_ip;
    uint16_t src_port = 0;
    uint16_t dst_port = 0;
};

// The IPv4 fields the ICRC covers that a UDP receiver cannot see. icrc() computes with any
// value; icrc_verify() only accepts dont_fragment == true. IPv6 has no such fields: ignored.
struct Ipv4Unseen {
    uint16_t identification = 0;
    bool dont_fragment = true;
};

// ICRC of a packet whose UDP payload (without ICRC) is the concatenation of `pieces`.
uint32_t icrc(const IpFlow& flow, const Ipv4Unseen& unseen,
              std::span<const std::span<const uint8_t>> pieces);

// Convenience for one contiguous buffer (BTH .. pad, no ICRC).
uint32_t icrc(const IpFlow& flow, const Ipv4Unseen& unseen, std::span<const uint8_t> roce);

enum class IcrcCheck {
    Exact,                // matches with the expected identification and DF (uroce's packets);
                          // over IPv6: matches
    MatchesUnseenFields,  // matches for some identification value, with DF set (the kernel's rxe)
    Mismatch,             // no identification value with DF set explains it: corrupted
};
const char* to_string(IcrcCheck c);

// Check the ICRC carried in the last four bytes of `udp_payload`. Over IPv6: Exact or Mismatch,
// and the identification arguments are unused. Over IPv4, for a packet sent with DF set
// and no other IPv4 flag or fragment offset. A packet whose ICRC only some identification with
// DF clear explains is a Mismatch. A random corruption is accepted with probability 2^-16; no
// single-bit corruption is accepted (except in BTH byte 4, which the ICRC masks) in a UDP
// payload of up to 26744 bytes.
//
// `expected_identification` is the identification the sender most likely used: Exact means
// the ICRC matches with it. 0 for a datagram received alone; k for the k-th segment of a
// datagram train a sender sent with GSO (Linux numbers the segments 0, 1, 2, ...).
// Unless it is a Mismatch, `*identification` (if not null) gets the identification that
// explains the ICRC: what the IPv4 header must have carried (a capture writes it back).
IcrcCheck icrc_verify(const IpFlow& flow, std::span<const uint8_t> udp_payload,
                      uint16_t expected_identification = 0, uint16_t* identification = nullptr);

}  // namespace uroce::wire
