// The registry of cmd_fds and channels, and the handler that replaces libibverbs' import of
// write so that ibv_create_comp_channel gets a channel fd. See comp_channel.h.
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/ib_user_verbs.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "provider/comp_channel.h"
#include "provider/got_patch.h"

namespace uroce::provider {
namespace {

// ---- registry ---------------------------------------------------------------------------

// The file behind an fd number when it was registered: a number the app closes and reuses
// names another file.
struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    bool operator==(const FileId&) const = default;
};

bool file_id(int fd, FileId* out) noexcept {
    const int saved = errno;
    struct stat st {};
    const bool ok = fstat(fd, &st) == 0;
    errno = saved;
    if (ok) *out = FileId{st.st_dev, st.st_ino};
    return ok;
}

struct Registry {
    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    std::unordered_map<int, std::shared_ptr<CompChannel>> channels;
    std::unordered_map<int, FileId> cmd_fds;
};

// Never destroyed: libibverbs may still write while static destructors run.
// nullptr only if the first call ran out of memory.
Registry* registry() noexcept {
    static Registry* const instance = new (std::nothrow) Registry();
    return instance;
}

// cmd_fds.size(): lets the write hook skip the lock while no context is open.
std::atomic<size_t> g_cmd_fds{0};

class RegistryLock {
  public:
    // Only once registry() returned non-null.
    RegistryLock() noexcept : registry_(*registry()) { pthread_mutex_lock(&registry_.mutex); }
    ~RegistryLock() {
        g_cmd_fds.store(registry_.cmd_fds.size(), std::memory_order_release);
        pthread_mutex_unlock(&registry_.mutex);
    }
    RegistryLock(const RegistryLock&) = delete;
    RegistryLock& operator=(const RegistryLock&) = delete;
    Registry* operator->() const noexcept { return &registry_; }
    Registry* get() const noexcept { return &registry_; }

  private:
    Registry& registry_;
};

bool is_cmd_fd(int fd) noexcept {
    if (g_cmd_fds.load(std::memory_order_acquire) == 0 || registry() == nullptr) return false;
    FileId registered;
    {
        RegistryLock r;
        const auto it = r->cmd_fds.find(fd);
        if (it == r->cmd_fds.end()) return false;
        registered = it->second;
    }
    FileId now;
    return file_id(fd, &now) && now == registered;
}

// Drops every channel whose app fd is closed (libibverbs' ibv_destroy_comp_channel, which the
// provider does not see) and that no CQ holds any more. The channels are destroyed after the
// lock is released.
size_t sweep_locked(Registry* r, std::vector<std::shared_ptr<CompChannel>>* dropped) noexcept {
    for (auto it = r->channels.begin(); it != r->channels.end();) {
        if (!it->second->is_open_as(it->first)) {
            try {
                dropped->push_back(std::move(it->second));
            } catch (...) {
                // Out of memory: destroyed here, under the lock; it only closes its fds.
            }
            it = r->channels.erase(it);
        } else {
            ++it;
        }
    }
    return r->channels.size();
}

// Publishes a new channel under its fd number, replacing stale entries of that number.
int register_channel(const std::shared_ptr<CompChannel>& channel) noexcept {
    if (registry() == nullptr) return ENOMEM;
    std::vector<std::shared_ptr<CompChannel>> dropped;
    RegistryLock r;
    sweep_locked(r.get(), &dropped);
    try {
        r->channels[channel->fd()] = channel;
    } catch (...) {
        return ENOMEM;
    }
    return 0;
}

// ---- the hook -----------------------------------------------------------------------------

using WriteFn = ssize_t (*)(int, const void*, size_t);
std::atomic<void*> g_next_write{nullptr};

ssize_t hook_write(int fd, const void* buf, size_t len) noexcept {
    if (fd >= 0 && is_cmd_fd(fd)) return detail::handle_cmd_write(buf, len);
    const auto next = reinterpret_cast<WriteFn>(g_next_write.load(std::memory_order_acquire));
    return next != nullptr ? next(fd, buf, len) : write(fd, buf, len);
}

void fork_prepare() noexcept {
    pthread_mutex_lock(&registry()->mutex);
}
void fork_release() noexcept {
    pthread_mutex_unlock(&registry()->mutex);
}

int find_libibverbs(got::LoadedObject* object) noexcept {
    // The object that defines a libibverbs function is the libibverbs this provider was
    // loaded by, however the app opened it. An executable's canonical PLT entry could stand
    // in for the function's address, so the SONAME is checked and searched for if needed.
    static constexpr char kSoname[] = "libibverbs.so";
    const auto* anchor = reinterpret_cast<const void*>(&ibv_create_comp_channel);
    if (got::find_object(anchor, object) == 0) {
        const char* name = got::soname(*object);
        if (name != nullptr && strncmp(name, kSoname, sizeof kSoname - 1) == 0) return 0;
    }
    return got::find_object_by_soname(kSoname, object);
}

int install() noexcept {
    if (registry() == nullptr) return ENOMEM;
    got::LoadedObject ibverbs;
    if (const int rc = find_libibverbs(&ibverbs); rc != 0) return rc;
    const auto replacement = reinterpret_cast<void*>(&hook_write);
    got::ImportSlots slots;
    if (const int rc = got::find_import_slots(ibverbs, "write", &slots); rc != 0) return rc;
    // No write import: a libibverbs built for ioctl only, which would not use the hook.
    if (slots.count == 0) return ENOENT;
    void* previous = got::current_target(ibverbs, slots, "write");
    if (previous == nullptr) return ENOENT;
    if (previous == replacement) return EALREADY;
    g_next_write.store(previous, std::memory_order_release);
    if (const int rc = pthread_atfork(fork_prepare, fork_release, fork_release); rc != 0) {
        return rc;
    }
    if (const int rc = got::store_import_slots(ibverbs, slots, replacement); rc != 0) {
        // Put back whatever slots were already redirected.
        static_cast<void>(got::store_import_slots(ibverbs, slots, previous));
        return rc;
    }
    return 0;
}

std::once_flag g_install_once;
int g_install_result = 0;

// A file whose write fails with EPERM and whose ioctl fails with ENOTTY (as the /dev/null
// node's does, which keeps libibverbs on its sysfs fallbacks): a memfd sealed against
// writes. /dev/full (ENOSPC) where memfds are unavailable. Stores the write errno.
int open_stand_in(int* write_errno) noexcept {
    const int memfd = memfd_create("uroce-no-comp-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd >= 0) {
        if (fcntl(memfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) ==
            0) {
            *write_errno = EPERM;
            return memfd;
        }
        close(memfd);
    }
    *write_errno = ENOSPC;
    return open("/dev/full", O_RDWR | O_CLOEXEC);
}

}  // namespace

int comp_channel_hook_install() noexcept {
    try {
        std::call_once(g_install_once, [] { g_install_result = install(); });
    } catch (...) {
        return EAGAIN;  // call_once reports a failed pthread_once this way
    }
    return g_install_result;
}

int comp_channel_attach(int cmd_fd) noexcept {
    int rc = comp_channel_hook_install();
    if (rc == 0) rc = cmd_fd_register(cmd_fd);
    if (rc != 0) detail::disable_channels(cmd_fd, rc);
    return rc;
}

int cmd_fd_register(int cmd_fd) noexcept {
    if (cmd_fd < 0) return EBADF;
    FileId id;
    if (!file_id(cmd_fd, &id)) return EBADF;
    if (registry() == nullptr) return ENOMEM;
    RegistryLock r;
    try {
        r->cmd_fds[cmd_fd] = id;
    } catch (...) {
        return ENOMEM;
    }
    return 0;
}

void cmd_fd_unregister(int cmd_fd) noexcept {
    if (cmd_fd < 0 || registry() == nullptr) return;
    std::vector<std::shared_ptr<CompChannel>> dropped;
    RegistryLock r;
    r->cmd_fds.erase(cmd_fd);
    sweep_locked(r.get(), &dropped);
}

std::shared_ptr<CompChannel> comp_channel_lookup(int fd) noexcept {
    if (fd < 0 || registry() == nullptr) return nullptr;
    std::shared_ptr<CompChannel> channel;
    {
        RegistryLock r;
        const auto it = r->channels.find(fd);
        if (it == r->channels.end()) return nullptr;
        channel = it->second;
    }
    return channel->is_open_as(fd) ? channel : nullptr;
}

namespace detail {

ssize_t handle_cmd_write(const void* buf, size_t len) noexcept {
    ib_uverbs_cmd_hdr hdr{};
    if (buf == nullptr || len < sizeof hdr) {
        errno = EINVAL;
        return -1;
    }
    memcpy(&hdr, buf, sizeof hdr);
    // Only channel creation has no provider op; every other command is for a kernel
    // provider's ibv_cmd_* helpers, which uroce does not use.
    if (hdr.command != IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL) {
        errno = EOPNOTSUPP;
        return -1;
    }
    // The kernel's checks: the request is exactly in_words long, the response has room.
    ib_uverbs_create_comp_channel request{};
    ib_uverbs_create_comp_channel_resp response{};
    if (len < sizeof hdr + sizeof request || size_t{hdr.in_words} * 4 != len) {
        errno = EINVAL;
        return -1;
    }
    if (size_t{hdr.out_words} * 4 < sizeof response) {
        errno = ENOSPC;
        return -1;
    }
    memcpy(&request, static_cast<const char*>(buf) + sizeof hdr, sizeof request);
    if (request.response == 0) {
        errno = EFAULT;
        return -1;
    }
    auto channel = CompChannel::create();
    if (!channel) return -1;
    if (const int rc = register_channel(channel); rc != 0) {
        errno = rc;
        return -1;
    }
    channel->hand_out();
    response.fd = static_cast<uint32_t>(channel->fd());
    memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(request.response)), &response,
           sizeof response);
    return static_cast<ssize_t>(len);
}

size_t sweep_channels() noexcept {
    if (registry() == nullptr) return 0;
    std::vector<std::shared_ptr<CompChannel>> dropped;
    RegistryLock r;
    return sweep_locked(r.get(), &dropped);
}

int disable_channels(int cmd_fd, int reason) noexcept {
    int write_errno = 0;
    const int stand_in = open_stand_in(&write_errno);
    if (stand_in < 0 || dup3(stand_in, cmd_fd, O_CLOEXEC) < 0) {
        // Nothing can stand in: libibverbs' write would "succeed" and hand back a garbage
        // fd. This cannot happen short of running out of fds at exactly this point.
        write_errno = 0;
    }
    if (stand_in >= 0) close(stand_in);
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
        const char* name = strerrorname_np(reason);
        const char* fails_with = write_errno != 0 ? strerrorname_np(write_errno) : nullptr;
        fprintf(stderr,
                "uroce: completion channels unavailable: cannot redirect libibverbs' write "
                "(%s: %s); ibv_create_comp_channel fails with %s\n",
                name != nullptr ? name : "?", strerror(reason),
                fails_with != nullptr ? fails_with : "an unusable fd");
    }
    return write_errno;
}

}  // namespace detail
}  // namespace uroce::provider
