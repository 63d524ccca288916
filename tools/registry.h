// The uroce device registry: a fake sysfs tree plus one char node per device.
//
// libibverbs 44 on a host without RDMA netlink discovers devices by scanning
// $SYSFS_PATH/class/infiniband_verbs and then needs /dev/infiniband/<uverbs name>
// to stat and open. `uroce add` writes what it reads (init.c setup_sysfs_dev,
// device.c ibv_get_device_guid, cmd_device.c GID fallback, verbs.c ibv_query_pkey):
//
//   ROOT/sys/class/infiniband_verbs/abi_version                    "6"
//   ROOT/sys/class/infiniband_verbs/uverbs_uroce_NAME/ibdev        "NAME"
//   ROOT/sys/class/infiniband_verbs/uverbs_uroce_NAME/dev          "1:3"
//   ROOT/sys/class/infiniband_verbs/uverbs_uroce_NAME/abi_version  "1"
//   ROOT/sys/class/infiniband/NAME/node_type                       "1: CA"
//   ROOT/sys/class/infiniband/NAME/node_guid                       "0200:7f00:0001:12b7"
//   ROOT/sys/class/infiniband/NAME/sys_image_guid                  same as node_guid
//   ROOT/sys/class/infiniband/NAME/fw_ver                          "0.1.0"
//   ROOT/sys/class/infiniband/NAME/board_id                        "uroce"
//   ROOT/sys/class/infiniband/NAME/hca_type                        "uroce"
//   ROOT/sys/class/infiniband/NAME/ports/1/gids/0                  IPv4-mapped GID
//   ROOT/sys/class/infiniband/NAME/ports/1/gid_attrs/types/0       "RoCE v2"
//   ROOT/sys/class/infiniband/NAME/ports/1/pkeys/0                 "0xffff"
//   ROOT/sys/class/infiniband/NAME/uroce/ipv4 (or ipv6)            "a.b.c.d" (or "::1")
//   ROOT/sys/class/infiniband/NAME/uroce/udp_port                  "4791"
//   ROOT/sys/class/infiniband/NAME/uroce/mtu                       "1024"
//   /dev/infiniband/uverbs_uroce_NAME                              char 1:3 (like /dev/null), 0666
//
// Every file ends with "\n" (libibverbs reads each with one read()). The GID
// table has exactly one entry (index 0). There is deliberately no
// gid_attrs/ndevs/ directory: libibverbs would try to resolve a netdev name.
//
// ROOT is $UROCE_ROOT, or when that is unset or empty: /run/uroce for root, and for other
// users a registry of their own, $XDG_RUNTIME_DIR/uroce (else ~/.cache/uroce), since they
// cannot write /run. SYSFS_PATH for the clients is ROOT/sys.
//
// Device names: [A-Za-z0-9_]{1,31}. '-' and '.' are not allowed, which keeps
// names safe as path components and as fnmatch() subjects, and keeps
// "uverbs_uroce_NAME" well within libibverbs' 64-byte name buffers.
//
// Node GUID: 8 bytes, big-endian, derived from the IPv4 address a.b.c.d and the
// UDP port p (so that two devices sharing an address on different ports differ):
//
//     02 00 a b c d p_hi p_lo          e.g. 127.0.0.1:4791 -> 0200:7f00:0001:12b7
//
// Byte 0 = 0x02 sets the EUI-64 universal/local bit (locally administered) and
// leaves the individual/group bit clear. Byte 1 is reserved (0). The same value
// is written as sys_image_guid. The provider should read node_guid from sysfs
// rather than re-derive it; node_guid_for() is the reference derivation.
//
// The /dev node is shared by every registry root on the host (libibverbs has
// /dev/infiniband compiled in), so two roots holding a device of the same name
// share one node; `del` in either removes it. Only root can make it: a user without
// that privilege registers devices without nodes (NodeMode::Optional), and `uroce run`
// gives its command the nodes in a private namespace (private_dev.h).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "uroce/ip_address.h"

namespace uroce::registry {

inline constexpr std::string_view kDefaultRoot = "/run/uroce";
inline constexpr std::string_view kDevDir = "/dev/infiniband";
inline constexpr std::string_view kUverbsPrefix = "uverbs_uroce_";
inline constexpr size_t kMaxNameLen = 31;
inline constexpr uint16_t kDefaultPort = 4791;
inline constexpr int kDefaultMtu = 1024;
inline constexpr std::array<int, 5> kValidMtus = {256, 512, 1024, 2048, 4096};
// The char device every node is made as (same as /dev/null).
inline constexpr unsigned kNodeMajor = 1;
inline constexpr unsigned kNodeMinor = 3;

struct DeviceConfig {
    std::string name;
    IpAddress ip;  // IPv4 or IPv6
    uint16_t port = kDefaultPort;
    int mtu = kDefaultMtu;
};

// What `add` and `del` do when the caller may not make or remove /dev nodes.
// Required: fail, saying root is needed (root's registry: nodes are how clients open
// devices). Optional: register the device without a node, and leave alone a node that
// cannot be removed (an unprivileged user's registry: `uroce run` supplies the nodes).
enum class NodeMode { Required, Optional };

struct DeviceInfo {
    DeviceConfig config;
    std::string node_guid;  // as stored in sysfs, "xxxx:xxxx:xxxx:xxxx"
};

// Kind::Usage means the user's arguments are wrong (exit 2); Kind::Failure is
// anything else (exit 1). what() is a full sentence saying what to do.
class Error : public std::runtime_error {
  public:
    enum class Kind { Usage, Failure };
    Error(Kind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
    Kind kind() const { return kind_; }

  private:
    Kind kind_;
};

// Validators return an empty string when the value is fine, else a message.
std::string check_name(std::string_view name);
std::string check_mtu(int mtu);
// Parses a device address: dotted-quad IPv4 or IPv6. Unusable addresses (0.0.0.0, ::,
// multicast, 255.255.255.255, link-local IPv6, which needs an interface) get their own
// message.
std::string parse_ip(std::string_view text, IpAddress& out);

std::string format_ip(const IpAddress& ip);                       // "127.0.0.1", "::1"
std::string format_endpoint(const IpAddress& ip, uint16_t port);  // "127.0.0.1:4791", "[::1]:4791"
// 02 (IPv4) or 06 (IPv6), the address's last four bytes, the port.
uint64_t node_guid_for(const IpAddress& ip, uint16_t port);
std::string format_guid(uint64_t guid);                 // "0200:7f00:0001:12b7"
std::string format_gid_sysfs(const IpAddress& ip);      // "0000:...:ffff:7f00:0001"
std::string format_gid_short(const IpAddress& ip);      // "::ffff:127.0.0.1", "::1"
std::string uverbs_name(std::string_view device_name);  // "uverbs_uroce_NAME"
std::filesystem::path dev_node_path(std::string_view device_name);
// The device's node is char 1:3 and the caller may open it for reading and writing, as
// libibverbs does.
bool dev_node_usable(std::string_view device_name);
// The warning for a device whose node is missing, with the command that makes it.
std::string missing_node_warning(std::string_view device_name);

// The registry root from the environment, made absolute (not required to exist).
std::filesystem::path root_from_env();
// The registry root of a user other than root when UROCE_ROOT is unset:
// $XDG_RUNTIME_DIR/uroce, else $HOME/.cache/uroce; empty if neither variable holds an
// absolute path.
std::filesystem::path private_default_root();

class Registry {
  public:
    explicit Registry(std::filesystem::path root);

    const std::filesystem::path& root() const { return root_; }
    std::filesystem::path sysfs_path() const { return root_ / "sys"; }

    // Adds a device; on any failure nothing of it is left behind.
    // Returns warnings (e.g. the address is not local) for the caller to print.
    std::vector<std::string> add(const DeviceConfig& cfg, NodeMode nodes = NodeMode::Required);
    // Removes the device's tree and its /dev node.
    void del(const std::string& name, NodeMode nodes = NodeMode::Required);
    // All registered devices, sorted by name. Malformed entries are skipped and
    // reported through `warnings`, as are devices without an infiniband_verbs
    // entry; missing /dev nodes are the caller's to report (missing_node_warning).
    std::vector<DeviceInfo> list(std::vector<std::string>* warnings = nullptr) const;

  private:
    std::filesystem::path verbs_class() const;
    std::filesystem::path ib_class() const;

    std::filesystem::path root_;
};

}  // namespace uroce::registry
