// Unpredictable numbers for identifiers a blind attacker must not guess (QP numbers, the
// key byte of memory keys), from the kernel's random pool.
#pragma once

#include <cstdint>
#include <span>

namespace uroce::transport {

uint64_t random_u64();

// Fills `out` as random_u64() would, value by value, but from one read of the kernel's pool
// for all of them: a QPN slot's shuffle draws 4,095 values, which were as many system calls
// in every application's trace.
void random_fill(std::span<uint64_t> out);

}  // namespace uroce::transport
