// The /dev/infiniband nodes of uroce devices, made inside a private mount namespace
// (rootless_namespace.h) by a user who may not mknod.
//
// What a node must be: libibverbs stats /dev/infiniband/uverbs_uroce_NAME when it lists
// devices, and at ibv_open_device opens it O_RDWR and checks that it is a char device whose
// major:minor equals the device's sysfs `dev`, 1:3. The provider never reads it; the one
// command libibverbs writes to it is answered in-process (comp_channel.h). So the host's own
// /dev/null, bind-mounted onto a file, is such a node, and a bind mount needs no CAP_MKNOD,
// only CAP_SYS_ADMIN in the user namespace that owns the mount namespace. (mknod on a tmpfs
// mounted there would not do: mounts made in a user namespace are nodev.)
//
// Where /dev/infiniband exists, a tmpfs over it holds the nodes; it hides the host's nodes,
// whose devices the command would not see anyway (`uroce run` refuses it RDMA netlink).
// Where it does not (no RDMA driver has made it), no directory can be made in the host's
// /dev, so /dev itself is covered by a tmpfs holding every entry of the host's /dev (bind
// mounts of its nodes, and of its directories with what is mounted under them, such as
// /dev/pts and /dev/shm; copies of its symlinks) and infiniband/.
#pragma once

#include <string>
#include <vector>

namespace uroce::tools {

// Makes /dev/infiniband/uverbs_uroce_NAME for each NAME of `device_names` as above. Call it
// in a private mount namespace only. Returns an empty string on success, else one sentence
// saying what failed.
std::string provide_dev_nodes(const std::vector<std::string>& device_names);

}  // namespace uroce::tools
