// Big-endian bit fields as the IBA specification lays out management datagrams.
//
// The CM chapter (IBA 12.6) gives every field of a message as a bit offset from the start of
// the message and a width, counting bits from the most significant bit of byte 0. A BitField
// holds exactly those two numbers, so a message's layout below reads like the spec's table,
// and one pair of functions reads and writes any field of any message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace uroce::transport::cm {

struct BitField {
    uint16_t bit;   // offset of the field's most significant bit from the start of the message
    uint8_t width;  // 1..64 bits

    constexpr size_t end_byte() const { return (bit + width + 7u) / 8u; }
};

// The field's value. The caller guarantees the span holds end_byte() bytes.
uint64_t get_field(std::span<const uint8_t> msg, BitField f);

// Writes the low f.width bits of value into the field, leaving every other bit alone.
void set_field(std::span<uint8_t> msg, BitField f, uint64_t value);

}  // namespace uroce::transport::cm
