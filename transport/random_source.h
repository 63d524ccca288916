// Unpredictable numbers for identifiers a blind attacker must not guess (QP numbers, the
// key byte of memory keys), from the kernel's random pool.
#pragma once

#include <cstdint>

namespace uroce::transport {

uint64_t random_u64();

}  // namespace uroce::transport
