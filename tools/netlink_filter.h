// Refusing RDMA netlink to a program, so that libibverbs looks for devices in
// SYSFS_PATH (the uroce registry) even on a kernel with RDMA support.
//
// libibverbs (rdma-core v44) first opens socket(AF_NETLINK, SOCK_RAW, NETLINK_RDMA).
// If that works it lists only the kernel's devices and never reads SYSFS_PATH;
// only if it fails does it scan sysfs. A kernel without ib_core fails it with
// EPROTONOSUPPORT (and one with ib_core loadable but not loaded loads it on that
// very call: ib_core carries the module alias net-pf-16-proto-20). The filter
// below gives every such call that same EPROTONOSUPPORT before the kernel sees
// it. Every other socket, netlink families included, is untouched.
#pragma once

#include <string>

namespace uroce::tools {

// NETLINK_RDMA from <linux/netlink.h>, spelled out so the value the docs and
// tests rely on is visible here.
inline constexpr int kNetlinkRdma = 20;

// Sets PR_SET_NO_NEW_PRIVS and loads a seccomp filter on the calling thread
// that makes socket(AF_NETLINK, any type, NETLINK_RDMA) fail with
// EPROTONOSUPPORT. The filter stays for the life of the process and is
// inherited by its children and kept across execve. Returns an empty string on
// success, else a sentence saying what failed. Call it in a single-threaded
// process (it filters only the calling thread), just before execve.
//
// Only the native ABI (x86-64 on an x86-64 build) is filtered; other ABIs
// (i386's socketcall, x32) pass unfiltered instead of being killed, since a
// program of another ABI cannot load the 64-bit provider anyway.
std::string refuse_rdma_netlink();

}  // namespace uroce::tools
