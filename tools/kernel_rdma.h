// Whether the running kernel has RDMA support that would hide uroce devices.
//
// libibverbs asks RDMA netlink for devices before it reads SYSFS_PATH, and the
// kernel answers that netlink family when ib_core is loaded or built in, or
// loads it on the spot when it is a module (alias net-pf-16-proto-20). Then
// only kernel devices are listed. `uroce add/list/env` warn about such a host;
// `uroce run` and the preload library printed by `uroce env` refuse RDMA
// netlink to the program (netlink_filter.h, no_rdma_netlink_preload.c).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace uroce::tools {

enum class KernelRdma {
    None,      // no ib_core anywhere: libibverbs falls back to SYSFS_PATH by itself
    Loaded,    // ROOT/sys/module/ib_core exists
    BuiltIn,   // listed in modules.builtin
    Loadable,  // listed in modules.dep: the first RDMA netlink socket loads it
};

// Looks under `root` ("/" for the host): ROOT/sys/module/ib_core, then
// modules.builtin and modules.dep in ROOT/lib/modules/RELEASE and
// ROOT/usr/lib/modules/RELEASE. Unreadable files count as absent.
KernelRdma probe_kernel_rdma(const std::filesystem::path& root, std::string_view release);

// The host: root "/", release from uname(2).
KernelRdma probe_kernel_rdma();

// One sentence for a warning line (empty for KernelRdma::None): what the host
// has and what to do about it.
std::string kernel_rdma_advice(KernelRdma state);

}  // namespace uroce::tools
