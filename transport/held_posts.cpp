#include "transport/held_posts.h"

namespace uroce::transport {

void HeldPosts::note(uint32_t qpn) {
    std::lock_guard lock(mutex_);
    noted_.push_back(qpn);
    any_.store(true, std::memory_order_relaxed);
}

void HeldPosts::flush(const std::function<void(uint32_t qpn)>& send) {
    if (!any_.load(std::memory_order_relaxed)) return;
    // A small fixed share at a time, taken under the lock and sent without it (the QPs' locks
    // are taken by `send`, and a posting thread takes this lock under a QP's).
    constexpr size_t kShare = 64;
    uint32_t share[kShare];
    for (;;) {
        size_t n = 0;
        {
            std::lock_guard lock(mutex_);
            while (n < kShare && !noted_.empty()) {
                share[n++] = noted_.back();
                noted_.pop_back();
            }
            if (noted_.empty()) any_.store(false, std::memory_order_relaxed);
        }
        if (n == 0) return;
        for (size_t i = 0; i < n; ++i) send(share[i]);
    }
}

}  // namespace uroce::transport
