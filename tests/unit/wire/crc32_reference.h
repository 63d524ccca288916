// An independent CRC-32 for the wire tests to check ISA-L's (and the ICRC built on it) against.
#pragma once

#include <cstdint>
#include <span>

namespace wiretest {

// CRC-32 as zlib's crc32() computes it, one bit at a time.
inline uint32_t crc32_bitwise(std::span<const uint8_t> data) {
    uint32_t c = 0xffffffff;
    for (uint8_t b : data) {
        c ^= b;
        for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ 0xedb88320 : c >> 1;
    }
    return ~c;
}

}  // namespace wiretest
