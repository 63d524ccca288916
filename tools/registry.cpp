// The uroce device registry; layout and rules are documented in registry.h.
#include "registry.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <system_error>

#include "transport/local_addresses.h"
#include "transport/send_sockets.h"

namespace uroce::registry {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& msg) {
    throw Error(Error::Kind::Failure, msg);
}

std::string errno_text(int err) {
    return std::error_code(err, std::generic_category()).message();
}

bool is_permission_error(int err) {
    return err == EPERM || err == EACCES || err == EROFS;
}

// Sets the umask for the lifetime of the object so that the tree is readable by
// every user (clients need not run as root) whatever the caller's umask is.
class UmaskGuard {
  public:
    explicit UmaskGuard(mode_t mask) : old_(::umask(mask)) {}
    ~UmaskGuard() { ::umask(old_); }
    UmaskGuard(const UmaskGuard&) = delete;
    UmaskGuard& operator=(const UmaskGuard&) = delete;

  private:
    mode_t old_;
};

// An exclusive flock() on ROOT/.lock, so that concurrent `uroce add/del` calls
// see each other's devices.
class RootLock {
  public:
    explicit RootLock(const fs::path& root) {
        const fs::path path = root / ".lock";
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) {
            int err = errno;
            fail(fmt::format("cannot open {}: {}; {}", path.string(), errno_text(err),
                             is_permission_error(err)
                                 ? "run as root or point UROCE_ROOT at a writable directory"
                                 : "check the registry directory"));
        }
        while (::flock(fd_, LOCK_EX) != 0) {
            if (errno != EINTR) {
                int err = errno;
                ::close(fd_);
                fail(fmt::format("cannot lock {}: {}", path.string(), errno_text(err)));
            }
        }
    }
    ~RootLock() { ::close(fd_); }
    RootLock(const RootLock&) = delete;
    RootLock& operator=(const RootLock&) = delete;

  private:
    int fd_ = -1;
};

void make_dirs(const fs::path& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
        fail(fmt::format("cannot create {}: {}; {}", dir.string(), ec.message(),
                         is_permission_error(ec.value())
                             ? "run as root or point UROCE_ROOT at a writable directory"
                             : "check the registry directory"));
    }
}

// Writes `content` + "\n" to a new file (replacing an existing one).
void write_file(const fs::path& path, std::string_view content) {
    std::string data(content);
    data += '\n';
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) fail(fmt::format("cannot create {}: {}", path.string(), errno_text(errno)));
    size_t done = 0;
    while (done < data.size()) {
        ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;
            ::close(fd);
            fail(fmt::format("cannot write {}: {}", path.string(), errno_text(err)));
        }
        done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0)
        fail(fmt::format("cannot write {}: {}", path.string(), errno_text(errno)));
}

// Reads a small file and strips one trailing newline; nullopt if unreadable.
std::optional<std::string> read_file(const fs::path& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    std::string out;
    char buf[256];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            ::close(fd);
            return std::nullopt;
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
        if (out.size() > 4096) break;
    }
    ::close(fd);
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
}

template <typename T>
bool parse_number(std::string_view text, T& out) {
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc() && ptr == text.data() + text.size() && !text.empty();
}

void remove_tree_quietly(const fs::path& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
}

// Renames `path` out of the way (to a dot name libibverbs skips) and deletes it.
void remove_tree(const fs::path& path) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(path, ec))) return;
    fs::path doomed = path.parent_path() / fmt::format(".{}.del.{}", path.filename().string(),
                                                       static_cast<long>(::getpid()));
    remove_tree_quietly(doomed);
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
        fail(fmt::format("cannot remove {}: {}", path.string(), errno_text(errno)));
    }
    fs::remove_all(doomed, ec);
    if (ec) fail(fmt::format("cannot remove {}: {}", doomed.string(), ec.message()));
}

bool is_our_node(const struct stat& st) {
    return S_ISCHR(st.st_mode) && major(st.st_rdev) == kNodeMajor &&
           minor(st.st_rdev) == kNodeMinor;
}

std::string needs_root_message(const fs::path& node, const char* what, int err) {
    return fmt::format(
        "{} {} needs root (CAP_MKNOD): {}; run 'uroce' as root, or have root create it with "
        "'mkdir -p {} && mknod -m 0666 {} c {} {}' and retry",
        what, node.string(), errno_text(err), kDevDir, node.string(), kNodeMajor, kNodeMinor);
}

enum class NodeState { Created, Reused, Absent };

// Makes sure /dev/infiniband/<uverbs name> is char 1:3 with mode 0666. Created means this
// call made it (so that a rollback removes it). Absent (NodeMode::Optional only): the caller
// may not make a usable one, and the device goes without.
NodeState ensure_dev_node(const std::string& name, NodeMode mode,
                          std::vector<std::string>& warnings) {
    const bool optional = mode == NodeMode::Optional;
    const fs::path dir(kDevDir);
    const fs::path node = dev_node_path(name);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        int err = errno;
        if (is_permission_error(err)) {
            if (optional) return NodeState::Absent;
            fail(needs_root_message(node, "creating", err));
        }
        fail(fmt::format("cannot create {}: {}", dir.string(), errno_text(err)));
    }
    struct stat st {};
    if (::lstat(node.c_str(), &st) == 0) {
        if (!is_our_node(st)) {
            // Another's file by that name; a private namespace hides it from `uroce run`.
            if (optional) return NodeState::Absent;
            fail(fmt::format("{} exists but is not char device {}:{}; remove it and retry",
                             node.string(), kNodeMajor, kNodeMinor));
        }
        if ((st.st_mode & 07777) != 0666 && ::chmod(node.c_str(), 0666) != 0) {
            if (optional) return dev_node_usable(name) ? NodeState::Reused : NodeState::Absent;
            warnings.push_back(fmt::format(
                "{} has mode {:04o} and could not be made 0666 ({}); non-root clients may "
                "fail to open the device",
                node.string(), st.st_mode & 07777, errno_text(errno)));
        }
        return NodeState::Reused;
    }
    if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(kNodeMajor, kNodeMinor)) != 0) {
        int err = errno;
        if (is_permission_error(err)) {
            if (optional) return NodeState::Absent;
            fail(needs_root_message(node, "creating", err));
        }
        fail(fmt::format("cannot create {}: {}", node.string(), errno_text(err)));
    }
    // mknod() honours the umask.
    if (::chmod(node.c_str(), 0666) != 0) {
        int err = errno;
        ::unlink(node.c_str());
        fail(fmt::format("cannot chmod {}: {}", node.string(), errno_text(err)));
    }
    return NodeState::Created;
}

// Warns when the address is not local: the provider could not bind it.
void check_address_is_local(const IpAddress& ip, std::vector<std::string>& warnings) {
    if (!transport::is_local_address(ip))
        warnings.push_back(fmt::format(
            "{} is not an address of this host; the device is registered, but the provider "
            "cannot use it until the address is configured on an interface",
            format_ip(ip)));
}

}  // namespace

namespace {

// Name prefixes other providers of libibverbs claim or that name kernel RDMA devices. rxe and
// siw match devices by name prefix: libibverbs would hand a uroce device called "rxe0" to the
// rxe provider. The hardware drivers' conventional names would only mislead.
constexpr std::string_view kClaimedPrefixes[] = {
    "rxe",   "siw", "mlx4",  "mlx5", "mthca",  "hfi1", "qib",        "bnxt_re", "efa",   "irdma",
    "i40iw", "hns", "erdma", "mana", "ocrdma", "qedr", "vmw_pvrdma", "cxgb4",   "usnic", "ipath",
};

}  // namespace

std::string check_name(std::string_view name) {
    if (name.empty()) return "device name must not be empty";
    for (std::string_view prefix : kClaimedPrefixes) {
        if (name.substr(0, prefix.size()) == prefix) {
            return fmt::format(
                "device name '{}' starts with '{}', which another RDMA provider or kernel driver "
                "uses for its devices (libibverbs could hand it to that provider); choose another "
                "name",
                name, prefix);
        }
    }
    if (name.size() > kMaxNameLen) {
        return fmt::format("device name '{}' is longer than {} characters; use a shorter name",
                           name, kMaxNameLen);
    }
    for (char c : name) {
        bool ok =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        if (!ok) {
            return fmt::format(
                "device name '{}' may only contain letters, digits and '_' (1 to {} characters)",
                name, kMaxNameLen);
        }
    }
    return {};
}

std::string check_mtu(int mtu) {
    if (std::find(kValidMtus.begin(), kValidMtus.end(), mtu) != kValidMtus.end()) return {};
    return fmt::format("MTU {} is not supported; use one of 256, 512, 1024, 2048, 4096", mtu);
}

std::string parse_ip(std::string_view text, IpAddress& out) {
    const std::string s(text);
    const auto parsed = IpAddress::parse(s);
    if (!parsed) {
        return fmt::format(
            "'{}' is not a valid IP address; use dotted-quad IPv4 such as 127.0.0.1 or IPv6 such "
            "as ::1",
            s);
    }
    const IpAddress ip = *parsed;
    if (ip.is_v4() && s.find(':') != std::string::npos) {
        return fmt::format(
            "{} is an IPv4-mapped IPv6 address; give the IPv4 address itself, such as {}", s,
            ip.to_string());
    }
    if (ip.is_unspecified()) {
        return fmt::format(
            "{} cannot be a device address; use the address of a local interface such as "
            "127.0.0.1 or ::1",
            s);
    }
    if (ip.is_v4() && (ip.v4() >> 24) >= 224) {
        return fmt::format(
            "{} is a multicast, broadcast or reserved address; use a unicast address of a local "
            "interface",
            s);
    }
    if (!ip.is_v4() && ip.is_multicast()) {
        return fmt::format("{} is a multicast address; use a unicast address of a local interface",
                           s);
    }
    if (!ip.is_v4() && ip.bytes()[0] == 0xfe && (ip.bytes()[1] & 0xc0) == 0x80) {
        return fmt::format(
            "{} is a link-local IPv6 address, which names no interface by itself; use a global "
            "or unique-local address (fd00::/8) of a local interface, or ::1",
            s);
    }
    out = ip;
    return {};
}

std::string format_ip(const IpAddress& ip) {
    return ip.to_string();
}

std::string format_endpoint(const IpAddress& ip, uint16_t port) {
    return ip.is_v4() ? fmt::format("{}:{}", ip.to_string(), port)
                      : fmt::format("[{}]:{}", ip.to_string(), port);
}

uint64_t node_guid_for(const IpAddress& ip, uint16_t port) {
    const auto& b = ip.bytes();
    const uint64_t kind = ip.is_v4() ? 0x02 : 0x06;
    return (kind << 56) | (uint64_t{b[12]} << 40) | (uint64_t{b[13]} << 32) |
           (uint64_t{b[14]} << 24) | (uint64_t{b[15]} << 16) | port;
}

std::string format_guid(uint64_t guid) {
    return fmt::format("{:04x}:{:04x}:{:04x}:{:04x}", (guid >> 48) & 0xffff, (guid >> 32) & 0xffff,
                       (guid >> 16) & 0xffff, guid & 0xffff);
}

std::string format_gid_sysfs(const IpAddress& ip) {
    const auto& b = ip.bytes();
    std::string out;
    for (size_t i = 0; i < b.size(); i += 2)
        out += fmt::format("{}{:02x}{:02x}", i ? ":" : "", b[i], b[i + 1]);
    return out;
}

std::string format_gid_short(const IpAddress& ip) {
    return ip.is_v4() ? "::ffff:" + ip.to_string() : ip.to_string();
}

std::string uverbs_name(std::string_view device_name) {
    return std::string(kUverbsPrefix) + std::string(device_name);
}

fs::path dev_node_path(std::string_view device_name) {
    return fs::path(kDevDir) / uverbs_name(device_name);
}

bool dev_node_usable(std::string_view device_name) {
    const fs::path node = dev_node_path(device_name);
    struct stat st {};
    return ::lstat(node.c_str(), &st) == 0 && is_our_node(st) &&
           ::faccessat(AT_FDCWD, node.c_str(), R_OK | W_OK, AT_EACCESS) == 0;
}

std::string missing_node_warning(std::string_view device_name) {
    const std::string node = dev_node_path(device_name).string();
    return fmt::format("device '{}': {} is missing; create it with 'mknod -m 0666 {} c {} {}'",
                       device_name, node, node, kNodeMajor, kNodeMinor);
}

namespace {

// An environment variable holding an absolute path, else nullopt.
std::optional<fs::path> absolute_env_path(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || value[0] != '/') return std::nullopt;
    return fs::path(value);
}

}  // namespace

fs::path private_default_root() {
    // The XDG runtime directory is the user's own (mode 0700) and lives as long as the
    // user's session, as /run/uroce lives as long as the boot.
    if (auto dir = absolute_env_path("XDG_RUNTIME_DIR")) return *dir / "uroce";
    if (auto home = absolute_env_path("HOME")) return *home / ".cache" / "uroce";
    return {};
}

fs::path root_from_env() {
    const char* env = std::getenv("UROCE_ROOT");
    fs::path root;
    if (env != nullptr && *env != '\0') {
        root = env;
    } else if (::geteuid() != 0 && !private_default_root().empty()) {
        root = private_default_root();
    } else {
        root = kDefaultRoot;
    }
    root = fs::absolute(root).lexically_normal();
    // "/a/b/" normalises to "/a/b/" (empty filename); drop it so SYSFS_PATH is clean.
    if (root.has_relative_path() && !root.has_filename()) root = root.parent_path();
    return root;
}

Registry::Registry(fs::path root) : root_(std::move(root)) {}

fs::path Registry::verbs_class() const {
    return root_ / "sys" / "class" / "infiniband_verbs";
}
fs::path Registry::ib_class() const {
    return root_ / "sys" / "class" / "infiniband";
}

std::vector<std::string> Registry::add(const DeviceConfig& cfg, NodeMode nodes) {
    if (auto msg = check_name(cfg.name); !msg.empty()) throw Error(Error::Kind::Usage, msg);
    if (auto msg = check_mtu(cfg.mtu); !msg.empty()) throw Error(Error::Kind::Usage, msg);
    if (cfg.port == 0) throw Error(Error::Kind::Usage, "UDP port must be in 1..65535");
    // A device listening on one of the QPs' source ports would share it (SO_REUSEPORT) with
    // sockets that only send, and could lose datagrams to them.
    if (cfg.port >= transport::kSourcePortBase &&
        cfg.port < transport::kSourcePortBase + transport::kSourcePorts) {
        throw Error(Error::Kind::Usage,
                    fmt::format("UDP port {} is one of the source ports uroce's QPs send from "
                                "({}..{}); choose another --port (RoCEv2's is 4791)",
                                cfg.port, transport::kSourcePortBase,
                                transport::kSourcePortBase + transport::kSourcePorts - 1));
    }

    UmaskGuard umask_guard(022);
    make_dirs(root_);
    RootLock lock(root_);
    make_dirs(verbs_class());
    make_dirs(ib_class());

    const std::string uverbs = uverbs_name(cfg.name);
    const fs::path ib_dir = ib_class() / cfg.name;
    const fs::path verbs_dir = verbs_class() / uverbs;
    std::error_code ec;
    if (fs::exists(fs::symlink_status(ib_dir, ec)) ||
        fs::exists(fs::symlink_status(verbs_dir, ec))) {
        fail(
            fmt::format("device '{}' already exists in {}; pick another name or remove it with "
                        "'uroce del {}'",
                        cfg.name, root_.string(), cfg.name));
    }
    for (const auto& dev : list()) {
        if (dev.config.ip == cfg.ip && dev.config.port == cfg.port) {
            fail(
                fmt::format("device '{}' already uses {}; choose another --ip or --port, or "
                            "remove it with 'uroce del {}'",
                            dev.config.name, format_endpoint(cfg.ip, cfg.port), dev.config.name));
        }
    }

    std::vector<std::string> warnings;
    check_address_is_local(cfg.ip, warnings);

    const fs::path abi = verbs_class() / "abi_version";
    if (read_file(abi) != "6") write_file(abi, "6");
    // librdmacm reads the rdma_cm device's ABI version (4, today's kernels') from here; the
    // RDMA CM's port tables live beside the registry, writable by every user (sticky, as
    // /tmp), since any process may bind ports.
    const fs::path cm_class = root_ / "sys" / "class" / "misc" / "rdma_cm";
    make_dirs(cm_class);
    if (read_file(cm_class / "abi_version") != "4") write_file(cm_class / "abi_version", "4");
    make_dirs(root_ / "rdma_cm");
    ::chmod((root_ / "rdma_cm").c_str(), 01777);

    // Everything is built under dot names (libibverbs skips those) and renamed
    // into place; the infiniband_verbs entry, which makes the device visible,
    // comes last.
    const fs::path ib_stage = ib_class() / fmt::format(".{}.new", cfg.name);
    const fs::path verbs_stage = verbs_class() / fmt::format(".{}.new", uverbs);
    bool ib_done = false;
    bool node_created = false;
    try {
        remove_tree_quietly(ib_stage);
        const std::string guid = format_guid(node_guid_for(cfg.ip, cfg.port));
        const fs::path port_dir = ib_stage / "ports" / "1";
        make_dirs(port_dir / "gids");
        make_dirs(port_dir / "gid_attrs" / "types");
        make_dirs(port_dir / "pkeys");
        make_dirs(ib_stage / "uroce");
        write_file(ib_stage / "node_type", "1: CA");
        write_file(ib_stage / "node_guid", guid);
        write_file(ib_stage / "sys_image_guid", guid);
        write_file(ib_stage / "fw_ver", "0.1.0");
        write_file(ib_stage / "board_id", "uroce");
        write_file(ib_stage / "hca_type", "uroce");
        write_file(port_dir / "gids" / "0", format_gid_sysfs(cfg.ip));
        write_file(port_dir / "gid_attrs" / "types" / "0", "RoCE v2");
        write_file(port_dir / "pkeys" / "0", "0xffff");
        write_file(ib_stage / "uroce" / (cfg.ip.is_v4() ? "ipv4" : "ipv6"), format_ip(cfg.ip));
        write_file(ib_stage / "uroce" / "udp_port", std::to_string(cfg.port));
        write_file(ib_stage / "uroce" / "mtu", std::to_string(cfg.mtu));
        if (::rename(ib_stage.c_str(), ib_dir.c_str()) != 0) {
            fail(fmt::format("cannot create {}: {}", ib_dir.string(), errno_text(errno)));
        }
        ib_done = true;

        node_created = ensure_dev_node(cfg.name, nodes, warnings) == NodeState::Created;

        remove_tree_quietly(verbs_stage);
        make_dirs(verbs_stage);
        write_file(verbs_stage / "ibdev", cfg.name);
        write_file(verbs_stage / "dev", fmt::format("{}:{}", kNodeMajor, kNodeMinor));
        write_file(verbs_stage / "abi_version", "1");
        if (::rename(verbs_stage.c_str(), verbs_dir.c_str()) != 0) {
            fail(fmt::format("cannot create {}: {}", verbs_dir.string(), errno_text(errno)));
        }
    } catch (...) {
        remove_tree_quietly(verbs_stage);
        if (node_created) ::unlink(dev_node_path(cfg.name).c_str());
        if (ib_done) remove_tree_quietly(ib_dir);
        remove_tree_quietly(ib_stage);
        throw;
    }
    return warnings;
}

void Registry::del(const std::string& name, NodeMode nodes) {
    if (auto msg = check_name(name); !msg.empty()) throw Error(Error::Kind::Usage, msg);
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) {
        fail(
            fmt::format("no device '{}' in {} (the registry is empty); 'uroce list' shows the "
                        "registered devices",
                        name, root_.string()));
    }
    RootLock lock(root_);
    const fs::path ib_dir = ib_class() / name;
    const fs::path verbs_dir = verbs_class() / uverbs_name(name);
    if (!fs::exists(fs::symlink_status(ib_dir, ec)) &&
        !fs::exists(fs::symlink_status(verbs_dir, ec))) {
        fail(fmt::format("no device '{}' in {}; 'uroce list' shows the registered devices", name,
                         root_.string()));
    }
    // The node first: if that needs root, the registry is left untouched. A node the caller
    // may not remove is root's (made for a device of the same name in another registry) and
    // no concern of a registry without nodes.
    const fs::path node = dev_node_path(name);
    struct stat st {};
    if (::lstat(node.c_str(), &st) == 0 && is_our_node(st) && ::unlink(node.c_str()) != 0 &&
        errno != ENOENT && !(nodes == NodeMode::Optional && is_permission_error(errno))) {
        int err = errno;
        if (is_permission_error(err)) {
            fail(fmt::format("removing {} needs root: {}; run 'uroce del {}' as root",
                             node.string(), errno_text(err), name));
        }
        fail(fmt::format("cannot remove {}: {}", node.string(), errno_text(err)));
    }
    remove_tree(verbs_dir);
    remove_tree(ib_dir);
}

std::vector<DeviceInfo> Registry::list(std::vector<std::string>* warnings) const {
    std::vector<DeviceInfo> out;
    std::error_code ec;
    fs::directory_iterator it(ib_class(), ec);
    if (ec) return out;
    for (const auto& entry : it) {
        const std::string name = entry.path().filename().string();
        if (name.empty() || name[0] == '.') continue;
        const fs::path dir = entry.path();
        if (!fs::is_directory(dir / "uroce", ec)) continue;  // not one of ours
        auto warn = [&](const std::string& why) {
            if (warnings != nullptr) {
                warnings->push_back(
                    fmt::format("skipping device '{}' in {}: {}; remove it with "
                                "'uroce del {}'",
                                name, root_.string(), why, name));
            }
        };
        DeviceInfo info;
        info.config.name = name;
        const bool v4 = fs::exists(dir / "uroce" / "ipv4", ec);
        const char* ip_file = v4 ? "ipv4" : "ipv6";
        auto ip = read_file(dir / "uroce" / ip_file);
        auto port = read_file(dir / "uroce" / "udp_port");
        auto mtu = read_file(dir / "uroce" / "mtu");
        auto guid = read_file(dir / "node_guid");
        if (!ip || !port || !mtu || !guid) {
            warn("incomplete entry");
            continue;
        }
        if (!parse_ip(*ip, info.config.ip).empty() || info.config.ip.is_v4() != v4) {
            warn(fmt::format("bad uroce/{} '{}'", ip_file, *ip));
            continue;
        }
        if (!parse_number(*port, info.config.port) || info.config.port == 0) {
            warn(fmt::format("bad uroce/udp_port '{}'", *port));
            continue;
        }
        if (!parse_number(*mtu, info.config.mtu) || !check_mtu(info.config.mtu).empty()) {
            warn(fmt::format("bad uroce/mtu '{}'", *mtu));
            continue;
        }
        info.node_guid = *guid;
        if (warnings != nullptr && !fs::is_directory(verbs_class() / uverbs_name(name), ec)) {
            warnings->push_back(
                fmt::format("device '{}': {} is missing, libibverbs will not see it; re-add it",
                            name, (verbs_class() / uverbs_name(name)).string()));
        }
        out.push_back(std::move(info));
    }
    std::sort(out.begin(), out.end(), [](const DeviceInfo& a, const DeviceInfo& b) {
        return a.config.name < b.config.name;
    });
    return out;
}

}  // namespace uroce::registry
