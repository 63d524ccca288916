#include "transport/scatter.h"

#include <algorithm>
#include <cstring>

namespace uroce::transport {

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
                } else {
                    std::memcpy(reinterpret_cast<void*>(s.addr + skip), data.data() + done, take);
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
