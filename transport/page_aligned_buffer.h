// Bytes that start on a page boundary, for the buffers the kernel copies received datagrams
// into.
//
// The kernel's copy to user memory (rep movsb) is several times slower on this machine's AMD
// CPUs for some offsets of the destination against the source within a page, and malloc's
// large blocks start 16 bytes into one. Measured with loopback's GSO trains: a recvmmsg of a
// 61,680-byte train took 23 us into a buffer 12, 16 or 20 bytes into a page and 3.3 us at 0,
// 32 or 48 bytes (ibv_rc_pingpong -s 65536: 242-252 -> 135-177 us per iteration; see
// docs/performance.md). tools/bench/recv_alignment.cpp measures it on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace uroce::transport {

class PageAlignedBuffer {
  public:
    static constexpr size_t kAlignment = 4096;

    // Left uninitialised: only what is written is ever touched. Throws std::bad_alloc.
    explicit PageAlignedBuffer(size_t bytes)
        : data_(static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{kAlignment}))) {}
    ~PageAlignedBuffer() { ::operator delete[](data_, std::align_val_t{kAlignment}); }
    PageAlignedBuffer(const PageAlignedBuffer&) = delete;
    PageAlignedBuffer& operator=(const PageAlignedBuffer&) = delete;

    uint8_t* data() const { return data_; }

  private:
    uint8_t* const data_;
};

}  // namespace uroce::transport
