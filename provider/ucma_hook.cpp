// Redirects librdmacm's imports of open, fstat, write and close to the rdma_cm emulation
// (ucma.h). The redirected functions pass everything that is not an event channel through
// to what librdmacm called before.
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "provider/got_patch.h"
#include "provider/ucma.h"

namespace uroce::provider::ucma {
namespace {

constexpr char kRdmaCmPath[] = "/dev/infiniband/rdma_cm";
// The misc device's numbers as a kernel gives them (major 10, a dynamic minor): librdmacm
// compares them only with what RDMA netlink announced, which uroce never does.
constexpr unsigned kMiscMajor = 10;
constexpr unsigned kRdmaCmMinor = 58;

using OpenFn = int (*)(const char*, int, ...);
using FstatFn = int (*)(int, struct stat*);
using WriteFn = ssize_t (*)(int, const void*, size_t);
using CloseFn = int (*)(int);

std::atomic<void*> g_open{nullptr};
std::atomic<void*> g_fstat{nullptr};
std::atomic<void*> g_write{nullptr};
std::atomic<void*> g_close{nullptr};

template <typename Fn>
Fn next(const std::atomic<void*>& slot) {
    return reinterpret_cast<Fn>(slot.load(std::memory_order_acquire));
}

int hook_open(const char* path, int flags, ...) noexcept {
    mode_t mode = 0;
    if ((flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE) {
        va_list ap;
        va_start(ap, flags);
        mode = static_cast<mode_t>(va_arg(ap, int));
        va_end(ap);
    }
    if (path != nullptr && std::strcmp(path, kRdmaCmPath) == 0) return detail::open_channel();
    const auto fn = next<OpenFn>(g_open);
    return fn != nullptr ? fn(path, flags, mode) : ::open(path, flags, mode);
}

int hook_fstat(int fd, struct stat* st) noexcept {
    const auto fn = next<FstatFn>(g_fstat);
    const int rc = fn != nullptr ? fn(fd, st) : ::fstat(fd, st);
    if (rc == 0 && st != nullptr && detail::is_channel(fd)) {
        // librdmacm accepts only a character device.
        st->st_mode = S_IFCHR | 0666;
        st->st_rdev = makedev(kMiscMajor, kRdmaCmMinor);
    }
    return rc;
}

ssize_t hook_write(int fd, const void* buf, size_t len) noexcept {
    if (fd >= 0 && detail::is_channel(fd)) return detail::handle_write(fd, buf, len);
    const auto fn = next<WriteFn>(g_write);
    return fn != nullptr ? fn(fd, buf, len) : ::write(fd, buf, len);
}

int hook_close(int fd) noexcept {
    if (fd >= 0 && detail::is_channel(fd)) detail::on_close(fd);
    const auto fn = next<CloseFn>(g_close);
    return fn != nullptr ? fn(fd) : ::close(fd);
}

struct Redirect {
    const char* symbol;
    void* replacement;
    std::atomic<void*>* previous;
};

pthread_mutex_t g_install_mutex = PTHREAD_MUTEX_INITIALIZER;
bool g_installed = false;

int install_locked() noexcept {
    got::LoadedObject rdmacm;
    if (got::find_object_by_soname("librdmacm.so", &rdmacm) != 0) return ENOENT;
    const Redirect redirects[] = {
        {"open", reinterpret_cast<void*>(&hook_open), &g_open},
        {"fstat", reinterpret_cast<void*>(&hook_fstat), &g_fstat},
        {"write", reinterpret_cast<void*>(&hook_write), &g_write},
        {"close", reinterpret_cast<void*>(&hook_close), &g_close},
    };
    got::ImportSlots slots[4];
    // Everything is looked up before anything is stored: all four or none.
    for (size_t i = 0; i < 4; ++i) {
        if (const int rc = got::find_import_slots(rdmacm, redirects[i].symbol, &slots[i]); rc != 0)
            return rc;
        if (slots[i].count == 0) return ENOENT;
        void* previous = got::current_target(rdmacm, slots[i], redirects[i].symbol);
        if (previous == nullptr) return ENOENT;
        if (previous == redirects[i].replacement) return 0;  // already ours (another copy)
        redirects[i].previous->store(previous, std::memory_order_release);
    }
    for (size_t i = 0; i < 4; ++i) {
        if (const int rc = got::store_import_slots(rdmacm, slots[i], redirects[i].replacement);
            rc != 0) {
            for (size_t j = 0; j <= i; ++j)
                static_cast<void>(got::store_import_slots(
                    rdmacm, slots[j], redirects[j].previous->load(std::memory_order_acquire)));
            return rc;
        }
    }
    return 0;
}

}  // namespace

int hook_install() noexcept {
    pthread_mutex_lock(&g_install_mutex);
    int rc = 0;
    if (!g_installed) {
        rc = install_locked();
        g_installed = rc == 0;
    }
    pthread_mutex_unlock(&g_install_mutex);
    return rc;
}

}  // namespace uroce::provider::ucma
