// A user namespace and a mount namespace for `uroce run` started by a user other than root.
//
// libibverbs opens /dev/infiniband/uverbs_uroce_NAME, a node only root can make on the host.
// An unprivileged process may create a user namespace, in which it holds every capability,
// and with it a mount namespace of its own, where it may mount a tmpfs and bind-mount
// existing device nodes (private_dev.h): what the command needs, without root. Inside, the
// caller keeps its own uid and gid (mapped to themselves), so the command it execs has no
// capability at all and sees its files as before; the mounts are private and vanish with the
// last process of the namespace.
//
// Hosts may forbid this: kernel.unprivileged_userns_clone=0 (older Debian kernels had it
// off), user.max_user_namespaces=0, a container's seccomp profile (Docker's refuses
// unshare), or AppArmor's kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu 24.04),
// which lets the namespace be made but refuses its mounts. Every failure is reported as one
// sentence saying what is forbidden and how to get past it: run as root, or the setting
// that allows it.
#pragma once

#include <string>

namespace uroce::tools {

// Moves the calling process into a new user namespace (its uid and gid mapped to
// themselves, supplementary groups kept as they are) and a new mount namespace whose mounts
// no longer propagate anywhere. The process must be single-threaded (the kernel refuses a
// user namespace to a threaded one). Returns an empty string on success, else what is
// forbidden and how to allow it; the process is then in whatever state the failure left.
std::string enter_user_mount_namespace();

// Reports a failed mount() in that namespace (errno `err`; `what` says which mount): for a
// refusal, the sentence names AppArmor's setting.
std::string namespace_mount_failure(const std::string& what, int err);

// What enter_user_mount_namespace() would report, tried in a child process together with
// one tmpfs mount (so AppArmor's refusal is caught too): an empty string if the caller can
// have a private namespace with mounts. The caller itself is left as it was.
std::string user_namespace_refusal();

}  // namespace uroce::tools
