// The ICRC: computation against the kernel captures and an independent bitwise CRC, and
// verification without the IPv4 identification and flags (DF required, identification
// solved for).
#include <netinet/in.h>

#include <catch2/catch.hpp>

#include <array>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "captures.h"
#include "crc32_reference.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

using namespace uroce::wire;
using uroce::IpAddress;
using wiretest::all_packets;
using wiretest::CapturedPacket;
using wiretest::crc32_bitwise;

namespace {

// 0.0.0.0 to 0.0.0.0, port 0: an IPv4 flow (the default IpFlow is IPv6's ::).
const IpFlow kZeroFlow{IpAddress::v4(0), IpAddress::v4(0), 0, 0};

uint32_t le32(const uint8_t* p) {
    return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void store_icrc(std::vector<uint8_t>& udp, uint32_t icrc) {
    for (size_t i = 0; i < 4; ++i) udp[udp.size() - 4 + i] = static_cast<uint8_t>(icrc >> (8 * i));
}

std::span<const uint8_t> roce_of(const std::vector<uint8_t>& udp) {
    return std::span(udp).first(udp.size() - 4);
}

// The ICRC spelled out from the README's description, with any IPv4 flags word.
uint32_t icrc_by_hand(const IpFlow& flow, uint16_t id, uint16_t flags_word,
                      std::span<const uint8_t> roce) {
    const size_t udp_len = 8 + roce.size() + 4;
    const auto b16 = [](uint32_t v) {
        return std::array<uint8_t, 2>{static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)};
    };
    std::vector<uint8_t> m(8, 0xff);
    const auto put16 = [&](uint32_t v) {
        const auto b = b16(v);
        m.insert(m.end(), b.begin(), b.end());
    };
    m.push_back(0x45);
    m.push_back(0xff);  // TOS
    put16(static_cast<uint32_t>(20 + udp_len));
    put16(id);
    put16(flags_word);
    m.push_back(0xff);  // TTL
    m.push_back(17);
    put16(0xffff);  // header checksum
    put16(flow.src_ip.v4() >> 16);
    put16(flow.src_ip.v4());
    put16(flow.dst_ip.v4() >> 16);
    put16(flow.dst_ip.v4());
    put16(flow.src_port);
    put16(flow.dst_port);
    put16(static_cast<uint32_t>(udp_len));
    put16(0xffff);  // UDP checksum
    const size_t bth_at = m.size();
    m.insert(m.end(), roce.begin(), roce.end());
    if (roce.size() > 4) m[bth_at + 4] = 0xff;
    return crc32_bitwise(m);
}

// An independent answer to "does some identification value, with DF set, explain this
// ICRC?": the 16 basis deltas are measured as differences of real ICRCs (no polynomial
// arithmetic), and the question is settled by Gaussian elimination over GF(2).
class ReferenceVerifier {
  public:
    ReferenceVerifier(const IpFlow& flow, std::span<const uint8_t> roce) : flow_(flow) {
        const uint32_t base = icrc(flow, Ipv4Unseen{}, roce);
        for (int bit = 0; bit < 16; ++bit) {
            add(icrc(flow, Ipv4Unseen{static_cast<uint16_t>(1u << bit), true}, roce) ^ base);
        }
    }

    int rank() const { return rank_; }

    IcrcCheck verify(const std::vector<uint8_t>& udp) const {
        const uint32_t computed = icrc(flow_, Ipv4Unseen{}, roce_of(udp));
        const uint32_t delta = computed ^ le32(udp.data() + udp.size() - 4);
        if (delta == 0) return IcrcCheck::Exact;
        return explains(delta) ? IcrcCheck::MatchesUnseenFields : IcrcCheck::Mismatch;
    }

    // Whether this change of the ICRC is one some identification change makes.
    bool explains(uint32_t delta) const { return reduce(delta) == 0; }

  private:
    uint32_t reduce(uint32_t v) const {
        for (int b = 31; b >= 0; --b) {
            if ((v >> b & 1) && pivot_[static_cast<size_t>(b)] != 0) {
                v ^= pivot_[static_cast<size_t>(b)];
            }
        }
        return v;
    }
    void add(uint32_t v) {
        v = reduce(v);
        if (v == 0) return;
        int top = 31;
        while (!(v >> top & 1)) --top;
        pivot_[static_cast<size_t>(top)] = v;
        ++rank_;
    }

    IpFlow flow_;
    std::array<uint32_t, 32> pivot_{};
    int rank_ = 0;
};

// One captured packet of each opcode, plus the longest one.
std::vector<const CapturedPacket*> samples() {
    std::map<int, const CapturedPacket*> by_opcode;
    const CapturedPacket* longest = nullptr;
    for (const CapturedPacket& cp : all_packets()) {
        by_opcode.emplace(cp.udp[0], &cp);
        if (longest == nullptr || cp.udp.size() > longest->udp.size()) longest = &cp;
    }
    std::vector<const CapturedPacket*> out;
    for (const auto& [op, cp] : by_opcode) out.push_back(cp);
    out.push_back(longest);
    return out;
}

// samples(), plus one captured packet of each UDP payload length not among them.
std::vector<const CapturedPacket*> samples_and_lengths() {
    std::vector<const CapturedPacket*> out = samples();
    std::set<size_t> lengths;
    for (const CapturedPacket* cp : out) lengths.insert(cp->udp.size());
    for (const CapturedPacket& cp : all_packets()) {
        if (lengths.insert(cp.udp.size()).second) out.push_back(&cp);
    }
    return out;
}

// The single-bit corruptions no verifier that accepts every identification can see: flipping
// bit `mask` of UDP payload byte `offset` changes the ICRC exactly as some identification
// change does. They follow from CRC-32 and the header layout alone, whatever the packet's
// contents and length; these are all of them in an IPv4 UDP payload (at most 65507 bytes),
// as the search below finds. With DF an unknown too, 173/0x08 and 1834/0x40 came first.
constexpr std::pair<size_t, uint8_t> kBlindBits[] = {
    {26744, 0x40}, {28451, 0x04}, {36245, 0x40}, {36245, 0x80}, {37980, 0x01}};
constexpr size_t kMaxIpv4UdpPayload = 65535 - 20 - 8;

// The brute-force answer over all 2^16 identification values with DF set (or, with
// `dont_fragment` false, with DF clear); returns the values that explain the carried ICRC.
std::vector<uint16_t> brute_force(const IpFlow& flow, const std::vector<uint8_t>& udp,
                                  bool dont_fragment = true) {
    std::vector<uint16_t> found;
    const uint32_t received = le32(udp.data() + udp.size() - 4);
    for (uint32_t id = 0; id < 65536; ++id) {
        const Ipv4Unseen u{static_cast<uint16_t>(id), dont_fragment};
        if (icrc(flow, u, roce_of(udp)) == received) found.push_back(u.identification);
    }
    return found;
}

// Flips every bit of `udp` except those of BTH byte 4 (which the ICRC masks) and returns the
// flips icrc_verify does not call a Mismatch.
std::set<std::pair<size_t, uint8_t>> accepted_flips(const IpFlow& flow, std::vector<uint8_t>& udp) {
    std::set<std::pair<size_t, uint8_t>> accepted;
    for (size_t byte = 0; byte < udp.size(); ++byte) {
        if (byte == 4) continue;
        for (int bit = 0; bit < 8; ++bit) {
            const auto mask = static_cast<uint8_t>(1u << bit);
            udp[byte] ^= mask;
            if (icrc_verify(flow, udp) != IcrcCheck::Mismatch) accepted.insert({byte, mask});
            udp[byte] ^= mask;
        }
    }
    return accepted;
}

}  // namespace

TEST_CASE("icrc with the captured identification and DF gives every captured ICRC",
          "[icrc][captures]") {
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame, cp.unseen.identification);
        const uint32_t carried = le32(cp.udp.data() + cp.udp.size() - 4);
        CHECK(icrc(cp.flow, cp.unseen, cp.roce()) == carried);
        // The kernel's packets: DF, nothing else in the flags, a non-zero identification.
        CHECK(cp.unseen.dont_fragment);
        CHECK(cp.other_flag_bits == 0);
        CHECK(cp.unseen.identification != 0);
    }
}

TEST_CASE("icrc agrees with a bitwise CRC-32 of the documented pseudo-header", "[icrc]") {
    std::mt19937 rng(99);
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        const uint16_t df_word = cp->unseen.dont_fragment ? 0x4000 : 0;
        CHECK(icrc(cp->flow, cp->unseen, cp->roce()) ==
              icrc_by_hand(cp->flow, cp->unseen.identification, df_word, cp->roce()));
        for (int i = 0; i < 8; ++i) {
            const IpFlow flow{IpAddress::v4(static_cast<uint32_t>(rng())),
                              IpAddress::v4(static_cast<uint32_t>(rng())),
                              static_cast<uint16_t>(rng()), static_cast<uint16_t>(rng())};
            const Ipv4Unseen u{static_cast<uint16_t>(rng()), (rng() & 1) != 0};
            CHECK(icrc(flow, u, cp->roce()) ==
                  icrc_by_hand(flow, u.identification, u.dont_fragment ? 0x4000 : 0, cp->roce()));
        }
    }
    // Degenerate lengths do not crash and still follow the definition.
    const std::vector<uint8_t> tiny = {1, 2, 3, 4, 5, 6};
    for (size_t n = 0; n <= tiny.size(); ++n) {
        const auto s = std::span(tiny).first(n);
        CHECK(icrc(kZeroFlow, Ipv4Unseen{}, s) == icrc_by_hand(kZeroFlow, 0, 0x4000, s));
    }
}

TEST_CASE("icrc does not depend on how the packet is split into pieces", "[icrc]") {
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        const auto roce = cp->roce();
        const uint32_t want = icrc(cp->flow, cp->unseen, roce);
        for (size_t cut = 0; cut <= roce.size(); ++cut) {
            const std::span<const uint8_t> two[] = {roce.first(cut), roce.subspan(cut)};
            REQUIRE(icrc(cp->flow, cp->unseen, two) == want);
        }
        // Three pieces cut inside the BTH (around its masked byte 4), with empty ones too.
        for (size_t a = 0; a <= 13; ++a) {
            for (size_t b = a; b <= 14; ++b) {
                CAPTURE(a, b);
                const std::span<const uint8_t> three[] = {
                    roce.first(a), {}, roce.subspan(a, b - a), {}, roce.subspan(b)};
                REQUIRE(icrc(cp->flow, cp->unseen, three) == want);
            }
        }
    }
    CHECK(icrc(kZeroFlow, Ipv4Unseen{}, std::span<const std::span<const uint8_t>>{}) ==
          icrc_by_hand(kZeroFlow, 0, 0x4000, {}));
}

TEST_CASE("the kernel's packets verify as MatchesUnseenFields", "[icrc][verify][captures]") {
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        CHECK(icrc_verify(cp.flow, cp.udp) == IcrcCheck::MatchesUnseenFields);
    }
    // Brute force agrees, and finds exactly the identification the kernel used.
    const CapturedPacket& cp = wiretest::find_packet("rc_read", 2);
    const std::vector<uint16_t> found = brute_force(cp.flow, cp.udp);
    REQUIRE(found.size() == 1);
    CHECK(found[0] == cp.unseen.identification);
}

TEST_CASE("packets sent with identification 0 and DF verify Exact", "[icrc][verify]") {
    std::mt19937 rng(7);
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        std::vector<uint8_t> udp = cp.udp;
        store_icrc(udp, icrc(cp.flow, Ipv4Unseen{}, roce_of(udp)));
        CHECK(icrc_verify(cp.flow, udp) == IcrcCheck::Exact);

        // Any other identification, with DF set, is still explained.
        const Ipv4Unseen other{static_cast<uint16_t>(rng() % 65535 + 1), true};
        store_icrc(udp, icrc(cp.flow, other, roce_of(udp)));
        CHECK(icrc_verify(cp.flow, udp) == IcrcCheck::MatchesUnseenFields);
    }
    // Each single identification bit, and all of them.
    const CapturedPacket& cp = wiretest::find_packet("rc_send_64", 1);
    std::vector<uint8_t> udp = cp.udp;
    for (uint32_t id = 1; id <= 0x10000; id <<= 1) {
        const Ipv4Unseen u{static_cast<uint16_t>(id == 0x10000 ? 0xffff : id), true};
        CAPTURE(u.identification);
        store_icrc(udp, icrc(cp.flow, u, roce_of(udp)));
        CHECK(icrc_verify(cp.flow, udp) == IcrcCheck::MatchesUnseenFields);
    }
}

TEST_CASE("verification names the identification that explains the ICRC", "[icrc][verify]") {
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        uint16_t id = 0;
        REQUIRE(icrc_verify(cp.flow, cp.udp, 0, &id) == IcrcCheck::MatchesUnseenFields);
        CHECK(id == cp.unseen.identification);  // the kernel's, read from the IPv4 header
        // Whatever the guess, the same answer.
        uint16_t again = 0;
        const auto guess = static_cast<uint16_t>(cp.unseen.identification ^ 0x5a5a);
        REQUIRE(icrc_verify(cp.flow, cp.udp, guess, &again) != IcrcCheck::Mismatch);
        CHECK(again == cp.unseen.identification);
        uint16_t exact = 0;
        CHECK(icrc_verify(cp.flow, cp.udp, cp.unseen.identification, &exact) == IcrcCheck::Exact);
        CHECK(exact == cp.unseen.identification);
    }
    const CapturedPacket& cp = wiretest::find_packet("rc_send_64", 1);
    std::vector<uint8_t> udp = cp.udp;
    for (uint32_t id : {1u, 0x80u, 0x100u, 0x8000u, 0x1234u, 0xffffu}) {
        CAPTURE(id);
        store_icrc(udp, icrc(cp.flow, Ipv4Unseen{static_cast<uint16_t>(id), true}, roce_of(udp)));
        uint16_t got = 0;
        REQUIRE(icrc_verify(cp.flow, udp, 7, &got) == IcrcCheck::MatchesUnseenFields);
        CHECK(got == id);
    }
    // A Mismatch leaves it alone.
    udp[20] ^= 1;
    uint16_t untouched = 0xabcd;
    CHECK(icrc_verify(cp.flow, udp, 0, &untouched) == IcrcCheck::Mismatch);
    CHECK(untouched == 0xabcd);
}

TEST_CASE("packets sent with DF clear are a Mismatch, whatever their identification",
          "[icrc][verify]") {
    std::mt19937 rng(17);
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        std::vector<uint8_t> udp = cp.udp;
        for (uint16_t id : {uint16_t{0}, cp.unseen.identification, uint16_t{0xffff},
                            static_cast<uint16_t>(rng())}) {
            CAPTURE(id);
            store_icrc(udp, icrc(cp.flow, Ipv4Unseen{id, false}, roce_of(udp)));
            CHECK(icrc_verify(cp.flow, udp) == IcrcCheck::Mismatch);
        }
    }
    // Every identification value with DF clear, on the shortest and the longest packet.
    const CapturedPacket* shortest = &all_packets().front();
    const CapturedPacket* longest = shortest;
    for (const CapturedPacket& cp : all_packets()) {
        if (cp.udp.size() < shortest->udp.size()) shortest = &cp;
        if (cp.udp.size() > longest->udp.size()) longest = &cp;
    }
    for (const CapturedPacket* cp : {shortest, longest}) {
        CAPTURE(cp->capture, cp->frame, cp->udp.size());
        std::vector<uint8_t> udp = cp->udp;
        size_t accepted = 0;
        for (uint32_t id = 0; id < 65536; ++id) {
            const Ipv4Unseen u{static_cast<uint16_t>(id), false};
            store_icrc(udp, icrc(cp->flow, u, roce_of(udp)));
            if (icrc_verify(cp->flow, udp) != IcrcCheck::Mismatch) ++accepted;
        }
        CHECK(accepted == 0);
    }
    // Though such a packet is a correct one, for an identification brute force finds.
    const CapturedPacket& cp = wiretest::find_packet("rc_read", 2);
    std::vector<uint8_t> udp = cp.udp;
    store_icrc(udp, icrc(cp.flow, Ipv4Unseen{cp.unseen.identification, false}, roce_of(udp)));
    CHECK(icrc_verify(cp.flow, udp) == IcrcCheck::Mismatch);
    CHECK(brute_force(cp.flow, udp, false) == std::vector<uint16_t>{cp.unseen.identification});
    CHECK(brute_force(cp.flow, udp).empty());
}

TEST_CASE("the reserved flag bits, MF and the fragment offset are taken to be zero",
          "[icrc][verify]") {
    const CapturedPacket& cp = wiretest::find_packet("rc_write", 1);
    std::vector<uint8_t> udp = cp.udp;
    for (uint16_t extra : {0x8000, 0x2000, 0x0001, 0x1000, 0x2001}) {
        CAPTURE(extra);
        store_icrc(udp, icrc_by_hand(cp.flow, 0x1234, static_cast<uint16_t>(0x4000 | extra),
                                     roce_of(udp)));
        CHECK(icrc_verify(cp.flow, udp) == IcrcCheck::Mismatch);
    }
}

TEST_CASE("single-bit corruption of a packet is a Mismatch", "[icrc][verify]") {
    size_t flips = 0;
    for (const CapturedPacket* cp : samples_and_lengths()) {
        CAPTURE(cp->capture, cp->frame, cp->udp.size());
        const ReferenceVerifier ref(cp->flow, cp->roce());
        REQUIRE(ref.rank() == 16);

        std::vector<uint8_t> udp = cp->udp;
        std::set<std::pair<size_t, uint8_t>> accepted;
        for (size_t byte = 0; byte < udp.size(); ++byte) {
            for (int bit = 0; bit < 8; ++bit) {
                const auto mask = static_cast<uint8_t>(1u << bit);
                udp[byte] ^= mask;
                const IcrcCheck got = icrc_verify(cp->flow, udp);
                udp[byte] ^= mask;
                ++flips;
                if (got != IcrcCheck::Mismatch) accepted.insert({byte, mask});
                if (byte != 4) {
                    // The BTH reserved byte aside, our answer is the reference's.
                    CAPTURE(byte, bit);
                    udp[byte] ^= mask;
                    REQUIRE(got == ref.verify(udp));
                    udp[byte] ^= mask;
                }
            }
        }
        // What goes through: only the BTH byte the ICRC masks (FECN, BECN: switches may set
        // them). Captured packets are far shorter than the first blind position.
        REQUIRE(udp.size() <= kBlindBits[0].first);
        std::set<std::pair<size_t, uint8_t>> want;
        for (int bit = 0; bit < 8; ++bit) want.insert({4, static_cast<uint8_t>(1u << bit)});
        CHECK(accepted == want);
    }
    CHECK(flips > 100000);
}

TEST_CASE("verification holds at every packet length", "[icrc][verify]") {
    // Lengths around the verifier's table boundaries (256-byte steps) up to the largest UDP
    // payload, with random contents and random unseen fields.
    std::mt19937 rng(2024);
    const IpFlow flow{IpAddress::v4(0xc0a84d02), IpAddress::v4(0xc0a84d03), 0xc001, kRoceV2Port};
    std::vector<size_t> lengths;
    for (size_t n = 0; n < 600; ++n) lengths.push_back(n);
    for (size_t n : {767u, 768u, 769u, 1500u, 4096u, 9000u, 65279u, 65280u, 65535u - 8u}) {
        lengths.push_back(n);
    }
    for (size_t udp_len : lengths) {
        if (udp_len < 4) continue;
        CAPTURE(udp_len);
        std::vector<uint8_t> udp(udp_len);
        for (auto& b : udp) b = static_cast<uint8_t>(rng());
        const ReferenceVerifier ref(flow, roce_of(udp));
        REQUIRE(ref.rank() == 16);

        store_icrc(udp, icrc(flow, Ipv4Unseen{}, roce_of(udp)));
        CHECK(icrc_verify(flow, udp) == IcrcCheck::Exact);
        store_icrc(udp, icrc(flow, Ipv4Unseen{static_cast<uint16_t>(rng()), false}, roce_of(udp)));
        CHECK(icrc_verify(flow, udp) == IcrcCheck::Mismatch);
        CHECK(ref.verify(udp) == IcrcCheck::Mismatch);
        const Ipv4Unseen u{static_cast<uint16_t>(rng() | 1), true};
        store_icrc(udp, icrc(flow, u, roce_of(udp)));
        CHECK(icrc_verify(flow, udp) == IcrcCheck::MatchesUnseenFields);
        for (int i = 0; i < 8; ++i) {
            const size_t byte = rng() % udp.size();
            const auto mask = static_cast<uint8_t>(1u << (rng() % 8));
            udp[byte] ^= mask;
            CHECK(icrc_verify(flow, udp) == ref.verify(udp));
            udp[byte] ^= mask;
        }
        // A random ICRC is almost never explained (2^16 of 2^32 values are).
        store_icrc(udp, static_cast<uint32_t>(rng()));
        CHECK(icrc_verify(flow, udp) == ref.verify(udp));
    }
}

TEST_CASE("no single-bit corruption passes in a UDP payload of up to 26744 bytes",
          "[icrc][verify]") {
    // Every bit of a packet just short of the first blind position, flipped one at a time and
    // checked by icrc_verify itself: all Mismatch but the masked BTH byte 4. This covers
    // every RoCE packet (the largest MTU is 4096) many times over.
    std::mt19937 rng(26744);
    const IpFlow flow{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 0xc000, kRoceV2Port};
    std::vector<uint8_t> udp(kBlindBits[0].first);
    for (auto& b : udp) b = static_cast<uint8_t>(rng());
    const Ipv4Unseen sent{0x4242, true};
    store_icrc(udp, icrc(flow, sent, roce_of(udp)));
    REQUIRE(icrc_verify(flow, udp) == IcrcCheck::MatchesUnseenFields);
    CHECK(accepted_flips(flow, udp).empty());
    for (int bit = 0; bit < 8; ++bit) {
        udp[4] ^= static_cast<uint8_t>(1u << bit);
        CHECK(icrc_verify(flow, udp) == IcrcCheck::MatchesUnseenFields);
        udp[4] ^= static_cast<uint8_t>(1u << bit);
    }

    // One byte longer (with the ICRC behind it), and byte 26744, bit 0x40 goes through: brute
    // force finds the one identification that explains it.
    udp.resize(kBlindBits[0].first + 1 + 4);
    store_icrc(udp, icrc(flow, sent, roce_of(udp)));
    const auto [offset, mask] = kBlindBits[0];
    udp[offset] ^= mask;
    CHECK(icrc_verify(flow, udp) == IcrcCheck::MatchesUnseenFields);
    const std::vector<uint16_t> found = brute_force(flow, udp);
    REQUIRE(found.size() == 1);
    CHECK(found[0] != sent.identification);
    udp[offset] ^= mask;
    for (const size_t neighbour : {offset - 1, offset + 1}) {
        udp[neighbour] ^= mask;
        CHECK(icrc_verify(flow, udp) == IcrcCheck::Mismatch);
        udp[neighbour] ^= mask;
    }
}

TEST_CASE("the single-bit blind positions of an IPv4 UDP payload are the listed ones",
          "[icrc][verify]") {
    // Flipping a bit changes the ICRC by an amount that depends only on how many bits follow
    // it. Walking back from the end: the carried ICRC's own bits are bits 31 (byte 3, bit 7)
    // down to 0 (byte 0, bit 0) of the value, and each earlier bit multiplies the change by x
    // (in the reflected CRC-32 register: shift right, reduce by the polynomial). A change is
    // accepted iff it is in the span of the 16 identification deltas, measured as real ICRC
    // differences by the reference verifier.
    const IpFlow flow{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 0xc000, kRoceV2Port};
    std::vector<uint8_t> udp(kMaxIpv4UdpPayload, 0xa5);
    store_icrc(udp, icrc(flow, Ipv4Unseen{0x4242, true}, roce_of(udp)));
    const ReferenceVerifier ref(flow, roce_of(udp));
    REQUIRE(ref.rank() == 16);

    std::vector<uint32_t> change(udp.size() * 8);  // change[8 * byte + bit]
    uint32_t c = 0x80000000u;
    for (size_t byte = udp.size(); byte-- > 0;) {
        for (int bit = 7; bit >= 0; --bit) {
            change[8 * byte + static_cast<size_t>(bit)] = c;
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
        }
    }
    // The model against real ICRCs, at the start, the end and at random in between.
    std::mt19937 rng(5);
    std::vector<size_t> probes;
    for (size_t byte = 0; byte < 64; ++byte) probes.push_back(byte);
    for (size_t byte = udp.size() - 64; byte < udp.size(); ++byte) probes.push_back(byte);
    for (int i = 0; i < 64; ++i) probes.push_back(rng() % udp.size());
    for (size_t byte : probes) {
        if (byte == 4) continue;
        for (int bit = 0; bit < 8; ++bit) {
            CAPTURE(byte, bit);
            const uint32_t before =
                icrc(flow, Ipv4Unseen{}, roce_of(udp)) ^ le32(udp.data() + udp.size() - 4);
            udp[byte] ^= static_cast<uint8_t>(1u << bit);
            const uint32_t after =
                icrc(flow, Ipv4Unseen{}, roce_of(udp)) ^ le32(udp.data() + udp.size() - 4);
            udp[byte] ^= static_cast<uint8_t>(1u << bit);
            REQUIRE((before ^ after) == change[8 * byte + static_cast<size_t>(bit)]);
        }
    }

    std::set<std::pair<size_t, uint8_t>> blind;
    for (size_t byte = 0; byte < udp.size(); ++byte) {
        if (byte == 4) continue;
        for (int bit = 0; bit < 8; ++bit) {
            if (ref.explains(change[8 * byte + static_cast<size_t>(bit)])) {
                blind.insert({byte, static_cast<uint8_t>(1u << bit)});
            }
        }
    }
    CHECK(blind ==
          std::set<std::pair<size_t, uint8_t>>(std::begin(kBlindBits), std::end(kBlindBits)));

    // And icrc_verify lets each of them through, but not its neighbours.
    for (const auto& [offset, mask] : kBlindBits) {
        CAPTURE(offset, mask);
        udp[offset] ^= mask;
        CHECK(icrc_verify(flow, udp) == IcrcCheck::MatchesUnseenFields);
        udp[offset] ^= mask;
        for (const size_t neighbour : {offset - 1, offset + 1}) {
            udp[neighbour] ^= mask;
            CHECK(icrc_verify(flow, udp) == IcrcCheck::Mismatch);
            udp[neighbour] ^= mask;
        }
    }
}

TEST_CASE("a wrong address or port is a Mismatch", "[icrc][verify]") {
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        for (int bit = 0; bit < 32; ++bit) {
            CAPTURE(bit);
            IpFlow f = cp->flow;
            f.src_ip = IpAddress::v4(f.src_ip.v4() ^ 1u << bit);
            CHECK(icrc_verify(f, cp->udp) == IcrcCheck::Mismatch);
            f = cp->flow;
            f.dst_ip = IpAddress::v4(f.dst_ip.v4() ^ 1u << bit);
            CHECK(icrc_verify(f, cp->udp) == IcrcCheck::Mismatch);
            if (bit < 16) {
                f = cp->flow;
                f.src_port = static_cast<uint16_t>(f.src_port ^ (1u << bit));
                CHECK(icrc_verify(f, cp->udp) == IcrcCheck::Mismatch);
                f = cp->flow;
                f.dst_port = static_cast<uint16_t>(f.dst_port ^ (1u << bit));
                CHECK(icrc_verify(f, cp->udp) == IcrcCheck::Mismatch);
            }
        }
        IpFlow swapped = cp->flow;
        std::swap(swapped.src_ip, swapped.dst_ip);
        CHECK(icrc_verify(swapped, cp->udp) == IcrcCheck::Mismatch);
        swapped = cp->flow;
        std::swap(swapped.src_port, swapped.dst_port);
        CHECK(icrc_verify(swapped, cp->udp) == IcrcCheck::Mismatch);
    }
}

TEST_CASE("a truncated or extended packet is a Mismatch", "[icrc][verify]") {
    const CapturedPacket& cp = wiretest::find_packet("rc_send_64", 1);
    for (size_t len = 0; len < cp.udp.size(); ++len) {
        CAPTURE(len);
        const std::vector<uint8_t> buf(cp.udp.begin(), cp.udp.begin() + static_cast<long>(len));
        CHECK(icrc_verify(cp.flow, buf) == IcrcCheck::Mismatch);
    }
    std::vector<uint8_t> longer = cp.udp;
    longer.insert(longer.end() - 4, 4, 0);
    CHECK(icrc_verify(cp.flow, longer) == IcrcCheck::Mismatch);
}

TEST_CASE("IcrcCheck values have distinct names", "[icrc]") {
    std::set<std::string> names;
    for (IcrcCheck c : {IcrcCheck::Exact, IcrcCheck::MatchesUnseenFields, IcrcCheck::Mismatch}) {
        REQUIRE(to_string(c) != nullptr);
        names.insert(to_string(c));
    }
    CHECK(names.size() == 3);
}

// --- IPv6 ---------------------------------------------------------------------------------

namespace {

IpAddress v6(std::string_view text) {
    const auto a = IpAddress::parse(text);
    REQUIRE(a);
    REQUIRE_FALSE(a->is_v4());
    return *a;
}

// The ICRC over IPv6 by its definition, byte by byte: 8 bytes of ones; the IPv6 header with
// traffic class, flow label and hop limit all ones; the UDP header with its checksum all
// ones; the RoCE bytes with BTH byte 4 all ones.
uint32_t icrc_v6_by_hand(const IpFlow& flow, std::span<const uint8_t> roce) {
    const size_t udp_len = 8 + roce.size() + 4;
    std::vector<uint8_t> m(8, 0xff);
    m.insert(m.end(), {0x6f, 0xff, 0xff, 0xff});
    m.push_back(static_cast<uint8_t>(udp_len >> 8));
    m.push_back(static_cast<uint8_t>(udp_len));
    m.push_back(17);
    m.push_back(0xff);
    m.insert(m.end(), flow.src_ip.bytes().begin(), flow.src_ip.bytes().end());
    m.insert(m.end(), flow.dst_ip.bytes().begin(), flow.dst_ip.bytes().end());
    for (uint16_t v : {flow.src_port, flow.dst_port, static_cast<uint16_t>(udp_len)}) {
        m.push_back(static_cast<uint8_t>(v >> 8));
        m.push_back(static_cast<uint8_t>(v));
    }
    m.insert(m.end(), {0xff, 0xff});
    const size_t bth_at = m.size();
    m.insert(m.end(), roce.begin(), roce.end());
    if (roce.size() > 4) m[bth_at + 4] = 0xff;
    return crc32_bitwise(m);
}

}  // namespace

TEST_CASE("IPv6: icrc follows the masked IPv6 pseudo-header", "[icrc][ipv6]") {
    const IpFlow flow{v6("fd00:75::1"), v6("fd00:75::2"), 0xc123, kRoceV2Port};
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        // The identification means nothing over IPv6: any value gives the same ICRC.
        const uint32_t want = icrc_v6_by_hand(flow, cp->roce());
        CHECK(icrc(flow, Ipv4Unseen{}, cp->roce()) == want);
        CHECK(icrc(flow, Ipv4Unseen{0x1234, false}, cp->roce()) == want);
        // And it is not the IPv4 one for the same bytes.
        CHECK(icrc(kZeroFlow, Ipv4Unseen{}, cp->roce()) != want);
    }
}

TEST_CASE("IPv6: verification is exact, and any change is a Mismatch", "[icrc][ipv6][verify]") {
    const IpFlow flow{v6("2001:db8::10"), v6("2001:db8::20"), 0xc001, kRoceV2Port};
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        std::vector<uint8_t> udp(cp->udp);
        store_icrc(udp, icrc(flow, Ipv4Unseen{}, roce_of(udp)));
        uint16_t id = 7;
        CHECK(icrc_verify(flow, udp, 0, &id) == IcrcCheck::Exact);
        // No unseen field to solve for: a packet whose ICRC was made for another
        // identification over IPv4 is simply wrong here.
        CHECK(icrc_verify(flow, udp, 5) == IcrcCheck::Exact);
        for (size_t byte = 0; byte < udp.size(); ++byte) {
            if (byte == 4) continue;  // the masked BTH byte
            std::vector<uint8_t> bad(udp);
            bad[byte] ^= 0x10;
            CAPTURE(byte);
            REQUIRE(icrc_verify(flow, bad) == IcrcCheck::Mismatch);
        }
        for (int bit = 0; bit < 128; ++bit) {
            IpAddress::Bytes b = flow.src_ip.bytes();
            b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
            IpFlow f = flow;
            f.src_ip = IpAddress::from_bytes(b.data());
            CAPTURE(bit);
            CHECK(icrc_verify(f, udp) == IcrcCheck::Mismatch);
        }
    }
}

TEST_CASE("IPv6: no identification is solved for: what one would explain is a Mismatch",
          "[icrc][ipv6][verify]") {
    // Over IPv4 a receiver accepts an ICRC that some other identification explains. The same
    // change of the ICRC on an IPv6 packet is corruption: IPv6 has no unseen field.
    const IpFlow v6flow{v6("fd00::1"), v6("fd00::2"), 0xc001, kRoceV2Port};
    const IpFlow v4flow{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 0xc001, kRoceV2Port};
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        // What identification 0x1234 instead of 0 changes in an ICRC of this length.
        const uint32_t id_delta = icrc(v4flow, Ipv4Unseen{0x1234, true}, cp->roce()) ^
                                  icrc(v4flow, Ipv4Unseen{0, true}, cp->roce());
        std::vector<uint8_t> udp(cp->udp);
        store_icrc(udp, icrc(v4flow, Ipv4Unseen{}, roce_of(udp)) ^ id_delta);
        REQUIRE(icrc_verify(v4flow, udp) == IcrcCheck::MatchesUnseenFields);
        store_icrc(udp, icrc(v6flow, Ipv4Unseen{}, roce_of(udp)) ^ id_delta);
        CHECK(icrc_verify(v6flow, udp) == IcrcCheck::Mismatch);
    }
}

TEST_CASE("IpAddress: IPv4-mapped form, parsing and the GID bytes", "[ipv6]") {
    const IpAddress a = IpAddress::v4(0x7f000001);
    CHECK(a.is_v4());
    CHECK(a.v4() == 0x7f000001);
    CHECK(a.family() == AF_INET);
    CHECK(a.to_string() == "127.0.0.1");
    CHECK(a.bytes()[10] == 0xff);
    CHECK(a.bytes()[11] == 0xff);
    CHECK(IpAddress::parse("127.0.0.1") == a);
    CHECK(IpAddress::parse("::ffff:127.0.0.1") == a);  // the GID's own spelling
    const IpAddress b = v6("fd00::1:2");
    CHECK(b.family() == AF_INET6);
    CHECK(b.v4() == 0);
    CHECK(b.to_string() == "fd00::1:2");
    CHECK(b.bytes()[0] == 0xfd);
    CHECK(b.bytes()[15] == 2);
    CHECK(IpAddress::from_bytes(b.bytes().data()) == b);
    CHECK(v6("::1").is_loopback());
    CHECK(IpAddress::v4(0x7f000203).is_loopback());
    CHECK(IpAddress{}.is_unspecified());
    CHECK(IpAddress::v4(0).is_unspecified());
    CHECK(v6("ff02::1").is_multicast());
    CHECK(IpAddress::v4(0xe0000001).is_multicast());
    CHECK_FALSE(b.is_multicast());
    CHECK_FALSE(IpAddress::parse("1.2.3"));
    CHECK_FALSE(IpAddress::parse("fd00::1::2"));
    CHECK_FALSE(IpAddress::parse(""));
    CHECK_FALSE(IpAddress::parse(std::string(100, '1')));
    sockaddr_storage ss;
    CHECK(b.to_sockaddr(4791, ss) == sizeof(sockaddr_in6));
    CHECK(IpAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), sizeof(sockaddr_in6)) == b);
    CHECK(a.to_sockaddr(4791, ss) == sizeof(sockaddr_in));
    CHECK(IpAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), sizeof(sockaddr_in)) == a);
    CHECK_FALSE(IpAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), 4));
}

TEST_CASE("IpAddress: equal only when all 16 bytes are", "[ipv6]") {
    // Every received packet's source is compared with its QP's peer: a difference in any
    // byte, in either half, makes another address.
    const IpAddress base = v6("fd00:1122:3344:5566:7788:99aa:bbcc:ddee");
    CHECK(base == IpAddress::from_bytes(base.bytes().data()));
    CHECK_FALSE(base != IpAddress::from_bytes(base.bytes().data()));
    for (size_t i = 0; i < 16; ++i) {
        for (uint8_t bit : {uint8_t{0x01}, uint8_t{0x80}}) {
            auto bytes = base.bytes();
            bytes[i] ^= bit;
            const IpAddress other = IpAddress::from_bytes(bytes.data());
            CAPTURE(i, static_cast<int>(bit));
            CHECK_FALSE(base == other);
            CHECK(base != other);
            CHECK((base < other) != (other < base));  // the order agrees
        }
    }
    CHECK(IpAddress::v4(0x7f000001) == IpAddress::v4(0x7f000001));
    CHECK(IpAddress::v4(0x7f000001) != IpAddress::v4(0x7f000002));
    CHECK(IpAddress::v4(0x7f000001) != v6("::7f00:1"));  // not IPv4-mapped
    static_assert(IpAddress::v4(1) == IpAddress::v4(1));
    static_assert(IpAddress::v4(1) != IpAddress::v4(2));
}

TEST_CASE("IpAddress: IPv4 only with the whole ::ffff:0:0/96 prefix", "[ipv6]") {
    // The same answer at run time (word compares) as at compile time (the bytes one by one).
    static_assert(IpAddress::v4(0x7f000001).is_v4());
    static_assert(!IpAddress{}.is_v4());
    const IpAddress a = IpAddress::v4(0x0a000001);
    REQUIRE(a.is_v4());
    for (size_t i = 0; i < 12; ++i) {
        for (uint8_t bit : {uint8_t{0x01}, uint8_t{0x80}}) {
            auto bytes = a.bytes();
            bytes[i] ^= bit;
            CAPTURE(i, static_cast<int>(bit));
            const IpAddress other = IpAddress::from_bytes(bytes.data());
            CHECK_FALSE(other.is_v4());
            CHECK(other.family() == AF_INET6);
            CHECK(other.v4() == 0);
        }
    }
    // The address bytes themselves do not matter.
    for (uint32_t host : {0u, 1u, 0xffffffffu, 0x80000000u}) CHECK(IpAddress::v4(host).is_v4());
    CHECK_FALSE(v6("::1").is_v4());
    CHECK_FALSE(v6("::fffe:0:1").is_v4());
    const auto mapped = IpAddress::parse("::ffff:0:1");  // ::ffff:0.0.0.1
    REQUIRE(mapped);
    CHECK(mapped->is_v4());
    CHECK(mapped->v4() == 1);
}

TEST_CASE("IPv6: the kernel's packets verify Exact and follow the pseudo-header by hand",
          "[icrc][ipv6][captures]") {
    const auto& packets = wiretest::ipv6_packets();
    REQUIRE(packets.size() == 56);  // rc_send_ipv6: SENDs of 64 and 10000 bytes, their ACKs
    for (const CapturedPacket& cp : packets) {
        CAPTURE(cp.capture, cp.frame);
        REQUIRE_FALSE(cp.flow.dst_ip.is_v4());
        CHECK(icrc_verify(cp.flow, cp.udp) == IcrcCheck::Exact);
        CHECK(icrc(cp.flow, Ipv4Unseen{}, cp.roce()) == le32(cp.udp.data() + cp.udp.size() - 4));
        CHECK(icrc_v6_by_hand(cp.flow, cp.roce()) == le32(cp.udp.data() + cp.udp.size() - 4));
        ParsedPacket p;
        CHECK(parse_packet(cp.udp, p) == ParseError::None);
    }
}

TEST_CASE("icrc follows the definition at every length around its one-call limit", "[icrc][ipv6]") {
    // Up to 256 bytes a packet is copied behind the pseudo-header and takes one CRC call;
    // longer ones are CRC'd piece by piece. Both ways, whole and cut, IPv4 and IPv6.
    std::mt19937 rng(256);
    const IpFlow flow4{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 0xc0de, 4791};
    const IpFlow flow6{v6("fd00::1"), v6("fd00::2"), 0xc0df, 4791};
    for (size_t n = 0; n <= 300; ++n) {
        CAPTURE(n);
        std::vector<uint8_t> roce(n);
        for (auto& b : roce) b = static_cast<uint8_t>(rng());
        const auto whole = std::span<const uint8_t>(roce);
        const Ipv4Unseen u{static_cast<uint16_t>(rng()), true};
        const uint32_t want4 = icrc_by_hand(flow4, u.identification, 0x4000, whole);
        const uint32_t want6 = icrc_v6_by_hand(flow6, whole);
        CHECK(icrc(flow4, u, whole) == want4);
        CHECK(icrc(flow6, u, whole) == want6);
        const size_t cut = n / 3;
        const std::span<const uint8_t> pieces[] = {whole.first(cut), {}, whole.subspan(cut)};
        CHECK(icrc(flow4, u, pieces) == want4);
        CHECK(icrc(flow6, u, pieces) == want6);
    }
}
