// See fork_guard.h.
#include "provider/fork_guard.h"

#include <pthread.h>

#include <mutex>

namespace uroce::provider {
namespace {

void in_child() noexcept {
    detail::fork_generation.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void fork_guard_install() noexcept {
    static std::once_flag once;
    // pthread_atfork fails only without memory; objects then stay usable in a child, as
    // before this guard existed.
    std::call_once(once, [] { (void)pthread_atfork(nullptr, nullptr, in_child); });
}

}  // namespace uroce::provider
