// See qp_ex_layout.h.
#include "provider/qp_ex_layout.h"

#include <link.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace uroce::provider {

namespace {

constexpr size_t kBuilt = offsetof(verbs_qp, comp_mask);

// The release number in "libibverbs.so.1.<n>.<release>.<x>", or 0.
[[maybe_unused]] unsigned release_of(std::string_view file_name) {
    const size_t slash = file_name.rfind('/');
    if (slash != std::string_view::npos) file_name.remove_prefix(slash + 1);
    constexpr std::string_view kPrefix = "libibverbs.so.1.";
    if (file_name.substr(0, kPrefix.size()) != kPrefix) return 0;
    file_name.remove_prefix(kPrefix.size());
    const size_t dot = file_name.find('.');  // after <n>
    if (dot == std::string_view::npos || dot == 0) return 0;
    file_name.remove_prefix(dot + 1);
    unsigned release = 0;
    size_t digits = 0;
    for (char c : file_name) {
        if (c < '0' || c > '9') break;
        release = release * 10 + static_cast<unsigned>(c - '0');
        if (++digits > 4) return 0;
    }
    return digits ? release : 0;
}

}  // namespace

size_t comp_mask_offset_for(std::string_view file_name) {
#if UROCE_VERBS_ABI == 34
    const unsigned release = release_of(file_name);
    if (release >= 36 && release <= 43) return 344;
    if (release == 44) return 352;
    if (release >= 45 && release <= 56) return 360;
#else
    static_cast<void>(file_name);  // ABI 57 (v57, v58) has one layout
#endif
    return kBuilt;
}

size_t loaded_comp_mask_offset() {
    static const size_t offset = [] {
        // The libibverbs among the loaded objects (no symbol of it is needed to find it).
        std::string name;
        ::dl_iterate_phdr(
            [](dl_phdr_info* info, size_t, void* out) {
                const char* n = info->dlpi_name;
                if (!n || !std::strstr(n, "/libibverbs.so")) return 0;
                *static_cast<std::string*>(out) = n;
                return 1;
            },
            &name);
        if (name.empty()) return kBuilt;
        // The name it was loaded by is usually the libibverbs.so.1 link.
        char* real = ::realpath(name.c_str(), nullptr);
        const size_t found = comp_mask_offset_for(real ? real : name);
        std::free(real);
        return found;
    }();
    return offset;
}

void set_qp_comp_mask(verbs_qp& vqp, uint32_t bits) {
    vqp.comp_mask |= bits;
    const size_t at = loaded_comp_mask_offset();
    if (at == kBuilt || at + sizeof(void*) > kBuilt) return;
    // The whole pointer slot, so that it holds no half of a pointer.
    unsigned char* slot = reinterpret_cast<unsigned char*>(&vqp) + at;
    std::memset(slot, 0, sizeof(void*));
    std::memcpy(slot, &vqp.comp_mask, sizeof vqp.comp_mask);
}

}  // namespace uroce::provider
