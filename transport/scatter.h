// Writing a received message into the buffer a receive WQE describes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <sys/uio.h>

#include "transport/memory_table.h"
#include "transport/work_request.h"

namespace uroce::transport {

// Copies so that the last byte becomes visible last: applications (ib_write_lat among
// them) poll the final byte of an RDMA WRITE to learn that the whole message is there.
// False if the pages under `dst` were gone (app_memory_guard.h): part may be written.
bool copy_last_byte_last(uint8_t* dst, const uint8_t* src, size_t len);

// The iovecs of bytes [offset, offset + len) of `wqe`'s message (inline data or SGEs, each
// SGE checked for local access in `pd`); false if a check fails. The caller holds
// memory.lock_shared() until the iovecs have been sent.
bool gather_checked(const MemoryTable& memory, const SendWqe& wqe, uint32_t pd, uint32_t offset,
                    uint32_t len, std::span<iovec> iov, size_t& niov);

// Copies each piece of `pieces` in turn into the buffer `sgl` describes, starting `offset`
// bytes into it, after checking every SGE it touches for local write in protection domain
// `pd`. All or nothing: if a check fails nothing is written and the result is not Ok.
// The caller has checked that the data fits (offset + total size <= sgl.total_length()).
// Unmapped (counted: memory.note_fault()) if the pages under a checked SGE were gone
// (app_memory_guard.h): then part may be written.
KeyCheck scatter_checked(const MemoryTable& memory, const SgeList& sgl, uint32_t pd,
                         uint32_t offset, std::span<const std::span<const uint8_t>> pieces);

}  // namespace uroce::transport
