// The RoCEv2 ICRC over IPv4 and IPv6, and its verification by a receiver, which over IPv4
// cannot see the identification and flags (it takes DF to be set and solves for the
// identification).
#include "uroce/icrc.h"

#include <algorithm>
#include <array>

#include "uroce/crc32.h"
#include "uroce/wire.h"

namespace uroce::wire {
namespace {

// Masked pseudo-header: 8 bytes of ones, the IP header, the UDP header.
constexpr size_t kOnesBytes = 8;
constexpr size_t kIpv4Bytes = 20;
constexpr size_t kIpv6Bytes = 40;
constexpr size_t kUdpBytes = 8;
constexpr size_t kPseudoBytes = kOnesBytes + kIpv4Bytes + kUdpBytes;
constexpr size_t kPseudoBytesV6 = kOnesBytes + kIpv6Bytes + kUdpBytes;
// Offsets in the CRC'd message of the unseen IPv4 fields: identification (2 bytes) and
// flags/fragment offset (first byte holds the flags).
constexpr size_t kIdOffset = kOnesBytes + 4;
constexpr size_t kFlagsOffset = kOnesBytes + 6;
constexpr uint16_t kDontFragment = 0x4000;
constexpr size_t kBthReservedByte = 4;

void put16(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
    put16(p, v >> 16);
    put16(p + 2, v);
}

void put_udp(uint8_t* udp, const IpFlow& flow, size_t udp_len) {
    put16(udp, flow.src_port);
    put16(udp + 2, flow.dst_port);
    put16(udp + 4, static_cast<uint32_t>(kUdpBytes + udp_len));
    udp[6] = udp[7] = 0xff;  // checksum: masked
}

// Fills the IPv4 pseudo-header for a UDP payload of `udp_len` bytes (ICRC included).
void fill_pseudo_header(uint8_t* p, const IpFlow& flow, const Ipv4Unseen& unseen, size_t udp_len) {
    std::fill_n(p, kOnesBytes, uint8_t{0xff});
    uint8_t* ip = p + kOnesBytes;
    ip[0] = 0x45;  // version 4, IHL 5: the ICRC has no room for options
    ip[1] = 0xff;  // TOS: masked
    put16(ip + 2, static_cast<uint32_t>(kIpv4Bytes + kUdpBytes + udp_len));
    put16(ip + 4, unseen.identification);
    put16(ip + 6, unseen.dont_fragment ? kDontFragment : 0);
    ip[8] = 0xff;            // TTL: masked
    ip[9] = 17;              // UDP
    ip[10] = ip[11] = 0xff;  // header checksum: masked
    put32(ip + 12, flow.src_ip.v4());
    put32(ip + 16, flow.dst_ip.v4());
    put_udp(ip + kIpv4Bytes, flow, udp_len);
}

// The IPv6 one: version 6, then traffic class and flow label masked (28 bits of ones), the
// payload length (the UDP length), next header UDP, hop limit masked, the addresses.
void fill_pseudo_header_v6(uint8_t* p, const IpFlow& flow, size_t udp_len) {
    std::fill_n(p, kOnesBytes, uint8_t{0xff});
    uint8_t* ip = p + kOnesBytes;
    ip[0] = 0x6f;
    ip[1] = ip[2] = ip[3] = 0xff;
    put16(ip + 4, static_cast<uint32_t>(kUdpBytes + udp_len));
    ip[6] = 17;    // UDP
    ip[7] = 0xff;  // hop limit: masked
    std::copy_n(flow.src_ip.bytes().data(), 16, ip + 8);
    std::copy_n(flow.dst_ip.bytes().data(), 16, ip + 24);
    put_udp(ip + kIpv6Bytes, flow, udp_len);
}

// --- GF(2) polynomial arithmetic modulo the CRC-32 polynomial P ----------------------------
//
// Values are in the CRC's reflected representation: bit 31 holds the coefficient of x^0,
// bit 0 that of x^31. Multiplying by x is then a right shift, and x^32 reduces to the low
// terms of P, which are 0xEDB88320.
constexpr uint32_t kPoly = 0xEDB88320u;
constexpr uint32_t kOne = 0x80000000u;  // the polynomial 1

constexpr uint32_t times_x(uint32_t a) {
    return (a >> 1) ^ (kPoly & (0u - (a & 1)));
}

// x is invertible because P has a constant term: add P to clear the x^0 coefficient, then
// every term moves down one degree (a left shift) and P's x^32 lands on x^31 (bit 0).
constexpr uint32_t times_x_inverse(uint32_t a) {
    return (a & kOne) ? ((a ^ kPoly) << 1) | 1u : a << 1;
}

// Shift-and-add, without branches on the data.
constexpr uint32_t multiply(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (int k = 31; k >= 0; --k) {  // a's coefficients of x^0, x^1, ...
        product ^= b & (0u - (a >> k & 1));
        b = times_x(b);  // b * x^(next power)
    }
    return product;
}

static_assert(times_x(times_x_inverse(kOne)) == kOne);
static_assert(multiply(times_x(kOne), times_x_inverse(kOne)) == kOne);

// kInversePowers[i] = x^-(2^i) mod P, so x^-e is a product over the set bits of e.
constexpr std::array<uint32_t, 64> make_inverse_powers() {
    std::array<uint32_t, 64> t{};
    t[0] = times_x_inverse(kOne);
    for (size_t i = 1; i < t.size(); ++i) t[i] = multiply(t[i - 1], t[i - 1]);
    return t;
}
constexpr std::array<uint32_t, 64> kInversePowers = make_inverse_powers();

uint32_t x_to_minus(uint64_t e) {
    uint32_t r = kOne;
    for (size_t i = 0; e != 0; ++i, e >>= 1) {
        if (e & 1) r = multiply(r, kInversePowers[i]);
    }
    return r;
}

// The exponents verification needs are whole bytes, and a UDP payload is under 64 KiB, so
// x^-(8k) comes from two 1 KiB tables and one multiplication instead of a dozen:
//   kLowBytes[i] = x^-(8i),  kHighBytes[j] = x^-(8 * 256j).
constexpr size_t kLowCount = 256;
constexpr size_t kHighCount = 257;  // k reaches 65535 + the pseudo-header's share

template <size_t N>
constexpr std::array<uint32_t, N> make_geometric(uint32_t step) {
    std::array<uint32_t, N> t{};
    t[0] = kOne;
    for (size_t i = 1; i < N; ++i) t[i] = multiply(t[i - 1], step);
    return t;
}
constexpr uint32_t kXMinus8 = kInversePowers[3];
constexpr std::array<uint32_t, kLowCount> kLowBytes = make_geometric<kLowCount>(kXMinus8);
constexpr std::array<uint32_t, kHighCount> kHighBytes =
    make_geometric<kHighCount>(kInversePowers[11]);  // x^-(8 * 256) = x^-(2^11)
static_assert(multiply(kLowBytes[255], kXMinus8) == kHighBytes[1]);

uint32_t x_to_minus_bytes(uint64_t k) {
    if (k >= kLowCount * kHighCount) return x_to_minus(8 * k);
    return multiply(kLowBytes[k % kLowCount], kHighBytes[k / kLowCount]);
}

// Why verification needs no search:
//
// The CRC is affine over GF(2): for two messages of the same length that differ by d,
// crc(m ^ d) = crc(m) ^ L(d), where L is the CRC with zero initial value and no final xor,
// i.e. L(d) = d(x) * x^32 mod P with the message's first bit as its highest coefficient.
//
// The message we compute (the expected identification, DF set) and the one the sender computed
// differ only inside the three bytes at kIdOffset..kFlagsOffset. Call that 24-bit difference D(x);
// in the whole message it sits multiplied by x^s, s = the number of bits after the window,
// so  received ^ computed = D(x) * x^(s+32) mod P.  Since x is invertible modulo P and D has
// degree below 32, D is recovered exactly as (received ^ computed) * x^-(s+32) mod P. The
// packet is explained by some identification value iff D touches only the 16 identification
// bits: the flags byte must be the one we computed with, DF set and the reserved and MF bits
// clear (the fragment offset, like the rest of the header, is taken to be zero).
//
// This is the same question as asking whether the delta lies in the span of the 16
// single-bit "basis deltas" (the Gaussian-elimination formulation): multiplying by x^s is an
// invertible linear map, and after undoing it the basis deltas are the monomials of D, which
// are already in echelon form. So no elimination is needed, and it costs one power of x^-1
// (table lookups and two 32-step multiplications), not a search over 2^16 values.
//
// Why DF is fixed rather than a 17th unknown. Each accepted unknown bit widens the set of CRC
// deltas taken for "unseen fields", and a single flipped bit of the packet can produce one of
// them: a flip k bits after the window changes the CRC by x^(s+32-k), i.e. D = x^-k mod P,
// so it passes iff x^-k mod P touches only accepted bits of the window. With DF accepted too,
// that happens for UDP payload byte 173, bit 0x08 (and byte 1834, bit 0x40): every packet
// longer than 177 bytes had a single-bit corruption that always passed. With the 16
// identification bits alone the nearest such position is byte 26744, bit 0x40, far beyond
// any RoCE packet (the largest MTU is 4096; uroce drops datagrams over 4352 bytes). Requiring
// DF costs nothing: RoCEv2 packets must not be fragmented, and the senders we meet, the
// kernel's rxe and uroce itself, set DF on every packet. A packet explained only with DF clear
// is a Mismatch. The positions depend only on CRC-32 and the header layout, not on the packet
// contents or length (the ICRC's own bits continue the sequence); tests/unit/wire/test_icrc.cpp
// searches for them.
//
// In the reflected representation the window's byte k, bit j (LSB first, the order the CRC
// consumes them) is the coefficient of x^(23 - 8k - j), i.e. bit 8 + 8k + j of D: D is the
// little-endian difference of the three bytes, shifted left by 8.
// Only the identification's two bytes (window bytes 0 and 1) may differ:
constexpr uint32_t kUnseenWindowMask = 0xffffu << 8;
constexpr size_t kWindowEndOffset = kFlagsOffset + 1;
static_assert(kFlagsOffset == kIdOffset + 2, "the window is three consecutive bytes");

// A packet up to this long (an ACK, a READ request, a short SEND or WRITE) is copied behind
// the pseudo-header and takes one CRC call. ISA-L's CRC costs about as much for 16 bytes as
// for 100 (15-28 ns here), so the two or more calls of the pieces cost more than the copy:
// 45 -> 38 ns for a 36-byte packet (2026-12-02).
constexpr size_t kOneCallBytes = 256;

}  // namespace

uint32_t icrc(const IpFlow& flow, const Ipv4Unseen& unseen,
              std::span<const std::span<const uint8_t>> pieces) {
    size_t roce_len = 0;
    for (const auto& piece : pieces) roce_len += piece.size();

    // The pseudo-header and the BTH go through one buffer, so the BTH reserved byte can be
    // masked even when the BTH is split across pieces; a short packet goes there whole.
    std::array<uint8_t, kPseudoBytesV6 + kOneCallBytes> head;
    size_t pseudo = kPseudoBytes;
    if (flow.dst_ip.is_v4()) {
        fill_pseudo_header(head.data(), flow, unseen, roce_len + kIcrcBytes);
    } else {
        fill_pseudo_header_v6(head.data(), flow, roce_len + kIcrcBytes);
        pseudo = kPseudoBytesV6;
    }
    if (roce_len <= kOneCallBytes) {
        size_t at = pseudo;
        for (const auto& piece : pieces) {
            std::copy_n(piece.data(), piece.size(), head.data() + at);
            at += piece.size();
        }
        if (roce_len > kBthReservedByte) head[pseudo + kBthReservedByte] = 0xff;
        return crc32(0, std::span(head).first(at));
    }
    size_t bth_len = 0;
    for (const auto& piece : pieces) {
        const size_t n = std::min(piece.size(), kBthBytes - bth_len);
        std::copy_n(piece.data(), n, head.data() + pseudo + bth_len);
        bth_len += n;
        if (bth_len == kBthBytes) break;
    }
    if (bth_len > kBthReservedByte) head[pseudo + kBthReservedByte] = 0xff;

    uint32_t crc = crc32(0, std::span(head).first(pseudo + bth_len));
    size_t skip = bth_len;
    for (const auto& piece : pieces) {
        const size_t n = std::min(piece.size(), skip);
        skip -= n;
        if (piece.size() > n) crc = crc32(crc, piece.subspan(n));
    }
    return crc;
}

uint32_t icrc(const IpFlow& flow, const Ipv4Unseen& unseen, std::span<const uint8_t> roce) {
    return icrc(flow, unseen, std::span<const std::span<const uint8_t>>(&roce, 1));
}

const char* to_string(IcrcCheck c) {
    switch (c) {
        case IcrcCheck::Exact:
            return "exact";
        case IcrcCheck::MatchesUnseenFields:
            return "matches for some IPv4 identification (DF set)";
        case IcrcCheck::Mismatch:
            return "mismatch";
    }
    return "invalid IcrcCheck";
}

IcrcCheck icrc_verify(const IpFlow& flow, std::span<const uint8_t> udp_payload,
                      uint16_t expected_identification, uint16_t* identification) {
    if (udp_payload.size() < kIcrcBytes) return IcrcCheck::Mismatch;
    const size_t roce_len = udp_payload.size() - kIcrcBytes;
    const uint8_t* c = udp_payload.data() + roce_len;
    const uint32_t received =
        uint32_t{c[0]} | uint32_t{c[1]} << 8 | uint32_t{c[2]} << 16 | uint32_t{c[3]} << 24;

    const uint32_t computed =
        icrc(flow, Ipv4Unseen{expected_identification, true}, udp_payload.first(roce_len));
    const uint32_t delta = received ^ computed;
    if (delta == 0) {
        if (identification) *identification = expected_identification;
        return IcrcCheck::Exact;
    }
    if (!flow.dst_ip.is_v4()) return IcrcCheck::Mismatch;  // IPv6: nothing unseen

    // s + 32 in bytes: what follows the window in the message, plus the CRC's own 32 bits.
    const uint64_t bytes_after_window = kPseudoBytes + uint64_t{roce_len} - kWindowEndOffset;
    const uint32_t window = multiply(delta, x_to_minus_bytes(bytes_after_window + 4));
    if ((window & ~kUnseenWindowMask) != 0) return IcrcCheck::Mismatch;
    // The window's bytes 0 and 1 are the identification's high and low byte on the wire; the
    // difference says which of their bits the sender had otherwise.
    if (identification)
        *identification = static_cast<uint16_t>(
            expected_identification ^ (((window >> 8) & 0xff) << 8 | ((window >> 16) & 0xff)));
    return IcrcCheck::MatchesUnseenFields;
}

}  // namespace uroce::wire
