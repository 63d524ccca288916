// Writing a received message into the buffer a receive WQE describes.
#pragma once

#include <cstdint>
#include <span>

#include "transport/memory_table.h"
#include "transport/work_request.h"

namespace uroce::transport {

// Copies each piece of `pieces` in turn into the buffer `sgl` describes, starting `offset`
// bytes into it, after checking every SGE it touches for local write in protection domain
// `pd`. All or nothing: if a check fails nothing is written and the result is not Ok. The
// caller has checked that the data fits (offset + total size <= sgl.total_length()).
KeyCheck scatter_checked(const MemoryTable& memory, const SgeList& sgl, uint32_t pd,
                         uint32_t offset, std::span<const std::span<const uint8_t>> pieces);

}  // namespace uroce::transport
