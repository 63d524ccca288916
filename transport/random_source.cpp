#include "transport/random_source.h"

#include <sys/random.h>

#include <atomic>
#include <chrono>
#include <cstring>

namespace uroce::transport {

uint64_t random_u64() {
    uint64_t v = 0;
    if (::getrandom(&v, sizeof v, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof v)) return v;
    // Only before the kernel's pool is initialised (early boot) or under a seccomp filter:
    // still differ between calls and processes, if not unpredictably.
    static std::atomic<uint64_t> counter{0};
    uint64_t x =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull) ^ reinterpret_cast<uintptr_t>(&v);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return x;
}

}  // namespace uroce::transport
