#include "transport/scatter.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "transport/app_memory_guard.h"

namespace uroce::transport {

bool copy_last_byte_last(uint8_t* dst, const uint8_t* src, size_t len) {
    if (len == 0) return true;
    auto copy = [dst, src, len] {
        std::memcpy(dst, src, len - 1);
        std::atomic_ref<uint8_t>(dst[len - 1]).store(src[len - 1], std::memory_order_release);
    };
    return guarded(copy);
}

bool gather_checked(const MemoryTable& memory, const SendWqe& wqe, uint32_t pd, uint32_t offset,
                    uint32_t len, std::span<iovec> iov, size_t& niov) {
    niov = 0;
    if (len == 0) return true;
    if (wqe.is_inline) {
        iov[niov++] = {const_cast<uint8_t*>(wqe.inline_data.data()) + offset, len};
        return true;
    }
    uint32_t skip = offset;
    for (uint32_t i = 0; i < wqe.sgl.count && len > 0; ++i) {
        const Sge& s = wqe.sgl.sge[i];
        if (skip >= s.length) {
            skip -= s.length;
            continue;
        }
        const uint32_t take = std::min(len, s.length - skip);
        if (memory.check_local(s.lkey, pd, s.addr + skip, take, 0) != KeyCheck::Ok) return false;
        if (niov == iov.size()) return false;
        iov[niov++] = {reinterpret_cast<void*>(s.addr + skip), take};
        len -= take;
        skip = 0;
    }
    return len == 0;
}

KeyCheck scatter_checked(const MemoryTable& memory, const SgeList& sgl, uint32_t pd,
                         uint32_t offset, std::span<const std::span<const uint8_t>> pieces) {
    auto guard = memory.lock_shared();
    // Pass 0 checks every SGE the data lands in, pass 1 writes: a refused message leaves
    // the buffer as it was.
    for (int pass = 0; pass < 2; ++pass) {
        uint32_t i = 0;          // current SGE
        uint32_t skip = offset;  // bytes of it already used
        while (i < sgl.count && skip >= sgl.sge[i].length) skip -= sgl.sge[i++].length;
        for (std::span<const uint8_t> data : pieces) {
            size_t done = 0;
            while (done < data.size()) {
                if (i >= sgl.count) return KeyCheck::OutOfBounds;
                const Sge& s = sgl.sge[i];
                const uint32_t take =
                    static_cast<uint32_t>(std::min<size_t>(data.size() - done, s.length - skip));
                if (pass == 0) {
                    const KeyCheck k =
                        memory.check_local(s.lkey, pd, s.addr + skip, take, kLocalWrite);
                    if (k != KeyCheck::Ok) return k;
                } else if (!guarded_copy(reinterpret_cast<void*>(s.addr + skip), data.data() + done,
                                         take)) {
                    memory.note_fault();
                    return KeyCheck::Unmapped;
                }
                done += take;
                skip += take;
                if (skip == s.length) {
                    ++i;
                    skip = 0;
                }
            }
        }
    }
    return KeyCheck::Ok;
}

}  // namespace uroce::transport
