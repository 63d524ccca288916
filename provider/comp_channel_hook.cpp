// The fd registry and the handlers that replace libibverbs' imports of write, read,
// __read_chk and close. See comp_channel.h.
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/ib_user_verbs.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "provider/comp_channel.h"
#include "provider/got_patch.h"

namespace uroce::provider {
namespace {

// ---- registry ---------------------------------------------------------------------------

struct Registry {
    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    std::unordered_map<int, std::shared_ptr<CompChannel>> channels;
    std::unordered_set<int> cmd_fds;
};

// Never destroyed: libibverbs may still call the hooks while static destructors run.
// nullptr only if the first call ran out of memory.
Registry* registry() noexcept {
    static Registry* const instance = new (std::nothrow) Registry();
    return instance;
}

// channels.size() + cmd_fds.size(): lets every hook skip the lock while nothing is tracked.
std::atomic<size_t> g_tracked{0};

class RegistryLock {
  public:
    // Only once registry() returned non-null (tracking() true or checked by the caller).
    RegistryLock() noexcept : registry_(*registry()) { pthread_mutex_lock(&registry_.mutex); }
    ~RegistryLock() {
        g_tracked.store(registry_.channels.size() + registry_.cmd_fds.size(),
                        std::memory_order_release);
        pthread_mutex_unlock(&registry_.mutex);
    }
    RegistryLock(const RegistryLock&) = delete;
    RegistryLock& operator=(const RegistryLock&) = delete;
    Registry* operator->() const noexcept { return &registry_; }

  private:
    Registry& registry_;
};

bool tracking() noexcept {
    return g_tracked.load(std::memory_order_acquire) != 0;
}

bool is_cmd_fd(int fd) noexcept {
    RegistryLock r;
    return r->cmd_fds.count(fd) != 0;
}

// The channel behind fd, if fd still is that channel's socket. An entry whose number the app
// closed behind libibverbs' back (and that now names something else) is dropped.
std::shared_ptr<CompChannel> live_channel(int fd) noexcept {
    std::shared_ptr<CompChannel> channel;
    {
        RegistryLock r;
        const auto it = r->channels.find(fd);
        if (it == r->channels.end()) return nullptr;
        channel = it->second;
    }
    if (channel->is_open_as(fd)) return channel;
    {
        RegistryLock r;
        const auto it = r->channels.find(fd);
        if (it != r->channels.end() && it->second == channel) r->channels.erase(it);
    }
    channel->mark_closed();
    return nullptr;
}

// Publishes a new channel under its fd number, replacing stale entries of that number.
int register_channel(const std::shared_ptr<CompChannel>& channel) noexcept {
    if (registry() == nullptr) return ENOMEM;
    RegistryLock r;
    try {
        r->cmd_fds.erase(channel->fd());
        r->channels[channel->fd()] = channel;
    } catch (...) {
        return ENOMEM;
    }
    return 0;
}

// ---- the previous targets of the patched slots ------------------------------------------

using WriteFn = ssize_t (*)(int, const void*, size_t);
using ReadFn = ssize_t (*)(int, void*, size_t);
using ReadChkFn = ssize_t (*)(int, void*, size_t, size_t);
using CloseFn = int (*)(int);

std::atomic<void*> g_next_write{nullptr};
std::atomic<void*> g_next_read{nullptr};
std::atomic<void*> g_next_read_chk{nullptr};
std::atomic<void*> g_next_close{nullptr};

template <typename Fn>
Fn next(const std::atomic<void*>& slot) noexcept {
    return reinterpret_cast<Fn>(slot.load(std::memory_order_acquire));
}

ssize_t next_write(int fd, const void* buf, size_t len) noexcept {
    const auto fn = next<WriteFn>(g_next_write);
    return fn != nullptr ? fn(fd, buf, len) : write(fd, buf, len);
}

ssize_t next_read(int fd, void* buf, size_t len) noexcept {
    const auto fn = next<ReadFn>(g_next_read);
    return fn != nullptr ? fn(fd, buf, len) : read(fd, buf, len);
}

int next_close(int fd) noexcept {
    const auto fn = next<CloseFn>(g_next_close);
    return fn != nullptr ? fn(fd) : close(fd);
}

// ---- the hooks ----------------------------------------------------------------------------

ssize_t hook_write(int fd, const void* buf, size_t len) noexcept {
    if (fd >= 0 && tracking() && is_cmd_fd(fd)) return detail::handle_cmd_write(buf, len);
    return next_write(fd, buf, len);
}

ssize_t hook_read(int fd, void* buf, size_t len) noexcept {
    if (fd >= 0 && tracking()) {
        if (const auto channel = live_channel(fd)) return channel->read_event(buf, len);
    }
    return next_read(fd, buf, len);
}

ssize_t hook_read_chk(int fd, void* buf, size_t len, size_t buflen) noexcept {
    if (fd >= 0 && len <= buflen && tracking()) {
        if (const auto channel = live_channel(fd)) return channel->read_event(buf, len);
    }
    const auto fn = next<ReadChkFn>(g_next_read_chk);
    return fn != nullptr ? fn(fd, buf, len, buflen) : next_read(fd, buf, len);
}

int hook_close(int fd) noexcept {
    if (fd >= 0 && tracking()) {
        std::shared_ptr<CompChannel> channel;
        {
            RegistryLock r;
            r->cmd_fds.erase(fd);
            const auto it = r->channels.find(fd);
            if (it != r->channels.end()) {
                channel = std::move(it->second);
                r->channels.erase(it);
            }
        }
        // Whether or not the number still is the channel's socket, libibverbs' close is
        // the end of that channel's fd; the CQs' references keep the rest alive.
        if (channel) channel->mark_closed();
    }
    return next_close(fd);
}

// ---- installation -------------------------------------------------------------------------

void fork_prepare() noexcept {
    pthread_mutex_lock(&registry()->mutex);
}
void fork_release() noexcept {
    pthread_mutex_unlock(&registry()->mutex);
}

struct Hook {
    const char* symbol;
    void* replacement;
    std::atomic<void*>* next;
    got::ImportSlots slots;
    void* previous;
};

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

    Hook hooks[] = {
        {"write", reinterpret_cast<void*>(&hook_write), &g_next_write, {}, nullptr},
        {"read", reinterpret_cast<void*>(&hook_read), &g_next_read, {}, nullptr},
        {"__read_chk", reinterpret_cast<void*>(&hook_read_chk), &g_next_read_chk, {}, nullptr},
        {"close", reinterpret_cast<void*>(&hook_close), &g_next_close, {}, nullptr},
    };
    for (Hook& hook : hooks) {
        if (const int rc = got::find_import_slots(ibverbs, hook.symbol, &hook.slots); rc != 0) {
            return rc;
        }
        if (hook.slots.count == 0) continue;
        hook.previous = got::current_target(ibverbs, hook.slots, hook.symbol);
        if (hook.previous == nullptr) return ENOENT;
        if (hook.previous == hook.replacement) return EALREADY;
    }
    const bool have_read = hooks[1].slots.count != 0 || hooks[2].slots.count != 0;
    if (hooks[0].slots.count == 0 || hooks[3].slots.count == 0 || !have_read) return ENOENT;

    for (Hook& hook : hooks) hook.next->store(hook.previous, std::memory_order_release);
    if (const int rc = pthread_atfork(fork_prepare, fork_release, fork_release); rc != 0) {
        return rc;
    }
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; ++i) {
        if (hooks[i].slots.count == 0) continue;
        const int rc = got::store_import_slots(ibverbs, hooks[i].slots, hooks[i].replacement);
        if (rc == 0) continue;
        for (size_t j = 0; j <= i; ++j) {  // put back what was already redirected
            if (hooks[j].slots.count != 0) {
                static_cast<void>(
                    got::store_import_slots(ibverbs, hooks[j].slots, hooks[j].previous));
            }
        }
        return rc;
    }
    return 0;
}

std::once_flag g_install_once;
int g_install_result = 0;

}  // namespace

int comp_channel_hook_install() noexcept {
    try {
        std::call_once(g_install_once, [] { g_install_result = install(); });
    } catch (...) {
        return EAGAIN;  // call_once reports a failed pthread_once this way
    }
    return g_install_result;
}

int cmd_fd_register(int cmd_fd) noexcept {
    if (cmd_fd < 0) return EBADF;
    if (registry() == nullptr) return ENOMEM;
    RegistryLock r;
    try {
        r->channels.erase(cmd_fd);  // a stale channel entry under a reused number
        r->cmd_fds.insert(cmd_fd);
    } catch (...) {
        return ENOMEM;
    }
    return 0;
}

void cmd_fd_unregister(int cmd_fd) noexcept {
    if (cmd_fd < 0 || registry() == nullptr) return;
    RegistryLock r;
    r->cmd_fds.erase(cmd_fd);
}

std::shared_ptr<CompChannel> comp_channel_lookup(int fd) noexcept {
    if (fd < 0 || registry() == nullptr) return nullptr;
    return live_channel(fd);
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
    response.fd = static_cast<uint32_t>(channel->fd());
    memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(request.response)), &response,
           sizeof response);
    return static_cast<ssize_t>(len);
}

}  // namespace detail
}  // namespace uroce::provider
