// CRC-32 (the Ethernet/zlib polynomial, reflected): the CRC the ICRC is made of (icrc.h).
//
// Computed by ISA-L's crc32_gzip_refl, which picks the fastest routine this CPU has. On a
// CPU with AVX-512 and VPCLMULQDQ that routine leaves the upper halves of the vector
// registers dirty (it ends without VZEROUPPER), and every legacy SSE instruction after it
// then pays for that state, in uroce and in the application it returns to: on a Xeon the
// first SSE instruction after each packet's CRC stalled for about 100 ns, and a 64 KiB
// ping-pong took a fifth longer. crc32() clears that state before it returns.
#pragma once

#include <cstdint>
#include <span>

namespace uroce::wire {

// CRC-32 of `data`, continuing `crc` (0 to start; the previous result to go on: the CRC of
// a concatenation is computed piece by piece). Leaves no vector register state dirty.
uint32_t crc32(uint32_t crc, std::span<const uint8_t> data);

}  // namespace uroce::wire
