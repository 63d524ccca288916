#include "transport/random_source.h"

#include <sys/random.h>

#include <atomic>
#include <chrono>
#include <cstring>

namespace uroce::transport {

namespace {

// Only before the kernel's pool is initialised (early boot) or under a seccomp filter:
// still differ between calls and processes, if not unpredictably.
uint64_t fallback_u64(const void* salt) {
    static std::atomic<uint64_t> counter{0};
    uint64_t x =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull) ^ reinterpret_cast<uintptr_t>(salt);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return x;
}

}  // namespace

uint64_t random_u64() {
    uint64_t v = 0;
    if (::getrandom(&v, sizeof v, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof v)) return v;
    return fallback_u64(&v);
}

void random_fill(std::span<uint64_t> out) {
    auto* bytes = reinterpret_cast<uint8_t*>(out.data());
    const size_t want = out.size_bytes();
    size_t got = 0;
    // A read past 256 bytes may come back short (a signal): a few more calls at most.
    for (int tries = 0; got < want && tries < 8; ++tries) {
        const ssize_t n = ::getrandom(bytes + got, want - got, GRND_NONBLOCK);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    // What the pool did not give comes from the fallback, value by value.
    for (size_t i = got / sizeof(uint64_t); i < out.size(); ++i) out[i] = fallback_u64(&out[i]);
}

}  // namespace uroce::transport
