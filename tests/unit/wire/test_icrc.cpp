// The ICRC: computation against the kernel captures and an independent bitwise CRC, and
// verification without the IPv4 identification and flags.
#include <catch2/catch.hpp>

#include <array>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "captures.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

using namespace uroce::wire;
using wiretest::all_packets;
using wiretest::CapturedPacket;

namespace {

uint32_t le32(const uint8_t* p) {
    return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void store_icrc(std::vector<uint8_t>& udp, uint32_t icrc) {
    for (size_t i = 0; i < 4; ++i) udp[udp.size() - 4 + i] = static_cast<uint8_t>(icrc >> (8 * i));
}

std::span<const uint8_t> roce_of(const std::vector<uint8_t>& udp) {
    return std::span(udp).first(udp.size() - 4);
}

// CRC-32 as zlib's crc32() computes it, one bit at a time.
uint32_t crc32_bitwise(const std::vector<uint8_t>& data) {
    uint32_t c = 0xffffffff;
    for (uint8_t b : data) {
        c ^= b;
        for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ 0xedb88320 : c >> 1;
    }
    return ~c;
}

// The ICRC spelled out from the README's description, with any IPv4 flags word.
uint32_t icrc_by_hand(const Ipv4Flow& flow, uint16_t id, uint16_t flags_word,
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
    put16(flow.src_ip >> 16);
    put16(flow.src_ip);
    put16(flow.dst_ip >> 16);
    put16(flow.dst_ip);
    put16(flow.src_port);
    put16(flow.dst_port);
    put16(static_cast<uint32_t>(udp_len));
    put16(0xffff);  // UDP checksum
    const size_t bth_at = m.size();
    m.insert(m.end(), roce.begin(), roce.end());
    if (roce.size() > 4) m[bth_at + 4] = 0xff;
    return crc32_bitwise(m);
}

// An independent answer to "does some identification/DF value explain this ICRC?": the basis
// deltas are measured as differences of real ICRCs (no polynomial arithmetic), and the
// question is settled by Gaussian elimination over GF(2).
class ReferenceVerifier {
  public:
    ReferenceVerifier(const Ipv4Flow& flow, std::span<const uint8_t> roce) : flow_(flow) {
        const uint32_t base = icrc_ipv4(flow, Ipv4Unseen{}, roce);
        for (int bit = 0; bit < 16; ++bit) {
            add(icrc_ipv4(flow, Ipv4Unseen{static_cast<uint16_t>(1u << bit), true}, roce) ^ base);
        }
        add(icrc_ipv4(flow, Ipv4Unseen{0, false}, roce) ^ base);
    }

    int rank() const { return rank_; }

    IcrcCheck verify(const std::vector<uint8_t>& udp) const {
        const uint32_t computed = icrc_ipv4(flow_, Ipv4Unseen{}, roce_of(udp));
        const uint32_t delta = computed ^ le32(udp.data() + udp.size() - 4);
        if (delta == 0) return IcrcCheck::Exact;
        return reduce(delta) == 0 ? IcrcCheck::MatchesUnseenFields : IcrcCheck::Mismatch;
    }

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

    Ipv4Flow flow_;
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

// Single-bit corruptions that no ICRC check accepting every identification and DF value can
// see: flipping bit `mask` of UDP payload byte `offset` changes the ICRC exactly as some
// identification/DF change does. They follow from CRC-32 and the position of those fields
// alone (found by searching x^-k mod P for k up to 8 * 64 KiB); the nearest is 173 bytes
// into the UDP payload, so MTU-sized packets carry one, 4096-MTU packets two.
constexpr std::pair<size_t, uint8_t> kBlindBits[] = {{173, 0x08}, {1834, 0x40}};

// What brute force over all 2^17 unseen values says; returns the values that explain it.
std::vector<Ipv4Unseen> brute_force(const Ipv4Flow& flow, const std::vector<uint8_t>& udp) {
    std::vector<Ipv4Unseen> found;
    const uint32_t received = le32(udp.data() + udp.size() - 4);
    for (uint32_t id = 0; id < 65536; ++id) {
        for (bool df : {false, true}) {
            const Ipv4Unseen u{static_cast<uint16_t>(id), df};
            if (icrc_ipv4(flow, u, roce_of(udp)) == received) found.push_back(u);
        }
    }
    return found;
}

}  // namespace

TEST_CASE("icrc_ipv4 with the captured identification and DF gives every captured ICRC",
          "[icrc][captures]") {
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame, cp.unseen.identification);
        const uint32_t carried = le32(cp.udp.data() + cp.udp.size() - 4);
        CHECK(icrc_ipv4(cp.flow, cp.unseen, cp.roce()) == carried);
        // The kernel's packets: DF, nothing else in the flags, a non-zero identification.
        CHECK(cp.unseen.dont_fragment);
        CHECK(cp.other_flag_bits == 0);
        CHECK(cp.unseen.identification != 0);
    }
}

TEST_CASE("icrc_ipv4 agrees with a bitwise CRC-32 of the documented pseudo-header", "[icrc]") {
    std::mt19937 rng(99);
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        const uint16_t df_word = cp->unseen.dont_fragment ? 0x4000 : 0;
        CHECK(icrc_ipv4(cp->flow, cp->unseen, cp->roce()) ==
              icrc_by_hand(cp->flow, cp->unseen.identification, df_word, cp->roce()));
        for (int i = 0; i < 8; ++i) {
            const Ipv4Flow flow{static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()),
                                static_cast<uint16_t>(rng()), static_cast<uint16_t>(rng())};
            const Ipv4Unseen u{static_cast<uint16_t>(rng()), (rng() & 1) != 0};
            CHECK(icrc_ipv4(flow, u, cp->roce()) ==
                  icrc_by_hand(flow, u.identification, u.dont_fragment ? 0x4000 : 0, cp->roce()));
        }
    }
    // Degenerate lengths do not crash and still follow the definition.
    const std::vector<uint8_t> tiny = {1, 2, 3, 4, 5, 6};
    for (size_t n = 0; n <= tiny.size(); ++n) {
        const auto s = std::span(tiny).first(n);
        CHECK(icrc_ipv4(Ipv4Flow{}, Ipv4Unseen{}, s) == icrc_by_hand(Ipv4Flow{}, 0, 0x4000, s));
    }
}

TEST_CASE("icrc_ipv4 does not depend on how the packet is split into pieces", "[icrc]") {
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        const auto roce = cp->roce();
        const uint32_t want = icrc_ipv4(cp->flow, cp->unseen, roce);
        for (size_t cut = 0; cut <= roce.size(); ++cut) {
            const std::span<const uint8_t> two[] = {roce.first(cut), roce.subspan(cut)};
            REQUIRE(icrc_ipv4(cp->flow, cp->unseen, two) == want);
        }
        // Three pieces cut inside the BTH (around its masked byte 4), with empty ones too.
        for (size_t a = 0; a <= 13; ++a) {
            for (size_t b = a; b <= 14; ++b) {
                CAPTURE(a, b);
                const std::span<const uint8_t> three[] = {
                    roce.first(a), {}, roce.subspan(a, b - a), {}, roce.subspan(b)};
                REQUIRE(icrc_ipv4(cp->flow, cp->unseen, three) == want);
            }
        }
    }
    CHECK(icrc_ipv4(Ipv4Flow{}, Ipv4Unseen{}, std::span<const std::span<const uint8_t>>{}) ==
          icrc_by_hand(Ipv4Flow{}, 0, 0x4000, {}));
}

TEST_CASE("the kernel's packets verify as MatchesUnseenFields", "[icrc][verify][captures]") {
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        CHECK(icrc_verify_ipv4(cp.flow, cp.udp) == IcrcCheck::MatchesUnseenFields);
    }
    // Brute force agrees, and finds exactly the identification the kernel used.
    const CapturedPacket& cp = wiretest::find_packet("rc_read", 2);
    const std::vector<Ipv4Unseen> found = brute_force(cp.flow, cp.udp);
    REQUIRE(found.size() == 1);
    CHECK(found[0].identification == cp.unseen.identification);
    CHECK(found[0].dont_fragment);
}

TEST_CASE("packets sent with identification 0 and DF verify Exact", "[icrc][verify]") {
    std::mt19937 rng(7);
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        std::vector<uint8_t> udp = cp.udp;
        store_icrc(udp, icrc_ipv4(cp.flow, Ipv4Unseen{}, roce_of(udp)));
        CHECK(icrc_verify_ipv4(cp.flow, udp) == IcrcCheck::Exact);

        // Any other identification, with or without DF, is still explained.
        Ipv4Unseen other{static_cast<uint16_t>(rng()), (rng() & 1) != 0};
        if (other.identification == 0 && other.dont_fragment) other.identification = 1;
        store_icrc(udp, icrc_ipv4(cp.flow, other, roce_of(udp)));
        CHECK(icrc_verify_ipv4(cp.flow, udp) == IcrcCheck::MatchesUnseenFields);
    }
    // Each single identification bit and DF alone.
    const CapturedPacket& cp = wiretest::find_packet("rc_send_64", 1);
    std::vector<uint8_t> udp = cp.udp;
    for (int bit = 0; bit < 16; ++bit) {
        store_icrc(udp, icrc_ipv4(cp.flow, Ipv4Unseen{static_cast<uint16_t>(1u << bit), true},
                                  roce_of(udp)));
        CHECK(icrc_verify_ipv4(cp.flow, udp) == IcrcCheck::MatchesUnseenFields);
    }
    store_icrc(udp, icrc_ipv4(cp.flow, Ipv4Unseen{0xffff, false}, roce_of(udp)));
    CHECK(icrc_verify_ipv4(cp.flow, udp) == IcrcCheck::MatchesUnseenFields);
}

TEST_CASE("the reserved flag bits, MF and the fragment offset are taken to be zero",
          "[icrc][verify]") {
    const CapturedPacket& cp = wiretest::find_packet("rc_write", 1);
    std::vector<uint8_t> udp = cp.udp;
    for (uint16_t extra : {0x8000, 0x2000, 0x0001, 0x1000, 0x2001}) {
        CAPTURE(extra);
        store_icrc(udp, icrc_by_hand(cp.flow, 0x1234, static_cast<uint16_t>(0x4000 | extra),
                                     roce_of(udp)));
        CHECK(icrc_verify_ipv4(cp.flow, udp) == IcrcCheck::Mismatch);
    }
}

TEST_CASE("single-bit corruption of a packet is a Mismatch", "[icrc][verify]") {
    size_t flips = 0;
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame, cp->udp.size());
        const ReferenceVerifier ref(cp->flow, cp->roce());
        REQUIRE(ref.rank() == 17);

        std::vector<uint8_t> udp = cp->udp;
        std::set<std::pair<size_t, uint8_t>> accepted;
        for (size_t byte = 0; byte < udp.size(); ++byte) {
            for (int bit = 0; bit < 8; ++bit) {
                const auto mask = static_cast<uint8_t>(1u << bit);
                udp[byte] ^= mask;
                const IcrcCheck got = icrc_verify_ipv4(cp->flow, udp);
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
        // What goes through: the BTH byte the ICRC masks (FECN, BECN: switches may set them),
        // and the blind positions inherent in accepting any identification/DF.
        std::set<std::pair<size_t, uint8_t>> want;
        for (int bit = 0; bit < 8; ++bit) want.insert({4, static_cast<uint8_t>(1u << bit)});
        for (const auto& blind : kBlindBits) {
            if (blind.first < udp.size() - 4) want.insert(blind);
        }
        CHECK(accepted == want);
    }
    CHECK(flips > 100000);
}

TEST_CASE("verification holds at every packet length", "[icrc][verify]") {
    // Lengths around the verifier's table boundaries (256-byte steps) up to the largest UDP
    // payload, with random contents and random unseen fields.
    std::mt19937 rng(2024);
    const Ipv4Flow flow{0xc0a84d02, 0xc0a84d03, 0xc001, kRoceV2Port};
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
        REQUIRE(ref.rank() == 17);

        store_icrc(udp, icrc_ipv4(flow, Ipv4Unseen{}, roce_of(udp)));
        CHECK(icrc_verify_ipv4(flow, udp) == IcrcCheck::Exact);
        Ipv4Unseen u{static_cast<uint16_t>(rng() | 1), (rng() & 1) != 0};
        store_icrc(udp, icrc_ipv4(flow, u, roce_of(udp)));
        CHECK(icrc_verify_ipv4(flow, udp) == IcrcCheck::MatchesUnseenFields);
        for (int i = 0; i < 8; ++i) {
            const size_t byte = rng() % udp.size();
            const auto mask = static_cast<uint8_t>(1u << (rng() % 8));
            udp[byte] ^= mask;
            CHECK(icrc_verify_ipv4(flow, udp) == ref.verify(udp));
            udp[byte] ^= mask;
        }
        // A random ICRC is almost never explained (2^17 of 2^32 values are).
        store_icrc(udp, static_cast<uint32_t>(rng()));
        CHECK(icrc_verify_ipv4(flow, udp) == ref.verify(udp));
    }
}

TEST_CASE("the blind single-bit corruptions are explained by an identification value",
          "[icrc][verify]") {
    // Shows that the accepted corruption at byte 173 is no bug of the span check: brute force
    // over every identification and DF value finds one whose ICRC matches.
    const CapturedPacket& cp = wiretest::find_packet("rc_write", 3);
    REQUIRE(cp.udp.size() > 1000);
    std::vector<uint8_t> udp = cp.udp;
    udp[kBlindBits[0].first] ^= kBlindBits[0].second;
    CHECK(icrc_verify_ipv4(cp.flow, udp) == IcrcCheck::MatchesUnseenFields);
    const std::vector<Ipv4Unseen> found = brute_force(cp.flow, udp);
    REQUIRE(found.size() == 1);
    CHECK(found[0].identification != cp.unseen.identification);

    // Every listed position, in a packet long enough to hold them all, by the reference.
    const Ipv4Flow flow{0x0a000001, 0x0a000002, 0xc000, kRoceV2Port};
    std::vector<uint8_t> big(4096, 0x5a);
    store_icrc(big, icrc_ipv4(flow, Ipv4Unseen{0x4242, true}, roce_of(big)));
    const ReferenceVerifier ref(flow, roce_of(big));
    for (const auto& [offset, mask] : kBlindBits) {
        CAPTURE(offset);
        big[offset] ^= mask;
        CHECK(icrc_verify_ipv4(flow, big) == IcrcCheck::MatchesUnseenFields);
        CHECK(ref.verify(big) == IcrcCheck::MatchesUnseenFields);
        big[offset] ^= mask;
        big[offset + 1] ^= mask;  // a neighbour is caught
        CHECK(icrc_verify_ipv4(flow, big) == IcrcCheck::Mismatch);
        big[offset + 1] ^= mask;
    }
}

TEST_CASE("a wrong address or port is a Mismatch", "[icrc][verify]") {
    for (const CapturedPacket* cp : samples()) {
        CAPTURE(cp->capture, cp->frame);
        for (int bit = 0; bit < 32; ++bit) {
            CAPTURE(bit);
            Ipv4Flow f = cp->flow;
            f.src_ip ^= 1u << bit;
            CHECK(icrc_verify_ipv4(f, cp->udp) == IcrcCheck::Mismatch);
            f = cp->flow;
            f.dst_ip ^= 1u << bit;
            CHECK(icrc_verify_ipv4(f, cp->udp) == IcrcCheck::Mismatch);
            if (bit < 16) {
                f = cp->flow;
                f.src_port = static_cast<uint16_t>(f.src_port ^ (1u << bit));
                CHECK(icrc_verify_ipv4(f, cp->udp) == IcrcCheck::Mismatch);
                f = cp->flow;
                f.dst_port = static_cast<uint16_t>(f.dst_port ^ (1u << bit));
                CHECK(icrc_verify_ipv4(f, cp->udp) == IcrcCheck::Mismatch);
            }
        }
        Ipv4Flow swapped = cp->flow;
        std::swap(swapped.src_ip, swapped.dst_ip);
        CHECK(icrc_verify_ipv4(swapped, cp->udp) == IcrcCheck::Mismatch);
        swapped = cp->flow;
        std::swap(swapped.src_port, swapped.dst_port);
        CHECK(icrc_verify_ipv4(swapped, cp->udp) == IcrcCheck::Mismatch);
    }
}

TEST_CASE("a truncated or extended packet is a Mismatch", "[icrc][verify]") {
    const CapturedPacket& cp = wiretest::find_packet("rc_send_64", 1);
    for (size_t len = 0; len < cp.udp.size(); ++len) {
        CAPTURE(len);
        const std::vector<uint8_t> buf(cp.udp.begin(), cp.udp.begin() + static_cast<long>(len));
        CHECK(icrc_verify_ipv4(cp.flow, buf) == IcrcCheck::Mismatch);
    }
    std::vector<uint8_t> longer = cp.udp;
    longer.insert(longer.end() - 4, 4, 0);
    CHECK(icrc_verify_ipv4(cp.flow, longer) == IcrcCheck::Mismatch);
}

TEST_CASE("IcrcCheck values have distinct names", "[icrc]") {
    std::set<std::string> names;
    for (IcrcCheck c : {IcrcCheck::Exact, IcrcCheck::MatchesUnseenFields, IcrcCheck::Mismatch}) {
        REQUIRE(to_string(c) != nullptr);
        names.insert(to_string(c));
    }
    CHECK(names.size() == 3);
}
