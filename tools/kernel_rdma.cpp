// Detecting kernel RDMA support; see kernel_rdma.h.
#include "kernel_rdma.h"

#include <sys/utsname.h>

#include <fstream>
#include <string>
#include <system_error>

namespace uroce::tools {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kModule = "ib_core";

// True if `path` (a module file as modules.dep/modules.builtin list it, e.g.
// "kernel/drivers/infiniband/core/ib_core.ko.xz") is the ib_core module.
// Module names treat '-' and '_' alike.
bool is_ib_core(std::string_view path) {
    const size_t slash = path.rfind('/');
    std::string name(slash == std::string_view::npos ? path : path.substr(slash + 1));
    const size_t dot = name.find(".ko");
    if (dot == std::string::npos) return false;
    // ".ko" must end the name or be followed by a compression suffix (".ko.xz").
    if (dot + 3 != name.size() && name[dot + 3] != '.') return false;
    name.resize(dot);
    for (char& c : name) {
        if (c == '-') c = '_';
    }
    return name == kModule;
}

// Each line of modules.dep is "MODULE: DEPENDENCIES"; of modules.builtin, "MODULE".
bool lists_ib_core(const fs::path& file) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
        const size_t colon = line.find(':');
        if (is_ib_core(std::string_view(line).substr(0, colon))) return true;
    }
    return false;
}

}  // namespace

KernelRdma probe_kernel_rdma(const fs::path& root, std::string_view release) {
    std::error_code ec;
    if (fs::exists(root / "sys/module" / kModule, ec)) return KernelRdma::Loaded;
    if (release.empty() || release.find('/') != std::string_view::npos) return KernelRdma::None;
    for (const char* dir : {"lib/modules", "usr/lib/modules"}) {
        const fs::path modules = root / dir / release;
        if (lists_ib_core(modules / "modules.builtin")) return KernelRdma::BuiltIn;
        if (lists_ib_core(modules / "modules.dep")) return KernelRdma::Loadable;
    }
    return KernelRdma::None;
}

KernelRdma probe_kernel_rdma() {
    struct utsname u {};
    if (::uname(&u) != 0) return probe_kernel_rdma("/", {});
    return probe_kernel_rdma("/", u.release);
}

std::string kernel_rdma_advice(KernelRdma state) {
    const char* what = nullptr;
    switch (state) {
        case KernelRdma::None:
            return {};
        case KernelRdma::Loaded:
            what = "ib_core is loaded";
            break;
        case KernelRdma::BuiltIn:
            what = "ib_core is built in";
            break;
        case KernelRdma::Loadable:
            what = "ib_core can be loaded, and the first RDMA netlink socket loads it";
            break;
    }
    return std::string("this kernel has RDMA support (") + what +
           "), so libibverbs lists only kernel devices unless RDMA netlink is refused to the "
           "program: 'uroce run' does that for its command; a program started after "
           "'eval \"$(uroce env)\"' needs the LD_PRELOAD line 'uroce env' prints";
}

}  // namespace uroce::tools
