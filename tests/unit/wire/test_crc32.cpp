// wire::crc32: ISA-L's CRC-32, checked against a bitwise CRC, and the vector register state it
// leaves behind (none dirty: uroce/crc32.h says why).
#include <cpuid.h>
#include <immintrin.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "crc32_reference.h"
#include "uroce/crc32.h"
#include "uroce/icrc.h"

using uroce::IpAddress;
using namespace uroce::wire;
using wiretest::crc32_bitwise;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
}

// XINUSE (XGETBV with ECX 1): which register state components are not in their initial
// configuration. Bit 2: the upper halves of YMM0-15; bit 6: the upper halves of ZMM0-15.
constexpr uint64_t kUpperHalves = (1u << 2) | (1u << 6);

bool can_read_xinuse() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return false;
    if (__get_cpuid_max(0, nullptr) < 0xd) return false;
    __cpuid_count(0xd, 1, a, b, c, d);
    return (a & (1u << 2)) != 0;  // XGETBV with ECX 1 supported
}

uint64_t xinuse() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    return uint64_t{hi} << 32 | lo;
}

// What AVX code such as ISA-L's AVX-512 CRC leaves: a non-zero upper half in YMM0. Naked:
// the compiler would otherwise end an AVX function with its own VZEROUPPER.
__attribute__((naked, noinline)) void dirty_upper_halves() {
    __asm__("vpcmpeqd %ymm0, %ymm0, %ymm0\n\tret");
}

}  // namespace

TEST_CASE("crc32 is the zlib CRC-32, whole or piece by piece", "[crc32]") {
    for (size_t n : {0, 1, 7, 64, 255, 256, 4111, 65536}) {
        const auto data = random_bytes(n, static_cast<uint32_t>(n));
        INFO(n << " bytes");
        CHECK(crc32(0, data) == crc32_bitwise(data));
        const size_t cut = n / 3;
        const uint32_t first = crc32(0, std::span(data).first(cut));
        CHECK(crc32(first, std::span(data).subspan(cut)) == crc32_bitwise(data));
    }
}

TEST_CASE("crc32 and icrc leave the vector registers' upper halves clean", "[crc32]") {
    if (!can_read_xinuse()) {
        WARN("this CPU has no AVX or cannot report XINUSE: case not run");
        return;
    }
    const auto packet = random_bytes(4096 + 12, 7);
    const IpFlow flow{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 49152, 4791};

    dirty_upper_halves();
    const uint64_t dirty = xinuse();
    REQUIRE((dirty & kUpperHalves) != 0);  // the check below can see the state

    // A packet's worth: the length at which ISA-L takes its widest routine.
    dirty_upper_halves();
    (void)crc32(0, packet);
    const uint64_t after_crc32 = xinuse();
    CHECK((after_crc32 & kUpperHalves) == 0);

    dirty_upper_halves();
    (void)icrc(flow, Ipv4Unseen{}, packet);
    const uint64_t after_icrc = xinuse();
    CHECK((after_icrc & kUpperHalves) == 0);
}
