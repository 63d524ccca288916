// Entering a user and mount namespace without root; see rootless_namespace.h.
#include "rootless_namespace.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <string_view>
#include <system_error>

namespace uroce::tools {

namespace {

std::string errno_text(int err) {
    return std::error_code(err, std::generic_category()).message();
}

// The reason unshare(CLONE_NEWUSER) gave `err`, with the way past it.
std::string unshare_failure(int err) {
    switch (err) {
        case EPERM:
            return fmt::format(
                "this host forbids user namespaces to unprivileged users (unshare: {}; "
                "kernel.unprivileged_userns_clone=0, or a seccomp profile such as a "
                "container's); run as root, or allow them with 'sysctl -w "
                "kernel.unprivileged_userns_clone=1' where that setting exists",
                errno_text(err));
        case ENOSPC:
            return fmt::format(
                "this host allows no more user namespaces (unshare: {}; user.max_user_namespaces "
                "is 0 or reached); run as root, or raise it with 'sysctl -w "
                "user.max_user_namespaces=10000'",
                errno_text(err));
        case EINVAL:
            return fmt::format(
                "this kernel has no user namespaces or refuses one to this process (unshare: {}); "
                "run as root",
                errno_text(err));
        default:
            return fmt::format("cannot create a user namespace (unshare: {}); run as root",
                               errno_text(err));
    }
}

// Writes `text` to a /proc/self file in one write(), as the kernel requires for id maps.
int write_proc_file(const char* path, std::string_view text) {
    const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const ssize_t n = ::write(fd, text.data(), text.size());
    const int err = n < 0 ? errno : (static_cast<size_t>(n) != text.size() ? EIO : 0);
    ::close(fd);
    return err;
}

}  // namespace

std::string namespace_mount_failure(const std::string& what, int err) {
    if (err == EPERM || err == EACCES) {
        return fmt::format(
            "this host forbids mounts in an unprivileged user namespace ({}: {}; AppArmor's "
            "kernel.apparmor_restrict_unprivileged_userns=1 does so); run as root, or allow it "
            "with 'sysctl -w kernel.apparmor_restrict_unprivileged_userns=0'",
            what, errno_text(err));
    }
    return fmt::format("cannot mount in the private namespace ({}: {}); run as root", what,
                       errno_text(err));
}

std::string enter_user_mount_namespace() {
    // Taken before unshare(): inside, until the maps are written, both read as the overflow
    // ids.
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return unshare_failure(errno);
    // An unprivileged process may map only its own ids, and its gid only once it has given up
    // setgroups(2) (which could otherwise drop a group that denies it access).
    if (int err = write_proc_file("/proc/self/setgroups", "deny"); err != 0) {
        return fmt::format(
            "cannot set up the user namespace (/proc/self/setgroups: {}); run as root",
            errno_text(err));
    }
    if (int err = write_proc_file("/proc/self/gid_map", fmt::format("{} {} 1", gid, gid));
        err != 0) {
        return fmt::format(
            "cannot map gid {} into the user namespace (/proc/self/gid_map: {}); "
            "run as root",
            gid, errno_text(err));
    }
    if (int err = write_proc_file("/proc/self/uid_map", fmt::format("{} {} 1", uid, uid));
        err != 0) {
        return fmt::format(
            "cannot map uid {} into the user namespace (/proc/self/uid_map: {}); "
            "run as root",
            uid, errno_text(err));
    }
    // The copied mounts may still receive events from the host's (a namespace of a less
    // privileged user gets them as slaves); ours must reach no one and hear from no one.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
        return namespace_mount_failure("making / private", errno);
    }
    return {};
}

std::string user_namespace_refusal() {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
        return fmt::format("cannot probe user namespaces (pipe: {})", errno_text(errno));
    }
    const pid_t child = ::fork();
    if (child < 0) {
        const int err = errno;
        ::close(pipe_fds[0]);
        ::close(pipe_fds[1]);
        return fmt::format("cannot probe user namespaces (fork: {})", errno_text(err));
    }
    if (child == 0) {
        // uroce is single-threaded, so the child may allocate. It reports through the pipe
        // and _exit()s: nothing of the parent's (stdio buffers, atexit) runs twice.
        ::close(pipe_fds[0]);
        std::string reason = enter_user_mount_namespace();
        if (reason.empty() &&
            ::mount("uroce", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755") != 0) {
            reason = namespace_mount_failure("mounting a tmpfs", errno);
        }
        size_t done = 0;
        while (done < reason.size()) {
            const ssize_t n = ::write(pipe_fds[1], reason.data() + done, reason.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            done += static_cast<size_t>(n);
        }
        ::_exit(0);
    }
    ::close(pipe_fds[1]);
    std::string reason;
    char buf[512];
    for (;;) {
        const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        reason.append(buf, static_cast<size_t>(n));
    }
    ::close(pipe_fds[0]);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (reason.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        return "the user namespace probe died; run as root";
    }
    return reason;
}

}  // namespace uroce::tools
