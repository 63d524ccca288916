// The rdma_cm device emulation: librdmacm (unmodified) talks to the kernel's RDMA CM through
// /dev/infiniband/rdma_cm, writing ucma commands to it and reading events back; uroce has no
// kernel RDMA CM, so it answers those commands in this process (docs/rdma-cm.md).
//
// librdmacm's own imports of open, fstat, write and close are redirected (got_patch.h), as
// libibverbs' write is for completion channels: opening the rdma_cm device yields an event
// channel (ucma_channel.h), which fstat reports as a character device, writes to it are ucma
// commands answered by the process's RDMA CM (transport/cm/rdma_cm.h), and closing it
// destroys the identifiers left on it, as closing the kernel's file does. Every other file
// librdmacm touches goes to the C library as before.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace uroce::provider::ucma {

// Redirects librdmacm's imports, if librdmacm is loaded. 0; ENOENT when it is not loaded
// (nothing to do); another errno when the redirection failed. Safe to call again.
int hook_install() noexcept;

// The hooks' bodies (ucma_commands.cpp); exposed for the unit tests.
namespace detail {
// open("/dev/infiniband/rdma_cm", ...): a new channel's fd, or -1 with errno.
int open_channel() noexcept;
bool is_channel(int fd) noexcept;
// A ucma command written to channel `fd`: len, or -1 with errno (as the kernel's write).
ssize_t handle_write(int fd, const void* buf, size_t len) noexcept;
// The application closes channel `fd` (before the fd itself is closed).
void on_close(int fd) noexcept;
}  // namespace detail

}  // namespace uroce::provider::ucma
