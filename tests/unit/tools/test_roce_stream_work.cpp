// tools/bench/roce_stream_work.cpp: the gso-write-rc and gso-rc baselines' per-byte work. Its
// figures are a ceiling only if the receiver really checks every packet and delivers every byte.
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "tools/bench/roce_stream_work.h"
#include "uroce/crc32.h"

using uroce::bench::RoceStreamWork;

namespace {

constexpr std::size_t kSeg = 4096 + 16;  // a 4096-byte path MTU's packet: BTH, payload, ICRC

std::vector<std::uint8_t> message(std::size_t n) {
    std::vector<std::uint8_t> m(n);
    for (std::size_t i = 0; i < n; ++i) m[i] = static_cast<std::uint8_t>(i * 7 + i / 251);
    return m;
}

// The staged packets as a receiver cuts them: the first `first_extra` larger, the last shorter.
std::vector<std::span<const std::uint8_t>> packets_of(std::span<const std::uint8_t> staged,
                                                      std::size_t count, std::size_t first_extra) {
    std::vector<std::span<const std::uint8_t>> out;
    std::size_t at = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t len = std::min(i == 0 ? kSeg + first_extra : kSeg, staged.size() - at);
        out.push_back(staged.subspan(at, len));
        at += len;
    }
    REQUIRE(at == staged.size());
    return out;
}

// Sets a packet's last 4 bytes to the CRC of the rest, as the sender does.
void sign(std::vector<std::uint8_t>& packet) {
    const std::uint32_t crc =
        uroce::wire::crc32(0, std::span(packet.data(), packet.size() - RoceStreamWork::kCrcBytes));
    std::memcpy(packet.data() + packet.size() - RoceStreamWork::kCrcBytes, &crc, sizeof crc);
}

}  // namespace

TEST_CASE("RoceStreamWork: every byte staged arrives in the region, in any packet order") {
    const std::size_t msg = GENERATE(65536u, 10000u, 8192u);
    // A WRITE's first packet carries a RETH; a SEND's does not.
    const std::size_t extra = GENERATE(std::size_t{RoceStreamWork::kRethBytes}, std::size_t{0});
    RoceStreamWork sender(msg, kSeg, extra);
    RoceStreamWork receiver(msg, kSeg, extra);
    const auto app = message(msg);
    const auto staged = sender.stage(app);
    CHECK(reinterpret_cast<std::uintptr_t>(staged.data() + 12 + extra) % 64 == 0);
    const auto packets = packets_of(staged, sender.packets(), extra);
    CHECK(sender.packets() == std::max<std::size_t>(2, (msg + 4095) / 4096));

    std::size_t delivered = 0;
    for (std::size_t i = packets.size(); i-- > 0;) {
        const auto got = receiver.take(packets[i]);
        REQUIRE(got.has_value());
        delivered += *got;
    }
    CHECK(delivered == msg);
    const auto region = receiver.region();
    CHECK(std::vector<std::uint8_t>(region.begin(), region.end()) == app);
}

TEST_CASE(
    "RoceStreamWork: a packet with a flipped bit, out of the message or cut short is refused") {
    RoceStreamWork sender(65536, kSeg, RoceStreamWork::kRethBytes);
    RoceStreamWork receiver(65536, kSeg, RoceStreamWork::kRethBytes);
    const auto staged = sender.stage(message(65536));
    const auto packets = packets_of(staged, sender.packets(), RoceStreamWork::kRethBytes);

    std::vector<std::uint8_t> flipped(packets[3].begin(), packets[3].end());
    flipped[100] ^= 0x10;
    CHECK_FALSE(receiver.take(flipped).has_value());

    // Signed again after the change: only the check named refuses it.
    std::vector<std::uint8_t> far(packets[3].begin(), packets[3].end());
    far[8] = 99;  // the index: past the message's 16 packets
    sign(far);
    CHECK_FALSE(receiver.take(far).has_value());

    // The last packet, its payload running 4 bytes past the message.
    std::vector<std::uint8_t> too_long(packets[15].begin(), packets[15].end());
    too_long.insert(too_long.end() - RoceStreamWork::kCrcBytes, {1, 2, 3, 4});
    sign(too_long);
    CHECK_FALSE(receiver.take(too_long).has_value());

    // A first packet too short for its RETH.
    std::vector<std::uint8_t> short_first(packets[0].begin(), packets[0].begin() + 20);
    sign(short_first);
    CHECK_FALSE(receiver.take(short_first).has_value());

    // Too short to hold a header: a buffer of its own, so that ASan sees any read past it.
    const std::vector<std::uint8_t> stub(packets[3].begin(), packets[3].begin() + 10);
    CHECK_FALSE(receiver.take(stub).has_value());
    // Nothing of the refused packets reached the region.
    for (const std::uint8_t b : receiver.region().subspan(3 * 4096, 4096)) REQUIRE(b == 0);
    CHECK(receiver.take(packets[3]) == 4096u);
}
