// The /dev/infiniband nodes in a private mount namespace; see private_dev.h.
#include "private_dev.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <climits>
#include <filesystem>
#include <system_error>

#include "registry.h"
#include "rootless_namespace.h"

namespace uroce::tools {

namespace fs = std::filesystem;
namespace reg = uroce::registry;

namespace {

constexpr const char* kDev = "/dev";
constexpr const char* kNull = "/dev/null";
// Mount flags of the tmpfs mounts: nothing on them is meant to be run or to raise privileges.
constexpr unsigned long kTmpfsFlags = MS_NOSUID | MS_NOEXEC;

std::string errno_text(int err) {
    return std::error_code(err, std::generic_category()).message();
}

// An fd that closes itself.
class Fd {
  public:
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }

  private:
    int fd_;
};

std::string mount_tmpfs(const char* where) {
    if (::mount("uroce", where, "tmpfs", kTmpfsFlags, "mode=0755") != 0) {
        return namespace_mount_failure(fmt::format("mounting a tmpfs on {}", where), errno);
    }
    return {};
}

// An empty file at `path` to bind-mount a non-directory onto (a mount point must have the
// type of what is mounted on it).
int make_mount_point_file(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    ::close(fd);
    return 0;
}

// Bind-mounts `source`, with everything mounted under it, onto `target`.
std::string bind_mount(const std::string& source, const fs::path& target) {
    if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        return namespace_mount_failure(
            fmt::format("bind-mounting {} on {}", source, target.string()), errno);
    }
    return {};
}

// Puts entry `name` of the old /dev (open as `old_dev`, now covered) into the new one.
std::string mirror_entry(int old_dev, const std::string& name) {
    struct stat st {};
    if (::fstatat(old_dev, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        // Gone since the listing (a device unplugged): nothing to mirror.
        if (errno == ENOENT) return {};
        return fmt::format("cannot set up /dev in the private namespace (/dev/{}: {})", name,
                           errno_text(errno));
    }
    const fs::path target = fs::path(kDev) / name;
    if (S_ISLNK(st.st_mode)) {
        std::string link(PATH_MAX, '\0');
        const ssize_t n = ::readlinkat(old_dev, name.c_str(), link.data(), link.size());
        if (n < 0 ||
            ::symlink(link.substr(0, static_cast<size_t>(n)).c_str(), target.c_str()) != 0) {
            return fmt::format("cannot set up /dev in the private namespace (symlink /dev/{}: {})",
                               name, errno_text(errno));
        }
        return {};
    }
    const int err = S_ISDIR(st.st_mode) ? (::mkdir(target.c_str(), 0755) == 0 ? 0 : errno)
                                        : make_mount_point_file(target);
    if (err != 0) {
        return fmt::format("cannot set up /dev in the private namespace ({}: {})", target.string(),
                           errno_text(err));
    }
    // The covered directory is still reachable through its fd, and a path through
    // /proc/self/fd crosses the mounts under it (/dev/pts, /dev/shm) as any path does.
    return bind_mount(fmt::format("/proc/self/fd/{}/{}", old_dev, name), target);
}

// Covers /dev with a tmpfs holding what the host's /dev holds, and an empty infiniband/.
std::string rebuild_dev() {
    const Fd old_dev(::open(kDev, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (old_dev.get() < 0) {
        return fmt::format("cannot set up /dev in the private namespace (/dev: {})",
                           errno_text(errno));
    }
    if (auto failure = mount_tmpfs(kDev); !failure.empty()) return failure;
    // A copy of the fd for the listing, close-on-exec as the original: none may reach the
    // command.
    DIR* dir = ::fdopendir(::fcntl(old_dev.get(), F_DUPFD_CLOEXEC, 0));
    if (dir == nullptr) {
        return fmt::format("cannot set up /dev in the private namespace (listing /dev: {})",
                           errno_text(errno));
    }
    std::string failure;
    while (failure.empty()) {
        errno = 0;
        const dirent* entry = ::readdir(dir);
        if (entry == nullptr) {
            if (errno != 0) {
                failure =
                    fmt::format("cannot set up /dev in the private namespace (listing /dev: {})",
                                errno_text(errno));
            }
            break;
        }
        const std::string name = entry->d_name;
        if (name == "." || name == ".." || name == "infiniband") continue;
        failure = mirror_entry(old_dev.get(), name);
    }
    ::closedir(dir);
    if (!failure.empty()) return failure;
    if (::mkdir((fs::path(kDev) / "infiniband").c_str(), 0755) != 0) {
        return fmt::format("cannot set up /dev in the private namespace (/dev/infiniband: {})",
                           errno_text(errno));
    }
    return {};
}

}  // namespace

std::string provide_dev_nodes(const std::vector<std::string>& device_names) {
    struct stat null_st {};
    if (::stat(kNull, &null_st) != 0 || !S_ISCHR(null_st.st_mode) ||
        major(null_st.st_rdev) != reg::kNodeMajor || minor(null_st.st_rdev) != reg::kNodeMinor) {
        return fmt::format("{} is not char device {}:{}, which the device nodes are made of", kNull,
                           reg::kNodeMajor, reg::kNodeMinor);
    }
    std::error_code ec;
    const std::string failure = fs::is_directory(reg::kDevDir, ec)
                                    ? mount_tmpfs(std::string(reg::kDevDir).c_str())
                                    : rebuild_dev();
    if (!failure.empty()) return failure;
    for (const auto& name : device_names) {
        const fs::path node = reg::dev_node_path(name);
        if (int err = make_mount_point_file(node); err != 0) {
            return fmt::format("cannot create {} in the private namespace: {}", node.string(),
                               errno_text(err));
        }
        if (auto bound = bind_mount(kNull, node); !bound.empty()) return bound;
    }
    return {};
}

}  // namespace uroce::tools
