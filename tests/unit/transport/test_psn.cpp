// 24-bit PSN arithmetic: addition wraps at 2^24, differences are signed across the wrap.
#include <catch2/catch.hpp>
#include <cstdint>

#include "transport/psn.h"

using namespace uroce::transport;

TEST_CASE("psn_add wraps at 2^24", "[psn]") {
    CHECK(kPsnModulus == 0x1000000u);
    CHECK(kPsnMask == 0xffffffu);
    CHECK(psn_add(0, 0) == 0);
    CHECK(psn_add(5, 7) == 12);
    CHECK(psn_add(0xfffffe, 1) == 0xffffff);
    CHECK(psn_add(0xffffff, 1) == 0);
    CHECK(psn_add(0xfffff0, 0x20) == 0x10);
    CHECK(psn_add(0xffffff, 0xffffff) == 0xfffffe);
    // Adding the modulus (or a multiple) is the identity.
    CHECK(psn_add(0x123456, kPsnModulus) == 0x123456);
    CHECK(psn_add(0x123456, 3 * kPsnModulus) == 0x123456);
    // Adding the mask is subtracting one.
    CHECK(psn_add(0, kPsnMask) == 0xffffff);
    CHECK(psn_add(0x10, kPsnMask) == 0xf);
    // Bits above the 24 of the operand do not leak into the result.
    CHECK(psn_add(0xff000001, 1) == 2);
    // The result is always a valid PSN.
    for (uint32_t n = 0; n < 64; ++n) CHECK(psn_add(0xffffe0 + n, n) <= kPsnMask);
}

TEST_CASE("psn_diff is signed across the wrap", "[psn]") {
    CHECK(psn_diff(0, 0) == 0);
    CHECK(psn_diff(10, 3) == 7);
    CHECK(psn_diff(3, 10) == -7);
    CHECK(psn_diff(0, 0xffffff) == 1);
    CHECK(psn_diff(0xffffff, 0) == -1);
    CHECK(psn_diff(0x10, 0xfffff0) == 0x20);
    CHECK(psn_diff(0xfffff0, 0x10) == -0x20);
    // The extremes of the range [-2^23, 2^23).
    CHECK(psn_diff(0x7fffff, 0) == 0x7fffff);
    CHECK(psn_diff(0x800000, 0) == -0x800000);
    CHECK(psn_diff(0, 0x800000) == -0x800000);
    CHECK(psn_diff(0, 0x7fffff) == -0x7fffff);
    CHECK(psn_diff(0x800001, 0) == -0x7fffff);
    // Consistent with psn_add for every distance in range, starting on either side of the
    // wrap.
    for (uint32_t base : {0u, 1u, 0x7ffff0u, 0xfffff0u, 0xffffffu}) {
        for (int32_t d : {0, 1, -1, 15, -15, 16, -16, 100000, -100000, 0x7fffff, -0x800000}) {
            const uint32_t other = psn_add(base, static_cast<uint32_t>(d));
            INFO("base " << base << " d " << d);
            CHECK(psn_diff(other, base) == d);
        }
    }
}

TEST_CASE("psn_before and psn_after order PSNs across the wrap", "[psn]") {
    CHECK(psn_before(1, 2));
    CHECK_FALSE(psn_after(1, 2));
    CHECK(psn_after(2, 1));
    CHECK_FALSE(psn_before(2, 1));
    CHECK_FALSE(psn_before(7, 7));
    CHECK_FALSE(psn_after(7, 7));
    // 0xffffff is just before 0: the wrap does not reverse the order.
    CHECK(psn_before(0xffffff, 0));
    CHECK(psn_after(0, 0xffffff));
    CHECK(psn_before(0xfffff0, 0x10));
    CHECK(psn_after(0x10, 0xfffff0));
    // Half the space away is the boundary: -2^23 counts as before.
    CHECK(psn_before(0, 0x800000));
    CHECK(psn_before(0x800000, 0));
    CHECK(psn_after(0x7fffff, 0));
    // Walking forward over the wrap, every PSN is after the one before it.
    uint32_t prev = 0xffff00;
    for (int i = 0; i < 512; ++i) {
        const uint32_t next = psn_add(prev, 1);
        CHECK(psn_after(next, prev));
        CHECK(psn_before(prev, next));
        prev = next;
    }
    CHECK(prev == 0x100);
}
