// See uroce/crc32.h.
#include "uroce/crc32.h"

#include <immintrin.h>
#include <isa-l/crc.h>

namespace uroce::wire {

namespace {

// Only this function is compiled for AVX: it runs only where the CPU has it.
__attribute__((target("avx"))) void clear_upper_vector_state() {
    _mm256_zeroupper();
}

// Without AVX there are no upper halves to leave dirty (and no VZEROUPPER to run). Read in a
// static initializer, which may run before libgcc's own: hence the explicit detection first.
const bool kCpuHasAvx = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") != 0;
}();

}  // namespace

uint32_t crc32(uint32_t crc, std::span<const uint8_t> data) {
    crc = crc32_gzip_refl(crc, data.data(), data.size());
    if (kCpuHasAvx) clear_upper_vector_state();
    return crc;
}

}  // namespace uroce::wire
