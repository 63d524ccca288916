#include "transport/cm/bit_field.h"

namespace uroce::transport::cm {

// Bit by bit: CM messages are a few hundred bytes exchanged a few times per connection, so
// clarity beats speed here.
uint64_t get_field(std::span<const uint8_t> msg, BitField f) {
    uint64_t v = 0;
    for (unsigned i = 0; i < f.width; ++i) {
        const unsigned b = f.bit + i;
        v = (v << 1) | ((msg[b / 8] >> (7 - b % 8)) & 1u);
    }
    return v;
}

void set_field(std::span<uint8_t> msg, BitField f, uint64_t value) {
    for (unsigned i = 0; i < f.width; ++i) {
        const unsigned b = f.bit + i;
        const unsigned from_lsb = f.width - 1 - i;
        const auto mask = static_cast<uint8_t>(1u << (7 - b % 8));
        if ((value >> from_lsb) & 1u) {
            msg[b / 8] = static_cast<uint8_t>(msg[b / 8] | mask);
        } else {
            msg[b / 8] = static_cast<uint8_t>(msg[b / 8] & ~mask);
        }
    }
}

}  // namespace uroce::transport::cm
