// Verbs objects belong to the process that created them.
//
// After fork() the child has a copy of the parent's memory and descriptors but none of its
// threads: an inherited context's engine thread does not exist there, its locks may be
// copies of locks a parent thread held, and its socket is the parent's, so a child that
// polled it would take the parent's packets. libibverbs says the child cannot use its
// parent's RDMA resources; uroce makes that safe rather than undefined:
//   - destroying an inherited object (QP, CQ, MR, PD) and closing an inherited context
//     succeed and touch nothing the parent uses: the child's copies of the sockets are
//     closed, the rest is left to the child's process image;
//   - every other verb on an inherited object fails with EIO (poll_cq returns -EIO,
//     post_send/post_recv name the first WR as bad), as on a device that is gone;
//   - the child opens contexts of its own and uses them normally.
// An inherited object is recognised by the fork generation its context was opened in.
#pragma once

#include <atomic>
#include <cstdint>

namespace uroce::provider {

// Installs the fork handler, once per process (the provider's constructor calls it).
void fork_guard_install() noexcept;

namespace detail {
inline std::atomic<uint32_t> fork_generation{0};  // forks between the loading process and this
}

// The generation a context opened now belongs to.
inline uint32_t current_fork_generation() noexcept {
    return detail::fork_generation.load(std::memory_order_relaxed);
}

}  // namespace uroce::provider
